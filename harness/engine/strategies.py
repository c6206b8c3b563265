"""Hypothesis strategies that draw cases *within an adapter's declared support*: the declared and undeclared cells
of an adapter on a device, and a case of one of them (its sizes drawn by the op's spec, see `harness.core.sizes`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import strategies as st

from harness import ops
from harness.core.case import Case
from harness.core.device import DeviceInfo
from harness.registry import Adapter


def declared_cells(adapter: Adapter, device: DeviceInfo | None = None) -> list[dict[str, str]]:
    spec = ops.get(adapter.op)
    cells = adapter.declared_cells({a.name: a.values for a in spec.axes})
    return [c for c in cells if adapter.declares(c, device)[0]
            and (spec.inapplicable is None or spec.inapplicable(c) is None)]


def undeclared_cells(adapter: Adapter, device: DeviceInfo | None = None) -> list[dict[str, str]]:
    spec = ops.get(adapter.op)
    return [c for c in spec.all_cells() if not adapter.declares(c, device)[0]]


@st.composite
def cases(draw: st.DrawFn, adapter: Adapter, cells: Sequence[Mapping[str, str]]) -> Case:
    """A case of `adapter` for one of `cells` (sizes and parameters drawn by the op's spec)."""
    if not cells:
        raise ValueError(f"adapter {adapter.name} has no cell to draw from")
    cell = dict(draw(st.sampled_from(list(cells))))
    fields = ops.get(adapter.op).draw(draw, adapter, cell)
    seed = draw(st.integers(min_value=0, max_value=2**31 - 1))
    return Case(op=adapter.op, adapter=adapter.name, features=cell, seed=seed, **fields)


def threshold_cases(adapter: Adapter, cells: Sequence[Mapping[str, str]]) -> list[Case]:
    """One case at each size the adapter declares past one of its kernel's internal thresholds (limits
    `cross_<dim>`: an int or a tuple), on the first of `cells` whose boundary cases have that dim: its boundary case
    with the fewest elements otherwise and at least one token, with <dim> set to that size. Draws stay small on a
    CPU, so without these a 1024-wide tile, a scan used above 32768 ids or a split path for wide rows would never
    be crossed."""
    spec = ops.get(adapter.op)
    found: list[Case] = []
    for key, value in adapter.limits.items():
        dim = key.removeprefix("cross_")
        if dim == key:
            continue
        for cell in cells[:64]:
            usable = [b for b in spec.boundary(adapter, cell) if dim in b["shapes"] and _substantive(b)]
            if not usable:
                continue
            base = min(usable, key=lambda b: _size(b["shapes"]))
            for size in (value if isinstance(value, (tuple, list)) else (value,)):
                shapes = {**base["shapes"], dim: int(size)}
                found.append(Case(op=adapter.op, adapter=adapter.name, features=dict(cell),
                                  **{**base, "shapes": shapes}))
            break
    return found


def _substantive(fields: Mapping[str, Any]) -> bool:
    """A boundary case that can fail: it has tokens and, under an expert map, a local expert."""
    return (all(fields["shapes"].get(t, 1) > 0 for t in ("M", "T", "max_tokens"))
            and fields.get("params", {}).get("local_experts", 1) != 0)


def _size(shapes: Mapping[str, int]) -> int:
    n = 1
    for v in shapes.values():
        n *= max(int(v), 1)
    return n


def _rows(shapes: Mapping[str, int]) -> int:
    """The token rows of a case (M, T or max_tokens; 2 for an op without them, which never wants more)."""
    return next((int(shapes[d]) for d in ("M", "T", "max_tokens") if d in shapes), 2)


def value_covering_cases(adapter: Adapter, cells: Sequence[Mapping[str, str]]) -> list[Case]:
    """A few small non-vacuous cases that together exercise every declared value of every axis (a greedy cover of the
    (axis, value) pairs by declared cells, each judged on the op's smallest boundary case with tokens, local
    experts, a few values and several token rows). Hypothesis' few draws over hundreds of cells leave whole value
    families (an activation, a quant type) unexercised in a CI run; these make every run cover them."""
    spec = ops.get(adapter.op)
    uncovered = {(a, v) for c in cells for a, v in c.items()}
    pool = list(cells)
    found: list[Case] = []
    while uncovered and pool:
        cell = max(pool, key=lambda c: len(set(c.items()) & uncovered))
        gain = set(cell.items()) & uncovered
        if not gain:
            break
        pool.remove(cell)
        usable = [b for b in spec.boundary(adapter, cell) if _substantive(b)]
        if not usable:
            continue
        ranked = sorted(usable, key=lambda b: _size(b["shapes"]))
        # a few values, not one, over several token rows (a row-tiled kernel then runs more than one program: a
        # reduction over programs, a per-tensor amax, is exercised), else the smallest with a few values
        base = next((b for b in ranked if _size(b["shapes"]) >= 16 and _rows(b["shapes"]) >= 2),
                    next((b for b in ranked if _size(b["shapes"]) >= 16), ranked[-1]))
        found.append(Case(op=adapter.op, adapter=adapter.name, features=dict(cell), **base))
        uncovered -= gain
    return found
