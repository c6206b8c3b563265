"""False-positive check: the correct built-in kernels must pass the generic property test under many seeds.

Runs the search of harness/plugin/generic.py::test_declared_cases_pass (hypothesis over the adapter's declared cells,
`ci` settings: 8 examples each) for every built-in kernel adapter (`kernels.*`, test aids excluded) under N
hypothesis seeds, and prints, per adapter, how many seeds passed. With --mutants it instead prints, per planted
bug of tests/mutants, how many seeds caught it (how robust each catch is, beyond the seed CI uses).

Not part of the default test run (about 10 minutes in the Triton interpreter on 2 cores):

    python scripts/false_positive_check.py [--seeds 20] [--jobs 2] [--adapter NAME ...] [--mutants]

Exit 0 when every seed of every adapter passed (or, with --mutants, every seed caught every mutant), 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setup() -> None:
    sys.path.insert(0, str(ROOT))
    if os.environ.get("TRITON_INTERPRET") is None:
        import torch

        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
    from harness.engine.profiles import register_profiles

    register_profiles()


def _search(adapter, device, unverifiable, seed_value: int):  # type: ignore[no-untyped-def]
    """One seeded ci-profile search; the first failing Result (stopping there), or None."""
    from hypothesis import Phase, given, seed, settings

    from harness.engine import runner
    from harness.engine import strategies as hs

    cells = hs.declared_cells(adapter, device)
    found: list = []

    class Stop(AssertionError):
        pass

    def prop(case):  # type: ignore[no-untyped-def]
        if not found:
            r = runner.judge(case, adapter, device, unverifiable=unverifiable)
            if r.verdict in ("fail", "error"):
                found.append(r)
        if found:
            raise Stop(found[0].reason)

    ci = settings(settings.get_profile("ci"), derandomize=False, phases=(Phase.explicit, Phase.generate))
    try:
        seed(seed_value)(ci(given(case=hs.cases(adapter, cells))(prop)))()
    except Stop:
        pass
    return found[0] if found else None


def _adapter_seeds(name: str, seeds: int) -> tuple[str, int, int, list[str], float]:
    _setup()
    from harness import registry
    from harness.core.device import detect
    from harness.engine.interpreter import unverifiable_here

    dev, unv = detect("auto"), unverifiable_here()
    a = registry.resolve(name)
    t0 = time.perf_counter()
    passed, problems = 0, []
    for s in range(seeds):
        r = _search(a, dev, unv, s)
        if r is None:
            passed += 1
        else:
            problems.append(f"seed {s}: {r.verdict}: {r.reason[:200]} | case {r.case.to_json()}")
    return name, passed, seeds, problems, time.perf_counter() - t0


def _mutant_seeds(name: str, seeds: int) -> tuple[str, int, int, list[str], float]:
    _setup()
    from harness.core.device import detect
    from harness.engine.interpreter import unverifiable_here
    from tests.mutants.build import build
    from tests.mutants.catalog import MUTANTS

    dev, unv = detect("auto"), unverifiable_here()
    a = build(next(m for m in MUTANTS if m.name == name))
    t0 = time.perf_counter()
    caught, missed = 0, []
    for s in range(seeds):
        if _search(a, dev, unv, s) is not None:
            caught += 1
        else:
            missed.append(f"seed {s}: survived")
    return name, caught, seeds, missed, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--adapter", action="append", default=[], help="only these adapters (or mutants with --mutants)")
    p.add_argument("--mutants", action="store_true", help="catch rate of each planted bug instead")
    args = p.parse_args(argv)
    _setup()
    if args.mutants:
        from tests.mutants.catalog import MUTANTS

        names = args.adapter or [m.name for m in MUTANTS]
        work, label = _mutant_seeds, "caught"
    else:
        from harness import registry
        from harness.core.device import detect

        dev = detect("auto")
        names = args.adapter or [a.name for a in registry.all_adapters()
                                 if a.source.startswith("kernels.") and not a.test_aid
                                 and dev.generation in a.generations]
        work, label = _adapter_seeds, "passed"
    ok = True
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(work, n, args.seeds) for n in names]
        print(f"| {'adapter' if not args.mutants else 'mutant'} | seeds {label} | seconds |\n|---|---|---|")
        for f in futures:
            name, good, total, notes, took = f.result()
            ok &= good == total
            print(f"| {name} | {good}/{total} | {took:.0f} |", flush=True)
            for n in notes[:3]:
                print(f"    {n}", file=sys.stderr)
    print(f"total {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
