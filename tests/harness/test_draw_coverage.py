"""Every indexing path drawn at CI scale (issue 18 item 2): quantized experts cells draw several scale groups
along K and along N (a scale read one group off is invisible with one group), and the matrix's boundary cases
include such a shape."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from harness import registry
from harness.core.case import Case
from harness.engine import strategies as hs
from harness.ops import get as get_op


def test_grouped_quant_cells_draw_several_groups_along_k_and_n(device_info) -> None:  # type: ignore[no-untyped-def]
    adapter = registry.resolve("triton-experts")
    cells = [c for c in hs.declared_cells(adapter, device_info) if c["quant_format"] == "G128"]
    assert cells
    seen: set[tuple[int, int]] = set()

    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=hs.cases(adapter, cells))
    def draw(case: Case) -> None:
        k, n = case.shapes["K"], case.shapes["N"]
        assert k % 128 == 0 and n % 128 == 0
        seen.add((k // 128, n // 128))

    draw()
    assert max(k for k, _ in seen) >= 3 and max(n for _, n in seen) >= 3, seen
    boundary = get_op("experts").boundary(adapter, cells[0])
    assert any(b["shapes"]["K"] >= 3 * 128 and b["shapes"]["N"] >= 2 * 128 for b in boundary)
