"""Every limit key an adapter can declare, per op: the one table the registry validates against, the strategies
read their defaults from, and `python -m harness conventions` lists (docs/CONVENTIONS.md).

Limits shape the cases drawn for an adapter, and the fixed cases every run judges besides the draws (boundary,
value-cover and value-class cases are moved to the nearest sizes the limits allow: `harness.engine.fitting`). Per
dim `D` of an op's cases (M, E, k, K, N, T, max_tokens): `max_D` and `min_D` bound them, `D_multiple` is a support
rule (cases take only multiples; a case that breaks it is reported unsupported without running), `cross_D` names
sizes just past an internal threshold of the kernel (judged once each), and where the op has one, `block_D` is the
tile whose edges the draws favour. Besides these,
`expert_maps` (ops whose cases carry an expert map) says which map shapes the kernel handles (`MAP_SHAPES`),
`layouts` (ops whose contract has tensors of any strides) which memory layouts (`harness.core.layouts`), and
`max_groups` bounds act_quant's groups per row. An unknown key, or a value of the wrong type, is an error when the
adapter is made, naming the valid keys of its op.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from harness.core.layouts import LAYOUTS

SCALE_NAMES = ("small", "large")


@dataclass(frozen=True)
class Dim:
    """A size of an op's cases. max: the default `max_D` at the small and large scale (None: bounded otherwise);
    block: the default `block_D` (None: the op has no such key); note: how the op's draws use it."""

    name: str
    meaning: str
    max: tuple[int, int] | None = None
    block: tuple[int, int] | None = None
    note: str = ""


@dataclass(frozen=True)
class Key:
    """One limit key of an op. kind: "int" (an integer >= 1; >= 0 for `min_`), "cross" (an int, a tuple of ints,
    {"at": ..., "where": {axis: values}} or a list of those), "maps" (a tuple of `MAP_SHAPES`). default: per scale
    (small, large), or None when there is none."""

    key: str
    kind: str
    meaning: str
    default: tuple[Any, Any] | None = None


#: the shapes of an expert map (global expert id -> local id or -1) an adapter can declare, narrowest first: each
#: includes the ones before it, so a kernel that handles one handles those before it too
MAP_SHAPES: dict[str, str] = {
    "identity": "every expert local, local id = global id",
    "contiguous": "the local experts are one contiguous range of global ids, in order, as an EP rank's share; "
                  "identity maps and maps with no local expert are such ranges",
    "random": "any subset of the global ids local; the draws take random subsets and contiguous ranges",
}

_TOKENS = (40, 600)
_ROW_TILE = (16, 64)
_M = Dim("M", "tokens, one row each", _TOKENS, _ROW_TILE)
_E = Dim("E", "global experts", (64, 300))
_K_TOP = Dim("k", "experts per token, the top-k", (8, 10))
_HIDDEN = Dim("K", "hidden size", (160, 2304))
_EXPERT_MAPS = Key("expert_maps", "maps", "the expert-map shapes the kernel handles, a tuple of "
                   + "; ".join(f"`{s}`: {m}" for s, m in MAP_SHAPES.items())
                   + ". Draws, boundary cases and value classes take only those (a kernel that handles one handles "
                     "those listed before it); a case with another is reported unsupported",
                   (("random",), ("random",)))
_MIN_LOCAL = Key("min_local_experts", "int", "the fewest local experts under an expert map the kernel handles "
                 "(1: an EP rank always holds an expert, as a library that sizes its launch by them needs); draws "
                 "and fixed cases take at least that many, a case with fewer is reported unsupported without "
                 "running", (0, 0))

#: op -> its dims
DIMS: dict[str, tuple[Dim, ...]] = {
    "routing": (_M, _E, _K_TOP),
    "grouped_routing": (_M, _E, _K_TOP),
    "align": (Dim("M", "tokens, one row each", (160, 2400),
                  note="draws favour the edges of the cell's block_size"), _E, _K_TOP),
    "activation": (Dim("T", "tokens, one row each", _TOKENS, _ROW_TILE),
                   Dim("N", "output columns; the input holds 2N", (96, 1024), (64, 64))),
    "reduce": (_M, _E, _K_TOP, _HIDDEN),
    "group_quant": (_M, Dim("K", "columns", (160, 2304),
                            note="in group cells at least 9 groups are drawn past max_K where it allows fewer")),
    "act_quant": (Dim("T", "tokens, one row each", _TOKENS, _ROW_TILE),
                  Dim("N", "output columns, group_size times the groups of max_groups")),
    "experts": (_M,
                Dim("E", "global experts", (64, 300), note="draws take at most 64 (cost); boundary cases up to max_E"),
                _K_TOP,
                Dim("K", "hidden size", (160, 2304), (32, 32),
                    note="in cells quantized in groups, three groups are drawn past max_K where it allows fewer"),
                Dim("N", "intermediate size", (96, 1024), (32, 32),
                    note="in cells quantized in groups, three groups are drawn past max_N where it allows fewer"),
                Dim("max_tokens", "rows per expert in the batched format", _TOKENS)),
    "permute": (),
}

