"""The fixed cases every run judges besides the draws (the matrix's boundary cases, the generic test's explicit
examples: vacuous boundary cases, the value cover, the value classes, the thresholds) follow the adapter's
declared size limits and support rule, as the draws do (harness.engine.fitting): an adapter that needs E % 16 == 0
gets its boundary cases at E = 16, not unsupported verdicts at E = 8; an adapter without size limits plans exactly
what the op's boundary cases give."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Mapping
from typing import Any
from unittest import mock

import pytest

from harness import ops, registry, sweep
from harness.core.case import Case
from harness.core.device import detect
from harness.engine import runner
from harness.engine import strategies as hs
from harness.plugin.generic import explicit_examples

CPU = detect("cpu")

#: (op, limits): adapters of unseen libraries whose kernels need these multiples
LIMITED = [("routing", {"E_multiple": 16}), ("grouped_routing", {"E_multiple": 16}),
           ("experts", {"K_multiple": 64, "N_multiple": 64}), ("align", {"E_multiple": 8})]


def _limited(op: str, lims: Mapping[str, Any]) -> registry.Adapter:
    base = registry.resolve(f"reference-{op.replace('_', '-')}")
    return dataclasses.replace(base, name=f"limited-{op}", limits=dict(lims))


def _breaks(case: Case, lims: Mapping[str, Any]) -> list[str]:
    """The declared multiples a case's shapes break, checked directly."""
    return [f"{key}: {case.shapes}" for key, m in lims.items()
            if key.endswith("_multiple") and case.shapes.get(key.removesuffix("_multiple"), 0) % m]


def _raw_plan(adapter: registry.Adapter) -> sweep.Plan:
    """The plan as the op's boundary cases give it, nothing fitted (the plan before fitting existed)."""
    from harness.engine import fitting  # here: the cases above also run where it does not exist

    def raw(a: registry.Adapter, cell: Mapping[str, str], device: Any = None, *, start: int = 0,
            most: int | None = None, reached: bool = True) -> list[dict[str, Any]]:
        cases = ops.get(a.op).boundary(a, cell)
        return (cases[start:] + cases[:start])[: most or len(cases)]

    with mock.patch.object(fitting, "boundary", raw):
        return sweep.plan(adapter, "quick")


def _cell_key(features: Mapping[str, str]) -> tuple:
    return tuple(sorted(features.items()))


def _fields_key(case: Case) -> str:
    return json.dumps([case.features, case.shapes, case.params], sort_keys=True)


def _turned_away(adapter: registry.Adapter, cases: list[Case]) -> list[str]:
    """The cases the runner's gate would report unsupported by the adapter's declarations."""
    return [f"{c.features} {c.shapes}" for c in cases if adapter.shape_unsupported(c.shapes, c.params)
            or (adapter.claims(c.features) and adapter.case_unsupported(None, c.features, c.shapes))]  # type: ignore[arg-type]


def _judge_moved(adapter: registry.Adapter, cases: list[Case], before: list[Case]) -> dict[str, str]:
    """The verdicts of the cases that are not among `before` (moved by the fitting): the others were judged as
    they are before it existed."""
    known = {_fields_key(c) for c in before}
    return {c.case_id: runner.judge(c, adapter, CPU).verdict for c in cases if _fields_key(c) not in known}


#: a multiple whose nearest sizes are no case of the op (K = 192 is not whole groups of 128): the next one is taken
ALIGNED = [("group_quant", {"K_multiple": 96})]


