"""The deterministic sweep behind `python -m harness matrix`.

Every adapter, a deterministic selection of cells of its op's feature axes (declared or not), several boundary
cases per cell; every verdict appended to the results store as soon as it is judged.

Cell selection (`plan`):
  full   every applicable cell (the full product of the axes, minus `OpSpec.inapplicable`).
  quick  every cell when the op has at most `QUICK_ALL_CELLS` of them; otherwise a pairwise (all-pairs) covering
         set, built greedily and deterministically: first over the cells the adapter declares (so every pair of
         declared values is exercised together in a cell the kernel accepts), then extended until every pair of
         values of any two axes that occurs in some applicable cell is covered.
  Cases of a cell are its op's boundary cases (`OpSpec.boundary`); a cell the adapter does not declare gets one
  case (enough to show a clean rejection); quick takes `cases_per_cell` of them, rotated
  by the cell's position so that every boundary shape still appears across the cells. A case's seed is its index
  in the boundary list, so the same case has the same seed in every profile.

Fault isolation (`run_sweep`): cases run in worker processes (never forked from a process that may hold a CUDA
context: a fork server, else spawn; a pool sized to the CPU count, or six per GPU, at most one per CPU), each
writing its own results file, one flushed line per verdict. The parent hands out chunks of one adapter's cases,
watches every worker, and when a case hangs past the per-case timeout (the worker is killed) or the worker dies
(os._exit, a signal, a CUDA context lost to an illegal memory access), writes an `error` verdict for that case with
the reason to its own file, starts a fresh worker and carries on with the rest.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import re
import sys
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import IO, Any

from harness.core.case import Case
from harness.core.device import DeviceInfo
from harness.store.results import Result, ResultStore

CASES_PER_CELL = {"quick": 2, "full": 6}
#: ops with at most this many applicable cells run all of them in the quick profile
QUICK_ALL_CELLS = 64
#: seconds a worker may take to start (import torch, triton, the kernels) before it counts as dead
START_TIMEOUT_S = 180.0
#: after this many worker deaths on one chunk before its first case starts, the chunk is marked, not retried
MAX_SILENT_DEATHS = 2
#: CUDA errors after which the context is unusable: the worker exits and a fresh one takes over
_STICKY_CUDA = re.compile(r"illegal memory access|unspecified launch failure|misaligned address|"
                          r"device-side assert|CUDA error: an illegal|cudaErrorIllegalAddress|CUDA-capable device",
                          re.IGNORECASE)


# -- cell selection -----------------------------------------------------------------------------------------------

def _pairs_of(cell: Sequence[str]) -> list[tuple[int, str, int, str]]:
    n = len(cell)
    found: list[tuple[int, str, int, str]] = [(i, cell[i], -1, "") for i in range(n)]  # singles, for 1-axis ops
    found += [(i, cell[i], j, cell[j]) for i in range(n) for j in range(i + 1, n)]
    return found


def pairwise_cover(candidates: Sequence[Sequence[str]], covered: set | None = None) -> list[int]:
    """Indices of a subset of `candidates` (tuples of axis values) covering every pair of values of two axes that
    occurs in some candidate. Greedy: repeatedly the first candidate covering the most uncovered pairs.
    `covered` (updated in place) holds pairs already covered by cells chosen earlier."""
    covered = set() if covered is None else covered
    pairs = [_pairs_of(c) for c in candidates]
    holders: dict[tuple, list[int]] = {}
    for idx, ps in enumerate(pairs):
        for p in ps:
            holders.setdefault(p, []).append(idx)
    gain = [sum(p not in covered for p in ps) for ps in pairs]
    chosen: list[int] = []
    while True:
        best = max(range(len(gain)), key=gain.__getitem__, default=None)
        if best is None or gain[best] <= 0:
            return chosen
        chosen.append(best)
        for p in pairs[best]:
            if p not in covered:
                covered.add(p)
                for idx in holders[p]:
                    gain[idx] -= 1


@dataclass
class Plan:
    """The cases of one adapter in one profile, and how its cells were chosen."""

    adapter: str
    op: str
    selection: str  # "all" | "pairwise"
    cells: list[dict[str, str]]
    cells_total: int
    cases: list[Case]

    def summary(self) -> dict[str, Any]:
        return {"selection": self.selection, "cells": len(self.cells), "cells_total": self.cells_total,
                "cases": len(self.cases)}


def select_cells(spec: Any, adapter: Any, profile: str) -> tuple[list[dict[str, str]], str, int]:
    """(cells in product order, selection name, number of applicable cells) for `adapter` in `profile`."""
    if profile not in CASES_PER_CELL:
        raise ValueError(f"profile must be one of {', '.join(CASES_PER_CELL)}, got {profile!r}")
    cells = spec.all_cells()
    if profile == "full" or len(cells) <= QUICK_ALL_CELLS:
        return cells, "all", len(cells)
    names = spec.axis_names()
    rows = [tuple(c[a] for a in names) for c in cells]
    declared = [i for i, c in enumerate(cells) if all(c[a] in adapter.support.get(a, ()) for a in names)]
    covered: set = set()
    picked = {declared[i] for i in pairwise_cover([rows[i] for i in declared], covered)}
    picked |= set(pairwise_cover(rows, covered))
    return [cells[i] for i in sorted(picked)], "pairwise", len(cells)


def plan(adapter: Any, profile: str = "quick") -> Plan:
    """Every case the sweep runs for `adapter` in `profile`, deterministically."""
    from harness import ops

    spec = ops.get(adapter.op)
    cells, selection, total = select_cells(spec, adapter, profile)
    position = {tuple(sorted(c.items())): i for i, c in enumerate(spec.all_cells())}
    cases = []
    for cell in cells:
        bounds = spec.boundary(adapter, cell)
        if not bounds:
            continue
        # An undeclared cell needs one case to show a clean rejection (or "works but not claimed"), not all of them.
        per_cell = CASES_PER_CELL[profile] if all(cell[a] in adapter.support.get(a, ()) for a in cell) else 1
        offset = position[tuple(sorted(cell.items()))] % len(bounds) if profile == "quick" else 0
        for seed in sorted({(offset + j) % len(bounds) for j in range(min(per_cell, len(bounds)))}):
            cases.append(Case(op=adapter.op, adapter=adapter.name, features=dict(cell), seed=seed, **bounds[seed]))
    return Plan(adapter.name, adapter.op, selection, cells, total, cases)


def adapter_record(adapter: Any, p: Plan | None, device: DeviceInfo, profile: str) -> dict[str, Any]:
    """The metadata the renderer needs about an adapter (written once per run, per adapter)."""
    axes: list[dict[str, Any]] = []
    op_title = adapter.op
    try:
        from harness import ops

        spec = ops.get(adapter.op)
        axes = [{"name": a.name, "title": a.title, "values": list(a.values)} for a in spec.axes]
        op_title = spec.title
    except ValueError:
        pass
    return {"adapter": adapter.name, "op": adapter.op, "op_title": op_title, "source": adapter.source,
            "description": adapter.description,
            "test_aid": bool(adapter.test_aid), "generations": list(adapter.generations),
            "support": {k: list(v) for k, v in adapter.support.items()}, "axes": axes,
            "generation": device.generation, "profile": profile, **(p.summary() if p else {})}


# -- the worker process -------------------------------------------------------------------------------------------

def _judge_safely(case: Case, adapter: Any, dev: DeviceInfo, unverifiable: set[str] | None) -> Result:
    from harness.engine import runner

    try:
        return runner.judge(case, adapter, dev, unverifiable=unverifiable)
    except Exception as e:  # runner.judge should not raise; if it does, the case is still recorded
        declared = adapter.declares(case.features, dev)[0]
        return Result(case=case, verdict="error", reason=f"harness error: {type(e).__name__}: {e}",
                      metrics={"trace": traceback.format_exc(limit=4)}, declared=declared,
                      generation=dev.generation, device=dev.to_dict())


def _worker(conn: Connection, device: str, results_dir: str, run_id: str, slot: int, threads: int) -> None:
    """Worker loop: receive (adapter spec, [(index, case dict)]) chunks, judge each case, append, report."""
    import torch

    torch.set_num_threads(max(1, threads))
    from harness import registry
    from harness.core.device import detect

    dev = detect(device)
    unverifiable: set[str] | None = None
    if dev.generation == "interp":
        from harness.engine.interpreter import unverifiable_here

        unverifiable = unverifiable_here()
    store = ResultStore(results_dir, run_id=run_id, worker=f"w{os.getpid()}")
    resolved: dict[str, Any] = {}
    conn.send(("ready", os.getpid()))
    while True:
        msg = conn.recv()
        if msg is None:
            break
        spec, items = msg
        try:
            adapter = resolved.get(spec) or registry.resolve(spec)
            resolved[spec] = adapter
        except Exception as e:
            conn.send(("unloadable", f"{type(e).__name__}: {e}"))
            continue
        for index, case_dict in items:
            conn.send(("start", index))
            r = _judge_safely(Case.from_dict(case_dict), adapter, dev, unverifiable)
            store.append(r)
            conn.send(("done", index, r.verdict, r.declared))
            if dev.is_cuda and r.verdict == "error" and _STICKY_CUDA.search(r.reason):
                store.close()
                os._exit(3)  # the CUDA context is gone; the parent starts a fresh worker for the rest
        conn.send(("idle",))
    store.close()


def _context() -> Any:
    """Workers must never inherit a CUDA context, so no plain fork. A fork server is a fresh process (it never
    touches CUDA) that imports torch once; each worker forks from it, so replacing a dead worker costs a fraction
    of a second instead of a full torch import. Where there is no fork server, spawn."""
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch"])
        return ctx
    return mp.get_context("spawn")


# -- the parent: scheduling, watching, marking ---------------------------------------------------------------------

@dataclass
class _Chunk:
    spec: str  # how the worker resolves the adapter (name or module:object)
    items: list[tuple[int, Case]]
    silent_deaths: int = 0


@dataclass
class _Slot:
    index: int
    device: str
    proc: Any = None
    conn: Connection | None = None
    ready: bool = False
    born: float = 0.0
    chunk: _Chunk | None = None
    current: int | None = None  # index of the case in flight
    since: float = 0.0


class Progress:
    """Cells done, verdict counts and ETA: a redrawn bar on a terminal, a plain line now and then otherwise."""

    def __init__(self, total_cases: int, cells_of: Mapping[int, tuple], out: IO[str] | None):
        self.total = total_cases
        self.out = out
        self.tty = bool(out is not None and hasattr(out, "isatty") and out.isatty())
        self.cell_left = Counter(cells_of.values())
        self.cells_total = len(self.cell_left)
        self.cells_of = cells_of
        self.done = 0
        self.counts: Counter = Counter()
        self.t0 = time.monotonic()
        self._last = 0.0

    @property
    def cells_done(self) -> int:
        return sum(1 for n in self.cell_left.values() if n == 0)

    def record(self, index: int, verdict: str, declared: bool) -> None:
        self.done += 1
        self.cell_left[self.cells_of[index]] -= 1
        self.counts[verdict if declared or verdict != "pass" else "pass (undeclared)"] += 1
        self.show()

    def line(self) -> str:
        elapsed = time.monotonic() - self.t0
        eta = elapsed / self.done * (self.total - self.done) if self.done else float("nan")
        counts = ", ".join(f"{v} {k}" for k, v in sorted(self.counts.items()))
        eta_s = "?" if math.isnan(eta) else f"{eta:.0f}s"
        return (f"{self.cells_done}/{self.cells_total} cells, {self.done}/{self.total} cases ({counts or 'none yet'})"
                f" {elapsed:.0f}s elapsed, ETA {eta_s}")

    def show(self, force: bool = False) -> None:
        if self.out is None:
            return
        now = time.monotonic()
        if self.tty and (force or now - self._last > 0.2):
            width = 24
            filled = int(width * self.done / max(1, self.total))
            print(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.line()}\x1b[K", end="", file=self.out, flush=True)
            self._last = now
        elif not self.tty and (force or now - self._last > 30):
            print(self.line(), file=self.out, flush=True)
            self._last = now

    def note(self, text: str) -> None:
        if self.out is None:
            return
        print(("\r\x1b[K" if self.tty else "") + text, file=self.out, flush=True)
        self.show(force=self.tty)

    def finish(self) -> None:
        if self.out is not None:
            if self.tty:
                print(file=self.out)
            print(f"done: {self.line()}", file=self.out, flush=True)


def default_jobs(device: DeviceInfo) -> int:
    if device.is_cuda:
        import torch

        # the judging (inputs, oracle, comparisons) is CPU-heavy and kernels are short: several workers per GPU
        return max(1, min(_cpus(), 6 * max(1, torch.cuda.device_count())))
    return _cpus()


def _cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def run_sweep(adapter_specs: Sequence[str], device: DeviceInfo, results_dir: str, *, profile: str = "quick",
              run_id: str | None = None, jobs: int | None = None, case_timeout: float = 120.0,
              command: str = "", out: IO[str] | None = sys.stderr,
              on_plan: Callable[[str, Plan], None] | None = None, resume: bool = False) -> dict[str, Counter]:
    """Plan every adapter's cases, judge them in worker processes, and return verdict counts per adapter.

    `adapter_specs` are registered names or module:object specs (workers resolve them the same way).
    Results go to `<results_dir>/<run_id>-w<slot>-<pid>.jsonl` (workers) and `<run_id>-main.jsonl` (metadata and
    the verdicts of cases whose worker hung or died).
    resume: continue run `run_id` (its files in results_dir): cases it already judged are counted, not re-run,
    so a sweep cut short (a time limit, a lost machine) finishes in a later call.
    """
    from harness import registry
    from harness.core.device import git_state
    from harness.store.results import new_run_id

    run_id = run_id or f"matrix-{device.generation}-{new_run_id()}"
    done: dict[str, Result] = {}
    if resume:
        from pathlib import Path

        from harness.store.results import load_results

        previous = sorted(Path(results_dir).glob(f"{run_id}-*.jsonl"))
        if not previous:
            raise ValueError(f"resume: no results of run {run_id!r} in {results_dir}")
        done = {r.case.case_id: r for r in load_results(previous, strict=False)}
    main = ResultStore(results_dir, run_id=run_id, worker="main")
    commit, dirty = git_state()
    main.append_meta("run", {"generation": device.generation, "device": device.to_dict(), "profile": profile,
                             "command": command, "commit": os.environ.get("MOE_HARNESS_COMMIT", commit),
                             "dirty": dirty, "quick_all_cells": QUICK_ALL_CELLS,
                             "cases_per_cell": CASES_PER_CELL[profile]})
    chunks: deque[_Chunk] = deque()
    cases: dict[int, Case] = {}
    owner: dict[int, Any] = {}
    totals: dict[str, Counter] = {}
    planned: list[tuple[Any, str, Plan]] = []
    for spec_name in adapter_specs:
        adapter = registry.resolve(spec_name)
        try:
            p = plan(adapter, profile)
        except Exception as e:  # an op without a spec, or a boundary() that raises: say so, sweep the rest
            main.append_meta("adapter", {**adapter_record(adapter, None, device, profile),
                                         "plan_error": f"{type(e).__name__}: {e}"})
            if out is not None:
                print(f"{adapter.name}: cannot plan its cases ({type(e).__name__}: {e}); skipped", file=out)
            continue
        main.append_meta("adapter", adapter_record(adapter, p, device, profile))
        planned.append((adapter, spec_name, p))
        totals[adapter.name] = Counter()
        if on_plan is not None:
            on_plan(adapter.name, p)
    n_jobs = max(1, jobs or default_jobs(device))
    total_cases = sum(len(p.cases) for _, _, p in planned)
    chunk_size = max(8, math.ceil(total_cases / (3 * n_jobs)))
    # biggest adapters first, so the long tail is short
    finished: list[tuple[int, Result]] = []
    for adapter, spec_name, p in sorted(planned, key=lambda t: -len(t[2].cases)):
        items = []
        for case in p.cases:
            index = len(cases)
            cases[index] = case
            owner[index] = adapter
            if case.case_id in done:  # judged before this resume
                finished.append((index, done[case.case_id]))
                continue
            items.append((index, case))
        for at in range(0, len(items), chunk_size):
            chunks.append(_Chunk(spec_name, items[at:at + chunk_size]))
    progress = Progress(len(cases), {i: (c.adapter, c.cell()) for i, c in cases.items()}, out)
    if out is not None:
        print(f"{len(planned)} adapter(s), {progress.cells_total} cells, {len(cases)} cases, profile {profile}, "
              f"{n_jobs} worker(s), case timeout {case_timeout:g}s", file=out, flush=True)
        for _, _, p in planned:
            print(f"  {p.adapter}: {p.selection} cells ({len(p.cells)} of {p.cells_total}), {len(p.cases)} cases",
                  file=out, flush=True)
    left_of = Counter(owner[i].name for i in cases)
    if out is not None and resume:
        print(f"resuming {run_id}: {len(finished)} of {len(cases)} cases already judged", file=out, flush=True)

    def mark(index: int, reason: str, kind: str, **metrics: Any) -> None:
        case, adapter = cases[index], owner[index]
        declared = adapter.declares(case.features, device)[0]
        r = Result(case=case, verdict="error", reason=reason, metrics={"marker": kind, **metrics}, declared=declared,
                   generation=device.generation, device=device.to_dict())
        main.append(r)
        account(index, r.verdict, declared)

    def account(index: int, verdict: str, declared: bool) -> None:
        name = owner[index].name
        totals[name][verdict if declared or verdict != "pass" else "pass (undeclared)"] += 1
        progress.record(index, verdict, declared)
        left_of[name] -= 1
        if left_of[name] == 0 and not progress.tty:
            progress.note(f"{name}: " + ", ".join(f"{v} {k}" for k, v in sorted(totals[name].items())))

    for index, r in finished:
        account(index, r.verdict, r.declared)

    ctx = _context()
    devices = [device.device]
    if device.is_cuda and device.device in ("cuda", "cuda:0"):
        import torch

        devices = [f"cuda:{i}" for i in range(max(1, torch.cuda.device_count()))]
    n_slots = min(n_jobs, max(1, len(chunks)))
    cpu_threads = max(1, (os.cpu_count() or 1) // n_slots)
    slots = [_Slot(i, devices[i % len(devices)]) for i in range(n_slots)]

    def start(slot: _Slot) -> None:
        parent, child = ctx.Pipe()
        slot.proc = ctx.Process(target=_worker, args=(child, slot.device, str(results_dir), run_id, slot.index,
                                                      cpu_threads), daemon=True)
        slot.proc.start()
        child.close()
        slot.conn, slot.ready, slot.born, slot.chunk, slot.current = parent, False, time.monotonic(), None, None

    def retire(slot: _Slot, why: str, kind: str) -> None:
        """The worker is dead or being killed: mark its case in flight, requeue the rest of its chunk."""
        if slot.proc is not None and slot.proc.is_alive():
            slot.proc.kill()
        if slot.proc is not None:
            slot.proc.join(5)
        code = slot.proc.exitcode if slot.proc is not None else None
        chunk, current = slot.chunk, slot.current
        if chunk is not None:
            rest = chunk.items
            if current is not None:
                mark(current, why, kind, exitcode=code)
                rest = [(i, c) for i, c in rest if i != current]
                chunk.silent_deaths = 0
            elif kind == "died":
                chunk.silent_deaths += 1
            if rest:
                if chunk.silent_deaths >= MAX_SILENT_DEATHS:
                    for i, _ in rest:
                        mark(i, f"not run: the worker died {chunk.silent_deaths} times before starting a case of "
                                f"this chunk (last: {why})", "died")
                else:
                    chunks.appendleft(_Chunk(chunk.spec, rest, chunk.silent_deaths))
        if slot.conn is not None:
            slot.conn.close()
        slot.proc, slot.conn, slot.chunk, slot.current = None, None, None, None

    startup = {"failures": 0}  # workers that died before reporting ready, in a row

    def handle(slot: _Slot, msg: tuple) -> None:
        kind = msg[0]
        if kind == "ready":
            slot.ready = True
            startup["failures"] = 0
        elif kind == "start":
            slot.current, slot.since = msg[1], time.monotonic()
        elif kind == "done":
            index = msg[1]
            account(index, msg[2], msg[3])
            if slot.chunk is not None:
                slot.chunk.items = [(i, c) for i, c in slot.chunk.items if i != index]
            slot.current = None
        elif kind == "unloadable":
            assert slot.chunk is not None
            for i, _ in slot.chunk.items:
                mark(i, f"adapter could not be loaded in the worker: {msg[1]}", "unloadable")
            slot.chunk, slot.current = None, None
        elif kind == "idle":
            slot.chunk, slot.current = None, None

    try:
        for slot in slots:
            start(slot)
        while chunks or any(s.chunk is not None for s in slots):
            for slot in slots:
                if slot.proc is None and (chunks or slot.chunk is not None):
                    start(slot)
                if slot.ready and slot.chunk is None and chunks and slot.conn is not None:
                    slot.chunk = chunks.popleft()
                    slot.conn.send((slot.chunk.spec, [(i, c.to_dict()) for i, c in slot.chunk.items]))
            live = [s for s in slots if s.conn is not None]
            wait([s.conn for s in live] + [s.proc.sentinel for s in live], timeout=0.5)
            now = time.monotonic()
            for slot in live:
                try:
                    while slot.conn is not None and slot.conn.poll():
                        handle(slot, slot.conn.recv())
                except (EOFError, OSError):
                    pass  # the pipe broke: the process is dead; handled just below
                if not slot.proc.is_alive():
                    slot.proc.join(1)
                    try:  # a verdict sent just before dying is still in the pipe
                        while slot.conn is not None and slot.conn.poll():
                            handle(slot, slot.conn.recv())
                    except (EOFError, OSError):
                        pass
                    code = slot.proc.exitcode
                    why = (f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}")
                    if slot.current is not None:
                        progress.note(f"worker {slot.index} died ({why}) on case {cases[slot.current].case_id} of "
                                      f"{cases[slot.current].adapter}; continuing")
                    if not slot.ready:
                        startup["failures"] += 1
                    retire(slot, f"worker process died ({why}) while running this case", "died")
                    if startup["failures"] >= MAX_SILENT_DEATHS * len(slots):
                        # workers cannot even start (a broken install, an unimportable __main__): stop respawning
                        progress.note(f"worker processes fail to start ({why}); the remaining cases are marked")
                        while chunks:
                            for i, _ in chunks.popleft().items:
                                mark(i, f"not run: worker processes fail to start ({why})", "died")
                elif slot.current is not None and now - slot.since > case_timeout:
                    progress.note(f"case {cases[slot.current].case_id} of {cases[slot.current].adapter} hung past "
                                  f"{case_timeout:g}s; worker killed, continuing")
                    retire(slot, f"hang: no verdict within {case_timeout:g}s (worker killed)", "timeout")
                elif not slot.ready and now - slot.born > START_TIMEOUT_S:
                    retire(slot, f"worker did not start within {START_TIMEOUT_S:g}s", "died")
            progress.show()
    finally:
        for slot in slots:
            if slot.conn is not None:
                try:
                    slot.conn.send(None)
                except OSError:
                    pass
        for slot in slots:
            if slot.proc is not None:
                slot.proc.join(5)
                if slot.proc.is_alive():
                    slot.proc.kill()
                    slot.proc.join(5)
        progress.finish()
        wall = round(time.monotonic() - progress.t0, 2)
        main.append_meta("run_end", {"generation": device.generation, "wall_s": wall, "verdicts": progress.done,
                                     "counts": dict(progress.counts)})
        main.close()
    return totals


def sweep(adapter_names: Iterable[str], device: DeviceInfo, store: ResultStore, *, profile: str = "quick",
          unverifiable: set[str] | None = None, out: IO[str] | None = sys.stderr) -> dict[str, Counter]:
    """In-process sweep (no isolation) into `store`, for callers that want one process; same plan as the CLI."""
    from harness import registry

    totals: dict[str, Counter] = {}
    for name in adapter_names:
        adapter = registry.resolve(name)
        p = plan(adapter, profile)
        store.append_meta("adapter", adapter_record(adapter, p, device, profile))
        counts: Counter = Counter()
        for case in p.cases:
            r = _judge_safely(case, adapter, device, unverifiable)
            store.append(r)
            counts[r.verdict if r.declared or r.verdict != "pass" else "pass (undeclared)"] += 1
        if out is not None:
            print(f"{name}: {len(p.cells)} cells, {len(p.cases)} cases: "
                  + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())), file=out, flush=True)
        totals[name] = counts
    return totals
