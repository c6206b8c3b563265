"""The deterministic sweep behind `python -m harness matrix`.

Every adapter, a deterministic selection of cells of its op's feature axes (declared or not), several boundary
cases per cell (`harness.sweep.selection`); optionally one shard of the cells (`Shard`, a sweep split over
machines); every case judged in a fault-isolated worker process (`harness.sweep.workers`) and its verdict appended
to the results store as soon as it is judged.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch

from harness import ops, registry
from harness.core import files
from harness.core.case import Case
from harness.core.device import LISTING_DEVICE, DeviceInfo, git_state, threads_for
from harness.core.result import Result
from harness.engine import remote, sandbox
from harness.engine.host import Host
from harness.store import manifest
from harness.store.results import ResultStore, load_results, new_run_id, sweep_file
from harness.sweep import plan_cache
from harness.sweep.planning import Planned, Planning, chunk_count
from harness.sweep.progress import Progress, WorkerWarnings, counted_as
from harness.sweep.schedule import ChunkQueue
from harness.sweep.selection import (
    CASES_PER_CELL,
    QUICK_ALL_CELLS,
    Plan,
    Shard,
    adapter_record,
    pairwise_cover,
    plan,
    select_cells,
)
from harness.sweep.workers import SweepInterrupted, WorkerPool, _Chunk, default_jobs, judge_safely

__all__ = ["CASES_PER_CELL", "QUICK_ALL_CELLS", "UNPLANNED", "Plan", "Shard", "SweepInterrupted", "VerdictsLost",
           "adapter_record", "default_jobs", "open_run", "pairwise_cover", "plan", "run_sweep", "select_cells", "sweep"]


@dataclass
class _Run:
    """The bookkeeping of one sweep: every case by index, its adapter, the counts, the parent's results file."""

    device: DeviceInfo
    main: ResultStore
    progress: Progress | None = None
    cases: dict[int, Case] = field(default_factory=dict)
    owner: dict[int, Any] = field(default_factory=dict)
    totals: dict[str, Counter] = field(default_factory=dict)
    left_of: Counter = field(default_factory=Counter)
    #: verdicts given without a worker: every case of an adapter the gate turns away whole (case id -> result)
    gated: dict[str, Result] = field(default_factory=dict)

    def account(self, index: int, verdict: str, declared: bool, record: str | Result | None = None) -> None:
        """Count a verdict; `record`: its result (as a worker judged it, in JSON), written to the run's file here."""
        spent = None
        if record is not None:
            result = record if isinstance(record, Result) else Result.from_dict(json.loads(record))
            self.main.append(result)
            spent = result.metrics.get("time_s")
        name = self.owner[index].name
        self.totals[name][counted_as(verdict, declared)] += 1
        assert self.progress is not None
        self.progress.record(index, verdict, declared, spent if isinstance(spent, dict) else None)
        self.left_of[name] -= 1
        if self.left_of[name] == 0 and not self.progress.tty:
            self.progress.note(f"{name}: " + ", ".join(f"{v} {k}" for k, v in sorted(self.totals[name].items())))

    def mark(self, index: int, reason: str, kind: str, **metrics: Any) -> None:
        """An `error` verdict, written by the parent, for a case whose worker hung or died."""
        case, adapter = self.cases[index], self.owner[index]
        declared = adapter.claims(case.features, self.device)
        device = adapter.device_for(self.device)
        r = Result(case=case, verdict="error", reason=reason, metrics={"marker": kind, **metrics}, declared=declared,
                   generation=device.generation, device=device.to_dict())
        self.main.append(r)
        self.account(index, r.verdict, declared)


def check_run_id(run_id: str) -> None:
    """A run id names files in the results folder: letters, digits, `.`, `_` and `-` only, never a path."""
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]*", run_id or ""):
        raise ValueError(f"run id {run_id!r}: use letters, digits, '.', '_' and '-' only (it names files in the "
                         "results folder, never a path)")


def _lock_run(results_dir: str, run_id: str) -> Any:
    """Hold `<run_id>.lock` for as long as this process lives: a second sweep (a second `--resume`) of the same
    run id is refused instead of judging its cases twice. ValueError when another process holds it."""
    import fcntl

    os.makedirs(results_dir, exist_ok=True)
    fh = open(os.path.join(results_dir, f"{run_id}.lock"), "w")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        raise ValueError(f"run {run_id} is being swept by another process (its lock, {run_id}.lock, is held); "
                         "wait for it to finish") from None
    return fh


