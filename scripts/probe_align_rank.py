"""Ranking align's in-chunk entries by its sorting network or by counting pairs: compile and run times (GPU probe)

`kernels.align`'s scatter kernel places each chunk's entries by their stable rank, the count of entries of the same
expert before them in the chunk. It gets that rank two ways, and this probe times each in a kernel of its own over
the same ids:
- `network`: `_bitonic_sort` of the (expert, index) keys, the rank read off the sorted chunk: fast at any chunk, but
  unrolled, so its compile grows with the chunk (the product's way for chunks over 64);
- `count`: `_rank_by_count`, all pairs of the chunk compared 32 columns at a time in a runtime loop: its code does
  not grow with the chunk, its work grows with the chunk's square (the product's way for chunks up to 64).
Both are checked against a torch reference (and so against each other) before they are timed (CUDA-graph
replays, L2 flushed); each variant's first call in a fresh Triton cache is its compile. `--plant` adds one to every
`count` rank: every check must then fail.

    python scripts/probe_align_rank.py [--ids 32768 4194304] [--chunk 256 1024 4096] [--out probe.jsonl]
    python scripts/probe_align_rank.py --smoke [--plant]   # tiny sizes in Triton's interpreter (no timing)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch
import triton
import triton.language as tl
from probe_fp8_contiguous import recorder

from harness.commands.bench import do_bench_graph
from kernels.align import _bins, _bitonic_sort, _rank_by_count

E = 256  # DeepSeek-V3's experts; bins are expert ids (no map)


@triton.jit
def _rank_network(ids_ptr, rank_ptr, first_ptr, numel, E, CHUNK: tl.constexpr, LOG_CHUNK: tl.constexpr,
                  NB: tl.constexpr):
    chunk = tl.program_id(0)
    local = tl.arange(0, CHUNK)
    b = _bins(ids_ptr, ids_ptr, chunk * CHUNK + local, numel, E, False, False)
    # each expert's first place in the sorted chunk, as the product finds it: its chunk histogram's exclusive scan
    own = tl.histogram(b, NB)
    tl.store(first_ptr + chunk * NB + tl.arange(0, NB), tl.cumsum(own, axis=0) - own)
    tl.debug_barrier()
    keys = _bitonic_sort((b << LOG_CHUNK) | local, LOG_CHUNK)
    e = keys >> LOG_CHUNK
    first = tl.load(first_ptr + chunk * NB + e)
    src = chunk * CHUNK + (keys & (CHUNK - 1))
    tl.store(rank_ptr + src, local - first, mask=(e < E) & (src < numel))


@triton.jit
def _rank_count(ids_ptr, rank_ptr, numel, E, CHUNK: tl.constexpr, PLANT: tl.constexpr):
    chunk = tl.program_id(0)
    local = tl.arange(0, CHUNK)
    b = _bins(ids_ptr, ids_ptr, chunk * CHUNK + local, numel, E, False, False)
    rank = _rank_by_count(ids_ptr, ids_ptr, b, chunk, numel, E, False, False, CHUNK)
    keep = (b < E) & (chunk * CHUNK + local < numel)
    tl.store(rank_ptr + chunk * CHUNK + local, rank + PLANT, mask=keep)


def reference_rank(ids: torch.Tensor, chunk: int) -> torch.Tensor:
    """Each id's count of equal ids before it in its chunk (stable rank), on the CPU."""
    flat = ids.reshape(-1).cpu().long()
    out = torch.empty_like(flat)
    for c0 in range(0, flat.numel(), chunk):
        part = flat[c0:c0 + chunk]
        order = torch.argsort(part * part.numel() + torch.arange(part.numel()))  # stable by (id, index)
        sorted_ids = part[order]
        first = torch.searchsorted(sorted_ids, sorted_ids, right=False)
        rank = torch.empty_like(part)
        rank[order] = torch.arange(part.numel()) - first
        out[c0:c0 + chunk] = rank
    return out.to(torch.int32)


def run(way: str, ids: torch.Tensor, chunk: int, plant: int) -> torch.Tensor:
    numel = ids.numel()
    rank = torch.full((numel,), -1, dtype=torch.int32, device=ids.device)
    grid = (triton.cdiv(numel, chunk),)
    warps = 4 if chunk <= 1024 else 8
    if way == "network":
        nb = max(32, triton.next_power_of_2(E + 1))
        first = torch.empty((grid[0], nb), dtype=torch.int32, device=ids.device)
        _rank_network[grid](ids, rank, first, numel, E, CHUNK=chunk, LOG_CHUNK=chunk.bit_length() - 1, NB=nb,
                            num_warps=warps)
    else:
        _rank_count[grid](ids, rank, numel, E, CHUNK=chunk, PLANT=plant, num_warps=warps, num_stages=1)
    return rank


def probe(numel: int, chunk: int, device: str, plant: int, record) -> list[dict]:
    g = torch.Generator(device=device).manual_seed(numel)
    rows = max(1, numel // 8)
    ids = torch.rand((rows, E), generator=g, device=device).topk(8, dim=1).indices.to(torch.int32).reshape(-1)
    want = reference_rank(ids, chunk)
    rows_out = []
    for way in ("network", "count"):
        t0 = time.perf_counter()
        got = run(way, ids, chunk, plant if way == "count" else 0)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        wrong = int((got.cpu() != want).sum())
        row = {"ids": ids.numel(), "chunk": chunk, "way": way, "first_call_s": round(first_s, 3),
               "verified": "yes" if wrong == 0 else f"no: {wrong} ranks differ"}
        if wrong == 0 and device.startswith("cuda"):
            row["us"] = round(do_bench_graph(lambda w=way: run(w, ids, chunk, 0)) * 1e6, 2)
        rows_out.append(row)
        record(row)
    return rows_out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ids", type=int, nargs="+", default=[32768, 4194304])
    ap.add_argument("--chunk", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--out", default=None, help="write the rows as JSON lines to this file as they come")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes in the interpreter, no timing")
    ap.add_argument("--plant", action="store_true", help="add one to every `count` rank (its checks must fail)")
    a = ap.parse_args()
    device = "cpu" if a.smoke else "cuda"
    sizes = [(200, 64), (77, 16)] if a.smoke else [(n, c) for n in a.ids for c in a.chunk]
    record = recorder(a.out)
    rows = [r for n, c in sizes for r in probe(n, c, device, int(a.plant), record)]
    return 0 if all(r["verified"] == "yes" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
