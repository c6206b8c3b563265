"""Triton `moe_align_block_size`: the sorted-token layout of a tiled MoE GEMM (docs/SEMANTICS.md §3).

Output (numel = M*k, sentinel = numel, capacity = numel + E*(block_size-1)):
  sorted_token_ids int32 [capacity]: for each kept expert in ascending global id, its flattened indices t*k+j
      in *ascending order* (a stable order: the result is bitwise reproducible and equals the reference oracle's
      layout), padded with the sentinel to a multiple of block_size; the sentinel everywhere past the used part.
  expert_ids int32 [ceil(capacity / block_size)]: the written id of each used block's expert (global id, or the
      local id under an expert map, -1 for a kept non-local expert), -1 for every block past the used ones.
  num_tokens_post_padded int32 [1].

Design (no atomics, so deterministic): the flattened ids are cut into chunks of CHUNK entries.
  1. `_hist_kernel` (one program per chunk): per-chunk expert histogram -> counts[chunk, bin].
  2. `_scan_kernel` (one program per tile of experts; only when there are many chunks): exclusive prefix of
     counts over chunks -> prefix[chunk, bin], and per-expert totals. With few chunks the scatter kernel sums
     the earlier chunks' rows itself (FUSED) and this launch is skipped.
  3. `_scatter_kernel` (one program per chunk): expert base offsets = exclusive scan of the padded totals; entry
     i of the chunk goes to base[e] + prefix[chunk, e] + its rank, the count of entries of expert e before it in
     the chunk. Small chunks (<= RANK_BY_COUNT_CHUNK) count that rank over all pairs in a runtime loop; larger
     ones sort the chunk by (expert, index) with a bitonic network and read the rank off the sorted chunk (fast
     at any size, but unrolled: its compile grows with the chunk). It also writes expert_ids of the blocks it
     fills, and a share of the padding sentinels, of the tail past num_tokens_post_padded and of the -1 tail of
     expert_ids.
Entries routed to a non-local expert under the `exclude` convention fall into a dummy bin (index E) and are
dropped; ids outside [0, E) are dropped the same way (the contract requires valid ids).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["EP_CONVENTIONS", "MAX_BLOCK_SIZE", "MAX_EXPERTS", "default_chunk", "moe_align_block_size",
           "sorted_layout_capacity"]

EP_CONVENTIONS = ("keep_invalid_blocks", "exclude")
MAX_EXPERTS = 1024  # keys (bin << log2(CHUNK)) | local index must fit in int32; histogram bins stay small
MAX_BLOCK_SIZE = 1024
#: chunks of at most this many entries rank them by counting pairs instead of sorting (see default_chunk)
RANK_BY_COUNT_CHUNK = 64
#: the most ids the default chunk leaves to the counting rank (up to 32 chunks: one launch fewer, the scan fused)
COUNT_UP_TO = 2048
_INDEX_DTYPES = (torch.int32, torch.int64)


@triton.jit
def _bins(ids_ptr, emap_ptr, offs, numel, E, HAS_MAP: tl.constexpr, EXCLUDE: tl.constexpr):
    """Expert bin of each flattened entry: its global id, or E (dummy) when masked out, invalid or excluded."""
    valid = offs < numel
    e = tl.load(ids_ptr + offs, mask=valid, other=0).to(tl.int32)
    valid = valid & (e >= 0) & (e < E)
    if HAS_MAP and EXCLUDE:
        local = tl.load(emap_ptr + e, mask=valid, other=-1).to(tl.int32)
        valid = valid & (local >= 0)
    return tl.where(valid, e, E)


@triton.jit
def _bitonic_sort(x, LOG: tl.constexpr):
    """Ascending sort of a [2**LOG] int tensor (bitonic network). Partners i and i ^ 2**t meet as the halves
    of a [A, B, 2] view (split/join are single ops in the interpreter too, unlike tl.sort's xor reduction,
    which it runs element by element)."""
    for s in tl.static_range(1, LOG + 1):
        for u in tl.static_range(s):
            # one step per call: Triton 3.6 refuses to re-bind a constexpr inside a loop body
            x = _bitonic_step(x, s, s - 1 - u, LOG)
    return x


@triton.jit
def _bitonic_step(x, S: tl.constexpr, T: tl.constexpr, LOG: tl.constexpr):
    C: tl.constexpr = 1 << LOG
    A: tl.constexpr = C >> (T + 1)
    B: tl.constexpr = 1 << T
    left, right = tl.split(tl.permute(tl.reshape(x, [A, 2, B]), (0, 2, 1)))
    lo = tl.minimum(left, right)
    hi = tl.maximum(left, right)
    if S < LOG:  # runs of 2**s alternate direction, so that pairs of runs form bitonic sequences
        desc = ((tl.arange(0, A) >> (S - T - 1)) & 1)[:, None] == 1
        first = tl.where(desc, hi, lo)
        second = tl.where(desc, lo, hi)
    else:
        first = lo
        second = hi
    return tl.reshape(tl.permute(tl.join(first, second), (0, 2, 1)), [C])


@triton.jit
def _rank_by_count(ids_ptr, emap_ptr, b, chunk, numel, E, HAS_MAP: tl.constexpr, EXCLUDE: tl.constexpr,
                   CHUNK: tl.constexpr):
    """Each entry's count of entries of its bin before it in the chunk, all pairs compared TILE at a time in a
    runtime loop: its code does not grow with the chunk, so it compiles in a fraction of the network's time."""
    TILE: tl.constexpr = 32 if CHUNK > 32 else CHUNK
    local = tl.arange(0, CHUNK)
    rank = tl.zeros([CHUNK], dtype=tl.int32)
    for t in range(0, CHUNK, TILE):
        j = t + tl.arange(0, TILE)
        bj = _bins(ids_ptr, emap_ptr, chunk * CHUNK + j, numel, E, HAS_MAP, EXCLUDE)
        before = (b[:, None] == bj[None, :]) & (j[None, :] < local[:, None])
        rank += tl.sum(before.to(tl.int32), axis=1)
    return rank


