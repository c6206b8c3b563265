"""Progress of a sweep: cells done, verdict counts and ETA (a bar on a terminal, a line now and then in a log), and
the worker processes' Python warnings kept out of it (logged next to the results, counted at the end)."""

from __future__ import annotations

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


#: time_s entries that are parts of others (summing them would count their seconds twice)
_PARTS = ("in_host", "first_run_excess")


def case_seconds(spent: Mapping[str, float]) -> float:
    """The seconds one case took, from its measured phases (metrics.time_s)."""
    return sum(float(v) for k, v in spent.items() if k not in _PARTS)


def eta_seconds(left: Mapping[str, int], measured: Mapping[str, tuple[float, int]], workers: int) -> float | None:
    """Seconds until the cases still `left` (a count per adapter) are judged by `workers` in parallel: each adapter's
    cases at its own measured seconds per case (`measured`: adapter -> (seconds, cases)), an adapter not measured
    yet at the mean of all measured cases. None before any case was measured; never under a second while a case is
    left (0 only once none is)."""
    cases_left = sum(n for n in left.values() if n > 0)
    if cases_left == 0:
        return 0.0
    seconds, cases = sum(s for s, _ in measured.values()), sum(n for _, n in measured.values())
    if cases == 0:
        return None
    mean = seconds / cases

    def per_case(adapter: str) -> float:
        s, n = measured.get(adapter, (0.0, 0))
        return s / n if n else mean

    work = sum(n * per_case(a) for a, n in left.items() if n > 0)
    return max(1.0, work / max(1, min(workers, cases_left)))


class Progress:
    """Cells done, verdict counts and ETA: a redrawn bar on a terminal, a plain line now and then otherwise."""

    def __init__(self, total_cases: int, cells_of: Mapping[int, tuple], out: IO[str] | None, workers: int = 1):
        self.total = total_cases
        self.workers = workers
        self.left_of = Counter(cell[0] for cell in cells_of.values())  # cases left per adapter
        self.measured: dict[str, tuple[float, int]] = {}  # adapter -> (seconds, cases) of the cases judged here
        self.out = out
        self.tty = bool(out is not None and hasattr(out, "isatty") and out.isatty())
        self.cell_left = Counter(cells_of.values())
        self.cells_total = len(self.cell_left)
        self.cells_of = dict(cells_of)
        self.done = 0
        self.counts: Counter = Counter()
        self.t0 = time.monotonic()
        self._last = 0.0
        self.spent: Counter = Counter()  # seconds per judging phase (metrics.time_s), summed over the cases
        self.planning = ""  # how far the planning is, while adapters are still being planned (the ETA waits for it)

    def add(self, cells_of: Mapping[int, tuple]) -> None:
        """More cases, planned while the first were judged: index -> (adapter, cell)."""
        self.cells_of.update(cells_of)
        self.total += len(cells_of)
        self.left_of.update(cell[0] for cell in cells_of.values())
        self.cell_left.update(cells_of.values())
        self.cells_total = len(self.cell_left)

    @property
    def cells_done(self) -> int:
        return sum(1 for n in self.cell_left.values() if n == 0)

    def record(self, index: int, verdict: str, declared: bool, spent: Mapping[str, float] | None = None) -> None:
        if spent:
            self.spent.update({k: float(v) for k, v in spent.items()})
            if "second_run" in spent:  # what the first run took beyond the second: compiles, first-call set-up
                self.spent["first_run_excess"] += max(0.0, spent.get("first_run", 0.0) - spent["second_run"])
            adapter = self.cells_of[index][0]
            s, n = self.measured.get(adapter, (0.0, 0))
            self.measured[adapter] = (s + case_seconds(spent), n + 1)
        self.done += 1
        self.cell_left[self.cells_of[index]] -= 1
        self.left_of[self.cells_of[index][0]] -= 1
        self.counts[counted_as(verdict, declared)] += 1
        self.show()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def line(self) -> str:
        elapsed = self.elapsed()
        eta = eta_seconds(self.left_of, self.measured, self.workers)
        counts = ", ".join(f"{v} {k}" for k, v in sorted(self.counts.items()))
        eta_s = "?" if eta is None or self.planning else duration(eta)
        planning = f" ({self.planning})" if self.planning else ""
        return (f"{self.cells_done}/{self.cells_total} cells, {self.done}/{self.total} cases ({counts or 'none yet'})"
                f" {elapsed:.0f}s elapsed, ETA {eta_s}{planning}{self._compiling()}")

    def _compiling(self) -> str:
        """A note when first-call work (Triton compiles) has taken most of the judging time so far."""
        total = self._judging_total()
        share = self.spent["first_run_excess"] / total if total > 0 else 0.0
        return f"; {share:.0%} of it compiling (first kernel runs)" if share >= 0.5 and total >= 10 else ""

    def _judging_total(self) -> float:
        """The judging seconds summed (`in_host` and the first-run excess are parts of the kernel runs)."""
        return case_seconds(self.spent)

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
