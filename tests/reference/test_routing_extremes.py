"""The routing oracle stays exact on the logits production reaches: past exp's overflow (|x| > 88.7 in fp32) and at
each dtype's largest finite value. Expectations are computed here with Python's math on the shifted logits (the
softmax is invariant under a shift, so exp(x - max) over the row is the exact quotient)."""

from __future__ import annotations

import math

import pytest
import torch

from reference import routing as ref


def _softmax(row: list[float]) -> list[float]:
    top = max(row)
    e = [math.exp(v - top) for v in row]
    return [v / sum(e) for v in e]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shift", [0.0, 100.0, 1000.0, -1000.0])
def test_softmax_weights_are_shift_invariant_past_exp_overflow(dtype: torch.dtype, shift: float) -> None:
    base = [3.0, 2.0, 0.5, -1.0]
    x = torch.tensor([[v + shift for v in base]], dtype=dtype)
    want = _softmax([float(v) for v in x[0].double()])
    w, ids = ref.topk_route(x, 4, scoring=ref.Scoring.SOFTMAX)
    assert ids[0].tolist() == [0, 1, 2, 3]
    assert torch.allclose(w[0].double(), torch.tensor(want, dtype=torch.float64), rtol=2**-23, atol=0)
    assert w.isfinite().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_largest_finite_logits(dtype: torch.dtype) -> None:
    """One logit at the dtype's largest finite value takes weight 1, the rest (its negation among them) 0; the
    sigmoid of +-max saturates to exactly 1 and 0."""
    top = torch.finfo(dtype).max
    x = torch.tensor([[1.0, top, -top, 0.0]], dtype=dtype)
    w, ids = ref.topk_route(x, 2, scoring=ref.Scoring.SOFTMAX)
    assert ids[0].tolist() == [1, 0] and w[0].tolist() == [1.0, 0.0]
    w, ids = ref.topk_route(x, 4, scoring=ref.Scoring.SIGMOID)
    assert ids[0].tolist() == [1, 0, 3, 2]
    assert w[0, 0] == 1.0 and w[0, 3] == 0.0 and w[0, 2] == 0.5
    assert abs(float(w[0, 1]) - 1 / (1 + math.exp(-1.0))) < 1e-7


def test_renormalized_saturated_zero_sigmoids_stay_zero() -> None:
    """Every selected sigmoid exactly 0 (logits far below -88): renormalize keeps zeros, never 0 / 0."""
    x = torch.full((1, 4), -2000.0)
    w, _ = ref.topk_route(x, 2, scoring=ref.Scoring.SIGMOID, renormalize=True)
    assert w.tolist() == [[0.0, 0.0]]
