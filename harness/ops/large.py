"""The large-offsets value class: one case per op whose offsets pass 2**31 elements where a kernel computes them.

A kernel that computes an offset in int32 (`row * stride`, `expert * stride_e` without a cast to int64) is right at
every smaller size and reads or writes out of bounds past it. Such a case holds gigabytes, so only the GPU profiles
judge it (`PROFILES`, `classes`; never `ci` or a CPU run), one per op, at the cheapest shape that reaches the bug:
one dim of a small boundary case of the cell grown (`grow`) until whole units of the tensor `Large.tensor` start
past 2**31, not merely its last element. Kernels add an element's column to a row's (or a block's) start, so a
tensor whose last row starts below 2**31 keeps every int32 product in range: the last `BLOCK_MARGIN` rows (a
kernel's whole last block of rows) start at 2**31 or past it, and for the experts the last local expert's weights
do, with a routed token reaching that expert. Its presence is read from the case's shapes (`Large.passes`), never
from its inputs (which the CPU cannot build). An adapter that declares a `max_<dim>` on the grown dim does not get
it.

align has none: its output `sorted_token_ids` is int32 and holds flat slot ids up to M*k, so a case past 2**31
slots cannot be expressed in its contract.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.ops.base import OpSpec, ValueClass

#: the first flat offset an int32 cannot hold
LARGE_OFFSET = 1 << 31
#: rows of the grown dim that start at 2**31 or past it (where the grown dim is the tensor's first): a kernel that
#: computes `block * BLOCK_M * stride` in int32 overflows only in a block that starts past 2**31, so the last
#: block of any BLOCK_M up to this many rows must
BLOCK_MARGIN = 256
#: the profiles that judge it (GPU runs only): on an H200 one such case takes 1 to 6 s in a kernel host (its device
#: arena hands it the tensors where they lie), one at a time on the machine (`harness.engine.large_lock`)
PROFILES = ("gpu", "thorough")
#: the class's name, in every op
NAME = "large_offsets"
#: ops that cannot have it, and why
NOT_EXPRESSIBLE = {"align": "its output sorted_token_ids is int32 and holds flat slot ids up to M*k: past 2**31 "
                            "slots the contract itself cannot express the result"}
#: seeds tried for a grown experts case whose routed tokens reach the last local expert
ROUTING_SEEDS = 256


@dataclass(frozen=True)
class Large:
    """How one op passes 2**31: `dim` grows; `per_unit(fields)` elements of `tensor` per unit of `dim` (the rest
    of its shape; `fields`: a case's features, shapes and params), so the tensor holds `shapes[dim] * per_unit`.
    `outer(fields)`: the count of the tensor's first dim where that is not `dim` (the experts' w13 grows N; its
    first dim is the local experts), whose last unit must start past 2**31."""

    dim: str
    tensor: str
    per_unit: Callable[[Mapping[str, Any]], int]
    #: params the grown case is drawn with (a value pattern built on the CPU from many full-size intermediates
    #: would cost more than the case; plain random values are drawn on the device)
    params: Mapping[str, Any] = field(default_factory=dict)
    #: the routing pattern the grown case is drawn with, where its inputs follow one (`random`: drawn on the
    #: device; the others draw row by row on the CPU: 20 s for a routing case's 2**31 logits on an H200)
    routing: str | None = None
    outer: Callable[[Mapping[str, Any]], int] | None = None

    def elements(self, fields: Mapping[str, Any]) -> int:
        return int(fields["shapes"][self.dim]) * self.per_unit(fields)

    def _units(self, fields: Mapping[str, Any]) -> tuple[int, int]:
        """The count of the tensor's first dim, and how many of its last units must start past 2**31."""
        if self.outer is None:
            return int(fields["shapes"][self.dim]), BLOCK_MARGIN
        return self.outer(fields), 1

    def passes(self, fields: Mapping[str, Any]) -> bool:
        """Whether the last units of the tensor's first dim (`BLOCK_MARGIN` rows, or the last expert) start at
        2**31 or past it."""
        count, margin = self._units(fields)
        return count > margin and (count - margin) * (self.elements(fields) // count) >= LARGE_OFFSET

    def size_past(self, fields: Mapping[str, Any], multiple: int = 1) -> int:
        """The fewest units of `dim` (a multiple of `multiple`) with which the case `passes`."""
        if self.outer is None:
            units = -(-LARGE_OFFSET // self.per_unit(fields)) + BLOCK_MARGIN
        else:
            count = self.outer(fields)
            per_outer_unit = self.per_unit(fields) // count  # elements of one expert per unit of `dim`
            units = -(-LARGE_OFFSET // ((count - 1) * per_outer_unit))
        return -(-units // multiple) * multiple


def _s(fields: Mapping[str, Any], dim: str) -> int:
    return int(fields["shapes"][dim])


def _local_experts(fields: Mapping[str, Any]) -> int:
    return int(fields.get("params", {}).get("local_experts", _s(fields, "E")))


def _w13_per_n(fields: Mapping[str, Any]) -> int:
    """Elements of w13 [local experts, 2N or N, K] per unit of N (2N rows for a gated activation)."""
    from harness.ops.experts_quant import ACTIVATIONS
    from reference.activations import is_gated

    act = fields.get("features", {}).get("activation")
    return _local_experts(fields) * (2 if act is None or is_gated(ACTIVATIONS[act]) else 1) * _s(fields, "K")


#: op -> how its case passes 2**31 (the tensor named is the one whose offsets pass)
LARGE: dict[str, Large] = {
    "routing": Large("M", "router_logits [M, E]", lambda f: _s(f, "E"), routing="random"),
    "grouped_routing": Large("M", "router_logits [M, E]", lambda f: _s(f, "E"), routing="random"),
    "activation": Large("T", "x [T, 2N]", lambda f: 2 * _s(f, "N")),
    "act_quant": Large("T", "x [T, 2N]", lambda f: 2 * _s(f, "N")),
    "group_quant": Large("M", "x [M, K]", lambda f: _s(f, "K"), {"pattern": "random"}),
    "reduce": Large("M", "expert_out [M, k, K]", lambda f: _s(f, "k") * _s(f, "K"), routing="random"),
    # the weights, with E and K of a small case and N grown until the last local expert's slice starts past
    # 2**31 (each slice stays under it: `expert * stride` is the product that passes); a case past 2**31 token
    # slots would hold the tokens and intermediates as well
    "experts": Large("N", "w13 [local experts, 2N, K]", _w13_per_n, outer=_local_experts),
}


def grow(op: str, adapter: Any, fields: Mapping[str, Any]) -> dict[str, Any]:
    """`fields` (a small case of the cell) with the op's dim grown past 2**31 in its tensor (a multiple of the
    adapter's `<dim>_multiple` and of the dim's old size where it grows N, whose divisibility the cell's groups
    need); an experts case takes the first seed whose routed tokens reach the last local expert (`_reaching_seed`)."""
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
    if how.outer is not None:
        grown["seed"] = _reaching_seed(op, adapter, fields)
    return grown


def last_local_expert_routed(inputs: Mapping[str, Any], local: int) -> bool:
    """Whether an experts case's inputs give its last local expert (of `local`) a token: a routed slot reaching it
    (through the expert map where there is one), or in the batched format a count. That expert's weights are the
    ones the grown case puts past 2**31."""
    if "expert_num_tokens" in inputs:
        return int(inputs["expert_num_tokens"][local - 1]) > 0
    ids = inputs["topk_ids"].long().reshape(-1)
    if "expert_map" in inputs:
        ids = inputs["expert_map"].long()[ids]
    return bool((ids == local - 1).any())


def _reaching_seed(op: str, adapter: Any, fields: Mapping[str, Any]) -> int:
    """The first seed from the case's own with which the small case's routed tokens reach its last local expert
    (the routing and the map depend on the seed, M, E and k only, which the grown case keeps). Only the routing is
    read: the op's `class_inputs` where it has them (the experts' skip quantizing every expert's weights, most of
    the cost of a seed)."""
    from harness import ops
    from harness.core.case import Case

    spec, first = ops.get(op), int(fields.get("seed", 0))
    build = spec.class_inputs or spec.make_inputs
    rest = {k: v for k, v in fields.items() if k not in ("features", "seed")}
    for seed in range(first, first + ROUTING_SEEDS):
        small = Case(op=op, adapter=adapter.name, features=dict(fields["features"]), seed=seed, **rest)
        if last_local_expert_routed(build(small, "cpu"), _local_experts(fields)):
            return seed
    raise ValueError(f"{op}: no seed of {first}..{first + ROUTING_SEEDS - 1} routes a token to the last local "
                     f"expert of {dict(fields['shapes'])}")


def _cheapest_boundary(op: str, adapter: Any, cell: Mapping[str, str]) -> dict[str, Any]:
    """The boundary case of the cell to grow: the first of those with the fewest tokens (where the grown dim is not
    the tokens', as the experts' N, the oracle's intermediates grow with both: with 65 tokens per expert in the
    batched format they outgrew an H200)."""
    from harness import ops

    found = [b for b in ops.get(op).boundary(adapter, cell) if _base(op, b)]
    if not found:
        raise ValueError(f"{op} has no boundary case with tokens to grow in {dict(cell)}")
    return min(found, key=lambda b: math.prod(int(b["shapes"].get(t, 1)) for t in ("M", "T", "max_tokens")))


def _base(op: str, fields: Mapping[str, Any]) -> bool:
    """A case to grow: tokens and a local expert (two for the experts: the last one's weights start past 2**31),
    no per-expert counts (they fix the token count), contiguous."""
    shapes, params = fields["shapes"], fields.get("params", {})
    local_ok = LARGE[op].outer is None or _local_experts({"shapes": shapes, "params": params}) >= 2
    return (all(int(shapes.get(t, 1)) > 0 for t in ("M", "T", "max_tokens")) and params.get("local_experts", 1) != 0
            and "counts" not in params and LARGE[op].dim in shapes and not fields.get("layout") and local_ok)


def base_case(op: str, fields: Mapping[str, Any]) -> bool:
    """Whether a (fitted) boundary case of the op can be grown (`grow`)."""
    return _base(op, fields)


def large_class(op: str) -> ValueClass:
    """The op's large-offsets class (only the `PROFILES` runs judge it: `classes`)."""
    how = LARGE[op]
    return ValueClass(
        NAME, lambda a, c: a.limits.get(f"max_{how.dim}") is None, (),
        lambda a, c: grow(op, a, {"features": dict(c), **_cheapest_boundary(op, a, c)}),
        lambda case, inputs: holds(case),
        sized=True, profiles=PROFILES, reads_inputs=False)


def holds(case: Any) -> bool:
    """Whether `case` is past 2**31 elements where its op's kernels compute offsets (read from its shapes)."""
    return case.op in LARGE and LARGE[case.op].passes(fields_of(case))


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
