"""Helpers shared by the op specs: size limits per scale, and small judging utilities."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from hypothesis import strategies as st

from harness.core import inputs as gen
from harness.core import limits as limit_table
from harness.core.compare import Comparison
from harness.core.sizes import limit, local_experts, num_experts, span, top_k
from harness.registry import Adapter


def lim(adapter: Adapter, name: str) -> Any:
    """The adapter's limit `name`, else its op's default at this scale (the table: `harness.core.limits`)."""
    return limit(adapter, name)


def draw_experts(draw: st.DrawFn, adapter: Adapter, *, cap: int | None = None, multiple: int = 1) -> int:
    """E within the adapter's E limits (at most `cap`), and at least the smallest k they allow."""
    sp = span(adapter, "E", lo=span(adapter, "k").fit(1), multiple=multiple)
    most = sp.high if cap is None else min(cap, sp.high or cap)
    return draw(num_experts(most, multiple=sp.multiple).map(sp.fit))


def draw_top_k(draw: st.DrawFn, adapter: Adapter, n: int) -> int:
    """k of `n` experts (at most n) within the adapter's k limits."""
    sp = span(adapter, "k", hi=n)
    return draw(top_k(n, sp.high or n).map(sp.fit))


def rows_for_counts(adapter: Adapter, dim: str, counts: list[int], k: int) -> tuple[int, list[int]]:
    """`inputs.counts_to_rows` with the rows moved up to a size the adapter's `dim` limits allow."""
    m, _ = gen.counts_to_rows(counts, k)
    return gen.counts_to_rows(counts, k, rows=span(adapter, dim).fit_up(m))


def experts_fitted(adapter: Adapter, e: int) -> int:
    """E grown to at least `e` (experts that per-expert counts need), at a size the E limits allow."""
    return span(adapter, "E").fit_up(e)


