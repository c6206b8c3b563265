"""Experts over torch's own grouped GEMMs: `torch._grouped_mm` (CUTLASS, bf16, sm90/sm100) and
`torch._scaled_grouped_mm` (CUTLASS fp8 rowwise, sm90).

What torch._grouped_mm requires (aten/src/ATen/native/GroupedMMUtils.h and cuda/GroupedBlas.cpp, GroupMM.cu):
- mat_a 2-D [rows, K] (standard: rows grouped by expert) or 3-D [E, T, K] (batched); mat_b 3-D [E, K, out],
  passed here as the transposed view of our [E, out, K] weights (column-major B, no copy);
- offs: int32, 1-D, the cumulative end row of each group (2-D x 3-D only); rows past offs[-1] are not written;
- every matrix's data pointer 16-byte aligned and its leading stride a multiple of 16 bytes: K and N multiples
  of 8 for bf16. Ragged K or N are zero-padded here (exact: zeros add nothing), which copies the weights, so the
  benchmarks use aligned shapes;
- fewer than 1024 groups (experts); no bias ("Bias not supported yet"); the output dtype is the input dtype.
  The CUTLASS path runs for bf16 on sm90/sm100; elsewhere torch falls back to a loop of mm with a host sync.

Numerics: both GEMMs accumulate in fp32 and round their outputs to bf16, so h is rounded before the activation
(IntermediateRounding.GEMM1_AND_ACTIVATION_OUTPUT) and the router weight multiplies the rounded expert output
(WeightPlacement.ROUNDED_EXPERT_OUTPUT). Activation, router weight and reduce run here in fp32 with one rounding
at the end. apply-router-weight-on-input (a test path only, not declared by the adapter) multiplies GEMM1's
rounded output in fp32: round(x.W) * w, which differs from round((w x).W) by up to one bf16 rounding.
Non-local slots (expert map) sort last, past offs[-1], and are masked out of the reduce.

fp8_w8a8 over `torch._scaled_grouped_mm` (`scaled_grouped_mm_experts`, `scaled_grouped_mm_batched_experts`), the
CUTLASS fp8 rowwise grouped GEMM (sm90 only; cuda/ScaledGroupMM.cu), per the checks of cuda/GroupedBlas.cpp:
- mat_a float8_e4m3fn row-major [rows, K] with offs, or [E, T, K] without; mat_b float8_e4m3fn [E, K, out]
  column-major (the transposed view of our [E, out, K] codes); K and out multiples of 16 (no padding here: the
  adapter declares the shape limit); no bias; bf16 output only; fewer than 1024 groups;
- scales fp32: scale_a 1-D contiguous, one per row of a 2-D mat_a ([E, T], unit last stride, for a 3-D one);
  scale_b [E, out] with unit last stride. Output = bf16((fp32 accumulator * scale_a[row]) * scale_b[col]),
  use_fast_accum=False (the fp32-promoting mainloop).
Quant formats: A (per-token activation scales, per-output-channel weight scales [E, rows, 1]) as torch takes them;
T (one activation scale per tensor, one weight scale per expert [E]) broadcast to rowwise scales (exact: the same
products). Activations are quantized by `kernels.quant_gemm.quantize_activation` (the Triton path's recipe), x over
all M tokens, then gathered (through a uint8 view) into slot order with their scales. The intermediate is the
activation (fp32, from GEMM1's bf16 output) rounded to bf16, with the rows of non-local slots zeroed (they lie
past offs[-1], never written) before it is re-quantized: a per-tensor scale covers the local slots only. Router
weight on the rounded GEMM2 output, fp32 reduce in slot order, one rounding. apply-router-weight-on-input (k = 1)
multiplies the weight into GEMM1's row scale: bf16((acc * s_x * w) * s_w) is the oracle's round((w x).W) up to fp32
rounding. Batched: rows past the counts are zeroed before a per-tensor quantization of x and of the intermediate.
No host synchronization: CUDA-graph capturable.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.naive_batched import activation_fn

__all__ = ["ALIGN", "available", "grouped_mm_batched_experts", "grouped_mm_experts", "scaled_available",
           "scaled_grouped_mm_batched_experts", "scaled_grouped_mm_experts"]

#: elements per 16 bytes of bf16: the stride alignment torch._grouped_mm checks
ALIGN = 8
MAX_GROUPS = 1023


def available() -> bool:
    return hasattr(torch, "_grouped_mm")


def _pad_last(t: torch.Tensor, multiple: int = ALIGN) -> torch.Tensor:
    extra = -t.shape[-1] % multiple
    return F.pad(t, (0, extra)) if extra else t


def group_ends(key: torch.Tensor, groups: int) -> torch.Tensor:
    """int32 cumulative end row of each group 0..groups-1 of `key` (values in [0, groups]; `groups` sorts last).
    A scatter-add, not torch.bincount, which reads the maximum back to the host: this stays capturable in a
    CUDA graph."""
    counts = torch.zeros(groups + 1, dtype=torch.int64, device=key.device)
    counts.scatter_add_(0, key, torch.ones_like(key))
    return counts[:groups].cumsum(0).to(torch.int32)


def _sort_slots(topk_ids: torch.Tensor, expert_map: torch.Tensor | None,
                e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(key, order, offs): each flattened slot's local expert (e for a non-local slot, so it sorts after every
    group), the stable order that groups the slots by it, and the int32 group ends (no host sync)."""
    ids = topk_ids.reshape(-1).long()
    if expert_map is not None:
        ids = expert_map.long()[ids]
    key = torch.where(ids >= 0, ids, e)
    order = torch.argsort(key, stable=True)
    return key, order, group_ends(key, e)


