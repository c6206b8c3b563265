"""Does an fp8 G128 GEMM that promotes every MMA keep pace with one that promotes every K block? (Gluon, sm90 probe)

Our default fp8 accumulation adds every tensor-core MMA's result (32 deep) to an fp32 accumulator before the next
MMA starts (Triton's `max_num_imprecise_acc=0`); the fast path lets the MMAs of a 128-deep K block accumulate in the
tensor core and promotes once per block. In Triton each promotion waits for its MMA, and the default path takes
1.4-2x the fast path's time at M >= 1024. This probe writes the GEMM in Gluon, Triton's explicit dialect, where
the next MMA can be issued before the previous one's result is promoted (asynchronous warp-group MMAs, one left in
flight), over expert-contiguous rows with TMA loads in a ring of stages. SPLIT = 4 promotes every 32-deep MMA (our
default numerics), SPLIT = 1 every 128-deep block (the fast path's). Beside it, on the same inputs: our GEMM1 as a
plain GEMM over the same 2N columns with either accumulation. Every probe configuration is checked against the rows
of our plain GEMM of the same numerics before it is timed (`--plant` passes unit activation scales, which the check
must reject). CUDA-graph replay, L2 flushed. Gluon kernels do not run in Triton's
interpreter: this probe needs an sm90 GPU.

    python scripts/probe_fp8_gluon.py --out probe.jsonl [--shape deepseek-v3 ...] [--m 1024 4096] [--gemm 1 2]

`--gemm 2` times the down projection the same way (A: the intermediate's rows, one per slot; B: W2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from probe_fp8_contiguous import GROUP, checked_time, expert_rows, inputs, ours, recorder
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

from kernels.quant_gemm import quantize_activation

#: (block_m, block_n, warps, stages, split, mode): warp groups of 4 warps side by side along N where `n2` is in the
#: mode, else stacked along M (16 rows a warp); `overlap` keeps the next MMA in flight while one is promoted, `sum`
#: adds a block's MMAs in fp32 and scales their sum once
TILES = [(128, 128, 8, 4, 1, ""), (128, 128, 8, 4, 4, ""), (128, 128, 8, 4, 4, "overlap"),
         (128, 128, 8, 3, 1, "overlap"), (64, 128, 4, 4, 1, ""), (64, 128, 4, 4, 4, ""), (64, 128, 4, 4, 4, "overlap"),
         (64, 128, 4, 3, 4, ""), (256, 64, 16, 4, 4, ""), (256, 64, 16, 4, 1, ""),
         (64, 128, 4, 4, 4, "sum"), (128, 128, 8, 4, 4, "sum"), (64, 256, 8, 3, 1, "n2"), (64, 256, 8, 3, 4, "n2"),
         (64, 256, 8, 4, 4, "n2"), (64, 256, 8, 3, 4, "n2 sum"), (128, 128, 8, 4, 4, "n2")]


@gluon.jit
def _promote(acc, part, sa, sw):
    return acc + part * (sa[:, None] * sw[None, :])


@gluon.jit
def _refill(a_desc, w_desc, a_bufs, w_bufs, bars, m0, w_row, kb, num_k, STAGES: gl.constexpr, BLOCK_K: gl.constexpr):
    if kb < num_k:
        t = kb % STAGES
        mbarrier.expect(bars.index(t), a_desc.block_type.nbytes + w_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(a_desc, [m0, kb * BLOCK_K], bars.index(t), a_bufs.index(t))
        tma.async_copy_global_to_shared(w_desc, [w_row, kb * BLOCK_K], bars.index(t), w_bufs.index(t))


@gluon.jit
def _gluon_gemm(a_desc, w_desc, c_ptr, as_ptr, ws_ptr, expert_ids_ptr, num_post_ptr, N, K, stride_cm, stride_asm,
                stride_wse, stride_wsn, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                STAGES: gl.constexpr, SPLIT: gl.constexpr, OVERLAP: gl.constexpr, WARPS_N: gl.constexpr,
                BLOCK_SUM: gl.constexpr, num_warps: gl.constexpr):
    """C[r, n] = sum over K blocks of (A[r] . W[e, n]) * sa[r, kb] * sw[e, n // 128, kb], one program per tile of
    the expert-contiguous rows r < num_post; each K block's SPLIT MMAs are promoted one by one, with OVERLAP the
    next MMA in flight while the previous one's result is added."""
    num_post = gl.load(num_post_ptr)
    tiles_n = gl.cdiv(N, BLOCK_N)
    pid = gl.program_id(0)
    pid_m = pid // tiles_n
    m0 = pid_m * BLOCK_M
    n0 = (pid % tiles_n) * BLOCK_N
    if m0 < num_post:
        SUB_K: gl.constexpr = BLOCK_K // SPLIT
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps // WARPS_N, WARPS_N],
                                                      instr_shape=[16, BLOCK_N // WARPS_N, 32])
        e = gl.load(expert_ids_ptr + pid_m)
        rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma))
        cols = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
        sa_ptrs = as_ptr + rows * stride_asm
        sw_ptrs = ws_ptr + e * stride_wse + (cols // 128) * stride_wsn
        a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
        w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(bars.index(i), count=1)
        num_k = gl.cdiv(K, BLOCK_K)
        w_row = e * N + n0
        for i in gl.static_range(STAGES - 1):
            _refill(a_desc, w_desc, a_bufs, w_bufs, bars, m0, w_row, i, num_k, STAGES, BLOCK_K)
        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=mma)
        zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=mma)
        last = warpgroup_mma_init(zero)  # the previous block's last MMA, in flight
        sa_last = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, mma))
        sw_last = gl.zeros([BLOCK_N], gl.float32, layout=gl.SliceLayout(0, mma))
        for kb in range(num_k):
            s = kb % STAGES
            if not OVERLAP:  # the previous block's MMAs are done in every warp group: its stage is free
                gl.thread_barrier()
                _refill(a_desc, w_desc, a_bufs, w_bufs, bars, m0, w_row, kb + STAGES - 1, num_k, STAGES, BLOCK_K)
            mbarrier.wait(bars.index(s), (kb // STAGES) & 1)
            a_s = a_bufs.index(s)
            w_s = w_bufs.index(s)
            sa = gl.load(sa_ptrs + kb)
            sw = gl.load(sw_ptrs + kb)
            if OVERLAP:  # the next MMA in flight while this warp group promotes the previous one
                part = warpgroup_mma(a_s.slice(0, SUB_K, dim=1), w_s.slice(0, SUB_K, dim=1).permute((1, 0)), zero,
                                     use_acc=False, is_async=True)
                last = warpgroup_mma_wait(num_outstanding=1, deps=(last,))
                acc = _promote(acc, last, sa_last, sw_last)
                gl.thread_barrier()  # every warp group is done with the previous block's stage before TMA refills it
                _refill(a_desc, w_desc, a_bufs, w_bufs, bars, m0, w_row, kb + STAGES - 1, num_k, STAGES, BLOCK_K)
                for j in gl.static_range(1, SPLIT):
                    nxt_part = warpgroup_mma(a_s.slice(j * SUB_K, SUB_K, dim=1),
                                             w_s.slice(j * SUB_K, SUB_K, dim=1).permute((1, 0)), zero,
                                             use_acc=False, is_async=True)
                    part = warpgroup_mma_wait(num_outstanding=1, deps=(part,))
                    acc = _promote(acc, part, sa, sw)
                    part = nxt_part
                last = part
                sa_last = sa
                sw_last = sw
            elif BLOCK_SUM:  # each MMA's result added in fp32 to the block's sum, scaled once per block
                blk = zero
                for j in gl.static_range(SPLIT):
                    part = warpgroup_mma(a_s.slice(j * SUB_K, SUB_K, dim=1),
                                         w_s.slice(j * SUB_K, SUB_K, dim=1).permute((1, 0)), zero,
                                         use_acc=False, is_async=True)
                    blk = blk + warpgroup_mma_wait(num_outstanding=0, deps=(part,))
                acc = _promote(acc, blk, sa, sw)
            else:  # each MMA waited for and promoted; the other warp groups' MMAs fill the tensor cores meanwhile
                for j in gl.static_range(SPLIT):
                    part = warpgroup_mma(a_s.slice(j * SUB_K, SUB_K, dim=1),
                                         w_s.slice(j * SUB_K, SUB_K, dim=1).permute((1, 0)), zero,
                                         use_acc=False, is_async=True)
                    part = warpgroup_mma_wait(num_outstanding=0, deps=(part,))
                    acc = _promote(acc, part, sa, sw)
        last = warpgroup_mma_wait(num_outstanding=0, deps=(last,))
        acc = _promote(acc, last, sa_last, sw_last)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(i))
        store: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
        out = gl.convert_layout(acc.to(gl.bfloat16), store)
        srows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, store))
        scols = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, store))
        gl.store(c_ptr + srows[:, None] * stride_cm + scols[None, :], out,
                 mask=(srows < num_post)[:, None] & (scols < N)[None, :])


