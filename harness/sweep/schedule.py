"""Which cases a sweep worker judges next: chunks of one adapter in plan order, then work taken from the busiest.

A case costs from a hundredth of a second to many seconds, and nothing in a plan says which: on a GPU with a cold
Triton cache every new kernel variant is a compile of seconds. With whole chunks handed out, a chunk of such cases
taken late ended the run alone while the other workers idled (the cold quick matrix on an H100: the last 40 s on
one or two workers). So:
- chunks go out in plan order (the biggest adapters first), a worker taking a chunk of the adapter whose kernel host
  it has up before any other (a host starts in 1.5 s or more);
- a worker is sent one case of its chunk at a time, so the rest of a chunk stays the parent's to give away;
- once no chunk is left, an idle worker takes the back half (rounded up: a last case too) of the not-yet-sent
  cases of the chunk with the most measured work left (that adapter's seconds per case, measured as the sweep goes,
  times its cases), when that half is worth more than a kernel host start, or, where the idle worker's host serves
  that chunk's adapter too (one family's host), more than the moving of a case costs. A last unsent case waited for
  its worker's case in flight before, ending a cold GPU sweep with seconds of one or two compiling workers.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Protocol

#: the weight of a chunk queued without one (`ChunkQueue.insert_by_weight`)
LIGHTEST = (-math.inf, 0.0)
#: seconds a taken half must be worth (measured) before an idle worker whose kernel host does not serve its adapter
#: takes it (about what a host takes to start, with margin)
STEAL_NEW_HOST_S = 3.0
#: seconds a taken half must be worth when the idle worker's kernel host serves its adapter already: moving a case is
#: a message each way
STEAL_SAME_HOST_S = 0.2


class _Chunk(Protocol):
    spec: str
    items: list


class ChunkQueue:
    """The chunks still to hand out, the biggest adapters first; `observe` feeds it the seconds each finished case
    took."""

    def __init__(self, chunks: Sequence | None = None) -> None:
        self._chunks: deque = deque(chunks or ())
        self._seconds: dict[str, float] = {}
        self._judged: dict[str, int] = {}

    def insert_by_weight(self, chunk: _Chunk) -> None:
        """Queue `chunk` after those of its `weight` or more and before lighter ones (a chunk without one is the
        lightest). The sweep weighs a chunk (-its place among its adapter's chunks, its adapter's cases): every
        adapter's first chunk goes out before any second one, so that an adapter whose cases are slow (each one a
        compile) starts early, not last; among first chunks the biggest adapters go first."""
        weight = getattr(chunk, "weight", LIGHTEST)
        at = next((i for i, c in enumerate(self._chunks) if getattr(c, "weight", LIGHTEST) < weight), len(self._chunks))
        self._chunks.insert(at, chunk)

    def appendleft(self, chunk: _Chunk) -> None:
        """Put back a chunk that was handed out: it goes out next."""
        self._chunks.appendleft(chunk)

    def __len__(self) -> int:
        return len(self._chunks)

    def __iter__(self) -> Iterator[_Chunk]:
        return iter(self._chunks)

    def popleft(self) -> _Chunk:
        return self._chunks.popleft()

    def take(self, current: str = "") -> _Chunk:
        """The next chunk for a worker whose kernel host is up for the spec `current`: one of its, else the next."""
        for chunk in self._chunks:
            if chunk.spec == current:
                self._chunks.remove(chunk)
                return chunk
        return self._chunks.popleft()

    def observe(self, spec: str, seconds: float) -> None:
        """One case of `spec` took `seconds` (from its start to its verdict, as the parent saw it)."""
        self._seconds[spec] = self._seconds.get(spec, 0.0) + max(0.0, seconds)
        self._judged[spec] = self._judged.get(spec, 0) + 1

    def per_case(self, spec: str) -> float:
        """Measured seconds per case of `spec`; the mean over all adapters while it has none (1 s before any)."""
        if self._judged.get(spec):
            return self._seconds[spec] / self._judged[spec]
        n = sum(self._judged.values())
        return sum(self._seconds.values()) / n if n else 1.0

    def to_take(self, unsent: Sequence[tuple[int, str, int, str]], host: str = "") -> tuple[int, int] | None:
        """For an idle worker whose kernel host serves `host` (a family, or an adapter's spec) when no chunk is left:
        (owner, n) to take the last n of the `unsent` cases of that owner's chunk, or None. `unsent`: (owner, spec,
        cases not yet sent, the host that chunk needs)."""
        best = max((u for u in unsent if u[2] > 0), key=lambda u: self.per_case(u[1]) * u[2], default=None)
        if best is None:
            return None
        n = (best[2] + 1) // 2
        same = bool(host) and best[3] == host
        return (best[0], n) if self.per_case(best[1]) * n > (STEAL_SAME_HOST_S if same else STEAL_NEW_HOST_S) else None
