"""The declared op contracts (harness.ops.contracts) against the ops themselves, so the reference cannot drift.

For one boundary case of every cell family of every op (the cells that differ in the axes the contract's
conditions name, plus every value of every other axis at least once): the names `make_inputs` and `outputs`
produce are exactly the contract's entries present in that cell, shapes and dtypes agree wherever the contract
states them as plain expressions, every case parameter its boundary and drawn cases carry is documented as present
in that cell, an output the kernel owes in full is judged in full; and nothing is stale: every entry is present in
some cell, every documented parameter is read by the op. (A read of a parameter the case does not carry takes the
op's default: nothing to document.)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis import strategies as st

from harness import ops, registry
from harness.commands import conventions as conventions_command
from harness.core import conventions as conv
from harness.core.case import DTYPES, Case
from harness.core.device import detect
from harness.ops.base import OpSpec
from harness.ops.contracts import ALL, Contract, Tensor, contract_of, dims, sizes_of

CPU = detect("cpu")


class _Reads(dict):  # type: ignore[type-arg]
    """case.params that remembers which keys were read (iterating or copying reads them all)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)

    def __iter__(self) -> Any:
        self.read.update(self.keys())
        return super().__iter__()

    def items(self) -> Any:
        self.read.update(self.keys())
        return super().items()

    def values(self) -> Any:
        self.read.update(self.keys())
        return super().values()

    def copy(self) -> dict[str, Any]:
        self.read.update(self.keys())
        return dict(super().items())


def _adapter(op: str) -> registry.Adapter:
    """The op's reference adapter, stating every recipe convention (those travel in the case's params)."""
    ref = next(a for a in registry.all_adapters(op) if a.source == "reference")
    recipes = {c.key: {} for c in conv.BY_OP.get(op, ()) if c.kind == "recipe"}
    return dataclasses.replace(ref, conventions={**ref.conventions, **recipes}) if recipes else ref


def _families(spec: OpSpec, contract: Contract, adapter: registry.Adapter) -> list[dict[str, str]]:
    """One declared cell per combination of the axes the contract's conditions name, chosen so that every value of
    every other axis appears too."""
    cells = [c for c in spec.all_cells() if adapter.declares(c)[0]]
    named = sorted(contract.axes_named())
    groups: dict[tuple[str, ...], list[dict[str, str]]] = {}
    for c in cells:
        groups.setdefault(tuple(c[a] for a in named), []).append(c)
    unseen = {pair for c in cells for pair in c.items()}
    chosen = []
    for members in groups.values():
        best = max(members, key=lambda c: len(unseen & set(c.items())))
        unseen -= set(best.items())
        chosen.append(best)
    for c in cells:
        if unseen & set(c.items()):
            unseen -= set(c.items())
            chosen.append(c)
    return chosen


