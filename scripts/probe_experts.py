"""Where a fused-experts scheme spends its time, and which tiles fix it (GPU only).

For each shape and M: our default call (fp8: also with fast accumulation, the tensor core's reduced-precision sum
within each K block, as vLLM's kernel runs), verified against the oracle; the tile pairs given with --tiles; with
--sweep, a sweep of GEMM1 tiles (with the default GEMM2 tile) and of GEMM2 tiles (with the best GEMM1 tile);
optionally vLLM's kernel (`--against-vllm PATH`, fp8); and a torch.profiler breakdown (align, GEMM1, quant,
GEMM2, reduce). Every timing is a CUDA-graph replay with L2 flushed (harness.commands.bench.do_bench_graph).
JSON lines to --out, a summary to stdout.

    python scripts/probe_experts.py --out probe.jsonl [--shape deepseek-v3] [--quant fp8_w8a8:G128] [--m 1024 4096]
        [--tiles 64,128,128,8,3,j/64,128,128,4,3 ...] [--sweep] [--against-vllm W]

A tile is block_m,block_n,block_k,warps,stages[,j] (j: GEMM1 computes gate and up in one joint dot); after "/"
the GEMM2 tile block_n,block_k,warps,stages (default: the sweep list's first tile of that block_m).
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

from harness.commands.bench import SHAPES, copy_bandwidth, do_bench_graph
from harness.commands.bench.experts import _point, _weights, matmul_rate, quantize_weights, rate_kind, verify_rows
from kernels.fused_experts import Config, fused_experts, gemm_configs
from kernels.quant_gemm import FORMATS, ExpertsQuant

# (block_m, block_n, block_k, warps, stages); block_k <= 128 (one scale group per K block)
GEMM1 = [(128, 64, 128, 8, 3), (128, 64, 128, 4, 3), (128, 64, 128, 8, 4), (128, 128, 128, 8, 3),
         (128, 32, 128, 4, 4), (64, 64, 128, 4, 3), (64, 64, 128, 4, 4), (64, 128, 128, 4, 3), (64, 128, 128, 8, 3)]
GEMM2 = [(128, 128, 128, 8, 3), (128, 128, 128, 4, 3), (128, 256, 128, 8, 3), (128, 64, 128, 4, 4),
         (64, 128, 128, 4, 3), (64, 128, 128, 4, 4), (64, 256, 128, 8, 3), (64, 64, 128, 4, 4)]


def cfg(t: tuple, group_m: int = 8, split: bool = True) -> Config:
    bm, bn, bk, w, st, *joint = t
    return Config(bm, bn, bk, group_m=group_m, num_warps=w, num_stages=st, split_tail=split and bm == 128,
                  joint_gate_up=bool(joint and joint[0]))


def parse_tiles(spec: str) -> tuple[Config, Config]:
    """'bm,bn,bk,w,s[,j][/bn2,bk2,w2,s2]' -> (GEMM1, GEMM2) configs."""
    one, _, two = spec.partition("/")
    f = one.split(",")
    flags = f[5:]
    if len(f) < 5 or flags not in ([], ["j"]):
        raise SystemExit(f"--tiles: expected bm,bn,bk,warps,stages[,j][/bn,bk,warps,stages], got {spec!r}")
    t1 = (*map(int, f[:5]), "j" in flags)
    t2 = (t1[0], *map(int, two.split(","))) if two else next(t for t in GEMM2 if t[0] == t1[0])
    return cfg(t1), cfg(t2)


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


def probe_m(name: str, s: dict, m: int, weights, qw: dict, scheme: tuple[str, str], moe, sweep: bool,
            tiles: list[str], record, modes: tuple[bool, ...], profile_default: bool) -> None:
    """Default, fast accumulation, the given tiles, the tile sweep and vLLM at one (shape, M)."""
    p = _point(name, s, m, scheme, weights, qw, "cuda")  # the bench's inputs and floor
    inp, quant, floor = p.inp, p.quant, p.floor
    call = (inp["x"], inp["w13"], inp["w2"], inp["topk_weights"], inp["topk_ids"])
    out = torch.empty_like(inp["x"])
    numel = m * s["k"]
    def default(fast: bool) -> tuple:
        return gemm_configs(None, numel / min(s["E"], numel), s["N"], s["K"], torch.bfloat16, act=1,
                            experts=min(s["E"], numel), quant=quant, fp8_fast=fast)

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

    def verify(configs, fast: bool, which: str) -> None:
        def rerun(sub: dict, fast=fast, d=configs):  # per-tensor scales span all rows: judge the sub-problem's run
            q = ExpertsQuant(*scheme, sub["w13_scale"], sub["w2_scale"])
            return fused_experts(sub["x"], sub["w13"], sub["w2"], sub["topk_weights"], sub["topk_ids"], quant=q,
                                 configs=d, fp8_fast_accum=fast)

        ok = verify_rows(inp, lambda fast=fast, call=call, out=out, d=configs: fused_experts(
            *call, out=out, quant=quant, configs=d, fp8_fast_accum=fast), "triton-experts", scheme=scheme,
            rerun=rerun if scheme[1] == "T" and m > 1 else None)()
        record({"shape": name, "M": m, "which": f"verify-{which}", "fast": fast, "verify": ok or "pass"})

    for fast in modes:
        timed(default(fast), fast, "default")
        verify(default(fast), fast, "default")
    if profile_default:
        d0 = default(False)
        record({"shape": name, "M": m, "which": "breakdown-default", "kernels": breakdown(
            lambda call=call, out=out, d=d0: fused_experts(*call, out=out, quant=quant, configs=d))})
    for spec in tiles:
        pair = parse_tiles(spec)
        for fast in modes:
            if timed(pair, fast, "tiles", {"spec": spec}) < float("inf"):
                verify(pair, fast, "tiles")
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
        b1, b2 = best[modes[-1]]
        record({"shape": name, "M": m, "which": "breakdown-best", "kernels": breakdown(
            lambda: fused_experts(*call, out=out, quant=quant, configs=(cfg(b1), cfg(b2)),
                                  fp8_fast_accum=modes[-1]))})
    if moe is not None and (quant is None or quant.w8a8):
        probe_vllm(name, s, m, call, qw, quant, floor, moe, record)


def probe_vllm(name: str, s: dict, m: int, call: tuple, qw: dict, quant, floor: float, moe, record) -> None:
    """vLLM's kernel (its config for this device, or its default) on the same inputs, and its profile."""
    from harness.commands.bench import _vllm

    qt, qf = (quant.quant_type, quant.quant_format) if quant is not None else ("none", "-")
    vcfg, source = moe.config(m, s["E"], s["N"], s["K"], s["k"], None if quant is None else qt,
                              [128, 128] if qf == "G128" else None)

    def vllm():
        return _vllm.fused_experts(moe, *call, quant_type=qt, quant_format=qf, w13_scale=qw.get("w13_scale"),
                                   w2_scale=qw.get("w2_scale"), config=vcfg)

    t = do_bench_graph(vllm, reps=20)
    record({"shape": name, "M": m, "which": "vllm", "config": source, "cfg": vcfg,
            "us": round(t * 1e6, 1), "pct_floor": round(100 * floor / t, 1)})
    record({"shape": name, "M": m, "which": "breakdown-vllm", "kernels": breakdown(vllm)})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", nargs="*", default=["deepseek-v3"])
    ap.add_argument("--m", nargs="*", type=int, default=[1024, 4096])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quant", default="fp8_w8a8:G128", help="TYPE:FORMAT (none for bf16)")
    ap.add_argument("--tiles", nargs="*", default=[], help="tile pairs to time (see the module docstring)")
    ap.add_argument("--against-vllm", default=None)
    ap.add_argument("--sweep", action="store_true", help="also sweep the tile lists")
    ap.add_argument("--fast-only", action="store_true", help="fp8: only fast accumulation")
    ap.add_argument("--default-only", action="store_true", help="fp8: only the default accumulation")
    ap.add_argument("--no-breakdown", action="store_true", help="skip the profile of the default")
    args = ap.parse_args()
    dev = "cuda"
    qt, _, qf = args.quant.partition(":")
    if qt != "none" and qf not in FORMATS.get(qt, ()):
        raise SystemExit(f"--quant: expected none or TYPE:FORMAT of {FORMATS}, got {args.quant!r}")
    fp8 = qt == "fp8_w8a8"
    rate = matmul_rate(dev, rate_kind(qt))
    bw = copy_bandwidth(dev)
    moe = None
    if args.against_vllm:
        from harness.commands.bench import _vllm

        moe = _vllm.load(args.against_vllm)
    print(f"dense rate {rate / 1e12:.0f} TFLOP/s, copy {bw / 1e9:.0f} GB/s", flush=True)
    with args.out.open("w") as log:
        def record(row: dict) -> None:
            log.write(json.dumps(row) + "\n")
            log.flush()
            print(json.dumps(row), flush=True)

        record({"device": torch.cuda.get_device_name(), "tflops": rate / 1e12, "copy_gbs": bw / 1e9,
                "quant": args.quant})
        for name in args.shape:
            s = SHAPES[name]
            weights = _weights(s, dev)
            t0 = time.time()
            qw = quantize_weights(weights, qt, qf, dev)
            record({"shape": name, "quantize_s": round(time.time() - t0, 1)})
            modes = (True,) if args.fast_only else (False, True) if fp8 and not args.default_only else (False,)
            for m in args.m:
                probe_m(name, s, m, weights, qw, (qt, qf or "-"), moe, args.sweep, args.tiles, record, modes,
                        not args.no_breakdown)
            del weights, qw
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
