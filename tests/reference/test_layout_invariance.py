"""The oracle's values are a function of the input *values* only: never of strides, batch size or row length.

torch's CPU kernels pick vectorized or scalar code (and reduction orders) by stride and length, and the two give
1-ulp different results for sigmoid, silu, gelu and softmax sums. Every activation and routing scoring function
must give bit-identical results for the same numbers stored in another layout, evaluated row by row, or in
other batch splits.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from reference import routing
from reference.activations import Activation, GateLayout, Rounding, apply_activation

_NATIVE = {Activation.SWIGLUOAI: GateLayout.INTERLEAVED}


def _x(t: int, w: int, seed: int, dtype: torch.dtype, scale: float = 4.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(t, w, generator=g, dtype=torch.float64) * scale).to(dtype)


def _transposed(x: torch.Tensor) -> torch.Tensor:
    return x.t().contiguous().t()  # same values, column-major storage


def _strided(x: torch.Tensor) -> torch.Tensor:
    big = torch.zeros(x.shape[0], 2 * x.shape[1] + 1, dtype=x.dtype)
    big[:, 1::2] = x
    return big[:, 1::2]  # column stride 2, odd storage offset


def _by_rows(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, splits: list[int]) -> torch.Tensor:
    return torch.cat([f(part) for part in torch.split(x, splits)])


def _row_splits(t: int) -> list[list[int]]:
    return [[1] * t, [3, t - 10, 7], [t - 1, 1]]


def _assert_same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, what
    same = (got == want) | (torch.isnan(got) & torch.isnan(want))
    assert bool(same.all()), f"{what}: {int((~same).sum())} of {same.numel()} elements differ"


def _activation_columns(name: Activation, x: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """The input whose output is columns [a, b) of the output of x (gate and up columns kept together)."""
    if name.value.endswith("_no_mul"):
        return x[:, a:b]
    if _NATIVE.get(name, GateLayout.HALVES) == GateLayout.INTERLEAVED:
        return x[:, 2 * a : 2 * b]
    n = x.shape[1] // 2
    return torch.cat([x[:, a:b], x[:, n + a : n + b]], dim=1)


_ACT_CASES = [(a, Rounding.ROUND_ONCE) for a in Activation] + [
    (a, Rounding.ROUND_ACTIVATION_FIRST) for a in Activation if not a.value.endswith("_no_mul")
]


@pytest.mark.parametrize(("name", "rounding"), _ACT_CASES, ids=lambda v: v.value)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("out_dtype", [None, torch.float32], ids=str)
def test_activations_do_not_depend_on_layout(name: Activation, rounding: Rounding, dtype: torch.dtype,
                                              out_dtype: torch.dtype | None) -> None:
    t, n = 37, 83  # odd lengths: vector bodies and scalar tails
    width = n if name.value.endswith("_no_mul") else 2 * n
    x = _x(t, width, seed=len(name.value) + 3, dtype=dtype)
    kw = {} if rounding == Rounding.ROUND_ONCE else {"rounding": rounding}

    def f(v: torch.Tensor) -> torch.Tensor:
        return apply_activation(name, v, out_dtype=out_dtype, **kw)

    want = f(x)
    _assert_same(f(_transposed(x)), want, "transposed storage")
    _assert_same(f(_strided(x)), want, "strided columns")
    for splits in _row_splits(t):
        _assert_same(_by_rows(f, x, splits), want, f"rows split {splits}")
    for a, b in ((0, 1), (1, 17), (17, n)):  # other row lengths
        _assert_same(f(_activation_columns(name, x, a, b)), want[:, a:b], f"columns [{a}, {b})")
    # one element at a time (every element through the scalar path)
    _assert_same(f(_activation_columns(name, x[:1], 5, 6)), want[:1, 5:6], "a single element")


_BIAS = torch.linspace(-0.05, 0.05, 64, dtype=torch.float32)
_ROUTES: dict[str, tuple[Callable[..., tuple[torch.Tensor, torch.Tensor]], Callable[..., torch.Tensor], dict]] = {
    "softmax": (routing.topk_route, routing.topk_selection_scores, {"k": 6}),
    "softmax_renormalize": (routing.topk_route, routing.topk_selection_scores, {"k": 6, "renormalize": True}),
    "topk_then_softmax": (routing.topk_route, routing.topk_selection_scores,
                          {"k": 6, "renormalize": True, "order": routing.SoftmaxOrder.TOPK_THEN_SOFTMAX}),
    "sigmoid_bias": (routing.topk_route, routing.topk_selection_scores,
                     {"k": 6, "scoring": routing.Scoring.SIGMOID, "renormalize": True, "correction_bias": _BIAS}),
    "grouped_softmax": (routing.grouped_topk_route, routing.grouped_topk_selection_scores,
                        {"k": 6, "num_groups": 8, "topk_group": 3, "scoring": routing.Scoring.SOFTMAX}),
    "grouped_sigmoid_bias": (routing.grouped_topk_route, routing.grouped_topk_selection_scores,
                             {"k": 8, "num_groups": 8, "topk_group": 4, "scoring": routing.Scoring.SIGMOID,
                              "correction_bias": _BIAS, "routed_scaling_factor": 2.5}),
    "llama4": (lambda x, **kw: routing.llama4_top1_route(x), lambda x, **kw: routing.llama4_top1_selection_scores(x),
               {}),
}


@pytest.mark.parametrize("route", list(_ROUTES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64], ids=str)
def test_routing_does_not_depend_on_layout(route: str, dtype: torch.dtype) -> None:
    fn, scores_fn, kw = _ROUTES[route]
    if dtype == torch.float64 and "correction_bias" in kw:
        kw = {**kw, "correction_bias": kw["correction_bias"].double()}
    x = _x(61, 64, seed=11, dtype=dtype, scale=2.0)

    def f(v: torch.Tensor) -> torch.Tensor:
        w, ids = fn(v, **kw)
        return torch.cat([w.to(torch.float64), ids.to(torch.float64), scores_fn(v, **kw).to(torch.float64)], 1)

    want = f(x)
    _assert_same(f(_transposed(x)), want, "transposed storage")
    _assert_same(f(_strided(x)), want, "strided experts")
    for splits in _row_splits(x.shape[0]):
        _assert_same(_by_rows(f, x, splits), want, f"rows split {splits}")
