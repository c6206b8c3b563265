"""The import probe's remembered all-clears (harness.core.probe_cache): a listing skips the probe child only
while every file the remembered probe imported is as it was; a changed adapter module is probed again."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness import registry
from harness.core import probe_cache
from harness.registry import probe as probing

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An adapter module outside any installed distribution, the cache in a folder of this test's own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(probe_cache.ENV, raising=False)
    path = tmp_path / "mods" / "probe_cached_adapter.py"
    path.parent.mkdir()
    path.write_text("VALUE = 1\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(path.parent))
    return path


def _probes(monkeypatch: pytest.MonkeyPatch, module: Path, deadly: dict[str, str]) -> list[list]:
    """Each probe_imports call that reached the probe child: a stand-in that reports `module` as imported."""
    calls: list[list] = []

    def fake(origins, timeout=0.0, start_timeout=0.0, files=None, first=None):  # type: ignore[no-untyped-def]
        calls.append(list(origins))
        if files is not None:
            files += [str(module), "_bare.py"]  # as torch's built-in submodules name theirs
        return dict(deadly)

    monkeypatch.setattr(probing, "probe", fake)
    monkeypatch.setattr(registry, "DEADLY", {})
    monkeypatch.setattr(registry, "_loaded", False)
    return calls


def test_an_all_clear_is_used_until_an_imported_file_changes(module: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _probes(monkeypatch, module, {})
    registry.probe_imports(["probe_cached_adapter:ADAPTER"])
    registry.probe_imports(["probe_cached_adapter:ADAPTER"])
    assert len(calls) == 1, "the second listing probed again though nothing changed"
    registry.probe_imports(["other_module:ADAPTER"])  # other origins: another entry
    assert len(calls) == 2
    module.write_text("VALUE = 2\n", encoding="utf-8")  # the same size: only the contents tell
    registry.probe_imports(["probe_cached_adapter:ADAPTER"])
    assert len(calls) == 3, "a stale all-clear was used after the adapter module changed"
    registry.probe_imports(["probe_cached_adapter:ADAPTER"])
    assert len(calls) == 3
    assert all(f.parent.name == "probes" for f in (module.parents[1] / "cache").rglob("*.json"))


def test_a_deadly_import_is_probed_every_time_and_the_cache_can_be_turned_off(
        module: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _probes(monkeypatch, module, {"module probe_cached_adapter": "importing it ended the process"})
    for _ in range(2):
        registry.probe_imports(["probe_cached_adapter:ADAPTER"])
    assert len(calls) == 2 and registry.DEADLY == {"module probe_cached_adapter": "importing it ended the process"}
    calls = _probes(monkeypatch, module, {})
    monkeypatch.setenv(probe_cache.ENV, "off")
    for _ in range(2):
        registry.probe_imports(["probe_cached_adapter:ADAPTER"])
    assert len(calls) == 2 and not (module.parents[1] / "cache").exists()


def test_the_key_follows_the_installed_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    origins = [("module", "kernels.adapters")]
    before = probe_cache.key(origins)

    other = SimpleNamespace(metadata={"Name": "triton"}, version="0.0.1-other")
    real = probe_cache.metadata.distributions
    monkeypatch.setattr(probe_cache.metadata, "distributions", lambda: [*real(), other])
    assert probe_cache.key(origins) != before
    monkeypatch.setattr(probe_cache.metadata, "distributions", real)
    assert probe_cache.key(origins) == before


def test_the_probe_child_reports_the_files_it_imported(module: Path) -> None:
    files: list[str] = []
    assert probing.probe([("module", module.stem)], timeout=60, files=files) == {}
    assert str(module) in files and any(f.endswith("harness/registry/__init__.py") for f in files)
    mine = probe_cache.own_files(files)
    assert str(module.resolve()) in mine and str(ROOT / "harness" / "registry" / "__init__.py") in mine
    assert not any("site-packages" in f or f.startswith(sys.base_prefix + "/lib/") for f in mine), mine


def test_only_the_newest_entries_are_kept(module: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe_cache, "KEEP", 3)
    where = probe_cache.folder()
    assert where is not None
    for i in range(5):
        probe_cache.record(f"entry{i}", [str(module)])
        os.utime(where / f"entry{i}.json", (1000 + i, 1000 + i))  # distinct ages, whatever the clock's resolution
    assert len(list(where.glob("*.json"))) == 3
    assert probe_cache.is_clear("entry4") and not probe_cache.is_clear("entry0")


def _children(monkeypatch: pytest.MonkeyPatch, module: Path) -> list[list]:
    """Each probe child the listing runs itself: a stand-in that imports every origin it is given."""
    runs: list[list] = []

    def fake(origins, timeout, start_timeout):  # type: ignore[no-untyped-def]
        runs.append([tuple(o) for o in origins])
        lines = [f"probe-{w} {i}" for i in range(len(origins)) for w in ("start", "done")]
        return probing._Child([*lines, f'probe-files ["{module}"]', "probe-end"], 0, "")

    monkeypatch.setattr(probing, "_run_child", fake)
    monkeypatch.setattr(registry, "DEADLY", {})
    monkeypatch.setattr(registry, "_loaded", False)
    return runs


def test_an_early_probe_child_of_the_same_origins_is_the_listings_probe(
        module: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The matrix starts the probe child before it imports torch (harness.engine.early_probe): the listing takes
    its run as the probe's, when it probed these origins under this environment."""
    from harness.engine import early_probe

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # as the child chooses for --device cpu
    specs = [f"{module.stem}:ADAPTER"]
    started = early_probe.start(specs)
    assert started is not None
    early = started.output()
    assert "probe-end" in early["lines"] and early["code"] is not None, early  # None: past its time limit
    runs = _children(monkeypatch, module)
    registry.probe_imports(specs, early)
    assert runs == [] and registry.DEADLY == {}
    registry.probe_imports(specs)  # its all-clear was remembered
    assert runs == []


