"""Permute layouts: how the (token, slot) pairs of a routing are arranged in expert order (docs/SEMANTICS.md §3).

A routing is `topk_ids [M, k]` (int32 or int64) holding *global* expert ids in [0, E). Its M*k entries are
numbered by their flattened index `i = t * k + j` (token t, slot j); that number is what the sorted-token layout
stores. Three layouts are modelled, each with a permute (`x [M, K]` -> expert-ordered rows) and an unpermute
(expert-ordered rows -> `[M, k, N]`, one row per (token, slot)):

- the sorted-token layout of tiled GEMMs (`moe_align_block_size`): `align_block_size`, `permute_sorted`,
  `unpermute_sorted`, and `layout_invariant_violations`, the contract as checks (the order of the entries within
  one expert is not part of the contract, because CUDA kernels fill it with atomics);
- the contiguous aligned layout (DeepGEMM's m-grouped contiguous GEMM): `contiguous_layout`,
  `permute_contiguous`, `unpermute_contiguous`;
- the batched layout `[E, max_tokens, K]`: `batched_layout`, `permute_batched`, `unpermute_batched`.

Expert parallelism: an optional `expert_map [E]` (int32/int64) maps a global expert id to its local id on this
rank, or -1 where the expert lives elsewhere. The local ids must be exactly 0..L-1 (each once), L = number of local
experts. Wherever a layout writes an expert id (the sorted layout's `expert_ids`, the contiguous layout's
`m_indices`, the batched layout's batch index), it is the *local* id when a map is given and the global id
otherwise. Experts are always visited in ascending *global* id; for the maps used in practice (contiguous ranges,
round-robin placement) local ids increase with global ids, so this is also ascending local id.

The oracle lists each expert's entries in ascending flattened index and writes zeros into padding rows; both
are choices of the oracle, not part of the contract.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch

from reference._checks import INT_INDEX_DTYPES, check_choice, check_int, check_tensor

__all__ = [
    "BatchedLayout",
    "ContiguousLayout",
    "ExpertMapConvention",
    "SortedTokenLayout",
    "align_block_size",
    "batched_layout",
    "check_expert_map",
    "check_topk_ids",
    "contiguous_layout",
    "layout_invariant_violations",
    "local_expert_ids",
    "permute_batched",
    "permute_contiguous",
    "permute_sorted",
    "sorted_layout_capacity",
    "unpermute_batched",
    "unpermute_contiguous",
    "unpermute_sorted",
]


class ExpertMapConvention(str, enum.Enum):
    """What the sorted-token layout does with entries routed to a non-local expert (expert_map value -1).

    KEEP_INVALID_BLOCKS: the entries stay in the layout, in blocks of their own whose `expert_ids` value is -1;
        the GEMM must write zeros for those rows (vLLM `moe_align_block_size` default).
    EXCLUDE: the entries are left out entirely; no block is made for non-local experts
        (vLLM `ignore_invalid_experts=True`).
    POOL_INVALID_FIRST: the entries of all non-local experts together form one group, padded as a whole to a
        multiple of block_size and placed before every local expert: ceil(n / block_size) leading blocks whose
        `expert_ids` value is -1 (n = the number of non-local entries; no such block when n = 0), then the local
        experts' blocks as usual. Within the pool, like within an expert, the order is free and entries of different
        non-local experts share blocks. The GEMM must write zeros for those rows (SGLang's `moe_align_block_size`:
        non-local ids are -1 there, and it bins id + 1, so they sort first).
    """

    KEEP_INVALID_BLOCKS = "keep_invalid_blocks"
    EXCLUDE = "exclude"
    POOL_INVALID_FIRST = "pool_invalid_first"


# ----------------------------------------------------------------------------------------------------------
# Validation shared by the layouts (and by reference.reduce)
# ----------------------------------------------------------------------------------------------------------


def check_topk_ids(topk_ids: object, num_experts: int, name: str = "topk_ids") -> torch.Tensor:
    """Validate a routing: a 2-D int32/int64 tensor of global expert ids in [0, num_experts)."""
    t = check_tensor(name, topk_ids, ndim=2, dtypes=INT_INDEX_DTYPES)
    if t.numel():
        lo, hi = int(t.min()), int(t.max())
        if lo < 0 or hi >= num_experts:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"{name} must hold expert ids in [0, num_experts={num_experts}), found {bad}"
            )
    return t


def check_expert_map(expert_map: object, num_experts: int, name: str = "expert_map") -> int:
    """Validate an expert map `[num_experts]` int32/int64 (global id -> local id or -1).

    The local ids must be exactly 0..L-1, each once. Returns L, the number of local experts (may be 0).
    """
    m = check_tensor(name, expert_map, ndim=1, dtypes=INT_INDEX_DTYPES, shape=[num_experts])
    values = m.detach().cpu().to(torch.int64)
    if values.numel() and int(values.min()) < -1:
        raise ValueError(f"{name} values must be -1 (not local) or a local id >= 0, found {int(values.min())}")
    local = values[values >= 0]
    num_local = int(local.numel())
    if not torch.equal(torch.sort(local).values, torch.arange(num_local)):
        raise ValueError(
            f"{name} local ids must be 0..{num_local - 1}, each exactly once, got {sorted(local.tolist())}"
        )
    return num_local


def local_expert_ids(num_experts: int, expert_map: torch.Tensor | None) -> list[int]:
    """Per global expert, the id a layout writes: the global id without a map, else the local id or -1."""
    if expert_map is None:
        return list(range(num_experts))
    return [int(v) for v in expert_map.detach().cpu().tolist()]


def _entries_by_expert(topk_ids: torch.Tensor, num_experts: int) -> list[torch.Tensor]:
    """For each global expert, the flattened indices routed to it, ascending (int64, CPU)."""
    flat = topk_ids.detach().cpu().reshape(-1).to(torch.int64)
    return [torch.nonzero(flat == e).reshape(-1) for e in range(num_experts)]


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


# ----------------------------------------------------------------------------------------------------------
# Sorted-token layout (moe_align_block_size)
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SortedTokenLayout:
    """The sorted-token layout of a tiled MoE GEMM (the outputs of `moe_align_block_size`).

    sorted_token_ids: int32 `[capacity]`, capacity = M*k + E*(block_size-1). Blocks of `block_size` entries;
        each block belongs to one expert and holds flattened indices t*k+j routed to it, padded with the
        sentinel M*k. Entries from `num_tokens_post_padded` on are all the sentinel.
    expert_ids: int32 `[ceil(capacity / block_size)]`, the expert of each block (local id under an expert map,
        -1 for a kept non-local block); -1 for every block from num_tokens_post_padded / block_size on.
    num_tokens_post_padded: int32 `[1]`, the number of used entries (a multiple of block_size).
    block_size, num_tokens (M), top_k (k): the parameters the layout was built for.
    """

    sorted_token_ids: torch.Tensor
    expert_ids: torch.Tensor
    num_tokens_post_padded: torch.Tensor
    block_size: int
    num_tokens: int
    top_k: int


def sorted_layout_capacity(numel: int, num_experts: int, block_size: int) -> int:
    """Length of `sorted_token_ids`: numel + num_experts * (block_size - 1), the worst case of padding.

    It covers every convention: under POOL_INVALID_FIRST the pool exists only when some expert is not local, so
    there are at most num_experts groups to pad there too.
    """
    return numel + num_experts * (block_size - 1)


#: group key of the entries a layout leaves out (EXCLUDE)
_LEFT_OUT = -2
#: group key of the pooled non-local entries (POOL_INVALID_FIRST): below every expert id, so the pool comes first
_POOL = -1


def _entry_groups(flat: torch.Tensor, written_id: list[int], ep_convention: ExpertMapConvention) -> torch.Tensor:
    """Per flattened entry, the key of the group whose blocks hold it (int64, CPU): its global expert id, or _POOL
    for a non-local entry under POOL_INVALID_FIRST, or _LEFT_OUT for one under EXCLUDE. A layout's groups come in
    ascending key."""
    keys = [
        e if wid != -1 or ep_convention == ExpertMapConvention.KEEP_INVALID_BLOCKS
        else _POOL if ep_convention == ExpertMapConvention.POOL_INVALID_FIRST else _LEFT_OUT
        for e, wid in enumerate(written_id)
    ]
    return torch.tensor(keys, dtype=torch.int64)[flat]


def _group_id(group: int, written_id: list[int]) -> int:
    """The expert id a group's blocks carry."""
    return -1 if group == _POOL else written_id[group]


