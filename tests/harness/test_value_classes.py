"""Boundary values and thresholds in every CI run: each value class of each op (all-zero groups, counts at block
multiples, the first and last local expert, non-finite rows, order-sensitive sums, poisoned padding rows) is held by
the inputs of a case the generic test judges first, once per family of declared cells; each declared threshold is
crossed by one of those cases on the CPU; and the presence checks can fail (random inputs do not pass them)."""

from __future__ import annotations

import pytest

from harness import registry
from harness.core.case import Case
from harness.engine import strategies as hs
from harness.ops import get as get_op
from harness.plugin.generic import explicit_examples

#: our kernels, the adapters CI judges on the CPU
TRITON = ("triton-activation", "triton-experts", "triton-batched-experts", "triton-experts-fp8-fast",
          "triton-group-quant", "triton-group-quant-fastdiv", "triton-act-quant", "triton-routing",
          "triton-grouped-routing", "triton-align", "triton-reduce")


@pytest.mark.parametrize("name", TRITON)
def test_every_value_class_is_judged_in_every_run(name: str, device_info) -> None:  # type: ignore[no-untyped-def]
    """The inputs of the explicit examples (judged and recorded first in every run of the generic test) hold each
    value class of the op in each family of the declared cells."""
    adapter = registry.resolve(name)
    cells = hs.declared_cells(adapter, adapter.device_for(device_info))
    coverage = hs.value_class_coverage(adapter, cells, explicit_examples(adapter, cells))
    missing = [key for key, case_id in coverage.items() if case_id is None]
    assert not missing, f"{name}: value classes no explicit example holds: {missing}"


def test_every_op_with_a_boundary_value_bug_class_declares_it() -> None:
    """The classes the planted bugs of tests/mutants/catalog_boundaries.py and catalog_values.py stand for, per
    op."""
    want = {"group_quant": {"zero_units", "last_block_amax", "dtype_extremes"},
            "act_quant": {"zero_groups", "dtype_extremes"}, "activation": {"dtype_extremes"},
            "routing": {"nonfinite_rows", "large_logits", "saturated_sigmoids", "many_experts"},
            "grouped_routing": {"nonfinite_rows", "large_logits", "saturated_sigmoids", "many_experts",
                                "odd_group_width"},
            "align": {"block_counts", "first_and_last_local_expert", "many_experts"},
            "reduce": {"summation_order", "first_and_last_local_expert", "zero_weights", "dtype_extremes"},
            "experts": {"zero_rows", "block_counts", "padding_rows_under_a_tensor_scale", "summation_order",
                        "zero_weights", "many_experts", "nonlocal_decode_slots"}}
    for op, names in want.items():
        assert {vc.name for vc in get_op(op).value_classes} == names, op


@pytest.mark.parametrize("name", TRITON)
def test_presence_checks_can_fail(name: str, device_info, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Each class's presence check says no to some case of the op's ordinary boundary inputs (the batched
    format's padding rows unpoisoned: they always are): the coverage test above asks the tensors, and could catch
    a class that stopped being generated."""
    from harness.ops import experts

    monkeypatch.setattr(experts, "PADDING_POISON", 1.0)
    adapter = registry.resolve(name)
    spec = get_op(adapter.op)
    cells = hs.declared_cells(adapter, adapter.device_for(device_info))
    for vc in spec.value_classes:
        cell = next((c for c in cells if vc.applies(adapter, c)), None)
        if cell is None:
            continue
        plain = [Case(op=adapter.op, adapter=name, features=dict(cell), **b) for b in spec.boundary(adapter, cell)
                 if hs._substantive(b) and "counts" not in b.get("params", {})]
        held = [vc.present(c, spec.make_inputs(c, "cpu")) for c in plain]
        assert plain and not all(held), (name, vc.name)


def crossings(name: str, device_info) -> list[tuple[str, int, str]]:  # type: ignore[no-untyped-def]
    """(dim, size, the case crossing it) for each declared threshold of adapter `name` among its explicit examples
    (the case with the fewest elements where several cross it), or "" where none does."""
    adapter = registry.resolve(name)
    cells = hs.declared_cells(adapter, adapter.device_for(device_info))
    examples = explicit_examples(adapter, cells)
    found = []
    for dim, sizes, where in hs.thresholds(adapter):
        for size in sizes:
            hits = [c for c in examples if c.shapes.get(dim) == size
                    and all(c.features.get(a) in v for a, v in where.items())]
            best = min(hits, key=lambda c: hs._size(c.shapes), default=None)
            found.append((dim, size, "" if best is None else f"{best.features} {best.shapes}"))
    return found


#: every declared threshold, by adapter: (dim, size just past it). A kernel whose launch code has another internal
#: threshold declares it (its adapter's `cross_<dim>`), and this list grows with it.
THRESHOLDS = {
    "triton-activation": [("N", 1025), ("T", 65)],
    "triton-group-quant": [("K", 8320), ("K", 1025), ("K", 4224)],
    "triton-group-quant-fastdiv": [("K", 8320), ("K", 1025), ("K", 4224)],
    "triton-act-quant": [("T", 9), ("N", 640)],
    "triton-routing": [("M", 65)],
    "triton-grouped-routing": [("M", 65)],
    "triton-align": [("M", 32769), ("M", 65537)],
    "triton-reduce": [("K", 1025)],
    "triton-experts": [("K", 257)],
    "triton-experts-fp8-fast": [("K", 257)],
}


@pytest.mark.parametrize("name", TRITON)
def test_every_declared_threshold_is_crossed_on_the_cpu(name: str, device_info) -> None:  # type: ignore[no-untyped-def]
    """Each declared threshold is crossed by an explicit example on the CPU scale too (the code past it runs under
    the interpreter in every CI run), at the cheapest boundary shape: the table of thresholds and crossing cases is
    printed (pytest -s)."""
    found = crossings(name, device_info)
    for dim, size, case in found:
        print(f"{name}: {dim} = {size}: {case or 'NOT CROSSED'}")
    assert [(d, s) for d, s, _ in found] == THRESHOLDS.get(name, [])
    assert all(case for _, _, case in found), found


def test_threshold_cases_take_the_cheapest_boundary_shape() -> None:
    """The crossing case is the op's boundary case with the fewest other elements, e.g. one token row past the
    activation's 1024-column tile."""
    adapter = registry.resolve("triton-activation")
    (case, *_) = hs.threshold_cases(adapter, hs.declared_cells(adapter))
    assert case.shapes == {"T": 1, "N": 1025}