@pytest.mark.parametrize(("op", "lims"), LIMITED + ALIGNED, ids=[op for op, _ in LIMITED + ALIGNED])
def test_the_planned_cases_follow_the_declared_multiples(op: str, lims: dict[str, int]) -> None:
    """Every planned case of the quick matrix keeps the declared multiples and the runner's gate lets it through;
    every moved case passes (the reference is right: the case is a valid case of its op); no boundary case of any
    cell is lost, and every cell that had planned cases still has as many."""
    from harness.engine import fitting

    adapter = _limited(op, lims)
    spec = ops.get(op)
    assert [len(fitting.boundary(adapter, c)) for c in spec.all_cells()] == \
        [len(spec.boundary(adapter, c)) for c in spec.all_cells()]
    planned = sweep.plan(adapter, "quick").cases
    assert not [b for c in planned for b in _breaks(c, lims)]
    assert not _turned_away(adapter, planned)
    raw = _raw_plan(adapter).cases
    assert Counter(_cell_key(c.features) for c in planned) == Counter(_cell_key(c.features) for c in raw)
    verdicts = _judge_moved(adapter, planned, raw)
    assert set(verdicts.values()) <= {"pass"}, verdicts


@pytest.mark.parametrize(("op", "lims"), LIMITED, ids=[op for op, _ in LIMITED])
def test_the_generic_tests_explicit_examples_follow_the_declared_multiples(op: str, lims: dict[str, int]) -> None:
    """The explicit examples keep the multiples and pass the gate, as many as without the limits, each moved one
    passes, and a value-class case that held its class holds it still (the inputs it builds are asked)."""
    adapter, unlimited = _limited(op, lims), _limited(op, {})
    cells = hs.declared_cells(adapter, CPU)
    examples, before = explicit_examples(adapter, cells), explicit_examples(unlimited, cells)
    assert len(examples) == len(before) and not [b for c in examples for b in _breaks(c, lims)]
    assert not _turned_away(adapter, examples)
    verdicts = _judge_moved(adapter, examples, before)
    assert set(verdicts.values()) <= {"pass"}, verdicts
    spec, kept = ops.get(op), {_fields_key(c) for c in examples}
    for vc in spec.value_classes:
        families: dict[tuple, dict[str, str]] = {}
        for cell in cells:
            if vc.applies(adapter, cell):
                families.setdefault(tuple(cell.get(a, "") for a in vc.family), cell)
        for key, cell in families.items():
            was = Case(op=op, adapter=adapter.name, features=dict(cell), **vc.fields(adapter, cell))
            if _fields_key(was) in kept or not vc.present(was, spec.make_inputs(was, "cpu")):
                continue  # not moved by the fitting, or nothing to keep
            # the moved case of the class, or another fixed case of its family that holds it (the class then gets
            # no case of its own: strategies.value_class_cases)
            moved = [c for c in examples if tuple(c.features.get(a, "") for a in vc.family) == key
                     and vc.applies(adapter, c.features)]
            assert any(vc.present(c, spec.make_inputs(c, "cpu")) for c in moved), (vc.name, cell)