# Sizes and counts other than numel (the bound of the id loads) are not specialized (divisible by 16, equal to 1):
# each drawn size was otherwise a new compile of the in-chunk sort, for a few integer comparisons.
@triton.jit(do_not_specialize=["E"])
def _hist_kernel(ids_ptr, emap_ptr, counts_ptr, numel, E, HAS_MAP: tl.constexpr, EXCLUDE: tl.constexpr,
                 CHUNK: tl.constexpr, NB: tl.constexpr):
    chunk = tl.program_id(0)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    b = _bins(ids_ptr, emap_ptr, offs, numel, E, HAS_MAP, EXCLUDE)
    # NB > E, so the dummy bin is counted in range (never rely on out-of-range behaviour, which differs by
    # Triton version in the interpreter).
    hist = tl.histogram(b, NB)
    tl.store(counts_ptr + chunk * NB + tl.arange(0, NB), hist)


@triton.jit(do_not_specialize=["num_chunks"])
def _scan_kernel(counts_ptr, prefix_ptr, totals_ptr, num_chunks, NB: tl.constexpr, CB: tl.constexpr,
                 EB: tl.constexpr):
    cols = tl.program_id(0) * EB + tl.arange(0, EB)
    carry = tl.zeros([EB], dtype=tl.int32)
    for c0 in range(0, num_chunks, CB):
        rows = c0 + tl.arange(0, CB)
        ptrs = rows[:, None] * NB + cols[None, :]
        mask = rows[:, None] < num_chunks
        tile = tl.load(counts_ptr + ptrs, mask=mask, other=0)
        incl = tl.cumsum(tile, axis=0)
        tl.store(prefix_ptr + ptrs, incl - tile + carry[None, :], mask=mask)
        carry += tl.sum(tile, axis=0)
    tl.store(totals_ptr + cols, carry)


