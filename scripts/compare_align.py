"""Time `kernels.align.moe_align_block_size` of this tree against the same file at another git revision (GPU).

Both versions build the layout of the same routings (top-k of random scores, decode to prefill sizes, E = 8 to 256,
block sizes 16 and 64); their three outputs must be equal, element for element, before either is timed. Times: the
median replay of a CUDA graph holding one call (the GPU's time, L2 flushed; `harness.commands.bench.do_bench_graph`)
and the mean of 200 eager calls (mostly Python's launch of the kernels at these sizes). One JSON line per point.

    python scripts/compare_align.py --against 60f37ec [--out rows.jsonl]   # or --against a copy of the file
    python scripts/compare_align.py --against HEAD --smoke [--plant]   # tiny sizes in the interpreter, no timing

`--plant` swaps two entries of this tree's sorted_token_ids: every point must then fail its check (exit 1).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch
from probe_fp8_contiguous import recorder

from harness.commands.bench import do_bench_graph

ROOT = Path(__file__).resolve().parents[1]
#: (tokens, top-k, experts)
POINTS = [(8, 8, 256), (32, 8, 256), (256, 8, 256), (1024, 2, 8), (4096, 2, 8), (4096, 8, 128), (4096, 8, 256),
          (8192, 8, 256)]
SMOKE_POINTS = [(5, 2, 8), (40, 8, 64)]


def load_at(rev: str, folder: str) -> object:
    """kernels/align.py as it was at `rev` (or the file `rev` names), imported under a name of its own."""
    path = Path(rev)
    if not path.is_file():
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:kernels/align.py"], capture_output=True,
                              text=True, check=True).stdout
        path = Path(folder) / "align_at_rev.py"
        path.write_text(text)
    spec = importlib.util.spec_from_file_location("align_at_rev", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def eager_s(fn, calls: int = 200) -> float:  # type: ignore[no-untyped-def]
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls


def compare(ours, theirs, m: int, k: int, e: int, bs: int, device: str, plant: bool) -> dict:  # type: ignore[no-untyped-def]
    g = torch.Generator(device=device).manual_seed(m * 1000 + e)
    ids = torch.rand((m, e), generator=g, device=device).topk(k, dim=1).indices.to(torch.int32)
    got = [t.clone() for t in ours.moe_align_block_size(ids, bs, e)]
    if plant:
        got[0][[0, 1]] = got[0][[1, 0]]
    want = theirs.moe_align_block_size(ids, bs, e)
    differ = [name for name, a, b in zip(("sorted_token_ids", "expert_ids", "num_tokens_post_padded"), got, want)
              if not torch.equal(a, b)]
    row = {"ids": m * k, "E": e, "block_size": bs, "verified": "yes" if not differ else f"no: {', '.join(differ)}"}
    if not differ and device == "cuda":
        for name, mod in (("ours", ours), ("against", theirs)):
            def call(mod=mod):  # type: ignore[no-untyped-def]
                return mod.moe_align_block_size(ids, bs, e)
            row[f"{name}_graph_us"] = round(do_bench_graph(call) * 1e6, 2)
            row[f"{name}_eager_us"] = round(eager_s(call) * 1e6, 2)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--against", required=True, help="git revision whose kernels/align.py is timed beside this one, "
                    "or a copy of that file (where there is no git history)")
    ap.add_argument("--out", default=None, help="write the rows as JSON lines to this file as they come")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes in the interpreter, no timing")
    ap.add_argument("--plant", action="store_true", help="swap two of this tree's entries (every check must fail)")
    a = ap.parse_args()
    from kernels import align as ours

    device = "cpu" if a.smoke else "cuda"
    if a.smoke:
        # the interpreter as the harness runs it (Triton 3.6's own cannot index a loop by a scalar argument)
        from harness.engine import interpreter

        interpreter.install()
    record = recorder(a.out)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        theirs = load_at(a.against, folder)
        for m, k, e in SMOKE_POINTS if a.smoke else POINTS:
            for bs in (16, 64):
                row = {"against": a.against, **compare(ours, theirs, m, k, e, bs, device, a.plant)}
                record(row)
                rows.append(row)
    return 0 if all(r["verified"] == "yes" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
