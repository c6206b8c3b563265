"""The matrix sweep: deterministic cell selection (pairwise covering sets), and fault isolation (a case that
raises, hangs, exits or kills its worker is marked and the run continues; nothing already judged is lost)."""

from __future__ import annotations

import io
import itertools
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from harness import ops, registry, sweep
from harness.core.device import detect, threads_for
from harness.store import manifest
from harness.store.results import load_meta, load_results
from harness.sweep import planning
from tests.harness import signals

FAKE = "tests.harness.fixtures.fake_adapters:FAULTY"


def _pairs(row: tuple[str, ...]) -> set[tuple]:
    return {(i, row[i], j, row[j]) for i, j in itertools.combinations(range(len(row)), 2)}


def test_pairwise_cover_covers_every_pair_that_occurs() -> None:
    values = [("a", "b", "c"), ("x", "y"), ("0", "1", "2", "3"), ("p", "q"), ("u", "v", "w")]
    # an inapplicable rule: some pairs occur in no candidate and must not be demanded
    rows = [r for r in itertools.product(*values) if not (r[0] == "c" and r[1] == "y")]
    chosen = sweep.pairwise_cover(rows)
    assert chosen == sweep.pairwise_cover(rows), "not deterministic"
    needed = set().union(*(_pairs(r) for r in rows))
    got = set().union(*(_pairs(rows[i]) for i in chosen))
    assert needed == got
    assert len(chosen) < len(rows) / 5
    assert len(sweep.pairwise_cover([("only",), ("one",)])) == 2  # one axis: every value


def _narrow_experts() -> registry.Adapter:
    """Declares the first value of every experts axis, two activations and both expert maps."""
    spec = ops.get("experts")
    support = {a.name: a.values[:1] for a in spec.axes}
    support["activation"] = spec.axes[spec.axis_names().index("activation")].values[:2]
    support["expert_map"] = ("N", "Y")
    return registry.Adapter(name="narrow-experts", op="experts", source="tests", support=support,
                            run=registry.resolve("reference-experts").run)


def test_quick_plan_is_pairwise_over_declared_cells_first_and_full_is_the_product() -> None:
    a = _narrow_experts()
    spec = ops.get("experts")
    names = spec.axis_names()
    quick, full = sweep.plan(a, "quick"), sweep.plan(a, "full")
    assert full.selection == "all" and len(full.cells) == len(spec.all_cells())
    assert quick.selection == "pairwise" and len(quick.cells) < len(full.cells)
    assert quick.cases == sweep.plan(a, "quick").cases  # deterministic
    rows = [tuple(c[n] for n in names) for c in quick.cells]
    applicable = [tuple(c[n] for n in names) for c in spec.all_cells()]
    assert set().union(*map(_pairs, applicable)) <= set().union(*map(_pairs, rows))
    # every pair of declared values is exercised together in a cell the adapter declares
    declared_rows = [r for r in rows if all(v in a.support[n] for n, v in zip(names, r))]
    declared_app = [r for r in applicable if all(v in a.support[n] for n, v in zip(names, r))]
    assert set().union(*map(_pairs, declared_app)) <= set().union(*map(_pairs, declared_rows))
    # a case's seed is its boundary index, and the rotation reaches every boundary shape
    n_bounds = len(spec.boundary(a, quick.cells[0]))
    assert {c.seed for c in quick.cases} == set(range(n_bounds))
    for c in quick.cases[:6]:
        assert spec.boundary(a, c.features)[c.seed]["shapes"] == c.shapes


#: the case timeout of the faults sweep: its ordinary cases must finish within it on a loaded machine (1.5 s did not
#: on a 16-worker GPU suite), its planted hang (30 s) must not
HANG_S = 5.0


