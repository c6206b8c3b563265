"""Deliberately wrong adapters: each integrity check and comparison must catch its bug with a readable reason."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from harness import ops, registry
from harness.core.case import Case
from harness.core.device import detect
from harness.engine import runner
from harness.registry import Adapter

DEV = detect("cpu")


def _case(op: str, name: str, features: dict[str, str], fields: dict) -> Case:
    return Case(op=op, adapter=name, features=features, seed=3, **fields)


def _wrong(base: str, name: str, run: Callable, **kw) -> Adapter:  # type: ignore[type-arg]
    ref = registry.resolve(base)
    return Adapter(name=name, op=ref.op, source="tests", run=run, support=ref.support,
                   requires=ref.requires, conventions=kw.pop("conventions", ref.conventions), **kw)


ACT_CELL = {"activation": "silu_and_mul", "dtype": "bfloat16"}
ACT_FIELDS = {"shapes": {"T": 33, "N": 129}, "dtypes": {"x": "bfloat16"}}
EXP_CELL = {"format": "standard", "quant_type": "none", "quant_format": "-", "activation": "silu",
            "apply_weight_on_input": "N", "expert_map": "N", "dtype": "bfloat16", "bias": "N"}
EXP_FIELDS = {"shapes": {"M": 17, "E": 8, "k": 2, "K": 65, "N": 33}, "dtypes": {"x": "bfloat16"}}
RED_CELL = {"accumulation": "fp32", "weights_applied": "N", "apply_weight_on_input": "N", "expert_map": "N",
            "dtype": "bfloat16"}
RED_FIELDS = {"shapes": {"M": 17, "E": 8, "k": 4, "K": 64}, "dtypes": {"expert_out": "bfloat16"}}


def _reference_run(base: str) -> Callable:  # type: ignore[type-arg]
    return registry.resolve(base).run


def _judge(adapter: Adapter, cell: dict, fields: dict):  # type: ignore[no-untyped-def]
    return runner.judge(_case(adapter.op, adapter.name, cell, fields), adapter, DEV)


def off_by_one_mask(case, inputs, outputs):  # type: ignore[no-untyped-def]
    full = {"out": torch.empty_like(outputs["out"])}
    _reference_run("reference-activation")(case, inputs, full)
    outputs["out"][:, :-1] = full["out"][:, :-1]  # the last column of the tile is masked off


def unwritten_rows(case, inputs, outputs):  # type: ignore[no-untyped-def]
    full = {"out": torch.empty_like(outputs["out"])}
    _reference_run("reference-experts")(case, inputs, full)
    outputs["out"][:-3] = full["out"][:-3]


def truncating_round(case, inputs, outputs):  # type: ignore[no-untyped-def]
    from reference.activations import apply_activation

    exact = apply_activation("silu_and_mul", inputs["x"], out_dtype=torch.float32)
    truncated = (exact.view(torch.int32) & ~0xFFFF).view(torch.float32)  # round toward zero instead of RNE
    outputs["out"].copy_(truncated.to(torch.bfloat16))


def modifies_input(case, inputs, outputs):  # type: ignore[no-untyped-def]
    _reference_run("reference-reduce")(case, inputs, outputs)
    inputs["expert_out"].mul_(0.5)  # scratch use of an input buffer


def writes_nan(case, inputs, outputs):  # type: ignore[no-untyped-def]
    _reference_run("reference-activation")(case, inputs, outputs)
    outputs["out"][0, 0] = float("nan")


def wrong_dtype(case, inputs, outputs):  # type: ignore[no-untyped-def]
    out = {"out": torch.empty(outputs["out"].shape, dtype=torch.float32)}
    _reference_run("reference-activation")(case, inputs, out)
    return out


def raises(case, inputs, outputs):  # type: ignore[no-untyped-def]
    raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")


def nondeterministic(case, inputs, outputs):  # type: ignore[no-untyped-def]
    _reference_run("reference-activation")(case, inputs, outputs)
    flat = outputs["out"].view(-1).view(torch.int32)
    flat[torch.randint(0, flat.numel(), (1,))] ^= 1  # one last-bit flip at a random place: a race


def duplicate_ids(case, inputs, outputs):  # type: ignore[no-untyped-def]
    _reference_run("reference-routing")(case, inputs, outputs)
    outputs["topk_ids"][:, -1] = outputs["topk_ids"][:, 0]


@pytest.mark.parametrize(("run", "base", "cell", "fields", "check", "words"), [
    (off_by_one_mask, "reference-activation", ACT_CELL, ACT_FIELDS, "written:out", "never written"),
    (unwritten_rows, "reference-experts", EXP_CELL, EXP_FIELDS, "written:out", "never written"),
    (truncating_round, "reference-activation", ACT_CELL, ACT_FIELDS, "out", "outside the error bound"),
    (modifies_input, "reference-reduce", RED_CELL, RED_FIELDS, "unchanged:expert_out", "was modified"),
    (writes_nan, "reference-activation", ACT_CELL, ACT_FIELDS, "finite:out", "NaN/Inf"),
    (wrong_dtype, "reference-activation", ACT_CELL, ACT_FIELDS, "output:out", "dtype torch.float32"),
    (duplicate_ids, "reference-routing",
     {"scoring": "softmax", "renormalize": "Y", "correction_bias": "N", "logits_dtype": "float32",
      "nonfinite_rows": "N"}, {"shapes": {"M": 9, "E": 16, "k": 4}, "dtypes": {"router_logits": "float32"}},
     "topk_ids", "duplicate or out-of-range"),
])
def test_wrong_adapter_is_caught(run, base, cell, fields, check, words) -> None:  # type: ignore[no-untyped-def]
    r = _judge(_wrong(base, f"wrong-{run.__name__}", run), cell, fields)
    assert r.verdict == "fail", r.reason
    assert check in r.metrics["failed_checks"], (r.metrics, r.reason)
    assert words in r.reason


def test_nondeterminism_caught_when_declared() -> None:
    cell = dict(ACT_CELL, dtype="float32")
    fields = {"shapes": {"T": 33, "N": 129}, "dtypes": {"x": "float32"}}
    bad = _wrong("reference-activation", "wrong-race", nondeterministic, properties=frozenset({"deterministic"}))
    r = _judge(bad, cell, fields)
    assert r.verdict == "fail" and "deterministic:out" in r.metrics["failed_checks"], r.reason
    assert "differ bitwise" in r.reason


def batch_dependent(case, inputs, outputs):  # type: ignore[no-untyped-def]
    _reference_run("reference-activation")(case, inputs, outputs)
    outputs["out"] += inputs["x"].float().mean() * 1e-6  # within the bound, but depends on the other rows


def test_batch_dependence_caught_when_invariance_declared() -> None:
    bad = _wrong("reference-activation", "wrong-batch", batch_dependent, properties=frozenset({"batch_invariant"}))
    r = _judge(bad, dict(ACT_CELL, dtype="float32"), {"shapes": {"T": 33, "N": 129}, "dtypes": {"x": "float32"}})
    assert r.verdict == "fail" and "batch_invariant:out" in r.metrics["failed_checks"], r.reason
    assert "rows change" in r.reason


def test_exception_in_declared_cell_is_an_error_with_the_message() -> None:
    r = _judge(_wrong("reference-activation", "wrong-raises", raises), ACT_CELL, ACT_FIELDS)
    assert r.verdict == "error" and "illegal memory access" in r.reason


def test_exception_naming_nothing_in_an_undeclared_cell_is_an_error() -> None:
    # a crash is not a rejection: only a message that names the cell's feature reads as "unsupported"
    ref = registry.resolve("reference-activation")
    narrow = Adapter(name="narrow", op="activation", source="tests", run=raises,
                     support={**ref.support, "dtype": ("float32",)})
    r = _judge(narrow, ACT_CELL, ACT_FIELDS)
    assert r.verdict == "error" and not r.declared and "dtype=bfloat16" in r.reason, r.reason
    assert "naming none of its axes or values" in r.reason


def test_correct_reference_passes_the_same_cases() -> None:
    for base, cell, fields in (("reference-activation", ACT_CELL, ACT_FIELDS),
                               ("reference-experts", EXP_CELL, EXP_FIELDS),
                               ("reference-reduce", RED_CELL, RED_FIELDS)):
        r = _judge(registry.resolve(base), cell, fields)
        assert r.verdict == "pass", r.reason


def test_every_op_spec_has_axes_and_boundary_cases() -> None:
    for op in ops.available():
        spec = ops.get(op)
        assert spec.axes and all(a.values for a in spec.axes)
        for a in registry.all_adapters(op):
            for cell in spec.all_cells()[:3]:
                assert spec.boundary(a, cell), f"{op}: no boundary case for {cell}"


# ------------------------------------------------------------------------------------ quantized experts

QEXP_CELL = dict(EXP_CELL, quant_type="fp8_w8a8", quant_format="A")
QEXP_FIELDS = {"shapes": {"M": 33, "E": 8, "k": 2, "K": 256, "N": 128}, "dtypes": {"x": "bfloat16"}}


def _quantized_reference(act_quant: dict, requant: bool = True) -> Callable:  # type: ignore[type-arg]
    """The experts oracle with another activation convention (or without re-quantizing the intermediate)."""
    from harness.ops import experts_quant
    from reference import experts

    def run(case, inputs, outputs):  # type: ignore[no-untyped-def]
        sch = experts_quant.scheme(case, {"act_quant": act_quant})
        quant = experts_quant.to_experts_quant(inputs, sch)
        if not requant:
            quant = experts.ExpertsQuant(quant.w13, quant.w2, act=quant.act, intermediate=None)
        outputs["out"].copy_(experts.fused_experts(inputs["x"], None, None, inputs["topk_weights"],
                                                   inputs["topk_ids"], quant=quant))
    return run


@pytest.mark.parametrize(("act_quant", "requant", "cell"), [
    ({"application": "multiply_reciprocal"}, True, QEXP_CELL),  # x * (1/s) where the declared convention divides
    ({}, False, QEXP_CELL),  # forgets to re-quantize the intermediate activation
    ({"scale_rule": "ue8m0"}, True, dict(QEXP_CELL, quant_format="G128")),  # power-of-two scales, not declared
])
def test_quantized_experts_convention_bugs_are_caught(act_quant: dict, requant: bool, cell: dict) -> None:
    bad = _wrong("reference-experts", "wrong-quant", _quantized_reference(act_quant, requant))
    r = _judge(bad, cell, QEXP_FIELDS)
    assert r.verdict == "fail" and "out" in r.metrics["failed_checks"], r.reason
    good = _wrong("reference-experts", "declared-quant", _quantized_reference(act_quant, requant),
                  conventions={"act_quant": act_quant})
    if requant:  # the same kernel passes once it declares its convention
        assert _judge(good, cell, QEXP_FIELDS).verdict == "pass"


def _writes_outside(where: str, on_run: int | str = 1) -> Callable:  # type: ignore[type-arg]
    """on_run: the call that writes outside (1, 2, ...), or "subset": the one on fewer token rows than the case."""
    calls = []

    def run(case, inputs, outputs):  # type: ignore[no-untyped-def]
        _reference_run("reference-activation")(case, inputs, outputs)
        calls.append(1)
        subset = outputs["out"].shape[0] < ACT_FIELDS["shapes"]["T"]
        if (not subset) if on_run == "subset" else len(calls) != on_run:
            return
        out = outputs["out"]
        start = out.storage_offset() + out.numel() if where == "after" else out.storage_offset() - 7
        torch.as_strided(out, (7,), (1,), start).fill_(float("nan"))  # past the end / before the start

    return run


@pytest.mark.parametrize(("where", "words"), [("after", "1 elements past its end"),
                                              ("before", "7 elements before its start")])
def test_out_of_bounds_writes_are_caught(where: str, words: str) -> None:
    r = _judge(_wrong("reference-activation", "oob", _writes_outside(where)), ACT_CELL, ACT_FIELDS)
    assert r.verdict == "fail" and "guard:out" in r.metrics["failed_checks"], r.reason
    assert "wrote 7 elements outside the output buffer" in r.reason and words in r.reason


def test_out_of_bounds_writes_on_the_second_run_are_caught() -> None:
    bad = _wrong("reference-activation", "oob2", _writes_outside("after", on_run=2),
                 properties=frozenset({"deterministic"}))
    r = _judge(bad, ACT_CELL, ACT_FIELDS)
    assert r.verdict == "fail" and "second run wrote 7 elements outside" in r.reason, r.reason


def test_out_of_bounds_writes_on_the_batch_invariance_run_are_caught() -> None:
    bad = _wrong("reference-activation", "oob3", _writes_outside("after", on_run="subset"),
                 properties=frozenset({"batch_invariant"}))
    r = _judge(bad, ACT_CELL, ACT_FIELDS)
    assert r.verdict == "fail" and "batch-invariance run wrote 7 elements outside" in r.reason, r.reason


class _Agreeable(torch.Tensor):
    pass


@pytest.mark.parametrize(("returned", "words"), [
    (lambda t: t.to("meta"), "on device meta, the case runs on cpu"),
    (lambda t: t.as_subclass(_Agreeable), "a _Agreeable with layout torch.strided, not a plain strided"),
])
def test_outputs_must_be_plain_tensors_on_the_case_device(returned: Callable, words: str) -> None:  # type: ignore[type-arg]
    def run(case, inputs, outputs):  # type: ignore[no-untyped-def]
        _reference_run("reference-activation")(case, inputs, outputs)
        return {"out": returned(outputs["out"])}

    r = _judge(_wrong("reference-activation", "elsewhere", run), ACT_CELL, ACT_FIELDS)
    assert r.verdict == "fail" and words in r.reason, r.reason


def test_a_kernel_raising_on_its_second_run_is_the_kernels_error() -> None:
    calls = []

    def run(case, inputs, outputs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("second call breaks")
        _reference_run("reference-activation")(case, inputs, outputs)

    r = _judge(_wrong("reference-activation", "flaky", run, properties=frozenset({"deterministic"})),
               ACT_CELL, ACT_FIELDS)
    assert r.verdict == "error" and r.reason.startswith("kernel raised on its second run: RuntimeError"), r.reason


GQ_CELL = {"quant_dtype": "fp8_e4m3fn", "unit": "group", "group_size": "128", "scale_rule": "float",
           "scale_layout": "column_major", "input_dtype": "bfloat16"}


def _own_scales(case, inputs, outputs):  # type: ignore[no-untyped-def]
    """Allocates its own column-major scales as torch.empty((G, M)).permute(1, 0), as some kernels do."""
    g = outputs["scales"].shape[1]
    scales = torch.empty((g, case.shape("M")), dtype=torch.float32).permute(1, 0)
    _reference_run("reference-group-quant")(case, inputs, {"codes": outputs["codes"], "scales": scales})
    return {"scales": scales}


def _row_major_scales(case, inputs, outputs):  # type: ignore[no-untyped-def]
    scales = torch.empty(outputs["scales"].shape, dtype=torch.float32)  # contiguous: strides (G, 1)
    _reference_run("reference-group-quant")(case, inputs, {"codes": outputs["codes"], "scales": scales})
    return {"scales": scales}


@pytest.mark.parametrize("m", [0, 5])
def test_strides_of_an_output_without_elements_are_not_judged(m: int) -> None:
    """M = 0: torch.empty((G, 0)).permute(1, 0) has strides (1, 1), not the contractual (1, M) = (1, 0); no element
    is laid out, so no stride can be wrong. With rows, the same allocation is column-major and passes too."""
    fields = {"shapes": {"M": m, "K": 256}, "dtypes": {"x": "bfloat16"}, "params": {"pattern": "random"}}
    r = _judge(_wrong("reference-group-quant", "own-scales", _own_scales), GQ_CELL, fields)
    assert r.verdict == "pass", r.reason
    bad = _judge(_wrong("reference-group-quant", "row-major-scales", _row_major_scales), GQ_CELL, fields)
    if m == 0:
        assert bad.verdict == "pass", bad.reason
    else:
        assert bad.verdict == "fail" and "output:scales" in bad.metrics["failed_checks"], bad.reason
        assert "strides (2, 1) != contractual (1, 5)" in bad.reason


ALIGN_CELL = {"block_size": "16", "expert_map": "none", "ids_dtype": "int32"}
ALIGN_FIELDS = {"shapes": {"M": 9, "E": 8, "k": 2}, "dtypes": {"topk_ids": "int32"}, "routing": "random"}


def _short_capacity(case, inputs, outputs):  # type: ignore[no-untyped-def]
    _reference_run("reference-align")(case, inputs, outputs)
    used = int(outputs["num_tokens_post_padded"][0])
    return {"sorted_token_ids": outputs["sorted_token_ids"][: used - 1].clone()}


def test_align_capacity_below_num_tokens_post_padded_is_rejected() -> None:
    r = _judge(_wrong("reference-align", "short-capacity", _short_capacity), ALIGN_CELL, ALIGN_FIELDS)
    assert r.verdict == "fail" and "output:sorted_token_ids" in r.metrics["failed_checks"], r.reason
    assert "shape" in r.reason
    assert _judge(registry.resolve("reference-align"), ALIGN_CELL, ALIGN_FIELDS).verdict == "pass"


NAN_CELL = {"scoring": "softmax", "renormalize": "Y", "correction_bias": "N", "logits_dtype": "float32",
            "nonfinite_rows": "Y"}
NAN_FIELDS = {"shapes": {"M": 9, "E": 16, "k": 4}, "dtypes": {"router_logits": "float32"}, "routing": "nonfinite"}


def _nan_weights(payload: Callable[[Case], int]) -> Callable[..., None]:
    """The reference router, then NaN weights on the non-finite rows (a NaN or +inf logit, or all -inf), their bits
    from `payload`."""
    def run(case, inputs, outputs):  # type: ignore[no-untyped-def]
        _reference_run("reference-routing")(case, inputs, outputs)
        logits = inputs["router_logits"]
        rows = (logits.isnan() | (logits == float("inf"))).any(-1) | (logits == -float("inf")).all(-1)
        w = outputs["topk_weights"].view(torch.int32)
        w[rows] = payload(case)
    return run


def test_nan_payloads_are_not_a_change_between_runs() -> None:
    # a vectorized and a scalar path of one kernel give NaNs of other bits: neither nondeterminism nor batch dependence
    calls = iter(range(1000))
    varying = _nan_weights(lambda case: 0x7FC00000 + 2 * case.shapes["M"] + next(calls) % 2)  # per batch, per run
    both = frozenset({"deterministic", "batch_invariant"})
    conv = {**registry.resolve("reference-routing").conventions, "nonfinite": "propagate"}  # NaN weights expected
    r = _judge(_wrong("reference-routing", "nan-payloads", varying, properties=both, conventions=conv), NAN_CELL,
               NAN_FIELDS)
    assert r.verdict == "pass", r.reason
    # a NaN in one run where the other has a number is still a change
    flips = iter(range(1000))
    number_or_nan = _nan_weights(lambda case: 0x7FC00000 if next(flips) % 2 else 0x3F800000)
    r = _judge(_wrong("reference-routing", "nan-or-one", number_or_nan, properties=both, conventions=conv), NAN_CELL,
               NAN_FIELDS)
    assert r.verdict == "fail" and "deterministic:topk_weights" in r.metrics["failed_checks"], r.reason


def test_a_large_buffers_garbage_is_a_repeated_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past GARBAGE_BLOCK elements a buffer holds one block of garbage repeated (drawing billions of values took
    longer than the case): still finite, never poison B, assorted within the block."""
    monkeypatch.setattr(runner, "GARBAGE_BLOCK", 64)
    for dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.int32):
        t = runner._fill(torch.empty(64 * 5 + 9, dtype=dtype), 0)
        assert torch.equal(runner.bits(t[64:128]), runner.bits(t[:64]))
        assert torch.equal(runner.bits(t[-9:]), runner.bits(t[:9])) and len(set(t[:64].float().tolist())) > 32
        assert bool(t.float().isfinite().all()) and not bool(runner._is_poison(t, 1).any())


@pytest.mark.parametrize("row", [0, 20, 32])
def test_an_unwritten_row_of_a_large_buffer_is_caught(monkeypatch: pytest.MonkeyPatch, row: int) -> None:
    """With the garbage repeated, an element the kernel never wrote still holds what was there: caught."""
    monkeypatch.setattr(runner, "GARBAGE_BLOCK", 64)

    def run(case, inputs, outputs):  # type: ignore[no-untyped-def]
        full = {"out": torch.empty_like(outputs["out"])}
        _reference_run("reference-activation")(case, inputs, full)
        keep = [r for r in range(full["out"].shape[0]) if r != row]
        outputs["out"][keep] = full["out"][keep]

    r = _judge(_wrong("reference-activation", "unwritten-row", run), ACT_CELL, ACT_FIELDS)
    assert r.verdict == "fail" and "written:out" in r.metrics["failed_checks"], r.reason
