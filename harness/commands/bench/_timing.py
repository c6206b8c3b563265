"""How a bench row is timed: two methods, interleaved rounds, a spread, and a re-time when the methods disagree.

The kernels of one point (ours, vLLM's, ...) are timed together, round-robin: round r times each of them once by
every method before round r+1 starts, so a clock or thermal drift during the point moves all of them alike instead
of favouring whichever ran first. A round is the median of `REPS` timed calls, each after an L2 flush. The
methods:

- `graph`: replays of a CUDA graph holding one call (the GPU time, as a serving engine's decode step runs it);
- `eager`: CUDA events around a plain Python call (launch overhead included).

A method's time is the median of its round medians, its spread (max - min) / median of them, in %. When the two
methods of a kernel differ by more than `AGREE` (e.g. a graph replay slower than the eager call), the whole point
is timed again for as many rounds and the rounds merged; a difference that stays is shown in the row. At small M
the eager time is mostly launch overhead: that difference is real and stays.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

ROUNDS = 5
REPS = 10
#: the largest relative difference between a kernel's graph and eager times that needs no re-time
AGREE = 0.05


class Clock(Protocol):
    """Times one round of a call; `capture` returns what `graph` replays, or raises when it cannot be captured."""

    def capture(self, fn: Callable[[], Any]) -> Any: ...

    def eager(self, fn: Callable[[], Any]) -> float: ...

    def graph(self, captured: Any) -> float: ...


@dataclass
class Timing:
    """The round medians of one kernel, per method (seconds), and why it has no graph time if it has none."""

    eager: list[float] = field(default_factory=list)
    graph: list[float] = field(default_factory=list)
    no_graph: str = ""
    retimed: bool = False

    @staticmethod
    def summary(rounds: Sequence[float]) -> tuple[float, float]:
        """(median, spread in % of the median) of round times."""
        mid = statistics.median(rounds)
        return mid, (100 * (max(rounds) - min(rounds)) / mid if mid > 0 else 0.0)

    def differ(self) -> float:
        """(eager - graph) / graph of the medians; 0 without a graph time."""
        if not self.graph or not self.eager:
            return 0.0
        g, e = statistics.median(self.graph), statistics.median(self.eager)
        return (e - g) / g if g > 0 else 0.0

    def columns(self) -> dict[str, Any]:
        """The row's timing columns; `kernel_us` is the graph time where there is one, else the eager time."""
        eager, eager_spread = self.summary(self.eager)
        row: dict[str, Any] = {"eager_us": eager * 1e6, "eager_spread_%": eager_spread}
        if self.graph:
            graph, graph_spread = self.summary(self.graph)
            row.update({"graph_us": graph * 1e6, "graph_spread_%": graph_spread, "timing": "graph",
                        "kernel_us": graph * 1e6, "eager_vs_graph_%": 100 * self.differ()})
        else:
            row.update({"timing": f"eager ({self.no_graph})" if self.no_graph else "eager", "kernel_us": eager * 1e6})
        if self.retimed:
            row["retimed"] = "yes"
        return row


def time_point(kernels: Sequence[Callable[[], Any]], graphs: Sequence[bool], clock: Clock,
               rounds: int = ROUNDS) -> list[Timing]:
    """Time the kernels of one point in interleaved rounds (see the module doc); `graphs[i]`: try a CUDA graph of
    kernel i. A kernel that raises raises here (the caller reports the point's error)."""
    timings = [Timing() for _ in kernels]
    captured: list[Any] = []
    for fn, want, t in zip(kernels, graphs, timings, strict=True):
        fn()  # warm-up: JIT compiles, allocator growth
        fn()
        handle = None
        if want:
            try:
                handle = clock.capture(fn)
            except Exception as e:  # not capturable: the eager time stands, and the row says why
                t.no_graph = f"no graph: {type(e).__name__}"
        captured.append(handle)

    def run_rounds() -> None:
        for _ in range(rounds):
            for fn, handle, t in zip(kernels, captured, timings, strict=True):
                t.eager.append(clock.eager(fn))
                if handle is not None:
                    t.graph.append(clock.graph(handle))

    run_rounds()
    if any(abs(t.differ()) > AGREE for t in timings):
        run_rounds()
        for t in timings:
            t.retimed = True
    return timings


class HostClock:
    """perf_counter around plain calls (no GPU: no graphs)."""

    def capture(self, fn: Callable[[], Any]) -> Any:
        raise NotImplementedError("CUDA graphs need a GPU")

    def eager(self, fn: Callable[[], Any]) -> float:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def graph(self, captured: Any) -> float:
        raise NotImplementedError("CUDA graphs need a GPU")


class CudaClock:
    """CUDA events around each call, L2 flushed (a 256 MiB write) before each one."""

    def __init__(self, reps: int = REPS) -> None:
        import torch

        self.torch = torch
        self.reps = reps
        self.flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")

    def capture(self, fn: Callable[[], Any]) -> Any:
        graph = self.torch.cuda.CUDAGraph()
        with self.torch.cuda.graph(graph):
            fn()
        graph.replay()
        self.torch.cuda.synchronize()
        return graph

    def _events(self, call: Callable[[], Any]) -> float:
        cuda = self.torch.cuda
        pairs = [(cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)) for _ in range(self.reps)]
        for start, end in pairs:
            self.flush.zero_()
            start.record()
            call()
            end.record()
        cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in pairs) / 1e3

    def eager(self, fn: Callable[[], Any]) -> float:
        return self._events(fn)

    def graph(self, captured: Any) -> float:
        return self._events(captured.replay)