def run_files(results_dir: str | os.PathLike, run_id: str) -> list[Path]:
    """The results file of sweep `run_id` (one, written by the sweep's parent): [] before it exists. Other files
    of the run's name in the folder are not the sweep's (something else wrote them) and are never read."""
    path = sweep_file(results_dir, run_id)
    return [path] if path.exists() else []


def _bad_lines(found: manifest.Inspection, lines: list[str]) -> str:
    """The lines of a results file that do not match its manifest, in words (the first few named)."""
    words = []
    for n in found.changed[:3]:
        try:
            json.loads(lines[n - 1])
            words.append(f"line {n} changed")
        except (ValueError, IndexError):
            words.append(f"line {n} is not a valid result record")
    if len(found.changed) > 3:
        words.append(f"{len(found.changed) - 3} more line(s) changed")
    if found.missing:
        words.append(f"{found.missing} line(s) removed")
    return ", ".join(words)


def judged_before(results_dir: str, run_id: str, drop_bad_lines: bool = False) -> tuple[dict[str, Result], list[str]]:
    """Cases run `run_id` already judged (for --resume), by case id, and the lines to tell the user (what was left
    out). Only what the run's manifest, signed on this machine, vouches for is used; ValueError (one line) when the
    file has no such manifest, or when some line does not match it and `drop_bad_lines` is off."""
    previous = run_files(results_dir, run_id)
    if not previous:
        raise ValueError(f"resume: no results of run {run_id!r} in {results_dir}")
    path = previous[0]
    data = files.read_bytes(path)
    key = manifest.load_key()
    found = manifest.inspect(path, data, key)
    if not found.signed:
        why = found.why() if not found.matches else "its manifest is not signed with this machine's key"
        raise ValueError(f"resume: {path} ({why}): a run resumes only from what this machine's judge wrote")
    lines = data.decode("utf-8", "replace").split("\n")
    notes = []
    usable = found.usable
    if found.status == "mismatch":
        bad = _bad_lines(found, lines)
        if not drop_bad_lines:
            raise ValueError(f"resume: {path}: {bad}: it does not match its manifest; nothing was changed (pass "
                             "--drop-bad-lines to leave those lines out, kept in the file, and judge their cases "
                             "again)")
        notes.append(f"dropped: {path}: {bad} (kept in the file, excluded by its manifest; their cases are judged "
                     "again)")
        usable = sorted(manifest.vouched_lines(path, data, key))
    elif found.tail:
        notes.append(f"left out: {path}: {len(found.tail)} line(s) written after its manifest's last checkpoint "
                     "(their cases are judged again)")
    results = [Result.from_dict(d) for d in (json.loads(lines[i]) for i in usable if lines[i].strip())
               if isinstance(d, dict) and "case" in d]
    # a case marked "not run" (its workers never started it) was never judged: a resume runs it
    return {r.case.case_id: r for r in results if not _never_judged(r)}, notes


def _never_judged(r: Result) -> bool:
    """A verdict the parent wrote for a case that never ran: its workers did not start, or the adapter could not
    be loaded (a resume judges it, whatever was broken may be fixed)."""
    marker = r.metrics.get("marker")
    return bool(marker) and (marker == "unloadable" or r.reason.startswith("not run"))


def run_record(device: DeviceInfo, profile: str, command: str, shard: Shard | None) -> dict[str, Any]:
    """The metadata a sweep's results file opens with (its `run` record)."""
    commit, dirty = git_state()
    return {"generation": device.generation, "device": device.to_dict(), "profile": profile, "command": command,
            "commit": os.environ.get("MOE_HARNESS_COMMIT", commit), "dirty": dirty,
            "quick_all_cells": QUICK_ALL_CELLS, "cases_per_cell": CASES_PER_CELL[profile], "shard": str(shard or ""),
            "kernel_hosts": sandbox.describe()}