@pytest.mark.parametrize("lims", [{"E_multiple": 5}, {"E_multiple": 5, "k_multiple": 3}, {"k_multiple": 16}])
def test_grouped_routing_keeps_its_groups_dividing_e(lims: dict[str, int]) -> None:
    """E moved from 8 to 10: 4 groups no longer divide it, so the groups move to 2; k moved up: enough groups kept
    for it. Every planned case keeps its multiples and its groups valid, no cell loses a case, each passes."""
    adapter = _limited("grouped_routing", lims)
    planned = sweep.plan(adapter, "quick").cases
    assert planned and not [b for c in planned for b in _breaks(c, lims)]
    for c in planned:
        e, g, tg = c.shapes["E"], c.params["num_groups"], c.params["topk_group"]
        assert e % g == 0 and tg <= g and c.shapes["k"] <= tg * (e // g), (c.shapes, c.params)
    raw = _raw_plan(adapter).cases
    assert Counter(_cell_key(c.features) for c in planned) == Counter(_cell_key(c.features) for c in raw)
    assert set(_judge_moved(adapter, planned, raw).values()) == {"pass"}


@pytest.mark.parametrize(("op", "lims"), [("align", {"M_multiple": 16, "E_multiple": 8}),
                                          ("reduce", {"M_multiple": 4, "E_multiple": 16}),
                                          ("align", {"k_multiple": 4})])
def test_per_expert_counts_follow_moved_rows_and_experts(op: str, lims: dict[str, int]) -> None:
    """Rows, experts or k moved: every case with per-expert counts still has one count per expert, filling
    M * k slots, none above M; every value class held without the limits is held with them (the counts under a
    contiguous map move with its range)."""
    adapter, unlimited = _limited(op, lims), _limited(op, {})
    cells = hs.declared_cells(adapter, CPU)
    examples = explicit_examples(adapter, cells)
    counted = [c for c in examples if "counts" in c.params]
    assert counted and not [b for c in examples for b in _breaks(c, lims)]
    assert not _turned_away(adapter, examples)
    for c in counted:
        counts, m, k = c.params["counts"], c.shapes["M"], c.shapes["k"]
        assert len(counts) == c.shapes["E"] and sum(counts) == m * k and max(counts) <= m, (c.shapes, counts)
    held = hs.value_class_coverage(unlimited, cells, explicit_examples(unlimited, cells))
    coverage = hs.value_class_coverage(adapter, cells, examples)
    assert [key for key, case_id in held.items() if case_id and not coverage[key]] == []


def test_a_case_that_cannot_be_fitted_is_left_out_but_a_cell_keeps_its_cases() -> None:
    """A support rule that turns away E = 8 (no size limit moves it): those cases are left out; a rule that turns
    away every shape: the cell keeps its boundary cases, to be reported unsupported."""
    from harness.engine import fitting

    def no_eight(device: Any, features: Mapping[str, str], shapes: Mapping[str, int] | None) -> str | None:
        return "E = 8 is not supported" if shapes is not None and shapes["E"] == 8 else None

    def none(device: Any, features: Mapping[str, str], shapes: Mapping[str, int] | None) -> str | None:
        return "no shape is supported" if shapes is not None else None

    base = registry.resolve("reference-routing")
    cell = hs.declared_cells(base)[0]
    raw = ops.get("routing").boundary(base, cell)
    some = fitting.boundary(dataclasses.replace(base, requires=no_eight), cell)
    assert some == [b for b in raw if b["shapes"]["E"] != 8] and len(some) < len(raw)
    assert fitting.boundary(dataclasses.replace(base, requires=none), cell) == raw


def test_every_registered_adapter_plans_what_it_planned_before() -> None:
    """Fitting changes a registered adapter's planned case only where the case breaks its declarations (a multiple
    or expert map that turns it away, a size past a min or max; compared with the plan of the op's boundary cases,
    nothing fitted): every other case is planned as before."""
    from harness.engine import fitting

    changed = []
    for a in registry.all_adapters():
        fitted = {c.case_id for c in sweep.plan(a, "quick").cases}
        for c in _raw_plan(a).cases:
            breaks = a.shape_unsupported(c.shapes, c.params) or not fitting.follows(a, {"shapes": c.shapes,
                                                                                        "params": c.params})
            if c.case_id not in fitted and not breaks:
                changed.append((a.name, c.case_id))
    assert not changed, changed[:5]


def _size_limited(adapter: registry.Adapter) -> bool:
    return any(k.endswith("_multiple") or k.startswith(("min_", "max_")) for k in adapter.limits)


def test_without_size_limits_the_fitting_is_the_identity_on_every_fixed_case() -> None:
    """For every registered adapter that declares no multiple, min or max: each boundary case and value-class case
    of each declared cell comes back unchanged (the very same fields)."""
    from harness.engine import fitting

    moved = []
    for adapter in [a for a in registry.all_adapters() if not _size_limited(a)]:
        spec = ops.get(adapter.op)
        for cell in hs.declared_cells(adapter)[:24]:
            fixed = [*spec.boundary(adapter, cell),
                     *(vc.fields(adapter, cell) for vc in spec.value_classes if vc.applies(adapter, cell))]
            moved += [(adapter.name, f) for f in fixed if fitting.fitted(adapter, cell, f) is not f]
    assert not moved, moved[:3]
