"""Triton routing kernels: plain top-k (softmax / sigmoid / Llama-4 top-1) and grouped top-k (DeepSeek V2/V3).

One kernel serves both. A program owns BLOCK_M tokens and holds each token's whole row of E logits in registers,
viewed as [groups, experts per group] (plain top-k is the one-group case), so every step is a register reduction:
  1. scores: softmax over all E (exp(x - max) / sum), or sigmoid 1 / (1 + exp(-x)), in fp32 with IEEE division
     and libdevice exp (Triton's default fp32 `/` and `tl.exp` are approximate on the GPU);
  2. selection = scores + correction bias (the bias only selects; weights are the unbiased scores);
  3. grouped: group score = max of the group (no bias) or the sum of its two largest biased scores; keep
     `topk_group` groups, every other expert is out of the running (not merely set to 0);
  4. k rounds of argmax, ties to the lower index (groups too); weights renormalized (a zero sum stays zero), then
     multiplied by the routed scaling factor.

Non-finite logits (the padding rows of CUDA graphs) follow the rule `nonfinite = "zero"`: every non-finite score
becomes 0 before selection and in the weights. A softmax row holding a NaN or +Inf (or all -Inf) is therefore all
zeros: ids 0..k-1 (with a bias, the bias picks), weights 0. Sigmoid zeroes only the NaN experts. Llama-4 selects on
the raw logits with NaN ranked as -Inf, and a non-finite weight becomes 0. Every row, whatever its logits, gets k
distinct ids in [0, E).

Rows are independent and the block shape depends on E only (never on M), so results are bitwise batch invariant;
there are no atomics, so they are deterministic. Offsets are int64 (M * E can exceed 2^31).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from kernels._launch import interpreting

SCORINGS = ("softmax", "sigmoid", "llama4_top1")
LOGITS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_E = 1024  # a whole row stays in registers
MAX_K = 32


# The k (and group) rounds are runtime loops and M is not specialized: unrolling 32 rounds over a 1024-wide row took
# 15-80 s per compile on an H100 machine, and every k drawn was a new compile. E and PER_GROUP stay specialized
# (divisible by 16: the masked row loads vectorize).
@triton.jit(do_not_specialize=["M", "K", "TOPK_GROUP"])
def _route_kernel(
    logits_ptr, bias_ptr, w_ptr, ids_ptr,
    M, E, PER_GROUP,
    stride_lm, stride_le, stride_wm, stride_wk, stride_im, stride_ik,
    scale, K, TOPK_GROUP,
    SCORING: tl.constexpr, HAS_BIAS: tl.constexpr,  # SCORINGS index
    GROUPED: tl.constexpr, RENORM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
):
    NEG_INF: tl.constexpr = float("-inf")
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    g = tl.arange(0, BLOCK_G)
    p = tl.arange(0, BLOCK_P)
    g3 = g[None, :, None]
    p3 = p[None, None, :]
    # Expert id of each slot [1, BG, BP], increasing in (g, p) over the real slots, so the lowest id breaks ties.
    eid = g3 * PER_GROUP + p3
    col_ok = (eid < E) & (p3 < PER_GROUP)
    row_ok = rows < M
    ok = row_ok[:, None, None] & col_ok
    x = tl.load(logits_ptr + rows[:, None, None] * stride_lm + eid.to(tl.int64) * stride_le, mask=ok, other=0.0)
    x = x.to(tl.float32)

    if SCORING == 0:  # softmax over all E
        xm = tl.where(col_ok, x, NEG_INF)
        mx = tl.max(tl.max(xm, axis=2), axis=1)
        nbad = tl.sum(tl.sum(tl.where(col_ok & ((x != x) | (x == float("inf"))), 1, 0), axis=2), axis=1)
        # NaN, +Inf or an all -Inf row make the whole softmax row NaN: all its scores become 0.
        row_bad = (nbad > 0) | (mx == NEG_INF)
        ex = tl.where(col_ok, libdevice.exp(xm - mx[:, None, None]), 0.0)
        den = tl.sum(tl.sum(ex, axis=2), axis=1)
        s = tl.where(row_bad[:, None, None], 0.0, tl.div_rn(ex, den[:, None, None]))
        sel = s
    else:  # sigmoid; also the Llama-4 weight
        s = tl.div_rn(tl.full(x.shape, 1.0, tl.float32), 1.0 + libdevice.exp(-x))
        s = tl.where(s == s, s, 0.0)  # only a NaN logit gives a non-finite sigmoid
        if SCORING == 2:  # Llama-4: select on the logits, NaN ranked as -Inf
            sel = tl.where(x == x, x, NEG_INF)
        else:
            sel = s
    if HAS_BIAS:
        sel = sel + tl.load(bias_ptr + eid, mask=col_ok, other=0.0)

    avail = ok
    if GROUPED:
        v = tl.where(col_ok, sel, NEG_INF)
        m1 = tl.max(v, axis=2)
        if HAS_BIAS:  # sum of the two largest biased scores of the group
            first = tl.min(tl.where(v == m1[:, :, None], p3, BLOCK_P), axis=2)
            m2 = tl.max(tl.where(p3 == first[:, :, None], NEG_INF, v), axis=2)
            gscore = m1 + m2
        else:
            gscore = m1
        g_ok = (g[None, :] * PER_GROUP) < E
        kept = tl.zeros([BLOCK_M, BLOCK_G], dtype=tl.int32)
        for _ in range(TOPK_GROUP):
            free_g = g_ok & (kept == 0)
            cand_g = tl.where(free_g, gscore, NEG_INF)
            best_g = tl.max(cand_g, axis=1)
            pick = tl.min(tl.where(free_g & (cand_g == best_g[:, None]), g[None, :], BLOCK_G), axis=1)
            kept = tl.where(g[None, :] == pick[:, None], 1, kept)
        avail = avail & (kept[:, :, None] != 0)

    kcol = tl.arange(0, BLOCK_K)[None, :]
    out_w = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    out_i = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.int32)
    for i in range(K):
        # -Inf is a legal selection value (Llama-4 logits), so availability is a mask, never a sentinel score.
        cand = tl.where(avail, sel, NEG_INF)
        best = tl.max(tl.max(cand, axis=2), axis=1)
        hit = avail & (cand == best[:, None, None])
        idx = tl.min(tl.min(tl.where(hit, eid, E), axis=2), axis=1)
        chosen = col_ok & (eid == idx[:, None, None])  # padding slots alias real ids when PER_GROUP < BLOCK_P
        avail = avail & ~chosen
        w = tl.sum(tl.sum(tl.where(chosen, s, 0.0), axis=2), axis=1)
        out_w = tl.where(kcol == i, w[:, None], out_w)
        out_i = tl.where(kcol == i, idx[:, None], out_i)

    if RENORM:
        tot = tl.sum(out_w, axis=1)[:, None]  # columns >= K hold 0
        out_w = tl.where(tot > 0, tl.div_rn(out_w, tl.where(tot > 0, tot, 1.0)), out_w)
    out_w = out_w * scale
    omask = row_ok[:, None] & (kcol < K)
    tl.store(w_ptr + rows[:, None] * stride_wm + kcol * stride_wk, out_w, mask=omask)
    tl.store(ids_ptr + rows[:, None] * stride_im + kcol * stride_ik, out_i, mask=omask)


def block_rows(row_slots: int) -> int:
    """Tokens per program, from the padded row size only (never from M: that keeps results batch invariant).

    On a GPU about 2048 fp32 slots per program (16 per thread at 4 warps): DeepSeek-V3 (E=256) gets 8 rows, i.e.
    512 programs for 4096 tokens, enough to fill an H100/H200. The interpreter runs programs one after another with
    each op vectorized in numpy, so there it takes up to 64 rows at a time.
    """
    budget, cap = (16384, 64) if interpreting() else (2048, 32)
    return max(1, min(cap, budget // row_slots))


def _check(router_logits: torch.Tensor, k: int, correction_bias: torch.Tensor | None) -> tuple[int, int]:
    if router_logits.ndim != 2 or router_logits.dtype not in LOGITS_DTYPES:
        raise ValueError(f"router_logits must be 2-D fp32/bf16/fp16, got {router_logits.dtype} "
                         f"{list(router_logits.shape)}")
    m, e = router_logits.shape
    if not 1 <= e <= MAX_E:
        raise ValueError(f"number of experts E={e} outside the kernel's range 1..{MAX_E}")
    if not 1 <= k <= min(e, MAX_K):
        raise ValueError(f"k={k} outside 1..min(E={e}, {MAX_K})")
    if correction_bias is not None and (correction_bias.shape != (e,) or correction_bias.dtype != torch.float32
                                        or not correction_bias.is_contiguous()):
        raise ValueError(f"correction_bias must be contiguous fp32 [E={e}], got {correction_bias.dtype} "
                         f"{list(correction_bias.shape)}")
    return m, e


def _outputs(m: int, k: int, device: torch.device, out_weights: torch.Tensor | None,
             out_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.empty((m, k), dtype=torch.float32, device=device) if out_weights is None else out_weights
    ids = torch.empty((m, k), dtype=torch.int32, device=device) if out_ids is None else out_ids
    if w.shape != (m, k) or w.dtype != torch.float32 or ids.shape != (m, k) or ids.dtype != torch.int32:
        raise ValueError(f"outputs must be fp32 and int32 [M={m}, k={k}], got {w.dtype} {list(w.shape)} and "
                         f"{ids.dtype} {list(ids.shape)}")
    return w, ids


def _launch(logits: torch.Tensor, k: int, *, groups: int, topk_group: int, scoring: str, renormalize: bool,
            bias: torch.Tensor | None, scale: float, out_weights: torch.Tensor | None,
            out_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    m, e = logits.shape
    w, ids = _outputs(m, k, logits.device, out_weights, out_ids)
    if m == 0:
        return w, ids
    per_group = e // groups
    block_g, block_p = triton.next_power_of_2(groups), triton.next_power_of_2(per_group)
    block_m = block_rows(block_g * block_p)
    _route_kernel[(triton.cdiv(m, block_m),)](
        logits, logits if bias is None else bias, w, ids,
        m, e, per_group,
        logits.stride(0), logits.stride(1), w.stride(0), w.stride(1), ids.stride(0), ids.stride(1),
        float(scale), k, topk_group,
        SCORING=SCORINGS.index(scoring), HAS_BIAS=bias is not None,
        GROUPED=topk_group < groups, RENORM=renormalize,  # keeping every group masks nothing
        BLOCK_M=block_m, BLOCK_G=block_g, BLOCK_P=block_p, BLOCK_K=triton.next_power_of_2(k),
        num_warps=4,
    )
    return w, ids


def topk_route(router_logits: torch.Tensor, k: int, *, scoring: str = "softmax", renormalize: bool = False,
               correction_bias: torch.Tensor | None = None, out_weights: torch.Tensor | None = None,
               out_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain top-k routing of `router_logits [M, E]` (fp32/bf16/fp16, any strides), E <= 1024, k <= 32.

    scoring: "softmax" (over all E), "sigmoid", or "llama4_top1" (select on the logits, weight = sigmoid(logit);
    takes neither renormalize nor a bias). correction_bias: fp32 [E], selection only. Returns (topk_weights [M, k]
    fp32, topk_ids [M, k] int32), written into `out_weights` / `out_ids` when given; each row in descending order
    of selection score, ties toward the lower expert index.
    """
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
    if scoring == "llama4_top1" and (renormalize or correction_bias is not None):
        raise ValueError("scoring='llama4_top1' takes neither renormalize nor a correction bias")
    _check(router_logits, k, correction_bias)
    return _launch(router_logits, k, groups=1, topk_group=1, scoring=scoring, renormalize=renormalize,
                   bias=correction_bias, scale=1.0, out_weights=out_weights, out_ids=out_ids)


