"""Offline tile sweep of kernels.fused_experts at the benchmark shapes (GPU only; feeds `choose_config`).

For every (shape, M) of `harness/benchmarks/experts.py`: the candidate BLOCK_M values for its rows per expert, and
for each, a list of GEMM1 tiles (timed with that BLOCK_M's default GEMM2 tile), then GEMM2 tiles (with the best
GEMM1 tile). Times are CUDA-graph replays (`harness.commands.bench`). The default (`choose_config`) is timed
too, so each line says what the heuristic leaves on the table. Compiles run first, in a pool of processes, on a
small problem with the same specialization (the GEMM kernel does not specialize on M or the routing).

    python scripts/tune_experts.py --out tune.jsonl [--shape deepseek-v3] [--m 1 4096] [--workers 12]
    python scripts/tune_experts.py --split --out split.jsonl     # choose_config's tiles, split tail off vs on

--split times, for every BLOCK_M the rows allow, choose_config's tile tables with `split_tail` off and on (a
tail block whose rows fit in half the block runs a half-height tile).

Every timing is a JSON line in --out; a summary table goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from harness.commands.bench import SHAPES, do_bench_graph
from harness.commands.bench.experts import M_VALUES, _inputs, _weights
from kernels.fused_experts import _GATED_TILES, _PLAIN_TILES, Config, choose_config, fused_experts

# (block_n, block_k, num_warps, num_stages); gated GEMM1 holds two block_n-wide accumulators
GEMM1 = {
    16: [(32, 128, 4, 4), (16, 128, 4, 4), (64, 128, 4, 4), (32, 256, 4, 3), (64, 256, 4, 3), (32, 64, 4, 6),
         (64, 64, 4, 5), (16, 256, 4, 4)],
    32: [(32, 128, 4, 4), (16, 128, 4, 4), (64, 128, 4, 4), (32, 256, 4, 3), (64, 64, 4, 5), (32, 64, 4, 6),
         (64, 128, 8, 4), (128, 64, 4, 4)],
    64: [(64, 64, 4, 4), (64, 64, 8, 4), (128, 64, 8, 3), (32, 128, 4, 4), (64, 128, 4, 3), (64, 128, 8, 3),
         (128, 32, 8, 4), (32, 64, 4, 5)],
    128: [(64, 64, 8, 4), (64, 64, 4, 4), (64, 128, 8, 3), (32, 64, 4, 4), (32, 128, 8, 4), (64, 32, 8, 5),
          (128, 32, 8, 4), (64, 64, 8, 3)],
}
GEMM2 = {
    16: [(64, 128, 4, 4), (32, 128, 4, 4), (128, 128, 4, 3), (64, 256, 4, 3), (128, 64, 4, 4), (64, 64, 4, 6),
         (256, 64, 8, 3), (32, 256, 4, 3)],
    32: [(64, 128, 4, 4), (32, 128, 4, 4), (128, 128, 4, 3), (64, 256, 4, 3), (128, 64, 4, 4), (64, 64, 4, 6),
         (256, 64, 8, 3), (128, 128, 8, 3)],
    64: [(128, 64, 4, 4), (128, 64, 8, 4), (64, 64, 4, 4), (256, 64, 8, 3), (128, 128, 8, 3), (64, 128, 4, 3),
         (256, 32, 8, 4), (128, 32, 4, 5)],
    128: [(128, 64, 8, 3), (128, 64, 8, 4), (256, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 4), (256, 32, 8, 4),
          (64, 128, 8, 3), (128, 32, 8, 5)],
}


def block_ms(rows: float) -> list[int]:
    if rows <= 4:
        return [16]
    if rows <= 12:
        return [16, 32]
    if rows <= 40:
        return [16, 32, 64]
    if rows <= 160:
        return [32, 64, 128]
    return [64, 128]


def cfg(bm: int, t: tuple[int, int, int, int], group_m: int) -> Config:
    bn, bk, w, s = t
    return Config(bm, bn, bk, group_m=group_m, num_warps=w, num_stages=s)


def splits(bm: int) -> tuple[bool, ...]:
    """split_tail values to time at this BLOCK_M (its half-height tile needs 16 rows for tl.dot)."""
    return (False, True) if bm >= 32 else (False,)


def table_pair(bm: int, split: bool) -> tuple[Config, Config]:
    """choose_config's tiles for this BLOCK_M (its tables), with or without the split tail."""
    gm = 1 if bm <= 32 else 8
    (n1, k1, w1, s1), (n2, k2, w2, s2) = _GATED_TILES[bm], _PLAIN_TILES[bm]
    return (Config(bm, n1, k1, gm, w1, s1, split_tail=split), Config(bm, n2, k2, gm, w2, s2, split_tail=split))


def plans(bm: int) -> list[tuple[Config, Config]]:
    """Every (GEMM1, GEMM2) pair the sweep may time for this BLOCK_M (for the compile pool)."""
    gm = 1 if bm <= 32 else 8
    d1, d2 = cfg(bm, GEMM1[bm][0], gm), cfg(bm, GEMM2[bm][0], gm)
    return [(cfg(bm, t, gm), d2) for t in GEMM1[bm]] + [(d1, cfg(bm, t, gm)) for t in GEMM2[bm]]


