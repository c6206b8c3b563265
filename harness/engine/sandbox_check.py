"""`python -m harness.engine.sandbox_check [--device cuda]`: how kernel hosts run on this machine, seen on a live one.

Prints the line the pytest header and the sweep print (`sandbox.describe()`), then starts a host on the device and
reports, from outside it, what the judge relies on: its pid namespace (not the judge's), the checkout read-only in
its mount namespace, /dev/shm the judge's own mount (the arena), the fork server's socket out of its reach, its start
time, and the verdict of one case judged through it (on a GPU: a CUDA context made inside the namespaces). Exit
status 0 when all hold as described.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from harness.core.case import Case
from harness.core.device import detect
from harness.engine import remote, runner, sandbox
from harness.engine.host import Host

_CASE = Case(op="activation", adapter="reference-activation",
             features={"activation": "silu_and_mul", "dtype": "float32"}, shapes={"T": 4, "N": 24},
             dtypes={"x": "float32"}, seed=1)


def _mounts(pid: int | str) -> dict[str, tuple[str, list[str]]]:
    """mount point -> (device, options) of the last mount there, as `pid` sees them."""
    found = {}
    with open(f"/proc/{pid}/mountinfo") as f:
        for line in f:
            fields = line.split()
            found[fields[4]] = (fields[2], fields[5].split(","))
    return found


def _seen_from_outside(host: Host) -> list[tuple[str, bool]]:
    """(what, holds) for a running host."""
    pid = host.worker_pid()
    assert pid is not None
    own_pid_ns = os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
    inside, outside = _mounts(pid), _mounts("self")
    checks = [("its own pid namespace", own_pid_ns)]
    for folder in sandbox.judge_paths():
        checks.append((f"{folder} read-only inside", "ro" in inside.get(folder, ("", []))[1]))
    checks.append(("/dev/shm the judge's mount", inside.get("/dev/shm", ("?", []))[0]
                   == outside.get("/dev/shm", ("!", []))[0]))
    for folder in sandbox.fork_server_folders():  # this process's server, the one the host was forked from
        checks.append(("the fork server's socket folder covered inside", folder in inside and folder not in outside))
    return checks


def check(device: str = "cpu") -> int:
    """Print how kernel hosts run here; 0 when what `describe()` says holds on a live host."""
    print(sandbox.describe())
    info = detect(device)
    device = info.device  # "cuda" names its index (cuda:0): a host takes one device
    started = time.monotonic()
    host = Host(device)
    try:
        host.ready()
        print(f"a host on {device} answered {time.monotonic() - started:.2f}s after its start (pid {host.proc.pid}, "
              f"its loop in pid {host.worker_pid()}); log {host.log}")
        checks = _seen_from_outside(host) if host.sandboxed else []
        for what, holds in checks:
            print(f"  {what}: {'yes' if holds else 'NO'}")
    finally:
        host.close()
    adapter = remote.open_adapter("reference-activation", device)
    try:
        result = runner.judge(_CASE, adapter, info)
    finally:
        remote.close_adapter("reference-activation", device)
    print(f"one case judged through a host: {result.verdict}{f' ({result.reason})' if result.reason else ''}")
    return 0 if all(holds for _, holds in checks) and result.verdict == "pass" else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.engine.sandbox_check", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    return check(p.parse_args(argv).device)


if __name__ == "__main__":
    sys.exit(main())
