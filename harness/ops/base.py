"""The OpSpec interface and the `Check` record an op's oracle produces for each output."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from harness.core.compare import Comparison

if TYPE_CHECKING:
    from hypothesis.strategies import DrawFn

    from harness.core.case import Case
    from harness.registry import Adapter


@dataclass(frozen=True)
class Axis:
    """A feature axis of an op (a column of its matrix table) and every value it can take."""

    name: str
    title: str
    values: tuple[str, ...]


@dataclass
class Check:
    """How one output is judged.

    mode: "exact" | "set" | "codes" | "bounded" | "custom". For "custom", `judge(actual) -> Comparison` decides
    (used for contracts that are not a single expected tensor, e.g. "any valid top-k set under ties"); it is
    called as judge(actual, all_outputs) so one output can be judged given another (weights given chosen ids).
    mask: elements that are part of the contract (None: all). Elements outside it are neither compared nor required
    to be written.
    untouched: elements the kernel must leave as they were (rows past a batched count, where the adapter declares
    it never writes them): the runner requires its poison there after the run.
    """

    name: str
    mode: str
    expected: torch.Tensor | None = None
    bound: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    untouched: torch.Tensor | None = None
    k: int = 1
    step_of: Callable[[torch.Tensor], torch.Tensor] | None = None
    judge: Callable[[torch.Tensor, Mapping[str, torch.Tensor]], Comparison] | None = None
    #: a check judged a chunk of rows at a time (`harness.engine.chunked`): the checks of the chunks it judges (its
    #: own `expected` is None where only some rows are judged), for what the case exercised
    parts: tuple[Check, ...] = ()


@dataclass(frozen=True)
class OutputSpec:
    """A pre-allocated output: shape, dtype and (contractual) strides."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    stride: tuple[int, ...] | None = None  # None: contiguous


@dataclass(frozen=True)
class ValueClass:
    """A kind of input values a bug can hide behind (all-zero groups, per-expert counts at block multiples, the
    first and last local expert, non-finite rows...): drawn by the op's strategy, and judged once per family in
    every run (harness.engine.strategies.value_class_cases).

    applies(adapter, cell): whether the cell can hold it. family: the axes whose values each get a case of their own
    (the code path the values reach differs between them). fields(adapter, cell): the case fields that hold it.
    present(case, inputs): whether a case's inputs hold it (the coverage test asks the tensors, not the names).
    sized: the class is a size as much as values (384 experts, rows past 8k columns): its case is not taken again
    at another size past a threshold (`strategies.threshold_cases`), which would multiply the two.
    profiles: the hypothesis profiles that judge it (None: every one; `harness.ops.large.classes`).
    reads_inputs: False where `present` reads the case's shapes only (its inputs are too large for the CPU).
    """

    name: str
    applies: Callable[[Adapter, Mapping[str, str]], bool]
    family: tuple[str, ...]
    fields: Callable[[Adapter, Mapping[str, str]], dict[str, Any]]
    present: Callable[[Case, Mapping[str, torch.Tensor]], bool]
    sized: bool = False
    profiles: tuple[str, ...] | None = None
    reads_inputs: bool = True


@dataclass
class OpSpec:
    """Everything op-specific the runner, the strategies and the matrix need."""

    name: str
    title: str
    axes: tuple[Axis, ...]
    #: build the inputs of a case on a device (deterministic from case.seed)
    make_inputs: Callable[[Case, str], dict[str, torch.Tensor]]
    #: the outputs the kernel writes (destination-passing)
    outputs: Callable[[Case, Mapping[str, torch.Tensor]], dict[str, OutputSpec]]
    #: the oracle: one Check per output
    expected: Callable[[Case, Mapping[str, torch.Tensor], Mapping[str, Any]], list[Check]]
    #: hypothesis: draw shapes/params for a cell within an adapter's limits -> Case fields
    draw: Callable[[DrawFn, Adapter, Mapping[str, str]], dict[str, Any]]
    #: deterministic boundary cases of a cell (for the matrix sweep) -> list of Case-field dicts
    boundary: Callable[[Adapter, Mapping[str, str]], list[dict[str, Any]]]
    #: rows of the token dimension, to check batch invariance: (inputs, rows) -> sub-inputs, output row slicer
    token_subset: (
        Callable[[Case, Mapping[str, torch.Tensor], slice], tuple[Case, dict[str, torch.Tensor]]] | None
    ) = None
    #: which output tensors hold one row per token (batch-invariance compares those rows)
    token_outputs: tuple[str, ...] = ()
    #: combinations of axis values that are not a cell at all (e.g. quant_type=none with quant_format=T): a reason
    #: string for those, None for real cells. Not-applicable combinations are never swept, declared or rendered.
    inapplicable: Callable[[Mapping[str, str]], str | None] | None = None
    notes: dict[str, str] = field(default_factory=dict)
    #: the value classes of its inputs that every run judges (one case per family among the declared cells)
    value_classes: tuple[ValueClass, ...] = ()
    #: about how many elements a case's inputs hold, known before they are built (None: the product of its shape
    #: sizes, an upper bound for ops whose largest input spans every dimension)
    input_elements: Callable[[Case], int] | None = None
    #: the oracle's intermediate values of a case under conventions, by name (GEMM1 output per slot, ...), for a
    #: reader (`python -m harness explain` saves them); None: the expected outputs are all there is
    stages: Callable[[Case, Mapping[str, torch.Tensor], Mapping[str, Any]], dict[str, torch.Tensor]] | None = None
    #: the inputs the value classes' `present` read, where they are cheaper to build than all of them (the
    #: coverage report asks every planned case); None: `make_inputs`
    class_inputs: Callable[[Case, str], dict[str, torch.Tensor]] | None = None
    #: why a case's sizes cannot be built (k past E, ...), None when they can: a fixed case moved to another size
    #: (a threshold) is checked with it before it is planned; None: every combination of sizes is a case
    invalid: Callable[[Case], str | None] | None = None
    #: `all_cells`' memo: (its key, the cells)
    _cells: Any = field(default=None, init=False, repr=False, compare=False)

    def estimated_input_elements(self, case: Case) -> int:
        if self.input_elements is not None:
            return self.input_elements(case)
        return math.prod(max(1, int(v)) for v in case.shapes.values())

    def axis_names(self) -> list[str]:
        return [a.name for a in self.axes]

    def all_cells(self) -> list[dict[str, str]]:
        """Every applicable cell, in product order (copies: made once per axes and rule, asked three times per
        adapter by a plan, and the experts op has thousands)."""
        from itertools import product

        key = (tuple((a.name, tuple(a.values)) for a in self.axes), self.inapplicable)
        if self._cells is None or self._cells[0] != key:
            names = self.axis_names()
            cells = [dict(zip(names, combo)) for combo in product(*(a.values for a in self.axes))]
            self._cells = (key, [c for c in cells if self.inapplicable is None or self.inapplicable(c) is None])
        return [dict(c) for c in self._cells[1]]
