"""`python -m harness conventions [--op OP]`: what an adapter author needs to know, generated from the code.

Per op: its description (the op module's docstring), its declared contract (`harness.ops.contracts`: inputs, case
parameters, outputs and what the kernel writes), every convention key with its values, default and users
(`harness.core.conventions`), every limit key with its meaning and defaults (`harness.core.limits`), its feature
axes, and the inputs and outputs of real cases (names, shapes, dtypes,
strides, built by the op's own input builder); then the adapter fields and the interpreter's feature names.
`docs/CONVENTIONS.md` is this output (`--out docs/CONVENTIONS.md`); a test fails when it is stale.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from typing import Any

from harness.commands import emit
from harness.core.layouts import LAYOUTS

DEFAULT_OUT = "docs/CONVENTIONS.md"
#: the ops documented, in this order (each must have a spec: `harness.ops.available()`)
OP_ORDER = ("routing", "grouped_routing", "align", "activation", "reduce", "group_quant", "act_quant", "experts")


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _conventions_table(op: str) -> list[str]:
    from harness.core import conventions as conv

    entries = conv.BY_OP.get(op, ())
    if not entries:
        return ["No conventions: the oracle's answer is fully determined by the cell and the inputs.", ""]
    lines = ["| key | kind | default | meaning | values |", "|---|---|---|---|---|"]
    for c in entries:
        if c.kind == "choice":
            values = "<br>".join(f"`{v}`" + (f": {_cell(m)}" if m else "") for v, m in c.values.items())
        elif c.kind == "recipe":
            values = "fields: " + ", ".join(f"`{f}`" for f in c.fields)
        else:
            values = c.kind
        default = "-" if c.default is None else f"`{c.default}`"
        lines.append(f"| `{c.key}` | {c.kind} | {default} | {_cell(c.meaning)} | {values} |")
    return [*lines, ""]


def _limits_table(op: str) -> list[str]:
    """Every limit key of `op` (`harness.core.limits`, the table the registry validates against)."""
    from harness.core import limits

    known = limits.keys(op)
    if not known:
        return ["No limits.", ""]
    lines = ["`limits={...}` keys; any other key, or a value of another type, is an error when the adapter is made.",
             "", "| key | kind | default (small / large scale) | meaning |", "|---|---|---|---|"]
    for k in known.values():
        default = "-" if k.default is None else " / ".join(f"`{_plain(v)}`" for v in k.default)
        lines.append(f"| `{k.key}` | {k.kind} | {default} | {_cell(k.meaning)} |")
    return [*lines, ""]


def _plain(value: Any) -> str:
    return ", ".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _recipe_fields() -> list[str]:
    from harness.core import conventions as conv

    lines = ["Recipe fields (the `recipe` conventions: `quant`, `act_quant`, `weight_quant`):", "",
             "| field | default | meaning | values |", "|---|---|---|---|"]
    for c in conv.RECIPE_FIELDS.values():
        values = ("<br>".join(f"`{v}`" + (f": {_cell(m)}" if m else "") for v, m in c.values.items())
                  if c.kind == "choice" else c.kind)
        default = "-" if c.default is None else f"`{c.default}`"
        lines.append(f"| `{c.key}` | {default} | {_cell(c.meaning)} | {values} |")
    return [*lines, ""]


def _example_cells(op: str) -> list[dict[str, str]]:
    from harness import ops

    spec = ops.get(op)
    cells = spec.all_cells()
    if op != "experts":
        return cells[:1]
    # experts: the unquantized cell and one per (quant type, format), whose scale layouts differ
    shown: dict[str, dict[str, str]] = {}
    for c in cells:
        key = (c.get("quant_type", "none"), c.get("quant_format", "-"))
        if key not in shown and c.get("format") == "standard" and c.get("bias", "N") == "N":
            shown[key] = c
    return list(shown.values())


def _tensor_rows(tensors: dict[str, Any]) -> list[str]:
    rows = []
    for name, t in tensors.items():
        shape = getattr(t, "shape", None)
        if shape is None:
            continue
        stride = t.stride() if callable(getattr(t, "stride", None)) else getattr(t, "stride", None)
        rows.append(f"| `{name}` | {list(shape)} | {str(t.dtype).removeprefix('torch.')} | {list(stride or [])} |")
    return rows


def _io_table(op: str) -> list[str]:
    """Inputs and outputs of example cases, built by the op's own code (so they cannot drift)."""
    from harness import ops, registry
    from harness.core.case import Case

    spec = ops.get(op)
    adapter = next((a for a in registry.all_adapters(op) if a.source == "reference"), None)
    if adapter is None:
        return []
    lines = []
    for cell in _example_cells(op):
        bounds = spec.boundary(adapter, cell)
        sized = [b for b in bounds if all(v > 0 for v in b.get("shapes", {}).values())] or bounds
        if not sized:
            continue
        case = Case(op=op, adapter=adapter.name, features=cell, seed=0, **sized[0])
        inputs = spec.make_inputs(case, "cpu")
        outs = spec.outputs(case, inputs)
        shapes = ", ".join(f"{k}={v}" for k, v in sorted(case.shapes.items()))
        lines += [f"Cell `{', '.join(f'{k}={v}' for k, v in cell.items())}`, shapes {shapes}:", "",
                  "| tensor | shape | dtype | strides |", "|---|---|---|---|",
                  *_tensor_rows(dict(inputs)),
                  *(r.replace("| `", "| out `", 1) for r in _tensor_rows(
                      {k: _Spec(o) for k, o in outs.items()})), ""]
    return lines


