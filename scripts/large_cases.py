"""Each GPU adapter's case past 2**31 elements (`harness.ops.large`), judged in its kernel host one at a time.

For every adapter named (default: those this repository ships for a GPU), its large-offsets case under the
`thorough` profile, judged as the generic test judges it: one tab-separated line with the adapter, op, verdict,
wall time, the arena kinds it was handed (`cuda`: the device arena), its shapes, the machine's peak GPU memory
above its level before the case (sampled every 20 ms, every process's), the judge's own torch peak, and the
reason of a verdict other than pass. This is how docs/PERFORMANCE.md's table of large cases was measured.

    python scripts/large_cases.py                              # every shipped GPU adapter
    python scripts/large_cases.py triton-group-quant --hold 12 # with all but 12 GiB of the GPU held elsewhere
    python scripts/large_cases.py --list --generation sm90     # the cases only (no GPU needed)

--hold GIB starts a process that holds all but GIB of the GPU's free memory while the cases are judged (what other
processes sharing the GPU hold in a busy suite): a case that does not fit is judged once more with no other large
case running, then reported not-verifiable with the reason (`harness.engine.runner.judge`).
Exit status: 0 when every case passed, 1 otherwise, 2 on bad arguments or without a GPU (except --list).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: the adapter families this repository ships for a GPU
SHIPPED = ("triton-", "reference-", "torch-", "naive-")
#: the holding process's program: all but argv[1] GiB of the free memory, until its stdin closes
HOLD = ("import sys, torch\n"
        "free = torch.cuda.mem_get_info()[0]\n"
        "t = torch.empty(max(0, free - int(float(sys.argv[1]) * 2**30)), dtype=torch.uint8, device='cuda')\n"
        "print(f'{t.numel() / 2**30:.1f}', flush=True)\n"
        "sys.stdin.read()\n")


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("adapters", nargs="*", help="adapter names (default: every shipped GPU adapter)")
    p.add_argument("--list", action="store_true", help="print each adapter's case only; judge nothing")
    p.add_argument("--generation", default="sm90", help="with --list: the GPU generation to plan for (default sm90)")
    p.add_argument("--hold", type=float, default=None, metavar="GIB",
                   help="hold all but GIB of the GPU's free memory in another process while judging")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per case (default 600)")
    return p.parse_args(argv)


def _cases(names: list[str], generation: str | None) -> list[tuple[Any, Any]]:
    """(adapter, its large case) for each adapter that has one (a line on stderr for each that has none)."""
    from harness import registry
    from harness.core.device import detect
    from harness.engine import strategies as hs
    from harness.engine.coverage import device_for

    device = device_for(generation) if generation else detect("cuda")
    found = []
    for name in names:
        adapter = registry.resolve(name)
        cells = hs.declared_cells(adapter, adapter.device_for(device))
        cases = hs.profile_class_cases(adapter, cells, "thorough")
        if not cases:
            print(f"{name}: no large case (none of its cells can hold one on {device.generation})", file=sys.stderr)
            continue
        found.append((adapter, cases[0]))
    return found


def _judged(name: str, case: Any, device: Any, timeout: float) -> list[str]:
    """One case judged in its kernel host: the line's fields."""
    import torch

    from harness.engine import remote, runner

    adapter = remote.open_adapter(name, device.device)
    kinds: list[str] = []
    real = runner._reserved_arena
    runner._reserved_arena = _recording(real, kinds)
    low, stop = [torch.cuda.mem_get_info()[0]], threading.Event()
    before = low[0]

    def sample() -> None:
        while not stop.is_set():
            low[0] = min(low[0], torch.cuda.mem_get_info()[0])
            time.sleep(0.02)

    torch.cuda.reset_peak_memory_stats()
    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    t0 = time.perf_counter()
    try:
        r = runner.judge(case, adapter, device, timeout=timeout)
    finally:
        wall = time.perf_counter() - t0
        stop.set()
        watcher.join()
        runner._reserved_arena = real
        remote.close_adapter(name, device.device)
    return [name, case.op, r.verdict, f"{wall:.1f}s", ",".join(kinds), json.dumps(case.shapes),
            f"machine_peak={(before - low[0]) / 2**30:.1f}GiB",
            f"judge_peak={torch.cuda.max_memory_allocated() / 2**30:.1f}GiB",
            "" if r.verdict == "pass" else r.reason[:400]]


def _recording(real: Any, kinds: list[str]) -> Any:
    """The runner's arena reservation, noting each arena's kind."""
    def reserved(*args: Any) -> Any:
        arena = real(*args)
        kinds.append(getattr(arena, "kind", "?"))
        return arena
    return reserved


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    from harness import registry

    names = args.adapters or [a.name for a in registry.all_adapters() if a.name.startswith(SHIPPED)]
    if args.list:
        for adapter, case in _cases(names, args.generation):
            print("\t".join([adapter.name, case.op, json.dumps(case.features), json.dumps(case.shapes)]))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("large_cases.py: judging these cases needs a CUDA GPU (--list plans them without one)", file=sys.stderr)
        return 2
    holder = None
    if args.hold is not None:
        holder = subprocess.Popen([sys.executable, "-c", HOLD, str(args.hold)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        print(f"holding {holder.stdout.readline().strip()} GiB of the GPU in process {holder.pid}", file=sys.stderr)
    from harness.core.device import detect

    device = detect("cuda")
    bad = 0
    try:
        for adapter, case in _cases(names, None):
            fields = _judged(adapter.name, case, device, args.timeout)
            bad += fields[2] != "pass"
            print("\t".join(fields), flush=True)
    finally:
        if holder is not None:
            holder.stdin.close()
            holder.wait(timeout=30)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
