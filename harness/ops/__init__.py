"""Op specifications: for each op, its feature axes, inputs, outputs, oracle call and comparisons.

An `OpSpec` is what makes "a new kernel is one adapter" true: everything op-specific (how to build inputs for a
case, what the oracle expects, which comparison mode judges each output) lives here, once per op.
"""

from __future__ import annotations

import importlib

from harness.ops.base import Axis, Check, OpSpec

_MODULES = {
    "routing": "harness.ops.routing",
    "grouped_routing": "harness.ops.routing",
    "align": "harness.ops.align",
    "activation": "harness.ops.activation",
    "reduce": "harness.ops.reduce",
    "experts": "harness.ops.experts",
    "group_quant": "harness.ops.group_quant",
    "act_quant": "harness.ops.act_quant",
    "permute": "harness.ops.permute",
}


def get(op: str) -> OpSpec:
    """The spec of `op` (ValueError when the op has no spec yet)."""
    if op not in _MODULES:
        raise ValueError(f"no op spec for {op!r}")
    try:
        module = importlib.import_module(_MODULES[op])
    except ModuleNotFoundError as e:
        raise ValueError(f"op {op!r} has no spec yet ({e})") from None
    return module.SPECS[op]


def available() -> list[str]:
    ops = []
    for op in _MODULES:
        try:
            get(op)
            ops.append(op)
        except ValueError:
            pass
    return ops


__all__ = ["Axis", "Check", "OpSpec", "available", "get"]
