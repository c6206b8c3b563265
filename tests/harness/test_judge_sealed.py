"""The judge as the operating system seals it from the kernels it judges: a kernel that truncates its shared-memory
arena or signals the process groups it can reach does not stop the judge; no shared memory left, or the judge's own
exception around a run, is a harness error charged to no kernel; one adapter module cannot change another's
declarations; and a kernel cannot tell the judge's extra runs from a first run (tests/harness/fixtures/
judge_attacks.py, declaration_target.py, declaration_rewriter.py)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.core.case import Case
from harness.core.device import detect
from harness.engine import remote, runner
from tests.harness.signals import as_from_a_shell

ATTACKS = "tests.harness.fixtures.judge_attacks"
TARGET = "tests.harness.fixtures.declaration_target:TARGET"
REWRITER = "tests.harness.fixtures.declaration_rewriter:REWRITER"
ROOT = Path(__file__).resolve().parents[2]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc, memfd and sessions are Linux's")


def _case(seed: int = 1) -> Case:
    return Case(op="activation", adapter="x", features={"activation": "silu_and_mul", "dtype": "float32"},
                shapes={"T": 4, "N": 24}, dtypes={"x": "float32"}, seed=seed)


@pytest.fixture
def extra_runs_drawn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every judging gets the extra runs (the same inputs again, other inputs), as one in eight does."""
    monkeypatch.setattr(runner, "fresh_selected", lambda: True)


#: judges each named adapter of the attacks fixture on one case, in order, in a process of its own (the test's
#: process must survive whatever reaches the judge), printing one line per verdict
_JUDGE_ALL = """
import sys
from harness.core.case import Case
from harness.core.device import detect
from harness.engine import remote, runner
case = Case(op="activation", adapter="x", features={"activation": "silu_and_mul", "dtype": "float32"},
            shapes={"T": 4, "N": 24}, dtypes={"x": "float32"}, seed=1)
for name in sys.argv[1:]:
    r = runner.judge(case, remote.open_adapter(f"ATTACKS:{name}", "cpu"), detect("cpu"))
    print(name, r.verdict, r.reason[:300], flush=True)
""".replace("ATTACKS", ATTACKS)


def _judged_apart(*names: str) -> dict[str, str]:
    done = subprocess.run([sys.executable, "-c", _JUDGE_ALL, *names], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=as_from_a_shell,
                          start_new_session=True)  # what reaches its group reaches no test
    assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    verdicts = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.strip())
    assert list(verdicts) == list(names), done.stdout
    return verdicts


@linux_only
def test_a_kernel_that_truncates_its_arena_does_not_kill_the_judge() -> None:
    """The arena is a sealed memfd: its truncation is refused (it was a SIGBUS in the judge, exit 135, and the next
    adapter was never judged)."""
    verdicts = _judged_apart("TRUNCATE", "HONEST")
    assert verdicts["TRUNCATE"].startswith("pass"), verdicts
    assert verdicts["HONEST"].startswith("pass"), verdicts


@linux_only
def test_sigint_to_every_group_a_kernel_reaches_does_not_stop_the_judge() -> None:
    """Its own group, 0 and its host's parent's group (the fork server's: it was the judge's, and a sweep stopped as
    at a Ctrl-C)."""
    verdicts = _judged_apart("INTERRUPT", "HONEST")
    assert verdicts["HONEST"].startswith("pass"), verdicts
    assert not verdicts["INTERRUPT"].startswith("fail"), verdicts  # right on its case; what it did is its host's


