"""The oracle of a very large case, a chunk of token rows at a time.

A case past 2**31 elements (`harness.ops.large`) holds gigabytes; the oracle's float32 or float64 intermediates of
all its rows at once would hold several times that. Where the op's oracle is row-independent (it has a
`token_subset`, every output it judges is one row per token, and no value is computed over all rows), the oracle
runs on `CHUNK_ELEMENTS` of input at a time and each output is judged chunk by chunk against that chunk's checks:
the same verdict as one call (tests/harness/test_large_offsets.py compares the two), its peak memory a chunk's.

The oracle costs about 100 ns an element on one CPU core, minutes for a case past 2**31 elements, so such a case
judges some chunks (`judged_chunks`): its first and last (the last holds the offsets past 2**31, where an int32
offset wraps) and `SAMPLED_CHUNKS` between them drawn from the OS's random source (never a function of the case, so
a kernel cannot know which rows are judged). What the comparison does not need the oracle for (every contract element
written, nothing outside the contract touched, two runs alike) still covers every row where the chunks' contract
masks are all-true; the verdict names the rows judged.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from harness.core.case import Case
from harness.core.compare import Comparison
from harness.ops.base import Check, OpSpec
from harness.ops.common import row_chunk, tile_rows

#: cases whose inputs hold more elements than this are judged in chunks, where the op allows
CHUNKED_ABOVE = 1 << 28
#: about how many input elements one chunk of rows holds (the oracle's float64 intermediates of a chunk: about
#: 170 bytes an element, and on the CPU it ran 2x slower per element at 2**24 elements than at 2**22)
CHUNK_ELEMENTS = 1 << 22
#: chunks judged between a sampled case's first and last (`judged_chunks`)
SAMPLED_CHUNKS = 2

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
    return tile_rows(chunk_elements * rows // max(total, 1))


def judged_chunks(n: int, sampled: int | None = SAMPLED_CHUNKS) -> list[int]:
    """Which of `n` chunks are judged: the first, the last and `sampled` others drawn from the OS's random source
    (None: every one)."""
    if sampled is None or n <= sampled + 2:
        return list(range(n))
    return sorted({0, n - 1, *secrets.SystemRandom().sample(range(1, n - 1), sampled)})


def _cat(parts: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
    return None if any(p is None for p in parts) else torch.cat(list(parts))  # type: ignore[arg-type]


def _whole(parts: list[tuple[slice, Check]], m: int, field: str) -> torch.Tensor | None:
    """The chunks' `field` (a mask) over all `m` rows: False on the rows no chunk judged; None where every chunk's
    is None (every element in the contract)."""
    if all(getattr(c, field) is None for _, c in parts):
        return None
    def shape(c: Check) -> tuple[int, ...]:  # a chunk's output shape (a mask may be broadcast over it)
        t = c.expected if c.expected is not None else getattr(c, field)
        return () if t is None else tuple(t.shape)

    # where the chunks' tensors lie (a case judged on the GPU: its gigabytes of mask stay there)
    device = next(t.device for _, c in parts for t in (c.expected, getattr(c, field)) if t is not None)
    whole = torch.zeros((m, *max((shape(c)[1:] for _, c in parts), key=len)), dtype=torch.bool, device=device)
    for rows, c in parts:
        t = getattr(c, field)
        whole[rows] = True if t is None else t.detach().to(device).expand(shape(c))
    return whole


def _merged(name: str, parts: list[tuple[slice, Check]], spans: list[Mapping[str, slice]],
            token_outputs: Sequence[str], judge: Judge, m: int) -> Check:
    """One check of output `name` that judges the rows of `parts` (all `m` rows of it, or a sample) chunk by chunk;
    `spans`: each part's rows of every token output (a padded layout's last chunk holds its padding)."""
    judged_rows = sum(rows.stop - rows.start for rows, _ in parts)
    sample = {} if judged_rows == m else {
        "rows_judged": [[rows.start, rows.stop - 1] for rows, _ in parts], "rows": m}

    def judged(actual: torch.Tensor, outputs: Mapping[str, torch.Tensor]) -> Comparison:
        first: Comparison | None = None
        for (rows, chk), span in zip(parts, spans):
            sub = {n: t[span[n]] for n, t in outputs.items() if n in token_outputs}
            for c in judge(chk, actual[rows], sub):
                if not c.passed:
                    return Comparison(name, "chunked", False, f"rows {rows.start}..{rows.stop - 1}: {c.reason}",
                                      {**c.metrics, **sample})
                first = first or c
        return Comparison(name, "chunked", True, "", {**(first.metrics if first else {}), **sample})

    checks = [c for _, c in parts]
    if sample:  # the oracle of some rows only: the rest are in no mask, and no expected tensor covers them
        return Check(name, "custom", mask=_whole(parts, m, "mask"), untouched=_whole(parts, m, "untouched"),
                     judge=judged, parts=tuple(checks))
    return Check(name, "custom", expected=_cat([c.expected for c in checks]), mask=_cat([c.mask for c in checks]),
                 untouched=_cat([c.untouched for c in checks]), judge=judged, parts=tuple(checks))


def expected(spec: OpSpec, case: Case, inputs: Mapping[str, torch.Tensor], conventions: Mapping[str, Any],
             judge: Judge, rows_per_chunk: int | None = None, sampled: int | None = SAMPLED_CHUNKS) -> list[Check]:
    """The op's checks of `case`: `spec.expected` whole, or (`chunk_rows`, or `rows_per_chunk` where given) one
    check per output that judges it chunk by chunk with `judge` against the checks of the chunks `judged_chunks`
    picks (`sampled`: None judges every one). Outputs that are not one row per token keep the case whole."""
    rows = rows_per_chunk or chunk_rows(spec, case)
    m = int(case.shapes.get(_token_dim(case) or "", 0))
    if rows is None or spec.token_subset is None or m <= rows:
        return spec.expected(case, inputs, conventions)
    by_name: dict[str, list[tuple[slice, Check]]] = {}
    spans: list[dict[str, slice]] = []
    for index in judged_chunks(-(-m // rows), sampled):
        part = slice(index * rows, min(m, (index + 1) * rows))
        sub_case, sub_inputs, span = row_chunk(spec, case, inputs, part)
        spans.append(span)
        for chk in spec.expected(sub_case, sub_inputs, conventions):
            by_name.setdefault(chk.name, []).append((spans[-1].get(chk.name, part), chk))
    if any(name not in spec.token_outputs for name in by_name):
        return spec.expected(case, inputs, conventions)
    whole = {n: int(o.shape[0]) for n, o in spec.outputs(case, inputs).items()}
    return [_merged(name, parts, spans, spec.token_outputs, judge, whole.get(name, m))
            for name, parts in by_name.items()]
