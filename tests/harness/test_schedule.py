"""The sweep's chunk queue: measured adapters first by work left, a worker kept on its adapter, put-backs first."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import pytest

from harness.sweep.schedule import PROBE_CASES, STICK, ChunkQueue
from harness.sweep.workers import HOSTS_KEPT


@dataclass
class Chunk:
    spec: str
    items: list


def chunks_of(spec: str, cases: int, size: int) -> list[Chunk]:
    return [Chunk(spec, list(range(at, min(cases, at + size)))) for at in range(0, cases, size)]


def test_every_adapter_is_measured_before_any_gets_a_second_chunk() -> None:
    q = ChunkQueue(chunks_of("a", 30, 10) + chunks_of("b", 20, 10) + chunks_of("c", 10, 10))
    first = [q.take(["a"]) for _ in range(3)]
    assert [c.spec for c in first] == ["a", "b", "c"]
    assert all(len(c.items) == PROBE_CASES for c in first)


def test_the_adapter_with_the_most_measured_work_left_goes_next() -> None:
    q = ChunkQueue(chunks_of("many-cheap", 100, 10) + chunks_of("few-slow", 30, 10))
    assert q.take().spec == "many-cheap" and q.take().spec == "few-slow"
    q.observe("many-cheap", 0.01)
    q.observe("few-slow", 3.0)
    # 98 cases at 0.01 s against 28 at 3 s: the slow adapter, though it has fewer cases
    assert q.take().spec == "few-slow"
    # a worker judging the cheap adapter moves: its 1 s left is less than half of the slow one's
    assert q.take(["many-cheap"]).spec == "few-slow"


def test_a_chunk_holds_at_most_a_fair_share_of_the_work_left() -> None:
    q = ChunkQueue(chunks_of("slow", 40, 40) + chunks_of("fast", 40, 40), workers=4)
    q.take(), q.take()
    q.observe("slow", 2.0)
    q.observe("fast", 0.01)
    # 39 slow cases (78 s) and 39 fast ones (0.39 s) left over 4 workers: 19.6 s, 9 slow cases a chunk
    assert len(q.take().items) == 9


def test_a_worker_stays_with_an_adapter_it_holds_while_that_has_a_fair_part_of_the_top_work() -> None:
    q = ChunkQueue(chunks_of("a", 100, 10) + chunks_of("b", 30, 10) + chunks_of("c", 2, 2))
    q.take(), q.take(), q.take()
    for spec in "abc":
        q.observe(spec, 1.0)
    assert 29 * STICK >= 99 > 19 * STICK
    assert q.take(["c", "b"]).spec == "b"  # b: 29 s left, a: 99 s
    assert q.take(["b"]).spec == "a"  # b: 19 s left


def test_an_unmeasured_adapter_counts_at_the_mean_of_the_measured_ones() -> None:
    q = ChunkQueue(chunks_of("a", 20, 10) + chunks_of("b", 20, 10))
    q.take(), q.take()
    q.observe("a", 4.0)
    assert q.per_case("b") == pytest.approx(4.0)
    assert ChunkQueue().per_case("x") == 1.0


def test_a_chunk_put_back_goes_out_first_and_nothing_is_lost() -> None:
    q = ChunkQueue(chunks_of("a", 20, 10) + chunks_of("b", 10, 10))
    first = q.take()
    back = Chunk(first.spec, first.items[1:])
    q.appendleft(back)
    assert q.take(["b"]) is back
    rest = []
    while q:
        rest.append(q.popleft())
    assert sorted((c.spec, i) for c in rest for i in c.items) == [("a", i) for i in range(PROBE_CASES, 20)] + [
        ("b", i) for i in range(10)]
    with pytest.raises(IndexError):
        q.take()


def simulate(queue: ChunkQueue, workers: int, cost: dict[str, float], host_start: float) -> float:
    """Makespan of `workers` judging the queue's chunks; a worker pays `host_start` for an adapter whose kernel host
    it does not hold (it holds those of the HOSTS_KEPT adapters it judged last)."""
    free = [(0.0, w) for w in range(workers)]
    held: dict[int, list[str]] = {w: [] for w in range(workers)}
    end = 0.0
    while queue:
        t, w = heapq.heappop(free)
        chunk = queue.take(held[w])
        if chunk.spec not in held[w]:
            t += host_start
        held[w] = [chunk.spec, *(h for h in held[w] if h != chunk.spec)][:HOSTS_KEPT]
        for _ in chunk.items:
            t += cost[chunk.spec]
            queue.observe(chunk.spec, cost[chunk.spec])
        end = max(end, t)
        heapq.heappush(free, (t, w))
    return end


def test_an_adapter_of_few_slow_cases_does_not_end_the_run_alone() -> None:
    # A cold-cache GPU sweep in miniature: big adapters of cheap cases, and one of few cases that each compile.
    workers = 16
    plan = {"cheap-1": 600, "cheap-2": 500, "cheap-3": 400, "mid": 200, "compiling": 50}
    cost = {"cheap-1": 0.05, "cheap-2": 0.1, "cheap-3": 0.05, "mid": 0.5, "compiling": 3.0}
    size = max(2, math.ceil(sum(plan.values()) / (12 * workers)))
    queue = ChunkQueue([c for spec, n in plan.items() for c in chunks_of(spec, n, size)], workers=workers)
    ideal = sum(plan[s] * cost[s] for s in plan) / workers  # 21.9 s
    # the compiling adapter is 150 s of work: in chunks of `size` cases in plan order it started last and one
    # 30 s chunk of it ended the run alone
    assert simulate(queue, workers, cost, host_start=0.0) <= 1.15 * ideal
    queue = ChunkQueue([c for spec, n in plan.items() for c in chunks_of(spec, n, size)], workers=workers)
    assert simulate(queue, workers, cost, host_start=1.5) <= 1.4 * ideal