def _route(x: torch.Tensor, topk_ids: torch.Tensor, expert_map: torch.Tensor | None, e: int,
           out: torch.Tensor | None) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None]:
    """out (allocated when None) and the sorted slots (order, group ends, local mask of the sorted rows), or None
    when out is already the answer: no routed slot (out as given) or no local expert (zeros)."""
    if out is None:
        out = torch.empty_like(x)
    if topk_ids.numel() == 0:
        return out, None
    if e == 0:
        return out.zero_(), None
    key, order, offs = _sort_slots(topk_ids, expert_map, e)
    return out, (order, offs, (key[order] < e)[:, None])  # non-local rows lie past offs[-1]


def _unsort_and_reduce(y: torch.Tensor, local: torch.Tensor, order: torch.Tensor, m: int, top_k: int,
                       out: torch.Tensor) -> torch.Tensor:
    """Weighted expert outputs y [M*k, K] (fp32, in sorted order) back to slot order, non-local rows (never
    written past offs[-1]) zeroed, summed over the k slots in fp32 and rounded once into out [M, K]."""
    slots = torch.empty_like(y)
    slots[order] = torch.where(local, y, 0.0)
    out.copy_(slots.view(m, top_k, -1).sum(dim=1))
    return out


def _gmm(a: torch.Tensor, w: torch.Tensor, offs: torch.Tensor | None) -> torch.Tensor:
    """a [rows, K] or [E, T, K] times w [E, out, K]^T per group (K padded to ALIGN on both sides)."""
    return torch._grouped_mm(_pad_last(a), _pad_last(w).transpose(1, 2), offs=offs)


def _act(h: torch.Tensor, activation: str) -> torch.Tensor:
    return activation_fn(activation)(h)