def gluon_gemm(a: torch.Tensor, sa: torch.Tensor, w: torch.Tensor, ws: torch.Tensor, expert_ids: torch.Tensor,
               num_post: torch.Tensor, c: torch.Tensor, tile: tuple[int, int, int, int, int, str]) -> None:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    bm, bn, warps, stages, split, mode = tile
    e, n, k = w.shape
    a_layout = gl.NVMMASharedLayout.get_default_for([bm, GROUP], gl.float8e4nv)
    w_layout = gl.NVMMASharedLayout.get_default_for([bn, GROUP], gl.float8e4nv)
    a_desc = TensorDescriptor(a, list(a.shape), list(a.stride()), [bm, GROUP], a_layout)
    w2 = w.view(e * n, k)
    w_desc = TensorDescriptor(w2, list(w2.shape), list(w2.stride()), [bn, GROUP], w_layout)
    tiles = -(-a.shape[0] // bm) * -(-n // bn)
    _gluon_gemm[(tiles,)](a_desc, w_desc, c, sa, ws, expert_ids, num_post, n, k, c.stride(0), sa.stride(0),
                          ws.stride(0), ws.stride(1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=GROUP, STAGES=stages,
                          SPLIT=split, OVERLAP="overlap" in mode, WARPS_N=2 if "n2" in mode else 1,
                          BLOCK_SUM="sum" in mode, num_warps=warps)


def down_inputs(shape: dict, m: int, device: str):
    """GEMM2's operands in GEMM1's form: a [M*k, 1] routing (one row of A per slot), W2's fp8 codes and 128x128
    scales (the bench's weights, the harness's quantizer), the intermediate's fp8 codes and 1x128 scales."""
    from harness.commands.bench.experts import _weights, quantize_weights

    g = torch.Generator(device="cpu").manual_seed(m)
    e, k = shape["E"], shape["k"]
    topk_ids = torch.rand(m, e, generator=g).argsort(dim=1)[:, :k].reshape(-1, 1).to(device)
    qw = quantize_weights(_weights(shape, device), "fp8_w8a8", "G128", device)
    torch.manual_seed(m)
    inter = torch.randn(m * k, shape["N"], device=device).to(torch.bfloat16)
    aq, a_s = quantize_activation(inter, "fp8_w8a8", "G128")
    return topk_ids, qw["w2"], qw["w2_scale"].float().contiguous(), aq, a_s


def probe(name: str, shape: dict, m: int, record, plant: bool = False, gemm: int = 1) -> None:
    from harness.commands.bench import copy_bandwidth, do_bench_graph
    from harness.commands.bench.experts import matmul_rate

    device = "cuda"
    topk_ids, wq, ws, xq, xs = (inputs if gemm == 1 else down_inputs)(shape, m, device)
    n2, hidden, numel = wq.shape[1], xq.shape[1], topk_ids.numel()  # output columns, reduction, slots
    flops = 2.0 * numel * n2 * hidden
    nbytes = int(topk_ids.unique().numel()) * n2 * hidden + xq.shape[0] * hidden + numel * n2 * 2
    floor = max(flops / matmul_rate(device, "fp8"), nbytes / copy_bandwidth(device))
    base = {"shape": name, "M": m, "gemm": gemm, "floor_us": floor * 1e6}
    refs = {}
    for label, fast in (("ours-plain fast", True), ("ours-plain default", False)):
        run, out, c = ours(xq, xs, wq, ws, topk_ids, n2, gated=False, fast=fast)
        run()
        refs[fast] = out  # each Gluon split is checked against our GEMM of the same numerics
        t = do_bench_graph(run)
        record({**base, "kernel": label, "tile": [c.block_m, c.block_n, c.block_k, c.num_warps, c.num_stages],
                "us": t * 1e6, "pct_floor": 100 * floor / t})
    for tile in TILES:
        st, a, sa = expert_rows(xq, xs, topk_ids, shape["E"], tile[0])
        if plant:  # the check must catch a kernel that ignores the activations' scales
            sa = torch.ones_like(sa)
        c = torch.empty(a.shape[0], n2, dtype=torch.bfloat16, device=device)
        def run(a=a, sa=sa, st=st, c=c, tile=tile):
            gluon_gemm(a, sa, wq, ws, st.expert_ids, st.num_post_padded, c, tile)
        row = {**base, "kernel": f"gluon split={tile[4]} {tile[5]}".strip(), "tile": list(tile)}
        record(checked_time(row, run, c, st, numel, refs[tile[4] == 1], floor))


def main() -> int:
    from harness.commands.bench import SHAPES

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="")
    p.add_argument("--shape", action="append", default=[])
    p.add_argument("--m", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--plant", action="store_true", help="pass unit activation scales: every row must be an error")
    p.add_argument("--gemm", type=int, nargs="+", default=[1], choices=(1, 2), help="GEMM1 (W13) and/or GEMM2 (W2)")
    args = p.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        p.error("this probe runs Hopper (sm90) warp-group MMAs: it needs an sm90 GPU")
    record = recorder(args.out)
    for gemm in args.gemm:
        for name in args.shape or list(SHAPES):
            for m in args.m:
                probe(name, SHAPES[name], m, record, args.plant, gemm)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
