"""Which chunk of cases a sweep worker judges next: the adapter with the most work left, measured as it goes.

A case costs from a hundredth of a second to many seconds, and nothing in a plan says which: on a GPU with a cold
Triton cache every new kernel variant is a compile of seconds, so an adapter of 50 cheap-looking cases can be the
longest in the run. Handing adapters out by case count left such an adapter to start last and finish alone. So:
- every adapter's first case goes out before any adapter's second chunk, which measures each adapter early;
- then the next chunk is of the adapter with the most work left: its measured seconds per case times its cases
  not yet handed out (an adapter with no finished case yet counts at the mean of all finished cases);
- a chunk handed out holds at most a fair share of the work left (that over the workers, in measured seconds),
  so the chunks of a slow adapter are short and the last ones end together;
- a worker stays with an adapter whose kernel host it has up while that adapter has at least a quarter of the work
  left of the busiest one (a kernel host starts in 1.5 s or more);
- a chunk put back (its worker died or was recycled) goes out first.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Protocol

#: a worker stays with its adapter while that has at least 1/STICK of the top adapter's work left
STICK = 4
#: cases in the first chunk of an adapter, handed out to measure it
PROBE_CASES = 1


class _Chunk(Protocol):
    spec: str
    items: list


class ChunkQueue:
    """The chunks still to hand out, by adapter spec; `observe` feeds it the seconds each finished case took."""

    def __init__(self, chunks: list | deque | None = None, workers: int = 1) -> None:
        self.workers = max(1, workers)
        self._urgent: deque = deque()
        self._by_spec: dict[str, deque] = {}
        self._seconds: dict[str, float] = {}
        self._judged: dict[str, int] = {}
        self._started: set[str] = set()
        for chunk in chunks or ():
            self.append(chunk)

    def append(self, chunk: _Chunk) -> None:
        self._by_spec.setdefault(chunk.spec, deque()).append(chunk)

    def appendleft(self, chunk: _Chunk) -> None:
        """Put back a chunk that was handed out: it goes out next."""
        self._urgent.appendleft(chunk)

    def __len__(self) -> int:
        return len(self._urgent) + sum(len(q) for q in self._by_spec.values())

    def __iter__(self) -> Iterator[_Chunk]:
        yield from self._urgent
        for q in self._by_spec.values():
            yield from q

    def popleft(self) -> _Chunk:
        """Any chunk (the put-back ones first); IndexError when empty."""
        return self.take()

    def observe(self, spec: str, seconds: float) -> None:
        """One case of `spec` took `seconds` (start to verdict, as the parent saw it)."""
        self._seconds[spec] = self._seconds.get(spec, 0.0) + max(0.0, seconds)
        self._judged[spec] = self._judged.get(spec, 0) + 1

    def per_case(self, spec: str) -> float:
        """Measured seconds per case of `spec`; the mean over all adapters while it has none."""
        if self._judged.get(spec):
            return self._seconds[spec] / self._judged[spec]
        n = sum(self._judged.values())
        return sum(self._seconds.values()) / n if n else 1.0

    def work_left(self, spec: str) -> float:
        return self.per_case(spec) * sum(len(c.items) for c in self._by_spec.get(spec, ()))

    def take(self, held: Sequence[str] = ()) -> _Chunk:
        """The next chunk for a worker whose kernel hosts are up for the adapter specs `held`."""
        if self._urgent:
            return self._urgent.popleft()
        live = [s for s, q in self._by_spec.items() if q]
        if not live:
            raise IndexError("no chunks left")
        unstarted = [s for s in live if s not in self._started]
        if unstarted:
            spec = unstarted[0]
        else:
            spec = max(live, key=self.work_left)
            mine = [s for s in held if s in live]
            if mine and self.work_left(own := max(mine, key=self.work_left)) * STICK >= self.work_left(spec):
                spec = own
        fits = PROBE_CASES if spec not in self._started else self._fair_share(spec)
        chunk = self._by_spec[spec].popleft()
        self._started.add(spec)
        if fits < len(chunk.items):  # hand out the head, keep the rest first in line for this adapter
            self._by_spec[spec].appendleft(dataclasses.replace(chunk, items=chunk.items[fits:]))
            chunk = dataclasses.replace(chunk, items=chunk.items[:fits])
        return chunk

    def _fair_share(self, spec: str) -> int:
        """Cases of `spec` worth at most the work left over the workers (at least one)."""
        share = sum(self.work_left(s) for s in self._by_spec) / self.workers
        return max(1, int(share / max(self.per_case(spec), 1e-6)))