def grouped_mm_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu_and_mul",
    expert_map: torch.Tensor | None = None,
    apply_router_weight_on_input: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Standard format: x [M, K], w13 [E, 2N (N), K], w2 [E, K, N], topk_* [M, k]. Returns out [M, K]."""
    m = x.shape[0]
    top_k = topk_ids.shape[1]
    e = w13.shape[0]
    if e > MAX_GROUPS:
        raise ValueError(f"torch._grouped_mm takes fewer than 1024 groups, got {e} experts")
    out, slots = _route(x, topk_ids, expert_map, e, out)
    if slots is None:
        return out
    order, offs, local = slots
    h = _gmm(x[order // top_k], w13, offs).float()
    w_sorted = topk_weights.reshape(-1)[order].float()[:, None]
    if apply_router_weight_on_input:
        h = h * w_sorted
    a = _act(h, activation).to(x.dtype)
    y = _gmm(a, w2, offs).float()
    if not apply_router_weight_on_input:
        y = y * w_sorted
    return _unsort_and_reduce(y, local, order, m, top_k, out)


def grouped_mm_batched_experts(
    x: torch.Tensor,
    expert_num_tokens: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    *,
    activation: str = "silu_and_mul",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Batched format: x [E, T, K] (every row is computed; rows past the counts are not part of the contract)."""
    e, t = x.shape[:2]
    if e > MAX_GROUPS:
        raise ValueError(f"torch._grouped_mm takes fewer than 1024 groups, got {e} experts")
    if out is None:
        out = torch.empty_like(x)
    if e == 0 or t == 0:
        return out
    a = _act(_gmm(x, w13, None).float(), activation).to(x.dtype)
    out.copy_(_gmm(a, w2, None))
    return out


# ------------------------------------------------------------------------------------- fp8 rowwise: _scaled_grouped_mm

#: the quant formats of fp8_w8a8 the rowwise grouped kernel can express (per-tensor scales broadcast to rows/columns)
SCALED_FORMATS = ("T", "A")
#: torch._scaled_grouped_mm: K and N of every matrix a multiple of 16 (elements; 16 bytes of fp8)
SCALED_ALIGN = 16


def scaled_available() -> bool:
    return hasattr(torch, "_scaled_grouped_mm")


def _check_scaled(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, quant_format: str) -> int:
    """Validate the fp8 operands; returns N (w2's K-side width)."""
    if quant_format not in SCALED_FORMATS:
        raise ValueError(f"quant_format must be one of {SCALED_FORMATS}, got {quant_format!r}")
    if x.dtype != torch.bfloat16:
        raise ValueError(f"x must be bfloat16 (the kernel's only output dtype), got {x.dtype}")
    if w13.dtype != torch.float8_e4m3fn or w2.dtype != torch.float8_e4m3fn:
        raise ValueError(f"w13 and w2 must be float8_e4m3fn codes, got {w13.dtype} and {w2.dtype}")
    k_dim, n = x.shape[-1], w2.shape[2]
    if k_dim % SCALED_ALIGN or n % SCALED_ALIGN:
        raise ValueError(f"torch._scaled_grouped_mm needs K and N multiples of {SCALED_ALIGN}, got K={k_dim}, N={n}")
    if w13.shape[0] > MAX_GROUPS:
        raise ValueError(f"torch._scaled_grouped_mm takes fewer than 1024 groups, got {w13.shape[0]} experts")
    return n


def _weight_scale(scale: torch.Tensor, e: int, rows: int, quant_format: str) -> torch.Tensor:
    """scale_b [E, rows] fp32 with unit last stride: per-channel [E, rows, 1] as is, per-expert [E] broadcast."""
    if quant_format == "A":
        return scale.reshape(e, rows).float().contiguous()
    return scale.reshape(e, 1).float().expand(e, rows).contiguous()


def _row_scale(scale: torch.Tensor, rows: int, quant_format: str) -> torch.Tensor:
    """1-D fp32 scale per row of codes quantized by `quantize_activation` ([rows, 1] per token, [1] per tensor)."""
    if quant_format == "A":
        return scale.reshape(rows).float()
    return scale.reshape(1).float().expand(rows)


def _sgmm(a: torch.Tensor, w: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
          offs: torch.Tensor | None) -> torch.Tensor:
    """bf16(fp32 acc * scale_a[row] * scale_b[col]) of fp8 codes a [rows, K] (or [E, T, K]) times w [E, out, K]^T."""
    return torch._scaled_grouped_mm(a, w.transpose(1, 2), scale_a.contiguous(), scale_b, offs=offs,
                                    out_dtype=torch.bfloat16, use_fast_accum=False)


def _quantize(rows: torch.Tensor, quant_format: str) -> tuple[torch.Tensor, torch.Tensor]:
    from kernels.quant_gemm import quantize_activation

    return quantize_activation(rows, "fp8_w8a8", quant_format)


