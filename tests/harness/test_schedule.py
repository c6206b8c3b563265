"""The sweep's scheduling: chunks in plan order, a worker kept on its adapter, then unsent cases taken over."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import pytest

from harness.sweep.schedule import STEAL_NEW_HOST_S, ChunkQueue


@dataclass
class Chunk:
    spec: str
    items: list


def chunks_of(spec: str, cases: int, size: int) -> list[Chunk]:
    return [Chunk(spec, list(range(at, min(cases, at + size)))) for at in range(0, cases, size)]


def test_chunks_go_in_plan_order_and_a_worker_keeps_its_adapter() -> None:
    q = ChunkQueue(chunks_of("a", 20, 10) + chunks_of("b", 20, 10))
    assert q.take().spec == "a"
    assert q.take("b").spec == "b"  # the worker that holds b's kernel host takes b's chunk before a's
    assert q.take().spec == "a" and q.take().spec == "b" and not q


def test_a_chunk_put_back_goes_out_first() -> None:
    q = ChunkQueue(chunks_of("a", 20, 10))
    back = Chunk("b", [3, 4])
    q.appendleft(back)
    assert q.take() is back and q.popleft().items == list(range(10))


def test_every_adapters_first_chunk_goes_out_before_any_second_one_biggest_adapters_first() -> None:
    """Plans reach the queue in planning order (not by size): every adapter's first chunk goes out before any second
    one (an adapter of slow cases, each a compile, must not start last), the bigger adapters first; a chunk put back
    still goes first."""
    q = ChunkQueue()
    for spec, weight in (("small", (0, 10)), ("big#1", (-1, 50)), ("big", (0, 50)), ("mid", (0, 30)),
                         ("big2", (0, 50)), ("mid#1", (-1, 30)), ("none", None)):
        chunk = Chunk(spec, [1])
        if weight is not None:
            chunk.weight = weight  # type: ignore[attr-defined]
        q.insert_by_weight(chunk)
    back = Chunk("back", [2])
    q.appendleft(back)
    assert [q.popleft().spec for _ in range(len(q))] == ["back", "big", "big2", "mid", "small", "big#1", "mid#1",
                                                           "none"]


def test_seconds_per_case_are_measured_per_adapter() -> None:
    q = ChunkQueue()
    assert q.per_case("x") == 1.0  # nothing measured yet
    q.observe("a", 4.0)
    q.observe("a", 2.0)
    assert q.per_case("a") == pytest.approx(3.0)
    assert q.per_case("unmeasured") == pytest.approx(3.0)  # the mean of all measured cases


def test_an_idle_worker_takes_half_of_the_unsent_cases_with_the_most_work() -> None:
    q = ChunkQueue()
    q.observe("slow", 3.0)
    q.observe("fast", 0.01)
    # worker 0 has 40 fast cases unsent (0.4 s), worker 1 has 9 slow ones (27 s): the back half, rounded up
    assert q.to_take([(0, "fast", 40, "fast"), (1, "slow", 9, "slow")]) == (1, 5)
    # for a worker whose host serves another adapter, a half worth less than a host's start stays where it is
    assert q.to_take([(0, "fast", 40, "fast")], host="other") is None
    assert q.to_take([(1, "slow", 1, "slow")], host="other") is None
    # a worker whose host serves that chunk's adapter (one family's host) takes even its last case ...
    q.observe("mid", STEAL_NEW_HOST_S * 0.375)
    assert q.to_take([(2, "mid", 1, "family")], host="family") == (2, 1)
    assert q.to_take([(2, "mid", 4, "family")], host="family") == (2, 2)
    assert q.to_take([(2, "mid", 4, "family")], host="other") is None
    # ... unless it is worth less than moving it
    assert q.to_take([(0, "fast", 1, "family")], host="family") is None
    assert q.to_take([(0, "fast", 0, "family"), (1, "slow", 0, "family")], host="family") is None


def simulate(queue: ChunkQueue, cost: dict[str, float], workers: int, host_start: float,
             family: dict[str, str] | None = None) -> float:
    """Makespan of `workers` judging the queue, one case at a time, taking unsent halves once the chunks are out; a
    worker pays `host_start` for an adapter its host does not serve (one of another `family`, adapter -> family)."""
    family = family or {}
    left: dict[int, list] = {w: [] for w in range(workers)}
    spec: dict[int, str] = {w: "" for w in range(workers)}
    events = [(0.0, w) for w in range(workers)]
    end = 0.0
    while events:
        t, w = heapq.heappop(events)
        if not left[w]:
            chunk = queue.take(spec[w]) if queue else None
            if chunk is None:
                taken = queue.to_take([(v, spec[v], len(left[v]), family.get(spec[v], spec[v])) for v in left],
                                      family.get(spec[w], spec[w]))
                if taken is not None:
                    v, n = taken
                    chunk, left[v] = Chunk(spec[v], left[v][-n:]), left[v][:-n]
            if chunk is None:
                if any(left.values()):
                    heapq.heappush(events, (t + 0.5, w))
                continue
            if family.get(chunk.spec, chunk.spec) != family.get(spec[w], spec[w]):
                t += host_start
            spec[w], left[w] = chunk.spec, list(chunk.items)
        left[w].pop(0)
        t += cost[spec[w]]
        queue.observe(spec[w], cost[spec[w]])
        end = max(end, t)
        heapq.heappush(events, (t, w))
    return end


@pytest.mark.parametrize("host_start", [0.0, 1.5])
def test_a_slow_chunk_does_not_end_the_run_alone(host_start: float) -> None:
    # A cold-cache GPU sweep in miniature: big adapters of cheap cases, then one whose few cases each compile.
    workers = 16
    plan = {"cheap-1": 600, "cheap-2": 500, "cheap-3": 400, "mid": 200, "compiling": 50}
    cost = {"cheap-1": 0.05, "cheap-2": 0.1, "cheap-3": 0.05, "mid": 0.5, "compiling": 3.0}
    size = max(2, math.ceil(sum(plan.values()) / (2 * workers)))
    queue = ChunkQueue([c for spec, n in plan.items() for c in chunks_of(spec, n, size)])
    ideal = sum(plan[s] * cost[s] for s in plan) / workers  # 21.9 s
    # whole chunks: the compiling adapter's one chunk of 50 cases (150 s) ran on one worker
    assert simulate(queue, cost, workers, host_start) <= 1.3 * ideal + host_start * len(plan)


def test_a_last_unsent_case_does_not_wait_for_its_workers_case_in_flight() -> None:
    """Two workers, one chunk of four compiling cases (3 s each): the idle worker takes the back half; once the
    owner is on its second case, its last unsent one goes to the worker that is idle again (it had waited for the
    owner: 10.5 s instead of 7.5, with a host start of 1.5 s each)."""
    queue = ChunkQueue(chunks_of("compiling", 4, 4))
    assert simulate(queue, {"compiling": 3.0}, workers=2, host_start=1.5) == pytest.approx(7.5)


def test_one_familys_host_takes_the_last_cases_of_its_other_adapters() -> None:
    """Adapters of one family share a worker's kernel host: a worker done with one of them takes the last unsent
    case of another without the host-start margin."""
    family = {"a": "lib", "b": "lib"}
    queue = ChunkQueue(chunks_of("a", 2, 2) + chunks_of("b", 1, 1))
    # both start a host (5 s); worker 0 judges a's first case (2 s), worker 1 b's one (0.5 s), then a's second one,
    # which is worth less than a host's start but needs none (else it waited for worker 0: 9 s)
    assert simulate(queue, {"a": 2.0, "b": 0.5}, workers=2, host_start=5.0, family=family) == pytest.approx(7.5)
