"""Triton unpermute-reduce: out[t] = routed_scaling_factor * sum_j w[t, j] * y[t, j] (docs/SEMANTICS.md §5).

`expert_out [M, k, K]` holds one row per (token, slot) (already unpermuted). One program computes BLOCK
contiguous columns of one token: the k rows are loaded (all issued before the adds, k is a compile-time
constant), each term formed in fp32, and summed in slot order j = 0..k-1. Memory bound: every input byte is read
once, every output byte written once.

Accumulation conventions:
  "fp32": terms and sum in fp32, times the factor in fp32, one rounding to the output dtype.
  "output_dtype_sequential": each term rounded to the output dtype, each add computed in fp32 and rounded to
      the output dtype (vLLM `moe_sum`), then the factor (if not 1) multiplied in fp32 and rounded again.
Slots whose expert is non-local under an expert map contribute nothing (their rows are not even read).
Each output element depends only on its own token's rows, with a block size chosen from K alone: results are
bitwise reproducible and independent of the batch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["ACCUMULATIONS", "unpermute_reduce"]

ACCUMULATIONS = ("fp32", "output_dtype_sequential")
_FLOATS = (torch.bfloat16, torch.float16, torch.float32)
_INDEX_DTYPES = (torch.int32, torch.int64)


@triton.jit
def _reduce_kernel(y_ptr, w_ptr, ids_ptr, emap_ptr, out_ptr, K, factor,
                   stride_ym, stride_yj, stride_yk, stride_wm, stride_wj, stride_im, stride_ij, stride_om, stride_ok,
                   TOPK: tl.constexpr, BLOCK: tl.constexpr, APPLY_WEIGHT: tl.constexpr, HAS_MAP: tl.constexpr,
                   SEQUENTIAL: tl.constexpr, SCALE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)  # M*k*K may pass 2**31 elements
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cmask = cols < K
    out_ty = out_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(TOPK):  # slot order is the accumulation order
        if HAS_MAP:
            e = tl.load(ids_ptr + t * stride_im + j * stride_ij)
            local = tl.load(emap_ptr + e) >= 0
            # a non-local row is not read at all: its columns count as out of range
            y = tl.load(y_ptr + t * stride_ym + j * stride_yj + cols * stride_yk, mask=cols < tl.where(local, K, 0),
                        other=0.0)
        else:
            y = tl.load(y_ptr + t * stride_ym + j * stride_yj + cols * stride_yk, mask=cmask, other=0.0)
        term = y.to(tl.float32)
        if APPLY_WEIGHT:
            term = tl.load(w_ptr + t * stride_wm + j * stride_wj) * term
        if SEQUENTIAL:
            # acc holds a value of the output dtype, widened; round the term, then round after the add
            summed = (acc + term.to(out_ty).to(tl.float32)).to(out_ty).to(tl.float32)
        else:
            summed = acc + term
        if HAS_MAP:
            acc = tl.where(local, summed, acc)  # a non-local slot adds nothing, whatever its row holds
        else:
            acc = summed
    if SCALE:
        acc = acc * factor
    tl.store(out_ptr + t * stride_om + cols * stride_ok, acc.to(out_ty), mask=cmask)


def _block_for(hidden: int) -> tuple[int, int]:
    """(BLOCK, num_warps) from K alone (never from M: keeps results batch invariant)."""
    block = min(1024, max(64, triton.next_power_of_2(max(hidden, 1))))
    return block, max(1, min(4, block // 256))


def unpermute_reduce(
    expert_out: torch.Tensor,
    topk_weights: torch.Tensor | None,
    topk_ids: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    accumulation: str = "fp32",
    weights_applied: bool = False,
    apply_router_weight_on_input: bool = False,
    expert_map: torch.Tensor | None = None,
    routed_scaling_factor: float = 1.0,
) -> torch.Tensor:
    """Weighted sum over the k slots of each token.

    Args:
        expert_out: [M, k, K] bf16/fp16/fp32, row (t, j) = expert topk_ids[t, j]'s output for token t.
        topk_weights: [M, k] fp32; not read (may be None) when weights_applied or apply_router_weight_on_input.
        topk_ids: [M, k] int32/int64 global expert ids; only read (and required) with an expert map.
        out: optional [M, K] bf16/fp16/fp32 output (any strides); allocated in expert_out's dtype when None.
        accumulation: "fp32" or "output_dtype_sequential" (module docstring).
        weights_applied: expert_out already carries the router weight (the term is y as given).
        apply_router_weight_on_input: the weight was applied to the GEMM1 input; requires k == 1; exclusive
            with weights_applied.
        expert_map: optional [E] int32/int64 global id -> local id or -1; non-local slots contribute nothing.
        routed_scaling_factor: multiplies the fp32 sum (rounded to fp32 first, as a kernel argument).

    Returns:
        out.
    """
    if not isinstance(expert_out, torch.Tensor) or expert_out.ndim != 3 or expert_out.dtype not in _FLOATS:
        got = f"{expert_out.dtype} {list(expert_out.shape)}" if isinstance(expert_out, torch.Tensor) else (
            type(expert_out).__name__)
        raise ValueError(f"expert_out must be a 3-D bf16/fp16/fp32 tensor [M, k, K], got {got}")
    m, k, hidden = expert_out.shape
    device = expert_out.device
    if accumulation not in ACCUMULATIONS:
        raise ValueError(f"accumulation must be one of {ACCUMULATIONS}, got {accumulation!r}")
    for name, flag in (("weights_applied", weights_applied),
                       ("apply_router_weight_on_input", apply_router_weight_on_input)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name} must be a bool, got {type(flag).__name__}")
    if weights_applied and apply_router_weight_on_input:
        raise ValueError("weights_applied and apply_router_weight_on_input are exclusive (the weight is applied once)")
    if apply_router_weight_on_input and k != 1:
        raise ValueError(f"apply_router_weight_on_input requires top_k == 1, got top_k={k}")
    if isinstance(routed_scaling_factor, bool) or not isinstance(routed_scaling_factor, (int, float)):
        raise ValueError(f"routed_scaling_factor must be a float, got {type(routed_scaling_factor).__name__}")
    apply_weight = not (weights_applied or apply_router_weight_on_input)
    if apply_weight:
        if (not isinstance(topk_weights, torch.Tensor) or topk_weights.dtype != torch.float32
                or list(topk_weights.shape) != [m, k] or topk_weights.device != device):
            got = (f"{topk_weights.dtype} {list(topk_weights.shape)} on {topk_weights.device}"
                   if isinstance(topk_weights, torch.Tensor) else type(topk_weights).__name__)
            raise ValueError(f"topk_weights must be an fp32 tensor of shape [{m}, {k}] on {device}, got {got}")
    has_map = expert_map is not None
    if has_map:
        if (not isinstance(expert_map, torch.Tensor) or expert_map.ndim != 1 or expert_map.dtype not in _INDEX_DTYPES
                or expert_map.device != device):
            raise ValueError(f"expert_map must be a 1-D int32/int64 tensor on {device}")
        if (not isinstance(topk_ids, torch.Tensor) or topk_ids.dtype not in _INDEX_DTYPES
                or list(topk_ids.shape) != [m, k] or topk_ids.device != device):
            raise ValueError(f"topk_ids must be an int32/int64 tensor of shape [{m}, {k}] on {device} "
                             "when an expert map is given")
        expert_map = expert_map.contiguous()
    if out is None:
        out = torch.empty((m, hidden), dtype=expert_out.dtype, device=device)
    elif (not isinstance(out, torch.Tensor) or list(out.shape) != [m, hidden] or out.dtype not in _FLOATS
          or out.device != device):
        got = f"{out.dtype} {list(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"out must be a bf16/fp16/fp32 tensor of shape [{m}, {hidden}] on {device}, got {got}")
    if m == 0 or hidden == 0:
        return out
    if k == 0:
        return out.zero_()

    w = topk_weights if apply_weight else expert_out  # never read when not applied
    ids = topk_ids if has_map else expert_out
    emap = expert_map if has_map else expert_out
    block, warps = _block_for(hidden)
    factor = float(routed_scaling_factor)
    _reduce_kernel[(m, triton.cdiv(hidden, block))](
        expert_out, w, ids, emap, out, hidden, factor,
        *expert_out.stride(), *(w.stride()[:2] if apply_weight else (0, 0)),
        *(ids.stride()[:2] if has_map else (0, 0)), *out.stride(),
        TOPK=k, BLOCK=block, APPLY_WEIGHT=apply_weight, HAS_MAP=has_map,
        SEQUENTIAL=accumulation == "output_dtype_sequential", SCALE=factor != 1.0, num_warps=warps)
    return out
