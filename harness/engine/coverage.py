"""What a profile's generic test exercises, counted without running a kernel: the draw-coverage report
(`python -m harness coverage`).

The plan of one adapter's generic test is its fixed cases (`harness.engine.fixed.explicit_examples`) and the cases
hypothesis draws under the profile (`harness.engine.strategies.property_test`: the same search with the same
derandomized seed, so `ci` here is what CI draws). Each case the adapter's declarations accept (`turned_away`:
the runner would report the others unsupported without running them) is counted against what the adapter
declares:

- `axis`: each declared value of each feature axis, in cases with tokens and a local expert (a vacuous case
  computes nothing);
- `value class`: each of the op's value classes per family (`ValueClass.applies`, `.family`), asked of the inputs
  each case builds (`ValueClass.present`, on the CPU);
- `expert map`: each map shape the adapter declares (`expert_maps`), in cells with an expert map;
- `layout`: each layout class (`harness.core.layouts`) the adapter's `layouts` limit allows, for each tensor the
  op's contract says may have any strides, in cases with tokens and a local expert;
- `boundary`: no token, one token row, no local expert, where the op's boundary cases of the declared cells have
  them (n/a where the adapter's limits leave none, e.g. a token count that must be a multiple of 4);
- `threshold`: each size past a declared internal threshold (`cross_<dim>`), in the cells it names.

The regions of the adapter's known findings (`Adapter.known`) are listed with each adapter: the search leaves them
out (drawn cases inside one are not counted), the fixed cases inside them are counted.

A row that cannot apply (a value no declared cell holds on the generation, a class whose `applies` holds for none
of the declared cells) is `n/a` with the reason; a row that applies and no case exercises is a gap. Size bands
(`DimStats`: quantiles, and whether 0, 1, the declared max and the tile edges were reached) are reported, not
required.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import settings

from harness import ops, registry
from harness.core import layouts
from harness.core import limits as limit_table
from harness.core.case import Case
from harness.core.device import DeviceInfo
from harness.core.known import KnownFinding, finding_of
from harness.core.sizes import limit
from harness.engine import fitting, strided
from harness.engine import strategies as hs
from harness.engine.fixed import VACUOUS_KINDS, explicit_examples
from harness.engine.profiles import name_of
from harness.ops import large
from harness.ops.base import ValueClass
from harness.registry import Adapter, SupportRuleError

#: a capability for each GPU generation, for support rules that read it (the report runs no kernel)
CAPABILITIES = {"sm80": (8, 0), "sm89": (8, 9), "sm90": (9, 0), "sm100": (10, 0), "sm120": (12, 0)}

#: the most input elements of a case whose inputs the report builds on the CPU (a larger one holds no class that
#: reads inputs: the classes are small cases)
LARGEST_BUILT = 1 << 26

#: the token dims of the ops' cases (one row each)
TOKEN_DIMS = ("M", "T", "max_tokens")

#: the sections of a report, in order
SECTIONS = ("axis", "value class", "expert map", "layout", "boundary", "threshold")

#: boundary kinds: the fields that hold each
BOUNDARY_KINDS: dict[str, Callable[[Mapping[str, Any]], bool]] = {
    **VACUOUS_KINDS,
    "one token row": lambda f: 1 in (f["shapes"].get(d) for d in TOKEN_DIMS),
}


@dataclass
class Row:
    """One thing the adapter declares and how many cases of the plan exercise it (`drawn`, `fixed`); `why`: the
    reason it cannot apply (then it is `n/a`)."""

    section: str
    item: str
    drawn: int = 0
    fixed: int = 0
    why: str = ""
    #: where it sorts within its section (the op's order of axes and values, classes, shapes...)
    rank: tuple[int, ...] = ()

    @property
    def status(self) -> str:
        return "n/a" if self.why else ("ok" if self.drawn + self.fixed else "gap")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        del d["rank"]
        return {**d, "status": self.status}

    def order(self) -> tuple[int, tuple[int, ...]]:
        return SECTIONS.index(self.section), self.rank


@dataclass
class DimStats:
    """The sizes one dim takes in the plan: quantiles, and how many cases sit at 0, 1, the declared max
    (`max_<dim>` or the op's default at the scale) and the tile edges (`block_<dim>` - 1, itself, + 1)."""

    dim: str
    count: int
    quantiles: dict[str, int]
    at: dict[str, int]


@dataclass
class AdapterCoverage:
    """The report of one adapter. `skipped`: why nothing is drawn for it here (no declared cell on the
    generation)."""

    adapter: str
    op: str
    generation: str
    cells: int = 0
    drawn: int = 0
    fixed: int = 0
    turned_away: dict[str, int] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    dims: list[DimStats] = field(default_factory=list)
    skipped: str = ""
    seconds: float = 0.0
    #: the regions its known findings take out of the search (`harness.core.known`), each in words
    known: list[str] = field(default_factory=list)
    #: drawn cases inside those regions: not judged by the generic test, so not counted
    excluded: int = 0

    def gaps(self) -> list[Row]:
        return [r for r in self.rows if r.status == "gap"]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["rows"] = [r.to_dict() for r in self.rows]
        return d


# ------------------------------------------------------------------------------------------------ the plan


def device_for(generation: str) -> DeviceInfo:
    """A description of a device of `generation` (the report builds inputs on the CPU and runs no kernel)."""
    from harness.core.device import GENERATIONS, detect

    if generation not in GENERATIONS:
        raise ValueError(f"generation must be one of {', '.join(GENERATIONS)}, got {generation!r}")
    cuda = generation in CAPABILITIES
    return dataclasses.replace(detect("cpu"), generation=generation, device="cuda:0" if cuda else "cpu",
                               capability=CAPABILITIES.get(generation))


class _Collector:
    """The drawn cases of a property test, each once, in draw order."""

    def __init__(self) -> None:
        self.cases: dict[str, Case] = {}

    def prop(self, case: Case) -> None:
        self.cases.setdefault(case.case_id, case)


def drawn_cases(adapter: Adapter, cells: Sequence[Mapping[str, str]], device: DeviceInfo | None,
                profile: settings) -> list[Case]:
    """The distinct cases the generic test's search draws for `cells` under `profile` (unsharded)."""
    collector = _Collector()
    hs.property_test(adapter, cells, device, profile, collector)()
    return list(collector.cases.values())


def turned_away(adapter: Adapter, device: DeviceInfo, case: Case) -> str | None:
    """Why the runner would report `case` unsupported without running it (its shape limits, expert map, support
    rule for its shapes), None when it would judge it."""
    if (why := adapter.shape_unsupported(case.shapes, case.params, case.layout)) is not None:
        return why
    try:
        return adapter.case_unsupported(device, case.features, case.shapes)
    except SupportRuleError:
        return None  # judged: the runner reports the rule's error


def _fields(case: Case) -> dict[str, Any]:
    return {"shapes": dict(case.shapes), "params": dict(case.params)}


def vacuous(case: Case) -> bool:
    """No token, or no local expert: the expected output is empty or zeros, nothing is computed."""
    return any(kind(_fields(case)) for kind in VACUOUS_KINDS.values())


# ------------------------------------------------------------------------------------------------ the rows


class _Counted:
    """The accepted cases of the plan, each with where it came from and its inputs (built once, when a value
    class asks)."""

    def __init__(self, adapter: Adapter, drawn: Iterable[Case], fixed: Iterable[Case]) -> None:
        self.adapter = adapter
        self.cases = [(c, "drawn") for c in drawn] + [(c, "fixed") for c in fixed]
        self._inputs: dict[str, Mapping[str, torch.Tensor]] = {}

    def inputs(self, case: Case) -> Mapping[str, torch.Tensor]:
        if case.case_id not in self._inputs:
            spec = ops.get(case.op)
            self._inputs[case.case_id] = (spec.class_inputs or spec.make_inputs)(case, "cpu")
        return self._inputs[case.case_id]

    def present(self, vc: ValueClass, case: Case) -> bool:
        """Whether the inputs of `case` hold `vc`; a test written for the class's own cases that cannot read
        another case's inputs (fewer experts than it compares) finds it absent. Inputs that cannot be built raise:
        the generic test would fail that case."""
        if not vc.reads_inputs:  # read from the shapes (a case past 2**31 elements is not built on the CPU)
            return bool(vc.present(case, {}))
        if ops.get(case.op).estimated_input_elements(case) > LARGEST_BUILT:
            return False
        inputs = self.inputs(case)
        try:
            return bool(vc.present(case, inputs))
        except (IndexError, KeyError, RuntimeError, ValueError):
            return False

    def row(self, section: str, item: str, holds: Callable[[Case], bool], rank: tuple[int, ...] = ()) -> Row:
        r = Row(section, item, rank=rank)
        for case, origin in self.cases:
            if holds(case):
                setattr(r, origin, getattr(r, origin) + 1)
        return r


def _axis_rows(counted: _Counted, cells: Sequence[Mapping[str, str]], generation: str) -> list[Row]:
    rows = []
    for i, axis in enumerate(ops.get(counted.adapter.op).axes):
        for j, value in enumerate(axis.values):
            if value not in counted.adapter.support.get(axis.name, ()):
                continue
            r = counted.row("axis", f"{axis.name}={value}",
                            lambda c, a=axis.name, v=value: c.features.get(a) == v and not vacuous(c), (i, j))
            if not any(cell.get(axis.name) == value for cell in cells):
                r.why = f"no declared cell on {generation} holds it (the support rule or the op excludes it)"
            rows.append(r)
    return rows


def _family(cell: Mapping[str, str], axes: Sequence[str]) -> str:
    return ", ".join(f"{a}={cell.get(a, '')}" for a in axes)


def _value_class_rows(counted: _Counted, cells: Sequence[Mapping[str, str]], profile: str | None) -> list[Row]:
    adapter, rows = counted.adapter, []
    for i, vc in enumerate(large.classes(ops.get(adapter.op), profile)):
        families = list(dict.fromkeys(_family(c, vc.family) for c in cells if vc.applies(adapter, c)))
        if not families:
            rows.append(Row("value class", vc.name, why="its `applies` holds for none of the declared cells",
                            rank=(i, 0)))
        for j, fam in enumerate(families):
            label = f"{vc.name} ({fam})" if fam else vc.name

            def holds(c: Case, vc: Any = vc, fam: str = fam) -> bool:
                return (vc.applies(adapter, c.features) and _family(c.features, vc.family) == fam
                        and counted.present(vc, c))

            rows.append(counted.row("value class", label, holds, (i, j)))
    return rows


def _raw_boundary(adapter: Adapter, cells: Sequence[Mapping[str, str]]) -> list[dict[str, Any]]:
    """The op's own boundary cases of the declared cells (before they are fitted to the adapter's limits): what
    the op means to reach."""
    spec = ops.get(adapter.op)
    return [b for cell in cells for b in spec.boundary(adapter, cell)]


def _map_rows(counted: _Counted, raw: Sequence[Mapping[str, Any]]) -> list[Row]:
    adapter = counted.adapter
    if "expert_maps" not in limit_table.keys(adapter.op):
        return []
    declared = limit(adapter, "expert_maps")
    mapped = any("local_experts" in b.get("params", {}) for b in raw)
    rows = []
    for i, shape in enumerate(s for s in limit_table.MAP_SHAPES if limit_table.map_allowed(declared, s)):
        def holds(c: Case, shape: str = shape) -> bool:
            n = c.params.get("local_experts")
            return bool(n) and limit_table.map_shape(c.params, int(c.shapes.get("E", 0))) == shape

        r = counted.row("expert map", shape, holds, (i,))
        r.why = "" if mapped else "no declared cell has an expert map"
        rows.append(r)
    return rows


def _layout_rows(counted: _Counted, cells: Sequence[Mapping[str, str]]) -> list[Row]:
    adapter, rows = counted.adapter, []
    allowed: dict[str, tuple[str, ...]] = {}
    for cell in cells:
        for name, classes in strided.choices(adapter, cell).items():
            allowed.setdefault(name, classes)
    for i, (name, classes) in enumerate(allowed.items()):
        for j, layout in enumerate(classes):
            def holds(c: Case, name: str = name, layout: str = layout) -> bool:
                return (name in strided.choices(adapter, c.features) and not vacuous(c)
                        and layouts.of(c.layout, name) == layout)

            rows.append(counted.row("layout", f"{name}: {layout}", holds, (i, j)))
    return rows


def _allowed_kind(adapter: Adapter, cells: Sequence[Mapping[str, str]], matches: Callable[..., bool]) -> bool:
    """Whether a boundary case of this kind, fitted to the adapter's limits, is left in some cell (of the first 64,
    as the generic test looks for its vacuous cases): a token dim that must be a multiple of 4 has no one-row
    case."""
    return any(matches(b) for cell in cells[:64] for b in fitting.boundary(adapter, cell))


def _boundary_rows(counted: _Counted, cells: Sequence[Mapping[str, str]],
                   raw: Sequence[Mapping[str, Any]]) -> list[Row]:
    rows = []
    for i, (kind, matches) in enumerate(BOUNDARY_KINDS.items()):
        if any(matches(b) for b in raw):
            r = counted.row("boundary", kind, lambda c, m=matches: m(_fields(c)), (i,))
            if r.status == "gap" and not _allowed_kind(counted.adapter, cells, matches):
                r.why = "the adapter's limits leave no boundary case of this kind"
            rows.append(r)
    return rows


def _threshold_rows(counted: _Counted, cells: Sequence[Mapping[str, str]]) -> list[Row]:
    rows = []
    for i, (dim, sizes, where) in enumerate(hs.thresholds(counted.adapter)):
        def inside(features: Mapping[str, str], where: Any = where) -> bool:
            return all(features.get(a) in v for a, v in where.items())

        scope = "; ".join(f"{a} in {', '.join(v)}" for a, v in where.items())
        for size in sizes:
            r = counted.row("threshold", f"{dim} >= {size}" + (f" ({scope})" if scope else ""),
                            lambda c, d=dim, s=size, f=inside: f(c.features) and c.shapes.get(d, 0) >= s, (i, size))
            r.why = "" if any(inside(c) for c in cells) else "no declared cell lies where it is declared"
            rows.append(r)
    return rows


def _quantiles(values: list[int]) -> dict[str, int]:
    ordered = sorted(values)
    return {name: ordered[min(len(ordered) - 1, int(q * len(ordered)))]
            for name, q in (("min", 0.0), ("p25", 0.25), ("p50", 0.5), ("p75", 0.75), ("max", 1.0))}


def _dim_stats(adapter: Adapter, cases: Sequence[Case]) -> list[DimStats]:
    found = []
    keys = limit_table.keys(adapter.op)
    for d in limit_table.DIMS.get(adapter.op, ()):
        values = [int(c.shapes[d.name]) for c in cases if d.name in c.shapes]
        if not values:
            continue
        marks: dict[str, int] = {"0": 0, "1": 0}
        if (most := limit(adapter, f"max_{d.name}")) is not None:
            marks[f"max {most}"] = int(most)
        if f"block_{d.name}" in keys:
            b = int(limit(adapter, f"block_{d.name}"))
            marks.update({f"block-1 {b - 1}": b - 1, f"block {b}": b, f"block+1 {b + 1}": b + 1})
        at = {name: sum(v == size for v in values) for name, size in marks.items()}
        found.append(DimStats(d.name, len(values), _quantiles(values), at))
    return found


# ------------------------------------------------------------------------------------------------ the report


def adapter_coverage(adapter: Adapter, device: DeviceInfo, profile: settings) -> AdapterCoverage:
    """The coverage of `adapter`'s generic test on `device` (its generation) under `profile`."""
    t0 = time.perf_counter()
    device = adapter.device_for(device)
    out = AdapterCoverage(adapter.name, adapter.op, device.generation)
    cells = hs.declared_cells(adapter, device)
    if not cells:
        out.skipped = f"declares no cell on {device.generation}"
        return out
    fixed = explicit_examples(adapter, cells, name_of(profile))
    known = {c.case_id for c in fixed}
    drawn = [c for c in drawn_cases(adapter, cells, device, profile) if c.case_id not in known]
    out.known = [known_region(k, fixed) for k in adapter.known]
    out.excluded = sum(finding_of(adapter.known, c) is not None for c in drawn)
    drawn = [c for c in drawn if finding_of(adapter.known, c) is None]
    kept: dict[str, list[Case]] = {"drawn": [], "fixed": []}
    for origin, found in (("drawn", drawn), ("fixed", fixed)):
        for case in found:
            if (why := turned_away(adapter, device, case)) is None:
                kept[origin].append(case)
            else:
                key = f"{origin}: {why}"
                out.turned_away[key] = out.turned_away.get(key, 0) + 1
    counted = _Counted(adapter, kept["drawn"], kept["fixed"])
    raw = _raw_boundary(adapter, cells)
    out.cells, out.drawn, out.fixed = len(cells), len(kept["drawn"]), len(kept["fixed"])
    out.rows = [*_axis_rows(counted, cells, device.generation), *_value_class_rows(counted, cells, name_of(profile)),
                *_map_rows(counted, raw), *_layout_rows(counted, cells), *_boundary_rows(counted, cells, raw),
                *_threshold_rows(counted, cells)]
    out.dims = _dim_stats(adapter, kept["drawn"] + kept["fixed"])
    out.seconds = round(time.perf_counter() - t0, 2)
    return out


def known_region(found: KnownFinding, fixed: Sequence[Case]) -> str:
    """A known finding's region as the report shows it: where, what fails, its case, the fixed cases inside."""
    inside = sum(found.contains(c) for c in fixed)
    return (f"{found.describe()}: known finding {found.finding}, expected to fail {', '.join(found.checks)}; left out "
            f"of the search, its case {found.case.case_id} judged every run ({inside} fixed case(s) inside judged "
            "too)")


def builtin_adapters() -> list[Adapter]:
    """The adapters this project ships (`harness.registry.BUILTIN_PROVIDERS`): no third-party library, not
    published by an installed package."""
    published = {a.name for a in registry.entry_point_adapters()}
    return [a for a in registry.all_adapters() if a.library is None and a.name not in published]


def coverage(adapters: Iterable[Adapter], device: DeviceInfo, profile: settings) -> list[AdapterCoverage]:
    return [adapter_coverage(a, device, profile) for a in adapters]
