"""Triton fused MoE experts, unquantized: standard (sorted-token) format.

    out[t] = sum_j w[t, j] * (W2[e] . act(W13[e] . x[t] + b13[e]) + b2[e]),   e = local(topk_ids[t, j])

Launches, no host synchronization:
1. `kernels.align.moe_align_block_size` (the align stage kernel, two or three launches): the sorted-token layout
   (docs/SEMANTICS.md §3): each local expert's slots in ascending flattened index, sentinel padding up to a multiple
   of BLOCK_M, and each block's local expert id. Slots of non-local experts get no block at all (the EXCLUDE
   convention); the reduce skips them. Decode batches of at most PER_SLOT_MAX slots skip it: each slot is
   its own block (PER_SLOT), its expert read by the GEMM from topk_ids.
2. `_moe_gemm_kernel` as GEMM1: gathers rows x[id // k], multiplies by W13[e]^T with the gate and up tiles of
   the same activation columns in two fp32 accumulators (or, with `Config.joint_gate_up`, in one dot over their
   interleaved rows, split in the epilogue), applies the router weight (apply-on-input: on the fp32
   accumulator before the bias, which equals weighting x in exact arithmetic), adds b13, applies the activation in
   fp32 and stores `a` rounded once to x.dtype, one row per (token, slot).
3. `_moe_gemm_kernel` as GEMM2: a . W2[e]^T in fp32, + b2, times the router weight on the fp32 accumulator
   (WeightPlacement.ACCUMULATOR), each weighted slot stored rounded to x.dtype in a buffer [M*k, K] (half the
   traffic of an fp32 buffer, which at M=4096 costs as much as a tenth of the weights' read).
4. `_reduce_kernel`: sums the k slots of each token in fp32, in slot order (deterministic), skipping non-local
   slots, and rounds once to the output dtype (Accumulation.ROUNDED_SLOTS); `reduce="moe_sum"` rounds every
   partial sum to x.dtype instead when 2 <= k <= 4, as vLLM's moe_sum (SEQUENTIAL_OUT_DTYPE). (A decode GEMM2 that
   summed each token's slots itself, saving this launch, measured slower on an H200: 74 against 65 us at
   DeepSeek-V3 M=1; a program looping over k experts' weights runs k short pipelines one after another.)

Large M: an expert's last block is often mostly empty (about 128 rows per expert with BLOCK_M 128); with
`Config.split_tail` a block whose valid rows fit in half of it runs a half-height tile (SPLIT_TAIL).

Numerics (what the oracle is told, see kernels/adapters/experts.py): tl.dot with fp32 accumulation (bf16/fp16
products are exact; fp32 inputs use input_precision="ieee" unless the caller asks for `fp32_precision="tf32"`);
GEMM1's output h is never rounded; the activation output is rounded to x.dtype
(IntermediateRounding.ACTIVATION_OUTPUT) with the activation computed in fp32 and rounded once (Rounding.ROUND_ONCE);
each weighted GEMM2 slot is rounded to x.dtype, and the reduce sums them in fp32 with one final rounding
(Accumulation.ROUNDED_SLOTS; `reduce="moe_sum"`: see 4). No atomics anywhere: bitwise deterministic for a fixed
tile config.

Offsets: row ids and expert offsets are int64 (M*k*K and E*2N*K can exceed 2**31); offsets inside one expert's
weight are int32 (the launcher checks 2N*K < 2**31).

Tile configs come from `choose_config` (a documented heuristic on the average rows per expert; no autotune, which
the interpreter cannot run); callers may pass their own `Config`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from kernels.align import moe_align_block_size

if TYPE_CHECKING:
    from kernels.quant_gemm import ExpertsQuant, QuantOperands

__all__ = ["ACTIVATIONS", "Config", "SortedTokens", "choose_config", "fused_experts", "sort_tokens"]

#: activation name (the oracle's) -> kernel code; codes 1-3 are gated (W13 holds gate and up)
ACTIVATIONS = {"silu_and_mul": 1, "gelu_and_mul": 2, "swigluoai": 3, "silu_no_mul": 4, "gelu_no_mul": 5}
GATED = (1, 2, 3)
#: swigluoai defaults (gpt-oss)
SWIGLUOAI_PARAMS = {"alpha": 1.702, "beta": 1.0, "limit": 7.0}
#: fused_experts(fp32_precision=...): tl.dot's input_precision for fp32 inputs
FP32_PRECISIONS = ("ieee", "tf32")
#: fused_experts(reduce=...): "fp32" (one rounding) or "moe_sum" (vLLM's: sequential in x.dtype for k in 2..4)
REDUCES = ("fp32", "moe_sum")
#: the top-k range (inclusive) where reduce="moe_sum" rounds every partial sum to x.dtype
MOE_SUM_SEQUENTIAL_K = (2, 4)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass(frozen=True)
class Config:
    """One GEMM's tiles. block_m must be the same for GEMM1 and GEMM2 (it is the sorted layout's block size)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    #: blocks whose valid rows fit in half the block run a block_m/2-row tile (see _moe_gemm_kernel)
    split_tail: bool = False
    #: gated GEMM1: the gate and up columns of a tile as one dot over 2*block_n interleaved weight rows (one
    #: accumulator, one MMA twice as wide), split in the epilogue; otherwise two block_n-wide dots
    joint_gate_up: bool = False


def _pow2(v: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, triton.next_power_of_2(max(v, 1))))


#: tiles per BLOCK_M, (block_n, block_k, num_warps, num_stages): the winners of an H200 sweep over the three
#: benchmark models at M = 1..4096 (scripts/tune_experts.py; results/sm90/bench/2026-11-21-1453327-tile-sweep/).
#: The gated GEMM1 holds two block_n-wide accumulators (gate and up), so its tiles are the narrow ones.
_GATED_TILES = {16: (32, 256, 4, 3), 32: (64, 128, 4, 4), 64: (64, 64, 4, 4), 128: (64, 64, 8, 3)}
_PLAIN_TILES = {16: (128, 128, 4, 3), 32: (128, 128, 4, 3), 64: (128, 64, 4, 4), 128: (128, 64, 8, 3)}
#: BLOCK_M 128, bf16/fp16, unquantized: (GEMM1, GEMM2) as (block_n, block_k, num_warps, num_stages), GEMM1 one joint
#: dot over 2 * 128 gate and up rows. vLLM's tile size at these M (128 x 256 x 64, 8 warps, 4 stages) where the
#: tables' 128-row tiles are 64 (gated) and 128 wide. H200, ours / vLLM's time, M = 1024 / 4096, this tile against
#: the table's: Mixtral 0.94 / 0.93 against 1.05 / 1.05, Qwen3 0.90 / 0.89 against 0.93 / 0.98, DeepSeek-V3 (M=4096)
#: 0.90 against 0.95 (results/sm90/bench/2026-11-29-9fae530-large-m-tile-probes/). fp32 and quantized operands keep
#: the tables (not measured with it; fp8 lost with 128-row tiles of every width in the same run).
_WIDE_16BIT = ((128, 64, 8, 4), (256, 64, 8, 4))
#: below this many programs a decode-size grid leaves SMs idle (132 on an H100/H200: two waves)
_MIN_PROGRAMS = 264


