"""Per-kernel GPU time of one kernels.fused_experts call at the benchmark shapes (torch.profiler, GPU only).

    python scripts/profile_experts.py [--shape deepseek-v3] [--m 1 4096]

Shows where the time of a call goes (align, GEMM1, GEMM2, reduce, allocations) next to the roofline floor.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch.profiler import ProfilerActivity, profile

from harness.commands.bench import SHAPES
from harness.commands.bench.experts import _inputs, _weights
from kernels.fused_experts import fused_experts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", nargs="*", default=list(SHAPES))
    ap.add_argument("--m", nargs="*", type=int, default=[1, 4096])
    args = ap.parse_args()
    for name in args.shape:
        s = SHAPES[name]
        weights = _weights(s, "cuda")
        for m in args.m:
            inp = _inputs(s, m, weights, "cuda")
            call = (inp["x"], inp["w13"], inp["w2"], inp["topk_weights"], inp["topk_ids"])
            for _ in range(3):
                fused_experts(*call)
            torch.cuda.synchronize()
            reps = 10
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(reps):
                    fused_experts(*call)
                torch.cuda.synchronize()
            print(f"== {name} M={m}")
            for ev in sorted(prof.key_averages(), key=lambda e: -e.device_time_total):
                if ev.device_time_total > 0:
                    print(f"  {ev.key[:60]:60s} {ev.device_time_total / reps:9.1f} us/call  x{ev.count // reps}")
        del weights
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
