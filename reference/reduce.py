"""Unpermute-reduce: combine each token's k expert outputs into one row (docs/SEMANTICS.md §5).

    out[t] = routed_scaling_factor * sum over slots j of w[t, j] * y[t, j]

where y[t, j] `[K]` is the output of expert topk_ids[t, j] for token t (already unpermuted to one row per
(token, slot), see reference.permute). Libraries agree on this in exact arithmetic and differ in rounding:
the accumulation convention (`ReduceAccumulation`) and where the router weight was applied (flags below) are
explicit arguments.
"""

from __future__ import annotations

import enum

import torch

from reference._checks import FLOAT_DTYPES, INT_INDEX_DTYPES, check_choice, check_tensor
from reference.permute import check_expert_map

__all__ = ["ReduceAccumulation", "unpermute_reduce"]


class ReduceAccumulation(str, enum.Enum):
    """How the k terms of a token are summed.

    FP32: every term in fp32, summed in fp32 in slot order, rounded once to the output dtype
        (SGLang moe_sum_reduce, DeepGEMM, FlashInfer). When expert_out or the output is fp64 the same is done
        in fp64 (so the oracle can produce a high-precision expected value).
    OUTPUT_DTYPE_SEQUENTIAL: each term is rounded to the output dtype, then added in slot order with a
        rounding to the output dtype after every add (each add computed in fp32, or fp64 for an fp64
        output) (vLLM `moe_sum`).
    """

    FP32 = "fp32"
    OUTPUT_DTYPE_SEQUENTIAL = "output_dtype_sequential"


def unpermute_reduce(
    expert_out: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    accumulation: ReduceAccumulation = ReduceAccumulation.FP32,
    weights_applied: bool = False,
    apply_router_weight_on_input: bool = False,
    expert_map: torch.Tensor | None = None,
    routed_scaling_factor: float = 1.0,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Weighted sum over the k slots of each token.

    Args:
        expert_out: `[M, k, K]` float (fp16, bf16, fp32, fp64): y[t, j], one row per (token, slot).
        topk_weights: `[M, k]` fp32 router weights.
        topk_ids: `[M, k]` int32/int64 global expert ids (>= 0; < E when an expert map is given). Only read to
            apply the expert map.
        accumulation: see `ReduceAccumulation`; default FP32 (one final rounding).
        weights_applied: True when expert_out already carries the router weight (it was multiplied into the
            GEMM2 fp32 accumulator, as the Triton fused-MoE kernels do): the terms are y[t, j] as given.
            False (default): the term is w[t, j] * y[t, j], computed in fp32 from the rounded expert output.
        apply_router_weight_on_input: True when the weight multiplied the *input* before GEMM1; the reduce
            then skips it. Only defined for k = 1 (ValueError otherwise); exclusive with weights_applied.
        expert_map: optional `[E]` int32/int64, global id -> local id or -1 (validated as in
            reference.permute). Slots whose expert is non-local contribute nothing, whatever their expert_out
            row holds (even NaN): the result is this rank's partial sum. A token with no local slot gets 0.
        routed_scaling_factor: multiplies the fp32 sum. Pass the model's factor only when the router did *not*
            already fold it into topk_weights (vLLM and FlashInfer fold it in; SGLang applies it here); the
            default 1.0 applies nothing. The factor is rounded to fp32 and multiplied in fp32; under
            OUTPUT_DTYPE_SEQUENTIAL it multiplies the already-rounded sum, which is then rounded again.
        out_dtype: output dtype (float); default expert_out.dtype.

    Returns:
        `[M, K]` in out_dtype, on expert_out's device.
    """
    expert_out = check_tensor("expert_out", expert_out, ndim=3, dtypes=FLOAT_DTYPES)
    num_tokens, top_k, hidden = expert_out.shape
    topk_weights = check_tensor(
        "topk_weights", topk_weights, ndim=2, dtypes=(torch.float32,), shape=[num_tokens, top_k]
    )
    topk_ids = check_tensor("topk_ids", topk_ids, ndim=2, dtypes=INT_INDEX_DTYPES, shape=[num_tokens, top_k])
    check_choice("accumulation", accumulation, list(ReduceAccumulation))
    for name, flag in (
        ("weights_applied", weights_applied),
        ("apply_router_weight_on_input", apply_router_weight_on_input),
    ):
        if not isinstance(flag, bool):
            raise ValueError(f"{name} must be a bool, got {type(flag).__name__}")
    if apply_router_weight_on_input and weights_applied:
        raise ValueError(
            "apply_router_weight_on_input and weights_applied are exclusive: the weight is applied once, "
            "either to the input or in the GEMM2 accumulator"
        )
    if apply_router_weight_on_input and top_k != 1:
        raise ValueError(f"apply_router_weight_on_input requires top_k == 1, got top_k={top_k}")
    if isinstance(routed_scaling_factor, bool) or not isinstance(routed_scaling_factor, (int, float)):
        raise ValueError(f"routed_scaling_factor must be a float, got {type(routed_scaling_factor).__name__}")
    if out_dtype is None:
        out_dtype = expert_out.dtype
    check_choice("out_dtype", out_dtype, FLOAT_DTYPES)
    if topk_ids.numel() and int(topk_ids.min()) < 0:
        raise ValueError(f"topk_ids must hold expert ids >= 0, found {int(topk_ids.min())}")

    # Which slots contribute: all of them, or only those of local experts.
    device = expert_out.device
    if expert_map is None:
        local = torch.ones((num_tokens, top_k), dtype=torch.bool, device=device)
    else:
        num_experts = expert_map.numel() if isinstance(expert_map, torch.Tensor) else 0
        check_expert_map(expert_map, max(num_experts, 1))
        if topk_ids.numel() and int(topk_ids.max()) >= num_experts:
            raise ValueError(
                f"topk_ids must hold expert ids in [0, {num_experts}) (the size of expert_map), "
                f"found {int(topk_ids.max())}"
            )
        local = expert_map.to(device)[topk_ids.to(device).long()] >= 0

    # The terms, in fp32; in fp64 where fp32 would lose digits: an fp64 output, or (FP32 mode) an fp64 input.
    sequential = accumulation == ReduceAccumulation.OUTPUT_DTYPE_SEQUENTIAL
    wide = out_dtype == torch.float64 or (not sequential and expert_out.dtype == torch.float64)
    compute = torch.float64 if wide else torch.float32
    y = expert_out.to(compute)
    if weights_applied or apply_router_weight_on_input:
        terms = y
    else:
        terms = topk_weights.to(device=device, dtype=compute).unsqueeze(-1) * y
    factor = torch.tensor(routed_scaling_factor, dtype=torch.float32, device=device).to(compute)

    if not sequential:
        acc = torch.zeros((num_tokens, hidden), dtype=compute, device=device)
        for j in range(top_k):
            acc = torch.where(local[:, j : j + 1], acc + terms[:, j], acc)
        return (acc * factor).to(out_dtype)

    # OUTPUT_DTYPE_SEQUENTIAL: round each term, then round after every add.
    acc = torch.zeros((num_tokens, hidden), dtype=out_dtype, device=device)
    for j in range(top_k):
        term = terms[:, j].to(out_dtype)
        summed = (acc.to(compute) + term.to(compute)).to(out_dtype)
        acc = torch.where(local[:, j : j + 1], summed, acc)
    if routed_scaling_factor != 1.0:
        acc = (acc.to(compute) * factor).to(out_dtype)
    return acc
