"""Golden cases of the unquantized experts oracle (reference.experts): standard and batched layouts."""

from __future__ import annotations

import torch

from harness.commands.golden import golden
from reference.experts import Accumulation, batched_experts, expert_intermediates, fused_experts

M, K, N, E, TOPK = 12, 16, 8, 6, 2
# Computed in float64 and stored in bf16, so that the BLAS summation order of this CPU cannot show.
F64 = torch.float64
BF16 = torch.bfloat16


def _weights(g: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        "w13": (torch.randn(E, 2 * N, K, generator=g) / K**0.5).to(torch.bfloat16),
        "w2": (torch.randn(E, K, N, generator=g) / N**0.5).to(torch.bfloat16),
        "w13_bias": (torch.randn(E, 2 * N, generator=g) * 0.1).to(torch.bfloat16),
        "w2_bias": (torch.randn(E, K, generator=g) * 0.1).to(torch.bfloat16),
    }


@golden("experts_standard")
def experts_standard() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(200)
    w = _weights(g)
    x = torch.randn(M, K, generator=g).to(torch.bfloat16)
    topk_ids = torch.stack([torch.randperm(E, generator=g)[:TOPK] for _ in range(M)]).to(torch.int32)
    topk_weights = torch.rand(M, TOPK, generator=g)
    expert_map = torch.tensor([2, -1, 0, -1, 1, -1], dtype=torch.int32)  # 3 local experts of 6
    local = [2, 4, 0]  # global ids of local experts 0, 1, 2 (inverse of expert_map)
    inter = expert_intermediates(x, w["w13"], w["w2"], topk_weights, topk_ids, compute_dtype=F64)
    return {
        "x": x, **w, "topk_weights": topk_weights, "topk_ids": topk_ids, "expert_map": expert_map,
        "out": fused_experts(x, w["w13"], w["w2"], topk_weights, topk_ids, compute_dtype=F64),
        "out_bias": fused_experts(x, w["w13"], w["w2"], topk_weights, topk_ids,
                                  w13_bias=w["w13_bias"], w2_bias=w["w2_bias"], compute_dtype=F64),
        "out_sequential": fused_experts(x, w["w13"], w["w2"], topk_weights, topk_ids,
                                        accumulation=Accumulation.SEQUENTIAL_OUT_DTYPE, compute_dtype=F64),
        "out_expert_map": fused_experts(x, w["w13"][local], w["w2"][local], topk_weights, topk_ids,
                                        expert_map=expert_map, compute_dtype=F64),
        "h": inter.h.to(BF16), "a": inter.a.to(BF16), "y": inter.y.to(BF16),
    }


@golden("experts_batched")
def experts_batched() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(201)
    w = _weights(g)
    max_tokens = 5
    x = torch.randn(E, max_tokens, K, generator=g).to(torch.bfloat16)
    expert_num_tokens = torch.tensor([5, 0, 3, 1, 5, 2], dtype=torch.int32)
    return {
        "x": x, **w, "expert_num_tokens": expert_num_tokens,
        "out": batched_experts(x, expert_num_tokens, w["w13"], w["w2"],
                               w13_bias=w["w13_bias"], w2_bias=w["w2_bias"], compute_dtype=F64),
    }
