"""Progress of a sweep: cells done, verdict counts and ETA (a bar on a terminal, a line now and then in a log), and
the worker processes' Python warnings kept out of it (logged next to the results, counted at the end)."""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import IO


def duration(seconds: float) -> str:
    """A wall time as people read it: 45s, 1m32s, 2h05m."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


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
        self.spent: Counter = Counter()  # seconds per judging phase (metrics.time_s), summed over the cases

    @property
    def cells_done(self) -> int:
        return sum(1 for n in self.cell_left.values() if n == 0)

    def record(self, index: int, verdict: str, declared: bool, spent: Mapping[str, float] | None = None) -> None:
        if spent:
            self.spent.update({k: float(v) for k, v in spent.items()})
            if "second_run" in spent:  # what the first run took beyond the second: compiles, first-call set-up
                self.spent["first_run_excess"] += max(0.0, spent.get("first_run", 0.0) - spent["second_run"])
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
                f" {elapsed:.0f}s elapsed, ETA {eta_s}{self._compiling()}")

    def _compiling(self) -> str:
        """A note when first-call work (Triton compiles) has taken most of the judging time so far."""
        total = self._judging_total()
        share = self.spent["first_run_excess"] / total if total > 0 else 0.0
        return f"; {share:.0%} of it compiling (first kernel runs)" if share >= 0.5 and total >= 10 else ""

    def _judging_total(self) -> float:
        """The judging seconds summed (`in_host` and the first-run excess are parts of the kernel runs)."""
        return sum(v for k, v in self.spent.items() if k not in ("in_host", "first_run_excess"))

    def account(self) -> str:
        """Where the judging time went, summed over the workers ("" before any case was timed)."""
        total = self._judging_total()
        if total <= 0:
            return ""
        s = self.spent

        def part(name: str, seconds: float) -> str:
            return f"{name} {duration(seconds)} ({seconds / total:.0%})"

        runs = s["first_run"] + s["second_run"] + s["other_runs"]
        parts = [part("kernel runs", runs) + (f" [first runs beyond their second, i.e. compiles and first calls: "
                                              f"{duration(s['first_run_excess'])}; in the kernel host's own timing: "
                                              f"{duration(s['in_host'])}]")]
        parts += [part(name, s[key]) for name, key in (("oracle", "oracle"), ("inputs", "inputs"),
                                                        ("checks", "checks"), ("kernel host starts", "host_start"))]
        return f"time summed over the workers: {duration(total)}: " + ", ".join(parts)

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
            print(f"done: judged {self.done} of {self.total} cases in {duration(self.elapsed())} "
                  f"({self.cells_done}/{self.cells_total} cells; "
                  + (", ".join(f"{v} {k}" for k, v in sorted(self.counts.items())) or "no verdicts") + ")",
                  file=self.out, flush=True)
            if account := self.account():
                print(account, file=self.out, flush=True)


class WorkerWarnings:
    """The worker processes' Python warnings (numpy overflows in Triton's interpreter, deprecations) go to one log
    file next to the results, one line each, instead of their stderr, where they would cut the progress lines."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def count(self) -> int:
        try:
            with open(self.path, encoding="utf-8", errors="replace") as fh:
                return sum(1 for _ in fh)
        except OSError:
            return 0

    def summary(self) -> str:
        """One line for the end of the sweep ("" when no worker warned)."""
        n = self.count()
        return f"{n} warning(s) from the worker processes (Python, Triton): {self.path}" if n else ""
