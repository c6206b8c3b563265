"""The layout dimension of the cases: each tensor an op's contract says may have any strides
(`harness.ops.contracts.any_strides`) takes a layout class of `harness.core.layouts` that the adapter's `layouts`
limit allows, drawn by hypothesis (`draw`) or given to the fixed cases in turn (`spread`), and recorded in
`Case.layout` (a contiguous tensor is not named: that is the default), so a replay builds the same layout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hypothesis import strategies as st

from harness.core import limits as limit_table
from harness.core.case import Case
from harness.ops.contracts import any_strides
from harness.registry import Adapter


def choices(adapter: Adapter, cell: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """For each tensor of `cell` that may have any strides, the layout classes the adapter handles."""
    declared = adapter.limits.get("layouts") if "layouts" in limit_table.keys(adapter.op) else None
    return {name: limit_table.layouts_allowed(declared, name) for name in any_strides(adapter.op, cell)}


def draw(draw_fn: Callable[[Any], Any], adapter: Adapter, cell: Mapping[str, str]) -> dict[str, str]:
    """A layout class for each tensor of `cell` that may have any strides (hypothesis' simplest: contiguous)."""
    found = {}
    for name, allowed in choices(adapter, cell).items():
        value = draw_fn(st.sampled_from(allowed)) if len(allowed) > 1 else allowed[0]
        if value != "contiguous":
            found[name] = value
    return found


def _has_tokens(case: Case) -> bool:
    return all(case.shapes.get(d, 1) > 0 for d in ("M", "T", "max_tokens"))


def spread(adapter: Adapter, cases: Sequence[Case]) -> list[Case]:
    """The fixed cases with the adapter's layout classes given in turn, the strided ones first, to the cases with
    tokens, per tensor (a few fixed cases then exercise every class, whatever hypothesis draws); a tensor a case
    names a layout for keeps it."""
    turn: dict[str, int] = {}
    found = []
    for case in cases:
        layout = dict(case.layout)
        for name, allowed in choices(adapter, case.features).items():
            if name in layout or len(allowed) < 2 or not _has_tokens(case):
                continue
            ordered = [v for v in allowed if v != "contiguous"] + [v for v in allowed if v == "contiguous"]
            value = ordered[turn.get(name, 0) % len(ordered)]
            turn[name] = turn.get(name, 0) + 1
            if value != "contiguous":
                layout[name] = value
        found.append(case if layout == case.layout else case.replace(layout=layout))
    return found
