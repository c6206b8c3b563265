"""The permute-layout oracle (reference.permute) against brute-force derivations and its own contract checks.

Expected layouts are rebuilt here with plain Python lists (no torch indexing tricks), round trips are checked
against x broadcast over slots, and the contract checker is shown to reject each kind of defect it exists for.
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from reference.permute import (
    ExpertMapConvention,
    SortedTokenLayout,
    align_block_size,
    batched_layout,
    contiguous_layout,
    layout_invariant_violations,
    permute_batched,
    permute_contiguous,
    permute_sorted,
    unpermute_batched,
    unpermute_contiguous,
    unpermute_sorted,
)

KEEP = ExpertMapConvention.KEEP_INVALID_BLOCKS
EXCLUDE = ExpertMapConvention.EXCLUDE
POOL = ExpertMapConvention.POOL_INVALID_FIRST


# ------------------------------------------------------------------------------------------------------------
# Routings
# ------------------------------------------------------------------------------------------------------------


def random_routing(m: int, k: int, e: int, seed: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """k distinct experts per token, like a real top-k."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randperm(e, generator=g)[:k] for _ in range(m)]
    return (torch.stack(rows) if rows else torch.zeros(0, k, dtype=torch.int64)).to(dtype)


def make_map(e: int, local: list[int]) -> torch.Tensor:
    """Expert map with the given global experts local, numbered in ascending order."""
    m = [-1] * e
    for i, g in enumerate(sorted(local)):
        m[g] = i
    return torch.tensor(m, dtype=torch.int32)


def edge_routings() -> list[tuple[str, torch.Tensor, int, int, torch.Tensor | None]]:
    """(name, topk_ids, num_experts, block_size, expert_map)."""
    one_expert = torch.full((7, 1), 3, dtype=torch.int32)
    return [
        ("M=0", torch.zeros(0, 2, dtype=torch.int32), 4, 4, None),
        ("M=0 bs=1", torch.zeros(0, 3, dtype=torch.int64), 5, 1, None),
        ("M=1", torch.tensor([[2, 0]], dtype=torch.int32), 4, 4, None),
        ("empty experts", torch.tensor([[1, 5], [5, 1], [1, 5]], dtype=torch.int32), 8, 2, None),
        ("all to one expert", one_expert, 6, 4, None),
        ("one expert, duplicates in a row", torch.full((3, 2), 1, dtype=torch.int64), 3, 4, None),
        ("k=1", random_routing(9, 1, 5, 1), 5, 3, None),
        ("k=E", random_routing(5, 6, 6, 2), 6, 4, None),
        ("E=257", random_routing(11, 8, 257, 3), 257, 16, None),
        ("block_size=1", random_routing(6, 2, 5, 4), 5, 1, None),
        ("block_size not dividing", random_routing(13, 3, 4, 5), 4, 5, None),
        ("block larger than all", random_routing(3, 2, 4, 6), 4, 64, None),
        ("map: no local experts", random_routing(6, 2, 6, 7), 6, 4, make_map(6, [])),
        ("map: some local", random_routing(10, 3, 8, 8), 8, 4, make_map(8, [1, 2, 6])),
        ("map: all local", random_routing(4, 2, 4, 9), 4, 2, make_map(4, [0, 1, 2, 3])),
        ("map: round robin", random_routing(12, 4, 8, 10), 8, 3, make_map(8, [1, 3, 5, 7])),
        ("map: local expert unused", torch.tensor([[0, 1]], dtype=torch.int32), 4, 2, make_map(4, [1, 3])),
    ]


EDGE = edge_routings()
EDGE_IDS = [c[0] for c in EDGE]


def written_ids(e: int, expert_map: torch.Tensor | None) -> list[int]:
    return list(range(e)) if expert_map is None else expert_map.tolist()


# ------------------------------------------------------------------------------------------------------------
# Sorted-token layout
# ------------------------------------------------------------------------------------------------------------


