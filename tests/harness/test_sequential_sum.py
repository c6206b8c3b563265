"""A declared slot-by-slot sum in the output dtype (vLLM's moe_sum for k = 2..4) is judged step by step (issue
18 item 6): the oracle's sequential result passes, an fp32 sum rounded once does not (before, a one-sided bound
let any fp32 sum pass)."""

from __future__ import annotations

import torch

from harness.core.case import Case
from harness.ops import experts as op
from reference import experts as ref


def _case(k: int) -> Case:
    return Case(op="experts", adapter="t", seed=5, routing="random",
                features={"format": "standard", "quant_type": "none", "quant_format": "-", "activation": "silu",
                          "apply_weight_on_input": "N", "expert_map": "N", "dtype": "bfloat16", "bias": "N"},
                shapes={"M": 64, "E": 8, "k": k, "K": 96, "N": 64}, dtypes={"x": "bfloat16"})


def _outside(check, actual: torch.Tensor) -> int:
    return int(((actual.double() - check.expected).abs() > check.bound).sum())


def test_sequential_accumulation_is_judged_step_by_step() -> None:
    case = _case(4)
    inputs = op.make_inputs(case, "cpu")
    conv = {"accumulation": "sequential_out_dtype", "weight_placement": "accumulator",
            "intermediate_rounding": "activation_output"}
    (check,) = op.expected(case, inputs, conv)
    args = (inputs["x"], inputs["w13"], inputs["w2"], inputs["topk_weights"], inputs["topk_ids"])
    sequential = ref.fused_experts(*args, accumulation=ref.Accumulation.SEQUENTIAL_OUT_DTYPE)
    fp32_sum = ref.fused_experts(*args, accumulation=ref.Accumulation.ROUNDED_SLOTS)
    assert _outside(check, sequential) == 0
    differ = int((sequential != fp32_sum).sum())
    assert differ > 100
    assert _outside(check, fp32_sum) > differ // 4  # a step whose rounding is certain catches the fp32 sum
