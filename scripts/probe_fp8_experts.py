"""Where the fp8 block-scaled (G128) experts path spends its time at large M, and which tiles fix it (GPU only).

For each shape and M: our default call, the same with fp8 fast accumulation (the tensor core's reduced-precision
sum within each K block, as vLLM's kernel runs), a sweep of GEMM1 tiles (with the default GEMM2 tile) and of
GEMM2 tiles (with the best GEMM1 tile), optionally vLLM's kernel (`--against-vllm PATH`), and a torch.profiler
breakdown (align, GEMM1, quant, GEMM2, reduce) of our default and of the best pair. Every timing is a CUDA-graph
replay with L2 flushed (harness.commands.bench.do_bench_graph). JSON lines to --out, a summary to stdout.

    python scripts/probe_fp8_experts.py --out probe.jsonl [--shape deepseek-v3] [--m 1024 4096] [--against-vllm W]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch.profiler import ProfilerActivity, profile

from harness.commands.bench import SHAPES, do_bench_graph
from harness.commands.bench.experts import _inputs, _weights, matmul_rate, quantize_weights, verify_rows
from kernels.fused_experts import Config, fused_experts, gemm_configs
from kernels.quant_gemm import ExpertsQuant

# (block_m, block_n, block_k, warps, stages); block_k <= 128 (one scale group per K block)
GEMM1 = [(128, 64, 128, 8, 3), (128, 64, 128, 4, 3), (128, 64, 128, 8, 4), (128, 128, 128, 8, 3),
         (128, 32, 128, 4, 4), (64, 64, 128, 4, 3), (64, 64, 128, 4, 4), (64, 128, 128, 4, 3), (64, 128, 128, 8, 3)]
GEMM2 = [(128, 128, 128, 8, 3), (128, 128, 128, 4, 3), (128, 256, 128, 8, 3), (128, 64, 128, 4, 4),
         (64, 128, 128, 4, 3), (64, 128, 128, 4, 4), (64, 256, 128, 8, 3), (64, 64, 128, 4, 4)]


def cfg(t: tuple[int, int, int, int, int], group_m: int = 8, split: bool = True) -> Config:
    bm, bn, bk, w, st = t
    return Config(bm, bn, bk, group_m=group_m, num_warps=w, num_stages=st, split_tail=split and bm == 128)


def breakdown(fn) -> list[tuple[str, float]]:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    return [(ev.key[:50], round(ev.device_time_total / 10, 1)) for ev in
            sorted(prof.key_averages(), key=lambda e: -e.device_time_total) if ev.device_time_total > 0][:8]


def probe_m(name: str, s: dict, m: int, weights, qw: dict, quant: ExpertsQuant, rate: float, moe, sweep: bool,
            record, modes: tuple[bool, ...] = (False, True)) -> None:
    """Default, fast accumulation, the tile sweep and vLLM at one (shape, M)."""
    dev = "cuda"
    inp = {**_inputs(s, m, weights, dev), **qw}
    call = (inp["x"], inp["w13"], inp["w2"], inp["topk_weights"], inp["topk_ids"])
    out = torch.empty_like(inp["x"])
    numel = m * s["k"]
    flops = 6 * numel * s["N"] * s["K"]
    floor = flops / rate
    default = gemm_configs(None, numel / min(s["E"], numel), s["N"], s["K"], torch.bfloat16, act=1,
                           experts=min(s["E"], numel), quant=quant)

    def timed(configs, fast: bool, which: str, extra: dict | None = None, call=call, out=out, m=m,
              name=name, floor=floor) -> float:
        try:
            t = do_bench_graph(lambda: fused_experts(*call, out=out, quant=quant, configs=configs,
                                                     fp8_fast_accum=fast), reps=20)
        except Exception as e:
            record({"shape": name, "M": m, "which": which, "error": f"{type(e).__name__}: {e}"[:300]})
            return float("inf")
        record({"shape": name, "M": m, "which": which, "fast": fast, "us": round(t * 1e6, 1),
                "pct_floor": round(100 * floor / t, 1), "gemm1": configs[0].__dict__,
                "gemm2": configs[1].__dict__, **(extra or {})})
        return t

    for fast in modes:
        timed(default, fast, "default")
        ok = verify_rows(inp, lambda fast=fast, call=call, out=out, d=default: fused_experts(
            *call, out=out, quant=quant, configs=d, fp8_fast_accum=fast), "triton-experts",
            scheme=("fp8_w8a8", quant.quant_format))()
        record({"shape": name, "M": m, "which": "verify-default", "fast": fast, "verify": ok or "pass"})
    record({"shape": name, "M": m, "which": "breakdown-default", "kernels": breakdown(
        lambda call=call, out=out, d=default: fused_experts(*call, out=out, quant=quant, configs=d))})
    best = {}
    if sweep:
        for fast in modes:
            results = []
            for bm in sorted({t[0] for t in GEMM1}):
                d2 = cfg(next(t for t in GEMM2 if t[0] == bm))
                g1 = [(timed((cfg(t), d2), fast, "gemm1"), t) for t in GEMM1 if t[0] == bm]
                b1 = min(g1)[1]
                g2 = [(timed((cfg(b1), cfg(t)), fast, "gemm2"), t) for t in GEMM2 if t[0] == bm]
                tb, b2 = min(g2)
                results.append((tb, b1, b2))
            tb, b1, b2 = min(results)
            for gm in (1, 16, 32):
                t = timed((cfg(b1, gm), cfg(b2, gm)), fast, "group_m", {"group_m": gm})
                results.append((t, b1, b2))
            best[fast] = (b1, b2)
            record({"shape": name, "M": m, "which": "best", "fast": fast, "us": round(tb * 1e6, 1),
                    "pct_floor": round(100 * floor / tb, 1), "gemm1": b1, "gemm2": b2})
        best_pair = (cfg(best[True][0]), cfg(best[True][1]))
        record({"shape": name, "M": m, "which": "breakdown-best-fast", "kernels": breakdown(
            lambda: fused_experts(*call, out=out, quant=quant, configs=best_pair, fp8_fast_accum=True))})
    if moe is not None:
        from harness.commands.bench import _vllm

        vcfg, source = moe.config(m, s["E"], s["N"], s["K"], s["k"], "fp8_w8a8",
                                  [128, 128] if quant.quant_format == "G128" else None)

        def vllm(call=call, vcfg=vcfg):
            return _vllm.fused_experts(moe, *call, quant_type="fp8_w8a8", quant_format=quant.quant_format,
                                       w13_scale=qw["w13_scale"], w2_scale=qw["w2_scale"], config=vcfg)

        t = do_bench_graph(vllm, reps=20)
        record({"shape": name, "M": m, "which": "vllm", "config": source, "cfg": vcfg,
                "us": round(t * 1e6, 1), "pct_floor": round(100 * floor / t, 1)})
        record({"shape": name, "M": m, "which": "breakdown-vllm", "kernels": breakdown(vllm)})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", nargs="*", default=["deepseek-v3"])
    ap.add_argument("--m", nargs="*", type=int, default=[1024, 4096])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--against-vllm", default=None)
    ap.add_argument("--sweep", action="store_true", help="also sweep the tile lists")
    ap.add_argument("--format", default="G128", choices=("G128", "A", "T"), help="fp8 activation/weight scales")
    ap.add_argument("--fast-only", action="store_true", help="only fp8 fast accumulation")
    args = ap.parse_args()
    dev = "cuda"
    rate = matmul_rate(dev, "fp8")
    moe = None
    if args.against_vllm:
        from harness.commands.bench import _vllm

        moe = _vllm.load(args.against_vllm)
    print(f"fp8 dense rate {rate / 1e12:.0f} TFLOP/s", flush=True)
    with args.out.open("w") as log:
        def record(row: dict) -> None:
            log.write(json.dumps(row) + "\n")
            log.flush()
            print(json.dumps(row), flush=True)

        record({"device": torch.cuda.get_device_name(), "fp8_tflops": rate / 1e12})
        for name in args.shape:
            s = SHAPES[name]
            weights = _weights(s, dev)
            t0 = time.time()
            qw = quantize_weights(weights, "fp8_w8a8", args.format, dev)
            record({"shape": name, "quantize_s": round(time.time() - t0, 1)})
            quant = ExpertsQuant("fp8_w8a8", args.format, qw["w13_scale"], qw["w2_scale"])
            for m in args.m:
                probe_m(name, s, m, weights, qw, quant, rate, moe, args.sweep, record,
                        (True,) if args.fast_only else (False, True))
            del weights, qw
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