_LAYOUTS = Key("layouts", "layouts", "the memory layouts the kernel handles for the tensors its op's contract says "
               "may have any strides, of `" + "`, `".join(LAYOUTS) + "` (harness.core.layouts): a tuple of them for "
               "every such tensor, or {tensor name: tuple} for some (the others take every layout); "
               "`('contiguous',)` declares contiguous-only. Draws and fixed cases take only those; a case with "
               "another is reported unsupported", (tuple(LAYOUTS), tuple(LAYOUTS)))

#: op -> keys that are not per dim
EXTRA: dict[str, tuple[Key, ...]] = {
    "routing": (_LAYOUTS,),
    "group_quant": (_LAYOUTS,),
    "align": (_EXPERT_MAPS, _MIN_LOCAL),
    "reduce": (_EXPERT_MAPS, _MIN_LOCAL, _LAYOUTS,
               Key("max_routed_scaling_factor", "int", "the largest routed_scaling_factor drawn (1: a reduce that "
                   "applies none, its router having folded the factor into the weights, as vLLM's moe_sum)")),
    "experts": (_EXPERT_MAPS, _MIN_LOCAL),
    "act_quant": (Key("max_groups", "int", "the most groups per row drawn (N = group_size x groups)", (9, 24)),),
    "grouped_routing": (_LAYOUTS, Key("max_num_groups", "int", "the most expert groups (num_groups) drawn, for "
                                      "kernels that take a bounded number (the fixed cases hold at most 8)"),),
}


def _dim_keys(d: Dim) -> list[Key]:
    note = f"; {d.note}" if d.note else ""
    found = [Key(f"max_{d.name}", "int", f"the largest {d.name} drawn and in the fixed cases ({d.name}: "
                 f"{d.meaning}); a budget, which sizes a multiple or per-expert counts need may pass{note}", d.max),
             Key(f"min_{d.name}", "int", f"the smallest {d.name} drawn and in the fixed cases (those below it are "
                 "moved up to it)", (1, 1)),
             Key(f"{d.name}_multiple", "int", f"{d.name} must be a multiple of it: draws take only multiples, the "
                 "fixed cases are moved up to one (or left out where no valid one exists), a case that breaks it "
                 "is reported unsupported without running", (1, 1)),
             Key(f"cross_{d.name}", "cross", f"sizes of {d.name} just past an internal threshold of the kernel, "
                 "judged once each at the cheapest shape that crosses them")]
    if d.block is not None:
        found.insert(3, Key(f"block_{d.name}", "int", f"the kernel's tile along {d.name}: draws favour its edges "
                            "(block - 1, block, block + 1)", d.block))
    return found


def keys(op: str) -> Mapping[str, Key]:
    """Every limit key of `op`, by name (read-only: made once per op, a plan asks it tens of thousands of times)."""
    return _keys(op)


@functools.cache
def _keys(op: str) -> Mapping[str, Key]:
    found = [k for d in DIMS.get(op, ()) for k in _dim_keys(d)] + list(EXTRA.get(op, ()))
    return MappingProxyType({k.key: k for k in found})


def default(op: str, key: str, scale: str) -> Any:
    """The default of limit `key` of `op` at `scale` (None: none); ValueError for a key `op` does not have."""
    known = keys(op)
    if key not in known:
        raise ValueError(f"op {op} has no limit {key!r}; its limits: {', '.join(known) or 'none'}")
    d = known[key].default
    return None if d is None else d[SCALE_NAMES.index(scale)]


# ------------------------------------------------------------------------------------------------- validation


def _is_int(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _check_cross(value: Any, where: str) -> None:
    entries = list(value) if isinstance(value, (list, tuple)) and any(isinstance(v, Mapping) for v in value) \
        else [value]
    for entry in entries:
        at = entry.get("at") if isinstance(entry, Mapping) else entry
        sizes = at if isinstance(at, (list, tuple)) else [at]
        ok = bool(sizes) and all(_is_int(s, 1) for s in sizes)
        if isinstance(entry, Mapping):
            w = entry.get("where", {})
            ok = ok and set(entry) <= {"at", "where"} and isinstance(w, Mapping) and all(
                isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v) for v in w.values())
        if not ok:
            raise ValueError(f"{where} must be a size (int >= 1), a tuple of sizes, {{'at': sizes, 'where': "
                             f"{{axis: (values, ...)}}}} or a list of such mappings, got {value!r}")


