"""Golden cases of the unpermute-reduce (reference.reduce), one per convention that changes the bits."""

from __future__ import annotations

import torch

from harness.commands.golden import golden
from reference.reduce import ReduceAccumulation, unpermute_reduce

NUM_EXPERTS = 8


def _inputs(seed: int, num_tokens: int, top_k: int, hidden: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    topk_ids = torch.stack([torch.randperm(NUM_EXPERTS, generator=g)[:top_k] for _ in range(num_tokens)])
    return {
        "expert_out": torch.randn(num_tokens, top_k, hidden, generator=g).to(dtype),
        "topk_weights": torch.rand(num_tokens, top_k, generator=g),
        "topk_ids": topk_ids.to(torch.int32),
    }


def _case(seed: int, dtype: torch.dtype, top_k: int = 4, **kwargs: object) -> dict[str, torch.Tensor]:
    inputs = _inputs(seed, 6, top_k, 16, dtype)
    out = unpermute_reduce(inputs["expert_out"], inputs["topk_weights"], inputs["topk_ids"], **kwargs)
    extra = {"expert_map": kwargs["expert_map"]} if "expert_map" in kwargs else {}
    return {**inputs, **extra, "out": out}


@golden("reduce_fp32_bf16")
def fp32_bf16() -> dict[str, torch.Tensor]:
    return _case(0, torch.bfloat16, accumulation=ReduceAccumulation.FP32)


@golden("reduce_sequential_bf16")
def sequential_bf16() -> dict[str, torch.Tensor]:
    return _case(0, torch.bfloat16, accumulation=ReduceAccumulation.OUTPUT_DTYPE_SEQUENTIAL)


@golden("reduce_sequential_fp16_weights_applied")
def sequential_fp16_weights_applied() -> dict[str, torch.Tensor]:
    return _case(
        1, torch.float16, accumulation=ReduceAccumulation.OUTPUT_DTYPE_SEQUENTIAL, weights_applied=True
    )


@golden("reduce_fp32_ep_scaled")
def fp32_ep_scaled() -> dict[str, torch.Tensor]:
    expert_map = torch.tensor([0, -1, 1, -1, 2, 3, -1, -1], dtype=torch.int32)
    return _case(2, torch.bfloat16, expert_map=expert_map, routed_scaling_factor=2.5)


@golden("reduce_apply_on_input")
def apply_on_input() -> dict[str, torch.Tensor]:
    return _case(3, torch.bfloat16, top_k=1, apply_router_weight_on_input=True, out_dtype=torch.float32)