@pytest.mark.parametrize("how", ["other key", "not started", "ended", "hung"])
def test_an_early_probe_child_is_blamed_like_any_and_the_rest_probed(module: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    how: str) -> None:
    """An early child that ended or hung in an import names it, and the listing probes the origins after it; one of
    another probe, or that never reached an import, is not used."""
    specs = [f"{module.stem}:ADAPTER"]
    origins = registry.probe_origins(specs)
    assert len(origins) >= 2
    key = probe_cache.key(origins)
    early: dict = {"lines": [f"probe-key {key}", "probe-start 0", "probe-done 0", "probe-start 1"], "code": 7}
    if how == "other key":
        early["lines"][0] = "probe-key another"
    elif how == "not started":
        early["lines"] = early["lines"][:1]
    elif how == "hung":
        early.update(code=None)  # past its time limit
    runs = _children(monkeypatch, module)
    registry.probe_imports(specs, early)
    if how in ("other key", "not started"):
        assert runs == [origins] and registry.DEADLY == {}
        return
    kind, target = origins[1]
    assert runs == [origins[2:]] if origins[2:] else runs == []
    why = registry.DEADLY[f"{kind} {target}"]
    assert ("hung" in why) if how == "hung" else ("exit status 7" in why), why


def test_an_early_probe_child_finds_a_remembered_all_clear_without_importing_torch(
        module: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a machine that remembers the probe's all-clear, the early child says so from its key alone: no torch
    import (seconds, beside the command's own) for a listing that will skip the probe."""
    import json
    import subprocess

    from harness.engine import early_probe

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # as the child chooses for --device cpu
    specs = [f"{module.stem}:ADAPTER"]
    key = probe_cache.key(probe_cache.origins(specs))
    probe_cache.record(key, [str(module)])
    watch = "import atexit, sys; atexit.register(lambda: print('torch-imported', 'torch' in sys.modules)); "
    done = subprocess.run([sys.executable, "-c", watch + early_probe._BOOT, json.dumps(sys.path), "cpu",
                           json.dumps(specs)], capture_output=True, text=True, timeout=120)
    assert done.stdout.split("\n")[:3] == [f"probe-key {key}", "probe-clear", "torch-imported False"], \
        done.stdout + done.stderr


@pytest.mark.parametrize("gpu_files", [False, True], ids=["no-gpu-device-files", "gpu-device-files"])
def test_the_interpreter_is_chosen_without_torch_where_no_gpu_can_be(gpu_files: bool) -> None:
    """`prepare_interpreter`: with none of the device files a GPU needs, no GPU can be there, and torch (an import
    of seconds) is not asked; with one, torch is asked."""
    import subprocess

    files = (os.devnull,) if gpu_files else (os.path.join(os.devnull, "none"),)
    code = (f"import os, sys; from harness.core import device; device.GPU_DEVICE_FILES = {files!r}; "
            "os.environ.pop('TRITON_INTERPRET', None); device.prepare_interpreter('auto'); "
            "print(os.environ.get('TRITON_INTERPRET'), 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    interpret, asked = done.stdout.split()
    assert asked == str(gpu_files), done.stdout + done.stderr
    import torch

    assert interpret == ("None" if gpu_files and torch.cuda.is_available() else "1"), done.stdout


def test_the_early_probe_child_probes_as_the_listing_host_does_whatever_the_runs_device(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The listing runs in a host on LISTING_DEVICE (a CPU host, with the interpreter chosen) even when the run's
    kernels go to a GPU: the early child must choose as that host does, or on a GPU machine it makes a probe of
    another key that the listing never uses (and a full probe beside a warm run's start)."""
    from harness.core.device import LISTING_DEVICE
    from harness.engine import early_probe, remote

    started: list[list[str]] = []

    class Recorded:
        def __init__(self, argv: list[str], **kwargs: object) -> None:
            started.append(argv)

    monkeypatch.setattr(early_probe.subprocess, "Popen", Recorded)
    assert early_probe.start(["reference-activation"]) is not None
    assert started[0][4:] == [LISTING_DEVICE, '["reference-activation"]'], started
    made: list[str] = []
    monkeypatch.setattr(remote, "Host", lambda device: made.append(device) or SimpleNamespace(close=lambda: None))
    monkeypatch.setattr(remote, "_ask", lambda host, msg, what: {"usage_error": "stop here"})
    with pytest.raises(ValueError, match="stop here"):
        remote.expand([])
    assert made == [LISTING_DEVICE]
