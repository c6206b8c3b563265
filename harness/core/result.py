"""`Result`: one judged case, the record the engine produces and the store keeps (one JSON line each)."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.core.case import Case

#: `not-installed`: the adapter's third-party library is missing here (nothing was run; the reason says how to
#: install it)
VERDICTS: tuple[str, ...] = ("pass", "fail", "error", "unsupported", "not-verifiable", "not-installed")
SCHEMA_VERSION = 1


@dataclass
class Result:
    """One judged case."""

    case: Case
    verdict: str
    reason: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    checks: list[dict[str, Any]] = field(default_factory=list)  # per-check outcomes (name, passed, reason)
    declared: bool = True  # whether the adapter declares support for the case's cell on this device
    duration_s: float = 0.0
    generation: str = ""
    device: dict[str, Any] = field(default_factory=dict)  # DeviceInfo.to_dict()
    run_id: str = ""
    timestamp: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}, got {self.verdict!r}")

    @property
    def adapter(self) -> str:
        return self.case.adapter

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["case"] = self.case.to_dict()
        d["schema"] = SCHEMA_VERSION
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Result:
        d = dict(d)
        d.pop("schema", None)
        d["case"] = Case.from_dict(d["case"])
        return cls(**d)


def strict_json(value: Any) -> Any:
    """`value` with every non-finite float as the string "inf", "-inf" or "nan": Python's json writes `Infinity`,
    which strict JSON readers (jq, JavaScript, most languages' parsers) refuse."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value