def open_run(results_dir: str, run_id: str, device: DeviceInfo, profile: str, command: str,
             shard: Shard | None) -> int:
    """Make sure run `run_id` has its results file (so that `--resume run_id` continues it, even when it was stopped
    before its planning began); the number of verdicts the file holds."""
    files = run_files(results_dir, run_id)
    if not files:
        store = ResultStore(os.path.abspath(results_dir), run_id=run_id, worker="main")
        store.append_meta("run", run_record(device, profile, command, shard))
        store.close()
        return 0
    return len(load_results(files, strict=False))


def _planned(adapter: Any, spec_name: str, profile: str, device: DeviceInfo) -> Plan:
    """`plan(adapter, profile)`, remembered per machine (`plan_cache`: signed here, made again when it does not
    match)."""
    name = plan_cache.key(adapter, spec_name, profile, device.generation)
    found = plan_cache.load(name)
    if found is None:
        with contextlib.suppress(ValueError):  # an op without a spec: plan() says so
            if isinstance(adapter, remote.RemoteAdapter):
                adapter.prefetch_rules(None, ops.get(adapter.op).all_cells())
        found = plan(adapter, profile)
        plan_cache.store(name, found)
    return found


#: the count an adapter that could not be planned gets in `run_sweep`'s totals: none of its cases was judged, which
#: a caller must not take for a clean run
UNPLANNED = "unplanned"


def _add_plan(run: _Run, planned: Planned, done: dict[str, Result], chunks: ChunkQueue, jobs: int,
              on_plan: Callable[[str, Plan], None] | None) -> None:
    """Record one adapter's plan in the run (its metadata; the verdicts known without a worker: judged before a
    resume, or given by the gate in planning) and queue the rest of its cases for the workers, in chunks."""
    adapter, p, progress = planned.adapter, planned.plan, run.progress
    assert progress is not None
    run.main.append_meta("adapter", {**planned.record, **({"plan_error": planned.error} if planned.error else {})})
    if p is None:
        progress.note(f"{adapter.name}: cannot plan its cases ({planned.error}); skipped")
        run.totals[adapter.name] = Counter({UNPLANNED: 1})
        return
    if tampered := planned.record.get("tampered"):
        progress.note(tampered)
    run.gated.update(planned.gated)
    run.totals[adapter.name] = Counter()
    if on_plan is not None:
        on_plan(adapter.name, p)
    first = len(run.cases)
    for at, case in enumerate(p.cases, first):
        run.cases[at], run.owner[at] = case, adapter
    run.left_of[adapter.name] += len(p.cases)
    progress.add({i: (run.cases[i].adapter, run.cases[i].cell()) for i in range(first, len(run.cases))})
    whole = f" ({len(p.cells)} of its {p.summary()['cells']} cells in this shard)" if p.shard else ""
    progress.note(f"  {p.adapter}: {p.selection} cells ({p.summary()['cells']} of {p.cells_total}){whole}, "
                  f"{len(p.cases)} cases")
    items = []
    for index in range(first, len(run.cases)):
        case = run.cases[index]
        if case.case_id in done:
            run.account(index, done[case.case_id].verdict, done[case.case_id].declared)
        elif case.case_id in planned.gated:
            r = planned.gated[case.case_id]
            run.account(index, r.verdict, r.declared, r)
        else:
            items.append((index, case))
    size = math.ceil(len(items) / chunk_count(len(items), jobs)) if items else 1
    family = remote.host_family(adapter)
    for j, at in enumerate(range(0, len(items), size)):
        chunks.insert_by_weight(_Chunk(planned.spec, items[at:at + size], family=family, weight=(-j, len(items))))


def _announce(out: IO[str] | None, run: _Run, adapters: int, profile: str, jobs: int, case_timeout: float,
              shard: Shard | None, planning_s: float, resumed: str) -> None:
    """The plan's summary, once every adapter is planned."""
    if out is None:
        return
    assert run.progress is not None
    where = f", shard {shard}" if shard is not None else ""
    gated = f" ({len(run.gated)} judged in planning: not installed, or not for this generation)" if run.gated else ""
    run.progress.note(f"{adapters} adapter(s), {run.progress.cells_total} cells, {len(run.cases)} cases{gated}, "
                      f"profile {profile}{where}, {jobs} worker(s), case timeout {case_timeout:g}s; planned in "
                      f"{planning_s:.1f}s")
    if resumed:
        run.progress.note(resumed)


