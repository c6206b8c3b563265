"""Judge a large-offsets mutant's case in a process of its own (an out-of-bounds GPU kernel ends its CUDA
context): `python -m tests.mutants.large_probe NAME` prints one line `verdict<TAB>reason`."""

from __future__ import annotations

import sys

from harness.core.device import detect
from harness.engine import runner
from harness.engine import strategies as hs
from tests.mutants.build import build
from tests.mutants.catalog_large import LARGE_MUTANTS


def main(name: str) -> int:
    mutant = next(m for m in LARGE_MUTANTS if m.name == name)
    adapter = build(mutant)
    device = adapter.device_for(detect())
    cases = hs.profile_class_cases(adapter, hs.declared_cells(adapter, device), "thorough")
    if not cases:
        print(f"none\t{name}: no large-offsets case planned")
        return 2
    r = runner.judge(cases[0], adapter, device)
    print(f"{r.verdict}\t{' '.join(r.reason.split())[:300]}")  # one line: the test reads the last
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
