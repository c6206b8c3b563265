"""The experts op's `division` convention: a kernel whose activation quantizer divides approximately (Triton's fp32
`/` on NVIDIA GPUs, up to 2 ulp: SGLang's Triton quantizers) rounds GEMM1-input elements that sit on a code
boundary to the other neighbour. Emulated on the CPU with the quotient moved one ulp toward zero: it must pass
under `division=approximate` and fail without it (the tie rows of w8a8 cells make it visible), and a quantizer
that is really wrong (a quotient 2^-10 off) must still fail under the declaration."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.core.case import Case
from harness.ops import experts as op
from harness.ops import experts_quant as xq
from reference import experts as ref
from reference.quant import QuantUnit, dequantize, quantize, scale_from_amax

_FEATURES = {"format": "standard", "activation": "silu", "apply_weight_on_input": "N", "expert_map": "N",
             "bias": "N"}


def _case(quant_type: str, quant_format: str, dtype: str, on_input: str = "N") -> Case:
    return Case(op="experts", adapter="t", seed=5, routing="random",
                features={**_FEATURES, "quant_type": quant_type, "quant_format": quant_format, "dtype": dtype,
                          "apply_weight_on_input": on_input},
                shapes={"M": 24, "E": 4, "k": 1 if on_input == "Y" else 2, "K": 256, "N": 128}, dtypes={"x": dtype})


def _moved_quantizer(quant: ref.ExpertsQuant, rel: float) -> ref.ExpertsQuant:
    """`quant` whose GEMM1-input quotients x / s are moved toward zero: one fp32 ulp (rel=0) or by rel."""
    recipe = quant.act

    class Moved(ref.ExpertsQuant):
        def quantize_input(self, rows: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
            r = rows.float()
            s = xq._expand(scale_from_amax(xq._units(r.abs(), recipe).float(), recipe), r, recipe).float()
            q = r / s
            q = torch.nextafter(q, torch.zeros_like(q)) if rel == 0 else q * (1 - rel)
            unit = dataclasses.replace(recipe, layout="row_major", application="divide")
            ones = torch.ones_like(xq._units(q.abs(), unit))
            return dequantize(quantize(q, unit, scales=ones), torch.float64) * s.double()

    assert recipe is not None and recipe.unit in (QuantUnit.GROUP, QuantUnit.ROW)
    fields = {f.name: getattr(quant, f.name) for f in dataclasses.fields(quant) if f.init}
    return Moved(**fields)


def _outside(case: Case, conv: dict[str, str], rel: float) -> int:
    inputs = op.make_inputs(case, "cpu")
    quant = xq.to_experts_quant(inputs, xq.scheme(case, conv))
    on_input = case.features["apply_weight_on_input"] == "Y"
    got = ref.fused_experts(inputs["x"], None, None, inputs["topk_weights"], inputs["topk_ids"],
                            **op._oracle_kwargs(case, conv), apply_router_weight_on_input=on_input,
                            quant=_moved_quantizer(quant, rel), compute_dtype=torch.float64,
                            out_dtype=inputs["x"].dtype)
    (check,) = op.expected(case, inputs, conv)
    return int(((got.double() - check.expected).abs() > check.bound).sum())


@pytest.mark.parametrize("cell", [("fp8_w8a8", "G128", "bfloat16", "N"), ("fp8_w8a8", "A", "float16", "Y"),
                                  ("int8_w8a8", "A", "float16", "N")])
def test_an_approximate_division_passes_only_under_its_declaration(cell: tuple[str, str, str, str]) -> None:
    case = _case(*cell)
    assert _outside(case, {}, rel=0) > 0, "the tie rows no longer show a one-ulp quotient"
    assert _outside(case, {"division": "approximate"}, rel=0) == 0


def test_a_wrong_quantizer_still_fails_under_the_declaration() -> None:
    assert _outside(_case("fp8_w8a8", "G128", "bfloat16", "N"), {"division": "approximate"}, rel=2**-10) > 0
