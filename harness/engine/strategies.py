"""Hypothesis strategies that draw cases *within an adapter's declared support*: the declared and undeclared cells
of an adapter on a device, and a case of one of them (its sizes and values drawn by the op's spec, see
`harness.core.sizes` and `harness.core.inputs`). Besides the draws, the explicit cases every run judges: a cover of
every declared value, one case per value class and family (`value_class_cases`), one past each declared threshold
(`threshold_cases`), each fitted to the adapter's declarations as the draws are (`harness.engine.fitting`).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from hypothesis import given, seed, settings
from hypothesis import strategies as st

from harness import ops
from harness.core.case import Case
from harness.core.device import DeviceInfo
from harness.engine import fitting, strided
from harness.engine.fitting import accepted
from harness.ops import large
from harness.registry import Adapter


def declared_cells(adapter: Adapter, device: DeviceInfo | None = None) -> list[dict[str, str]]:
    spec = ops.get(adapter.op)
    cells = adapter.declared_cells({a.name: a.values for a in spec.axes})
    _ask_cell_rules(adapter, device, cells)
    return [c for c in cells if adapter.declares(c, device)[0]
            and (spec.inapplicable is None or spec.inapplicable(c) is None)]


def undeclared_cells(adapter: Adapter, device: DeviceInfo | None = None) -> list[dict[str, str]]:
    spec = ops.get(adapter.op)
    cells = spec.all_cells()
    _ask_cell_rules(adapter, device, [c for c in cells if all(v in adapter.support.get(a, ()) for a, v in
                                                              c.items())])
    return [c for c in cells if not adapter.declares(c, device)[0]]


def _ask_cell_rules(adapter: Adapter, device: DeviceInfo | None, cells: Sequence[Mapping[str, str]]) -> None:
    """The support rule for whole `cells` at once, for `declares` to find: every generic test of the experts asked
    3,360, one round trip to the kernel host each."""
    if device is not None:
        device = adapter.device_for(device)  # as `declares` asks
        if device.generation not in adapter.generations:
            return  # `declares` asks no rule there
    fitting.ask_rules_at_once(adapter, device, cells)


#: how many candidate cases one drawn example may take, the first that the adapter's declarations accept (its
#: `<dim>_multiple` and `expert_maps` limits, its support rule for shapes); the last is kept when none does (judged
#: unsupported). The op's draws honour the limits themselves, so this is for arbitrary `requires` rules
REDRAWS = 32


@st.composite
def cases(draw: st.DrawFn, adapter: Adapter, cells: Sequence[Mapping[str, str]],
          device: DeviceInfo | None = None) -> Case:
    """A case of `adapter` for one of `cells` (sizes and parameters drawn by the op's spec) that its declarations
    accept on `device` (None: any device), outside the regions of its known findings (`known_region`), drawn again
    up to `REDRAWS` times (`accepted`): no hypothesis filter, so a rule that excludes most shapes costs draws, not
    rejected examples (a draw left inside a region is not judged: `harness.plugin.generic`)."""
    if not cells:
        raise ValueError(f"adapter {adapter.name} has no cell to draw from")
    spec = ops.get(adapter.op)
    last: Any = None
    for _ in range(REDRAWS):
        cell = dict(draw(st.sampled_from(list(cells))))
        fields = spec.draw(draw, adapter, cell)
        # the same candidate again: hypothesis is feeding its simplest choices, which draw it every time
        if (cell, fields) == last or (accepted(adapter, device, cell, fields) and not known_region(adapter, cell,
                                                                                                   fields)):
            break
        last = (cell, fields)
    if layout := strided.draw(draw, adapter, cell):  # the tensors of any strides: a layout class each
        fields = {**fields, "layout": {**fields.get("layout", {}), **layout}}
    seed = draw(st.integers(min_value=0, max_value=2**31 - 1))
    return Case(op=adapter.op, adapter=adapter.name, features=cell, seed=seed, **fields)


def known_region(adapter: Adapter, cell: Mapping[str, str], fields: Mapping[str, Any]) -> bool:
    """Whether a case of `cell` with these fields lies in one of the adapter's known findings' regions (the search
    draws again: the finding's own case is judged every run, `harness.core.known`)."""
    return any(k.holds(cell, fields["shapes"], fields.get("params")) for k in adapter.known)


class Searcher(Protocol):
    """What a property test hands each drawn case to (`prop`)."""

    def prop(self, case: Case) -> None: ...


def property_test(adapter: Adapter, cells: Sequence[Mapping[str, str]], device: DeviceInfo | None,
                  profile: settings, search: Searcher, shard: tuple[int, int] = (0, 1),
                  name: str | None = None) -> Callable[[], None]:
    """The generic test's hypothesis search over the cases of `cells` under `profile`, each draw handed to
    `search.prop`: shard `index` of `count` draws its share of the examples under a seed of its own (from `name`,
    the adapter's name by default); unsharded, a derandomized profile's seed is hypothesis' own, which it derives
    from the source of `prop` below, so the generic test and the coverage report (`harness.engine.coverage`) draw
    the same cases; a profile that is not derandomized takes one random seed for every rerun of the search (its
    draws repeat, judged once)."""

    def prop(case):  # type: ignore[no-untyped-def]
        search.prop(case)

    test = given(case=cases(adapter, cells, device))(prop)
    index, count = shard
    if count > 1:
        examples = max(4, -(-profile.max_examples // count))
        return seed(zlib.crc32(f"{name or adapter.name}/{index}".encode()))(
            settings(profile, max_examples=examples, derandomize=False, database=None)(test))
    test = settings(profile)(test)
    return test if profile.derandomize else seed(random.getrandbits(64))(test)


def thresholds(adapter: Adapter) -> list[tuple[str, tuple[int, ...], Mapping[str, tuple[str, ...]]]]:
    """The adapter's declared thresholds: (dim, sizes just past them, the cells where the code past them runs) from
    its `cross_<dim>` limits: an int, a tuple of ints, {"at": int or tuple, "where": {axis: values}}, or a list of
    such mappings (one dim, several thresholds in different cells)."""
    found = []
    for key, value in adapter.limits.items():
        dim = key.removeprefix("cross_")
        if dim == key:
            continue
        # a list (or tuple: a description read back from a kernel host) of mappings is several thresholds
        several = isinstance(value, (list, tuple)) and any(isinstance(v, Mapping) for v in value)
        entries = list(value) if several else [value]
        for entry in entries:
            at, where = (entry["at"], entry.get("where", {})) if isinstance(entry, Mapping) else (entry, {})
            found.append((dim, tuple(int(v) for v in (at if isinstance(at, (tuple, list)) else (at,))), where))
    return found


def threshold_cases(adapter: Adapter, cells: Sequence[Mapping[str, str]]) -> list[Case]:
    """One case at each size the adapter declares past one of its kernel's internal thresholds (`thresholds`), on the
    first of `cells` (within the threshold's `where`) whose boundary cases have that dim: its boundary case with the
    fewest elements and at least one token, with <dim> set to that size: the cheapest shape that crosses it. Draws
    stay small on a CPU, so without these a 1024-wide tile, a scan used above 32768 ids or a split path for wide
    rows would never be crossed. The boundary and value-class cases are fitted to the adapter's declarations
    (`fitting`) before."""
    found: list[Case] = []
    for dim, sizes, where in thresholds(adapter):
        for cell in [c for c in cells if all(c.get(a) in v for a, v in where.items())][:64]:
            usable = [b for b in fitting.boundary(adapter, cell) if dim in b["shapes"] and _substantive(b)]
            if not usable:
                continue
            usable.sort(key=lambda b: _size({**b["shapes"], dim: 1}))
            for size in sizes:
                moved = [_moved(adapter, cell, base, dim, size) for base in usable]
                first = next((c for c in moved if c is not None), None)
                extra = [_moved(adapter, cell, b, dim, size) for b in _class_bases(adapter, cell, dim)]
                found += [c for c in (first, *extra) if c is not None]
            break
    return found


def _moved(adapter: Adapter, cell: Mapping[str, str], base: Mapping[str, Any], dim: str, size: int) -> Case | None:
    """`base` with <dim> set to `size`, None where the op cannot build that case (`OpSpec.invalid`: k past E, ...)."""
    case = Case(op=adapter.op, adapter=adapter.name, features=dict(cell),
                **{**base, "shapes": {**base["shapes"], dim: size}})
    invalid = ops.get(adapter.op).invalid
    return case if invalid is None or invalid(case) is None else None


def _class_bases(adapter: Adapter, cell: Mapping[str, str], dim: str) -> list[dict[str, Any]]:
    """The fields of the op's value classes for `cell` that can take another size of `dim` (not those that fix
    per-expert counts, which fix the token and expert counts): the code past a threshold meets zero rows and
    outliers too."""
    found = []
    for vc in ops.get(adapter.op).value_classes:
        if vc.applies(adapter, cell) and not vc.sized:
            fields = fitting.fitted(adapter, cell, vc.fields(adapter, cell), holds=vc.present)
            if fields is not None and dim in fields["shapes"] and "counts" not in fields.get("params", {}):
                found.append(dict(fields))
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
    families (an activation, a quant type) unexercised in a CI run; these make every run cover them. The boundary
    cases are fitted to the adapter's declarations (`fitting`)."""
    uncovered = {(a, v) for c in cells for a, v in c.items()}
    pool = list(cells)
    found: list[Case] = []
    while uncovered and pool:
        cell = max(pool, key=lambda c: len(set(c.items()) & uncovered))
        gain = set(cell.items()) & uncovered
        if not gain:
            break
        pool.remove(cell)
        usable = [b for b in fitting.boundary(adapter, cell) if _substantive(b)]
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


def value_class_cases(adapter: Adapter, cells: Sequence[Mapping[str, str]],
                      held_by: Sequence[Case] = ()) -> list[Case]:
    """One case of each of the op's value classes (all-zero groups, counts at block multiples, the first and last
    local expert, non-finite rows...) per family of the declared cells that can hold it (the values of the class's
    family axes): the declared-value cover exercises every value, these every boundary value class in each family,
    in every run. Each is fitted to the adapter's declarations (`fitting.fitted`, the class still present), or
    kept as it is where it cannot be (judged unsupported). A family whose class the inputs of a case of `held_by`
    (other fixed cases: a threshold case built from the class's fields) already hold gets no case of its own."""
    spec = ops.get(adapter.op)
    found: list[Case] = []
    held = value_class_coverage(adapter, cells, held_by, skip_unbuildable=True) if held_by else {}
    for vc in spec.value_classes:
        families: dict[tuple[str, ...], Mapping[str, str]] = {}
        for cell in cells:
            if vc.applies(adapter, cell):
                families.setdefault(tuple(cell.get(a, "") for a in vc.family), cell)
        for key, cell in families.items():
            if held.get((vc.name, key)) is not None:
                continue
            fields = vc.fields(adapter, cell)
            fields = dict(fitting.fitted(adapter, cell, fields, holds=vc.present) or fields)
            found.append(Case(op=adapter.op, adapter=adapter.name, features=dict(cell), **fields))
    return found


def profile_class_cases(adapter: Adapter, cells: Sequence[Mapping[str, str]], profile: str | None) -> list[Case]:
    """One case of each value class only `profile` judges (`harness.ops.large`: past 2**31 elements, GPU profiles),
    on the first declared cell it applies to (half-precision cells first: half the bytes): the cell's fitted
    boundary case with tokens and the widest rows, its dim grown past 2**31 (`large.grow`). Left out where the
    adapter's declarations turn that case away (a `<dim>_multiple` it breaks, a support rule for the shapes):
    it does not get it."""
    found: list[Case] = []
    for vc in large.profile_classes(adapter.op, profile):
        usable = sorted((c for c in cells if vc.applies(adapter, c)), key=lambda c: "float32" in c.values())
        for cell in usable[:64]:
            bases = [b for b in fitting.boundary(adapter, cell) if large.base_case(adapter.op, b)]
            if not bases:
                continue
            # the widest rows: the fewest of them (outputs and programs) for the same 2**31 elements
            base = max(bases, key=lambda b: large.LARGE[adapter.op].per_unit({"features": cell, **b}))
            fields = large.grow(adapter.op, adapter, {"features": dict(cell), **base})
            if accepted(adapter, None, cell, fields) and fitting.follows(adapter, fields):
                found.append(Case(op=adapter.op, adapter=adapter.name, features=dict(cell), **fields))
            break
    return found


def value_class_coverage(adapter: Adapter, cells: Sequence[Mapping[str, str]], judged: Sequence[Case],
                         skip_unbuildable: bool = False) -> dict[tuple[str, tuple[str, ...]], str | None]:
    """For each value class and family of the declared `cells`, the id of a case of `judged` whose inputs hold the
    class (asked of the tensors it builds, on the CPU, once per case), or None where none does. skip_unbuildable:
    a case whose inputs cannot be built (judged unsupported) holds nothing, instead of raising its ValueError."""
    spec = ops.get(adapter.op)
    built: dict[str, Mapping[str, Any] | None] = {}

    def inputs(case: Case) -> Mapping[str, Any] | None:
        if case.case_id not in built:
            try:
                built[case.case_id] = spec.make_inputs(case, "cpu")
            except ValueError:
                if not skip_unbuildable:
                    raise
                built[case.case_id] = None
        return built[case.case_id]

    found: dict[tuple[str, tuple[str, ...]], str | None] = {}
    for vc in spec.value_classes:
        for cell in cells:
            if vc.applies(adapter, cell):
                found.setdefault((vc.name, tuple(cell.get(a, "") for a in vc.family)), None)
        for case in judged:
            key = (vc.name, tuple(case.features.get(a, "") for a in vc.family))
            if found.get(key, "") is None and vc.applies(adapter, case.features) \
                    and (got := inputs(case)) is not None and vc.present(case, got):
                found[key] = case.case_id
    return found
