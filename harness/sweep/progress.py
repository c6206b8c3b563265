"""Progress of a sweep: cells done, verdict counts and ETA (a bar on a terminal, a line now and then in a log)."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Mapping
from typing import IO


def counted_as(verdict: str, declared: bool) -> str:
    """The verdict as the counts show it: a pass of an undeclared cell is counted apart."""
    return verdict if declared or verdict != "pass" else "pass (undeclared)"


class Progress:
    """Cells done, verdict counts and ETA: a redrawn bar on a terminal, a plain line now and then otherwise."""

    def __init__(self, total_cases: int, cells_of: Mapping[int, tuple], out: IO[str] | None):
        self.total = total_cases
        self.out = out
        self.tty = bool(out is not None and hasattr(out, "isatty") and out.isatty())
        self.cell_left = Counter(cells_of.values())
        self.cells_total = len(self.cell_left)
        self.cells_of = cells_of
        self.done = 0
        self.counts: Counter = Counter()
        self.t0 = time.monotonic()
        self._last = 0.0

    @property
    def cells_done(self) -> int:
        return sum(1 for n in self.cell_left.values() if n == 0)

    def record(self, index: int, verdict: str, declared: bool) -> None:
        self.done += 1
        self.cell_left[self.cells_of[index]] -= 1
        self.counts[counted_as(verdict, declared)] += 1
        self.show()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def line(self) -> str:
        elapsed = self.elapsed()
        eta = elapsed / self.done * (self.total - self.done) if self.done else float("nan")
        counts = ", ".join(f"{v} {k}" for k, v in sorted(self.counts.items()))
        eta_s = "?" if math.isnan(eta) else f"{eta:.0f}s"
        return (f"{self.cells_done}/{self.cells_total} cells, {self.done}/{self.total} cases ({counts or 'none yet'})"
                f" {elapsed:.0f}s elapsed, ETA {eta_s}")

    def show(self, force: bool = False) -> None:
        if self.out is None:
            return
        now = time.monotonic()
        if self.tty and (force or now - self._last > 0.2):
            width = 24
            filled = int(width * self.done / max(1, self.total))
            print(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.line()}\x1b[K", end="", file=self.out, flush=True)
            self._last = now
        elif not self.tty and (force or now - self._last > 30):
            print(self.line(), file=self.out, flush=True)
            self._last = now

    def note(self, text: str) -> None:
        if self.out is None:
            return
        print(("\r\x1b[K" if self.tty else "") + text, file=self.out, flush=True)
        self.show(force=self.tty)

    def finish(self) -> None:
        if self.out is not None:
            if self.tty:
                print(file=self.out)
            print(f"done: {self.line()}", file=self.out, flush=True)
