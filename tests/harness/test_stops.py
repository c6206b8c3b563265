"""A run stops when told and ends when done: Ctrl-C or SIGTERM ends a matrix sweep within 5 s, in its planning or its
judging, with nothing it started left running (workers, kernel hosts, fork servers, resource trackers) and the
command that resumes it printed; a finished sweep exits within 5 s of its summary; the ETA comes from the measured
time of each adapter's cases and is never 0 while a case is left.

Every process of a run is found by the mark the test puts in its environment (inherited, and kept by a process
re-parented to init) or by its session (the run is started in a new one)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from harness import plugin
from harness.store.results import load_results
from harness.sweep.progress import Progress, eta_seconds
from tests.harness import signals

ROOT = Path(__file__).resolve().parents[2]
FAKES = "tests.harness.fixtures.fake_adapters"
#: seconds a run may take to end once told to, or once it printed its summary
LIMIT_S = 5.0


class _Run:
    """`python -m harness ARGS` in a new process session, its output in a file; `matrix`: one adapter's sweep on the
    CPU (two workers)."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.mark, self.pidfile, self.log = uuid.uuid4().hex, tmp_path / "pids", tmp_path / "log"
        self.results = tmp_path / "results"
        cmd = [sys.executable, "-m", "harness", *args]
        env = dict(os.environ, PYTHONPATH=str(ROOT), MOE_TEST_PIDFILE=str(self.pidfile),
                   **{signals.MARK_ENV: self.mark})
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True, preexec_fn=signals.as_from_a_shell)

    @classmethod
    def matrix(cls, tmp_path: Path, adapter: str, *extra: str) -> _Run:
        return cls(tmp_path, "matrix", "--adapter", adapter, "--device", "cpu", "--jobs", "2", "--results-dir",
                   str(tmp_path / "results"), "--out", "", *extra)

    def text(self) -> str:
        return self.log.read_text()

    def wait_for(self, ready, what: str, limit: float = 300.0) -> float:  # type: ignore[no-untyped-def]
        """Poll until `ready()`; the time it came (the run must still be going, unless it is what is awaited)."""
        deadline = time.monotonic() + limit
        while not ready():
            assert time.monotonic() < deadline, f"no {what} within {limit:g}s:\n{self.text()[-3000:]}"
            time.sleep(0.05)
        return time.monotonic()

    def kernel_started(self) -> bool:
        assert self.proc.poll() is None, self.text()[-3000:]
        return self.pidfile.exists() and bool(self.pidfile.read_text().strip())

    def ended_within(self, since: float) -> int:
        """The exit status of the run, which must end `LIMIT_S` after `since` at most, and leave nothing it started
        running when it ends (a process that outlives it holds its output open: `... | tee log` waits for it)."""
        try:
            code = self.proc.wait(timeout=max(0.1, since + LIMIT_S - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {LIMIT_S:g}s later:\n" + "\n".join(self._left()) + "\n"
                                 + self.text()[-3000:]) from None
        left = self._left()
        assert not left, f"{len(left)} process(es) of the run outlived it:\n" + "\n".join(left)
        return code

    def _left(self) -> list[str]:
        return signals.leftovers(self.mark, self.proc.pid)

    def close(self) -> None:
        signals.kill_leftovers(self.mark, self.proc.pid)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def runs():  # type: ignore[no-untyped-def]
    started: list[_Run] = []
    yield started
    for run in started:
        run.close()


def test_sigterm_while_planning_ends_the_sweep_and_prints_how_to_resume(tmp_path: Path, runs: list[_Run]) -> None:
    """The adapter's support rule hangs in the planning host: SIGTERM to the sweep (as a job's time limit sends)."""
    run = _Run.matrix(tmp_path, f"{FAKES}:SLOW_PLAN")
    runs.append(run)
    run.wait_for(run.kernel_started, "planning")
    run.proc.send_signal(signal.SIGTERM)
    code = run.ended_within(time.monotonic())
    text = run.text()
    assert code == 130 and "nothing was judged" in text and "--resume matrix-" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    run_id = text.split("--resume ")[1].split()[0]
    assert (run.results / f"{run_id}-main.jsonl").exists()  # so that the printed command continues the run


def test_ctrl_c_while_judging_ends_the_sweep_and_everything_it_started(tmp_path: Path, runs: list[_Run]) -> None:
    """Every case hangs in its kernel host: Ctrl-C reaches the terminal's whole process group."""
    run = _Run.matrix(tmp_path, f"{FAKES}:HANGS", "--case-timeout", "300")
    runs.append(run)
    run.wait_for(run.kernel_started, "kernel run")
    os.killpg(run.proc.pid, signal.SIGINT)
    code = run.ended_within(time.monotonic())
    text = run.text()
    assert code == 130 and "--resume matrix-" in text and "Traceback" not in text, text[-3000:]
    assert [r for r in load_results([run.results], strict=False) if r.verdict == "error"] == []


def test_a_finished_shard_exits_within_seconds_of_its_last_verdict(tmp_path: Path, runs: list[_Run]) -> None:
    run = _Run.matrix(tmp_path, "reference-activation", "--shard", "1/2")
    runs.append(run)
    # the adapter's counts are printed with its last verdict, before the workers stop
    judged = run.wait_for(lambda: "reference-activation: 26 pass" in run.text(), "last verdict")
    code = run.ended_within(judged)
    assert code == 0 and "judged 26 cases in" in run.text(), run.text()[-3000:]


def test_sigterm_ends_a_replay_and_its_kernel_host(tmp_path: Path, runs: list[_Run]) -> None:
    from harness.core.case import Case
    from harness.store.casefiles import CASE_FILE_KIND

    case = Case(op="activation", adapter="fake-hangs", features={"activation": "silu_and_mul", "dtype": "float32"},
                shapes={"T": 5, "N": 16}, dtypes={"x": "float32"}, seed=1)
    path = tmp_path / "case.json"
    path.write_text(json.dumps({"kind": CASE_FILE_KIND, "case": case.to_dict(), "adapter": "fake-hangs",
                                "adapter_object": f"{FAKES}:HANGS"}))
    run = _Run(tmp_path, "replay", str(path))
    runs.append(run)
    run.wait_for(run.kernel_started, "kernel run")
    run.proc.send_signal(signal.SIGTERM)
    code = run.ended_within(time.monotonic())
    assert code == 130 and "Traceback" not in run.text(), run.text()[-3000:]


# ---------------------------------------------------------------------------------------------------------- ETA


def test_the_eta_follows_each_adapters_measured_case_time() -> None:
    # a: 2 s a case (6 s over 3), b not measured yet: the mean of the measured cases (2 s); two workers
    assert eta_seconds({"a": 2, "b": 4}, {"a": (6.0, 3)}, workers=2) == (2 * 2.0 + 4 * 2.0) / 2
    # b measured now at 1 s a case: its cases follow its own time, not the mean (7 s over 4)
    assert eta_seconds({"a": 2, "b": 4}, {"a": (6.0, 3), "b": (1.0, 1)}, workers=2) == (2 * 2.0 + 4 * 1.0) / 2
    # one case left: one worker judges it, whatever the pool's size
    assert eta_seconds({"a": 1}, {"a": (30.0, 3)}, workers=8) == 10.0
    assert eta_seconds({"a": 3}, {}, workers=2) is None  # nothing measured: no guess
    assert eta_seconds({"a": 0}, {"a": (3.0, 3)}, workers=2) == 0.0  # done


def test_the_eta_is_never_0_while_a_case_is_left() -> None:
    assert eta_seconds({"a": 1}, {"a": (0.003, 3)}, workers=2) == 1.0
    # two quick cases of `a` judged; the case left is of `b`, not measured: it takes the mean, not 0
    progress = Progress(3, {0: ("a", "x"), 1: ("a", "y"), 2: ("b", "x")}, out=None, workers=2)
    for index in (0, 1):
        progress.record(index, "pass", True, {"inputs": 0.5, "first_run": 3.0, "in_host": 2.9})
    assert "ETA 4s" in progress.line(), progress.line()  # 3.5 s measured a case (in_host is part of the run)
    progress.record(2, "pass", True, {"first_run": 0.001})
    assert "ETA 0s" in progress.line()


# --------------------------------------------------------------------------------------------------- pytest's end

_SLOW_WORKER_END = '''
import gc, os, time

def pytest_unconfigure(config):
    # an xdist worker slow to finish after its tests (a large heap collected on a loaded machine): xdist sends it
    # SIGINT after 5 s, which lands where the worker is, here in a gc callback as in hypothesis' own
    if os.environ.get("PYTEST_XDIST_WORKER"):
        gc.callbacks.append(lambda phase, info: time.sleep(0.05))
        end = time.monotonic() + 8
        while time.monotonic() < end:
            gc.collect()
'''


def test_a_passing_xdist_run_prints_no_traceback_when_a_worker_is_slow_to_finish(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(_SLOW_WORKER_END)
    (tmp_path / "test_quick.py").write_text("def test_quick():\n    pass\n")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin.load_args(),
           "-n", "1", "--moe-adapter",
           "reference-activation", "--moe-results-dir", str(tmp_path / "results"), "-k", "test_quick",
           str(tmp_path / "test_quick.py")]  # the plugin is active (--moe-adapter); its generic tests deselected
    p = subprocess.run(cmd, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT), **signals.NO_GPU),
                       capture_output=True, text=True, timeout=300, preexec_fn=signals.as_from_a_shell)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "1 passed" in out, out[-3000:]
    assert "KeyboardInterrupt" not in out and "Traceback" not in out, out[-3000:]
