"""Nothing ends a run silently: an adapter module whose import ends the process from C code (where Python cannot
refuse the exit) is found in a child process before the matrix imports it; a pytest session that a kernel ends
from C code does not exit 0."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.registry.probe import probe

C_EXIT = "tests.harness.fixtures.c_exiting_adapter"
HANG = "tests.harness.fixtures.hanging_import_adapter"
ROOT = Path(__file__).resolve().parents[2]


def test_the_probe_names_the_imports_that_end_or_hang_the_process_and_goes_on_after_them() -> None:
    found = probe([("module", C_EXIT), ("module", "json"), ("module", "no.such.module"), ("module", HANG)],
                  timeout=12)
    assert set(found) == {f"module {C_EXIT}", f"module {HANG}"}, found
    assert "ended the process (exit status 0)" in found[f"module {C_EXIT}"]
    assert "hung" in found[f"module {HANG}"]


def test_a_hanging_import_is_named_however_slow_the_child_is_to_start() -> None:
    """The timeout counts from the import's start, not from the child's spawn: starting the child (Python, torch,
    the harness) takes longer than 1 s, more so on a loaded machine."""
    found = probe([("module", HANG)], timeout=1)
    assert list(found) == [f"module {HANG}"] and "hung" in found[f"module {HANG}"], found


@pytest.mark.parametrize(("command", "words"), [
    ("import sys; sys.stderr.write('no torch here\\n'); sys.exit(3)",
     "ended before its first import (exit status 3): no torch here"),
    ("import time; time.sleep(60)", "did not start within 0.5 s"),
])
def test_a_probe_child_that_does_not_start_is_named_as_such(monkeypatch: pytest.MonkeyPatch, command: str,
                                                             words: str) -> None:
    """Nothing can be blamed on the origins of a child that never reached its first import: said, not `{}`."""
    from harness.registry import probe as probing

    monkeypatch.setattr(probing, "_command", lambda origins: [sys.executable, "-c", command])
    with pytest.raises(probing.ProbeNotStarted, match=re.escape(words)):
        probe([("module", HANG)], timeout=1, start_timeout=0.5)


def test_adapters_are_imported_unprobed_with_a_warning_when_the_probe_child_does_not_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from harness import registry
    from harness.core import probe_cache
    from harness.registry import probe as probing

    def not_started(origins, timeout=0.0, start_timeout=0.0, files=None, first=None):  # type: ignore[no-untyped-def]
        raise probing.ProbeNotStarted("the import probe child process ended before its first import (exit status 3)",
                                      {f"module {HANG}": "importing it hung"})  # what an earlier child found

    monkeypatch.setattr(probing, "probe", not_started)
    monkeypatch.setenv(probe_cache.ENV, "off")  # an all-clear this machine remembers would skip the probe
    monkeypatch.setattr(registry, "_loaded", False)
    monkeypatch.setattr(registry, "DEADLY", {})
    with pytest.warns(UserWarning, match=r"ended before its first import \(exit status 3\); .* imported in this "
                                         "process unprobed"):
        registry.probe_imports([])
    assert registry.DEADLY == {f"module {HANG}": "importing it hung"}


def test_matrix_survives_an_adapter_whose_import_exits_from_c_code(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "harness", "matrix", "--device", "cpu", "--adapter",
                        "reference-activation", "--adapter", f"{C_EXIT}:ADAPTER", "--results-dir", str(tmp_path),
                        "--out", ""], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert f"module '{C_EXIT}'" in p.stderr and "ended the process" in p.stderr, p.stderr


SESSION = '''
import ctypes, os, signal

def test_first():
    pass

def test_ends_the_process():
    how = os.environ["END_HOW"]
    if how == "exit0":
        ctypes.CDLL(None)._exit(0)
    if how == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)

def test_after():
    assert os.environ["END_HOW"] != "fail"
'''


def _session(tmp_path: Path, how: str, *extra: str) -> subprocess.CompletedProcess:
    """A one-process pytest session (the plugin active) in which one test ends the process `how`."""
    from harness.plugin import load_args

    (tmp_path / "test_session.py").write_text(SESSION)
    plugin = load_args()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin, "-o",
           "moe_adapters=reference-activation", str(tmp_path / "test_session.py"), *extra]
    env = dict(os.environ, PYTHONPATH=str(ROOT), END_HOW=how)
    env.pop("MOE_HARNESS_SUPERVISE", None)
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("how", "status"), [("exit0", 1), ("segv", 128 + 11)])
def test_a_session_a_test_ends_from_c_code_does_not_pass(tmp_path: Path, how: str, status: int) -> None:
    p = _session(tmp_path, how)
    assert p.returncode == status, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    assert "ended without closing" in p.stderr and "test_ends_the_process" in p.stderr, p.stderr[-2000:]


@pytest.mark.parametrize(("how", "status"), [("none", 0), ("fail", 1)])
def test_a_session_that_closes_keeps_its_own_status(tmp_path: Path, how: str, status: int) -> None:
    p = _session(tmp_path, how)
    assert p.returncode == status, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    assert "ended without closing" not in p.stderr
    assert ("3 passed" if how == "none" else "1 failed, 2 passed") in p.stdout, p.stdout[-2000:]


def test_without_the_watcher_an_exit_from_c_code_reads_as_success(tmp_path: Path) -> None:
    """What the watcher exists for (and the opt-out works)."""
    p = _session(tmp_path, "exit0", "--moe-no-supervise")
    assert p.returncode == 0 and "ended without closing" not in p.stderr