def test_fault_isolation_marks_the_faulty_cases_and_loses_nothing(tmp_path: Path) -> None:
    from tests.harness.fixtures import fake_adapters

    faulty = registry.resolve(FAKE)
    planned = sweep.plan(faulty, "quick").cases
    faults = fake_adapters.faulty_cases()
    assert sorted(faults.values()) == ["exit", "hang", "os-exit", "raise", "signal"]
    out = io.StringIO()
    totals = sweep.run_sweep([FAKE], detect("cpu"), str(tmp_path), profile="quick", run_id="t", jobs=2,
                             case_timeout=HANG_S, out=out)
    results = load_results([tmp_path])
    by_id = Counter(r.case.case_id for r in results)
    # every planned case has exactly one verdict: nothing lost, nothing judged twice
    assert by_id == Counter(c.case_id for c in planned)
    verdict = {r.case.case_id: r for r in results}
    for case_id, fault in faults.items():
        r = verdict[case_id]
        assert r.verdict == "error", (fault, r.verdict, r.reason)
        expected = {"raise": "planted failure", "hang": f"hang: no verdict within {HANG_S:g}s",
                    "exit": "kernel host died (exit status 7)", "signal": "kernel host died (killed by SIGKILL)",
                    "os-exit": "kernel raised: KernelExitAttempt: the kernel called os._exit(5); refused"}[fault]
        assert expected in r.reason, (fault, r.reason)
    others = [r for r in results if r.case.case_id not in faults]
    assert others and all(r.verdict in ("pass", "unsupported") for r in others), \
        {(r.verdict, r.reason) for r in others if r.verdict not in ("pass", "unsupported")}
    # the workers send every verdict to the parent, the one writer: the dead workers' verdicts are in its file
    assert sorted(p.name for p in tmp_path.glob("t-*.jsonl")) == ["t-main.jsonl"]
    assert sum(totals["fake-faulty"].values()) == len(planned)
    meta = load_meta([tmp_path])
    assert [m["kind"] for m in meta] == ["run", "adapter", "run_end"]
    assert meta[1]["test_aid"] is True and meta[2]["verdicts"] == len(planned)
    text = out.getvalue()
    assert "\r" not in text and "done:" in text and f"hung past {HANG_S:g}s" in text


def _split(lines: list[str]) -> tuple[list[str], list[str]]:
    """(metadata records but the run's end, verdicts) of a sweep's file."""
    records = [(line, json.loads(line)) for line in lines if line.strip()]
    return ([line for line, d in records if "kind" in d and d["kind"] != "run_end"],
            [line for line, d in records if "kind" not in d])


def test_a_truncated_last_line_is_skipped(tmp_path: Path) -> None:
    # a truncated last line (a process killed mid-write) is skipped by the loader
    good = load_results(["tests/harness/fixtures/matrix_results.jsonl"])
    p = tmp_path / "cut.jsonl"
    p.write_text(json.dumps(good[0].to_dict()) + "\n" + json.dumps(good[1].to_dict())[:40], encoding="utf-8")
    assert len(load_results([p])) == 1


@pytest.mark.parametrize("profile", ["quick"])
def test_every_registered_adapter_has_a_plan(profile: str) -> None:
    for a in registry.all_adapters():
        try:
            ops.get(a.op)
        except ValueError:
            continue
        p = sweep.plan(a, profile)
        assert p.cases and len({c.case_id for c in p.cases}) == len(p.cases)


