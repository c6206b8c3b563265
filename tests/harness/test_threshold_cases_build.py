"""A threshold case is a fixed case moved to a size past a kernel's internal threshold: the move must give a case
the op can build (a k of 9 on an 8-expert boundary case is not a case), and every declared threshold is crossed."""

from __future__ import annotations

import pytest

from harness import ops, registry
from harness.engine import strategies as hs


def _with_thresholds() -> list[registry.Adapter]:
    import kernels.adapters.external  # noqa: F401  (the third-party adapters declare thresholds too)

    return [a for a in registry.all_adapters() if hs.thresholds(a)]


@pytest.mark.parametrize("adapter", _with_thresholds(), ids=lambda a: a.name)
def test_every_threshold_case_can_be_built_and_each_threshold_is_crossed(adapter: registry.Adapter) -> None:
    cases = hs.threshold_cases(adapter, hs.declared_cells(adapter))
    invalid = ops.get(adapter.op).invalid
    assert invalid is None or not [c for c in cases if invalid(c)], [invalid(c) for c in cases if invalid(c)]
    for dim, sizes, _ in hs.thresholds(adapter):
        for size in sizes:
            assert any(c.shapes.get(dim) == size for c in cases), f"{adapter.name}: {dim}={size} never crossed"
