"""Experts over torch's own grouped GEMM, `torch._grouped_mm` (CUTLASS, bf16, sm90/sm100).

What torch requires (aten/src/ATen/native/GroupedMMUtils.h and cuda/GroupedBlas.cpp, GroupMM.cu):
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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.naive_batched import ACTIVATIONS

__all__ = ["ALIGN", "available", "grouped_mm_batched_experts", "grouped_mm_experts"]

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


def _gmm(a: torch.Tensor, w: torch.Tensor, offs: torch.Tensor | None) -> torch.Tensor:
    """a [rows, K] or [E, T, K] times w [E, out, K]^T per group (K padded to ALIGN on both sides)."""
    return torch._grouped_mm(_pad_last(a), _pad_last(w).transpose(1, 2), offs=offs)


def _act(h: torch.Tensor, activation: str) -> torch.Tensor:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    return ACTIVATIONS[activation](h)


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
    m, k_dim = x.shape
    top_k = topk_ids.shape[1]
    e = w13.shape[0]
    if e > MAX_GROUPS:
        raise ValueError(f"torch._grouped_mm takes fewer than 1024 groups, got {e} experts")
    if out is None:
        out = torch.empty_like(x)
    numel = m * top_k
    if numel == 0:
        return out
    if e == 0:
        return out.zero_()
    ids = topk_ids.reshape(-1).long()
    if expert_map is not None:
        ids = expert_map.long()[ids]
    key = torch.where(ids >= 0, ids, e)  # non-local slots sort after every group
    order = torch.argsort(key, stable=True)
    offs = group_ends(key, e)
    h = _gmm(x[order // top_k], w13, offs).float()
    w_sorted = topk_weights.reshape(-1)[order].float()[:, None]
    if apply_router_weight_on_input:
        h = h * w_sorted
    a = _act(h, activation).to(x.dtype)
    y = _gmm(a, w2, offs).float()
    if not apply_router_weight_on_input:
        y = y * w_sorted
    y = torch.where((key[order] < e)[:, None], y, 0.0)  # rows past offs[-1] were never written
    slots = torch.empty(numel, k_dim, dtype=torch.float32, device=x.device)
    slots[order] = y
    out.copy_(slots.view(m, top_k, k_dim).sum(dim=1))
    return out


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
