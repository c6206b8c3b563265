"""What the sweep runs: the cells of each adapter in a profile, their boundary cases, and shards of them.

Cell selection (`select_cells`):
  full   every applicable cell (the full product of the axes, minus `OpSpec.inapplicable`).
  quick  every cell when the op has at most `QUICK_ALL_CELLS` of them; otherwise a pairwise (all-pairs) covering
         set, built greedily and deterministically: first over the cells the adapter declares (so every pair of
         declared values is exercised together in a cell the kernel accepts), then extended until every pair of
         values of any two axes that occurs in some applicable cell is covered.
Cases of a cell are its op's boundary cases (`OpSpec.boundary`), fitted to the adapter's declared size limits and
support rule (`harness.engine.fitting`: moved to allowed sizes, or left out); a cell the adapter does not declare
gets one case (enough to show a clean rejection); quick takes `cases_per_cell` of them, rotated by the cell's
position so that every boundary shape still appears across the cells. A case's seed is its index in the (fitted)
boundary list, so the same case has the same seed in every profile.

Shards (`Shard`): shard K of N holds the cells whose stable hash (adapter, op, cell) is K-1 modulo N, so a sweep
split over N machines judges every case exactly once, whatever else each machine runs, and the shards' results
merge into the same matrix as one unsharded run.
"""

from __future__ import annotations

import functools
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from harness import ops
from harness.core.case import Case
from harness.core.device import DeviceInfo
from harness.core.sizes import scale
from harness.core.sweep_args import check_shard, parse_shard
from harness.engine import fitting
from harness.engine.strategies import threshold_cases

#: cases per cell of each plan profile (`harness.core.sweep_args.PROFILES`, which the command line offers)
CASES_PER_CELL = {"quick": 2, "full": 6}
#: ops with at most this many applicable cells run all of them in the quick profile
QUICK_ALL_CELLS = 64


def _pairs_of(cell: Sequence[str]) -> list[tuple[int, str, int, str]]:
    n = len(cell)
    found: list[tuple[int, str, int, str]] = [(i, cell[i], -1, "") for i in range(n)]  # singles, for 1-axis ops
    found += [(i, cell[i], j, cell[j]) for i in range(n) for j in range(i + 1, n)]
    return found


@functools.lru_cache(maxsize=16)
def _pair_index(candidates: tuple[tuple[str, ...], ...]) -> tuple[tuple[tuple, ...], dict[tuple, tuple[int, ...]]]:
    """Each candidate's pairs, and the candidates holding each pair: the same for every adapter of an op when
    the candidates are all its cells (read-only)."""
    pairs = tuple(tuple(_pairs_of(c)) for c in candidates)
    holders: dict[tuple, list[int]] = {}
    for idx, ps in enumerate(pairs):
        for p in ps:
            holders.setdefault(p, []).append(idx)
    return pairs, {p: tuple(at) for p, at in holders.items()}


def pairwise_cover(candidates: Sequence[Sequence[str]], covered: set | None = None) -> list[int]:
    """Indices of a subset of `candidates` (tuples of axis values) covering every pair of values of two axes that
    occurs in some candidate. Greedy: repeatedly the first candidate covering the most uncovered pairs.
    `covered` (updated in place) holds pairs already covered by cells chosen earlier."""
    covered = set() if covered is None else covered
    pairs, holders = _pair_index(tuple(tuple(c) for c in candidates))
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
    whole: dict[str, Any] | None = None  # for a shard: the summary of the unsharded plan
    shard: str = ""  # "K/N" for a shard

    def summary(self) -> dict[str, Any]:
        """How the cells were chosen, for the whole plan (identical in every shard, so shards merge cleanly)."""
        if self.whole is not None:
            return {**self.whole, "shard": self.shard, "shard_cells": len(self.cells), "shard_cases": len(self.cases)}
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
    declared = [i for i, c in enumerate(cells) if adapter.claims(c)]
    covered: set = set()
    picked = {declared[i] for i in pairwise_cover([rows[i] for i in declared], covered)}
    picked |= set(pairwise_cover(rows, covered))
    return [cells[i] for i in sorted(picked)], "pairwise", len(cells)


