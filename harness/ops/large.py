"""The large-offsets value class: one case per op whose largest flat offset in one tensor passes 2**31 elements.

A kernel that computes an offset in int32 (`pid * stride` without a cast to int64) is right at every smaller size
and reads or writes out of bounds past it. Such a case holds gigabytes, so only the GPU profiles judge it
(`PROFILES`, `classes`; never `ci` or a CPU run), one per op, at the cheapest shape that passes: one dim of a
small boundary case of the cell grown (`grow`) until the tensor `Large.tensor` holds more than 2**31 elements, so its
last element's offset is at least 2**31. Its presence is read from the case's shapes (`Large.offset`), never from its
inputs (which the CPU cannot build). An adapter that declares a `max_<dim>` on the grown dim does not get it.

align has none: its output `sorted_token_ids` is int32 and holds flat slot ids up to M*k, so a case past 2**31
slots cannot be expressed in its contract.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.ops.base import OpSpec, ValueClass

#: the first flat offset an int32 cannot hold
LARGE_OFFSET = 1 << 31
#: the profiles that judge it (GPU runs only). Not `gpu` yet: on an H200 one such case took 39 to 58 s in a kernel
#: host (32 s in process), mostly copies through the CPU, and each of some 25 adapters would get one in the GPU
#: suite (docs/PERFORMANCE.md)
PROFILES = ("thorough",)
#: the class's name, in every op
NAME = "large_offsets"
#: ops that cannot have it, and why
NOT_EXPRESSIBLE = {"align": "its output sorted_token_ids is int32 and holds flat slot ids up to M*k: past 2**31 "
                            "slots the contract itself cannot express the result"}


@dataclass(frozen=True)
class Large:
    """How one op passes 2**31: `dim` grows; `per_unit(fields)` elements of `tensor` per unit of `dim` (the rest
    of its shape; `fields`: a case's features, shapes and params), so the tensor holds `shapes[dim] * per_unit`."""

    dim: str
    tensor: str
    per_unit: Callable[[Mapping[str, Any]], int]
    #: params the grown case is drawn with (a value pattern built on the CPU from many full-size intermediates
    #: would cost more than the case; plain random values are drawn on the device)
    params: Mapping[str, Any] = field(default_factory=dict)
    #: the routing pattern the grown case is drawn with, where its inputs follow one (`random`: drawn on the
    #: device; the others draw row by row on the CPU: 20 s for a routing case's 2**31 logits on an H200)
    routing: str | None = None

    def elements(self, fields: Mapping[str, Any]) -> int:
        return int(fields["shapes"][self.dim]) * self.per_unit(fields)

    def offset(self, fields: Mapping[str, Any]) -> int:
        """The largest flat offset into `tensor` (its last element's)."""
        return self.elements(fields) - 1

    def size_past(self, fields: Mapping[str, Any], multiple: int = 1) -> int:
        """The fewest units of `dim` (a multiple of `multiple`) that put the last offset at 2**31 or past it."""
        units = LARGE_OFFSET // self.per_unit(fields) + 1
        return -(-units // multiple) * multiple


def _s(fields: Mapping[str, Any], dim: str) -> int:
    return int(fields["shapes"][dim])


def _w13_per_n(fields: Mapping[str, Any]) -> int:
    """Elements of w13 [local experts, 2N or N, K] per unit of N (2N rows for a gated activation)."""
    from harness.ops.experts_quant import ACTIVATIONS
    from reference.activations import is_gated

    local = int(fields.get("params", {}).get("local_experts", _s(fields, "E")))
    act = fields.get("features", {}).get("activation")
    return local * (2 if act is None or is_gated(ACTIVATIONS[act]) else 1) * _s(fields, "K")


#: op -> how its case passes 2**31 (the tensor named is the one whose offsets pass)
LARGE: dict[str, Large] = {
    "routing": Large("M", "router_logits [M, E]", lambda f: _s(f, "E"), routing="random"),
    "grouped_routing": Large("M", "router_logits [M, E]", lambda f: _s(f, "E"), routing="random"),
    "activation": Large("T", "x [T, 2N]", lambda f: 2 * _s(f, "N")),
    "act_quant": Large("T", "x [T, 2N]", lambda f: 2 * _s(f, "N")),
    "group_quant": Large("M", "x [M, K]", lambda f: _s(f, "K"), {"pattern": "random"}),
    "reduce": Large("M", "expert_out [M, k, K]", lambda f: _s(f, "k") * _s(f, "K"), routing="random"),
    # the weights, with E and K of a small case and N grown (each expert's slice stays under 2**31, the expert
    # offset passes it); a case past 2**31 token slots would hold the tokens and intermediates as well
    "experts": Large("N", "w13 [local experts, 2N, K]", _w13_per_n),
}


def grow(op: str, adapter: Any, fields: Mapping[str, Any]) -> dict[str, Any]:
    """`fields` (a small case of the cell) with the op's dim grown past 2**31 in its tensor (a multiple of the
    adapter's `<dim>_multiple` and of the dim's old size where it grows N, whose divisibility the cell's groups
    need)."""
    how = LARGE[op]
    shapes = dict(fields["shapes"])
    multiple = int(adapter.limits.get(f"{how.dim}_multiple", 1))
    if how.dim == "N":
        multiple = multiple * int(shapes["N"])
    shapes[how.dim] = how.size_past(fields, multiple)
    params = {**fields.get("params", {}), **how.params}
    grown = {**{k: v for k, v in fields.items() if k != "features"}, "shapes": shapes, "params": params}
    if how.routing is not None:
        grown["routing"] = how.routing
    return grown


def _first_boundary(op: str, adapter: Any, cell: Mapping[str, str]) -> dict[str, Any]:
    from harness import ops

    found = [b for b in ops.get(op).boundary(adapter, cell) if _base(op, b)]
    if not found:
        raise ValueError(f"{op} has no boundary case with tokens to grow in {dict(cell)}")
    return found[0]


def _base(op: str, fields: Mapping[str, Any]) -> bool:
    """A case to grow: tokens and a local expert, no per-expert counts (they fix the token count), contiguous."""
    shapes, params = fields["shapes"], fields.get("params", {})
    return (all(int(shapes.get(t, 1)) > 0 for t in ("M", "T", "max_tokens")) and params.get("local_experts", 1) != 0
            and "counts" not in params and LARGE[op].dim in shapes and not fields.get("layout"))


def base_case(op: str, fields: Mapping[str, Any]) -> bool:
    """Whether a (fitted) boundary case of the op can be grown (`grow`)."""
    return _base(op, fields)


def large_class(op: str) -> ValueClass:
    """The op's large-offsets class (only the `PROFILES` runs judge it: `classes`)."""
    how = LARGE[op]
    return ValueClass(
        NAME, lambda a, c: a.limits.get(f"max_{how.dim}") is None, (),
        lambda a, c: grow(op, a, {"features": dict(c), **_first_boundary(op, a, c)}),
        lambda case, inputs: how.offset(fields_of(case)) >= LARGE_OFFSET,
        sized=True, profiles=PROFILES, reads_inputs=False)


def fields_of(case: Any) -> dict[str, Any]:
    """A case's features, shapes and params, as `Large` reads them."""
    return {"features": dict(case.features), "shapes": dict(case.shapes), "params": dict(case.params)}


def classes(spec: OpSpec, profile: str | None = None) -> tuple[ValueClass, ...]:
    """The value classes a run under `profile` judges: the op's `value_classes` (every run's) and those only some
    profiles judge (past 2**31 elements, GPU profiles only); None: every run's only."""
    return (*spec.value_classes, *profile_classes(spec.name, profile))


def profile_classes(op: str, profile: str | None) -> tuple[ValueClass, ...]:
    """The value classes of `op` that only some profiles judge, those `profile` does."""
    if op not in LARGE or profile not in PROFILES:
        return ()
    return (large_class(op),)
