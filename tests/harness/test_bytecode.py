"""Bytecode kept for a run's processes where PYTHONDONTWRITEBYTECODE turns its writing off (harness.core.bytecode)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.core import bytecode

ROOT = Path(__file__).resolve().parents[2]


def _env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX", bytecode.ENV)}
    # no background compile of torch into each test's folder (on a GPU machine's cores it would start)
    return {**env, "PYTHONDONTWRITEBYTECODE": "1", "XDG_CACHE_HOME": str(cache), bytecode.WARM_ENV: "off", **extra}


def _compiled(cache: Path, module: str) -> list[Path]:
    """The bytecode of the repository's `module` (a path under the checkout, no suffix) kept under `cache`."""
    mirror = cache / "moe-harness" / "pycache" / ROOT.relative_to(ROOT.anchor) / Path(module).parent
    return sorted(mirror.glob(f"{Path(module).name}.*.pyc"))


@pytest.mark.parametrize(("given", "kept"), [
    ({"PYTHONDONTWRITEBYTECODE": "1"}, True),
    ({"PYTHONDONTWRITEBYTECODE": ""}, False),
    ({}, False),
    ({"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/elsewhere"}, False),
    ({"PYTHONDONTWRITEBYTECODE": "1", bytecode.ENV: "off"}, False),
])
def test_bytecode_is_kept_apart_only_where_its_writing_is_off_and_no_prefix_was_chosen(
        given: dict[str, str], kept: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(bytecode.ENV, raising=False)
    if bytecode.ENV in given:
        monkeypatch.setenv(bytecode.ENV, given[bytecode.ENV])
    environ = {k: v for k, v in given.items() if k != bytecode.ENV}
    where = bytecode.keep_for_run(environ)
    if kept:
        assert where == str(tmp_path / "moe-harness" / "pycache")
        assert environ == {"PYTHONPYCACHEPREFIX": where}  # the processes it starts write there
    else:
        assert where is None and environ == {k: v for k, v in given.items() if k != bytecode.ENV}


def test_the_command_line_writes_its_bytecode_apart_when_the_environment_turns_writing_off(tmp_path: Path) -> None:
    """`python -m harness` under PYTHONDONTWRITEBYTECODE compiles its later imports once for the run's processes,
    into the user's cache folder; with the switch off it writes nothing, as before."""
    for switch, expected in (("on", True), ("off", False)):
        cache = tmp_path / switch
        done = subprocess.run([sys.executable, "-m", "harness", "--version"], cwd=ROOT, capture_output=True, text=True,
                              env=_env(cache, **{bytecode.ENV: switch}), timeout=120)
        assert done.returncode == 0, done.stderr
        assert bool(_compiled(cache, "harness/cli")) == expected, (switch, sorted(cache.rglob("*.pyc"))[:5])
        assert not list(cache.rglob("*.pyc")) or expected


def test_a_pytest_session_writes_its_bytecode_apart_when_the_environment_turns_writing_off(tmp_path: Path) -> None:
    """The plugin does the same for a session run from the command line (its xdist workers inherit it)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--co",
                           "tests/test_diagnostic_scripts.py", "--moe-adapter", "reference-activation"],
                          cwd=ROOT, capture_output=True, text=True, env=_env(tmp_path), timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert _compiled(tmp_path, "tests/test_diagnostic_scripts"), sorted(tmp_path.rglob("*.pyc"))[:5]


def _package(root: Path) -> Path:
    pkg = root / "src" / "warmpkg"
    (pkg / "tests").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("X = 1\n")
    (pkg / "tests" / "test_mod.py").write_text("def test_x():\n    pass\n")
    return pkg


def test_the_packages_are_compiled_into_the_folder_once(tmp_path: Path) -> None:
    """The background warming writes where imports under the prefix look, leaves test suites out, and marks the
    folder so that the next run starts none; a second warming while one runs does nothing."""
    from harness.core import bytecode_warm

    pkg, where = _package(tmp_path), tmp_path / "pycache"
    mirror = where / pkg.relative_to(pkg.anchor)
    done = subprocess.run([sys.executable, "-m", "harness.core.bytecode_warm", str(where), str(pkg)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert list(mirror.glob("mod.*.pyc")) and list(mirror.glob("__init__.*.pyc"))
    assert not list((mirror / "tests").glob("*.pyc"))
    assert bytecode_warm.done(str(where), [str(pkg)])
    # the import finds it there: with writing off, it is read, not written again
    seen = subprocess.run([sys.executable, "-c", "import warmpkg.mod, sys; print(warmpkg.mod.__cached__)"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(pkg.parent), "PYTHONPYCACHEPREFIX": str(where)})
    assert seen.stdout.strip().startswith(str(where)), seen.stdout + seen.stderr
    other = tmp_path / "other"
    (other / ".warm-x").parent.mkdir()
    mark = bytecode_warm._mark(str(other), [str(pkg)])
    Path(mark + ".running").write_text("")  # another process is at it
    assert bytecode_warm.done(str(other), [str(pkg)])
    assert bytecode_warm.warm(str(other), [str(pkg)], 1) == 0 and not list(other.rglob("*.pyc"))
    old = time.time() - bytecode_warm.RUNNING_S - 1  # that process died long ago: a new warming goes ahead
    os.utime(mark + ".running", (old, old))
    assert not bytecode_warm.done(str(other), [str(pkg)])
    assert bytecode_warm.warm(str(other), [str(pkg)], 1) == 1 and bytecode_warm.done(str(other), [str(pkg)])


def test_a_run_that_chooses_the_folder_warms_it_on_a_machine_of_many_cores(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.core import bytecode_warm, device

    pkg = _package(tmp_path)
    monkeypatch.setattr(bytecode_warm, "packages", lambda: [str(pkg)])
    monkeypatch.setattr(sys, "pycache_prefix", sys.pycache_prefix)
    monkeypatch.setattr(sys, "dont_write_bytecode", sys.dont_write_bytecode)
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.delenv(bytecode.ENV, raising=False)
    monkeypatch.delenv(bytecode.WARM_ENV, raising=False)
    started: list[str] = []
    procs: list[subprocess.Popen | None] = []
    real = bytecode.warm_in_background

    def recorded(where: str) -> subprocess.Popen | None:
        started.append(where)
        procs.append(real(where))
        return procs[-1]

    monkeypatch.setattr(bytecode, "warm_in_background", recorded)
    for cpus, switch, expected in ((bytecode.WARM_MIN_CPUS, "", True), (bytecode.WARM_MIN_CPUS - 1, "", False),
                                   (bytecode.WARM_MIN_CPUS, "off", False)):
        monkeypatch.setattr(device, "usable_cpus", lambda cpus=cpus: cpus)
        monkeypatch.setenv(bytecode.WARM_ENV, switch)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / f"cache-{cpus}-{switch}"))
        started.clear()
        procs.clear()
        where = bytecode.keep_for_run({"PYTHONDONTWRITEBYTECODE": "1"})  # another mapping: chosen, not warmed
        assert where and not started
        os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
        os.environ.pop("PYTHONPYCACHEPREFIX", None)
        where = bytecode.keep_for_run()
        assert started == [where]
        if procs[0] is not None:
            procs[0].wait(timeout=120)
        mirror = Path(where) / pkg.relative_to(pkg.anchor)
        assert bool(list(mirror.glob("mod.*.pyc"))) == expected, (cpus, switch)
        if expected:
            assert real(where) is None  # marked: the next run starts nothing