def choose_config(rows_per_expert: float, n: int, k: int, dtype: torch.dtype, *, gated: bool,
                  experts: int = 0, max_block_k: int = 0, fp8: str = "", fp8_fast: bool = False,
                  quantized: bool = False) -> Config:
    """Tiles for one GEMM whose output has `n` columns and whose reduction is `k` long; `experts`: the expert
    blocks the layout will hold (about min(E, M*k); 0 if unknown); `max_block_k`: a cap on BLOCK_K (a K-group
    scale that BLOCK_K must divide; 0: none); `fp8`: the scale format of fp8 operands (G128, A, T; "": not fp8);
    `fp8_fast`: fp8 dots with fast accumulation (fused_experts(fp8_fast_accum=True)); `quantized`: the weights are
    codes of any quantized scheme.

    Heuristic (from the H200 sweep in results/sm90/bench/2026-11-21-1453327-tile-sweep/):
    - interpreter: one program per expert block and few, large tiles (numpy cost is per program);
    - BLOCK_M by the average rows per expert: <= 8 -> 16, <= 24 -> 32, <= 48 -> 64, else 128. A block as tall
      as most experts' rows reads each expert's weights once; the second, mostly empty block of an expert just
      above the average costs a whole weight read (Mixtral at 16 rows per expert: 355 us with 32, 436 with 16);
    - BLOCK_N/BLOCK_K/warps/stages per BLOCK_M from the tables above (BLOCK_M 128 with unquantized 16-bit
      operands: `_WIDE_16BIT`, GEMM1 as a joint dot); decode-size GEMMs whose grid would leave
      SMs idle (e.g. Mixtral's GEMM2 at M=1: 2 experts x 32 column tiles) take 32-wide, 256-deep tiles instead;
    - split tail at BLOCK_M 128 only: its half-height (64-row) tail tile won at every point of an H200 sweep
      (DeepSeek-V3 M=4096: 2491 against 2744 us; Qwen3 M=1024: 379 against 391), while at BLOCK_M 64 and 32 it
      lost as often as it won (that folder's split.jsonl);
    - GROUP_M 1 for small blocks (few blocks per expert), 8 otherwise (L2 reuse of the weight tiles);
    - fp32 inputs halve BLOCK_K (twice the bytes per element).
    """
    if interpreting():  # split_tail: both tile heights run in every CI case
        return Config(32, _pow2(n, 16, 128), _pow2(k, 16, 128), group_m=1, num_warps=4, num_stages=1,
                      split_tail=True)
    bm = 16 if rows_per_expert <= 8 else 32 if rows_per_expert <= 24 else 64 if rows_per_expert <= 48 else 128
    bn, bk, warps, stages = (_GATED_TILES if gated else _PLAIN_TILES)[bm]
    if bm == 16 and experts and experts * triton.cdiv(n, bn) < _MIN_PROGRAMS:
        bn, bk = 32, 256
    if dtype == torch.float32:
        bk //= 2
    if fp8 and rows_per_expert > 24:
        # fp8 operands (H100 probes, scripts/probe_experts.py; results/sm90/bench/*tile-probes*/): 64-row blocks
        # with 128-deep K blocks (fp8 elements are half as wide). DeepSeek-V3 M=4096, 128x128 block scales: 3608
        # against 5966 us with the bf16 tables' 128-row tiles. A gated GEMM1 runs gate and up as one 128-wide
        # joint dot (H100, M=4096, each pair timed in one run) where that won at every shape probed:
        # - G128, both accumulations (fast / default): DeepSeek-V3 2116 / 3359 against 2313 / 3817 us with two
        #   128-wide accumulators and 8 warps, Qwen3 785 / 1329 against 911 / 1483, Mixtral 2354 / 4765 (4 stages)
        #   against 2800 / 5264;
        # - per-channel/per-tensor scales with fast accumulation: Mixtral A 1999 against 2182, DeepSeek-V3 A 2036
        #   against 2136, Qwen3 T 761 against 818;
        # - but not per-channel/per-tensor with the default accumulation, which keeps two 128-wide accumulators
        #   (Mixtral A 3280 against 3464 joint, DeepSeek-V3 A 2604 against 2802, Qwen3 T 1044 against 1110).
        if gated and (fp8 == "G128" or fp8_fast):
            return _fit_k(Config(64, 64, 128, group_m=8, num_warps=4, num_stages=3, joint_gate_up=True), k)
        return _fit_k(Config(64, 128, 128, group_m=8, num_warps=4, num_stages=3), k)
    wide = bm == 128 and dtype in (torch.bfloat16, torch.float16) and not quantized
    if wide:
        bn, bk, warps, stages = _WIDE_16BIT[0 if gated else 1]
    if max_block_k:
        bk = min(bk, max_block_k)
    return _fit_k(Config(bm, bn, bk, group_m=1 if bm <= 32 else 8, num_warps=warps, num_stages=stages,
                         split_tail=bm == 128, joint_gate_up=wide and gated), k)


#: reductions shorter than this (and than the tile's BLOCK_K) all take one small tile: BLOCK_K 32, one stage
SHORT_K = 128


