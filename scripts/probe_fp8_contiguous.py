"""Would an fp8 G128 GEMM1 over expert-contiguous rows reach 55% of the floor in Triton on sm90? (GPU probe)

Our GEMM1 gathers each block's rows of x through the sorted ids, so its A operand cannot be a TMA tile. This probe
times the same GEMM (x [M, K] fp8 with 1x128 scales, W13 [E, 2N, K] fp8 with 128x128 scales, fast accumulation
promoted per 128-deep K block, bf16 out) over rows copied into expert order first (the copy is not timed), with
both operands loaded through TMA descriptors, persistent programs over the tiles, and Triton's warp specialization
where it compiles for sm90. Beside it, on the same inputs: our GEMM1 as `fused_experts` launches it (gated, joint
gate/up tile) and as a plain GEMM over the same 2N columns. Every probe configuration is checked against our plain
GEMM's rows (the oracle-verified kernel) before it is timed. CUDA-graph replay, L2 flushed.

    python scripts/probe_fp8_contiguous.py --out probe.jsonl [--shape deepseek-v3 ...] [--m 1024 4096]
    python scripts/probe_fp8_contiguous.py --smoke     # a tiny shape in Triton's interpreter (no timing)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch
import triton
import triton.language as tl

from kernels.fused_experts import choose_config, launch_gemm, sort_tokens
from kernels.quant_gemm import ExpertsQuant, quantize_activation

GROUP = 128
#: (block_m, block_n, warps, stages); BLOCK_K is the scale group
TILES = [(64, 128, 4, 4), (128, 128, 8, 4), (128, 128, 8, 3), (64, 256, 8, 3)]


@triton.jit
def _contiguous_gemm(a_desc, w_desc, c_ptr, as_ptr, ws_ptr, expert_ids_ptr, num_post_ptr, N, K, stride_cm,
                     stride_asm, stride_wse, stride_wsn, num_programs,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WS: tl.constexpr):
    """C[r, n] = sum over K blocks of (A[r] . W[e, n]) * sa[r, kb] * sw[e, n // 128, kb] for the expert-contiguous
    rows r < num_post (padding rows of A are zeros), programs striding over the (m block, n tile) tiles."""
    num_post = tl.load(num_post_ptr)
    tiles_n = tl.cdiv(N, BLOCK_N)
    num_tiles = tl.cdiv(num_post, BLOCK_M) * tiles_n
    for tile in tl.range(tl.program_id(0), num_tiles, num_programs, warp_specialize=WS):
        pid_m = tile // tiles_n
        m0 = pid_m * BLOCK_M
        n0 = (tile % tiles_n) * BLOCK_N
        e = tl.load(expert_ids_ptr + pid_m)
        rows = m0 + tl.arange(0, BLOCK_M)
        cols = n0 + tl.arange(0, BLOCK_N)
        sa_ptrs = as_ptr + rows * stride_asm
        sw_ptrs = ws_ptr + e * stride_wse + (cols // 128) * stride_wsn
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for kb in range(0, tl.cdiv(K, BLOCK_K)):
            a = a_desc.load([m0, kb * BLOCK_K])
            w = w_desc.load([e * N + n0, kb * BLOCK_K])
            sa = tl.load(sa_ptrs + kb)
            sw = tl.load(sw_ptrs + kb)
            acc += tl.dot(a, w.T) * (sa[:, None] * sw[None, :])
        tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :], acc.to(tl.bfloat16),
                 mask=(rows < num_post)[:, None] & (cols < N)[None, :])


def contiguous_gemm(a: torch.Tensor, sa: torch.Tensor, w: torch.Tensor, ws: torch.Tensor, expert_ids: torch.Tensor,
                    num_post: torch.Tensor, c: torch.Tensor, tile: tuple[int, int, int, int], programs: int,
                    ws_flag: bool) -> None:
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, warps, stages = tile
    e, n, k = w.shape
    a_desc = TensorDescriptor.from_tensor(a, [bm, GROUP])
    w_desc = TensorDescriptor.from_tensor(w.view(e * n, k), [bn, GROUP])
    _contiguous_gemm[(programs,)](a_desc, w_desc, c, sa, ws, expert_ids, num_post, n, k, c.stride(0), sa.stride(0),
                                  ws.stride(0), ws.stride(1), programs, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=GROUP,
                                  WS=ws_flag, num_warps=warps, num_stages=stages)


def expert_rows(xq: torch.Tensor, xs: torch.Tensor, topk_ids: torch.Tensor, experts: int, block_m: int):
    """x's codes and scales copied into the sorted layout's order (sentinel rows zero): the expert-contiguous A."""
    st = sort_tokens(topk_ids, experts, block_m)
    k = topk_ids.shape[1]
    ids = st.sorted_ids.long()
    valid = ids < topk_ids.numel()
    src = torch.where(valid, ids // k, 0)
    a = xq[src].view(torch.uint8) * valid[:, None].to(torch.uint8)
    sa = xs[src] * valid[:, None]
    return st, a.view(torch.float8_e4m3fn).contiguous(), sa.contiguous()


def inputs(shape: dict, m: int, device: str):
    """topk ids, W13's fp8 codes and 128x128 scales (the bench's weights, quantized by the harness's recipe), x's fp8
    codes and 1x128 scales."""
    from harness.commands.bench.experts import _weights, quantize_weights

    g = torch.Generator(device="cpu").manual_seed(m)
    e, hidden, k = shape["E"], shape["K"], shape["k"]
    topk_ids = torch.rand(m, e, generator=g).argsort(dim=1)[:, :k].to(device)
    qw = quantize_weights(_weights(shape, device), "fp8_w8a8", "G128", device)
    torch.manual_seed(m)
    xq, xs = quantize_activation(torch.randn(m, hidden, device=device).to(torch.bfloat16), "fp8_w8a8", "G128")
    return topk_ids, qw["w13"], qw["w13_scale"].float().contiguous(), xq, xs


def ours(xq, xs, wq, ws, topk_ids, n2: int, gated: bool, fast: bool = True):
    """Our GEMM1 launch (gated: the silu-and-mul tile fused_experts runs; else a plain GEMM over all 2N columns), with
    fp8 accumulation promoted per K block (fast) or per MMA (our default)."""
    m, hidden = xq.shape
    k = topk_ids.shape[1]
    e = wq.shape[0]
    numel = m * k
    cfg = choose_config(numel / min(e, numel), n2 // 2 if gated else n2, hidden, torch.bfloat16, gated=gated,
                        experts=min(e, numel), max_block_k=GROUP, fp8="G128", fp8_fast=fast, quantized=True)
    st = sort_tokens(topk_ids, e, cfg.block_m)
    quant = ExpertsQuant("fp8_w8a8", "G128", ws, ws)
    out = torch.empty(numel, n2 // 2 if gated else n2, dtype=torch.bfloat16, device=xq.device)
    rw = torch.ones(numel, device=xq.device)
    q = quant.operands("w13", xs)

    def run():
        launch_gemm(xq, wq, None, out, rw, cfg, act=1 if gated else 0, interleaved=False, weight_mode=0,
                    n=n2 // 2 if gated else n2, num_pid_m=st.max_blocks, a_row_div=k, sorted_tokens=st,
                    num_valid=numel, q=q, fp8_fast=fast)
    return run, out, cfg


def probe(name: str, shape: dict, m: int, device: str, record, smoke: bool) -> None:
    from harness.commands.bench import copy_bandwidth, do_bench_graph
    from harness.commands.bench.experts import matmul_rate

    topk_ids, wq, ws, xq, xs = inputs(shape, m, device)
    n2, hidden, numel = 2 * shape["N"], shape["K"], m * shape["k"]
    flops = 2.0 * numel * n2 * hidden
    # the weights of every expert any slot routes to, x's codes, the bf16 output
    nbytes = int(topk_ids.unique().numel()) * n2 * hidden + m * hidden + numel * n2 * 2
    floor = 0.0 if smoke else max(flops / matmul_rate(device, "fp8"), nbytes / copy_bandwidth(device))
    plain, ref, cfg = ours(xq, xs, wq, ws, topk_ids, n2, gated=False)
    plain()
    base = {"shape": name, "M": m, "floor_us": floor * 1e6}
    for label, gated in (("ours-gated", True), ("ours-plain", False)):
        run, _, c = ours(xq, xs, wq, ws, topk_ids, n2, gated) if gated else (plain, ref, cfg)
        t = 0.0 if smoke else do_bench_graph(run)
        record({**base, "kernel": label, "tile": [c.block_m, c.block_n, c.block_k, c.num_warps, c.num_stages],
                "us": t * 1e6, "pct_floor": 100 * floor / t if t else 0.0})
    sms = torch.cuda.get_device_properties(device).multi_processor_count if not smoke else 4
    for tile in TILES[:1] if smoke else TILES:
        st, a, sa = expert_rows(xq, xs, topk_ids, shape["E"], tile[0])
        c = torch.empty(a.shape[0], n2, dtype=torch.bfloat16, device=device)
        tiles = -(-a.shape[0] // tile[0]) * -(-n2 // tile[1])
        for mode, programs, ws_flag in (("persistent", sms, False), ("persistent-ws", sms, True),
                                        ("one-tile-each", tiles, False)):
            def run(a=a, sa=sa, st=st, c=c, tile=tile, programs=programs, ws_flag=ws_flag):
                contiguous_gemm(a, sa, wq, ws, st.expert_ids, st.num_post_padded, c, tile, programs, ws_flag)
            record(checked_time({**base, "kernel": f"contiguous-tma {mode}", "tile": list(tile)}, run, c, st, numel,
                                ref, floor, smoke))


def checked_time(row: dict, run, c: torch.Tensor, st, numel: int, ref: torch.Tensor, floor: float,
                 smoke: bool = False) -> dict:
    """`row` with a probe configuration's `max_rel_err` against `ref` (our GEMM's rows, which the sorted ids name)
    and, where it agrees, its time; an `error` where it disagrees or does not build (a result, not the probe's end)."""
    from harness.commands.bench import do_bench_graph

    try:
        c.zero_()
        run()
        used = int(st.num_post_padded.item())
        ids = st.sorted_ids[:used].long()
        valid = ids < numel
        got, want = c[:used][valid].float(), ref[ids[valid]].float()
        err = ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
        row["max_rel_err"] = err
        if not err < 1e-2:
            row["error"] = f"disagrees with our GEMM: max error {err:.3g} of the largest output"
            return row
        t = 0.0 if smoke else do_bench_graph(run)
        row.update(us=t * 1e6, pct_floor=100 * floor / t if t else 0.0)
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    return row


def recorder(path: str):
    """A function that prints a result row as a JSON line and appends it to `path` (if given) at once."""
    sink = open(path, "w") if path else None

    def record(row: dict) -> None:
        line = json.dumps(row)
        print(line, flush=True)
        if sink:
            sink.write(line + "\n")
            sink.flush()
    return record


def main() -> int:
    from harness.commands.bench import SHAPES

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="")
    p.add_argument("--shape", action="append", default=[])
    p.add_argument("--m", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args()
    if args.smoke:
        shapes, ms, device = {"tiny": {"E": 4, "k": 2, "K": 256, "N": 128}}, [8], "cpu"
    else:
        shapes = {s: SHAPES[s] for s in (args.shape or list(SHAPES))}
        ms, device = args.m, "cuda"
    record = recorder(args.out)
    for name, s in shapes.items():
        for m in ms:
            probe(name, s, m, device, record, args.smoke)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