def grouped_topk_route(router_logits: torch.Tensor, k: int, *, num_groups: int, topk_group: int, scoring: str,
                       correction_bias: torch.Tensor | None = None, renormalize: bool = True,
                       routed_scaling_factor: float = 1.0, out_weights: torch.Tensor | None = None,
                       out_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped top-k routing (DeepSeek-V2: softmax; DeepSeek-V3: sigmoid + correction bias) of `router_logits`.

    num_groups divides E (E <= 1024); 1 <= topk_group <= num_groups; k <= min(topk_group * E / num_groups, 32);
    with a bias, at least 2 experts per group. The weights are renormalized (if asked) and then multiplied by
    `routed_scaling_factor` (pass 1.0 when the reduce applies it). Returns (topk_weights fp32, topk_ids int32)
    as `topk_route` does.
    """
    if scoring not in ("softmax", "sigmoid"):
        raise ValueError(f"scoring must be 'softmax' or 'sigmoid' for grouped routing, got {scoring!r}")
    e = _check(router_logits, k, correction_bias)[1]
    if num_groups < 1 or e % num_groups:
        raise ValueError(f"num_groups={num_groups} must divide E={e}")
    if not 1 <= topk_group <= num_groups:
        raise ValueError(f"topk_group={topk_group} outside 1..num_groups={num_groups}")
    if k > topk_group * (e // num_groups):
        raise ValueError(f"k={k} > topk_group * experts per group = {topk_group * (e // num_groups)}")
    if correction_bias is not None and e // num_groups < 2:
        raise ValueError("the correction-bias path needs at least 2 experts per group (group score = top-2 sum)")
    if not (routed_scaling_factor > 0 and routed_scaling_factor < float("inf")):
        raise ValueError(f"routed_scaling_factor must be finite and > 0, got {routed_scaling_factor}")
    return _launch(router_logits, k, groups=num_groups, topk_group=topk_group, scoring=scoring,
                   renormalize=renormalize, bias=correction_bias, scale=routed_scaling_factor,
                   out_weights=out_weights, out_ids=out_ids)
