"""How long kernel hosts started at once take to answer their first request, as a sweep's workers start theirs.

    python scripts/host_start_probe.py DEVICE N [--no-preload]

Starts one host (the fork server's first), then N at once on DEVICE ("cuda:0", "cpu"), each asked `ping` from
its own thread; prints one JSON line: when the N starts were requested, when each host answered (seconds from the
first start), and how long the first host then took to describe triton-experts (0 when it imported the adapters
as it started: `preload`, as a sweep worker's hosts do). MOE_HARNESS_SANDBOX=off compares without the sandbox.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def trial(n: int, device: str, preload: bool) -> dict:
    from harness.engine.host import Host

    hosts = [Host(device, preload=preload) for _ in range(n)]
    t0 = time.monotonic()
    for h in hosts:
        h.start()
    requested = time.monotonic() - t0
    ready: list[float] = []

    def ask(h: Host) -> None:
        h.ask(("ping",))
        ready.append(round(time.monotonic() - t0, 2))

    threads = [threading.Thread(target=ask, args=(h,)) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    t1 = time.monotonic()
    hosts[0].ask(("describe", "triton-experts"))
    described = time.monotonic() - t1
    for h in hosts:
        h.close()
    return {"started": round(requested, 2), "ready": sorted(ready), "describe_s": round(described, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("device")
    ap.add_argument("n", type=int)
    ap.add_argument("--no-preload", action="store_true")
    args = ap.parse_args()
    from harness.engine import fork_server

    fork_server.start_early()
    preload = not args.no_preload
    first = trial(1, args.device, preload)
    print(json.dumps({"device": args.device, "n": args.n, "preload": preload,
                      "sandbox": os.environ.get("MOE_HARNESS_SANDBOX", "auto"), "first": first,
                      **trial(args.n, args.device, preload)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
