"""How long CUDA contexts created at once take, with every GPU visible to each process or only its own.

    python scripts/cuda_init_probe.py --procs 32 --gpus 0,1 [--own-gpu-only]

Starts `--procs` processes that import torch, wait until all have, then at one moment each make the primary context
of GPU `i mod len(gpus)` (`torch.cuda.set_device` and a one-element tensor there). `--own-gpu-only` gives each
process `CUDA_VISIBLE_DEVICES=<its GPU>` (the process then uses its `cuda:0`). Prints one JSON line: each process's
wall and CPU seconds of that step, and which GPUs each process holds a context on (from `nvidia-smi`, read while
all of them still hold theirs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import os, sys, time, json, resource
import torch
go, out, dev = sys.argv[1], sys.argv[2], int(sys.argv[3])
open(out + ".ready", "w").close()
while not os.path.exists(go):
    time.sleep(0.005)
t0, c0 = time.monotonic(), time.process_time()
torch.cuda.set_device(dev)
torch.zeros(1, device=f"cuda:{dev}")
torch.cuda.synchronize()
wall, cpu = time.monotonic() - t0, time.process_time() - c0
with open(out, "w") as f:
    json.dump({"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "pid": os.getpid()}, f)
while not os.path.exists(go + ".end"):
    time.sleep(0.02)
"""


def _contexts() -> dict[int, list[str]]:
    """pid -> the bus ids of the GPUs it holds a context on."""
    text = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_bus_id", "--format=csv,noheader"],
                          capture_output=True, text=True, check=False).stdout
    held: dict[int, list[str]] = {}
    for line in text.splitlines():
        pid, _, bus = line.partition(",")
        if pid.strip().isdigit():
            held.setdefault(int(pid), []).append(bus.strip())
    return held


def trial(procs: int, gpus: list[int], own_only: bool) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="cuda-init-"))
    go = tmp / "go"
    children = []
    for i in range(procs):
        gpu = gpus[i % len(gpus)]
        env = dict(os.environ)
        if own_only:
            env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        dev = 0 if own_only else gpu
        children.append(subprocess.Popen([sys.executable, "-c", CHILD, str(go), str(tmp / f"c{i}"), str(dev)],
                                         env=env))
    while sum((tmp / f"c{i}.ready").exists() for i in range(procs)) < procs:
        time.sleep(0.05)
    t0 = time.monotonic()
    go.touch()
    while sum((tmp / f"c{i}").exists() for i in range(procs)) < procs:
        time.sleep(0.01)
    all_done = time.monotonic() - t0
    time.sleep(0.5)
    held = _contexts()
    (tmp / "go.end").touch()
    for c in children:
        c.wait()
    rows = [json.loads((tmp / f"c{i}").read_text()) for i in range(procs)]
    pids = {r["pid"] for r in rows}
    walls = sorted(r["wall_s"] for r in rows)
    return {"procs": procs, "gpus": gpus, "own_gpu_only": own_only, "all_done_s": round(all_done, 2),
            "wall_s_median": walls[len(walls) // 2], "wall_s_max": walls[-1],
            "cpu_s_sum": round(sum(r["cpu_s"] for r in rows), 2),
            "contexts_per_process": sorted({len(v) for p, v in held.items() if p in pids}),
            "walls": walls}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--procs", type=int, default=16)
    ap.add_argument("--gpus", default="0")
    ap.add_argument("--own-gpu-only", action="store_true")
    a = ap.parse_args()
    print(json.dumps(trial(a.procs, [int(g) for g in a.gpus.split(",")], a.own_gpu_only)), flush=True)


if __name__ == "__main__":
    main()