def centred_counts(adapter: Adapter, counts: list[int], n_local: int, designed: int) -> tuple[int, list[int]]:
    """(E, counts) for per-expert counts written for a contiguous map of `n_local` experts among `designed`: E at a
    size the E limits allow, the counts moved with the map's range (centred: `inputs.contiguous_map`) and padded."""
    e = experts_fitted(adapter, max(designed, len(counts)))
    shifted = counts
    for _ in range(4):
        shifted = [0] * max(0, (e - n_local) // 2 - (designed - n_local) // 2) + counts
        if len(shifted) <= e:
            break
        e = experts_fitted(adapter, len(shifted))
    return e, shifted + [0] * (e - len(shifted))


def expert_maps(adapter: Adapter) -> str:
    """The widest expert-map shape the adapter declares (`expert_maps`: random, contiguous or identity)."""
    return limit_table.widest_map(lim(adapter, "expert_maps"))


def fewest_local(adapter: Adapter) -> int:
    """The adapter's `min_local_experts` (0 where it declares none)."""
    return int(adapter.limits.get("min_local_experts", 0))


def draw_map(draw: st.DrawFn, adapter: Adapter, e: int) -> dict[str, Any]:
    """`local_experts` and `map` of a drawn case, of a map shape the adapter declares."""
    widest = expert_maps(adapter)
    if widest == "identity":
        return {"local_experts": e, "map": "contiguous"}
    n_local = max(draw(local_experts(e)), min(fewest_local(adapter), e))
    kinds = ["random", "contiguous"] if widest == "random" else ["contiguous"]
    return {"local_experts": n_local, "map": draw(st.sampled_from(kinds))}


def map_fields(adapter: Adapter, e: int, n_local: int, kind: str = "random") -> dict[str, Any]:
    """`local_experts` (and `map`) of a deliberate case with `n_local` of `e` experts local by a `kind` map
    (`random`: no `map` parameter), moved to a map shape the adapter declares: a range, else all experts local."""
    widest = expert_maps(adapter)
    if widest == "identity":
        return {"local_experts": e, "map": "contiguous"}
    n_local = max(n_local, min(fewest_local(adapter), e))
    if widest == "contiguous" or kind == "contiguous":
        return {"local_experts": n_local, "map": "contiguous"}
    return {"local_experts": n_local}


def yes(value: str) -> bool:
    return value == "Y"


def custom(name: str, passed: bool, reason: str = "", **metrics: Any) -> Comparison:
    return Comparison(name, "custom", passed, reason, metrics)


def rows_where(mask: torch.Tensor) -> list[int]:
    return mask.nonzero().flatten()[:5].tolist()


def row_subset(dim: str, tensor: str = "x") -> Any:
    """A token_subset for ops whose only input is `tensor` with one row per token along shape `dim`."""

    def subset(case: Any, inputs: Any, rows: slice) -> tuple[Any, dict[str, torch.Tensor]]:
        x = inputs[tensor][rows]
        return case.replace(shapes={**case.shapes, dim: x.shape[0]}), {tensor: x}

    return subset


def ends_routed(ids: torch.Tensor, emap: torch.Tensor) -> bool:
    """Whether the global ids `ids` reach the first and the last local expert of `emap` and miss some local one."""
    local = emap.detach().cpu().long()[ids.detach().cpu().long().reshape(-1)]
    n = int(emap.max()) + 1
    hit = set(local[local >= 0].unique().tolist())
    return n > 0 and {0, n - 1} <= hit and len(hit) < n


def near_multiple_counts(counts: torch.Tensor, block: int) -> bool:
    """Whether some count is an exact multiple of `block` and others lie one below and one above a multiple."""
    c = counts.detach().cpu().long()
    c = c[c > 0] % block
    return bool((c == 0).any() and (c == block - 1).any() and (c == 1 % block).any())


#: a chunk of token rows holds whole tiles of this many rows (a swizzled scale layout's 128-row tiles): its rows of
#: every output are then its own, the last chunk's padding included (`row_chunk`)
ROW_TILE = 128
#: a reference adapter (the oracle run as a kernel) takes an input past this many elements a chunk of rows at a time:
#: its float64 intermediates of a whole large-offsets case (2**31 elements) killed its kernel host on an H200 machine
REFERENCE_CHUNK_ELEMENTS = 1 << 24


def tile_rows(rows: int) -> int:
    """`rows` rounded down to whole `ROW_TILE`s, one tile at least."""
    return max(1, rows // ROW_TILE) * ROW_TILE


def row_chunk(spec: Any, case: Any, inputs: Mapping[str, torch.Tensor],
              part: slice) -> tuple[Any, dict[str, torch.Tensor], dict[str, slice]]:
    """The sub-case of token rows `part` (the op's `token_subset`), its inputs, and its rows of every output: as
    many as the op gives the sub-case from `part.start` (a padded layout's last chunk holds its padding)."""
    sub_case, sub_inputs = spec.token_subset(case, inputs, part)
    spans = {n: slice(part.start, part.start + int(o.shape[0])) for n, o in spec.outputs(sub_case, sub_inputs).items()}
    return sub_case, sub_inputs, spans


def by_rows(run: Any, op: str, dim: str, case: Any, inputs: dict[str, torch.Tensor],
            outputs: dict[str, torch.Tensor]) -> None:
    """A reference adapter's `run(case, inputs, outputs, on_device=...)` of a row-independent op, a chunk of whole
    row tiles along `dim` at a time where its inputs hold more than REFERENCE_CHUNK_ELEMENTS: each chunk's sub-case
    writes its rows of every token output (`row_chunk`), computed on the inputs' device (`on_device=True`: on the
    CPU a case past 2**31 elements takes minutes); a smaller input is run whole, as the oracle runs it
    (`on_device=False`)."""
    from harness import ops

    spec, m = ops.get(op), case.shape(dim)
    total = sum(t.numel() for t in inputs.values() if isinstance(t, torch.Tensor))
    if total <= REFERENCE_CHUNK_ELEMENTS or spec.token_subset is None:
        run(case, inputs, outputs, on_device=False)
        return
    step = tile_rows(REFERENCE_CHUNK_ELEMENTS * m // total)
    for start in range(0, m, step):
        sub_case, sub_inputs, spans = row_chunk(spec, case, inputs, slice(start, min(m, start + step)))
        run(sub_case, sub_inputs, {n: t[spans[n]] if n in spec.token_outputs else t for n, t in outputs.items()},
            on_device=True)
