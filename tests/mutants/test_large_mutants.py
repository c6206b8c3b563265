"""Planted int32-offset bugs (tests/mutants/catalog_large.py): each is caught by its adapter's large-offsets case
(`harness.ops.large`, the `gpu` profile's): no smaller case can catch one. GPU-only: on the CPU the case cannot
be built, so the catching test is skipped with that reason; the patches are still checked to apply."""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys

import pytest

from harness import ops
from harness.engine import strategies as hs
from harness.ops import large
from tests.mutants.build import build, patched_source
from tests.mutants.catalog_large import LARGE_MUTANTS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("mutant", LARGE_MUTANTS, ids=lambda m: m.name)
def test_large_mutant_changes_the_source(mutant) -> None:  # type: ignore[no-untyped-def]
    assert patched_source(mutant) != inspect.getsource(importlib.import_module(mutant.module))


@pytest.mark.parametrize("mutant", LARGE_MUTANTS, ids=lambda m: m.name)
def test_large_mutant_gets_a_case_past_2_31(mutant, device_info) -> None:  # type: ignore[no-untyped-def]
    """The mutant's declared cells get the large-offsets case under `gpu` (and none under `ci`)."""
    adapter = build(mutant)
    cells = hs.declared_cells(adapter, adapter.device_for(device_info))
    assert not hs.profile_class_cases(adapter, cells, "ci")
    (case,) = hs.profile_class_cases(adapter, cells, "thorough")
    assert large.classes(ops.get(case.op), "thorough")[-1].present(case, {}), case.shapes


@pytest.mark.parametrize("mutant", LARGE_MUTANTS, ids=lambda m: m.name)
def test_large_mutant_is_caught(mutant, device_info) -> None:  # type: ignore[no-untyped-def]
    if not device_info.is_cuda:
        pytest.skip(f"{mutant.name}: GPU-only (its case holds more than 2**31 elements, which this "
                    f"{device_info.generation} run cannot build)")
    done = subprocess.run([sys.executable, "-m", "tests.mutants.large_probe", mutant.name], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    verdict = line.split("\t", 1)[0]
    crashed = done.returncode not in (0, 2) and "CUDA" in done.stderr  # an illegal address ends the process
    print(f"\nmutant {mutant.name}: {line or done.stderr[-300:]}")
    assert verdict in ("fail", "error") or crashed, (
        f"mutant {mutant.name} ({mutant.bug}) survived its large-offsets case: {line}\n{done.stderr[-2000:]}")
