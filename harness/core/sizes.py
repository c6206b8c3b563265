"""Size strategies shared by the op specs: boundary-biased sizes, expert counts, top-k, local experts, and the
scale (`small` for the CPU interpreter, `large` on a GPU) that sets how large "large" is.

Sizes are boundary-biased: M in {0, 1, block-1, block, block+1, large}, K and N off the tile multiples where the
adapter allows, E in {1, not divisible by 4 or 16, 257}, k in {1, E}. The scale comes from `HARNESS_SCALE` or the
device.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
from hypothesis import strategies as st

from harness.core import limits as limit_table
from harness.core.limits import Span

SCALES = limit_table.SCALE_NAMES


def scale() -> str:
    """`small` (interpreter / CI) or `large` (GPU), from HARNESS_SCALE or the device."""
    s = os.environ.get("HARNESS_SCALE")
    if s:
        if s not in SCALES:
            raise ValueError(f"HARNESS_SCALE must be one of {SCALES}, got {s!r}")
        return s
    return "large" if torch.cuda.is_available() else "small"


def limit(adapter: Any, name: str) -> Any:
    """An adapter's limit `name`, else its op's default at this scale (`harness.core.limits`; ValueError for a key
    its op does not list: an op reads only the keys the table documents)."""
    fallback = limit_table.default(adapter.op, name, scale())
    return adapter.limits.get(name, fallback)


def span(adapter: Any, dim: str, *, lo: int = 1, hi: int | None = None, multiple: int = 1,
         usual: int | None = None) -> Span:
    """The sizes of `dim` a draw for `adapter` may take: the op's bounds [lo, hi] and `multiple`, narrowed by the
    adapter's `min_<dim>`, `max_<dim>` (else `usual`, else the op's default) and `<dim>_multiple`."""
    most = adapter.limits.get(f"max_{dim}", usual if usual is not None else limit(adapter, f"max_{dim}"))
    high = most if hi is None else (hi if most is None else min(hi, most))
    low = max(lo, int(limit(adapter, f"min_{dim}") or lo))
    return Span(lo=lo, hi=hi, multiple=math.lcm(multiple, int(limit(adapter, f"{dim}_multiple"))), low=low,
                high=high)


def edge_sizes(sp: Span, block: int) -> st.SearchStrategy[int]:
    """`boundary_sizes` of `block` within the span `sp`, each moved to an allowed size (`Span.fit`)."""
    return boundary_sizes(block, sp.high if sp.high is not None else max(sp.low, 2 * block),
                          minimum=sp.low).map(sp.fit)


def boundary_sizes(block: int, large: int, *, minimum: int = 0) -> st.SearchStrategy[int]:
    """Sizes biased to the edges of a tile of `block`: 0, 1, block-1, block, block+1, and up to `large`."""
    edges = sorted({v for v in (0, 1, 2, block - 1, block, block + 1, large) if minimum <= v <= large})
    return st.one_of(st.sampled_from(edges), st.integers(min_value=max(minimum, 0), max_value=max(large, minimum)))


def multiple_of(m: int, lo: int, hi: int) -> st.SearchStrategy[int]:
    lo_q, hi_q = -(-lo // m), hi // m
    return st.integers(min_value=max(lo_q, 1), max_value=max(hi_q, max(lo_q, 1))).map(lambda q: q * m)


def num_experts(max_e: int, *, multiple: int = 1) -> st.SearchStrategy[int]:
    specials = [e for e in (1, 3, 7, 8, 13, 16, 33, 64, 257) if e <= max_e and e % multiple == 0]
    return st.one_of(st.sampled_from(specials or [multiple]), multiple_of(multiple, multiple, max_e))


def top_k(e: int, max_k: int = 16) -> st.SearchStrategy[int]:
    hi = min(e, max_k)
    return st.one_of(st.sampled_from(sorted({1, hi})), st.integers(min_value=1, max_value=max(hi, 1)))


def local_experts(e: int) -> st.SearchStrategy[int]:
    """How many of E experts are local under an expert map, biased to the edges: one and all. None local (every
    row of the output written as zeros) is a deliberate boundary case, not a draw: its expected output is all
    zeros, which any kernel that clears its output passes."""
    return st.one_of(st.sampled_from(sorted({1, max(e, 1)})), st.integers(min_value=min(1, e), max_value=e))
