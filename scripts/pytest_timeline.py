"""A pytest plugin for diagnosing a suite's wall time: every test's start and end, per xdist worker.

    PYTHONPATH=scripts MOE_TIMELINE_DIR=DIR python -m pytest -p pytest_timeline -n 16 ...

writes DIR/<worker>.jsonl (gw0.jsonl ..., main.jsonl without xdist), one line per event: `t` (epoch seconds), `e`
(`s` start, `f` finish) and `id` (the node id). `python scripts/pytest_timeline.py DIR` prints how many workers held
a test in each 10 s of the run, and the tests still running when it ended.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import IO

ENV = "MOE_TIMELINE_DIR"
_out: IO[str] | None = None


def _write(event: str, nodeid: str) -> None:
    global _out
    folder = os.environ.get(ENV)
    if not folder:
        return
    if _out is None:
        os.makedirs(folder, exist_ok=True)
        name = os.environ.get("PYTEST_XDIST_WORKER", "main")
        _out = open(os.path.join(folder, f"{name}.jsonl"), "a", buffering=1, encoding="utf-8")
    _out.write(json.dumps({"t": time.time(), "e": event, "id": nodeid}) + "\n")


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    _write("s", nodeid)


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    _write("f", nodeid)


def spans(folder: Path) -> tuple[list[tuple[float, float, str, str]], list[tuple[float, str, str]]]:
    """The finished tests as (start, end, worker, node id), and the unfinished ones as (start, worker, node id)."""
    done, running = [], []
    for path in sorted(folder.glob("*.jsonl")):
        started: dict[str, float] = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            event = json.loads(line)
            if event["e"] == "s":
                started[event["id"]] = event["t"]
            elif event["id"] in started:
                done.append((started.pop(event["id"]), event["t"], path.stem, event["id"]))
        running += [(t, path.stem, nodeid) for nodeid, t in started.items()]
    return done, running


def busy(done: list[tuple[float, float, str, str]], step: float = 10.0) -> list[float]:
    """Workers holding a test, on average, in each `step` seconds from the first start."""
    if not done:
        return []
    t0, t1 = min(d[0] for d in done), max(d[1] for d in done)
    bins = []
    at = t0
    while at < t1:
        held = sum(max(0.0, min(at + step, end) - max(at, start)) for start, end, _, _ in done)
        bins.append(held / step)
        at += step
    return bins


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print("usage: python scripts/pytest_timeline.py DIR", file=sys.stderr)
        return 2
    done, running = spans(Path(argv[0]))
    print("workers busy per 10 s:", " ".join(f"{b:.1f}" for b in busy(done)))
    print(f"{len(done)} tests finished, {sum(e - s for s, e, _, _ in done):.0f} s summed")
    for _start, worker, nodeid in sorted(running):
        print(f"unfinished ({worker}): {nodeid}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