def test_resume_finishes_an_interrupted_run_without_judging_twice(tmp_path: Path) -> None:
    name = "reference-activation"
    planned = sweep.plan(registry.resolve(name), "quick").cases
    sweep.run_sweep([name], detect("cpu"), str(tmp_path), run_id="r", jobs=1, out=None)
    # an interrupted run: keep its metadata and the verdicts of the first half only
    main = tmp_path / "r-main.jsonl"
    meta, verdicts = _split(main.read_text().splitlines())
    kept = verdicts[: len(verdicts) // 2]
    main.write_text("\n".join(meta + kept) + "\n")
    manifest.seal(main, manifest.load_key(create=True))  # as its judge's last checkpoint left it
    out = io.StringIO()
    totals = sweep.run_sweep([name], detect("cpu"), str(tmp_path), run_id="r", jobs=1, out=out, resume=True)
    assert f"{len(kept)} of {len(planned)} cases already judged" in out.getvalue()
    by_id = Counter(r.case.case_id for r in load_results([tmp_path]))
    assert by_id == Counter(c.case_id for c in planned)  # every case once: the kept half was not re-run
    assert sum(totals[name].values()) == len(planned)
    with pytest.raises(ValueError, match="no results of run"):
        sweep.run_sweep([name], detect("cpu"), str(tmp_path), run_id="missing", jobs=1, out=None, resume=True)


def test_shards_partition_the_cells_stably() -> None:
    a = _narrow_experts()
    whole = sweep.plan(a, "full")
    parts = [sweep.Shard(k, 3).of(whole) for k in (1, 2, 3)]
    ids = [{c.case_id for c in p.cases} for p in parts]
    assert all(ids) and sum(map(len, ids)) == len(whole.cases)
    assert set().union(*ids) == {c.case_id for c in whole.cases}
    # the same shard on another machine, with other adapters around it, holds the same cells
    assert sweep.Shard(2, 3).of(sweep.plan(a, "full")).cases == parts[1].cases
    # every part still describes the whole plan, so the shards' metadata merge into the unsharded one
    assert {k: v for k, v in parts[0].summary().items() if not k.startswith("shard")} == whole.summary()
    for bad in ("0/2", "3/2", "2", "a/b", "1/0"):
        with pytest.raises(ValueError, match="--shard"):
            sweep.Shard.parse(bad)


def test_two_shards_merged_render_the_same_matrix_as_one_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's flow: `matrix --shard K/N` on each machine, then `matrix --from` over the shards' folders."""
    from harness.cli import main

    # `matrix --device cpu` chooses the interpreter for its process; on a GPU machine that must not outlive the test
    monkeypatch.setenv("TRITON_INTERPRET", "1")

    common = ["matrix", "--device", "cpu", "--jobs", "2", "--adapter", "reference-activation",
              "--adapter", FAKE.replace(":FAULTY", ":PARTIAL")]
    # exit 1: fake-partial has a planted bug (its footnotes and case files must merge too)
    assert main([*common, "--results-dir", str(tmp_path / "one"), "--out", ""]) == 1
    for k in (1, 2):
        assert main([*common, "--shard", f"{k}/2", "--results-dir", str(tmp_path / f"shard{k}")]) in (0, 1)
    shard_ids = [{r.case.case_id for r in load_results([tmp_path / f"shard{k}"])} for k in (1, 2)]
    assert all(shard_ids) and not shard_ids[0] & shard_ids[1]

    models = []
    for name, sources in (("one", ["one"]), ("merged", ["shard1", "shard2"])):
        out = tmp_path / f"render-{name}" / "MATRIX.md"  # the same name: case-file links name the folder
        assert main(["matrix", "--from", *[str(tmp_path / s) for s in sources], "--out", str(out)]) == 0
        model = json.loads(out.with_suffix(".json").read_text())
        for key in ("command", "sources"):
            model.pop(key)
        models.append(model)
    assert models[0] == models[1]
    assert models[0]["declared_vs_verified"]["claimed_but_failing"], "the planted bug must show"
    assert models[0]["verdicts"] == len(shard_ids[0]) + len(shard_ids[1])


def _rule_raises(device, features):  # type: ignore[no-untyped-def]
    raise RuntimeError("requires exploded")


def test_an_adapter_whose_support_rule_raises_gets_errors_and_the_others_their_verdicts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One adapter's `requires()` raising used to end the sweep with no verdict for anyone."""
    import dataclasses

    from harness.store.results import ResultStore

    broken = dataclasses.replace(registry.resolve("reference-activation"), name="rule-raises", requires=_rule_raises)
    monkeypatch.setitem(registry._REGISTRY, broken.name, broken)
    with ResultStore(tmp_path, run_id="r") as store:
        totals = sweep.sweep(["rule-raises", "reference-reduce"], detect("cpu"), store, out=None)
    assert totals["reference-reduce"]["pass"] > 0 and set(totals["reference-reduce"]) <= {"pass", "unsupported"}
    results = [r for r in load_results([tmp_path]) if r.adapter == "rule-raises"]
    errors = [r for r in results if r.verdict == "error"]
    assert errors and all("support rule error: rule-raises: its requires() raised RuntimeError" in r.reason
                          and r.declared for r in errors)
    assert {r.verdict for r in results} <= {"error", "unsupported"}


def test_resume_runs_the_cases_marked_not_run(tmp_path: Path) -> None:
    """Cases a dying pool marked "not run" were never judged: --resume must judge them, not count them."""
    from harness.store.render import dedupe

    name = "reference-activation"
    sweep.run_sweep([name], detect("cpu"), str(tmp_path), run_id="r", jobs=1, out=None)
    main = tmp_path / "r-main.jsonl"
    meta, lines = _split(main.read_text().splitlines())
    main.write_text("\n".join(meta + lines[:2]) + "\n")
    with open(main, "a") as fh:  # what the parent writes when its workers cannot start
        for line in lines[2:]:
            d = json.loads(line)
            d.update(verdict="error", reason="not run: worker processes fail to start (exit code 1)",
                     metrics={"marker": "died"})
            fh.write(json.dumps(d) + "\n")
    manifest.seal(main, manifest.load_key(create=True))  # the parent's own lines: vouched for
    out = io.StringIO()
    totals = sweep.run_sweep([name], detect("cpu"), str(tmp_path), run_id="r", jobs=1, out=out, resume=True)
    assert "2 of " in out.getvalue() and totals[name]["pass"] == len(lines)
    assert {r.verdict for r in dedupe(load_results([tmp_path]))} == {"pass"}


def test_lost_cuda_contexts_recycle_the_worker_and_no_case_is_left_unjudged(tmp_path: Path) -> None:
    # several sticky errors in one chunk once marked the rest of the chunk "not run" (19 false errors on an H100)
    spec = "tests.harness.fixtures.fake_adapters:LOSES_CONTEXT"
    adapter = registry.resolve(spec)
    planned = sweep.plan(adapter, "quick").cases
    lost = [c for c in planned if c.features["dtype"] == "float32"]
    assert len(lost) >= 3
    out = io.StringIO()
    sweep.run_sweep([spec], detect("cpu"), str(tmp_path), profile="quick", run_id="t", jobs=1, case_timeout=60,
                    out=out)
    results = {r.case.case_id: r for r in load_results([tmp_path])}
    assert set(results) == {c.case_id for c in planned}
    assert not [r.reason for r in results.values() if "not run" in r.reason]
    for c in planned:
        want = "error" if c in lost else "pass"
        assert results[c.case_id].verdict in (want, "unsupported"), results[c.case_id].reason
    for c in lost:  # the context was the kernel host's: the host is replaced, the worker judges on
        assert any("lost its CUDA context" in n for n in results[c.case_id].metrics.get("kernel_host", [])), \
            results[c.case_id].metrics


def test_workers_end_when_the_sweep_parent_is_killed(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    pidfile = tmp_path / "pids"
    script = ("import sys; from harness.cli import main; sys.exit(main(['matrix', '--adapter', "
              "'tests.harness.fixtures.fake_adapters:HANGS', '--device', 'cpu', '--jobs', '2', '--case-timeout', "
              f"'300', '--results-dir', {str(tmp_path / 'r')!r}, '--out', '']))")
    parent = subprocess.Popen([sys.executable, "-c", script], env=dict(os.environ, MOE_TEST_PIDFILE=str(pidfile)),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and len(pidfile.read_text().split() if pidfile.exists() else []) < 2:
        time.sleep(0.2)
    workers = [int(p) for p in pidfile.read_text().split()]
    assert len(workers) == 2
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 15
    alive = workers
    while alive and time.time() < deadline:
        time.sleep(0.2)
        alive = [p for p in workers if _alive(p)]
    assert not alive, "workers outlived their killed parent"


@pytest.mark.parametrize("to_group", [True, False], ids=["ctrl-c-to-the-group", "sigterm-to-the-parent"])
def test_ctrl_c_or_sigterm_stops_the_sweep_and_blames_no_kernel(tmp_path: Path, to_group: bool) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    pidfile, log = tmp_path / "pids", tmp_path / "log"
    cmd = [sys.executable, "-m", "harness", "matrix", "--adapter", "tests.harness.fixtures.fake_adapters:HANGS",
           "--device", "cpu", "--jobs", "2", "--case-timeout", "300", "--results-dir", str(tmp_path / "r"),
           "--out", ""]
    with open(log, "w") as err:
        parent = subprocess.Popen(cmd, env=dict(os.environ, MOE_TEST_PIDFILE=str(pidfile)), stdout=subprocess.DEVNULL,
                                  stderr=err, start_new_session=True, preexec_fn=signals.as_from_a_shell)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and len(pidfile.read_text().split() if pidfile.exists() else []) < 2:
            time.sleep(0.2)
        workers = [int(p) for p in pidfile.read_text().split()]
        # Ctrl-C reaches every process of the terminal's group; a job's time limit may terminate the parent only
        os.killpg(parent.pid, signal.SIGINT) if to_group else parent.send_signal(signal.SIGTERM)
        try:
            code = parent.wait(timeout=60)
        except subprocess.TimeoutExpired:  # say what is still running, and what the sweep printed, for the record
            ps = subprocess.run(["ps", "-eo", "pid,ppid,pgid,sid,stat,wchan:24,etimes,args"], capture_output=True,
                                text=True).stdout.splitlines()
            kept = [line for line in ps[1:] if line.split()[3] == str(parent.pid)]
            raise AssertionError(f"the sweep did not stop within 60 s of the signal (this worker: {signals.state()}); "
                                 "its session:\n"
                                 + "\n".join([ps[0], *kept]) + "\n" + log.read_text()[-3000:]) from None
        deadline = time.time() + 15
        while [p for p in workers if _alive(p)] and time.time() < deadline:
            time.sleep(0.2)
        assert not [p for p in workers if _alive(p)], "workers outlived the stopped sweep"
    finally:
        try:
            os.killpg(parent.pid, signal.SIGKILL)  # whatever is left of it
        except ProcessLookupError:
            pass
    text = log.read_text()
    assert code == 130 and "interrupted: the sweep was stopped (" in text and "--resume matrix-" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert [r for r in load_results([tmp_path / "r"], strict=False) if r.verdict == "error"] == []


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) is not running
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_results_a_kernel_removes_are_restored_from_the_judges_record(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Behind the sandbox (which makes the results folder read-only to kernels): a kernel of an unsandboxed host."""
    monkeypatch.setenv("MOE_HARNESS_SANDBOX", "off")
    monkeypatch.setenv("MOE_TEST_RESULTS", str(tmp_path))
    spec = "tests.harness.fixtures.fake_adapters:DELETES_RESULTS"
    totals = sweep.run_sweep([spec], detect("cpu"), str(tmp_path), profile="quick", run_id="t", jobs=1,
                             case_timeout=60, out=None)
    planned = sweep.plan(registry.resolve(spec), "quick").cases
    assert Counter(r.case.case_id for r in load_results([tmp_path])) == Counter(c.case_id for c in planned)
    assert sum(totals["fake-deletes-results"].values()) == len(planned)
    assert any(m["kind"] == "tampered" for m in load_meta([tmp_path]))


def test_verdicts_missing_from_the_files_fail_the_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last safeguard, should a results file lose verdicts anyway (here: to a kernel of an unsandboxed host): the
    sweep fails rather than render it."""
    monkeypatch.setenv("MOE_HARNESS_SANDBOX", "off")
    monkeypatch.setattr(sweep.ResultStore, "check_untouched", lambda self, full=False: True)  # no repair
    monkeypatch.setenv("MOE_TEST_RESULTS", str(tmp_path))
    with pytest.raises(sweep.VerdictsLost, match="verdicts counted by this sweep are missing"):
        sweep.run_sweep(["tests.harness.fixtures.fake_adapters:DELETES_RESULTS"], detect("cpu"), str(tmp_path),
                        profile="quick", run_id="t", jobs=1, case_timeout=60, out=None)


def test_a_kernel_that_changes_directory_cannot_move_the_results(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # a relative results folder is fixed at start (a kernel's chdir is also undone after its case)
    monkeypatch.chdir(tmp_path)
    store = sweep.ResultStore("rel", run_id="t")
    monkeypatch.chdir("/")
    assert store.directory == tmp_path / "rel"


def test_each_adapter_runs_in_a_kernel_host_of_its_own(tmp_path: Path) -> None:
    """One worker judges both adapters; what the first kernel changes in its process (its kernel host) is named in
    its verdicts and never reaches the other adapter's host, nor the judge."""
    specs = ["tests.harness.fixtures.flipping_adapter:ADAPTER", "reference-activation"]
    sweep.run_sweep(specs, detect("cpu"), str(tmp_path), profile="quick", run_id="one", jobs=1, out=None)
    results = load_results([tmp_path])
    flips = [r for r in results if r.adapter == "flips-switches"]
    others = [r for r in results if r.adapter == "reference-activation"]
    assert flips and others and {r.verdict for r in flips + others} <= {"pass", "unsupported"}
    assert any("mkldnn" in note for r in flips for note in r.metrics.get("kernel_host", []))
    assert not any(r.metrics.get("kernel_host") for r in others)


def test_an_idle_worker_takes_half_of_a_busy_workers_unsent_cases(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """One adapter, cut into one chunk: the worker that did not get it takes unsent halves of it, one case at a time
    reaching each worker, and every case still gets exactly one verdict."""
    spec = "tests.harness.fixtures.fake_adapters:SLOW"
    pidfile = tmp_path / "pids"
    monkeypatch.setenv("MOE_TEST_PIDFILE", str(pidfile))
    monkeypatch.setattr(planning, "MIN_CHUNK", 10**6)  # one chunk
    planned = sweep.plan(registry.resolve(spec), "quick").cases
    sweep.run_sweep([spec], detect("cpu"), str(tmp_path / "r"), profile="quick", run_id="s", jobs=2, out=None)
    results = load_results([tmp_path / "r"])
    assert Counter(r.case.case_id for r in results) == Counter(c.case_id for c in planned)
    assert {r.verdict for r in results} <= {"pass", "unsupported"}
    hosts = Counter(pidfile.read_text().split())
    assert len(hosts) == 2 and min(hosts.values()) >= 10, hosts  # both workers' kernel hosts judged many cases


def test_adapters_turned_away_whole_get_their_verdicts_without_a_worker(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A library that is not installed, a generation this machine is not: every case's verdict is known before any
    kernel host starts (each took a host start per worker that met it, seconds of a GPU sweep). They are written
    by the planning, with the same verdicts a worker gives, and no worker starts when nothing is left."""
    from harness.engine import runner
    from harness.sweep import workers

    def no_worker(self: object, slot: object) -> None:
        raise AssertionError("a worker started for cases whose verdicts were known")

    monkeypatch.setattr(workers.WorkerPool, "start", no_worker)
    adapters = {registry.resolve(spec).name: spec for spec in (f"tests.harness.fixtures.fake_adapters:{name}"
                                                               for name in ("NOT_INSTALLED", "OTHER_GENERATION"))}
    specs = list(adapters.values())
    planned = [c for s in specs for c in sweep.plan(registry.resolve(s), "quick").cases]
    totals = sweep.run_sweep(specs, detect("cpu"), str(tmp_path), profile="quick", run_id="g", jobs=2, out=None)
    results = load_results([tmp_path])
    assert Counter(r.case.case_id for r in results) == Counter(c.case_id for c in planned)
    assert {r.verdict for r in results if r.adapter == "fake-not-installed"} == {"not-installed"}
    assert all("pip install moe-harness-absent-library" in r.reason for r in results if r.verdict == "not-installed")
    assert {r.verdict for r in results if r.adapter == "fake-other-generation"} == {"unsupported"}
    assert sum(sum(c.values()) for c in totals.values()) == len(planned), totals
    for r in results:  # the verdicts the judge gives
        judged = runner.judge(r.case, registry.resolve(adapters[r.adapter]), detect("cpu"))
        assert (judged.verdict, judged.reason, judged.declared, judged.generation) == (
            r.verdict, r.reason, r.declared, r.generation)


def test_cases_are_judged_while_later_adapters_are_still_planned(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The planning runs beside the judging: the second adapter's planning waits for a verdict of the first one's
    cases, which only comes when those cases reach the workers before every adapter is planned."""
    first, second = "reference-activation", "tests.harness.fixtures.fake_adapters:CORRECT"
    judged = threading.Event()
    account, planned = sweep._Run.account, sweep._planned

    def counted(self: Any, index: int, verdict: str, declared: bool, record: Any = None) -> None:
        account(self, index, verdict, declared, record)
        if self.owner[index].name == "reference-activation":
            judged.set()

    waited: list[bool] = []
    threads: list[int] = []

    def second_waits(adapter: Any, spec: str, profile: str, device: Any) -> Any:
        if spec == second:
            waited.append(judged.wait(120))
        threads.append(torch.get_num_threads())
        return planned(adapter, spec, profile, device)

    monkeypatch.setattr(sweep._Run, "account", counted)
    monkeypatch.setattr(sweep, "_planned", second_waits)
    before = torch.get_num_threads()
    totals = sweep.run_sweep([first, second], detect("cpu"), str(tmp_path), profile="quick", run_id="p", jobs=2,
                             out=None)
    assert waited == [True]
    # the planning's oracle runs take their share of the CPUs beside the workers (torch's threads, restored after)
    assert set(threads) == {threads_for(3)} and torch.get_num_threads() == before
    expected = [c.case_id for s in (first, second) for c in sweep.plan(registry.resolve(s), "quick").cases]
    assert Counter(r.case.case_id for r in load_results([tmp_path])) == Counter(expected)
    assert set(totals) == {"reference-activation", "fake-correct"}


def test_adapters_whose_cases_workers_judge_are_planned_first_the_biggest_ops_first() -> None:
    """Workers wait for plans: those of adapters turned away whole (their verdicts need no worker) come last, and
    among the rest the ops with the most cells (the longest to judge) first."""
    specs = ["tests.harness.fixtures.fake_adapters:NOT_INSTALLED", "reference-routing", "reference-activation",
             "reference-experts"]
    opened = [(s, registry.resolve(s)) for s in specs]
    order = [a.name for _, a in sorted(opened, key=planning._order(detect("cpu")))]
    cells = {a.name: len(ops.get(a.op).all_cells()) for _, a in opened}
    assert order[-1] == "fake-not-installed"
    assert [cells[n] for n in order[:-1]] == sorted((cells[n] for n in order[:-1]), reverse=True), (order, cells)


def test_an_adapter_is_cut_into_few_chunks_of_many_cases() -> None:
    """A chunk moves a worker to the adapter's kernel host (seconds to start): an adapter is cut into at most a
    quarter as many chunks as there are workers, of MIN_CHUNK cases or more unless it is one."""
    for jobs in (1, 2, 8, 16, 64):
        for cases in (1, 10, planning.MIN_CHUNK, 105, 1000, 10_000):
            n = planning.chunk_count(cases, jobs)
            assert 1 <= n <= max(1, -(-jobs // 4)), (cases, jobs, n)
            assert n == 1 or cases // n >= planning.MIN_CHUNK, (cases, jobs, n)
    assert planning.chunk_count(1000, 16) > 1  # a big adapter is shared from the start on a machine of many workers


def test_idle_workers_take_halves_while_only_adapters_turned_away_whole_are_left_to_plan(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once every plan with cases for the workers is made, an idle worker takes half of a busy one's chunk even
    while the planning goes on: the last adapter's planning waits until both workers' kernel hosts judged cases."""
    slow, away = (f"tests.harness.fixtures.fake_adapters:{n}" for n in ("SLOW", "NOT_INSTALLED"))
    pidfile = tmp_path / "pids"
    monkeypatch.setenv("MOE_TEST_PIDFILE", str(pidfile))
    monkeypatch.setattr(planning, "MIN_CHUNK", 10**6)  # one chunk
    planned = sweep._planned
    shared: list[bool] = []

    def away_waits(adapter: Any, spec: str, profile: str, device: Any) -> Any:
        if spec == away:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and len(set(pidfile.read_text().split()) if pidfile.exists() else ()) < 2:
                time.sleep(0.1)
            shared.append(pidfile.exists() and len(set(pidfile.read_text().split())) == 2)
        return planned(adapter, spec, profile, device)

    monkeypatch.setattr(sweep, "_planned", away_waits)
    sweep.run_sweep([away, slow], detect("cpu"), str(tmp_path / "r"), profile="quick", run_id="h", jobs=2, out=None)
    assert shared == [True]
    expected = [c.case_id for s in (away, slow) for c in sweep.plan(registry.resolve(s), "quick").cases]
    assert Counter(r.case.case_id for r in load_results([tmp_path / "r"])) == Counter(expected)


def test_each_planned_adapters_first_chunk_is_queued_before_any_second_one(tmp_path: Path) -> None:
    """The sweep cuts a plan into chunks as it arrives: whatever the planning order, the workers get every adapter's
    first chunk, bigger adapters first, before any adapter's second one."""
    from harness.store.results import ResultStore
    from harness.sweep.progress import Progress
    from harness.sweep.schedule import ChunkQueue

    dev = detect("cpu")
    run = sweep._Run(dev, ResultStore(str(tmp_path), run_id="q", worker="main"))
    run.progress = Progress(0, {}, None, workers=16)
    chunks = ChunkQueue()
    sizes = {}
    for name in ("reference-activation", "reference-reduce"):  # the smaller one planned first
        adapter = registry.resolve(name)
        p = sweep.plan(adapter, "quick")
        sizes[name] = len(p.cases)
        record = sweep.adapter_record(adapter, p, dev, "quick")
        sweep._add_plan(run, planning.Planned(adapter, name, p, record), {}, chunks, 16, None)
    run.main.close()
    assert sizes["reference-activation"] < sizes["reference-reduce"]
    order = [(c.spec, c.items[0][0]) for c in chunks]
    first_case = {spec: min(i for s, i in order if s == spec) for spec, _ in order}
    firsts = [spec for spec, i in order if i == first_case[spec]]
    assert len(order) > 2 and [spec for spec, _ in order[:2]] == firsts == ["reference-reduce",
                                                                           "reference-activation"], order
    assert sum(len(c.items) for c in chunks) == sum(sizes.values())


def test_sweep_workers_and_kernel_hosts_ask_one_fork_server_preload_without_triton() -> None:
    """Workers and kernel hosts fork from one fork server, started by whichever comes first; what it preloads is
    fixed then. Were it the workers' and were Triton in it, hosts started afterwards would hold a Triton imported
    before the sweep chose the interpreter or not."""
    code = ("import multiprocessing.forkserver as fs, sys\n"
            "from harness.sweep.workers import _context\n"
            "_context()\n"
            "from harness.engine import fork_server\n"
            "assert fs._forkserver._preload_modules == list(fork_server.PRELOAD), fs._forkserver._preload_modules\n"
            "assert not any(m == 'triton' or m.startswith('triton.') for m in fork_server.PRELOAD)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
