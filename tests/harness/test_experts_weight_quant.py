"""The experts op quantizes several experts' weights per oracle call where no scale unit spans two experts: the same
codes and scales as quantizing each expert on its own, for every scheme, shape and number of experts per call."""

from __future__ import annotations

import pytest
import torch

from harness.core.case import Case
from harness.ops import experts_quant as xq
from reference.quant import quantize

SCHEMES = [(qt, qf) for qt, formats in xq.FORMATS_OF.items() if qt != "none" for qf in formats]
#: (E, N, K): N a multiple of the 128-row blocks or not, odd N, K a multiple of 128 or ragged
SHAPES = [(3, 64, 256), (3, 130, 256), (2, 37, 96), (5, 128, 200)]
#: elements per call: one expert per call, two or three (five experts: a shorter last call), all at once
BUDGETS = [1, 2 * 128 * 200, 1 << 30]


def _recipe(qt: str, qf: str):  # type: ignore[no-untyped-def]
    case = Case(op="experts", adapter="any", features={"quant_type": qt, "quant_format": qf, "dtype": "bfloat16"},
                shapes={}, dtypes={"x": "bfloat16"}, seed=0)
    return xq.scheme(case, {}).weight


def _one_by_one(w: torch.Tensor, recipe):  # type: ignore[no-untyped-def]
    qs = [quantize(w[e], recipe) for e in range(w.shape[0])]
    return {f: None if getattr(qs[0], f) is None else torch.stack([getattr(q, f) for q in qs])
            for f in ("codes", "scales", "zero_points", "global_scale")}


@pytest.mark.parametrize(("qt", "qf"), SCHEMES, ids=[f"{qt}-{qf}" for qt, qf in SCHEMES])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
@pytest.mark.parametrize("budget", BUDGETS, ids=["one", "some", "all"])
def test_experts_quantized_together_are_as_each_expert_alone(qt: str, qf: str, shape: tuple[int, int, int],
                                                               budget: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(xq, "BATCH_ELEMENTS", budget)
    recipe = _recipe(qt, qf)
    g = torch.Generator().manual_seed(sum(shape))
    # each expert of its own magnitude, with one outlier: a unit spanning two experts would change their scales
    w = torch.randn(shape, generator=g) * torch.logspace(-2, 1, shape[0])[:, None, None]
    w[:, 0, 0] *= 40
    try:
        want = _one_by_one(w, recipe)
    except ValueError:  # a shape the scheme does not take (odd N for packed zero points, ragged K)
        with pytest.raises(ValueError):
            xq._quantized_per_expert(w, recipe)
        return
    got = xq._quantized_per_expert(w, recipe)
    for field, expected in want.items():
        value = getattr(got, field)
        if expected is None:
            assert value is None, field
        else:
            assert value.dtype == expected.dtype and torch.equal(value, expected), (field, qt, qf, shape)