def scaled_grouped_mm_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    w13_scale: torch.Tensor,
    w2_scale: torch.Tensor,
    quant_format: str,
    activation: str = "silu_and_mul",
    expert_map: torch.Tensor | None = None,
    apply_router_weight_on_input: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp8_w8a8 experts, standard format, both GEMMs on torch._scaled_grouped_mm (sm90). x [M, K] bf16; w13
    [E, 2N (N), K] and w2 [E, K, N] float8_e4m3fn codes; scales T: [E], A: [E, rows, 1]. Returns out [M, K]."""
    _check_scaled(x, w13, w2, quant_format)
    m, k_dim = x.shape
    top_k = topk_ids.shape[1]
    e = w13.shape[0]
    out, slots = _route(x, topk_ids, expert_map, e, out)
    if slots is None:
        return out
    order, offs, local = slots
    # x quantized once over all M tokens (a per-tensor scale covers every token), then gathered into slot order
    codes, xs = _quantize(x, quant_format)
    src = order // top_k
    a1 = codes.view(torch.uint8)[src].view(torch.float8_e4m3fn)
    s1 = _row_scale(xs, m, quant_format)[src]
    w_sorted = topk_weights.reshape(-1)[order].float()
    if apply_router_weight_on_input:
        s1 = s1 * w_sorted  # (w x).W = (acc * s_x * w) * s_w: the weight folds into the row scale
    h = _sgmm(a1, w13, s1, _weight_scale(w13_scale, e, w13.shape[1], quant_format), offs)
    a = _act(h.float(), activation).to(torch.bfloat16)
    # rows past offs[-1] were never written: zero them before a per-tensor scale reads them
    a = torch.where(local, a, torch.zeros((), dtype=a.dtype, device=a.device))
    a_codes, a_s = _quantize(a, quant_format)
    y = _sgmm(a_codes, w2, _row_scale(a_s, m * top_k, quant_format), _weight_scale(w2_scale, e, k_dim, quant_format),
              offs).float()
    if not apply_router_weight_on_input:
        y = y * w_sorted[:, None]
    return _unsort_and_reduce(y, local, order, m, top_k, out)


def scaled_grouped_mm_batched_experts(
    x: torch.Tensor,
    expert_num_tokens: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    *,
    w13_scale: torch.Tensor,
    w2_scale: torch.Tensor,
    quant_format: str,
    activation: str = "silu_and_mul",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp8_w8a8 experts, batched format: x [E, T, K] bf16 with expert_num_tokens [E]; weights and scales as
    `scaled_grouped_mm_experts`. Every row is computed (rows past the counts are not part of the contract); a
    per-tensor scale (x's and the intermediate's) covers the rows below the counts only."""
    n = _check_scaled(x, w13, w2, quant_format)
    e, t, k_dim = x.shape
    if out is None:
        out = torch.empty_like(x)
    if e == 0 or t == 0:
        return out
    per_tensor = quant_format == "T"
    valid = (torch.arange(t, device=x.device)[None, :] < expert_num_tokens.to(x.device)[:, None])[..., None]
    rows = x
    if per_tensor:  # rows past a count are no input: keep them out of the tensor's amax
        rows = torch.where(valid, x, torch.zeros((), dtype=x.dtype, device=x.device))
    codes, xs = _quantize(rows.reshape(e * t, k_dim), quant_format)
    s1 = _row_scale(xs, e * t, quant_format).reshape(e, t)
    h = _sgmm(codes.view(e, t, k_dim), w13, s1, _weight_scale(w13_scale, e, w13.shape[1], quant_format), None)
    a = _act(h.float(), activation).to(torch.bfloat16)
    if per_tensor:
        a = torch.where(valid, a, torch.zeros((), dtype=a.dtype, device=a.device))
    a_codes, a_s = _quantize(a.reshape(e * t, n), quant_format)
    s2 = _row_scale(a_s, e * t, quant_format).reshape(e, t)
    out.copy_(_sgmm(a_codes.view(e, t, n), w2, s2, _weight_scale(w2_scale, e, k_dim, quant_format), None))
    return out
