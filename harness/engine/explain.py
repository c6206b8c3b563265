"""Which declarations would make a failing case pass (`python -m harness explain`).

The kernel runs once (`runner.run_once`); its outputs are then judged again, through the comparisons of a normal
verdict, under alternative conventions: every other value of each convention key of the op (choice keys: each other
value; bool: the other; recipe keys: each field's alternatives, one field at a time; number keys: the key's default
and the few values of NUMBER_TRIES), merged over the adapter's own conventions for the case, one change at a time;
then pairs of the changes that reduced the error. The keys come from `harness.core.conventions`, so a key added
there is tried without a change here.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.core import conventions as conv
from harness.core.compare import Comparison
from harness.engine.runner import OneRun, summarize

#: number keys: values worth trying besides the key's default (guards and tolerances libraries differ in)
NUMBER_TRIES: dict[str, tuple[float, ...]] = {"eps": (1e-10, 1e-12, 1e-6, 1e-4), "scale_ulps": (0, 1, 2)}
#: keys never tried, and why
NOT_TRIED = {"weight_quant": "it shapes the inputs (the harness quantizes the weights it gives the kernel), so "
             "the kernel would have to run again"}
#: pairs are formed among this many of the best single changes that reduced the error
MAX_PAIRED = 6
#: metrics of a failed check that count wrong elements or rows
_COUNTS = ("mismatches", "bad_rows", "mismatched_rows", "unwritten", "touched", "nonfinite", "out_of_bounds")
#: tie-break between equally good changes: a choice of computation before a number (a tolerance, a guard)
_KIND_RANK = {"choice": 0, "bool": 0, "recipe": 0, "number": 1, "int": 1}


@dataclass(frozen=True)
class Change:
    """One convention set to `value`; for a recipe key, one of its fields (`field`)."""

    key: str
    value: Any
    field: str | None = None
    kind: str = "choice"
    was: Any = None  # the value it replaces (None: undeclared)

    @property
    def label(self) -> str:
        return f"{self.key}.{self.field}" if self.field else self.key

    def describe(self) -> str:
        was = "undeclared" if self.was is None else f"declared {_show(self.was)}"
        return f"{self.label}={_show(self.value)} ({was})"


def _show(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def recipe_base(key: str, conventions: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """A recipe convention as the oracle reads it: the case's copy (recipes that shape the inputs travel in the
    case's params), then the adapter's."""
    base = dict(params.get(key) or {}) if isinstance(params.get(key), Mapping) else {}
    return {**base, **dict(conventions.get(key) or {})}


def apply(changes: tuple[Change, ...], conventions: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """`conventions` with `changes` merged over them."""
    merged = dict(conventions)
    for c in changes:
        if c.field is None:
            merged[c.key] = c.value
        else:
            merged[c.key] = {**recipe_base(c.key, merged, params), c.field: c.value}
    return merged


def _values(c: conv.Convention, current: Any) -> list[Any]:
    """The values of `c` other than `current` worth judging."""
    if c.kind == "choice":
        return [v for v in c.values if v != current]
    if c.kind == "bool":
        return [not bool(current if current is not None else c.default)]
    if c.kind in ("number", "int"):
        tries = [c.default, *NUMBER_TRIES.get(c.key, ())]
        return [v for v in dict.fromkeys(tries) if v is not None and v != current]
    return []


def single_changes(op: str, conventions: Mapping[str, Any], params: Mapping[str, Any]) -> list[Change]:
    """Every single change of a convention of `op` (a recipe's fields one at a time), in the schema's order."""
    found = []
    for c in conv.BY_OP.get(op, ()):
        if c.key in NOT_TRIED:
            continue
        if c.kind != "recipe":
            current = conventions.get(c.key, c.default)
            found += [Change(c.key, v, None, c.kind, conventions.get(c.key)) for v in _values(c, current)]
            continue
        base = recipe_base(c.key, conventions, params)
        for name in c.fields:
            f = conv.RECIPE_FIELDS[name]
            current = base.get(name, f.default)
            found += [Change(c.key, v, name, f.kind, base.get(name)) for v in _values(f, current)]
    return found


@dataclass
class Judged:
    """The kernel's outputs judged under the declared conventions with `changes` merged over them."""

    changes: tuple[Change, ...]
    passed: bool
    reason: str = ""
    margin: float | None = None
    mismatches: int = 0
    failed: list[str] = field(default_factory=list)
    error: str = ""  # the oracle could not be built under these conventions
    order: int = 0
    max_error: float | None = None  # |kernel - oracle| at worst (bounded checks)
    exact: int = 0  # checks judged bitwise (a judge that accepts either neighbour of a code is looser)

    def score(self) -> tuple[Any, ...]:
        """Smaller is better: pass first, then the margin (error / bound), then the wrong elements."""
        margin = self.margin if self.margin is not None and not math.isnan(self.margin) else 0.0
        return (not self.passed, margin, self.mismatches, len(self.failed))

    def rank_key(self) -> tuple[Any, ...]:
        """Those that pass first: one change before two, then the closest to the kernel's outputs (the smallest
        error: a change that only widens the bound, e.g. a looser matmul precision, leaves the error as it was),
        then the most checks judged bitwise (a looser judge accepts more), then the margin. Those that fail by
        margin. Ties: a choice of computation before a number, then the schema's order."""
        kinds = max((_KIND_RANK.get(c.kind, 1) for c in self.changes), default=0)
        error = self.max_error if self.max_error is not None and not math.isnan(self.max_error) else 0.0
        _, margin, wrong, failed = self.score()
        if self.passed:
            return (False, len(self.changes), error, -self.exact, margin, kinds, self.order)
        return (True, margin, wrong, failed, error, len(self.changes), kinds, self.order)

    def describe(self) -> str:
        return ", ".join(c.describe() for c in self.changes) or "the declared conventions"

    def to_dict(self) -> dict[str, Any]:
        return {"changes": {c.label: c.value for c in self.changes}, "passed": self.passed, "margin": self.margin,
                "mismatches": self.mismatches, "failed_checks": list(self.failed), "reason": self.reason}


def verdict_of(checks: list[Comparison], changes: tuple[Change, ...] = (), order: int = 0) -> Judged:
    reason, metrics = summarize(checks)
    counted = sum(int(c.metrics.get(k) or 0) for c in checks if not c.passed for k in _COUNTS)
    return Judged(changes, not reason, reason, metrics.get("margin"), counted, metrics.get("failed_checks", []),
                  order=order, max_error=metrics.get("max_error"), exact=sum(c.mode == "exact" for c in checks))


@dataclass
class Exploration:
    """What `explore` found: the declared verdict, every judged alternative, what was not tried."""

    declared: Judged
    singles: list[Judged]
    pairs: list[Judged]
    not_tried: dict[str, str]
    seconds: float = 0.0

    def improvements(self) -> list[Judged]:
        """Alternatives that reduced the error, best first: those that pass (one change before two), then by
        margin and wrong elements."""
        base = self.declared.score()
        better = [j for j in (*self.singles, *self.pairs) if not j.error and j.score() < base]
        return sorted(better, key=Judged.rank_key)

    def no_effect(self) -> list[str]:
        """Convention keys (or recipe fields) none of whose alternatives changed the verdict's score."""
        base = self.declared.score()
        moved = {c.label for j in self.singles if not j.error and j.score() != base for c in j.changes}
        return list(dict.fromkeys(c.label for j in self.singles for c in j.changes if c.label not in moved))


Progress = Callable[[int, int], None]


def _judge(one: OneRun, changes: tuple[Change, ...], order: int) -> Judged:
    merged = apply(changes, one.conventions, one.case.params)
    try:
        conv.validate(one.case.op, merged, "explain")
        checks, _ = one.judge(merged)
    except Exception as e:  # these conventions do not apply to the case (the oracle refuses them)
        return Judged(changes, False, error=f"{type(e).__name__}: {e}", order=order)
    return verdict_of(checks, changes, order)


def _pairs(singles: list[Judged], base: tuple[Any, ...]) -> Iterator[tuple[Change, ...]]:
    best = sorted((j for j in singles if not j.error and j.score() < base), key=Judged.rank_key)[:MAX_PAIRED]
    for a, b in itertools.combinations(best, 2):
        if a.changes[0].label != b.changes[0].label:
            yield (a.changes[0], b.changes[0])


def explore(one: OneRun, progress: Progress | None = None) -> Exploration:
    """Judge the outputs of `one` under every single change, then pairs of those that reduced the error."""
    t0 = time.perf_counter()
    assert one.outputs is not None, "the kernel gave no outputs to judge"
    declared = verdict_of(one.judge(one.conventions)[0])
    changes = single_changes(one.case.op, one.conventions, one.case.params)
    singles = []
    for i, c in enumerate(changes):
        singles.append(_judge(one, (c,), i))
        if progress:
            progress(i + 1, len(changes))
    pairs = []
    todo = list(_pairs(singles, declared.score()))
    for i, pair in enumerate(todo):
        pairs.append(_judge(one, pair, len(changes) + i))
        if progress:
            progress(len(changes) + i + 1, len(changes) + len(todo))
    not_tried = {c.key: NOT_TRIED[c.key] for c in conv.BY_OP.get(one.case.op, ()) if c.key in NOT_TRIED}
    return Exploration(declared, singles, pairs, not_tried, time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------------------- the file


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().clone()


def _checks_tensors(prefix: str, expected: Mapping[str, Any], omitted: dict[str, str]) -> dict[str, torch.Tensor]:
    found = {}
    for name, chk in expected.items():
        for part in ("expected", "bound", "mask"):
            t = getattr(chk, part)
            if isinstance(t, torch.Tensor):
                found[f"{prefix}{part}.{name}"] = _cpu(t)
        if chk.expected is None:
            omitted[f"{prefix}expected.{name}"] = (f"the oracle judges {name} by a rule ({chk.mode}), not against one "
                                                   "tensor (e.g. codes against the kernel's own scales)")
    return found


def tensors(one: OneRun, best: Judged | None = None) -> dict[str, Any]:
    """What `explain` saves for `torch.load`: inputs, the kernel's outputs, the oracle's expected values, bounds
    and masks under the declared conventions (and under the best alternative: `best.expected.*`), the oracle's
    intermediate stages where its op has them, and `meta` (what was omitted and why)."""
    omitted: dict[str, str] = {}
    found: dict[str, Any] = {f"input.{k}": _cpu(v) for k, v in (one.inputs or {}).items()
                             if isinstance(v, torch.Tensor)}
    found.update({f"output.{k}": _cpu(v) for k, v in (one.outputs or {}).items() if isinstance(v, torch.Tensor)})
    if one.outputs is None:
        omitted["output.*"] = "the kernel gave no outputs (see meta.reason)"
    found.update(_checks_tensors("", one.expected or {}, omitted))
    if best is not None and one.outputs is not None:
        _, expected = one.judge(apply(best.changes, one.conventions, one.case.params))
        found.update(_checks_tensors("best.", expected, omitted))
    spec = one.spec
    if spec is not None and spec.stages is not None and one.inputs is not None:
        stages = spec.stages(one.case, one.inputs, one.conventions)
        found.update({f"stage.{k}": _cpu(v) for k, v in stages.items()})
        if not stages:
            omitted["stage.*"] = f"the {one.case.op} oracle has no intermediate stages for this case's format"
    elif spec is not None:
        omitted["stage.*"] = f"the {one.case.op} oracle has no intermediate stages (its expected outputs are all)"
    found["meta"] = {"omitted": omitted}
    return found
