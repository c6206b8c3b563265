"""Fused experts for fp8 G128 on sm90 with fast accumulation, both GEMMs written in Gluon (Triton's explicit dialect).

Numerics as kernels.fused_experts(fp8_fast_accum=True) and vLLM's kernel: each 128-deep K block's fp8 products are
summed by the tensor core in its reduced precision, then scaled and added to an fp32 accumulator. Each GEMM issues
asynchronous warp-group MMAs (wgmma) on TMA tiles from a ring of stages; while one warp group promotes a block, the
other CTAs on the SM keep the tensor cores busy (results/sm90/bench/2026-11-30-4342101-fp8-gluon-promotion-probe).
TMA needs the rows of A contiguous, so x's codes are first copied into the sorted-token order.

The pipeline: x quantized per token (1x128 groups) and copied into expert order; GEMM1 with the gate and up halves
of W13 in two accumulators and silu(gate) * up in fp32 in its epilogue, rounded to x.dtype; that intermediate
quantized by the same recipe; GEMM2 with the router weight on its fp32 accumulator, each weighted slot stored in
x.dtype at its slot's row; the slots summed in fp32 (kernels.fused_experts.reduce_slots). (Promoting every 32-deep
fp8 MMA instead is not our default accumulation: the tensor core's sum within one MMA is already reduced precision;
the default path multiplies in fp16, exactly.)

Gluon kernels do not run in Triton's interpreter: this path exists on sm90 GPUs only (`unavailable()` says why not).
"""

from __future__ import annotations

import functools

import torch
import triton

from kernels.fused_experts import REDUCES, _act_code, _check_weights, reduce_slots, sort_tokens
from kernels.quant_gemm import ExpertsQuant

#: (rows, columns of the output tile, warps, stages): a warp group of 4 warps per 64 rows, 2 CTAs per SM
BLOCK_M, BLOCK_N, WARPS, STAGES = 64, 128, 4, 4
GROUP = 128
#: TMA: every row of a global operand starts 16-byte aligned
ALIGN = 16


@functools.cache
def missing_api() -> str:
    """Why this Triton cannot build these kernels ("" when it can): no Gluon Hopper API. Imports them (once)."""
    try:
        import kernels.gluon_experts_kernels  # noqa: F401
    except (ImportError, AttributeError) as e:  # a Triton without it: the path is unavailable
        return f"Triton {triton.__version__} has no Gluon Hopper API ({e})"
    return ""


def unavailable(device: torch.device | str | None = None) -> str:
    """Why this path cannot run here ("" when it can): Gluon's Hopper API and an sm90 GPU."""
    if missing_api():
        return missing_api()
    if not torch.cuda.is_available():
        return "no CUDA device (Gluon kernels do not run in Triton's interpreter)"
    cap = torch.cuda.get_device_capability(device)
    if cap != (9, 0):
        return f"warp-group MMAs (wgmma) need compute capability 9.0, this GPU has {cap[0]}.{cap[1]}"
    return ""


def _gemm(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, c: torch.Tensor,
          st, rw: torch.Tensor, numel: int, n: int, *, gated: bool, scatter: bool) -> None:
    from kernels.gluon_experts_kernels import TensorDescriptor, experts_gemm, gl

    e, w_rows, k_dim = w.shape
    bn = BLOCK_N // 2 if gated else BLOCK_N
    w_scale = w_scale.float().contiguous()
    a_layout = gl.NVMMASharedLayout.get_default_for([BLOCK_M, GROUP], gl.float8e4nv)
    w_layout = gl.NVMMASharedLayout.get_default_for([bn, GROUP], gl.float8e4nv)
    a_desc = TensorDescriptor(a, list(a.shape), list(a.stride()), [BLOCK_M, GROUP], a_layout)
    w2d = w.view(e * w_rows, k_dim)
    w_desc = TensorDescriptor(w2d, list(w2d.shape), list(w2d.stride()), [bn, GROUP], w_layout)
    grid = (st.max_blocks * triton.cdiv(n, bn),)
    experts_gemm[grid](a_desc, w_desc, c, a_scale, w_scale, st.sorted_ids, st.expert_ids, st.num_post_padded, rw,
                        numel, n, k_dim, w_rows, c.stride(0), a_scale.stride(0), w_scale.stride(0),
                        w_scale.stride(1), GATED=gated, SCATTER=scatter, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                        BLOCK_K=GROUP, STAGES=STAGES, num_warps=WARPS)


def gluon_fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                        topk_ids: torch.Tensor, quant: ExpertsQuant, *, out: torch.Tensor | None = None,
                        reduce: str = "fp32") -> torch.Tensor:
    """silu_and_mul fused experts on x [M, K] (bf16 or fp16) with fp8 codes w13 [E, 2N, K], w2 [E, K, N] and
    their 128x128 scales in `quant` (fp8_w8a8 G128), topk_* [M, k]; x and the intermediate quantized by the
    scheme's activation recipe (kernels.quant_gemm). K and N multiples of 16 (TMA). Returns out [M, K] in x.dtype.
    Fast accumulation: each 128-deep K block summed by the tensor core, then promoted (matmul_precision
    "fp8_mma_promoted")."""
    if quant.quant_type != "fp8_w8a8" or quant.quant_format != "G128":
        raise ValueError(f"quant must be fp8_w8a8 G128, got {quant.quant_type} {quant.quant_format}")
    if reduce not in REDUCES:
        raise ValueError(f"reduce must be one of {REDUCES}, got {reduce!r}")
    if x.dim() != 2 or topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0] or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"x must be [M, K] and topk_ids/topk_weights [M, k], got {list(x.shape)}, "
                         f"{list(topk_ids.shape)}, {list(topk_weights.shape)}")
    m, k_dim = x.shape
    e = w13.shape[0]
    n = _check_weights(x.dtype, k_dim, w13, w2, _act_code("silu_and_mul"), quant)
    if k_dim % ALIGN or n % ALIGN:
        raise ValueError(f"K and N must be multiples of {ALIGN} (TMA rows), got K={k_dim}, N={n}")
    why = unavailable(x.device)
    if why:
        raise RuntimeError(f"gluon_fused_experts cannot run here: {why}")
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    top_k = topk_ids.shape[1]
    numel = m * top_k
    if numel == 0 or k_dim == 0:
        return out
    ids = topk_ids.reshape(-1).contiguous()
    st = sort_tokens(ids, e, BLOCK_M)
    xq, xs = quant.quantize_activation(x)
    rows = st.sorted_ids.long()
    src = torch.where(rows < numel, rows // top_k, 0)  # padding rows read token 0: finite, and never stored
    a1 = xq.view(torch.uint8).index_select(0, src).view(xq.dtype)
    s1 = xs.index_select(0, src)
    rw = topk_weights.reshape(-1).contiguous()
    inter = torch.empty(rows.shape[0], n, dtype=x.dtype, device=x.device)  # in expert order, like a1
    _gemm(a1, s1, w13, quant.w13_scale, inter, st, rw, numel, n, gated=True, scatter=False)
    a2, s2 = quant.quantize_activation(inter)
    y = torch.empty(numel, k_dim, dtype=x.dtype, device=x.device)  # each weighted slot at its slot's row
    _gemm(a2, s2, w2, quant.w2_scale, y, st, rw, numel, k_dim, gated=False, scatter=True)
    return reduce_slots(y, out, ids, None, top_k, reduce)
