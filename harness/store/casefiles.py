"""Case files: the self-contained, replayable record of a fail or error verdict.

Every fail or error verdict that reaches a `ResultStore` is also written to `<results-dir>/cases/<case-id>.json`:
the `Case` (which regenerates the inputs deterministically from its seed, so no tensor is stored), the adapter's
registered name and, where it can be found, its `module:object` reference (so a fresh process without the
registration can still import it), the verdict and reason, every check with its comparison mode and metrics
(margins, error, failed checks: what the comparison needs to be re-judged and compared), and the generation, device
and versions it failed on. `read_case_file` accepts a case file, a bare Case, a result record and the render's
`SUPPORT_MATRIX.cases` files; `harness.commands.replay` runs one.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.core import files
from harness.core.paths import public_record
from harness.core.result import strict_json

if TYPE_CHECKING:  # imported lazily: the replay parent stays light (no torch)
    from harness.core.result import Result
    from harness.registry import Adapter

CASE_FILE_KIND = "moe-harness-case"
CASE_FILE_SCHEMA = 1
#: no case file is larger (a case holds no tensor: its inputs are regenerated from its seed)
CASE_FILE_MAX_BYTES = 64 << 20
#: verdicts that get a case file
CASE_FILE_VERDICTS = ("fail", "error")


def adapter_reference(adapter: Adapter) -> str | None:
    """A `module:object` naming `adapter` in an imported module (its run function's or its source), or None."""
    from harness import registry

    if (spec := registry.FROM_SPEC.get(adapter.name)) is not None:  # found through it (a list: `#name` picks it)
        return spec
    for module_name in dict.fromkeys([getattr(adapter.run, "__module__", None), adapter.source]):
        module = sys.modules.get(module_name) if module_name else None
        if module is None or module_name in ("__main__", "__mp_main__"):  # not importable by that name
            continue
        for attr, value in vars(module).items():
            if value is adapter and not attr.startswith("__"):
                return f"{module_name}:{attr}"
    return None


def _registered(name: str) -> Adapter | None:
    # Peek without loading plugins: writing a case file must not import anything new.

    from harness import registry

    return getattr(registry, "_REGISTRY", {}).get(name)


def case_record(result: Result, *, adapter_object: str | None = None) -> dict[str, Any]:
    """The case-file content for a judged result."""
    from harness import __version__

    if adapter_object is None:  # the judge recorded it (an adapter loaded in a kernel host), else look it up here
        adapter_object = result.metrics.get("adapter_object")
    if adapter_object is None and (a := _registered(result.adapter)) is not None:
        adapter_object = adapter_reference(a)
    dev = result.device or {}
    return {
        "kind": CASE_FILE_KIND,
        "schema": CASE_FILE_SCHEMA,
        "case_id": result.case.case_id,
        "case": result.case.to_dict(),
        "adapter": result.adapter,
        "adapter_object": adapter_object,
        "verdict": result.verdict,
        "reason": result.reason,
        "declared": result.declared,
        # what the comparison needs to be re-judged: per check its mode, outcome and metrics (margin = error/bound)
        "comparisons": [{k: c.get(k) for k in ("name", "mode", "passed", "reason", "metrics")}
                        for c in result.checks],
        "metrics": result.metrics,
        "generation": result.generation,
        "device": dev,
        "versions": {"harness": __version__, "torch": dev.get("torch_version"),
                     "triton": dev.get("triton_version"), "python": dev.get("python_version"),
                     "commit": dev.get("commit"), "dirty": dev.get("dirty")},
        "run_id": result.run_id,
        "timestamp": result.timestamp,
    }


def write_case_file(result: Result, directory: str | os.PathLike, *, adapter_object: str | None = None) -> Path:
    """Write `<directory>/<case-id>.json` atomically (xdist workers may write the same case) and return its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{result.case.case_id}.json"
    record = public_record(case_record(result, adapter_object=adapter_object))
    text = json.dumps(strict_json(record), indent=1, sort_keys=True, allow_nan=False) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@dataclass
class CaseFile:
    """What a replay needs from a case file: the case as JSON, the adapter to run, what was recorded."""

    case: dict[str, Any]
    adapter: str
    adapter_object: str | None = None
    recorded: dict[str, Any] = field(default_factory=dict)  # verdict, generation, versions, ... (may be empty)

    @property
    def adapter_specs(self) -> list[str]:
        """Ways to find the adapter, in order: its registered name, then its `module:object`."""
        return list(dict.fromkeys(s for s in (self.adapter, self.adapter_object) if s))


def parse_case_file(data: Any, *, validate: bool = True) -> CaseFile:
    """A `CaseFile` from parsed JSON; raises ValueError for anything that is not a case. With `validate` off only
    the structure is checked (no torch import: the replay parent stays light; the child validates fully)."""
    if not isinstance(data, dict):
        raise ValueError(f"a case file must hold a JSON object, got {type(data).__name__}")
    case_dict = data["case"] if isinstance(data.get("case"), dict) else data
    if validate:
        from harness.core.case import Case

        case_dict = Case.from_dict(case_dict).to_dict()
    else:
        missing = [k for k in ("op", "adapter", "features", "shapes") if k not in case_dict]
        if missing:
            raise ValueError(f"case is missing field(s): {', '.join(missing)}")
        if not isinstance(case_dict["adapter"], str) or not case_dict["adapter"]:
            raise ValueError(f"Case.adapter must be a non-empty string, got {case_dict['adapter']!r}")
    recorded = {k: v for k, v in data.items() if k != "case"} if case_dict is not data else {}
    if "device" in recorded and "versions" not in recorded and isinstance(recorded["device"], dict):
        dev = recorded["device"]  # a result record: versions live in the device record
        recorded["versions"] = {"torch": dev.get("torch_version"), "triton": dev.get("triton_version"),
                                "commit": dev.get("commit")}
    adapter = recorded.get("adapter") if isinstance(recorded.get("adapter"), str) else case_dict["adapter"]
    obj = recorded.get("adapter_object") if isinstance(recorded.get("adapter_object"), str) else None
    return CaseFile(case=dict(case_dict), adapter=adapter or case_dict["adapter"], adapter_object=obj,
                    recorded=recorded)


def read_case_file(path: str | os.PathLike, *, validate: bool = True) -> CaseFile:
    """Read a case file; raises ValueError (with the path) when it cannot be read or is not a case."""
    try:  # a FIFO or a device named *.json is refused, never waited on (harness.core.files)
        data = json.loads(files.read_text(path, limit=CASE_FILE_MAX_BYTES))
        return parse_case_file(data, validate=validate)
    except (OSError, ValueError, TypeError, KeyError, RecursionError) as e:  # RecursionError: absurdly nested JSON
        raise ValueError(f"cannot read case file {str(path)!r}: {e}") from None
