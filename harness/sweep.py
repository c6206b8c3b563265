"""The deterministic sweep behind `python -m harness matrix`: every adapter, every cell of its op's feature axes
(declared or not), several boundary cases per cell; every verdict appended to the results store as it is judged."""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Iterable

from harness import adapters, ops, runner
from harness.case import Case
from harness.device import DeviceInfo
from harness.results import ResultStore

CASES_PER_CELL = {"quick": 2, "full": 6}


def sweep(adapter_names: Iterable[str], device: DeviceInfo, store: ResultStore, *, profile: str = "quick",
          unverifiable: set[str] | None = None, out=sys.stderr) -> dict[str, Counter]:  # type: ignore[no-untyped-def]
    """Run the sweep; returns verdict counts per adapter. Progress goes to `out`, one line per adapter."""
    if profile not in CASES_PER_CELL:
        raise ValueError(f"profile must be one of {', '.join(CASES_PER_CELL)}, got {profile!r}")
    totals: dict[str, Counter] = {}
    for name in adapter_names:
        adapter = adapters.resolve(name)
        spec = ops.get(adapter.op)
        counts: Counter = Counter()
        t0 = time.perf_counter()
        cells = spec.all_cells()
        for i, cell in enumerate(cells):
            for seed, fields in enumerate(spec.boundary(adapter, cell)[: CASES_PER_CELL[profile]]):
                case = Case(op=adapter.op, adapter=adapter.name, features=cell, seed=seed, **fields)
                r = runner.judge(case, adapter, device, unverifiable=unverifiable)
                store.append(r)
                counts[r.verdict if r.declared or r.verdict != "pass" else "pass (undeclared)"] += 1
            if out is not None and out.isatty():
                print(f"\r{name}: cell {i + 1}/{len(cells)} {dict(counts)}", end="", file=out, flush=True)
        if out is not None:
            print(f"\r{name}: {len(cells)} cells, {sum(counts.values())} cases in {time.perf_counter() - t0:.1f}s: "
                  + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())), file=out, flush=True)
        totals[name] = counts
    return totals
