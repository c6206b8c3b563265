"""Case files and contained replay (`python -m harness replay CASE.json`).

Case file: every fail or error verdict that reaches a `ResultStore` is also written to `<results-dir>/cases/
<case-id>.json`, a self-contained JSON record: the `Case` (which regenerates the inputs deterministically from its
seed, so no tensor is stored), the adapter's registered name and, where it can be found, its `module:object`
reference (so a fresh process without the registration can still import it), the verdict and reason, every
check with its comparison mode and metrics (margins, error, failed checks: what the comparison needs to be
re-judged and compared), and the generation, device and versions it failed on.

Replay: the case runs in a child process (spawn), never in the caller. A kernel that kills its process (a signal,
a CUDA illegal memory access, `os._exit`) or hangs past the timeout is reported as a failing verdict with the
reason, so a `git bisect run` is never aborted by a crash. Exit codes follow `git bisect run`: 0 pass, 1 fail,
125 cannot be tested here (adapter not importable, device generation unsupported, a build error, a case the
harness cannot build). `read_case_file` accepts a case file, a bare Case, a result record and the render's
`SUPPORT_MATRIX.cases` files.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported lazily: results.py and the spawned child import this module first
    from harness.adapters import Adapter
    from harness.results import Result

CASE_FILE_KIND = "moe-harness-case"
CASE_FILE_SCHEMA = 1
#: verdicts that get a case file
CASE_FILE_VERDICTS = ("fail", "error")

EXIT_PASS, EXIT_FAIL, EXIT_UNTESTABLE = 0, 1, 125
EXIT_BAD_FILE = 2
DEFAULT_TIMEOUT_S = 300.0

#: `error` verdicts that say nothing about the kernel's correctness at this commit: the harness could not build or
#: judge the case, or the kernel could not be compiled (a build error skips the commit in a bisect)
_UNTESTABLE_ERRORS = re.compile(
    r"^harness could not build the case|^harness error while judging|"
    r"^kernel raised: (CompilationError|PTXASError|NVRTCError|OutOfResources|ModuleNotFoundError|ImportError)\b")


# -- case files ---------------------------------------------------------------------------------------------------

def adapter_reference(adapter: Adapter) -> str | None:
    """A `module:object` naming `adapter` in an imported module (its run function's or its source), or None."""
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
    from harness import adapters

    return getattr(adapters, "_REGISTRY", {}).get(name)


def case_record(result: Result, *, adapter_object: str | None = None) -> dict[str, Any]:
    """The case-file content for a judged result."""
    from harness import __version__

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
    text = json.dumps(case_record(result, adapter_object=adapter_object), indent=1, sort_keys=True) + "\n"
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
        from harness.case import Case

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
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        return parse_case_file(data, validate=validate)
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise ValueError(f"cannot read case file {str(path)!r}: {e}") from None


# -- contained replay ---------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    """A replay's verdict: a runner verdict, `untestable` (could not run here) or `bad-case` (invalid case)."""

    verdict: str
    reason: str = ""
    exit_code: int = EXIT_UNTESTABLE
    adapter: str = ""
    generation: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] | None = None  # the Result record when the child judged the case
    duration_s: float = 0.0


def exit_code_for(verdict: str, reason: str = "") -> int:
    """The `git bisect run` exit code of a verdict."""
    if verdict == "pass":
        return EXIT_PASS
    if verdict == "fail":
        return EXIT_FAIL
    if verdict == "error":
        return EXIT_UNTESTABLE if _UNTESTABLE_ERRORS.search(reason) else EXIT_FAIL
    return EXIT_UNTESTABLE  # unsupported, not-verifiable, untestable


def _resolve_any(specs: list[str]) -> tuple[Adapter | None, str]:
    from harness import adapters

    problems = []
    for spec in specs:
        try:
            return adapters.resolve(spec), ""
        except Exception as e:  # a kernel module that does not import (syntax error, missing symbol, no triton)
            problems.append(f"{spec}: {type(e).__name__}: {e}")
    return None, "adapter not importable here (" + "; ".join(problems) + ")"