def _fit_k(cfg: Config, k: int) -> Config:
    """A reduction shorter than the tile's BLOCK_K. Below SHORT_K: BLOCK_K 32 and one stage whatever K is, so that
    every short reduction of a feature cell is one compiled variant (K = 33, 48, 64, 65 and 100 were four BLOCK_Ks,
    each a compile of its own: a cold GPU suite compiled 425 GEMM variants for the Triton experts adapters' property
    tests). From SHORT_K up: BLOCK_K down to K's next power of two, and one stage where one block covers K. Both
    give the same results and compile in a fraction of the full tile's time (GEMM1 and GEMM2 of seven small
    quick-matrix shapes, sm90 target: 8.8 s, 4.9 fitted); model-size reductions (K >= 1024) keep their tile."""
    if k < min(SHORT_K, cfg.block_k):
        return replace(cfg, block_k=min(cfg.block_k, 32), num_stages=1)
    bk = min(cfg.block_k, max(32, triton.next_power_of_2(max(k, 1))))
    stages = 1 if k <= bk else cfg.num_stages
    if (bk, stages) == (cfg.block_k, cfg.num_stages):
        return cfg
    return replace(cfg, block_k=bk, num_stages=stages)


# ----------------------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------------------


@triton.jit
def _accumulate(acc, a, w, rows, grp, sa, ws_ptrs, stride_wsg, zp_ptrs, stride_zpg,
                W_CODES: tl.constexpr, HAS_ZP: tl.constexpr, INT_DOT: tl.constexpr, SCALE_IN_LOOP: tl.constexpr,
                IEEE: tl.constexpr, TF32: tl.constexpr, BLOCK_N: tl.constexpr, FP8_FAST: tl.constexpr):
    """acc + a . w for one K block of one weight tile (BLOCK_N weight rows): integer weights offset by their zero
    point, K-block scales (G128) applied per block, exact int32 dots for int8."""
    if W_CODES != 0:
        if HAS_ZP:
            z = tl.load(zp_ptrs + grp * stride_zpg).to(tl.int32)
            if W_CODES == 4:
                z = (z >> ((rows % 2) * 4)) & 0xF
        elif W_CODES == 8:  # implicit zero point: the middle of the code range
            z = tl.full([BLOCK_N], 128, tl.int32)
        else:
            z = tl.full([BLOCK_N], 8, tl.int32)
    if W_CODES == 4:
        # w: [BLOCK_K / 2, BLOCK_N] bytes, K element 2i in byte i's low nibble, 2i + 1 in its high nibble. Codes
        # become floats without int->float conversions (16 a clock per SM): a nibble ORed into the mantissa of a
        # float whose last place is 1 (128 in bf16, 1024 in fp16) is that float plus the nibble, and subtracting
        # (that float + z) leaves q - z exactly. The even and odd K elements of a meet the low and high nibbles in
        # two half-depth dots (no shuffle of the weights). Together 12-20% faster at decode on an H100 than a
        # join/permute unpack with conversions (results/sm90/bench/2026-11-24-2b5503c-experts-vs-vllm/).
        if a.dtype == tl.float16:
            magic = 1024.0
            bits = 0x6400
        else:
            magic = 128.0
            bits = 0x4300
        zf = (z.to(tl.float32) + magic).to(a.dtype)[None, :]
        w_lo = ((w & 0xF).to(tl.uint16) | bits).to(tl.uint16).to(a.dtype, bitcast=True) - zf
        w_hi = ((w >> 4).to(tl.uint16) | bits).to(tl.uint16).to(a.dtype, bitcast=True) - zf
        a_even, a_odd = tl.split(tl.reshape(a, (a.shape[0], a.shape[1] // 2, 2)))
        if SCALE_IN_LOOP:
            sw = tl.load(ws_ptrs + grp * stride_wsg)
            acc += tl.dot(a_odd, w_hi, tl.dot(a_even, w_lo)) * sw[None, :]
        else:
            acc = tl.dot(a_odd, w_hi, tl.dot(a_even, w_lo, acc))
    else:
        if W_CODES == 8:  # (the float-mantissa trick below gained nothing for 8-bit codes on an H100: 1097 vs 1098 us)
            w = (w.to(tl.int32) - z[None, :]).to(a.dtype)
        if SCALE_IN_LOOP:
            sw = tl.load(ws_ptrs + grp * stride_wsg)
            if INT_DOT:
                part = tl.dot(a, w, out_dtype=tl.int32).to(tl.float32)
            elif FP8_FAST:  # the tensor core's reduced-precision sum over the whole K block, promoted per block
                part = tl.dot(a, w)
            else:
                part = tl.dot(a, w, max_num_imprecise_acc=0)
            acc += part * (sa[:, None] * sw[None, :])
        elif INT_DOT:
            acc += tl.dot(a, w, out_dtype=tl.int32).to(tl.float32)
        elif IEEE:
            acc = tl.dot(a, w, acc, input_precision="ieee")
        elif TF32:  # fp32 operands read as TF32 by the tensor cores (fused_experts(fp32_precision="tf32"))
            acc = tl.dot(a, w, acc, input_precision="tf32")
        elif FP8_FAST:  # the K block's reduced-precision sum, added to the fp32 accumulator (promoted per block)
            acc += tl.dot(a, w)
        else:
            acc = tl.dot(a, w, acc, max_num_imprecise_acc=0)
    return acc


@triton.jit
def _expert_tile(
    a_ptr, w_ptr, bias_ptr, c_ptr, rw_ptr, sorted_ids_ptr,
    as_ptr, ws_ptr, zp_ptr,
    e, row_start, count, pid_n,
    num_valid, N, K, rows_per_expert, a_row_div,
    stride_ae, stride_am, stride_ak,
    stride_we, stride_wn, stride_wk,
    stride_be, stride_bn,
    stride_ce, stride_cm, stride_cn,
    stride_asm, stride_asg,
    stride_wse, stride_wsn, stride_wsg,
    stride_zpe, stride_zpn, stride_zpg,
    alpha, beta, limit,
    ACT: tl.constexpr, GATED: tl.constexpr, INTERLEAVED: tl.constexpr, HAS_BIAS: tl.constexpr,
    WEIGHT_MODE: tl.constexpr, BATCHED: tl.constexpr, IEEE: tl.constexpr, TF32: tl.constexpr,
    EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    A_SCALE: tl.constexpr, W_SCALE: tl.constexpr, SCALE_IN_LOOP: tl.constexpr,
    GROUP_K: tl.constexpr, WS_ROW_DIV: tl.constexpr, INT_DOT: tl.constexpr,
    W_CODES: tl.constexpr, HAS_ZP: tl.constexpr, PER_SLOT: tl.constexpr, FP8_FAST: tl.constexpr,
    JOINT: tl.constexpr,
):
    """One BLOCK_M x BLOCK_N output tile of expert e: rows from `row_start` (standard: an offset into
    sorted_ids; batched: the expert's first row, valid below `count`; PER_SLOT: the slot), columns of tile
    pid_n. BLOCK_M may be half the layout's block (a tail block whose valid rows fit in its first half).
    JOINT (gated): one accumulator over 2*BLOCK_N weight rows, gate and up of each column side by side."""
    offs_r = tl.arange(0, BLOCK_M)
    if BATCHED:
        r = row_start + offs_r
        row_ok = r < count
        a_rows = r.to(tl.int64)
        c_rows = r.to(tl.int64)
        w_rows = e.to(tl.int64) * rows_per_expert + r  # unused (no router weight in the batched format)
        s_rows = w_rows  # activation scales of the flattened [E * T] rows
    else:
        if PER_SLOT:
            ids = (row_start + offs_r * 0).to(tl.int64)
            row_ok = offs_r == 0
        else:
            ids = tl.load(sorted_ids_ptr + row_start + offs_r).to(tl.int64)
            row_ok = ids < num_valid
        a_rows = ids // a_row_div
        c_rows = ids
        w_rows = ids
        s_rows = a_rows
    e64 = e.to(tl.int64)

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_nw = offs_n % N  # wrapped columns: weight loads need no mask, the store masks them
    if JOINT:  # tile column 2j is column j's gate row, 2j + 1 its up row
        TILE_N: tl.constexpr = 2 * BLOCK_N
        offs_t = tl.arange(0, TILE_N)
        col = (pid_n * BLOCK_N + offs_t // 2) % N
        if INTERLEAVED:
            g_rows = 2 * col + offs_t % 2
        else:
            g_rows = col + (offs_t % 2) * N
        u_rows = g_rows
    else:
        TILE_N: tl.constexpr = BLOCK_N
        if GATED:
            if INTERLEAVED:
                g_rows = 2 * offs_nw
                u_rows = g_rows + 1
            else:
                g_rows = offs_nw
                u_rows = offs_nw + N
        else:
            g_rows = offs_nw
            u_rows = offs_nw
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + e64 * stride_ae + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    w_base = w_ptr + e64 * stride_we
    if W_CODES == 4:  # the block's packed bytes, loaded once each (contiguous: vectorized), unpacked per K block
        wk = tl.arange(0, BLOCK_K // 2)
        w_step = BLOCK_K // 2
    else:
        wk = offs_k
        w_step = BLOCK_K
    wg_ptrs = w_base + g_rows[None, :] * stride_wn + wk[:, None] * stride_wk
    wu_ptrs = w_base + u_rows[None, :] * stride_wn + wk[:, None] * stride_wk
    # defaults: every argument of _accumulate must exist in every specialization (unused ones are dead code)
    sa = tl.full([BLOCK_M], 1.0, tl.float32)
    wsg_ptrs = ws_ptr
    wsu_ptrs = ws_ptr
    zpg_ptrs = zp_ptr
    zpu_ptrs = zp_ptr
    if A_SCALE:
        as_ptrs = as_ptr + s_rows * stride_asm
    if W_SCALE:
        ws_base = ws_ptr + e64 * stride_wse
        wsg_ptrs = ws_base + (g_rows // WS_ROW_DIV) * stride_wsn
        wsu_ptrs = ws_base + (u_rows // WS_ROW_DIV) * stride_wsn
    if HAS_ZP:
        zp_base = zp_ptr + e64 * stride_zpe
        if W_CODES == 4:  # packed along rows: row r in byte r // 2, nibble r % 2
            zpg_ptrs = zp_base + (g_rows // 2) * stride_zpn
            zpu_ptrs = zp_base + (u_rows // 2) * stride_zpn
        else:
            zpg_ptrs = zp_base + g_rows * stride_zpn
            zpu_ptrs = zp_base + u_rows * stride_zpn
    acc_g = tl.zeros([BLOCK_M, TILE_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, TILE_N], dtype=tl.float32)
    for kk in range(0, (K + BLOCK_K - 1) // BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            wg = tl.load(wg_ptrs)
        else:
            k_ok = offs_k < K - kk * BLOCK_K
            if W_CODES == 4:
                w_ok = 2 * wk < K - kk * BLOCK_K
            else:
                w_ok = k_ok
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            wg = tl.load(wg_ptrs, mask=w_ok[:, None], other=0.0)
        grp = (kk * BLOCK_K) // GROUP_K
        if SCALE_IN_LOOP and A_SCALE:
            sa = tl.load(as_ptrs + grp * stride_asg, mask=row_ok, other=0.0)
        acc_g = _accumulate(acc_g, a, wg, g_rows, grp, sa, wsg_ptrs, stride_wsg, zpg_ptrs, stride_zpg,
                            W_CODES, HAS_ZP, INT_DOT, SCALE_IN_LOOP, IEEE, TF32, TILE_N, FP8_FAST)
        if GATED and not JOINT:
            if EVEN_K:
                wu = tl.load(wu_ptrs)
            else:
                wu = tl.load(wu_ptrs, mask=w_ok[:, None], other=0.0)
            acc_u = _accumulate(acc_u, a, wu, u_rows, grp, sa, wsu_ptrs, stride_wsg, zpu_ptrs, stride_zpg,
                                W_CODES, HAS_ZP, INT_DOT, SCALE_IN_LOOP, IEEE, TF32, TILE_N, FP8_FAST)
        a_ptrs += BLOCK_K * stride_ak
        wg_ptrs += w_step * stride_wk
        wu_ptrs += w_step * stride_wk

    if W_SCALE and not SCALE_IN_LOOP:  # scales constant along K: once, on the finished accumulator
        if A_SCALE:
            sa = tl.load(as_ptrs, mask=row_ok, other=0.0)
        else:
            sa = tl.full([BLOCK_M], 1.0, tl.float32)
        acc_g = acc_g * (sa[:, None] * tl.load(wsg_ptrs)[None, :])
        if GATED and not JOINT:
            acc_u = acc_u * (sa[:, None] * tl.load(wsu_ptrs)[None, :])
    if WEIGHT_MODE == 1:
        rw = tl.load(rw_ptr + w_rows, mask=row_ok, other=0.0).to(tl.float32)
        acc_g = acc_g * rw[:, None]
        acc_u = acc_u * rw[:, None]
    if HAS_BIAS:
        b_base = bias_ptr + e64 * stride_be
        acc_g += tl.load(b_base + g_rows * stride_bn).to(tl.float32)[None, :]
        if GATED and not JOINT:
            acc_u += tl.load(b_base + u_rows * stride_bn).to(tl.float32)[None, :]
    if JOINT:
        acc_g, acc_u = tl.split(tl.reshape(acc_g, (BLOCK_M, BLOCK_N, 2)))
    # Activations in fp32, inlined (nested jit calls cost a lot in the interpreter). silu(g) = g / (1 + exp(-g)),
    # gelu(g) = g/2 (1 + erf(g / sqrt 2)).
    if ACT == 1:
        out = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    elif ACT == 2:
        out = 0.5 * acc_g * (1.0 + tl.erf(acc_g * 0.7071067811865476)) * acc_u
    elif ACT == 3:
        g = tl.minimum(acc_g, limit)
        u = tl.minimum(tl.maximum(acc_u, -limit), limit)
        out = g / (1.0 + tl.exp(-alpha * g)) * (u + beta)
    elif ACT == 4:
        out = acc_g / (1.0 + tl.exp(-acc_g))
    elif ACT == 5:
        out = 0.5 * acc_g * (1.0 + tl.erf(acc_g * 0.7071067811865476))
    else:
        out = acc_g
    if WEIGHT_MODE == 2:
        rw = tl.load(rw_ptr + w_rows, mask=row_ok, other=0.0).to(tl.float32)
        out = out * rw[:, None]
    c_ptrs = c_ptr + e64 * stride_ce + c_rows[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, out.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])




# Sizes that vary from call to call are not specialized on (divisibility by 16, == 1): one compile serves every M
# and every routing. Strides, N and K still are (aligned rows vectorize their loads).
@triton.jit(do_not_specialize=["num_valid", "rows_per_expert", "a_row_div", "num_pid_m", "num_pid_n"])
def _moe_gemm_kernel(
    a_ptr, w_ptr, bias_ptr, c_ptr, rw_ptr,
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr, counts_ptr,
    as_ptr, ws_ptr, zp_ptr,
    num_valid, N, K, rows_per_expert, a_row_div,
    stride_ae, stride_am, stride_ak,
    stride_we, stride_wn, stride_wk,
    stride_be, stride_bn,
    stride_ce, stride_cm, stride_cn,
    stride_asm, stride_asg,
    stride_wse, stride_wsn, stride_wsg,
    stride_zpe, stride_zpn, stride_zpg,
    alpha, beta, limit,
    num_pid_m, num_pid_n,
    ACT: tl.constexpr, GATED: tl.constexpr, INTERLEAVED: tl.constexpr, HAS_BIAS: tl.constexpr,
    WEIGHT_MODE: tl.constexpr, BATCHED: tl.constexpr, IEEE: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    TF32: tl.constexpr = False,
    A_SCALE: tl.constexpr = False, W_SCALE: tl.constexpr = False, SCALE_IN_LOOP: tl.constexpr = False,
    GROUP_K: tl.constexpr = 128, WS_ROW_DIV: tl.constexpr = 1, INT_DOT: tl.constexpr = False,
    W_CODES: tl.constexpr = 0, HAS_ZP: tl.constexpr = False, PER_SLOT: tl.constexpr = False,
    SLOT_MAP: tl.constexpr = False, SPLIT_TAIL: tl.constexpr = False, FP8_FAST: tl.constexpr = False,
    JOINT: tl.constexpr = False,
):
    """C[row, n] = epilogue(A[row] . W[e, n]^T) for the rows of one expert block.

    Standard format: the block's rows are sorted_ids[pid_m*BLOCK_M:], A row = id // a_row_div, C row = id.
    PER_SLOT (decode): block pid_m is the single slot pid_m (sorted_ids_ptr: the flat topk_ids; expert_ids_ptr:
    the expert map when SLOT_MAP), so no layout has to be built.
    Batched format: block pid_m is rows [r0, r0+BLOCK_M) of expert pid_m // blocks_per_expert, valid below
    counts[e]; A and C rows are (e, r). WEIGHT_MODE: 0 none, 1 router weight before the bias (apply on input),
    2 after the bias (on the GEMM2 accumulator). ACT 0: none; gated ACT reads gate and up weight rows.

    Quantized operands (kernels/quant_gemm.py builds the arguments): A_SCALE: A holds codes with one fp32 scale
    per (A row, K group) at as_ptr + row*stride_asm + group*stride_asg (strides 0 for one scale); W_SCALE: one
    per (expert, weight row // WS_ROW_DIV, K group). SCALE_IN_LOOP: scales vary along K (groups of GROUP_K, a
    multiple of BLOCK_K), so each K block's dot is scaled before it joins the accumulator; otherwise the scales
    multiply the finished accumulator. INT_DOT: int8 operands, int32 dot per K block. W_CODES: 0 weights in
    the dot's dtype; 8: uint8 codes with zero point (implicit 128); 4: two uint4 codes a byte along K (low
    nibble first), zero point implicit 8 or explicit (uint4 packed along rows). (q - zp) is an integer of at
    most 9 bits, exact in bf16/fp16, so the dot multiplies exactly and the scale goes onto its fp32 result.

    SPLIT_TAIL: a block whose valid rows fit in its first half (an expert's last, mostly empty block) runs a
    BLOCK_M/2-row tile: half the MMA work, the same weight reads.

    JOINT (gated only): gate and up in one dot over 2*BLOCK_N interleaved weight rows (Config.joint_gate_up).
    """
    pid = tl.program_id(0)
    in_group = GROUP_M * num_pid_n
    first_m = (pid // in_group) * GROUP_M
    size_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % size_m
    pid_n = (pid % in_group) // size_m

    count = 0
    if BATCHED:
        blocks_per_e = (rows_per_expert + BLOCK_M - 1) // BLOCK_M  # not tl.cdiv: a nested jit call
        e = pid_m // blocks_per_e
        row_start = (pid_m % blocks_per_e) * BLOCK_M
        count = tl.load(counts_ptr + e)
        if row_start >= count:
            return
        tail = count - row_start <= BLOCK_M // 2
    elif PER_SLOT:  # block pid_m is routed slot pid_m alone: its expert straight from topk_ids (and the map)
        e = tl.load(sorted_ids_ptr + pid_m).to(tl.int32)
        if SLOT_MAP:
            e = tl.load(expert_ids_ptr + e).to(tl.int32)
        if e < 0:  # a non-local slot: no row here (the reduce skips it)
            return
        row_start = pid_m
        tail = False
    else:
        row_start = pid_m * BLOCK_M
        if row_start >= tl.load(num_post_ptr):
            return
        e = tl.load(expert_ids_ptr + pid_m)
        # valid rows are a prefix of the block: a sentinel at the middle row means they fit in the first half
        tail = tl.load(sorted_ids_ptr + row_start + BLOCK_M // 2) >= num_valid
    if SPLIT_TAIL:  # (never with PER_SLOT)
        if tail:
            _expert_tile(a_ptr, w_ptr, bias_ptr, c_ptr, rw_ptr, sorted_ids_ptr, as_ptr, ws_ptr, zp_ptr, e, row_start,
                         count, pid_n, num_valid, N, K, rows_per_expert, a_row_div, stride_ae, stride_am, stride_ak,
                         stride_we, stride_wn, stride_wk, stride_be, stride_bn, stride_ce, stride_cm, stride_cn,
                         stride_asm, stride_asg, stride_wse, stride_wsn, stride_wsg, stride_zpe, stride_zpn,
                         stride_zpg, alpha, beta, limit, ACT, GATED, INTERLEAVED, HAS_BIAS, WEIGHT_MODE, BATCHED,
                         IEEE, TF32, EVEN_K, BLOCK_M // 2, BLOCK_N, BLOCK_K, A_SCALE, W_SCALE, SCALE_IN_LOOP, GROUP_K,
                         WS_ROW_DIV, INT_DOT, W_CODES, HAS_ZP, PER_SLOT, FP8_FAST,
                 JOINT)
            return
    _expert_tile(a_ptr, w_ptr, bias_ptr, c_ptr, rw_ptr, sorted_ids_ptr, as_ptr, ws_ptr, zp_ptr, e, row_start, count,
                 pid_n, num_valid, N, K, rows_per_expert, a_row_div, stride_ae, stride_am, stride_ak, stride_we,
                 stride_wn, stride_wk, stride_be, stride_bn, stride_ce, stride_cm, stride_cn, stride_asm, stride_asg,
                 stride_wse, stride_wsn, stride_wsg, stride_zpe, stride_zpn, stride_zpg, alpha, beta, limit, ACT,
                 GATED, INTERLEAVED, HAS_BIAS, WEIGHT_MODE, BATCHED, IEEE, TF32, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K,
                 A_SCALE, W_SCALE, SCALE_IN_LOOP, GROUP_K, WS_ROW_DIV, INT_DOT, W_CODES, HAS_ZP, PER_SLOT, FP8_FAST,
                 JOINT)


@triton.jit(do_not_specialize=["M", "top_k"])
def _reduce_kernel(y_ptr, out_ptr, topk_ids_ptr, map_ptr, M, K, top_k, stride_om, stride_ok,
                   HAS_MAP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK: tl.constexpr,
                   SEQUENTIAL: tl.constexpr = False):
    """out[t] = sum over local slots j of y[t*k + j] (already weighted, in x.dtype), in slot order. fp32 sum rounded
    once (ROUNDED_SLOTS); SEQUENTIAL: every partial sum rounded to the output dtype (vLLM moe_sum's
    SEQUENTIAL_OUT_DTYPE; a non-local slot adds nothing, as the oracle's zeroed slot leaves a rounded sum as is)."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = (t < M)[:, None] & (offs < K)[None, :]
    acc = tl.zeros([BLOCK_T, BLOCK], dtype=tl.float32)
    for j in range(0, top_k):  # slot order: deterministic
        slot = t * top_k + j
        use = ok
        if HAS_MAP:
            lid = tl.load(map_ptr + tl.load(topk_ids_ptr + slot, mask=t < M, other=0), mask=t < M, other=-1)
            use = ok & (lid >= 0)[:, None]
        acc += tl.load(y_ptr + slot[:, None] * K + offs[None, :], mask=use, other=0.0).to(tl.float32)
        if SEQUENTIAL:
            acc = acc.to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + t[:, None] * stride_om + offs[None, :] * stride_ok, acc.to(out_ptr.dtype.element_ty), mask=ok)


# ----------------------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SortedTokens:
    """The sorted-token layout: `sorted_ids` (int32, sentinel = numel), `expert_ids` per block (local ids),
    `num_post_padded` (int32 [1], on the device), `max_blocks` (the grid's upper bound on blocks)."""

    sorted_ids: torch.Tensor
    expert_ids: torch.Tensor
    num_post_padded: torch.Tensor
    max_blocks: int
    block_m: int
    #: one block per routed slot: sorted_ids is the flat topk_ids, expert_ids the expert map (if `mapped`)
    per_slot: bool = False
    mapped: bool = False


#: at most this many routed slots run one block per slot (no layout, no align launches): decode batches, where
#: a token's k slots hit distinct experts and few tokens share one
PER_SLOT_MAX = 16


def slot_blocks(topk_ids: torch.Tensor, block_m: int, expert_map: torch.Tensor | None = None) -> SortedTokens:
    """The per-slot layout: block i is slot i (flat topk_ids, int32/int64), its expert found by the GEMM."""
    ids = topk_ids.reshape(-1)
    mapped = expert_map is not None
    return SortedTokens(ids, expert_map if mapped else ids, ids, ids.numel(), block_m, per_slot=True, mapped=mapped)


def sort_tokens(topk_ids: torch.Tensor, num_local: int, block_m: int,
                expert_map: torch.Tensor | None = None) -> SortedTokens:
    """The sorted-token layout on the device (kernels.align, no host sync; slots of non-local experts excluded).
    topk_ids: [M, k] or flat global ids; num_local >= 1 (w13.shape[0])."""
    ids = topk_ids.reshape(1, -1)
    numel = ids.shape[1]
    num_experts = num_local if expert_map is None else expert_map.shape[0]
    # interpreter: one chunk just covering the ids (the bitonic sort's numpy cost grows with the chunk)
    chunk = _pow2(numel, 16, 1024) if interpreting() else None
    sorted_ids, expert_ids, num_post = moe_align_block_size(
        ids, block_m, num_experts, expert_map=expert_map, ep_convention="exclude", chunk=chunk)
    # Every local expert with slots takes >= 1 block; all slots fill at most cdiv(numel, block_m) full blocks:
    # a tighter grid than the buffers' capacity (which assumes every expert has slots).
    max_blocks = triton.cdiv(numel, block_m) + min(num_local, numel)
    return SortedTokens(sorted_ids, expert_ids, num_post, max_blocks, block_m)


def gemm_configs(configs: tuple[Config, Config] | None, rows_per_expert: float, n: int, k_dim: int,
                 dtype: torch.dtype, *, act: int, experts: int, quant: ExpertsQuant | None,
                 fp8_fast: bool = False) -> tuple[Config, Config]:
    """The (GEMM1, GEMM2) tiles: the caller's, checked, or `choose_config`'s. A quantized scheme with K-group
    scales (G128) caps BLOCK_K at 128: its scales are applied per K block, so BLOCK_K must divide the group.
    fp8_fast: the fp8 dots use fast accumulation (it changes the best tiles)."""
    if configs is None:
        cap = 128 if quant is not None and quant.quant_format == "G128" else 0
        fp8 = quant.quant_format if quant is not None and quant.quant_type == "fp8_w8a8" else ""
        coded = quant is not None
        configs = (choose_config(rows_per_expert, n, k_dim, dtype, gated=act in GATED, experts=experts,
                                 max_block_k=cap, fp8=fp8, fp8_fast=fp8_fast, quantized=coded),
                   choose_config(rows_per_expert, k_dim, n, dtype, gated=False, experts=experts, max_block_k=cap,
                                 fp8=fp8, quantized=coded))
    if configs[0].block_m != configs[1].block_m:
        raise ValueError("GEMM1 and GEMM2 configs must share block_m")
    if any(c.split_tail and c.block_m < 32 for c in configs):
        raise ValueError("split_tail needs block_m >= 32 (its half-height tile is at least 16 rows for tl.dot)")
    return configs


def _act_code(activation: str) -> int:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    return ACTIVATIONS[activation]


def _check_weights(x_dtype: torch.dtype, k_dim: int, w13: torch.Tensor, w2: torch.Tensor, act: int,
                   quant: ExpertsQuant | None = None) -> int:
    w_dtype, pk = (x_dtype, 1) if quant is None else (quant.code_dtype(), quant.packed_k())
    if w13.dtype != w_dtype or w2.dtype != w_dtype:
        raise ValueError(f"w13 and w2 must have dtype {w_dtype}, got {w13.dtype} and {w2.dtype}")
    if quant is not None and x_dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"quantized schemes take bf16/fp16 activations, got {x_dtype}")
    if w13.dim() != 3 or w2.dim() != 3 or w13.shape[2] * pk != k_dim or w2.shape[1] != k_dim:
        raise ValueError(f"w13 must be [E, 2N or N, {k_dim // pk}] and w2 [E, {k_dim}, N/{pk}], got "
                         f"{list(w13.shape)}, {list(w2.shape)}")
    n = w13.shape[1] // 2 if act in GATED else w13.shape[1]
    if w2.shape[2] * pk != n or w2.shape[0] != w13.shape[0] or (act in GATED and w13.shape[1] % 2):
        raise ValueError(f"w13 {list(w13.shape)} and w2 {list(w2.shape)} do not agree on E and N")
    if max(w13.shape[1] * k_dim, k_dim * n) >= 2**31:
        raise ValueError("one expert's weight must have < 2**31 elements (int32 offsets inside an expert)")
    return n


def launch_gemm(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, c: torch.Tensor,
                router_weights: torch.Tensor | None, cfg: Config, *, act: int, interleaved: bool,
                weight_mode: int, n: int, num_pid_m: int, a_row_div: int = 1, sorted_tokens: SortedTokens | None
                = None, counts: torch.Tensor | None = None, rows_per_expert: int = 0, num_valid: int = 0,
                alpha: float = 0.0, beta: float = 0.0, limit: float = 0.0,
                q: QuantOperands | None = None, fp32_precision: str = "ieee", fp8_fast: bool = False) -> None:
    """One grouped GEMM over expert blocks (standard: `sorted_tokens`; batched: `counts`, 3-D a and c).
    q: scales / zero points / code format of quantized operands (kernels.quant_gemm). fp32_precision: tl.dot's
    input_precision for fp32 operands ("ieee" or "tf32"; other dtypes ignore it). fp8_fast: fp8 dots summed by
    the tensor core in reduced precision over each K block (Triton's default) instead of promoted per MMA."""
    if fp32_precision not in FP32_PRECISIONS:
        raise ValueError(f"fp32_precision must be one of {FP32_PRECISIONS}, got {fp32_precision!r}")
    fp32 = a.dtype == torch.float32
    batched = counts is not None
    k_dim = a.shape[-1]
    if batched:
        sae, sam, sak = a.stride()
        sce, scm, scn = c.stride()
    else:
        sae, (sam, sak) = 0, a.stride()
        sce, (scm, scn) = 0, c.stride()
    dummy = c
    st = sorted_tokens
    num_pid_n = triton.cdiv(n, cfg.block_n)
    grid = (num_pid_m * num_pid_n,)
    _moe_gemm_kernel[grid](
        a, w, bias if bias is not None else dummy, c, router_weights if router_weights is not None else dummy,
        st.sorted_ids if st else counts, st.expert_ids if st else counts, st.num_post_padded if st else counts,
        counts if batched else st.num_post_padded,
        *(q.pointers(dummy) if q else (dummy, dummy, dummy)),
        num_valid, n, k_dim, rows_per_expert, a_row_div,
        sae, sam, sak, *w.stride(), *(bias.stride() if bias is not None else (0, 0)), sce, scm, scn,
        *(q.strides() if q else (0,) * 8),
        float(alpha), float(beta), float(limit), num_pid_m, num_pid_n,
        ACT=act, GATED=act in GATED, INTERLEAVED=interleaved, HAS_BIAS=bias is not None, WEIGHT_MODE=weight_mode,
        BATCHED=batched, IEEE=fp32 and fp32_precision == "ieee", TF32=fp32 and fp32_precision == "tf32",
        EVEN_K=k_dim % cfg.block_k == 0,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        PER_SLOT=bool(st and st.per_slot), SLOT_MAP=bool(st and st.mapped),
        SPLIT_TAIL=cfg.split_tail and not (st and st.per_slot), FP8_FAST=fp8_fast,
        JOINT=cfg.joint_gate_up and act in GATED,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **(q.constexprs(cfg.block_k) if q else {}),
    )


def fused_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu_and_mul",
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    expert_map: torch.Tensor | None = None,
    apply_router_weight_on_input: bool = False,
    alpha: float = SWIGLUOAI_PARAMS["alpha"],
    beta: float = SWIGLUOAI_PARAMS["beta"],
    limit: float = SWIGLUOAI_PARAMS["limit"],
    configs: tuple[Config, Config] | None = None,
    out: torch.Tensor | None = None,
    quant: ExpertsQuant | None = None,
    fp32_precision: str = "ieee",
    reduce: str = "fp32",
    fp8_fast_accum: bool = False,
) -> torch.Tensor:
    """Fused experts on x [M, K] with w13 [E, 2N (N for *_no_mul), K], w2 [E, K, N], topk_* [M, k].

    quant (kernels.quant_gemm.ExpertsQuant): w13/w2 are codes with these scales. w8a8: x is quantized
    dynamically before GEMM1 and the activation output (rounded to x.dtype) again over all local slots before
    GEMM2, both by the scheme's activation recipe; the scales are applied to the fp32 accumulator (per K block
    inside the loop for G128).

    swigluoai reads gate and up interleaved (even/odd rows of w13); the others read halves, gate first.
    expert_map [E_global] maps global ids to local ids or -1 (non-local slots contribute nothing).
    configs: (GEMM1, GEMM2) tiles with the same block_m; default `choose_config`. Returns out [M, K] in x.dtype.

    fp32_precision: tl.dot's input_precision when x is float32: "ieee" (default, exact products) or "tf32"
    (operands read as TF32, as vLLM's fused_moe_kernel does with Triton's default); bf16/fp16 are unaffected.
    reduce: "fp32" (default) sums each token's weighted slots (each rounded to x.dtype) in fp32 and rounds once;
    "moe_sum" sums them as vLLM's moe_sum does for 2 <= k <= 4: in slot order, every partial sum rounded to
    x.dtype (Accumulation.SEQUENTIAL_OUT_DTYPE); for other k it is the fp32 sum.
    fp8_fast_accum: fp8 dots accumulate in the tensor core's reduced precision within each K block (as vLLM's
    kernel does; matmul_precision "fp8_mma_promoted") instead of promoting every MMA to fp32 (the default).
    """
    if fp32_precision not in FP32_PRECISIONS:
        raise ValueError(f"fp32_precision must be one of {FP32_PRECISIONS}, got {fp32_precision!r}")
    if reduce not in REDUCES:
        raise ValueError(f"reduce must be one of {REDUCES}, got {reduce!r}")
    act = _act_code(activation)
    if x.dim() != 2 or topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0] or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"x must be [M, K] and topk_ids/topk_weights [M, k], got {list(x.shape)}, "
                         f"{list(topk_ids.shape)}, {list(topk_weights.shape)}")
    m, k_dim = x.shape
    top_k = topk_ids.shape[1]
    n = _check_weights(x.dtype, k_dim, w13, w2, act, quant)
    if apply_router_weight_on_input and top_k != 1:
        raise ValueError(f"apply_router_weight_on_input requires k = 1, got {top_k}")
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    num_local = w13.shape[0]
    numel = m * top_k
    if numel == 0 or k_dim == 0:
        return out
    if num_local == 0:  # no local expert: the partial sum is zero
        return out.zero_()
    c1, c2 = gemm_configs(configs, numel / min(num_local, numel), n, k_dim, x.dtype, act=act,
                          experts=min(num_local, numel), quant=quant, fp8_fast=fp8_fast_accum)
    ids = topk_ids.reshape(-1).contiguous()
    if numel <= PER_SLOT_MAX:
        st = slot_blocks(ids, c1.block_m, expert_map)
    else:
        st = sort_tokens(ids, num_local, c1.block_m, expert_map)
    rw = topk_weights.reshape(-1)
    if not rw.is_contiguous():
        rw = rw.contiguous()
    io_dtype = x.dtype
    q1 = q2 = None
    if quant is not None:
        xs = None
        if quant.w8a8:
            x, xs = quant.quantize_activation(x)
        q1 = quant.operands("w13", xs)
    # non-local slots are never written: a per-tensor re-quantization reads every row, so they must hold zeros
    alloc = torch.zeros if quant is not None and quant.w8a8 and quant.per_tensor else torch.empty
    inter = alloc(numel, n, dtype=io_dtype, device=x.device)
    launch_gemm(x, w13, w13_bias, inter, rw, c1, act=act, interleaved=activation == "swigluoai",
                weight_mode=1 if apply_router_weight_on_input else 0, n=n, num_pid_m=st.max_blocks,
                a_row_div=top_k, sorted_tokens=st, num_valid=numel, alpha=alpha, beta=beta, limit=limit, q=q1,
                fp32_precision=fp32_precision, fp8_fast=fp8_fast_accum)
    if quant is not None:
        a_s = None
        if quant.w8a8:  # the oracle's intermediate: a rounded to x.dtype, then re-quantized by the same recipe
            inter, a_s = quant.quantize_activation(inter)
        q2 = quant.operands("w2", a_s)
    y = torch.empty(numel, k_dim, dtype=io_dtype, device=x.device)  # weighted slots, rounded once
    launch_gemm(inter, w2, w2_bias, y, rw, c2, act=0, interleaved=False,
                weight_mode=0 if apply_router_weight_on_input else 2, n=k_dim, num_pid_m=st.max_blocks,
                sorted_tokens=st, num_valid=numel, q=q2, fp32_precision=fp32_precision, fp8_fast=fp8_fast_accum)
    return reduce_slots(y, out, ids, expert_map, top_k, reduce)


def reduce_slots(y: torch.Tensor, out: torch.Tensor, ids: torch.Tensor, expert_map: torch.Tensor | None,
                 top_k: int, reduce: str = "fp32") -> torch.Tensor:
    """out[t] = the sum of y's weighted slots t*k .. t*k+k-1 (`reduce` as in fused_experts); slots of experts the
    map makes non-local are left out. y [M*k, K], ids the flat topk_ids."""
    m, k_dim = out.shape
    # interpreter: a few large tiles; GPU: 4 tokens x 256 columns a program (enough programs at M = 1)
    block_t, block = (_pow2(m, 1, 64), _pow2(k_dim, 16, 256)) if interpreting() else (4, _pow2(k_dim, 16, 256))
    _reduce_kernel[(triton.cdiv(m, block_t), triton.cdiv(k_dim, block))](
        y, out, ids, expert_map if expert_map is not None else ids, m, k_dim, top_k, *out.stride(),
        HAS_MAP=expert_map is not None, BLOCK_T=block_t, BLOCK=block,
        SEQUENTIAL=reduce == "moe_sum" and MOE_SUM_SEQUENTIAL_K[0] <= top_k <= MOE_SUM_SEQUENTIAL_K[1], num_warps=4,
    )
    return out
