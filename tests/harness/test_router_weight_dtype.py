"""The `router_weight_dtype` convention of the experts op: a kernel that rounds the router weights to bf16 before it
multiplies by them (vLLM's make_routing_data for OpenAI's triton_kernels) passes under `bfloat16` and fails under the
default `float32`, and a kernel that keeps them in fp32 fails under `bfloat16`. Likewise for fp16, and `input`
(the activations' dtype, whatever it is) fits a kernel that rounds them to x's dtype in every dtype it serves."""

from __future__ import annotations

import pytest
import torch

from harness.core import conventions
from harness.core.case import Case
from harness.ops import experts as op
from reference import experts as ref

_CASE = Case(op="experts", adapter="t", seed=3, routing="random",
             features={"format": "standard", "quant_type": "none", "quant_format": "-", "activation": "silu",
                       "apply_weight_on_input": "N", "expert_map": "N", "dtype": "bfloat16", "bias": "N"},
             shapes={"M": 48, "E": 8, "k": 4, "K": 96, "N": 64}, dtypes={"x": "bfloat16"})


def _outside(conv: dict[str, str], actual: torch.Tensor, inputs: dict[str, torch.Tensor], case: Case = _CASE) -> int:
    (check,) = op.expected(case, inputs, conv)
    return int(((actual.double() - check.expected).abs() > check.bound).sum())


def test_bf16_router_weights_are_told_apart() -> None:
    assert conventions.for_op("experts")["router_weight_dtype"].default == "float32"
    inputs = op.make_inputs(_CASE, "cpu")
    args = (inputs["x"], inputs["w13"], inputs["w2"])
    exact = ref.fused_experts(*args, inputs["topk_weights"], inputs["topk_ids"])
    rounded = ref.fused_experts(*args, inputs["topk_weights"].to(torch.bfloat16).float(), inputs["topk_ids"])
    bf16 = {"router_weight_dtype": "bfloat16"}
    assert _outside(bf16, rounded, inputs) == 0 and _outside({}, exact, inputs) == 0
    assert _outside({}, rounded, inputs) > 0 and _outside(bf16, exact, inputs) > 0
    assert torch.equal(inputs["topk_weights"], op.make_inputs(_CASE, "cpu")["topk_weights"])  # inputs untouched


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_router_weights_rounded_to_the_input_dtype(dtype: str) -> None:
    """A kernel rounding the weights to x's dtype: passes under `input` in every dtype and under that dtype's name,
    fails under the other names (for fp32 x `input` keeps the weights as given). Summed slot by slot in the output
    dtype (vLLM's moe_sum), where fp16's rounding of the weights shows: an fp32 sum hides it within its bound."""
    case = _CASE.replace(features={**_CASE.features, "dtype": dtype}, dtypes={"x": dtype})
    inputs = op.make_inputs(case, "cpu")
    args = (inputs["x"], inputs["w13"], inputs["w2"])
    rounded = ref.fused_experts(*args, inputs["topk_weights"].to(getattr(torch, dtype)).float(), inputs["topk_ids"],
                                accumulation=ref.Accumulation.SEQUENTIAL_OUT_DTYPE)
    for said in ("input", "float32", "bfloat16", "float16"):
        declared = {"router_weight_dtype": said, "accumulation": "sequential_out_dtype"}
        conventions.validate("experts", declared, "t")
        bad = _outside(declared, rounded, inputs, case)
        assert (bad == 0) == (said in ("input", dtype)), (said, bad)