def test_no_shared_memory_for_the_arena_is_a_harness_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Allocating the arena fails with ENOSPC (a full shared memory): a clear harness error naming the space
    needed, charged to no kernel; once there is space again, the next case is judged."""
    spec = f"{ATTACKS}:HONEST"
    remote.close_adapter(spec, "cpu")  # a host without an arena yet
    adapter = remote.open_adapter(spec, "cpu")

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    try:
        monkeypatch.setattr(os, "posix_fallocate", full)
        r = runner.judge(_case(), adapter, detect("cpu"))
        monkeypatch.undo()
        again = runner.judge(_case(), adapter, detect("cpu"))
    finally:
        remote.close_adapter(spec, "cpu")
    assert r.verdict == "error" and r.reason.startswith("harness error"), (r.verdict, r.reason)
    assert "no space in" in r.reason and "MiB needed" in r.reason, r.reason
    assert r.metrics.get("harness_error") is True and "kernel raised" not in r.reason
    assert again.verdict == "pass", again.reason


def test_an_exception_of_the_judges_own_code_is_a_harness_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The judge's code around a run raises (here: copying the inputs into the arena): a harness error, not the
    kernel's `error`."""
    from harness.engine import arena

    def broken(self, t):  # type: ignore[no-untyped-def]
        raise RuntimeError("planted in the judge")

    adapter = remote.open_adapter(f"{ATTACKS}:HONEST", "cpu")
    monkeypatch.setattr(arena.Arena, "put", broken)
    r = runner.judge(_case(), adapter, detect("cpu"))
    assert r.verdict == "error" and r.reason.startswith("harness error"), r.reason
    assert "planted in the judge" in r.reason and r.metrics.get("harness_error") is True


def test_a_late_write_found_as_the_next_run_starts_is_a_failed_check_not_a_kernel_error() -> None:
    """The judge finds the first run's output changed when it starts the second run: that case fails its
    `settled` check (it was reported as the kernel raising the judge's own exception)."""
    from harness import ops

    adapter = remote.open_adapter(f"{ATTACKS}:HONEST", "cpu")
    case = _case()
    judging = runner._Judging(case, adapter, detect("cpu"), None)
    spec = ops.get(case.op)
    inputs = judging.inputs(spec, case)
    specs = spec.outputs(case, inputs)
    judging.kernel(inputs, specs, 0, "first run")
    _, shared, _ = judging.taken[0]
    shared["out"].add_(1)  # what a thread the kernel left would write into the arena after the run returned
    with pytest.raises(runner._KernelFailed) as failed:
        judging.kernel(inputs, specs, 1, "second run")
    r = failed.value.result
    assert r.verdict == "fail" and r.metrics["failed_checks"] == ["settled:out"], (r.verdict, r.reason)


def test_a_returned_meta_tensor_is_the_kernels_failed_output() -> None:
    """A meta tensor has no values: the kernel's output fails its structure check (the host's copy of it raised
    NotImplementedError, which was taken for the kernel rejecting its cell)."""
    r = runner.judge(_case(), remote.open_adapter(f"{ATTACKS}:META_OUTPUT", "cpu"), detect("cpu"))
    assert r.verdict == "fail" and r.metrics["failed_checks"] == ["output:out"], (r.verdict, r.reason)
    assert "meta" in r.reason


@pytest.mark.usefixtures("extra_runs_drawn")
def test_a_kernel_right_only_on_its_first_call_with_given_inputs_fails() -> None:
    r = runner.judge(_case(), remote.open_adapter(f"{ATTACKS}:FIRST_CALL_ONLY", "cpu"), detect("cpu"))
    assert r.verdict == "fail", (r.verdict, r.reason)
    assert "repeat:out" in r.metrics["failed_checks"], r.metrics["failed_checks"]
    assert "on the same inputs again" in r.reason


def test_a_first_run_failure_reads_the_same_whether_or_not_the_extra_runs_were_drawn() -> None:
    """The extra runs (one judging in eight, drawn at random) repeat a first run's failure: the verdict's reason and
    margin stay the first run's, so a rendered matrix does not change with the draw; failed_checks names them."""
    adapter = remote.open_adapter(f"{ATTACKS}:ARENA_AWARE", "cpu")
    plain = runner.judge(_case(), adapter, detect("cpu"), extra_runs={})
    drawn = runner.judge(_case(), adapter, detect("cpu"), extra_runs={"seed": 5, "order": ["repeat", "fresh"]})
    assert plain.verdict == drawn.verdict == "fail", (plain.reason, drawn.reason)
    assert {"repeat:out", "fresh_inputs:out"} <= set(drawn.metrics["failed_checks"]), drawn.metrics["failed_checks"]
    assert drawn.reason == plain.reason and drawn.metrics["margin"] == plain.metrics["margin"], drawn.reason


