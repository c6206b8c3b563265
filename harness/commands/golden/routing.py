"""Golden cases of the routing oracle (reference/routing.py): a handful of rows each, E up to 64."""

from __future__ import annotations

import math

import torch

from harness.commands.golden import golden
from reference.routing import (
    ScalingPlacement,
    Scoring,
    SoftmaxOrder,
    grouped_topk_route,
    grouped_topk_selection_scores,
    llama4_top1_route,
    llama4_top1_selection_scores,
    topk_route,
    topk_selection_scores,
)

#: softmax/sigmoid weights come from fp32 exp, whose last bit differs between CPUs
ROUTING_ULPS = 4


def _logits(seed: int, m: int, e: int, dtype: torch.dtype, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m, e, generator=g) * scale).to(dtype)


def _bias(seed: int, e: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(e, generator=g) * 0.1


@golden("routing_softmax_topk", ulps=ROUTING_ULPS)
def softmax_topk() -> dict[str, torch.Tensor]:
    x = _logits(100, 6, 16, torch.float32)
    w, ids = topk_route(x, 4)
    sel = topk_selection_scores(x, 4)
    return {"router_logits": x, "topk_weights": w, "topk_ids": ids, "selection_scores": sel}


@golden("routing_softmax_topk_bf16_renorm", ulps=ROUTING_ULPS)
def softmax_topk_bf16_renorm() -> dict[str, torch.Tensor]:
    x = _logits(101, 6, 64, torch.bfloat16)
    w, ids = topk_route(x, 8, renormalize=True)
    return {"router_logits": x, "topk_weights": w, "topk_ids": ids}


@golden("routing_topk_then_softmax", ulps=ROUTING_ULPS)
def topk_then_softmax() -> dict[str, torch.Tensor]:
    x = _logits(102, 6, 32, torch.float16)
    kw = dict(renormalize=True, order=SoftmaxOrder.TOPK_THEN_SOFTMAX)
    w, ids = topk_route(x, 4, **kw)
    sel = topk_selection_scores(x, 4, **kw)
    return {"router_logits": x, "topk_weights": w, "topk_ids": ids, "selection_scores": sel}


@golden("routing_sigmoid_bias", ulps=ROUTING_ULPS)
def sigmoid_bias() -> dict[str, torch.Tensor]:
    x = _logits(103, 6, 32, torch.float32)
    b = _bias(203, 32)
    kw = dict(scoring=Scoring.SIGMOID, correction_bias=b, renormalize=True)
    w, ids = topk_route(x, 4, **kw)
    return {
        "router_logits": x, "correction_bias": b, "topk_weights": w, "topk_ids": ids,
        "selection_scores": topk_selection_scores(x, 4, **kw),
    }


@golden("routing_grouped_deepseek_v2", ulps=ROUTING_ULPS)
def grouped_v2() -> dict[str, torch.Tensor]:
    # DeepSeek-V2 shape of the problem: softmax, no bias, no renormalization, routed_scaling_factor 16.
    x = _logits(104, 6, 64, torch.bfloat16)
    kw = dict(
        num_groups=8, topk_group=3, scoring=Scoring.SOFTMAX, renormalize=False, routed_scaling_factor=16.0
    )
    w, ids = grouped_topk_route(x, 6, **kw)
    return {
        "router_logits": x, "topk_weights": w, "topk_ids": ids,
        "selection_scores": grouped_topk_selection_scores(x, 6, **kw),
    }


@golden("routing_grouped_deepseek_v3", ulps=ROUTING_ULPS)
def grouped_v3() -> dict[str, torch.Tensor]:
    # DeepSeek-V3 shape of the problem: sigmoid, correction bias, renormalize, routed_scaling_factor 2.5.
    x = _logits(105, 6, 64, torch.bfloat16)
    b = _bias(205, 64)
    kw = dict(num_groups=8, topk_group=4, scoring=Scoring.SIGMOID, correction_bias=b, renormalize=True,
              routed_scaling_factor=2.5)
    w, ids = grouped_topk_route(x, 8, **kw)
    w_reduce, _ = grouped_topk_route(x, 8, **kw, scaling_placement=ScalingPlacement.REDUCE)
    return {
        "router_logits": x, "correction_bias": b, "topk_weights": w, "topk_ids": ids,
        "topk_weights_placement_reduce": w_reduce,
        "selection_scores": grouped_topk_selection_scores(x, 8, **kw),
    }


@golden("routing_llama4_top1", ulps=ROUTING_ULPS)
def llama4_top1() -> dict[str, torch.Tensor]:
    x = _logits(106, 6, 16, torch.bfloat16)
    w, ids = llama4_top1_route(x)
    sel = llama4_top1_selection_scores(x)
    return {"router_logits": x, "topk_weights": w, "topk_ids": ids, "selection_scores": sel}


@golden("routing_ties_and_nonfinite", ulps=ROUTING_ULPS)
def ties_and_nonfinite() -> dict[str, torch.Tensor]:
    # Row 0: all equal; row 1: integer logits with ties; rows 2-5: NaN row, one NaN, one +Inf, two -Inf
    # (NonFinitePolicy.ZERO, the default).
    x = torch.tensor([[0.5] * 8, [1, 0, 1, 2, 0, 2, 1, 0]] + [[0.25 * i - 1 for i in range(8)]] * 4)
    x[2] = math.nan
    x[3, 4] = math.nan
    x[4, 1] = math.inf
    x[5, [0, 7]] = -math.inf
    out: dict[str, torch.Tensor] = {"router_logits": x}
    for scoring in Scoring:
        w, ids = topk_route(x, 3, scoring=scoring, renormalize=True)
        out[f"{scoring.value}_topk_weights"], out[f"{scoring.value}_topk_ids"] = w, ids
    w, ids = grouped_topk_route(x, 3, num_groups=4, topk_group=2, scoring=Scoring.SIGMOID,
                                correction_bias=torch.linspace(-0.1, 0.1, 8))
    out["grouped_topk_weights"], out["grouped_topk_ids"] = w, ids
    w, ids = llama4_top1_route(x)
    out["llama4_topk_weights"], out["llama4_topk_ids"] = w, ids
    return out
