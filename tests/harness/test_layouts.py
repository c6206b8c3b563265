"""Contract-driven layouts: every tensor an op's contract says may have any strides (`Tensor.any_strides`) is drawn
in every layout class of harness.core.layouts that the adapter handles, reaches the kernel in it (in this process
and through a kernel host's arena), is counted by the ci coverage plan, and a kernel that ignores it fails; an
adapter that declares fewer (`layouts` limit) is never given the others."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from harness import ops, registry
from harness.core import layouts
from harness.core import limits as limit_table
from harness.core.case import Case
from harness.core.compare import bits
from harness.core.device import detect
from harness.engine import coverage as cov
from harness.engine import remote, runner
from harness.engine import strategies as hs
from harness.engine.arena import Arena
from harness.engine.fixed import explicit_examples
from harness.engine.profiles import PROFILES
from harness.ops.contracts import CONTRACTS, any_strides
from tests.harness.fixtures import layout_adapters as planted

CPU = detect("cpu")
# what the draws see of our Triton kernels on any machine (detect("cpu") on a GPU machine declares none of them)
DRAWS = cov.device_for("interp")
FIXTURES = "tests.harness.fixtures.layout_adapters"
STRIDED_OPS = sorted(op for op, c in CONTRACTS.items() if any(t.any_strides for t in (*c.inputs, *c.outputs)))
OURS = sorted(a.name for a in cov.builtin_adapters() if a.op in STRIDED_OPS)


def _drawn(adapter: registry.Adapter, n: int) -> list[Case]:
    cells = hs.declared_cells(adapter, DRAWS)
    found: list[Case] = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=hs.cases(adapter, cells))
    def draw(case: Case) -> None:
        found.append(case)

    draw()
    return found


def _expected(adapter: registry.Adapter) -> dict[str, set[str]]:
    """From the contracts: each tensor of any strides in some declared cell, and the layouts the adapter allows it."""
    declared = adapter.limits.get("layouts")
    return {name: set(limit_table.layouts_allowed(declared, name)) for cell in hs.declared_cells(adapter, DRAWS)
            for name in any_strides(adapter.op, cell)}


def test_the_contracts_state_layout_freedom_in_the_structured_field() -> None:
    """No free text about strides left in a contract's meaning: "any strides" is the field (read by the draws)."""
    for op, c in CONTRACTS.items():
        for t in (*c.inputs, *c.outputs):
            assert not re.search(r"any strides|non-contiguous|row stride", t.meaning), (op, t.name)
    declared = {(op, t.name) for op, c in CONTRACTS.items() for t in (*c.inputs, *c.outputs) if t.any_strides}
    assert {("routing", "router_logits"), ("grouped_routing", "router_logits"), ("group_quant", "x"),
            ("reduce", "out")} <= declared
    for op in STRIDED_OPS:  # every such op lets an adapter narrow them
        assert "layouts" in limit_table.keys(op)


@pytest.mark.parametrize("name", OURS)
def test_the_draw_space_holds_every_layout_and_builds_it(name: str) -> None:
    adapter = registry.resolve(name)
    expected = _expected(adapter)
    assert expected, f"{name}: no tensor of any strides in its declared cells"
    drawn = _drawn(adapter, 48)
    spec = ops.get(adapter.op)
    for tensor, allowed in expected.items():
        seen = {layouts.of(c.layout, tensor) for c in drawn if tensor in any_strides(adapter.op, c.features)}
        assert seen == allowed, f"{name}: {tensor} drawn in {sorted(seen)}, the contract allows {sorted(allowed)}"
        for layout in allowed - {"contiguous"}:  # the tensor the kernel gets has the layout's strides, same values
            case = next(c for c in drawn if c.layout.get(tensor) == layout and c.shapes.get("M", 1) > 1)
            inputs = spec.make_inputs(case, "cpu")
            plain = spec.make_inputs(case.replace(layout={}), "cpu")
            if tensor in inputs:
                t = inputs[tensor]
                assert t.stride() == layouts.strides(tuple(t.shape), layout), (tensor, layout, t.stride())
                assert torch.equal(bits(t), bits(plain[tensor]))
            else:
                out = spec.outputs(case, inputs)[tensor]
                assert out.stride == layouts.strides(out.shape, layout), (tensor, layout, out.stride)


@pytest.mark.parametrize("name", OURS)
def test_the_ci_plan_counts_every_layout_of_every_tensor(name: str) -> None:
    adapter = registry.resolve(name)
    report = cov.adapter_coverage(adapter, cov.device_for("interp"), PROFILES["ci"])
    rows = {r.item: r for r in report.rows if r.section == "layout"}
    want = {f"{t}: {lay}" for t, allowed in _expected(adapter).items() for lay in allowed}
    assert set(rows) == want
    assert all(r.drawn + r.fixed > 0 for r in rows.values()), {i: (r.drawn, r.fixed) for i, r in rows.items()}