def _child(conn: Any, case_dict: dict[str, Any], specs: list[str], device: str) -> None:
    """Runs in the spawned process: resolve, detect, judge, send one message."""
    try:
        from harness.cli import _prepare_device

        _prepare_device(device)  # before any kernel module imports triton
        from harness import runner
        from harness.case import Case
        from harness.device import detect
        from harness.interpreter import unverifiable_here

        try:
            case = Case.from_dict(case_dict)
        except ValueError as e:
            conn.send({"status": "bad-case", "reason": f"not a valid case: {e}"})
            return
        adapter, why = _resolve_any(specs)
        if adapter is None:
            conn.send({"status": "untestable", "reason": why})
            return
        try:
            dev = detect(device)
        except ValueError as e:
            conn.send({"status": "untestable", "reason": f"device not available: {e}", "adapter": adapter.name})
            return
        if case.adapter != adapter.name:
            case = case.replace(adapter=adapter.name)
        r = runner.judge(case, adapter, dev, unverifiable=unverifiable_here())
        # as JSON text: plain values only, so that unpickling in the parent never imports torch (TorchVersion)
        conn.send({"status": "judged", "result": json.loads(json.dumps(r.to_dict())), "adapter": adapter.name})
    except BaseException as e:  # the harness itself failed here: nothing is known about the kernel
        conn.send({"status": "untestable", "reason": f"harness failed to replay: {type(e).__name__}: {e}"})
    finally:
        conn.close()


def _death(exitcode: int | None) -> str:
    if exitcode is None:
        return "did not exit"
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with status {exitcode}"


def replay(case_file: CaseFile, *, adapter: str | None = None, device: str = "auto",
           timeout: float = DEFAULT_TIMEOUT_S) -> Outcome:
    """Judge the case of `case_file` in a spawned child process; never raises for what the kernel does."""
    specs = [adapter] if adapter else case_file.adapter_specs
    ctx = mp.get_context("spawn")  # never fork: the caller may hold a CUDA context
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(sender, case_file.case, specs, device), daemon=True)
    t0 = time.perf_counter()
    proc.start()
    sender.close()
    msg: dict[str, Any] | None = None
    timed_out = False
    try:
        if receiver.poll(timeout):  # data, or EOF when the child died without sending
            try:
                msg = receiver.recv()
            except (EOFError, OSError):
                msg = None
        else:
            timed_out = True
    finally:
        receiver.close()
        if timed_out:
            proc.kill()
        proc.join(timeout=60)
        if proc.is_alive():  # hung in teardown after reporting
            proc.kill()
            proc.join()
    elapsed = round(time.perf_counter() - t0, 3)
    name = (msg or {}).get("adapter", specs[0] if specs else case_file.adapter)

    if timed_out:
        return Outcome("fail", f"kernel hung: no verdict within the {timeout:g} s timeout (child killed)",
                       EXIT_FAIL, name, duration_s=elapsed)
    if msg is None:
        return Outcome("fail", f"kernel crashed: the replay process {_death(proc.exitcode)} before a verdict",
                       EXIT_FAIL, name, duration_s=elapsed)
    if msg["status"] == "untestable":
        return Outcome("untestable", msg["reason"], EXIT_UNTESTABLE, name, duration_s=elapsed)
    if msg["status"] == "bad-case":
        return Outcome("bad-case", msg["reason"], EXIT_BAD_FILE, name, duration_s=elapsed)
    res = msg["result"]
    verdict, reason = res["verdict"], res["reason"]
    code = exit_code_for(verdict, reason)
    if proc.exitcode not in (0, None) and code == EXIT_PASS:
        # a kernel that corrupts its process may still report a verdict before the process dies
        verdict, code = "fail", EXIT_FAIL
        reason = f"the case passed, but the replay process then {_death(proc.exitcode)}"
    return Outcome(verdict, reason, code, name, res.get("generation", ""), res.get("metrics", {}), res, elapsed)


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def describe(outcome: Outcome, case_file: CaseFile | None = None) -> str:
    """Human-readable report: the verdict, its metrics, and how it compares with the recorded verdict."""
    where = f" on {outcome.generation}" if outcome.generation else ""
    lines = [f"{outcome.verdict}: {outcome.adapter}{where} (exit {outcome.exit_code})"]
    if outcome.reason:
        lines.append(f"  reason: {outcome.reason}")
    for key, value in outcome.metrics.items():
        if key == "metrics_trace":
            continue
        if key == "failed_checks":
            if value:
                lines.append(f"  failed checks: {', '.join(value)}")
            continue
        if isinstance(value, (int, float, str)):
            lines.append(f"  {key}: {_fmt(value)}")
    rec = (case_file.recorded if case_file else {}) or {}
    if rec.get("verdict"):
        versions = rec.get("versions") or {}
        prov = ", ".join(f"{k} {str(v)[:12]}" for k, v in versions.items() if v and k in ("torch", "triton", "commit"))
        same = "reproduced" if rec["verdict"] == outcome.verdict else f"now {outcome.verdict}"
        on = f" on {rec['generation']}" if rec.get("generation") else ""
        lines.append(f"  recorded: {rec['verdict']}{on}" + (f" ({prov})" if prov else "") + f" -> {same}")
    return "\n".join(lines)