class _Spec:
    """An OutputSpec read like a tensor (shape, dtype, stride) for the tables."""

    def __init__(self, spec: Any) -> None:
        from harness.core.layouts import contiguous_strides as _contiguous

        self.shape, self.dtype = spec.shape, spec.dtype
        self.stride = spec.stride if spec.stride is not None else _contiguous(tuple(spec.shape))


def _contract(op: str) -> list[str]:
    """The op's declared contract (harness.ops.contracts): inputs, case parameters, outputs, what the kernel writes."""
    from harness import ops
    from harness.ops.contracts import contract_of, describe_cells

    spec = ops.get(op)
    c = contract_of(spec)
    if c is None:
        return ["No contract declared yet: see the op's description above.", ""]

    def present(e: Any) -> str:
        return _cell(describe_cells(e.when, e.unless, spec.axes))

    lines = ["Shape letters: " + "; ".join(f"`{k}` {_cell(v)}" for k, v in c.symbols.items()) + ".", "",
             "Inputs (`inputs[name]` in `run`):", "", "| input | shape | dtype | present in | holds |",
             "|---|---|---|---|---|",
             *(f"| `{t.name}` | {_cell(t.shape)} | {_cell(t.dtype)} | {present(t)} | {_holds(t)} |"
               for t in c.inputs), ""]
    if c.params:
        lines += ["Case parameters (`case.params[name]`):", "", "| param | kind | present in | meaning |",
                  "|---|---|---|---|",
                  *(f"| `{p.name}` | {p.kind} | {present(p)} | {_cell(p.meaning)} |" for p in c.params), ""]
    else:
        lines += ["Case parameters: none.", ""]
    lines += ["Outputs (`outputs[name]`, pre-allocated; the kernel writes them or returns tensors that replace "
              "them):", "", "| output | shape | dtype | present in | holds | the kernel writes |",
              "|---|---|---|---|---|---|",
              *(f"| `{t.name}` | {_cell(t.shape)} | {_cell(t.dtype)} | {present(t)} | {_holds(t)} | "
                f"{_cell(t.written)} |" for t in c.outputs), ""]
    if c.notes:
        lines += [*(f"- {n}" for n in c.notes), ""]
    if any(t.any_strides for t in (*c.inputs, *c.outputs)):
        lines += [_ANY_STRIDES, ""]
    return lines


#: what "any strides" in a contract table means
_ANY_STRIDES = ("*Any strides*: the tensor may come in any memory layout; the draws take each of "
                + ", ".join(f"`{k}` ({v})" for k, v in LAYOUTS.items())
                + ", recorded in `case.layout[name]`. A strided output is judged on its view; a write into the gaps "
                "of its buffer fails the case. An adapter whose kernel needs fewer declares the `layouts` limit.")


