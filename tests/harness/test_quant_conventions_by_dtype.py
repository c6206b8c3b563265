"""Quantization conventions declared through an adapter and read by the op specs (group_quant, act_quant, experts):
each kernel here is a direct emulation written in plain torch (not the oracle), judged under the matching
declaration (pass) and under the default or another value (fail).

- `eps_dtype` on act_quant's `quant` and the experts' `act_quant` / `weight_quant` recipes, and its values
  `bfloat16` / `float16` (eps rounded to that dtype whatever the input's) beside `input`;
- `e2m1_negative_zero="never"` on group_quant's MXFP4 codes;
- `scale_formula="reciprocal_of_qmax_over_amax"` on group_quant's per-tensor scale (torch's `1 / (448 / amax)`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch

from harness import registry
from harness.core import conventions as conv
from harness.core.case import Case
from harness.core.device import detect
from harness.engine import runner
from harness.ops import act_quant as aq
from harness.ops import experts as experts_op
from harness.ops import experts_quant as xq
from harness.ops import group_quant as gq
from harness.ops.base import Check
from tests.reference.test_format_rules import _mxfp4

FP8_MAX = 448.0
DEV = detect("cpu")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _passed(checks: list[Check], outs: Mapping[str, torch.Tensor]) -> dict[str, bool]:
    return {c.name: runner._compare(c, outs[c.name], outs).passed for c in checks}


def _fp8(v: torch.Tensor) -> torch.Tensor:
    return v.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def _rounded(eps: float, dtype: torch.dtype) -> torch.Tensor:
    """eps as torch code holds it for a tensor of `dtype`: the Python float to fp32, then to the dtype."""
    return torch.tensor(eps, dtype=torch.float32).to(dtype).to(torch.float32)


# ------------------------------------------------------------------------------------------------- act_quant


def _act_case(dtype: str) -> Case:
    f = {"activation": "silu_and_mul", "dtype": dtype, "group_size": "64", "scale_rule": "float",
         "scale_layout": "row_major", "clamp_limit": "N"}
    return Case(op="act_quant", adapter="t", features=f, shapes={"T": 5, "N": 128}, dtypes={"x": dtype}, seed=2)


def _silu_mul_quant(x: torch.Tensor, eps: torch.Tensor) -> dict[str, torch.Tensor]:
    """silu(gate) * up in fp32, per group of 64: scale = max(amax, eps) / 448, codes of v / scale."""
    gate, up = x.float().chunk(2, dim=-1)
    v = (gate * torch.sigmoid(gate) * up).reshape(x.shape[0], -1, 64)
    s = v.abs().amax(-1, keepdim=True).clamp(min=eps) / FP8_MAX
    return {"codes": _fp8(v / s).reshape(x.shape[0], -1), "scales": s.squeeze(-1)}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_act_quant_reads_eps_dtype(dtype: str) -> None:
    """Every group's amax lies below eps = 0.3: its scale is eps / 448 with eps as the kernel holds it."""
    case = _act_case(dtype)
    x = (torch.randn(5, 256, generator=_gen(1)) * 0.5).to(case.dtype("x"))
    eps = 0.3  # fp32, bf16 and fp16 each hold another value
    quant = {"eps": eps}
    for name, dt in (("float16", torch.float16), ("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        kernel = _silu_mul_quant(x, _rounded(eps, dt))
        for said in ("float16", "bfloat16", "float32", "input"):
            conv.validate("act_quant", {"quant": {**quant, "eps_dtype": said}}, "t")
            checks = aq.expected(case, {"x": x}, {"quant": {**quant, "eps_dtype": said}})
            meant = dtype if said == "input" else said
            want = {"codes": True, "scales": meant == name}
            assert _passed(checks, kernel) == want, (name, said)
    default = aq.expected(case, {"x": x}, {"quant": quant})  # float32, the default
    assert _passed(default, _silu_mul_quant(x, _rounded(eps, torch.float32)))["scales"]


# ---------------------------------------------------------------------------------------------------- experts


def _experts_case(dtype: str, **params: Any) -> Case:
    f = {"format": "standard", "quant_type": "fp8_w8a8", "quant_format": "A", "activation": "silu",
         "apply_weight_on_input": "N", "expert_map": "N", "dtype": dtype, "bias": "N"}
    return Case(op="experts", adapter="t", features=f, shapes={"M": 6, "E": 4, "k": 2, "K": 64, "N": 32},
                dtypes={"x": dtype}, seed=4, routing="random", params=params)


def _row_fake_quant(x: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """Per-row fp8 quantization of x, dequantized exactly: scale max(amax, eps) / 448, codes of x / scale."""
    s = x.float().abs().amax(-1, keepdim=True).clamp(min=eps) / FP8_MAX
    return _fp8(x.float() / s).double() * s.double()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_experts_act_quant_reads_eps_dtype(dtype: str) -> None:
    """An eps above every row's amax (100.3): the GEMM1 input's dequantized values follow eps's dtype."""
    case = _experts_case(dtype)
    inputs = experts_op.make_inputs(case, "cpu")
    x = inputs["x"]
    eps = 100.3
    centres = {}
    for said in ("float16", "bfloat16", "float32", "input"):
        conventions = {"act_quant": {"eps": eps, "eps_dtype": said}}
        conv.validate("experts", conventions, "t")
        quant = xq.to_experts_quant(inputs, xq.scheme(case, conventions))
        held = _rounded(eps, case.dtype("x") if said == "input" else getattr(torch, said))
        assert torch.equal(quant.quantize_input(x), _row_fake_quant(x, held)), said
        (check,) = experts_op.expected(case, inputs, conventions)
        centres[said] = check.expected
    assert torch.equal(centres["input"], centres[dtype])
    others = [s for s in ("float16", "bfloat16", "float32") if s != dtype]
    assert all(not torch.equal(centres[dtype], centres[o]) for o in others)


def test_experts_weight_quant_reads_eps_dtype() -> None:
    """The harness quantizes the weights it gives the kernel by `weight_quant`: eps 100.3 above every row's amax
    makes every per-row scale eps / 448, eps held in the declared dtype (`input`: x's, fp16 here)."""
    w = {"w13": torch.randn(4, 64, 64, generator=_gen(7)).to(torch.float16),
         "w2": torch.randn(4, 64, 32, generator=_gen(8)).to(torch.float16)}
    for said, dt in (("float16", torch.float16), ("bfloat16", torch.bfloat16), ("input", torch.float16),
                     ("float32", torch.float32)):
        conv.validate("experts", {"weight_quant": {"eps": 100.3, "eps_dtype": said}}, "t")
        case = _experts_case("float16", weight_quant={"eps": 100.3, "eps_dtype": said})
        found = dict(w)
        xq.quantize_weights(found, xq.scheme(case, {}), "cpu")
        s = _rounded(100.3, dt) / FP8_MAX
        for name in ("w13", "w2"):
            assert bool((found[f"{name}_scale"] == s).all()), (said, name)
            want = _fp8(w[name].float() / s)
            assert torch.equal(found[name].view(torch.uint8), want.view(torch.uint8)), (said, name)


def test_the_reference_experts_resolve_input_eps_by_x_dtype() -> None:
    """reference.experts without the harness: `input` in the activation recipes is x's dtype (bf16 here), for the
    GEMM1 input and the re-quantized intermediate alike."""
    from reference import experts as ex
    from reference.quant import QuantRecipe, quantize

    g = _gen(9)
    x = (torch.randn(5, 32, generator=g) * 0.01).to(torch.bfloat16)
    q13 = [quantize(torch.randn(16, 32, generator=g) * 0.1, QuantRecipe(unit="row")) for _ in range(2)]
    q2 = [quantize(torch.randn(32, 8, generator=g) * 0.1, QuantRecipe(unit="row")) for _ in range(2)]
    tw, ti = torch.rand(5, 1, generator=g), torch.randint(0, 2, (5, 1), generator=g)

    def run(eps_dtype: str) -> torch.Tensor:
        act = QuantRecipe(unit="row", eps=0.07, eps_dtype=eps_dtype)
        return ex.fused_experts(x, None, None, tw, ti, quant=ex.ExpertsQuant(q13, q2, act=act, intermediate=act),
                                compute_dtype=torch.float64, out_dtype=torch.float64)

    assert torch.equal(run("input"), run("bfloat16"))
    assert not torch.equal(run("input"), run("float32"))


# ------------------------------------------------------------------------------------------------ group_quant


def _adapter(name: str, run: Callable[..., None], conventions: dict[str, Any]) -> registry.Adapter:
    ref = registry.resolve("reference-group-quant")
    return registry.Adapter(name=name, op="group_quant", source="tests", run=run, support=ref.support,
                            requires=ref.requires, conventions=conventions)


def _mxfp4_kernel(negative_zero: bool) -> Callable[..., None]:
    def run(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
        codes, scales = _mxfp4(inputs["x"], negative_zero)
        outputs["codes"].copy_(codes)
        outputs["scales"].copy_(scales)
    return run


def test_mxfp4_codes_without_negative_zero_pass_only_where_declared() -> None:
    f = {"quant_dtype": "mxfp4", "unit": "group", "group_size": "32", "scale_rule": "ocp_floor",
         "scale_layout": "row_major", "input_dtype": "bfloat16"}
    case = Case(op="group_quant", adapter="t", features=f, shapes={"M": 6, "K": 128}, dtypes={"x": "bfloat16"},
                seed=3, params={"pattern": "random"})
    for kernel_keeps in (True, False):
        for said in ("kept", "never"):
            a = _adapter(f"mxfp4-{kernel_keeps}-{said}", _mxfp4_kernel(kernel_keeps), {"e2m1_negative_zero": said})
            verdict = runner.judge(case.replace(adapter=a.name), a, DEV).verdict
            assert verdict == ("pass" if kernel_keeps == (said == "kept") else "fail"), (kernel_keeps, said)
    default = _adapter("mxfp4-default", _mxfp4_kernel(False), {})
    assert runner.judge(case.replace(adapter=default.name), default, DEV).verdict == "fail"


def _tensor_case() -> Case:
    f = {"quant_dtype": "fp8_e4m3fn", "unit": "tensor", "group_size": "-", "scale_rule": "float",
         "scale_layout": "row_major", "input_dtype": "bfloat16"}
    return Case(op="group_quant", adapter="t", features=f, shapes={"M": 4, "K": 64}, dtypes={"x": "bfloat16"},
                seed=1)


def _torch_per_tensor(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """torch code: factor = 448 / amax on the fp32 tensor, codes of x * factor, 1 / factor stored."""
    factor = FP8_MAX / x.float().abs().amax()
    return {"codes": _fp8(x.float() * factor), "scales": (1 / factor).reshape(1)}


def test_a_per_tensor_scale_stored_as_one_over_448_over_amax() -> None:
    case = _tensor_case()
    said = {"scale_formula": "reciprocal_of_qmax_over_amax", "application": "qmax_over_amax"}
    conv.validate("group_quant", said, "t")
    seen_other = 0
    for seed in range(12):
        x = (torch.randn(4, 64, generator=_gen(seed)) * 40).clamp(-180, 180).to(torch.bfloat16)
        if seed == 0:
            x[2, 5] = -185.0  # amax 185: 0.41294640302658081, not 0.41294643282890320
        kernel = _torch_per_tensor(x)
        assert _passed(gq.expected(case, {"x": x}, said), kernel) == {"codes": True, "scales": True}, seed
        old = _passed(gq.expected(case, {"x": x}, {**said, "scale_formula": "reciprocal_of_factor"}), kernel)
        seen_other += not old["scales"]
        if seed == 0:
            assert f"{kernel['scales'].item():.17g}" == "0.41294640302658081" and not old["scales"]
    assert seen_other >= 3, seen_other


def test_the_judge_reports_a_wrong_declaration_naming_the_scales() -> None:
    """End to end: the torch kernel passes under the new formula and fails under the correctly rounded factor."""
    def run(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
        for k, v in _torch_per_tensor(inputs["x"]).items():
            outputs[k].copy_(v)

    def factors_differ(c: Case) -> bool:
        amax = gq.make_inputs(c, "cpu")["x"].float().abs().amax()
        return (FP8_MAX / amax).item() != (FP8_MAX / amax.double()).float().item()

    # the first seed whose amax makes the two factors differ (so the test cannot pass vacuously)
    case = next(c for c in (_tensor_case().replace(seed=s, params={"pattern": "random", "exponent": 5})
                            for s in range(40)) if factors_differ(c))
    said = {"scale_formula": "reciprocal_of_qmax_over_amax", "application": "qmax_over_amax"}
    right = _adapter("torch-per-tensor", run, said)
    assert runner.judge(case.replace(adapter=right.name), right, DEV).verdict == "pass"
    wrong = dataclasses.replace(right, name="torch-per-tensor-rn",
                                conventions={**said, "scale_formula": "reciprocal_of_factor"})
    result = runner.judge(case.replace(adapter=wrong.name), wrong, DEV)
    assert result.verdict == "fail" and "scales" in result.reason, result.reason