def run_sweep(adapter_specs: Sequence[str], device: DeviceInfo, results_dir: str, *, profile: str = "quick",
              run_id: str | None = None, jobs: int | None = None, case_timeout: float = 120.0,
              command: str = "", out: IO[str] | None = sys.stderr,
              on_plan: Callable[[str, Plan], None] | None = None, resume: bool = False,
              shard: Shard | None = None, planner: Host | None = None,
              pool: WorkerPool | None = None, drop_bad_lines: bool = False,
              on_planned: Callable[[], None] | None = None) -> dict[str, Counter]:
    """Plan every adapter's cases, judge them in worker processes, and return verdict counts per adapter (an adapter
    that could not be planned counts one `UNPLANNED`).

    `adapter_specs` are registered names or module:object specs (workers resolve them the same way).
    Results go to `<results_dir>/<run_id>-main.jsonl`, written by this process alone (the workers send it their
    verdicts): metadata, every verdict, and the verdicts of cases whose worker hung or died.
    resume: continue run `run_id` (its files in results_dir): cases it already judged are counted, not re-run,
    so a sweep cut short (a time limit, a lost machine) finishes in a later call (`judged_before`: only what its
    manifest vouches for; `drop_bad_lines` leaves out the lines that do not match it instead of refusing).
    shard: judge only this shard of the cells (the metadata still describes the whole plan, so shards merge).
    planner: a CPU host that has the adapters imported (remote.expand's), to plan in; closed once the plan is made.
    pool: workers started for this run before it was planned (`worker_pool(..., start=n)`); stopped at the end.
    on_planned: called once every adapter is planned (the judging goes on).
    Ctrl-C or SIGTERM raises `SweepInterrupted` (a KeyboardInterrupt) once the workers are stopped: the cases they
    were running get no verdict (the user stopped them, not their kernels) and `resume` judges them later.
    """
    run_id = run_id or f"matrix-{device.generation}-{new_run_id()}"
    results_dir = os.path.abspath(results_dir)  # fixed now: a kernel that changes the cwd cannot move the results
    sandbox.protect(results_dir)  # read-only to the kernel hosts started from now on
    try:
        check_run_id(run_id)
        lock = _lock_run(results_dir, run_id)
    except BaseException:
        if pool is not None:
            pool.stop(kill=True)
        raise
    try:
        done, notes = judged_before(results_dir, run_id, drop_bad_lines) if resume else ({}, [])
        for note in notes if out is not None else ():
            print(note, file=out, flush=True)
        return _sweep_locked(adapter_specs, device, results_dir, run_id, profile, jobs, case_timeout, command, out,
                             on_plan, resume, done, shard, planner, pool, on_planned)
    finally:
        if pool is not None:  # started early: stopped here even when planning failed (a no-op after its run)
            pool.stop(kill=True)
        with contextlib.suppress(OSError):
            os.unlink(lock.name)
        lock.close()