def brute_force_sorted(
    topk_ids: torch.Tensor, e: int, bs: int, expert_map: torch.Tensor | None, conv: ExpertMapConvention
) -> tuple[list[int], list[int], int]:
    flat = topk_ids.reshape(-1).tolist()
    n = len(flat)
    wid = written_ids(e, expert_map)
    ids: list[int] = []
    blocks: list[int] = []
    pooled = conv == POOL and expert_map is not None
    if pooled:  # every non-local entry, in one group before the experts
        pool = [i for i, v in enumerate(flat) if wid[v] == -1]
        while len(pool) % bs:
            pool.append(n)
        ids += pool
        blocks += [-1] * (len(pool) // bs)
    for expert in range(e):
        mine = [i for i, v in enumerate(flat) if v == expert]
        if not mine or (wid[expert] == -1 and (conv == EXCLUDE or pooled)):
            continue
        while len(mine) % bs:
            mine.append(n)
        ids += mine
        blocks += [wid[expert]] * (len(mine) // bs)
    used = len(ids)
    capacity = n + e * (bs - 1)
    ids += [n] * (capacity - used)
    blocks += [-1] * (-(-capacity // bs) - len(blocks))
    return ids, blocks, used


def assert_sorted_matches_brute_force(topk_ids, e, bs, expert_map, conv) -> SortedTokenLayout:
    layout = align_block_size(topk_ids, bs, e, expert_map=expert_map, ep_convention=conv)
    ids, blocks, used = brute_force_sorted(topk_ids, e, bs, expert_map, conv)
    for t in (layout.sorted_token_ids, layout.expert_ids, layout.num_tokens_post_padded):
        assert t.dtype == torch.int32
    assert layout.sorted_token_ids.tolist() == ids
    assert layout.expert_ids.tolist() == blocks
    assert layout.num_tokens_post_padded.tolist() == [used]
    assert layout_invariant_violations(layout, topk_ids, bs, e, expert_map=expert_map, ep_convention=conv) == []
    return layout


@pytest.mark.parametrize("conv", list(ExpertMapConvention))
@pytest.mark.parametrize("case", EDGE, ids=EDGE_IDS)
def test_align_edge_routings(case, conv) -> None:
    _, topk_ids, e, bs, expert_map = case
    assert_sorted_matches_brute_force(topk_ids, e, bs, expert_map, conv)


@given(
    m=st.integers(0, 12),
    e=st.integers(1, 20),
    k_frac=st.floats(0, 1),
    bs=st.sampled_from([1, 2, 3, 4, 16]),
    seed=st.integers(0, 2**31),
    local_frac=st.sampled_from([None, 0.0, 0.3, 1.0]),
    conv=st.sampled_from(list(ExpertMapConvention)),
)
def test_align_random_routings(m, e, k_frac, bs, seed, local_frac, conv) -> None:
    k = 1 + int(k_frac * (e - 1))
    topk_ids = random_routing(m, k, e, seed, torch.int64 if seed % 2 else torch.int32)
    expert_map = None
    if local_frac is not None:
        g = torch.Generator().manual_seed(seed + 1)
        expert_map = make_map(e, torch.randperm(e, generator=g)[: int(local_frac * e)].tolist())
    layout = assert_sorted_matches_brute_force(topk_ids, e, bs, expert_map, conv)
    x = torch.randn(m, 5, generator=torch.Generator().manual_seed(seed))
    _check_sorted_round_trip(x, topk_ids, layout, e, expert_map, conv)


def _kept_mask(topk_ids, expert_map, conv) -> torch.Tensor:
    """Which (token, slot) pairs a layout holds."""
    if expert_map is None or conv in (KEEP, POOL):
        return torch.ones(topk_ids.shape, dtype=torch.bool)
    rows = [[expert_map[v] >= 0 for v in row] for row in topk_ids.tolist()]
    return torch.tensor(rows, dtype=torch.bool).reshape(topk_ids.shape)  # reshape: M = 0 gives a 1-D tensor


def _check_sorted_round_trip(x, topk_ids, layout, e, expert_map, conv) -> None:
    back = unpermute_sorted(permute_sorted(x, layout), layout)
    kept = _kept_mask(topk_ids, expert_map, conv)
    m, k = topk_ids.shape
    want = torch.where(kept[:, :, None], x[:, None, :].expand(m, k, x.shape[1]), torch.zeros(()))
    assert back.shape == (m, k, x.shape[1])
    assert torch.equal(back, want)


@pytest.mark.parametrize("conv", list(ExpertMapConvention))
@pytest.mark.parametrize("case", EDGE, ids=EDGE_IDS)
def test_sorted_round_trip(case, conv) -> None:
    _, topk_ids, e, bs, expert_map = case
    layout = align_block_size(topk_ids, bs, e, expert_map=expert_map, ep_convention=conv)
    x = torch.randn(topk_ids.shape[0], 3, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    _check_sorted_round_trip(x, topk_ids, layout, e, expert_map, conv)


def test_sorted_simulated_gemm_sees_the_right_expert() -> None:
    """A fake GEMM scales each row by (its block's expert id + 1); unpermute must give x[t] * (id[t, j] + 1)."""
    topk_ids = random_routing(9, 3, 7, 11)
    layout = align_block_size(topk_ids, 4, 7)
    x = torch.randn(9, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    rows = permute_sorted(x, layout)
    block_of_row = torch.arange(rows.shape[0]) // 4
    rows = rows * (layout.expert_ids[block_of_row].to(torch.float64) + 1)[:, None]
    out = unpermute_sorted(rows, layout)
    for t in range(9):
        for j in range(3):
            assert torch.equal(out[t, j], x[t] * (int(topk_ids[t, j]) + 1))


def test_sorted_permute_padding_rows_and_sentinel() -> None:
    topk_ids = torch.tensor([[0], [0], [0]], dtype=torch.int32)  # 3 entries, block 4: one padding row
    layout = align_block_size(topk_ids, 4, 2)
    x = torch.tensor([[1.0], [2.0], [3.0]])
    rows = permute_sorted(x, layout)
    assert rows[:4, 0].tolist() == [1.0, 2.0, 3.0, 0.0]
    assert layout.sorted_token_ids[3] == 3  # the sentinel is numel


# ------------------------------------------------------------------------------------------------------------
# The contract checker rejects what it exists for
# ------------------------------------------------------------------------------------------------------------


def _valid():
    # experts 0: 3 entries, 1: 1 entry, 2: 6 entries, 3: none; block 2
    topk_ids = torch.tensor([[0, 2], [2, 1], [0, 2], [2, 0], [2, 2]], dtype=torch.int32)
    layout = align_block_size(topk_ids, 2, 4)
    return topk_ids, [t.clone() for t in (layout.sorted_token_ids, layout.expert_ids,
                                          layout.num_tokens_post_padded)]


def _mutate(name: str, ids: torch.Tensor, eids: torch.Tensor, ntpp: torch.Tensor):
    # valid layout: ids = [0 4 | 7 10 | 3 10 | 1 2 | 5 6 | 8 9 | 10 ...], eids = [0 0 1 2 2 2 -1 ...]
    if name == "swap within expert":
        ids[[0, 1]] = ids[[1, 0]]
        ids[[6, 9]] = ids[[9, 6]]
    elif name == "padding moved within expert":
        ids[[1, 3]] = ids[[3, 1]]
    elif name == "swap across experts":
        ids[[0, 4]] = ids[[4, 0]]
    elif name == "entry dropped":
        ids[6] = 10
    elif name == "entry duplicated":
        ids[3] = 0
    elif name == "junk index":
        ids[3] = 11
    elif name == "wrong expert id":
        eids[2] = 3
    elif name == "ntpp off":
        ntpp[0] = 14
    elif name == "tail not sentinel":
        ids[-1] = 0
    elif name == "expert_ids tail not -1":
        eids[-1] = 0
    elif name == "blocks out of order":
        ids[[4, 5, 2, 3]] = ids[[2, 3, 4, 5]].clone()
        eids[[1, 2]] = eids[[2, 1]].clone()
    elif name == "wrong dtype":
        ids = ids.to(torch.int64)
    elif name == "capacity below ntpp":
        ids = ids[:11]
    elif name == "expert_ids shorter than the used blocks":
        eids = eids[:5]
    elif name == "2-D sorted_token_ids":
        ids = ids[None]
    return ids, eids, ntpp


@pytest.mark.parametrize(
    "name, expect",
    [
        ("swap within expert", None),
        ("padding moved within expert", None),
        ("swap across experts", "mixes entries"),
        ("entry dropped", "wrong number of times"),
        ("entry duplicated", "wrong number of times"),
        ("junk index", "neither an index"),
        ("wrong expert id", r"expert_ids\[2\]"),
        ("ntpp off", "num_tokens_post_padded"),
        ("tail not sentinel", None),  # past num_tokens_post_padded: never read, kernels differ there
        ("expert_ids tail not -1", None),
        ("blocks out of order", "ascending expert order"),
        ("wrong dtype", "dtype torch.int64"),
        ("capacity below ntpp", "capacity 11 is smaller than num_tokens_post_padded 12"),
        ("expert_ids shorter than the used blocks", "fewer than the 6 used blocks"),
        ("2-D sorted_token_ids", "expected 1-D"),
    ],
)
def test_checker_rejects_planted_defects(name: str, expect: str | None) -> None:
    topk_ids, (ids, eids, ntpp) = _valid()
    assert ids.tolist()[:12] == [0, 4, 7, 10, 3, 10, 1, 2, 5, 6, 8, 9], "fixture changed"
    assert layout_invariant_violations((ids, eids, ntpp), topk_ids, 2, 4) == []
    problems = layout_invariant_violations(_mutate(name, ids, eids, ntpp), topk_ids, 2, 4)
    if expect is None:
        assert problems == []
    else:
        assert any(re.search(expect, p) for p in problems), problems


@pytest.mark.parametrize("m, k, e, bs", [(1, 2, 8, 16), (3, 1, 64, 4), (6, 2, 4, 2), (40, 8, 16, 32)])
def test_checker_accepts_any_capacity_covering_the_used_part(m: int, k: int, e: int, bs: int) -> None:
    """vLLM's wrapper allocates min(numel * block_size, numel + E * (block_size - 1)) entries, padded variants
    round the capacity up to block_size: any capacity >= num_tokens_post_padded is valid."""
    topk_ids = random_routing(m, k, e, seed=m + e)
    layout = align_block_size(topk_ids, bs, e)
    used, numel = int(layout.num_tokens_post_padded[0]), topk_ids.numel()
    full = numel + e * (bs - 1)
    for cap in sorted({used, min(numel * bs, full), full, -(-full // bs) * bs, full + 3 * bs}):
        ids = torch.full((cap,), numel, dtype=torch.int32)
        ids[:used] = layout.sorted_token_ids[:used]
        eids = torch.full((-(-cap // bs),), 0, dtype=torch.int32)  # vLLM's kernels fill the tail with 0 or -1
        eids[: used // bs] = layout.expert_ids[: used // bs]
        got = layout_invariant_violations((ids, eids, layout.num_tokens_post_padded), topk_ids, bs, e)
        assert got == [], (cap, got)
    if used:
        short = layout.sorted_token_ids[: used - 1]
        problems = layout_invariant_violations((short, layout.expert_ids, layout.num_tokens_post_padded),
                                               topk_ids, bs, e)
        assert any("is smaller than num_tokens_post_padded" in p for p in problems), problems


def test_checker_knows_the_conventions() -> None:
    topk_ids = random_routing(8, 2, 6, 3)
    expert_map = make_map(6, [0, 4, 5])
    keep = align_block_size(topk_ids, 4, 6, expert_map=expert_map, ep_convention=KEEP)
    excl = align_block_size(topk_ids, 4, 6, expert_map=expert_map, ep_convention=EXCLUDE)
    assert layout_invariant_violations(keep, topk_ids, 4, 6, expert_map=expert_map, ep_convention=EXCLUDE)
    assert layout_invariant_violations(excl, topk_ids, 4, 6, expert_map=expert_map, ep_convention=KEEP)
    # global ids where local ids are due (every local id is global - 1 here)
    plain = align_block_size(topk_ids, 4, 6)
    problems = layout_invariant_violations(plain, topk_ids, 4, 6, expert_map=make_map(6, [1, 2, 3, 4, 5]))
    assert any("expert_ids" in p for p in problems)


def test_checker_rejects_padding_only_block() -> None:
    topk_ids = torch.tensor([[0], [3]], dtype=torch.int32)  # experts 0 and 3 used, 1 and 2 empty; block 2
    ids = torch.tensor([0, 2, 2, 2, 1, 2], dtype=torch.int32)  # a block for empty expert 1 in the middle
    eids = torch.tensor([0, 1, 3], dtype=torch.int32)
    problems = layout_invariant_violations((ids, eids, torch.tensor([6], dtype=torch.int32)), topk_ids, 2, 4)
    assert any("only padding" in p for p in problems)


# ------------------------------------------------------------------------------------------------------------
# POOL_INVALID_FIRST: every non-local entry in one leading group of -1 blocks (worked by hand)
# ------------------------------------------------------------------------------------------------------------

# E = 4, experts 1 and 3 local (local ids 0 and 1); flat entries 0..5 go to experts 0 1 2 3 1 0; numel = 6
POOL_IDS = torch.tensor([[0, 1], [2, 3], [1, 0]], dtype=torch.int32)
POOL_MAP = torch.tensor([-1, 0, -1, 1], dtype=torch.int32)


@pytest.mark.parametrize(
    "bs, conv, ids, eids, ntpp",
    [
        # pool {0, 2, 5} + 1 pad | expert 1 {1, 4} | expert 3 {3} + 1 pad; capacity 6 + 4 * 1 = 10, 5 blocks
        (2, POOL, [0, 2, 5, 6, 1, 4, 3, 6, 6, 6], [-1, -1, 0, 1, -1], 8),
        # the same routing, one block per non-local expert, in expert order (for contrast)
        (2, KEEP, [0, 5, 1, 4, 2, 6, 3, 6, 6, 6], [-1, 0, -1, 1, -1], 8),
        # block 4: the pool pads once (12 used), where separate non-local blocks pad twice (16 used)
        (4, POOL, [0, 2, 5, 6, 1, 4, 6, 6, 3, 6, 6, 6, 6, 6, 6, 6, 6, 6], [-1, 0, 1, -1, -1], 12),
        (4, KEEP, [0, 5, 6, 6, 1, 4, 6, 6, 2, 6, 6, 6, 3, 6, 6, 6, 6, 6], [-1, 0, -1, 1, -1], 16),
    ],
)
def test_pooled_layout_worked_examples(bs, conv, ids, eids, ntpp) -> None:
    layout = align_block_size(POOL_IDS, bs, 4, expert_map=POOL_MAP, ep_convention=conv)
    assert layout.sorted_token_ids.tolist() == ids
    assert layout.expert_ids.tolist() == eids
    assert layout.num_tokens_post_padded.tolist() == [ntpp]
    assert layout_invariant_violations(layout, POOL_IDS, bs, 4, expert_map=POOL_MAP, ep_convention=conv) == []


def test_pooled_layout_without_non_local_entries_is_the_plain_layout() -> None:
    topk_ids = torch.tensor([[1, 3], [3, 1], [1, 1]], dtype=torch.int32)  # only local experts routed
    pooled = align_block_size(topk_ids, 2, 4, expert_map=POOL_MAP, ep_convention=POOL)
    assert pooled.sorted_token_ids[:6].tolist() == [0, 3, 4, 5, 1, 2]
    assert pooled.expert_ids[:3].tolist() == [0, 0, 1]
    assert pooled.num_tokens_post_padded.tolist() == [6]
    no_map = align_block_size(POOL_IDS, 2, 4, ep_convention=POOL)  # no map: nothing is non-local
    assert no_map.sorted_token_ids.tolist() == [0, 5, 1, 4, 2, 6, 3, 6, 6, 6]
    assert no_map.expert_ids.tolist() == [0, 1, 2, 3, -1]


def test_pooled_layout_with_no_local_expert_is_one_pool() -> None:
    topk_ids = torch.tensor([[0], [2], [1]], dtype=torch.int32)  # numel 3: sentinel 3; capacity 3 + 3 = 6
    layout = align_block_size(topk_ids, 2, 3, expert_map=torch.full((3,), -1, dtype=torch.int32), ep_convention=POOL)
    assert layout.sorted_token_ids.tolist() == [0, 1, 2, 3, 3, 3]
    assert layout.expert_ids.tolist() == [-1, -1, -1]
    assert layout.num_tokens_post_padded.tolist() == [4]


@pytest.mark.parametrize(
    "name, ids, eids, ntpp, expect",
    [
        ("pool order free", [5, 6, 2, 0, 1, 4, 6, 3], [-1, -1, 0, 1], 8, None),
        ("per-expert non-local blocks", [0, 5, 1, 4, 2, 6, 3, 6], [-1, 0, -1, 1], 8, "ascending expert order"),
        ("pool last", [1, 4, 3, 6, 0, 2, 5, 6], [0, 1, -1, -1], 8, "ascending expert order"),
        ("pool padding in its middle", [0, 5, 2, 6, 1, 4, 3, 6], [-1, -1, 0, 1], 8, None),
        ("a padding-only pool block", [0, 5, 2, 6, 6, 6, 1, 4, 3, 6], [-1, -1, -1, 0, 1], 10, "only padding"),
        ("pool block tagged local", [0, 2, 5, 6, 1, 4, 3, 6], [-1, 0, 0, 1], 8, r"expert_ids\[1\]: 0, expected -1"),
        ("local entry in the pool", [0, 2, 5, 1, 6, 4, 3, 6], [-1, -1, 0, 1], 8, "mixes entries"),
    ],
)
def test_checker_knows_the_pooled_layout(name: str, ids, eids, ntpp, expect: str | None) -> None:
    got = (torch.tensor(ids, dtype=torch.int32), torch.tensor(eids, dtype=torch.int32),
           torch.tensor([ntpp], dtype=torch.int32))
    problems = layout_invariant_violations(got, POOL_IDS, 2, 4, expert_map=POOL_MAP, ep_convention=POOL)
    if expect is None:
        assert problems == []
    else:
        assert any(re.search(expect, p) for p in problems), problems


def test_pooled_and_per_expert_layouts_reject_each_other() -> None:
    for bs in (2, 4):
        pooled = align_block_size(POOL_IDS, bs, 4, expert_map=POOL_MAP, ep_convention=POOL)
        kept = align_block_size(POOL_IDS, bs, 4, expert_map=POOL_MAP, ep_convention=KEEP)
        assert layout_invariant_violations(pooled, POOL_IDS, bs, 4, expert_map=POOL_MAP, ep_convention=KEEP)
        assert layout_invariant_violations(kept, POOL_IDS, bs, 4, expert_map=POOL_MAP, ep_convention=POOL)
        assert layout_invariant_violations(pooled, POOL_IDS, bs, 4, expert_map=POOL_MAP, ep_convention=EXCLUDE)

# ------------------------------------------------------------------------------------------------------------
# Contiguous aligned layout
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alignment", [1, 4, 128])
@pytest.mark.parametrize("case", EDGE, ids=EDGE_IDS)
def test_contiguous_layout(case, alignment) -> None:
    _, topk_ids, e, _, expert_map = case
    layout = contiguous_layout(topk_ids, e, alignment=alignment, expert_map=expert_map)
    flat = topk_ids.reshape(-1).tolist()
    wid = written_ids(e, expert_map)
    counts = [flat.count(x) if wid[x] != -1 else 0 for x in range(e)]
    m_sum = sum(-(-c // alignment) * alignment for c in counts)
    assert layout.m_indices.dtype == torch.int32 and layout.row_of.dtype == torch.int32
    assert layout.m_indices.shape == (m_sum,) and layout.row_of.shape == topk_ids.shape
    mi = layout.m_indices.tolist()
    rows = layout.row_of.reshape(-1).tolist()
    # Each kept entry has its own row, labelled with its expert; excluded ones have -1.
    kept_rows = [r for r, x in zip(rows, flat) if wid[x] != -1]
    assert sorted(kept_rows) == sorted(set(kept_rows))
    for r, x in zip(rows, flat):
        assert r == -1 if wid[x] == -1 else mi[r] == wid[x]
    # Every other row is padding; each aligned chunk holds one expert, real rows before padding.
    assert sum(v != -1 for v in mi) == len(kept_rows)
    for start in range(0, m_sum, alignment):
        chunk = mi[start : start + alignment]
        real = [v for v in chunk if v != -1]
        assert real, f"chunk at {start} is all padding"
        assert len(set(real)) == 1 and chunk[: len(real)] == real
    # Segments ascend by expert.
    order = [v for i, v in enumerate(mi) if v != -1 and (i == 0 or mi[i - 1] != v)]
    assert order == sorted(order) and len(order) == len(set(order))
    # Round trip.
    x = torch.randn(topk_ids.shape[0], 6, generator=torch.Generator().manual_seed(3))
    back = unpermute_contiguous(permute_contiguous(x, layout), layout)
    kept = _kept_mask(topk_ids, expert_map, EXCLUDE)
    m, k = topk_ids.shape
    assert torch.equal(back, torch.where(kept[:, :, None], x[:, None, :].expand(m, k, 6), torch.zeros(())))


def test_contiguous_padding_rows_are_zero_and_not_read() -> None:
    topk_ids = torch.tensor([[1, 0], [1, 2]], dtype=torch.int32)
    layout = contiguous_layout(topk_ids, 3, alignment=4)
    assert layout.m_indices.tolist() == [0, -1, -1, -1, 1, 1, -1, -1, 2, -1, -1, -1]
    x = torch.tensor([[1.0], [2.0]])
    rows = permute_contiguous(x, layout)
    assert rows[:, 0].tolist() == [1, 0, 0, 0, 1, 2, 0, 0, 2, 0, 0, 0]
    rows[layout.m_indices == -1] = float("nan")
    assert not unpermute_contiguous(rows, layout).isnan().any()


# ------------------------------------------------------------------------------------------------------------
# Batched layout
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", EDGE, ids=EDGE_IDS)
def test_batched_layout(case) -> None:
    _, topk_ids, e, _, expert_map = case
    wid = written_ids(e, expert_map)
    flat = topk_ids.reshape(-1).tolist()
    num_batches = e if expert_map is None else sum(v != -1 for v in wid)
    counts = [0] * num_batches
    for x in flat:
        if wid[x] != -1:
            counts[wid[x]] += 1
    layout = batched_layout(topk_ids, e, expert_map=expert_map)
    assert layout.expert_num_tokens.dtype == torch.int32
    assert layout.expert_num_tokens.tolist() == counts
    assert layout.max_tokens == max(counts, default=0)
    rows_of: dict[int, list[int]] = {}
    for b, r, x in zip(layout.expert_of.reshape(-1).tolist(), layout.row_of.reshape(-1).tolist(), flat):
        assert b == wid[x]
        if b == -1:
            assert r == -1
        else:
            rows_of.setdefault(b, []).append(r)
    for b, rows in rows_of.items():
        assert sorted(rows) == list(range(counts[b]))
    x = torch.randn(topk_ids.shape[0], 5, generator=torch.Generator().manual_seed(4)).to(torch.float16)
    for max_tokens in (None, layout.max_tokens + 3):
        lay = batched_layout(topk_ids, e, expert_map=expert_map, max_tokens=max_tokens)
        permuted = permute_batched(x, lay)
        assert permuted.shape == (num_batches, lay.max_tokens, 5)
        back = unpermute_batched(permuted, lay)
        kept = _kept_mask(topk_ids, expert_map, EXCLUDE)
        m, k = topk_ids.shape
        assert torch.equal(back, torch.where(kept[:, :, None], x[:, None, :].expand(m, k, 5), torch.zeros(())))


def test_batched_rows_beyond_count_are_not_read() -> None:
    topk_ids = torch.tensor([[0, 1], [1, 2]], dtype=torch.int32)
    layout = batched_layout(topk_ids, 3, max_tokens=4)
    batched = permute_batched(torch.ones(2, 2), layout)
    for b, n in enumerate(layout.expert_num_tokens.tolist()):
        batched[b, n:] = float("nan")
    assert not unpermute_batched(batched, layout).isnan().any()


# ------------------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------------------

IDS = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: align_block_size(IDS.float(), 4, 4), "topk_ids must have dtype"),
        (lambda: align_block_size(IDS.reshape(-1), 4, 4), "topk_ids must be 2-D"),
        (lambda: align_block_size(IDS, 4, 3), r"topk_ids must hold expert ids in \[0, num_experts=3\), found 3"),
        (lambda: align_block_size(-IDS, 4, 4), "topk_ids must hold expert ids .* found -3"),
        (lambda: align_block_size(IDS, 0, 4), "block_size must be >= 1"),
        (lambda: align_block_size(IDS, 4, 0), "num_experts must be >= 1"),
        (lambda: align_block_size(IDS, 4.0, 4), "block_size must be an int"),
        (lambda: align_block_size(IDS, 4, 4, ep_convention="drop"), "ep_convention must be one of"),
        (lambda: align_block_size(IDS, 4, 4, expert_map=make_map(5, [0])), r"expert_map must have shape \[4\]"),
        (lambda: align_block_size(IDS, 4, 4, expert_map=make_map(4, [0]).float()), "expert_map must have dtype"),
        (lambda: align_block_size(IDS, 4, 4, expert_map=torch.tensor([0, 0, -1, -1], dtype=torch.int32)),
         "expert_map local ids must be 0..1"),
        (lambda: align_block_size(IDS, 4, 4, expert_map=torch.tensor([0, 2, -1, -1], dtype=torch.int32)),
         "expert_map local ids must be 0..1"),
        (lambda: align_block_size(IDS, 4, 4, expert_map=torch.tensor([0, -2, -1, -1], dtype=torch.int32)),
         "expert_map values must be -1"),
        (lambda: layout_invariant_violations(align_block_size(IDS, 4, 4), IDS, 4, 3), "topk_ids must hold"),
        (lambda: contiguous_layout(IDS, 4, alignment=0), "alignment must be >= 1"),
        (lambda: contiguous_layout(IDS, 2), "topk_ids must hold expert ids"),
        (lambda: batched_layout(IDS, 4, max_tokens=-1), "max_tokens must be >= 0"),
        (lambda: batched_layout(torch.tensor([[1], [1], [0]]), 4, max_tokens=1),
         "max_tokens=1 is too small: expert 1 receives 2 tokens"),
        (lambda: permute_sorted(torch.zeros(3, 2), align_block_size(IDS, 4, 4)), r"x must have shape \[2, \*\]"),
        (lambda: unpermute_sorted(torch.zeros(3, 2), align_block_size(IDS, 4, 4)),
         "rows must have at least num_tokens_post_padded=16 rows"),
        (lambda: permute_contiguous(torch.zeros(2), contiguous_layout(IDS, 4)), "x must be 2-D"),
        (lambda: unpermute_contiguous(torch.zeros(5, 2), contiguous_layout(IDS, 4)), r"rows must have shape \[512"),
        (lambda: permute_batched(torch.zeros(1, 2), batched_layout(IDS, 4)), r"x must have shape \[2, \*\]"),
        (lambda: unpermute_batched(torch.zeros(4, 2, 2), batched_layout(IDS, 4)), r"batched must have shape \[4, 1"),
    ],
)
def test_errors(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()