def test_a_kernel_that_recognises_the_arena_by_its_outputs_layout_fails() -> None:
    """An output in the arena was a view at the guard's offset into a larger storage: right only when it sees one."""
    r = runner.judge(_case(), remote.open_adapter(f"{ATTACKS}:ARENA_AWARE", "cpu"), detect("cpu"))
    assert r.verdict == "fail", (r.verdict, r.reason)


@pytest.mark.usefixtures("extra_runs_drawn")
def test_the_extra_runs_seed_and_order_are_drawn_recorded_and_replayed() -> None:
    """The other inputs come from a seed nobody can predict (it was the case's seed + 7919), recorded with the
    order of the extra runs; judging with the recorded ones runs the same."""
    adapter = remote.open_adapter(f"{ATTACKS}:HONEST", "cpu")
    case = _case()
    drawn = [runner.judge(case, adapter, detect("cpu")).metrics.get("extra_runs", {}) for _ in range(6)]
    seeds = {d["seed"] for d in drawn}
    assert len(seeds) == 6 and case.seed + 7919 not in seeds, drawn
    assert {tuple(d["order"]) for d in drawn} <= {("fresh", "repeat"), ("repeat", "fresh")}
    replayed = runner.judge(case, adapter, detect("cpu"), extra_runs=drawn[0])
    assert replayed.verdict == "pass" and replayed.metrics["extra_runs"] == drawn[0]


#: judgings of one case: with one in FRESH_EVERY (8) drawn, none drawn or all drawn has a chance below 1e-9
DRAWS = 160


def test_which_judging_gets_the_extra_runs_is_drawn_each_time_and_replayed() -> None:
    """Not a function of the case id (a kernel could tell the cases that get them): the same case judged again and
    again gets them in some judgings and not in others; the choice is recorded (`extra_runs`, empty when none) and a
    replay with the recorded choice does the same."""
    adapter = remote.open_adapter(f"{ATTACKS}:HONEST", "cpu")
    case = _case()
    drawn = [runner.judge(case, adapter, detect("cpu")).metrics.get("extra_runs") for _ in range(DRAWS)]
    assert all(isinstance(d, dict) for d in drawn), drawn
    picked = [d for d in drawn if d]
    assert 0 < len(picked) < DRAWS, len(picked)
    for recorded in (picked[0], {}):
        again = runner.judge(case, adapter, detect("cpu"), extra_runs=recorded)
        assert again.verdict == "pass" and again.metrics["extra_runs"] == recorded


def test_one_adapter_module_cannot_change_anothers_declarations() -> None:
    """The rewriter's module, imported after the target's in the planning host, says the target runs on no
    generation: its cases were recorded unsupported, never judged. The change is named, and each of its cases is
    a harness error."""
    from harness.engine.host import Host

    planner = Host("cpu")
    try:
        catalog = remote.expand([TARGET, REWRITER], host=planner)
        target = remote.open_adapter(catalog.spec_of("declaration-target"), "cpu", host=planner)
        rewriter = remote.open_adapter(catalog.spec_of("declaration-rewriter"), "cpu", host=planner)
        r = runner.judge(_case().replace(adapter="declaration-target"), target, detect("cpu"))
        gated = runner.gated_verdict(_case().replace(adapter="declaration-target"), target, detect("cpu"))
    finally:
        planner.close()
    for v in (r, gated):
        assert v is not None and v.verdict == "error" and v.reason.startswith("harness error"), v
        assert v.metrics.get("tampered") is True
    assert target.tampered and not rewriter.tampered, (target.tampered, rewriter.tampered)
    assert "declaration-target's declaration was changed by another module" in target.tampered
    assert "declaration_rewriter" in target.tampered and "fields generations" in target.tampered
