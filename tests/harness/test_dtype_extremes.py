"""The activation op's judging at the dtype's largest finite value: a product that rounds past the output dtype's
range is inf, required exactly; the bound stays finite where the operands' product overflows fp32 (a NaN fails)."""

from __future__ import annotations

import torch

from harness.core.case import Case
from harness.core.compare import compare_bounded
from harness.ops import activation as act_op

FP16_MAX = 65504.0
#: fp16 values at or past 65520 (halfway to 2^16) round to inf
FP16_OVERFLOW = 65520.0


def _case(dtype: str) -> Case:
    return Case(op="activation", adapter="t", features={"activation": "silu_and_mul", "dtype": dtype}, seed=0,
                shapes={"T": 1, "N": 2}, dtypes={"x": dtype})


def _check(x: torch.Tensor, dtype: str):  # type: ignore[no-untyped-def]
    (check,) = act_op.expected(_case(dtype), {"x": x}, {})
    return check


def test_a_product_past_the_output_range_is_inf_exactly() -> None:
    # gate = max: silu(max) = max exactly (sigmoid(65504) is 1 in float64); times 3 is past 65520
    x = torch.tensor([[FP16_MAX, -FP16_MAX, 3.0, 3.0]], dtype=torch.float16)
    assert FP16_MAX * 3.0 >= FP16_OVERFLOW
    check = _check(x, "float16")
    assert check.expected[0, 0].item() == float("inf") and check.bound[0, 0].item() == 0
    assert check.expected[0, 1].item() == 0.0 and torch.isfinite(check.bound).all()
    good = torch.tensor([[float("inf"), -0.0]], dtype=torch.float16)
    assert compare_bounded("out", good, check.expected, check.bound).passed
    for wrong in (FP16_MAX, float("nan")):
        bad = torch.tensor([[wrong, -0.0]], dtype=torch.float16)
        assert not compare_bounded("out", bad, check.expected, check.bound).passed, wrong


def test_the_bound_stays_finite_where_the_operands_overflow_fp32() -> None:
    big = float(torch.finfo(torch.bfloat16).max)
    # gate -max: silu is -0 whatever up is; the operand magnitude (max + 1) * (3 + 1) is past fp32's range
    x = torch.tensor([[-big, 0.5, 3.0, 0.5]], dtype=torch.bfloat16)
    check = _check(x, "bfloat16")
    assert torch.isfinite(check.bound).all()
    nan = torch.tensor([[float("nan"), 0.0]], dtype=torch.bfloat16)
    assert not compare_bounded("out", nan, check.expected, check.bound).passed