def _holds(t: Any) -> str:
    return _cell(t.meaning + (". *Any strides*" if t.any_strides else ""))


def _module_doc(op: str) -> str:
    from harness import ops

    return inspect.getdoc(importlib.import_module(ops._MODULES[op])) or ""


def _adapter_fields() -> list[str]:
    from harness.registry import Adapter

    doc = inspect.getdoc(Adapter) or ""
    return ["## Adapter fields", "", "From `harness.registry.Adapter`:", "", "```text", doc, "```", ""]


#: how the runner tells the interpreter's own exceptions from the kernel's (harness.engine.interpreter_faults)
_FAULTS = ("An exception Triton's interpreter raises itself while a kernel runs (below Triton's `InterpreterError` "
           "wrappers, raised in `triton/runtime/interpreter.py` or the fidelity layer: a load mask that is not "
           "boolean, inline PTX, a libdevice function it cannot emulate) is reported not-verifiable on `interp` with "
           "its message. "
           "The kernel's own stay its error: an out-of-bounds access (the fidelity layer's `OutOfBoundsAccess`), a "
           "failed `tl.device_assert` / `tl.assume` / `tl.static_assert`, a misaligned tensor descriptor, a reduction "
           "over a missing axis, an exception of Triton's frontend, of the kernel's launch or of its adapter; on a GPU "
           "every exception is the kernel's.")


def _interpreter_features() -> list[str]:
    from harness.engine.interpreter import _fixable_issues

    lines = ["## Interpreter feature names", "",
             "An adapter's `interp_features(cell)` names the features its kernel depends on; on the CPU interpreter "
             "a cell depending on one that could not be made faithful is reported not-verifiable.", "",
             _FAULTS, "",
             "| issue | feature names | fixed here | exact | what |", "|---|---|---|---|---|"]
    for issue in _fixable_issues():
        names = ", ".join(f"`{n}`" for n in sorted(issue.features))
        if len(issue.features) > 6:
            names = f"`{sorted(issue.features)[0].split('_')[0]}_<function>` ({len(issue.features)} names)"
        fixed = "n/a (not a bug)" if not issue.present else ("yes" if issue.fixable else "no")
        lines.append(f"| {issue.name} | {names} | {fixed} | {'yes' if issue.exact else 'no'} | "
                     f"{_cell(issue.description)} |")
    return [*lines, ""]


def render(only: str | None = None) -> str:
    """The conventions reference (markdown); `only`: one op."""
    from harness import ops

    known = [op for op in OP_ORDER if op in ops.available()]
    if only is not None and only not in known:
        raise ValueError(f"--op must be one of {', '.join(known)}, got {only!r}")
    lines = ["# Conventions reference", "",
             "Generated by `python -m harness conventions --out docs/CONVENTIONS.md` from the code: the convention "
             "schema (`harness/core/conventions.py`), the limits table (`harness/core/limits.py`), the op specs "
             "(`harness/ops/`) and the interpreter "
             "(`harness/engine/interpreter.py`). An unknown key or value is an error when the adapter is made.", ""]
    for op in [only] if only else known:
        spec = ops.get(op)
        lines += [f"## `{op}`: {spec.title}", "", _module_doc(op), "",
                  "Feature axes: " + "; ".join(f"`{a.name}` ({', '.join(a.values)})" for a in spec.axes) + ".", "",
                  "### Contract", "", *_contract(op),
                  "### Conventions", "", *_conventions_table(op),
                  "### Limits", "", *_limits_table(op),
                  "### Inputs and outputs", "", *_io_table(op)]
    if not only:
        lines += _recipe_fields() + _adapter_fields() + _interpreter_features()
    return "\n".join(lines).rstrip() + "\n"


def run(args: argparse.Namespace) -> int:
    from harness.core.device import prepare_interpreter

    prepare_interpreter("cpu")
    try:
        text = render(args.op)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    emit(text, args.out)
    return 0


def add_parser(sub: Any) -> None:
    c = sub.add_parser("conventions", help="every convention key, value and input layout per op (markdown)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--op", default=None, help="only this op")
    c.add_argument("--out", default=None, help=f"write to this file (the committed one is {DEFAULT_OUT})")
    c.set_defaults(func=run)
