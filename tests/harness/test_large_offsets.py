"""The large-offsets value class (`harness.ops.large`): judged under the GPU profiles only, one case per op whose
named tensor's last flat offset is 2**31 or past (computed here from the shapes, independently of the class), the
chunked oracle judging as the whole one, and the machine-wide lock around such cases."""

from __future__ import annotations

import fcntl

import pytest

from harness import ops, registry
from harness.core.case import Case
from harness.engine import chunked, large_lock, runner
from harness.engine import strategies as hs
from harness.engine.coverage import device_for
from harness.engine.fixed import explicit_examples
from harness.ops import large
from harness.ops.large import NAME, NOT_EXPRESSIBLE

GATED = ("silu", "gelu", "gelu_tanh", "swigluoai", "swigluoai_uninterleave", "swiglustep")


def _elements(case: Case) -> int:
    """Elements of the tensor whose offsets pass 2**31, written out per op (not read from `harness.ops.large`)."""
    s = case.shapes
    if case.op in ("routing", "grouped_routing"):
        return s["M"] * s["E"]  # router_logits [M, E]
    if case.op in ("activation", "act_quant"):
        return s["T"] * 2 * s["N"]  # x [T, 2N]
    if case.op == "group_quant":
        return s["M"] * s["K"]  # x [M, K]
    if case.op == "reduce":
        return s["M"] * s["k"] * s["K"]  # expert_out [M, k, K]
    local = case.params.get("local_experts", s["E"])  # experts: w13 [local experts, 2N (gated) or N, K]
    rows = 2 * s["N"] if case.features["activation"] in GATED else s["N"]
    return local * rows * s["K"]


def _reference(op: str) -> registry.Adapter:
    return next(a for a in registry.all_adapters() if a.op == op and a.name.startswith("reference-"))


@pytest.mark.parametrize("op", ops.available())
def test_the_class_is_judged_under_the_thorough_gpu_profile_only(op: str) -> None:
    spec = ops.get(op)
    for profile in ("ci", "dev", "gpu", None):
        assert NAME not in [vc.name for vc in large.classes(spec, profile)], (op, profile)
    assert (NAME in [vc.name for vc in large.classes(spec, "thorough")]) == (op not in NOT_EXPRESSIBLE), op


@pytest.mark.parametrize("op", [op for op in ops.available() if op not in NOT_EXPRESSIBLE])
def test_one_case_per_op_just_past_2_31(op: str) -> None:
    adapter = _reference(op)
    cells = hs.declared_cells(adapter, device_for("sm90"))
    assert not hs.profile_class_cases(adapter, cells, "ci")
    assert not [c for c in explicit_examples(adapter, cells) if _elements(c) > 1 << 31]
    (case,) = hs.profile_class_cases(adapter, cells, "thorough")
    assert _elements(case) - 1 >= 1 << 31, case.shapes  # the last element's flat offset
    vc = large.classes(ops.get(op), "thorough")[-1]
    assert vc.present(case, {})
    if op != "experts":  # the cheapest: one row fewer stays under (experts grow N by the cell's group multiple)
        dim = "T" if "T" in case.shapes else "M"
        fewer = case.replace(shapes={**case.shapes, dim: case.shapes[dim] - 1})
        assert _elements(fewer) - 1 < 1 << 31 and not vc.present(fewer, {}), fewer.shapes


#: (op, axis values of its reference cell) for the chunk test: row-independent ops
CHUNKED_OPS = ("routing", "grouped_routing", "activation", "act_quant", "group_quant", "reduce")


def _small_case(op: str) -> tuple[registry.Adapter, Case]:
    adapter = _reference(op)
    cells = hs.declared_cells(adapter, device_for("interp"))
    cases = [c for c in hs.value_covering_cases(adapter, cells)
             if c.shapes.get("M", c.shapes.get("T", 0)) >= 5 and c.features.get("unit") != "tensor"]
    return adapter, cases[0]


def _verdicts(checks: list, outputs: dict) -> list[bool]:  # type: ignore[type-arg]
    return [all(c.passed for c in runner._judged(chk, outputs[chk.name], outputs)) for chk in checks]


@pytest.mark.parametrize("op", CHUNKED_OPS)
def test_the_chunked_oracle_judges_as_the_whole_one(op: str) -> None:
    adapter, case = _small_case(op)
    keep: dict = {}  # type: ignore[type-arg]
    r = runner.judge(case, adapter, device_for("interp"), keep=keep)
    assert r.verdict == "pass", r.reason
    spec, conv = ops.get(op), adapter.conventions_of(case, device_for("interp"))
    inputs = spec.make_inputs(case, "cpu")
    whole = spec.expected(case, inputs, conv)
    parts = chunked.expected(spec, case, inputs, conv, runner._judged, rows_per_chunk=2)
    assert all(c.mode == "custom" and c.judge is not None for c in parts)  # really chunked
    outputs = dict(keep["outputs"])
    assert _verdicts(whole, outputs) == _verdicts(parts, outputs) == [True] * len(whole)
    name = spec.token_outputs[0]  # a wrong last row: both fail
    bad = outputs[name].clone()
    bad[-1] = (bad[-1].float() + 7).to(bad.dtype) if bad.is_floating_point() else bad[-1] + 1
    wrong = {**outputs, name: bad}
    assert not all(_verdicts(whole, wrong)) and not all(_verdicts(parts, wrong))


def test_chunks_only_large_row_independent_cases() -> None:
    spec = ops.get("group_quant")
    _, case = _small_case("group_quant")
    assert chunked.chunk_rows(spec, case) is None
    assert chunked.chunk_rows(spec, case, chunk_elements=8, above=0) is not None
    tensor = case.replace(features={**case.features, "unit": "tensor"})
    assert chunked.chunk_rows(spec, tensor, chunk_elements=8, above=0) is None


def test_a_large_case_holds_the_machine_wide_lock(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "lock")

    def taken() -> bool:
        with open(path, "a+") as other:
            try:
                fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(other.fileno(), fcntl.LOCK_UN)
            return False

    with large_lock.one_at_a_time(100, above=10, path=path) as held:
        assert held and taken()
    assert not taken()
    with large_lock.one_at_a_time(10, above=10, path=path) as held:
        assert not held and not taken()
