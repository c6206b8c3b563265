"""A sweep's planning beside its judging: adapters planned one at a time in a thread while the workers already judge
the cases of those planned before.

A cold plan of every adapter (no remembered plan: a fresh machine, a changed source) takes seconds: 10.8 to 13 s for
the quick matrix's 61 adapters on an H200, 3 s on 2 CPU cores. The workers, started early, waited idle for all of it.
Now the adapters whose cases workers judge (installed, of this generation) are planned first, the ops with the most
cells first, and each plan reaches the sweep as soon as it is made.

Everything the planning asks of the adapters' declarations (the planner host's round trips) happens in this thread,
and everything that touches the run (its results file, its counts, the workers' queue) in the sweep's thread, which
takes the finished plans (`Planning.take`) between its other work.
"""

from __future__ import annotations

import contextlib
import math
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness import ops
from harness.core.device import DeviceInfo
from harness.core.result import Result
from harness.engine import remote, runner
from harness.sweep.selection import Plan, Shard, adapter_record

#: cases a chunk of one adapter holds at least before the adapter is cut into several (a worker that moves to another
#: adapter starts a kernel host: seconds); at most a quarter of the workers start on one adapter, the rest of a big
#: one goes to idle workers in halves once no chunk is left (harness.sweep.schedule)
MIN_CHUNK = 24
#: in the plans' queue: no plan after it has cases for the workers
_FOR_WORKERS_DONE = "for-workers-done"


def chunk_count(cases: int, jobs: int) -> int:
    """How many chunks an adapter's `cases` for the workers are cut into, with `jobs` workers."""
    return max(1, min(math.ceil(jobs / 4), cases // MIN_CHUNK))


@dataclass
class Planned:
    """One adapter's plan as the planning made it: its record for the results file, the verdicts of the cases the
    gate turns away whole (case id -> verdict), or why it could not be planned (`error`, `plan` None)."""

    adapter: Any
    spec: str
    plan: Plan | None
    record: dict[str, Any]
    gated: dict[str, Result] = field(default_factory=dict)
    error: str = ""


def _turned_away(adapter: Any, device: DeviceInfo) -> bool:
    """Whether the gate gives every case of `adapter` its verdict with no kernel host: not installed, another
    generation, or a tampered declaration (every case a harness error: runner's gate)."""
    return bool(runner.turned_away_whole(adapter, device) or getattr(adapter, "tampered", ""))


def _order(device: DeviceInfo) -> Callable[[tuple[str, Any]], tuple[bool, int]]:
    """Adapters whose cases workers judge before those turned away whole, then the ops with more cells first."""

    def key(opened: tuple[str, Any]) -> tuple[bool, int]:
        adapter = opened[1]
        cells = 0
        with contextlib.suppress(Exception):  # an op without a spec: its plan says so
            cells = len(ops.get(adapter.op).all_cells())
        return _turned_away(adapter, device), -cells

    return key


class Planning:
    """Plans `specs` (read from `planner`, a CPU host that imported them) in a thread; `take` returns the plans made
    since the last call and raises what stopped the planning, `done` once every plan was taken."""

    def __init__(self, specs: Sequence[str], planner: Any, device: DeviceInfo, profile: str, shard: Shard | None,
                 plan_one: Callable[[Any, str], Plan]) -> None:
        self.specs, self.planner, self.device, self.profile, self.shard = list(specs), planner, device, profile, shard
        self.plan_one = plan_one
        self.made = 0  # plans taken so far
        self.for_workers_done = False  # every plan with cases for workers was taken (the rest are turned away whole)
        self._out: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._ended = False
        self._thread = threading.Thread(target=self._run, name="moe-harness-planning", daemon=True)

    def start(self) -> Planning:
        self._thread.start()
        return self

    @property
    def done(self) -> bool:
        return self._ended

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the thread to end after the adapter it is planning, and wait for it a while."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def take(self) -> list[Planned]:
        """The plans made since the last call; re-raises in this thread what ended the planning early (a host that
        died, a spec that names no adapter)."""
        found: list[Planned] = []
        while not self._ended:
            try:
                item = self._out.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._ended = self.for_workers_done = True
            elif item is _FOR_WORKERS_DONE:
                self.for_workers_done = True
            elif isinstance(item, BaseException):
                self._ended = True
                raise item
            else:
                found.append(item)
        self.made += len(found)
        return found

    def _run(self) -> None:
        try:
            opened = [(spec, remote.open_adapter(spec, "cpu", host=self.planner)) for spec in self.specs]
            order = _order(self.device)
            ranked = sorted(((order(o), o) for o in opened), key=lambda t: t[0])
            for_workers = sum(1 for (away, _), _ in ranked if not away)
            for i, (_, (spec, adapter)) in enumerate(ranked):
                if self._stop.is_set():
                    break
                if i == for_workers:  # the first turned away whole: no chunk comes after it
                    self._out.put(_FOR_WORKERS_DONE)
                self._out.put(self._planned(spec, adapter))
        except BaseException as e:  # handed to the sweep's thread, which raises it
            self._out.put(e)
        self._out.put(None)

    def _planned(self, spec: str, adapter: Any) -> Planned:
        try:
            p = self.plan_one(adapter, spec)
        except Exception as e:  # an op without a spec, or a boundary() that raises: recorded, the rest planned
            return Planned(adapter, spec, None, adapter_record(adapter, None, self.device, self.profile),
                           error=f"{type(e).__name__}: {e}")
        if self.shard is not None:
            p = self.shard.of(p)
        record = adapter_record(adapter, p, self.device, self.profile)
        if tampered := getattr(adapter, "tampered", ""):  # every case of it is a harness error (runner's gate)
            record["tampered"] = tampered
        gated: dict[str, Result] = {}
        if _turned_away(adapter, self.device):
            for c in p.cases:
                verdict = runner.gated_verdict(c, adapter, self.device)
                assert verdict is not None  # the gate's first rules turn every case away
                gated[c.case_id] = verdict
        return Planned(adapter, spec, p, record, gated)
