"""Where a machine's CPU goes, by kind of process: samples /proc while something runs, then sums it up.

    python scripts/proc_cpu.py sample OUT.json SECONDS   # every 0.2 s, until SECONDS pass or SIGTERM
    python scripts/proc_cpu.py summary OUT.json          # CPU seconds and process counts by kind

A sample keeps, per process, its command line, parent, first and last sight and CPU seconds (user + system) when
last seen: a process shorter than one sample may be missed, and a forked one counts only what it used after its
fork. A process forked from a fork server keeps the server's command line, so the kind comes from its parent too.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

FORK_SERVER = "multiprocessing.forkserver import main"


def _read(pid: str, tick: int) -> tuple[int, float, int] | None:
    """(parent, CPU seconds, start tick) of `pid`, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / tick, int(fields[19])


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:400]
    except OSError:
        return "?"


def sample(out: str, seconds: float) -> None:
    tick = os.sysconf("SC_CLK_TCK")
    seen: dict[str, dict[str, Any]] = {}

    def save(*_: Any) -> None:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(list(seen.values()), f)

    signal.signal(signal.SIGTERM, lambda *_: (save(), os._exit(0)))
    end = time.time() + seconds
    while time.time() < end:
        now = time.time()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            stat = _read(pid, tick)
            if stat is None:
                continue
            key = f"{pid}-{stat[2]}"
            if key not in seen:
                seen[key] = {"pid": int(pid), "ppid": stat[0], "cmd": _cmdline(pid), "t0": now}
            seen[key].update(t1=now, cpu=stat[1])
        time.sleep(0.2)
    save()


def kind(record: dict[str, Any], parents: dict[int, dict[str, Any]]) -> str:
    """What a sampled process was."""
    cmd = record["cmd"]
    if FORK_SERVER in cmd:
        parent = parents.get(record["ppid"])
        return "forked from a fork server" if parent and FORK_SERVER in parent["cmd"] else "fork server"
    if "multiprocessing.resource_tracker" in cmd:
        return "resource tracker"
    if "exec(eval(sys.stdin" in cmd:
        return "xdist worker"
    if " -m pytest" in cmd:
        return "pytest (a session's main process)"
    if " -m harness" in cmd:
        return "python -m harness"
    return os.path.basename(cmd.split(" ", 1)[0]) or "(kernel thread)"


def summary(records: Iterable[dict[str, Any]]) -> list[tuple[str, int, float]]:
    """(kind, processes, CPU seconds), the most CPU first."""
    records = list(records)
    parents = {r["pid"]: r for r in records}
    count: Counter[str] = Counter()
    cpu: Counter[str] = Counter()
    for r in records:
        k = kind(r, parents)
        count[k] += 1
        cpu[k] += r.get("cpu", 0.0)
    return [(k, count[k], round(cpu[k], 1)) for k, _ in cpu.most_common()]


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "sample":
        sample(argv[1], float(argv[2]))
        return 0
    if len(argv) == 2 and argv[0] == "summary":
        with open(argv[1], encoding="utf-8") as f:
            rows = summary(json.load(f))
        for k, n, seconds in rows:
            print(f"{seconds:10.1f} s  {n:6d}  {k}")
        return 0
    print("usage: python scripts/proc_cpu.py sample OUT.json SECONDS | summary OUT.json", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