def test_a_contiguous_only_adapter_is_never_given_another_layout() -> None:
    base = registry.resolve("reference-routing")
    only = dataclasses.replace(base, name="fixture-contiguous-routing", limits={"layouts": ("contiguous",)})
    cells = hs.declared_cells(only, CPU)
    assert not [c.layout for c in [*_drawn(only, 32), *explicit_examples(only, cells)] if c.layout]
    report = cov.adapter_coverage(only, cov.device_for("interp"), PROFILES["ci"])
    assert [r.item for r in report.rows if r.section == "layout"] == ["router_logits: contiguous"]
    case = Case(op="routing", adapter=only.name, features=cells[0], seed=1, shapes={"M": 5, "E": 8, "k": 2},
                dtypes={"router_logits": cells[0]["logits_dtype"]}, layout={"router_logits": "transposed"})
    r = runner.judge(case, only, CPU)
    assert r.verdict == "unsupported" and "router_logits" in r.reason and "transposed" in r.reason, r.reason
    assert runner.judge(case, base, CPU).verdict == "pass"


def test_a_layouts_limit_per_tensor_narrows_that_tensor() -> None:
    base = registry.resolve("reference-group-quant")
    rows = dataclasses.replace(base, name="fixture-row-stride-only", limits={"layouts": {"x": ("contiguous",
                                                                                              "row_padded")}})
    assert {c.layout.get("x", "contiguous") for c in _drawn(rows, 32)} == {"contiguous", "row_padded"}
    with pytest.raises(ValueError, match="limit layouts must be a non-empty tuple of 'contiguous'"):
        dataclasses.replace(base, limits={"layouts": ("diagonal",)})


@pytest.mark.parametrize("fixture", ["ROWS_ASSUMED", "UNIT_COLUMN_STRIDE", "OUT_AS_CONTIGUOUS"])
def test_a_kernel_that_ignores_a_layout_fails_the_generic_plan(fixture: str) -> None:
    """The planted bugs pass every case of their plan made contiguous (as every case was before layouts were
    drawn), and fail the plan itself, only ever on a case with a strided tensor."""
    adapter = getattr(planted, fixture)
    plan = explicit_examples(adapter, hs.declared_cells(adapter, CPU))
    plain = {runner.judge(c.replace(layout={}), adapter, CPU).verdict for c in plan}
    assert plain == {"pass"}, plain
    results = [(c, runner.judge(c, adapter, CPU)) for c in plan]
    failed = [(c, r) for c, r in results if r.verdict != "pass"]
    # fail, or error where the bug reads a gap's NaN into a kernel that refuses non-finite input
    assert failed and all(r.verdict in ("fail", "error") and c.layout for c, r in failed), [
        (c.layout, r.reason) for c, r in failed]
    if fixture == "OUT_AS_CONTIGUOUS":  # a padded or column-strided out: the writes land in its gaps
        assert any("between the elements of its view" in r.reason for _, r in failed)


@pytest.mark.parametrize("fixture", ["ROWS_ASSUMED", "OUT_AS_CONTIGUOUS"])
def test_a_strided_tensor_keeps_its_layout_through_a_kernel_host(fixture: str) -> None:
    """Through the host's shared arena, as the generic test runs adapters: the strided tensor arrives strided (a
    contiguous copy would let the planted bug pass)."""
    local = getattr(planted, fixture)
    cell = hs.declared_cells(local, CPU)[0]
    tensor = any_strides(local.op, cell)[0]
    base = next(b for b in ops.get(local.op).boundary(local, cell) if b["shapes"].get("M", 0) > 2)
    case = Case(op=local.op, adapter=local.name, features=cell, seed=3, **base)
    spec = f"{FIXTURES}:{fixture}"
    try:
        hosted = remote.open_adapter(spec, "cpu")
        strided = runner.judge(case.replace(layout={tensor: "column_step"}), hosted, CPU)
        contiguous = runner.judge(case, hosted, CPU)
    finally:
        remote.close_adapter(spec, "cpu")
    assert strided.verdict == "fail", strided.reason
    assert contiguous.verdict == "pass", contiguous.reason


def test_the_arena_copies_a_strided_tensor_with_its_strides_and_gaps() -> None:
    arena = Arena()
    arena.reserve(1 << 16)
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    for layout in ("row_padded", "transposed", "column_step"):
        v = layouts.laid_out(t, layout)
        shared, _ = arena.put(v)
        assert shared.stride() == v.stride() and torch.equal(shared, t), layout
        n = layouts.span(tuple(v.shape), v.stride())
        assert torch.equal(bits(shared.as_strided((n,), (1,), 0)), bits(v.as_strided((n,), (1,), 0)))
    shared, _ = arena.put(torch.ones(3).expand(4, 3))  # overlapping: copied dense, as before
    assert shared.is_contiguous()
    arena.close()


def test_a_case_file_replays_its_layouts() -> None:
    cell = hs.declared_cells(registry.resolve("reference-reduce"), CPU)[0]
    case = Case(op="reduce", adapter="reference-reduce", features=cell, seed=2, shapes={"M": 3, "E": 4, "k": 2, "K": 5},
                dtypes={"expert_out": cell["dtype"]}, layout={"out": "transposed"})
    again = Case.from_json(case.to_json())
    assert again.case_id == case.case_id
    assert ops.get("reduce").outputs(again, {})["out"].stride == (1, 3)
    with pytest.raises(ValueError, match=r"Case.layout\['out'\] must be one of contiguous, row_padded"):
        case.replace(layout={"out": "diagonal"})