def plan(adapter: Any, profile: str = "quick") -> Plan:
    """Every case the sweep runs for `adapter` in `profile`, deterministically."""
    spec = ops.get(adapter.op)
    cells, selection, total = select_cells(spec, adapter, profile)
    position = {tuple(sorted(c.items())): i for i, c in enumerate(spec.all_cells())}
    cases = []
    for cell in cells:
        at = position[tuple(sorted(cell.items()))]
        if not adapter.claims(cell):  # its support rule included
            # An undeclared cell needs one case to show a clean rejection (or "works but not claimed"), not all of
            # them: the first that fits from a place that turns with the cell, so the cells share out the cases
            n = len(spec.boundary(adapter, cell))
            offset = at % n if profile == "quick" and n else 0
            one = fitting.boundary(adapter, cell, start=offset, most=1, reached=False)
            cases += [Case(op=adapter.op, adapter=adapter.name, features=dict(cell), seed=offset, **f) for f in one]
            continue
        bounds = fitting.boundary(adapter, cell)
        if not bounds:
            continue
        per_cell = CASES_PER_CELL[profile]
        offset = at % len(bounds) if profile == "quick" else 0
        for seed in sorted({(offset + j) % len(bounds) for j in range(min(per_cell, len(bounds)))}):
            cases.append(Case(op=adapter.op, adapter=adapter.name, features=dict(cell), seed=seed, **bounds[seed]))
    if scale() == "large":  # sizes past the kernel's internal thresholds: once each, where they are affordable
        cases += threshold_cases(adapter, [c for c in cells if adapter.claims(c)])
    return Plan(adapter.name, adapter.op, selection, cells, total, cases)


def adapter_record(adapter: Any, p: Plan | None, device: DeviceInfo, profile: str) -> dict[str, Any]:
    """The metadata the renderer needs about an adapter (written once per run, per adapter)."""
    axes: list[dict[str, Any]] = []
    op_title = adapter.op
    try:
        spec = ops.get(adapter.op)
        axes = [{"name": a.name, "title": a.title, "values": list(a.values)} for a in spec.axes]
        op_title = spec.title
    except ValueError:
        pass
    return {"adapter": adapter.name, "op": adapter.op, "op_title": op_title, "source": adapter.source,
            "description": adapter.description,
            "test_aid": bool(adapter.test_aid), "generations": list(adapter.generations),
            "support": {k: list(v) for k, v in adapter.support.items()}, "axes": axes,
            **({"library": {"distribution": adapter.library.distribution, "written_for": adapter.library.written_for,
                            "installed": adapter.library.version(), "install": adapter.library.install}}
               if adapter.library is not None else {}),
            "generation": adapter.device_for(device).generation, "profile": profile, **(p.summary() if p else {})}


@dataclass(frozen=True)
class Shard:
    """Shard `index` (1-based) of `count`: a deterministic share of the cells, stable across machines and runs."""

    index: int
    count: int

    def __post_init__(self) -> None:
        check_shard(self.index, self.count)

    @classmethod
    def parse(cls, text: str) -> Shard:
        return cls(*parse_shard(text))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def holds(self, adapter: str, op: str, cell: dict[str, str]) -> bool:
        key = f"{adapter}|{op}|{json.dumps(cell, sort_keys=True)}"
        return zlib.crc32(key.encode()) % self.count == self.index - 1

    def of(self, p: Plan) -> Plan:
        """The part of plan `p` in this shard (its summary still describes the whole plan)."""
        cells = [c for c in p.cells if self.holds(p.adapter, p.op, c)]
        cases = [c for c in p.cases if self.holds(p.adapter, p.op, c.features)]
        return replace(p, cells=cells, cases=cases, whole=p.whole or p.summary(), shard=str(self))
