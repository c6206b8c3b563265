"""`Case`: the complete, JSON-serializable specification of one verification example.

A case names the op and adapter, the feature cell it exercises (one value per feature axis of the op, the unit
the support matrix is made of), the sizes, dtypes, quant recipe, layout flags, routing pattern, seed and any
conventions or op parameters. Everything a verdict depends on is in the case, so a case file replays anywhere.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.core import layouts

if TYPE_CHECKING:
    import torch

OPS: tuple[str, ...] = (
    "routing", "grouped_routing", "group_quant", "align", "permute", "activation", "act_quant", "reduce", "experts",
)

ROUTING_PATTERNS: tuple[str, ...] = (
    "random",  # uniform random logits / ids
    "skewed",  # Zipf-distributed expert popularity
    "one_expert",  # every token to the same expert(s)
    "some_empty",  # a random subset of experts receives nothing
    "ties",  # exactly tied router scores
    "nonfinite",  # rows with NaN / Inf logits (only in properties that test them)
    "extreme",  # finite logits past exp's overflow and at the dtype's largest finite value
)

#: the dtype names a case may use (each the name of a torch dtype); `DTYPES` maps them to torch dtypes
DTYPE_NAMES: tuple[str, ...] = ("float64", "float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "int64",
                                "int32", "int8", "uint8")


@functools.cache
def _dtypes() -> dict[str, torch.dtype]:
    import torch  # on first use: reading, writing and rendering cases never needs torch

    return {name: getattr(torch, name) for name in DTYPE_NAMES}


def __getattr__(name: str) -> Any:
    if name == "DTYPES":  # {name: torch dtype}, made when first asked for
        return _dtypes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

_JSONScalar = (str, int, float, bool, type(None))


def dtype_of(name: str) -> torch.dtype:
    """torch dtype from its short name ("bfloat16"), with a clear error."""
    try:
        return _dtypes()[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPE_NAMES)}") from None


def _check_json(where: str, value: Any) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"{where}: keys must be strings, got {k!r}")
            _check_json(f"{where}.{k}", v)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_json(f"{where}[{i}]", v)
    elif not isinstance(value, _JSONScalar):
        raise ValueError(f"{where} must hold JSON values, got {type(value).__name__}")
    if isinstance(value, float) and value != value:
        raise ValueError(f"{where} must not be NaN")


@dataclass(frozen=True)
class Case:
    """One example: everything needed to build inputs, run an adapter and judge it."""

    op: str
    adapter: str
    features: dict[str, str]  # the matrix cell: one value per feature axis of the op
    shapes: dict[str, int]  # sizes by name: M, K, N, E, k, ...
    dtypes: dict[str, str] = field(default_factory=dict)  # tensor name -> dtype name
    seed: int = 0
    routing: str = "random"
    quant: dict[str, Any] | None = None  # quant recipe (reference.quant.QuantRecipe.to_dict())
    layout: dict[str, Any] = field(default_factory=dict)  # tensor name -> layout class (harness.core.layouts)
    params: dict[str, Any] = field(default_factory=dict)  # op parameters (block_size, renormalize, ...)
    convention: dict[str, Any] = field(default_factory=dict)  # numeric conventions the oracle must follow

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"Case.op must be one of {', '.join(OPS)}, got {self.op!r}")
        if not isinstance(self.adapter, str) or not self.adapter:
            raise ValueError(f"Case.adapter must be a non-empty string, got {self.adapter!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"Case.seed must be a non-negative int, got {self.seed!r}")
        if self.routing not in ROUTING_PATTERNS:
            raise ValueError(f"Case.routing must be one of {', '.join(ROUTING_PATTERNS)}, got {self.routing!r}")
        for name, size in self.shapes.items():
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise ValueError(f"Case.shapes[{name!r}] must be a non-negative int, got {size!r}")
        for name, dt in self.dtypes.items():
            if dt not in DTYPE_NAMES:
                raise ValueError(f"Case.dtypes[{name!r}]: unknown dtype {dt!r}; known: {', '.join(DTYPE_NAMES)}")
        for name, value in self.features.items():
            if not isinstance(value, str):
                raise ValueError(f"Case.features[{name!r}] must be a string, got {value!r}")
        for part in ("quant", "layout", "params", "convention"):
            _check_json(f"Case.{part}", getattr(self, part))
        layouts.validate(self.layout, "Case.layout")

    # -- serialization -------------------------------------------------------------------------------------------
    def _fields(self) -> dict[str, Any]:
        """The fields by name, not copied."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    def to_dict(self) -> dict[str, Any]:
        # the fields hold JSON values only (checked above): a JSON round trip is the deep copy (dataclasses.asdict's
        # own deep copy was most of the time of rendering a matrix)
        return json.loads(json.dumps(self._fields()))

    def to_json(self, **kwargs: Any) -> str:
        # the same text as dumping to_dict() (JSON values only), without its copy: case ids hash it
        return json.dumps(self._fields(), sort_keys=True, **kwargs)

    @classmethod
    def from_dict(cls, d: Any) -> Case:
        if not isinstance(d, dict):
            raise ValueError(f"a case must be a JSON object, got {type(d).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown case field(s): {', '.join(sorted(unknown))}")
        missing = {"op", "adapter", "features", "shapes"} - set(d)
        if missing:
            raise ValueError(f"case is missing field(s): {', '.join(sorted(missing))}")
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> Case:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"case is not valid JSON: {e}") from None
        return cls.from_dict(data)

    # -- helpers ---------------------------------------------------------------------------------------------------
    @property
    def case_id(self) -> str:
        """Stable short id: a hash of the canonical JSON."""
        return hashlib.sha1(self.to_json().encode()).hexdigest()[:12]

    def cell(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self.features.items()))

    def dtype(self, name: str, default: str | None = None) -> torch.dtype:
        if name not in self.dtypes:
            if default is None:
                raise ValueError(f"case has no dtype for {name!r}")
            return dtype_of(default)
        return dtype_of(self.dtypes[name])

    def shape(self, name: str) -> int:
        if name not in self.shapes:
            raise ValueError(f"case of op {self.op!r} has no size {name!r}; has {sorted(self.shapes)}")
        return self.shapes[name]

    def replace(self, **changes: Any) -> Case:
        d = self.to_dict()
        d.update(changes)
        return Case.from_dict(d)