def _layout_tuple(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(v in LAYOUTS for v in value)


def _check_layouts(value: Any, where: str) -> None:
    entries = value.values() if isinstance(value, Mapping) else [value]
    names_ok = not isinstance(value, Mapping) or all(isinstance(k, str) for k in value)
    if isinstance(value, str) or not names_ok or not all(_layout_tuple(v) for v in entries):
        raise ValueError(f"{where} must be a non-empty tuple of {', '.join(map(repr, LAYOUTS))} (e.g. "
                         f"('contiguous',)) or a mapping of tensor names to such tuples, got {value!r}")


def layouts_allowed(declared: Any, name: str) -> tuple[str, ...]:
    """The layout classes a `layouts` limit (None: none declared) allows tensor `name`, in `LAYOUTS` order."""
    if isinstance(declared, Mapping):
        declared = declared.get(name)
    return tuple(v for v in LAYOUTS if declared is None or v in declared)


def _check(key: Key, value: Any, where: str) -> None:
    where = f"{where}: limit {key.key}"
    if key.kind == "int":
        least = 0 if key.key.startswith("min_") else 1
        if not _is_int(value, least):
            raise ValueError(f"{where} must be an integer >= {least}, got {value!r}")
    elif key.kind == "cross":
        _check_cross(value, where)
    elif key.kind == "layouts":
        _check_layouts(value, where)
    elif key.kind == "maps":
        if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value \
                or any(v not in MAP_SHAPES for v in value):
            raise ValueError(f"{where} must be a non-empty tuple of {', '.join(map(repr, MAP_SHAPES))} (e.g. "
                             f"('contiguous',)), got {value!r}")


def validate(op: str, limits: Mapping[str, Any], where: str) -> None:
    """Raise ValueError naming `where`, the key and the valid keys of `op`, for a limit `op` does not have or a
    value of the wrong type (and for a `min_D` above `max_D`)."""
    if not isinstance(limits, Mapping):
        raise ValueError(f"{where}: limits must be a mapping, got {type(limits).__name__}")
    known = keys(op)
    for key, value in limits.items():
        if key not in known:
            raise ValueError(f"{where}: unknown limit {key!r} for op {op}; valid: "
                             f"{', '.join(known) or 'none (this op has no limits)'}")
        _check(known[key], value, where)
    for d in DIMS.get(op, ()):
        lo, hi = limits.get(f"min_{d.name}"), limits.get(f"max_{d.name}")
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"{where}: limit min_{d.name}={lo} is above max_{d.name}={hi}")


# ----------------------------------------------------------------------------------------------- expert maps


def map_shape(params: Mapping[str, Any], e: int) -> str | None:
    """The shape of a case's expert map, from its parameters (None: it has none): every expert local is the
    identity, a `contiguous` map (or none local) a range, any other a random subset."""
    n_local = params.get("local_experts")
    if n_local is None:
        return None
    if n_local == e and e > 0:
        return "identity"
    return "contiguous" if params.get("map") == "contiguous" or n_local == 0 else "random"


def widest_map(declared: Any) -> str:
    """The widest of the declared map shapes (the kernel handles it and every narrower one)."""
    order = list(MAP_SHAPES)
    return max(declared, key=order.index)


def map_allowed(declared: Any, shape: str) -> bool:
    order = list(MAP_SHAPES)
    return order.index(shape) <= order.index(widest_map(declared))


# ------------------------------------------------------------------------------------------------------ spans


@dataclass(frozen=True)
class Span:
    """The sizes a draw of one dim may take. lo, hi: the op's own bounds (hi None: none; k at most E); low, high:
    the adapter's min_ and max_ (or the defaults) within them; multiple: of the op and the adapter's `D_multiple`.
    `fit` moves a drawn size to the nearest size allowed: within [low, high] where a multiple lies there, else
    within [low, hi], else [lo, hi] (a multiple is a support rule, the max a budget), else as close as it gets."""

    lo: int
    hi: int | None
    multiple: int
    low: int
    high: int | None

    def _ranges(self) -> list[tuple[int, int | None]]:
        return [(self.low, self.high), (self.low, self.hi), (self.lo, self.hi)]

    def fit(self, v: int) -> int:
        m = self.multiple
        for lo, hi in self._ranges():
            bottom, top = -(-lo // m) * m, (None if hi is None else hi // m * m)
            if top is None or bottom <= top:
                v = max(v, bottom) if top is None else min(max(v, bottom), top)
                return -(-v // m) * m
        return max(self.lo, v) if self.hi is None else min(max(self.lo, v), self.hi)

    def fit_up(self, v: int) -> int:
        """The smallest allowed size at least `v`, past the max if need be (rows that per-expert counts need)."""
        m = self.multiple
        return -(-max(v, self.low) // m) * m

    def allows(self, v: int) -> bool:
        return v % self.multiple == 0 and self.low <= v and (self.high is None or v <= self.high)
