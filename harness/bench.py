"""`python -m harness bench`: timings on the GPU (never asserted in tests).

`--op reference-experts` times the reference experts oracle at model shapes: it must be fast enough to be the oracle
for real shapes (DeepSeek-V3-like M=4096, E=256, k=8, K=7168, N=512 in well under a second on one GPU).
"""

from __future__ import annotations

import time

import torch

SHAPES = {
    "deepseek-v3": {"M": 4096, "E": 256, "k": 8, "K": 7168, "N": 512},
    "mixtral-tp2": {"M": 4096, "E": 8, "k": 2, "K": 4096, "N": 7168},
    "qwen3-30b-a3b": {"M": 4096, "E": 128, "k": 8, "K": 2048, "N": 768},
}


def _time(fn, device: str, reps: int = 3) -> float:  # type: ignore[no-untyped-def]
    fn()  # warm-up
    times = []
    for _ in range(reps):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def bench_reference_experts(device: str, shapes: list[str], dtype: torch.dtype = torch.bfloat16) -> list[dict]:
    from reference.experts import fused_experts

    rows = []
    for name in shapes:
        s = SHAPES[name]
        g = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(s["M"], s["K"], generator=g, device=device).to(dtype)
        w13 = (torch.randn(s["E"], 2 * s["N"], s["K"], generator=g, device=device) / s["K"] ** 0.5).to(dtype)
        w2 = (torch.randn(s["E"], s["K"], s["N"], generator=g, device=device) / s["N"] ** 0.5).to(dtype)
        logits = torch.randn(s["M"], s["E"], generator=g, device=device)
        w, ids = torch.topk(logits.softmax(-1), s["k"], dim=-1)
        ids = ids.to(torch.int32)
        for compute in (torch.float32,):
            t = _time(lambda: fused_experts(x, w13, w2, w, ids, compute_dtype=compute), device)  # noqa: B023
            flops = 2 * s["M"] * s["k"] * (2 * s["N"] * s["K"] + s["K"] * s["N"])
            rows.append({"shape": name, **s, "compute": str(compute).removeprefix("torch."), "median_s": t,
                         "tflops": flops / t / 1e12})
    return rows


def main_bench(op: str, device: str, shapes: list[str]) -> int:
    from tabulate import tabulate

    if op != "reference-experts":
        print(f"error: unknown bench op {op!r}; available: reference-experts (stage kernels arrive with issue 5)")
        return 2
    rows = bench_reference_experts(device, shapes)
    print(tabulate(rows, headers="keys", floatfmt=".4g", tablefmt="github"))
    return 0