def align_block_size(
    topk_ids: torch.Tensor,
    block_size: int,
    num_experts: int,
    *,
    expert_map: torch.Tensor | None = None,
    ep_convention: ExpertMapConvention = ExpertMapConvention.KEEP_INVALID_BLOCKS,
) -> SortedTokenLayout:
    """Build the sorted-token layout of a routing (reference `moe_align_block_size`).

    Args:
        topk_ids: `[M, k]` int32/int64, global expert ids in [0, num_experts).
        block_size: rows per GEMM tile (>= 1); each expert's entries are padded to a multiple of it.
        num_experts: E, the number of global experts (>= 1).
        expert_map: optional `[E]` int32/int64, global id -> local id or -1 (see the module docstring).
        ep_convention: what happens to entries of non-local experts (only read when expert_map is given);
            default KEEP_INVALID_BLOCKS (blocks kept with expert id -1).

    Returns:
        A `SortedTokenLayout` (all tensors int32, on topk_ids' device). For each expert in ascending global id
        that has entries (and is kept by the convention): its flattened indices in ascending order (the oracle's
        choice; the contract leaves the order within an expert free), then the sentinel M*k up to a multiple of
        block_size. Experts without entries get no block. `expert_ids` holds the global id without a map, the
        local id for local experts, and -1 for kept non-local experts. Under POOL_INVALID_FIRST the non-local
        entries come first, as one group (ascending flattened index, then the sentinel), with expert id -1.
    """
    topk_ids = check_tensor("topk_ids", topk_ids, ndim=2, dtypes=INT_INDEX_DTYPES)
    block_size = check_int("block_size", block_size, min_value=1)
    num_experts = check_int("num_experts", num_experts, min_value=1)
    topk_ids = check_topk_ids(topk_ids, num_experts)
    check_choice("ep_convention", ep_convention, list(ExpertMapConvention))
    if expert_map is not None:
        check_expert_map(expert_map, num_experts)
    written_id = local_expert_ids(num_experts, expert_map)

    num_tokens, top_k = topk_ids.shape
    numel = num_tokens * top_k
    sentinel = numel
    capacity = sorted_layout_capacity(numel, num_experts, block_size)
    num_blocks_capacity = -(-capacity // block_size)

    sorted_ids = torch.full((capacity,), sentinel, dtype=torch.int64)
    expert_ids = torch.full((num_blocks_capacity,), -1, dtype=torch.int64)
    groups = _entry_groups(topk_ids.detach().cpu().reshape(-1).to(torch.int64), written_id, ep_convention)
    pos = 0
    for g in torch.unique(groups).tolist():  # ascending: groups without entries get no block
        if g == _LEFT_OUT:
            continue
        entries = torch.nonzero(groups == g).reshape(-1)
        padded = _round_up(entries.numel(), block_size)
        sorted_ids[pos : pos + entries.numel()] = entries
        expert_ids[pos // block_size : (pos + padded) // block_size] = _group_id(g, written_id)
        pos += padded

    device = topk_ids.device
    return SortedTokenLayout(
        sorted_token_ids=sorted_ids.to(torch.int32).to(device),
        expert_ids=expert_ids.to(torch.int32).to(device),
        num_tokens_post_padded=torch.tensor([pos], dtype=torch.int32, device=device),
        block_size=block_size,
        num_tokens=num_tokens,
        top_k=top_k,
    )


def permute_sorted(x: torch.Tensor, layout: SortedTokenLayout) -> torch.Tensor:
    """Gather the GEMM input rows of the sorted-token layout.

    Args:
        x: `[M, K]` any dtype, M = layout.num_tokens.
        layout: from `align_block_size`.

    Returns:
        `[capacity, K]` in x's dtype: row r is x[sorted_token_ids[r] // k] (entry i = t*k+j reads token t);
        rows holding the sentinel are zeros (the oracle's choice; they are not part of the contract).
    """
    x = check_tensor("x", x, ndim=2, shape=[layout.num_tokens, None])
    ids = layout.sorted_token_ids.detach().cpu().to(torch.int64)
    numel = layout.num_tokens * layout.top_k
    out = torch.zeros((ids.numel(), x.shape[1]), dtype=x.dtype, device=x.device)
    valid = torch.nonzero(ids < numel).reshape(-1)
    if valid.numel():
        tokens = ids[valid] // layout.top_k
        out[valid.to(x.device)] = x[tokens.to(x.device)]
    return out


def unpermute_sorted(rows: torch.Tensor, layout: SortedTokenLayout) -> torch.Tensor:
    """Scatter rows in sorted-token order back to one row per (token, slot).

    Args:
        rows: `[R, N]` any dtype, R >= num_tokens_post_padded; row r belongs to entry sorted_token_ids[r].
            Only rows below num_tokens_post_padded that hold a real entry (not the sentinel) are read.
        layout: from `align_block_size`.

    Returns:
        `[M, k, N]` in rows' dtype; out[t, j] = the row of entry t*k+j. Entries absent from the layout
        (non-local experts under the EXCLUDE convention) are zeros. Kept non-local blocks (expert id -1) are
        copied like any other: whether their rows are zero is the GEMM's business.
    """
    used = int(layout.num_tokens_post_padded.reshape(-1)[0])
    rows = check_tensor("rows", rows, ndim=2)
    if rows.shape[0] < used:
        raise ValueError(
            f"rows must have at least num_tokens_post_padded={used} rows, got shape {list(rows.shape)}"
        )
    numel = layout.num_tokens * layout.top_k
    ids = layout.sorted_token_ids.detach().cpu().to(torch.int64)[:used]
    out = torch.zeros((numel, rows.shape[1]), dtype=rows.dtype, device=rows.device)
    src = torch.nonzero(ids < numel).reshape(-1)
    if src.numel():
        out[ids[src].to(rows.device)] = rows[src.to(rows.device)]
    return out.reshape(layout.num_tokens, layout.top_k, rows.shape[1])


def layout_invariant_violations(
    layout: SortedTokenLayout | tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    topk_ids: torch.Tensor,
    block_size: int,
    num_experts: int,
    *,
    expert_map: torch.Tensor | None = None,
    ep_convention: ExpertMapConvention = ExpertMapConvention.KEEP_INVALID_BLOCKS,
) -> list[str]:
    """Judge a sorted-token layout (from any kernel) against the contract; returns the violations found.

    `layout` is a `SortedTokenLayout` or the tuple (sorted_token_ids, expert_ids, num_tokens_post_padded).
    The other arguments are those `align_block_size` takes (they are validated and raise ValueError; the
    layout itself never raises, every defect is reported as a string). An empty list means the layout is
    valid. The contract, with numel = M*k and sentinel = numel:

    - dtypes int32; sorted_token_ids 1-D of any capacity >= num_tokens_post_padded (the oracle allocates
      `sorted_layout_capacity`, vLLM's wrapper min(numel * block_size, that), padded variants round it up),
      expert_ids 1-D with at least num_tokens_post_padded / block_size entries, num_tokens_post_padded `[1]`;
    - num_tokens_post_padded is the sum over kept groups of their entry count rounded up to block_size; a group
      is one expert, except under POOL_INVALID_FIRST, where all non-local experts form one group (the pool);
    - within the used part every block belongs to one group: its entries are real indices of that group or
      the sentinel, and it holds at least one real entry; blocks ascend by global expert id, the pool first
      (so each group's blocks are contiguous); each kept group has exactly ceil(count / block_size) blocks;
    - every kept (token, slot) index appears exactly once, excluded ones (EXCLUDE convention) never;
    - expert_ids of a used block is its group's written id (global id, local id, or -1 for kept non-local
      entries, pooled or not).

    Only the used part (`sorted_token_ids[:num_tokens_post_padded]` and its blocks' expert_ids) is checked:
    what lies past it is never read by the GEMM, and kernels differ there (the oracle writes the sentinel and
    -1; vLLM's kernels fill expert_ids with 0 or -1, some fill sorted ids only in the used region). The order
    of entries within an expert's blocks, and where its padding sits among them, are not checked either.
    """
    block_size = check_int("block_size", block_size, min_value=1)
    num_experts = check_int("num_experts", num_experts, min_value=1)
    topk_ids = check_topk_ids(topk_ids, num_experts)
    check_choice("ep_convention", ep_convention, list(ExpertMapConvention))
    if expert_map is not None:
        check_expert_map(expert_map, num_experts)
    written_id = local_expert_ids(num_experts, expert_map)

    if isinstance(layout, SortedTokenLayout):
        sorted_ids, expert_ids, ntpp = layout.sorted_token_ids, layout.expert_ids, layout.num_tokens_post_padded
    else:
        sorted_ids, expert_ids, ntpp = layout

    # Structure first: if it is wrong, nothing else can be read.
    problems = _structure_problems(sorted_ids, expert_ids, ntpp)
    if problems:
        return problems

    ids = sorted_ids.detach().cpu().to(torch.int64)
    eids = expert_ids.detach().cpu().to(torch.int64)
    used = int(ntpp.detach().cpu()[0])
    flat = topk_ids.detach().cpu().reshape(-1).to(torch.int64)
    groups = _entry_groups(flat, written_id, ep_convention)
    counts = {g: int((groups == g).sum()) for g in torch.unique(groups).tolist() if g != _LEFT_OUT}
    expected_used = sum(_round_up(c, block_size) for c in counts.values())
    if used != expected_used:
        problems.append(f"num_tokens_post_padded: {used}, expected {expected_used}")
    if used < 0 or used % block_size:
        problems.append(f"num_tokens_post_padded: {used} is not a non-negative multiple of block_size={block_size}")
        return problems
    num_used_blocks = used // block_size
    if used > ids.numel():
        problems.append(f"sorted_token_ids: capacity {ids.numel()} is smaller than num_tokens_post_padded {used}")
    if num_used_blocks > eids.numel():
        problems.append(f"expert_ids: {eids.numel()} entries, fewer than the {num_used_blocks} used blocks")
    if used > ids.numel() or num_used_blocks > eids.numel():
        return problems
    problems += _entry_problems(ids[:used], flat, groups != _LEFT_OUT, topk_ids.shape[1])
    problems += _block_problems(ids[:used], eids, groups, counts, written_id, block_size)
    return problems


def _structure_problems(sorted_ids: Any, expert_ids: Any, ntpp: Any) -> list[str]:
    """The three outputs are int32 tensors: sorted_token_ids and expert_ids 1-D (lengths are judged against
    num_tokens_post_padded later), num_tokens_post_padded of shape [1]."""
    problems: list[str] = []
    for name, t, shape_ok, want in (
        ("sorted_token_ids", sorted_ids, lambda t: t.dim() == 1, "1-D"),
        ("expert_ids", expert_ids, lambda t: t.dim() == 1, "1-D"),
        ("num_tokens_post_padded", ntpp, lambda t: list(t.shape) == [1], "[1]"),
    ):
        if not isinstance(t, torch.Tensor):
            problems.append(f"{name}: not a tensor ({type(t).__name__})")
            continue
        if t.dtype != torch.int32:
            problems.append(f"{name}: dtype {t.dtype}, expected torch.int32")
        if not shape_ok(t):
            problems.append(f"{name}: shape {list(t.shape)}, expected {want}")
    return problems


def _entry_problems(body: torch.Tensor, flat: torch.Tensor, kept: torch.Tensor, k: int) -> list[str]:
    """In the used part: real indices or the sentinel, never anything else; each kept (token, slot) exactly once,
    excluded ones never (`kept`: per flattened entry)."""
    problems = []
    numel = flat.numel()
    real = (body >= 0) & (body < numel)
    junk = ~real & (body != numel)
    if bool(junk.any()):
        first = int(torch.nonzero(junk)[0])
        problems.append(
            f"sorted_token_ids: {int(junk.sum())} used entries are neither an index in [0, {numel}) nor the "
            f"sentinel {numel} (first at {first}: {int(body[first])})"
        )
    seen = torch.bincount(body[real], minlength=numel) if numel else torch.zeros(0, dtype=torch.int64)
    expected_seen = kept.to(torch.int64)
    wrong = torch.nonzero(seen != expected_seen).reshape(-1)
    if wrong.numel():
        i = int(wrong[0])
        problems.append(
            f"sorted_token_ids: {wrong.numel()} (token, slot) entries appear the wrong number of times "
            f"(first: entry {i} = token {i // max(k, 1)} slot {i % max(k, 1)}, "
            f"expert {int(flat[i])}, appears {int(seen[i])}x, expected {int(expected_seen[i])}x)"
        )
    return problems


def _block_problems(body: torch.Tensor, eids: torch.Tensor, groups: torch.Tensor, counts: dict[int, int],
                    written_id: list[int], block_size: int) -> list[str]:
    """Blocks: one group each, at least one real entry, ascending groups, the right count and expert id."""
    problems = []
    numel = groups.numel()
    block_group: list[int] = []
    for b in range(body.numel() // block_size):
        block = body[b * block_size : (b + 1) * block_size]
        members = block[(block >= 0) & (block < numel)]
        found = sorted(set(groups[members].tolist()))
        if not found:
            problems.append(f"block {b}: holds only padding (an expert without entries must get no block)")
            continue
        if len(found) > 1:
            problems.append(f"block {b}: mixes entries of {', '.join(_group_label(g) for g in found)}")
        kept = [g for g in found if g != _LEFT_OUT]
        if not kept:  # entries that must not be there at all: reported per entry
            continue
        g = kept[0]
        block_group.append(g)
        want = _group_id(g, written_id)
        if int(eids[b]) != want:
            problems.append(f"expert_ids[{b}]: {int(eids[b])}, expected {want} ({_group_label(g, 'global ')})")
    if block_group != sorted(block_group):
        pool = " (-1: the non-local pool, due first)" if _POOL in block_group else ""
        problems.append(f"blocks are not in ascending expert order{pool}: {block_group}")
    for g, count in counts.items():
        want = -(-count // block_size)
        have = block_group.count(g)
        if have != want:
            problems.append(
                f"{_group_label(g)}: {have} blocks for {count} entries, expected {want} (block_size {block_size})"
            )
    return problems


def _group_label(group: int, expert: str = "") -> str:
    if group == _POOL:
        return "the non-local pool"
    if group == _LEFT_OUT:
        return "entries left out (non-local, EXCLUDE)"
    return f"{expert}expert {group}"


# ----------------------------------------------------------------------------------------------------------
# Contiguous aligned layout (DeepGEMM m-grouped contiguous)
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContiguousLayout:
    """Rows grouped by expert, each expert's segment padded to a multiple of `alignment` (DeepGEMM).

    m_indices: int32 `[M_sum]`, the expert of each row (local id under an expert map), -1 for padding rows.
        M_sum = sum over kept experts of round_up(count, alignment): the exact size, no worst-case capacity.
    row_of: int32 `[M, k]`, the row of each (token, slot); -1 where excluded (non-local expert under a map).
    alignment, num_tokens (M), top_k (k): the parameters the layout was built for.
    """

    m_indices: torch.Tensor
    row_of: torch.Tensor
    alignment: int
    num_tokens: int
    top_k: int


def contiguous_layout(
    topk_ids: torch.Tensor,
    num_experts: int,
    *,
    alignment: int = 128,
    expert_map: torch.Tensor | None = None,
) -> ContiguousLayout:
    """Build the contiguous aligned layout of a routing.

    Args:
        topk_ids: `[M, k]` int32/int64, global expert ids in [0, num_experts).
        num_experts: E (>= 1).
        alignment: segment alignment in rows (>= 1), default 128 (DeepGEMM's M block).
        expert_map: optional `[E]` global -> local id or -1; entries of non-local experts are excluded
            (row -1) and get no rows.

    Returns:
        A `ContiguousLayout` (int32 tensors on topk_ids' device). Segments in ascending global expert id;
        experts without entries have an empty segment; within a segment the oracle puts entries in ascending
        flattened index (t*k+j), then the padding rows.
    """
    topk_ids = check_tensor("topk_ids", topk_ids, ndim=2, dtypes=INT_INDEX_DTYPES)
    num_experts = check_int("num_experts", num_experts, min_value=1)
    alignment = check_int("alignment", alignment, min_value=1)
    topk_ids = check_topk_ids(topk_ids, num_experts)
    if expert_map is not None:
        check_expert_map(expert_map, num_experts)
    written_id = local_expert_ids(num_experts, expert_map)

    num_tokens, top_k = topk_ids.shape
    row_of = torch.full((num_tokens * top_k,), -1, dtype=torch.int64)
    segments: list[torch.Tensor] = []
    pos = 0
    for e, entries in enumerate(_entries_by_expert(topk_ids, num_experts)):
        if written_id[e] == -1 or entries.numel() == 0:
            continue
        padded = _round_up(entries.numel(), alignment)
        segment = torch.full((padded,), -1, dtype=torch.int64)
        segment[: entries.numel()] = written_id[e]
        segments.append(segment)
        row_of[entries] = torch.arange(pos, pos + entries.numel())
        pos += padded
    m_indices = torch.cat(segments) if segments else torch.zeros(0, dtype=torch.int64)
    device = topk_ids.device
    return ContiguousLayout(
        m_indices=m_indices.to(torch.int32).to(device),
        row_of=row_of.reshape(num_tokens, top_k).to(torch.int32).to(device),
        alignment=alignment,
        num_tokens=num_tokens,
        top_k=top_k,
    )


def permute_contiguous(x: torch.Tensor, layout: ContiguousLayout) -> torch.Tensor:
    """Gather `x [M, K]` into the contiguous layout: `[M_sum, K]` in x's dtype.

    Row row_of[t, j] is x[t]; padding rows are zeros (the oracle's choice; not part of the contract).
    """
    x = check_tensor("x", x, ndim=2, shape=[layout.num_tokens, None])
    out = torch.zeros((layout.m_indices.numel(), x.shape[1]), dtype=x.dtype, device=x.device)
    row_of = layout.row_of.detach().cpu().to(torch.int64)
    t, _ = torch.nonzero(row_of >= 0, as_tuple=True)
    if t.numel():
        out[row_of[row_of >= 0].to(x.device)] = x[t.to(x.device)]
    return out


def unpermute_contiguous(rows: torch.Tensor, layout: ContiguousLayout) -> torch.Tensor:
    """Scatter contiguous-layout rows `[M_sum, N]` back to `[M, k, N]` (rows' dtype).

    out[t, j] = rows[row_of[t, j]]; (token, slot) pairs excluded by the expert map are zeros. Padding rows
    are never read.
    """
    rows = check_tensor("rows", rows, ndim=2, shape=[layout.m_indices.numel(), None])
    row_of = layout.row_of.detach().cpu().to(torch.int64)
    out = torch.zeros((layout.num_tokens, layout.top_k, rows.shape[1]), dtype=rows.dtype, device=rows.device)
    t, j = torch.nonzero(row_of >= 0, as_tuple=True)
    if t.numel():
        out[t.to(rows.device), j.to(rows.device)] = rows[row_of[t, j].to(rows.device)]
    return out


# ----------------------------------------------------------------------------------------------------------
# Batched layout [E, max_tokens, K]
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchedLayout:
    """One batch of `max_tokens` rows per expert (local experts only under an expert map).

    expert_num_tokens: int32 `[E']`, the number of valid rows of each batch; E' = E, or L under a map.
    expert_of: int32 `[M, k]`, the batch (expert id written: global, or local under a map) of each
        (token, slot); -1 where excluded (non-local expert).
    row_of: int32 `[M, k]`, the row within that batch; -1 where excluded.
    max_tokens: rows per batch. num_tokens (M), top_k (k): the routing's shape.
    Rows at or beyond expert_num_tokens[e] are not part of the contract.
    """

    expert_num_tokens: torch.Tensor
    expert_of: torch.Tensor
    row_of: torch.Tensor
    max_tokens: int
    num_tokens: int
    top_k: int


def batched_layout(
    topk_ids: torch.Tensor,
    num_experts: int,
    *,
    max_tokens: int | None = None,
    expert_map: torch.Tensor | None = None,
) -> BatchedLayout:
    """Build the batched layout of a routing.

    Args:
        topk_ids: `[M, k]` int32/int64, global expert ids in [0, num_experts).
        num_experts: E (>= 1).
        max_tokens: rows per batch (>= 0); None computes the largest per-expert count. A value smaller than
            some expert's count raises ValueError.
        expert_map: optional `[E]` global -> local id or -1; batches exist only for local experts (indexed by
            local id) and entries of non-local experts are excluded.

    Returns:
        A `BatchedLayout` (int32 tensors on topk_ids' device); within a batch the oracle puts entries in
        ascending flattened index (t*k+j).
    """
    topk_ids = check_tensor("topk_ids", topk_ids, ndim=2, dtypes=INT_INDEX_DTYPES)
    num_experts = check_int("num_experts", num_experts, min_value=1)
    topk_ids = check_topk_ids(topk_ids, num_experts)
    if max_tokens is not None:
        max_tokens = check_int("max_tokens", max_tokens, min_value=0)
    num_batches = num_experts if expert_map is None else check_expert_map(expert_map, num_experts)
    written_id = local_expert_ids(num_experts, expert_map)

    num_tokens, top_k = topk_ids.shape
    counts = torch.zeros(num_batches, dtype=torch.int64)
    expert_of = torch.full((num_tokens * top_k,), -1, dtype=torch.int64)
    row_of = torch.full((num_tokens * top_k,), -1, dtype=torch.int64)
    for e, entries in enumerate(_entries_by_expert(topk_ids, num_experts)):
        b = written_id[e]
        if b == -1:
            continue
        counts[b] = entries.numel()
        expert_of[entries] = b
        row_of[entries] = torch.arange(entries.numel())
    largest = int(counts.max()) if counts.numel() else 0
    if max_tokens is None:
        max_tokens = largest
    elif max_tokens < largest:
        e = int(torch.argmax(counts))
        raise ValueError(f"max_tokens={max_tokens} is too small: expert {e} receives {largest} tokens")
    device = topk_ids.device
    return BatchedLayout(
        expert_num_tokens=counts.to(torch.int32).to(device),
        expert_of=expert_of.reshape(num_tokens, top_k).to(torch.int32).to(device),
        row_of=row_of.reshape(num_tokens, top_k).to(torch.int32).to(device),
        max_tokens=max_tokens,
        num_tokens=num_tokens,
        top_k=top_k,
    )


def permute_batched(x: torch.Tensor, layout: BatchedLayout) -> torch.Tensor:
    """Gather `x [M, K]` into `[E', max_tokens, K]` (x's dtype).

    out[expert_of[t, j], row_of[t, j]] = x[t]; rows beyond each expert's count are zeros (the oracle's
    choice; not part of the contract).
    """
    x = check_tensor("x", x, ndim=2, shape=[layout.num_tokens, None])
    num_batches = layout.expert_num_tokens.numel()
    out = torch.zeros((num_batches, layout.max_tokens, x.shape[1]), dtype=x.dtype, device=x.device)
    expert_of = layout.expert_of.detach().cpu().to(torch.int64)
    row_of = layout.row_of.detach().cpu().to(torch.int64)
    t, j = torch.nonzero(expert_of >= 0, as_tuple=True)
    if t.numel():
        out[expert_of[t, j].to(x.device), row_of[t, j].to(x.device)] = x[t.to(x.device)]
    return out


def unpermute_batched(batched: torch.Tensor, layout: BatchedLayout) -> torch.Tensor:
    """Scatter `[E', max_tokens, N]` back to `[M, k, N]` (batched's dtype).

    out[t, j] = batched[expert_of[t, j], row_of[t, j]]; excluded (token, slot) pairs are zeros. Rows beyond
    each expert's count are never read.
    """
    num_batches = layout.expert_num_tokens.numel()
    batched = check_tensor("batched", batched, ndim=3, shape=[num_batches, layout.max_tokens, None])
    out = torch.zeros(
        (layout.num_tokens, layout.top_k, batched.shape[2]), dtype=batched.dtype, device=batched.device
    )
    expert_of = layout.expert_of.detach().cpu().to(torch.int64)
    row_of = layout.row_of.detach().cpu().to(torch.int64)
    t, j = torch.nonzero(expert_of >= 0, as_tuple=True)
    if t.numel():
        dev = batched.device
        out[t.to(dev), j.to(dev)] = batched[expert_of[t, j].to(dev), row_of[t, j].to(dev)]
    return out