@triton.jit(do_not_specialize=["E", "block_size", "capacity", "num_blocks_cap", "num_chunks"])
def _scatter_kernel(ids_ptr, emap_ptr, counts_ptr, prefix_ptr, totals_ptr, offs_ptr, sorted_ptr, eids_ptr,
                    ntpp_ptr, numel, E, block_size, capacity, num_blocks_cap, num_chunks,
                    HAS_MAP: tl.constexpr, EXCLUDE: tl.constexpr, FUSED: tl.constexpr, CHUNK: tl.constexpr,
                    LOG_CHUNK: tl.constexpr, NB: tl.constexpr, FILL: tl.constexpr, SORT: tl.constexpr):
    chunk = tl.program_id(0)
    nprog = tl.num_programs(0)
    bins = tl.arange(0, NB)
    real_bin = bins < E

    # Per-expert totals and this chunk's exclusive prefix over the earlier chunks.
    if FUSED:
        totals = tl.zeros([NB], dtype=tl.int32)
        prefix = tl.zeros([NB], dtype=tl.int32)
        for c in range(0, num_chunks):
            row = tl.load(counts_ptr + c * NB + bins)
            totals += row
            prefix += tl.where(c < chunk, row, 0)
    else:
        totals = tl.load(totals_ptr + bins)
        prefix = tl.load(prefix_ptr + chunk * NB + bins)
    totals = tl.where(real_bin, totals, 0)
    padded = (totals + block_size - 1) // block_size * block_size
    base = tl.cumsum(padded, axis=0) - padded
    used = tl.sum(padded, axis=0)

    local = tl.arange(0, CHUNK)
    b = _bins(ids_ptr, emap_ptr, chunk * CHUNK + local, numel, E, HAS_MAP, EXCLUDE)
    if SORT:
        # Entry p of the sorted chunk goes to off[e] + p, with off = base + prefix - first position of e.
        own = tl.load(counts_ptr + chunk * NB + bins)
        tl.store(offs_ptr + chunk * NB + bins, base + prefix - (tl.cumsum(own, axis=0) - own))
        # Keys are unique (they carry the local index), so the sort is stable by construction.
        keys = _bitonic_sort((b << LOG_CHUNK) | local, LOG_CHUNK)
        e = keys >> LOG_CHUNK
        src = chunk * CHUNK + (keys & (CHUNK - 1))
        rank = local
    else:
        tl.store(offs_ptr + chunk * NB + bins, base + prefix)
        e = b
        src = chunk * CHUNK + local
        rank = _rank_by_count(ids_ptr, emap_ptr, b, chunk, numel, E, HAS_MAP, EXCLUDE, CHUNK)
    tl.debug_barrier()  # the gather below reads what other threads of this program just stored
    keep = e < E
    dest = tl.load(offs_ptr + chunk * NB + e, mask=keep, other=0) + rank
    tl.store(sorted_ptr + dest, src, mask=keep)
    if HAS_MAP:
        wid = tl.load(emap_ptr + e, mask=keep, other=-1).to(tl.int32)
    else:
        wid = e
    # Every used block holds at least one real entry, so these (same-valued) stores cover all used blocks.
    tl.store(eids_ptr + dest // block_size, wid, mask=keep)

    # Padding sentinels after each expert's entries: column jj of every expert's padding, columns shared out
    # over the programs (plain vector stores: no gathers, no reductions).
    for jj in range(chunk, block_size, nprog):
        tl.store(sorted_ptr + base + totals + jj, tl.zeros([NB], dtype=tl.int32) + numel,
                 mask=real_bin & (jj < padded - totals))

    # The tails: sorted ids [used, capacity) and expert ids [used / block_size, num_blocks_cap).
    span = (capacity + nprog - 1) // nprog
    lo = tl.maximum(chunk * span, used)
    hi = tl.minimum((chunk + 1) * span, capacity)
    for s in range(lo, hi, FILL):
        p = s + tl.arange(0, FILL)
        tl.store(sorted_ptr + p, tl.zeros([FILL], dtype=tl.int32) + numel, mask=p < hi)
    bspan = (num_blocks_cap + nprog - 1) // nprog
    blo = tl.maximum(chunk * bspan, used // block_size)
    bhi = tl.minimum((chunk + 1) * bspan, num_blocks_cap)
    for s in range(blo, bhi, FILL):
        p = s + tl.arange(0, FILL)
        tl.store(eids_ptr + p, tl.full([FILL], -1, dtype=tl.int32), mask=p < bhi)
    if chunk == 0:
        tl.store(ntpp_ptr, used)


def default_chunk(numel: int) -> int:
    """Entries per program for `numel` ids: RANK_BY_COUNT_CHUNK up to COUNT_UP_TO ids, then 1024 and, above 65536
    ids, 4096 (sorted). Ranking 64 entries by counting pairs compiles in a fifth of the time the sorting network
    of 64 takes (0.47 against 2.6 s on an H200; the network of 1024, the default from 257 ids on before, 2.4 s).
    The whole op on an H200 (CUDA-graph replays, block sizes 16 / 64): 256 ids 9.0 / 11.2 us against 11.4 / 19.9
    with the network of 256, 2048 ids 10.6 / 11.0 against 13.3 / 19.7 with that of 1024; but at 8192 ids 11.4 against
    10.5 and at 32768 24 against 14 us: counting is quadratic in the chunk, and with chunks of 64 a large input is
    hundreds of programs, each with its experts' offsets to build (results/sm90/bench/*-align-count-rank/)."""
    if numel <= COUNT_UP_TO:
        return RANK_BY_COUNT_CHUNK
    return 1024 if numel <= 65536 else 4096


def sorted_layout_capacity(numel: int, num_experts: int, block_size: int) -> int:
    """Length of sorted_token_ids: numel + num_experts * (block_size - 1)."""
    return numel + num_experts * (block_size - 1)


def _check_out(name: str, t: torch.Tensor | None, length: int, device: torch.device) -> torch.Tensor:
    if t is None:
        return torch.empty(length, dtype=torch.int32, device=device)
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or list(t.shape) != [length]:
        got = f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name} must be an int32 tensor of shape [{length}], got {got}")
    if not t.is_contiguous() or t.device != device:
        raise ValueError(f"{name} must be contiguous and on {device}")
    return t


def moe_align_block_size(
    topk_ids: torch.Tensor,
    block_size: int,
    num_experts: int,
    *,
    expert_map: torch.Tensor | None = None,
    ep_convention: str = "keep_invalid_blocks",
    sorted_token_ids: torch.Tensor | None = None,
    expert_ids: torch.Tensor | None = None,
    num_tokens_post_padded: torch.Tensor | None = None,
    chunk: int | None = None,
    fuse_scan: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Build the sorted-token layout of `topk_ids [M, k]` (int32/int64 global ids in [0, num_experts)).

    Args:
        block_size: GEMM tile rows, 1..1024.
        num_experts: E, 1..1024.
        expert_map: optional [E] int32/int64, global id -> local id or -1.
        ep_convention: "keep_invalid_blocks" (non-local experts keep blocks with expert id -1) or "exclude"
            (their entries are left out); only read with an expert map.
        sorted_token_ids, expert_ids, num_tokens_post_padded: optional int32 outputs to write into
            (shapes [capacity], [ceil(capacity / block_size)], [1]); allocated when None.
        chunk: entries per program (a power of two, 16..4096; up to RANK_BY_COUNT_CHUNK they are ranked by
            counting, larger chunks are sorted); default `default_chunk(numel)`.
        fuse_scan: sum the earlier chunks in the scatter kernel instead of launching the scan kernel; default when
            there are <= 32 chunks.

    Returns:
        (sorted_token_ids, expert_ids, num_tokens_post_padded), see the module docstring.
    """
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.ndim != 2 or topk_ids.dtype not in _INDEX_DTYPES:
        got = f"{topk_ids.dtype} {list(topk_ids.shape)}" if isinstance(topk_ids, torch.Tensor) else type(topk_ids)
        raise ValueError(f"topk_ids must be a 2-D int32/int64 tensor, got {got}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise ValueError(f"block_size must be an int in [1, {MAX_BLOCK_SIZE}], got {block_size!r}")
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or not 1 <= num_experts <= MAX_EXPERTS:
        raise ValueError(f"num_experts must be an int in [1, {MAX_EXPERTS}], got {num_experts!r}")
    if ep_convention not in EP_CONVENTIONS:
        raise ValueError(f"ep_convention must be one of {EP_CONVENTIONS}, got {ep_convention!r}")
    device = topk_ids.device
    if expert_map is not None:
        if (not isinstance(expert_map, torch.Tensor) or expert_map.dtype not in _INDEX_DTYPES
                or list(expert_map.shape) != [num_experts]):
            got = f"{expert_map.dtype} {list(expert_map.shape)}" if isinstance(expert_map, torch.Tensor) else (
                type(expert_map).__name__)
            raise ValueError(f"expert_map must be an int32/int64 tensor of shape [{num_experts}], got {got}")
        if expert_map.device != device:
            raise ValueError(f"expert_map must be on topk_ids' device {device}, got {expert_map.device}")
        expert_map = expert_map.contiguous()
    numel = topk_ids.numel()
    if numel >= 2**31 - num_experts * block_size:
        raise ValueError(f"topk_ids has {numel} entries; int32 ids need numel + E*block_size < 2**31")
    if chunk is None:
        chunk = default_chunk(numel)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 16 or chunk > 4096 or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two in [16, 4096], got {chunk!r}")

    capacity = sorted_layout_capacity(numel, num_experts, block_size)
    num_blocks_cap = -(-capacity // block_size)
    sorted_token_ids = _check_out("sorted_token_ids", sorted_token_ids, capacity, device)
    expert_ids = _check_out("expert_ids", expert_ids, num_blocks_cap, device)
    num_tokens_post_padded = _check_out("num_tokens_post_padded", num_tokens_post_padded, 1, device)

    flat = topk_ids.reshape(-1)  # flattened index t*k+j in logical order (copies only if not viewable)
    num_chunks = max(1, -(-numel // chunk))
    nb = max(32, triton.next_power_of_2(num_experts + 1))  # one dummy bin past the experts
    fused = num_chunks <= 32 if fuse_scan is None else bool(fuse_scan)
    has_map = expert_map is not None
    exclude = has_map and ep_convention == "exclude"
    emap = expert_map if has_map else flat  # any tensor: never read without a map

    counts = torch.empty((num_chunks, nb), dtype=torch.int32, device=device)
    offs = torch.empty((num_chunks, nb), dtype=torch.int32, device=device)
    warps = 4 if chunk <= 1024 else 8
    _hist_kernel[(num_chunks,)](flat, emap, counts, numel, num_experts, HAS_MAP=has_map, EXCLUDE=exclude,
                                CHUNK=chunk, NB=nb, num_warps=warps)
    if fused:
        prefix = totals = counts  # not read
    else:
        prefix = torch.empty((num_chunks, nb), dtype=torch.int32, device=device)
        totals = torch.empty((nb,), dtype=torch.int32, device=device)
        eb = 32
        _scan_kernel[(nb // eb,)](counts, prefix, totals, num_chunks, NB=nb, CB=64, EB=eb, num_warps=4)
    _scatter_kernel[(num_chunks,)](
        flat, emap, counts, prefix, totals, offs, sorted_token_ids, expert_ids, num_tokens_post_padded,
        numel, num_experts, block_size, capacity, num_blocks_cap, num_chunks,
        HAS_MAP=has_map, EXCLUDE=exclude, FUSED=fused, CHUNK=chunk, LOG_CHUNK=chunk.bit_length() - 1, NB=nb,
        FILL=1024, SORT=chunk > RANK_BY_COUNT_CHUNK, num_warps=warps)
    return sorted_token_ids, expert_ids, num_tokens_post_padded
