"""The oracle of a very large case, a chunk of token rows at a time.

A case past 2**31 elements (`harness.ops.large`) holds gigabytes; the oracle's float32 or float64 intermediates of
all its rows at once would hold several times that. Where the op's oracle is row-independent (it has a
`token_subset`, every output it judges is one row per token, and no value is computed over all rows), the oracle
runs on `CHUNK_ELEMENTS` of input at a time and each output is judged chunk by chunk against that chunk's checks:
the same verdict as one call (tests/harness/test_large_offsets.py compares the two), its peak memory a chunk's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from harness.core.case import Case
from harness.core.compare import Comparison
from harness.ops.base import Check, OpSpec

#: cases whose inputs hold more elements than this are judged in chunks, where the op allows
CHUNKED_ABOVE = 1 << 28
#: about how many input elements one chunk of rows holds
CHUNK_ELEMENTS = 1 << 26

#: an output judged against one check: (check, actual, all outputs) -> comparisons (the runner's)
Judge = Callable[[Check, torch.Tensor, Mapping[str, torch.Tensor]], list[Comparison]]


def _token_dim(case: Case) -> str | None:
    return next((d for d in ("M", "T") if d in case.shapes), None)


def row_independent(spec: OpSpec, case: Case) -> bool:
    """Whether the op's oracle of `case` can run on its rows a chunk at a time: a per-tensor scale (group_quant's
    `tensor` unit) is computed over every row."""
    return (spec.token_subset is not None and _token_dim(case) is not None
            and case.features.get("unit") != "tensor")


def chunk_rows(spec: OpSpec, case: Case, chunk_elements: int = CHUNK_ELEMENTS,
               above: int = CHUNKED_ABOVE) -> int | None:
    """Rows per chunk for `case` (None: judged whole, small enough or not row-independent)."""
    total = spec.estimated_input_elements(case)
    if total <= above or not row_independent(spec, case):
        return None
    rows = int(case.shapes[_token_dim(case)])  # type: ignore[index]
    return max(1, chunk_elements * rows // max(total, 1))


def _cat(parts: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
    return None if any(p is None for p in parts) else torch.cat(list(parts))  # type: ignore[arg-type]


def _merged(name: str, parts: list[tuple[slice, Check]], token_outputs: Sequence[str], judge: Judge) -> Check:
    def judged(actual: torch.Tensor, outputs: Mapping[str, torch.Tensor]) -> Comparison:
        first: Comparison | None = None
        for rows, chk in parts:
            sub = {n: t[rows] for n, t in outputs.items() if n in token_outputs}
            for c in judge(chk, actual[rows], sub):
                if not c.passed:
                    return Comparison(name, "chunked", False, f"rows {rows.start}..{rows.stop - 1}: {c.reason}",
                                      dict(c.metrics))
                first = first or c
        return Comparison(name, "chunked", True, "", dict(first.metrics) if first else {})

    checks = [c for _, c in parts]
    return Check(name, "custom", expected=_cat([c.expected for c in checks]), mask=_cat([c.mask for c in checks]),
                 untouched=_cat([c.untouched for c in checks]), judge=judged)


def expected(spec: OpSpec, case: Case, inputs: Mapping[str, torch.Tensor], conventions: Mapping[str, Any],
             judge: Judge, rows_per_chunk: int | None = None) -> list[Check]:
    """The op's checks of `case`: `spec.expected` whole, or (`chunk_rows`, or `rows_per_chunk` where given) one
    check per output that judges it chunk by chunk with `judge` against the checks of each chunk's rows. Outputs
    that are not one row per token keep the case whole."""
    rows = rows_per_chunk or chunk_rows(spec, case)
    m = int(case.shapes.get(_token_dim(case) or "", 0))
    if rows is None or spec.token_subset is None or m <= rows:
        return spec.expected(case, inputs, conventions)
    by_name: dict[str, list[tuple[slice, Check]]] = {}
    for start in range(0, m, rows):
        part = slice(start, min(m, start + rows))
        sub_case, sub_inputs = spec.token_subset(case, inputs, part)
        for chk in spec.expected(sub_case, sub_inputs, conventions):
            by_name.setdefault(chk.name, []).append((part, chk))
    if any(name not in spec.token_outputs for name in by_name):
        return spec.expected(case, inputs, conventions)
    return [_merged(name, parts, spec.token_outputs, judge) for name, parts in by_name.items()]