def _sweep_locked(adapter_specs: Sequence[str], device: DeviceInfo, results_dir: str, run_id: str, profile: str,
                  jobs: int | None, case_timeout: float, command: str, out: IO[str] | None,
                  on_plan: Callable[[str, Plan], None] | None, resume: bool, done: dict[str, Result],
                  shard: Shard | None, planner: Host | None, pool: WorkerPool | None,
                  on_planned: Callable[[], None] | None = None) -> dict[str, Counter]:
    run = _Run(device, ResultStore(results_dir, run_id=run_id, worker="main"))
    run.main.append_meta("run", run_record(device, profile, command, shard))
    n_jobs = max(1, jobs or default_jobs(device))
    run.progress = Progress(0, {}, out, workers=n_jobs)
    if out is not None:
        print(sandbox.describe(), file=out, flush=True)
    planner = planner or Host(LISTING_DEVICE)
    started = time.monotonic()
    planning = Planning(adapter_specs, planner, device, profile, shard,
                        lambda adapter, spec: _planned(adapter, spec, profile, device)).start()
    chunks = ChunkQueue()

    def feed() -> tuple[bool, bool]:
        """Take the plans made since the last call: (whether more plans come, whether more chunks may come)."""
        for planned in planning.take():
            _add_plan(run, planned, done, chunks, n_jobs, on_plan)
        run.progress.planning = "" if planning.done else f"planning: {planning.made} of {len(adapter_specs)} adapters"
        if not planning.done:
            return True, not planning.for_workers_done
        planner.close()
        before = sum(1 for c in run.cases.values() if c.case_id in done)
        resumed = f"resuming {run_id}: {before} of {len(run.cases)} cases already judged" if resume else ""
        adapters = sum(1 for c in run.totals.values() if not c[UNPLANNED])
        _announce(out, run, adapters, profile, n_jobs, case_timeout, shard, time.monotonic() - started, resumed)
        if on_planned is not None:
            on_planned()
        return False, False

    warned = WorkerWarnings(warnings_log(results_dir, run_id))
    threads = torch.get_num_threads()
    torch.set_num_threads(threads_for(n_jobs + 1))  # the planning's oracle runs share the CPUs with the workers
    try:
        pool = pool or worker_pool(device, results_dir, run_id, n_jobs, case_timeout)
        pool.several_families = len(set(adapter_specs)) != 1
        pool.run(chunks, run.progress, run.cases, run.account, run.mark, feed=feed)
    finally:
        torch.set_num_threads(threads)
        planner.close()  # first: a planning thread waiting on it ends
        planning.stop()
        run.progress.finish()
        run.main.append_meta("run_end", {"generation": device.generation, "verdicts": run.progress.done,
                                         "wall_s": round(run.progress.elapsed(), 2),
                                         "counts": dict(run.progress.counts), "warnings": warned.count()})
        run.main.close()
        if out is not None and warned.summary():
            print(warned.summary(), file=out, flush=True)
    _check_recorded(results_dir, run_id, run)
    return run.totals


def warnings_log(results_dir: str, run_id: str) -> Path:
    """Where a sweep's workers and kernel hosts log their warnings."""
    return Path(os.path.abspath(results_dir)) / f"{run_id}-warnings.log"


def worker_pool(device: DeviceInfo, results_dir: str, run_id: str, jobs: int | None = None,
                case_timeout: float = 120.0, *, start: int = 0) -> WorkerPool:
    """The worker pool of run `run_id` (`jobs`: default by device); `start` workers started now, before the cases
    are planned (for `run_sweep(pool=...)`: their start overlaps the listing and the planning)."""
    pool = WorkerPool(device, os.path.abspath(results_dir), run_id, max(1, jobs or default_jobs(device)),
                      case_timeout, warnings_log=str(warnings_log(results_dir, run_id)))
    if start:
        pool.start_workers(start)
    return pool


class VerdictsLost(RuntimeError):
    """Verdicts the sweep counted are not in its results files (something removed or rewrote them)."""


def _check_recorded(results_dir: str, run_id: str, run: _Run) -> None:
    """Every case the parent counted has its verdict in the run's files: what is rendered is what was judged."""
    recorded = {r.case.case_id for r in load_results(run_files(results_dir, run_id),
                                                     strict=False)}
    lost = [c for c in run.cases.values() if c.case_id not in recorded]
    if lost:
        names = ", ".join(sorted({c.adapter for c in lost}))
        raise VerdictsLost(f"{len(lost)} of {len(run.cases)} verdicts counted by this sweep are missing from "
                           f"{results_dir}/{run_id}-*.jsonl (adapters: {names}): the files were removed or "
                           "rewritten while the sweep ran; nothing is rendered from them")


def sweep(adapter_names: Iterable[str], device: DeviceInfo, store: ResultStore, *, profile: str = "quick",
          unverifiable: set[str] | None = None, out: IO[str] | None = sys.stderr,
          shard: Shard | None = None) -> dict[str, Counter]:
    """In-process sweep (no isolation) into `store`, for callers that want one process; same plan as the CLI."""
    totals: dict[str, Counter] = {}
    for name in adapter_names:
        adapter = registry.resolve(name)
        p = plan(adapter, profile)
        if shard is not None:
            p = shard.of(p)
        store.append_meta("adapter", adapter_record(adapter, p, device, profile))
        counts: Counter = Counter()
        for case in p.cases:
            r = judge_safely(case, adapter, device, unverifiable)
            store.append(r)
            counts[counted_as(r.verdict, r.declared)] += 1
        if out is not None:
            print(f"{name}: {len(p.cells)} cells, {len(p.cases)} cases: "
                  + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())), file=out, flush=True)
        totals[name] = counts
    return totals