def _compile(jobs: list[tuple[Config, Config]]) -> list[str]:
    """Run each pair once on a small problem with the benchmark's specialization (K, N multiples of 256)."""
    torch.manual_seed(0)
    dev = "cuda"
    e, m, k, hidden, n = 4, 64, 2, 1024, 512
    x = torch.randn(m, hidden, device=dev, dtype=torch.bfloat16)
    w13 = torch.randn(e, 2 * n, hidden, device=dev, dtype=torch.bfloat16)
    w2 = torch.randn(e, hidden, n, device=dev, dtype=torch.bfloat16)
    ids = torch.randint(0, e, (m, k), device=dev, dtype=torch.int32)
    tw = torch.rand(m, k, device=dev)
    errors = []
    for c1, c2 in jobs:
        try:
            fused_experts(x, w13, w2, tw, ids, configs=(c1, c2))
        except Exception as err:  # a tile that does not fit is reported and skipped by the sweep
            errors.append(f"{c1} {c2}: {type(err).__name__}: {str(err)[:200]}")
    torch.cuda.synchronize()
    return errors


def precompile(all_jobs: list[tuple[Config, Config]], workers: int) -> None:
    t0 = time.time()
    unique = list(dict.fromkeys(all_jobs))
    chunks = [unique[i::workers] for i in range(workers)]
    with mp.get_context("spawn").Pool(workers) as pool:
        for errs in pool.imap_unordered(_compile, chunks):
            for err in errs:
                print("compile:", err, file=sys.stderr)
    print(f"precompiled {len(unique)} tile pairs in {time.time() - t0:.0f}s", file=sys.stderr, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", nargs="*", default=list(SHAPES))
    ap.add_argument("--m", nargs="*", type=int, default=list(M_VALUES))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--split", action="store_true", help="only the tables' tiles, split tail off and on")
    args = ap.parse_args()
    dev = "cuda"
    points = []
    for name in args.shape:
        s = SHAPES[name]
        for m in args.m:
            numel = m * s["k"]
            points.append((name, m, numel / min(s["E"], numel)))
    bms = sorted({bm for *_, rows in points for bm in block_ms(rows)})
    if args.split:
        precompile([table_pair(bm, sp) for bm in bms for sp in splits(bm)], args.workers)
    else:
        precompile([p for bm in bms for p in plans(bm)], args.workers)
    summary = []
    with args.out.open("w") as log:
        for name in args.shape:
            s = SHAPES[name]
            weights = _weights(s, dev)
            for m in args.m:
                inp = _inputs(s, m, weights, dev)
                call = (inp["x"], inp["w13"], inp["w2"], inp["topk_weights"], inp["topk_ids"])
                out = torch.empty_like(inp["x"])
                numel = m * s["k"]
                rows = numel / min(s["E"], numel)

                def timed(c1: Config, c2: Config, which: str, call=call, out=out, name=name, m=m,
                          rows=rows) -> float:
                    try:
                        t = do_bench_graph(lambda: fused_experts(*call, out=out, configs=(c1, c2)), reps=20)
                    except Exception as err:
                        print(f"{name} M={m} {c1} {c2}: {type(err).__name__}: {str(err)[:200]}", file=sys.stderr)
                        return float("inf")
                    log.write(json.dumps({"shape": name, "M": m, "rows": rows, "which": which,
                                          "gemm1": c1.__dict__, "gemm2": c2.__dict__, "us": t * 1e6}) + "\n")
                    log.flush()
                    return t

                default = (choose_config(rows, s["N"], s["K"], torch.bfloat16, gated=True),
                           choose_config(rows, s["K"], s["N"], torch.bfloat16, gated=False))
                t_default = timed(*default, "default")
                best = (t_default, default)
                if args.split:
                    for bm in block_ms(rows):
                        for sp in splits(bm):
                            t = timed(*table_pair(bm, sp), f"split={sp}")
                            if t < best[0]:
                                best = (t, table_pair(bm, sp))
                for bm in ([] if args.split else block_ms(rows)):
                    gm = 1 if bm <= 32 else 8
                    c2 = cfg(bm, GEMM2[bm][0], gm)
                    _, c1 = min(((timed(cfg(bm, t, gm), c2, "gemm1"), cfg(bm, t, gm)) for t in GEMM1[bm]),
                                 key=lambda r: r[0])
                    t2, c2 = min(((timed(c1, cfg(bm, t, gm), "gemm2"), cfg(bm, t, gm)) for t in GEMM2[bm]),
                                 key=lambda r: r[0])
                    if t2 < best[0]:
                        best = (t2, (c1, c2))
                row = {"shape": name, "M": m, "rows": round(rows, 2), "default_us": round(t_default * 1e6, 1),
                       "best_us": round(best[0] * 1e6, 1), "gain": round(t_default / best[0], 3),
                       "gemm1": best[1][0].__dict__, "gemm2": best[1][1].__dict__}
                summary.append(row)
                print(json.dumps(row), flush=True)
            del weights
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