def _drawn(spec: OpSpec, adapter: registry.Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    """The Case fields of one case the op's strategy draws for `cell`."""
    strategy = st.composite(lambda draw: spec.draw(draw, adapter, cell))()
    once = settings(database=None, max_examples=1, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    return find(strategy, lambda _: True, settings=once)


def _dtype(entry: Tensor, cell: Mapping[str, str], inputs: Mapping[str, torch.Tensor]) -> torch.dtype | None:
    """The dtype an entry states, where it states one plainly: a dtype name, "the cell's AXIS", "NAME's dtype"."""
    if entry.dtype in DTYPES:
        return DTYPES[entry.dtype]
    if (m := re.fullmatch(r"the cell's (\w+)", entry.dtype)) and cell.get(m[1]) in DTYPES:
        return DTYPES[cell[m[1]]]
    if (m := re.fullmatch(r"(\w+)'s dtype", entry.dtype)) and m[1] in inputs:
        return inputs[m[1]].dtype
    return None


@dataclasses.dataclass
class _Seen:
    entries: set[int] = dataclasses.field(default_factory=set)
    params: set[str] = dataclasses.field(default_factory=set)
    shapes_checked: int = 0


def _check_case(op: str, contract: Contract, case: Case, produced: set[str], seen: _Seen) -> list[str]:
    spec, adapter = ops.get(op), _adapter(op)
    reads = _Reads(case.params)
    object.__setattr__(case, "params", reads)  # a frozen dataclass: watch what the op reads of its params
    inputs = spec.make_inputs(case, "cpu")
    outs = spec.outputs(case, inputs)
    checks = spec.expected(case, inputs, adapter.conventions_of(case, CPU))
    cell = case.features
    want_in, want_out, want_params = contract.present(cell)
    where = f"{op} {cell}"
    problems = []
    for kind, got, want in (("input", {n: t.shape for n, t in inputs.items()}, want_in),
                            ("output", {n: s.shape for n, s in outs.items()}, want_out)):
        names = [t.name for t in want]
        if sorted(got) != sorted(names):
            problems.append(f"{where}: {kind}s {sorted(got)}, the contract says {sorted(names)}")
        sizes = sizes_of(contract, case)
        for t in want:
            seen.entries.add(id(t))
            expect = dims(t.shape, sizes)
            if t.name in got and expect is not None:
                seen.shapes_checked += 1
                if tuple(got[t.name]) != expect:
                    problems.append(f"{where}: {kind} {t.name} has shape {list(got[t.name])}, the contract says "
                                    f"{t.shape} = {list(expect)}")
    for t in want_in + want_out:
        actual = inputs[t.name].dtype if t in want_in and t.name in inputs else (
            outs[t.name].dtype if t.name in outs else None)
        stated = _dtype(t, cell, inputs)
        if actual is not None and stated is not None and actual != stated:
            problems.append(f"{where}: {t.name} is {actual}, the contract says {t.dtype}")
    problems += [f"{where}: its cases carry param {p!r}, which the contract does not list for this cell"
                 for p in sorted(produced - {p.name for p in want_params})]
    seen.params |= reads.read
    for chk in checks:
        t = next((t for t in want_out if t.name == chk.name), None)
        if t is not None and t.written == ALL and chk.mask is not None and not bool(chk.mask.all()):
            problems.append(f"{where}: {chk.name} is judged on part of it only, the contract says the kernel "
                            f"writes {ALL}")
    return problems


@pytest.mark.parametrize("op", ops.available())
def test_the_contract_matches_the_op(op: str) -> None:
    spec = ops.get(op)
    contract = contract_of(spec)
    assert contract is not None, f"op {op} declares no contract (harness/ops/contracts.py)"
    adapter = _adapter(op)
    seen = _Seen()
    problems = []
    for cell in _families(spec, contract, adapter):
        fields = spec.boundary(adapter, cell)
        sized = [f for f in fields if all(v > 0 for v in f.get("shapes", {}).values())] or fields
        produced = {k for f in [*fields, _drawn(spec, adapter, cell)] for k in f.get("params", {})}
        case = Case(op=op, adapter=adapter.name, features=cell, seed=0, **sized[0])
        problems += _check_case(op, contract, case, produced, seen)
    entries: list[Tensor] = [*contract.inputs, *contract.outputs]
    problems += [f"{op}: entry {t.name} {t.shape} ({t.when or ''}{t.unless or ''}) is present in no cell tested"
                 for t in entries if id(t) not in seen.entries]
    problems += [f"{op}: param {p.name!r} is read in no case tested" for p in contract.params
                 if p.name not in seen.params]
    assert seen.shapes_checked, f"{op}: no shape of the contract could be checked"
    assert not problems, "\n".join(problems[:20])


@pytest.mark.parametrize("op", ops.available())
def test_the_contract_names_real_axes_and_values(op: str) -> None:
    spec = ops.get(op)
    contract = contract_of(spec)
    assert contract is not None
    axes = {a.name: set(a.values) for a in spec.axes}
    for e in (*contract.inputs, *contract.outputs, *contract.params):
        for cond in (e.when, e.unless):
            for axis, values in cond.items():
                assert axis in axes, f"{op}: {e.name} names axis {axis!r}, which the op does not have"
                assert set(values) <= axes[axis], f"{op}: {e.name}: {axis} has no {set(values) - axes[axis]}"


def test_the_reference_states_what_the_source_alone_said() -> None:
    """The reduce op's scaling factor and the experts op's input semantics are in the generated reference."""
    reduce_doc = conventions_command.render("reduce")
    assert "| `routed_scaling_factor` | float | every cell |" in reduce_doc
    experts_doc = conventions_command.render("experts")
    for words in ("| `topk_weights` | [M, k] | float32 |", "h = x @ w13[e].T", "routed scaling factor",
                  "the kernel writes"):
        assert words in experts_doc, words
