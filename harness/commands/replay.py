"""Contained replay (`python -m harness replay CASE.json`): one case file (`harness.store.casefiles`) judged again.

The case runs in a child process (spawn), never in the caller. A kernel that kills its process (a signal, a CUDA
illegal memory access, `os._exit`) or hangs past the timeout is reported as a failing verdict with the reason, so a
`git bisect run` is never aborted by a crash. Exit codes follow `git bisect run`: 0 pass, 1 fail, 125 cannot be
tested here (adapter not importable, device generation unsupported, a build error, a case the harness cannot build),
2 an unreadable case file.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import re
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.commands import positive
from harness.core.exits import exit_cause
from harness.store.casefiles import CaseFile

if TYPE_CHECKING:  # imported lazily: the replay parent never imports torch
    from harness.registry import Adapter

EXIT_PASS, EXIT_FAIL, EXIT_UNTESTABLE = 0, 1, 125
EXIT_BAD_FILE = 2
DEFAULT_TIMEOUT_S = 300.0

#: `error` verdicts that say nothing about the kernel's correctness at this commit: the harness could not build or
#: judge the case, or the kernel could not be compiled (a build error skips the commit in a bisect)
_UNTESTABLE_ERRORS = re.compile(
    r"^harness could not build the case|^harness error\b|"
    r"^kernel raised: (CompilationError|PTXASError|NVRTCError|OutOfResources|ModuleNotFoundError|ImportError)\b")


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


def _resolve_any(specs: list[str], device: str) -> tuple[Adapter | None, str]:
    from harness.engine import remote

    problems = []
    for spec in specs:
        try:  # in a kernel host of its own: this process judges, it never imports the adapter's module
            return remote.open_adapter(spec, device), ""
        except Exception as e:  # a kernel module that does not import (syntax error, missing symbol, no triton)
            problems.append(f"{spec}: {type(e).__name__}: {e}")
    return None, "adapter not importable here (" + "; ".join(problems) + ")"


def _child(conn: Any, case_dict: dict[str, Any], specs: list[str], device: str,
           extra_runs: dict[str, Any] | None = None) -> None:
    """Runs in the spawned process: resolve, detect, judge, send one message."""
    try:
        from harness.core.device import prepare_interpreter

        prepare_interpreter(device)  # before any kernel module imports triton
        from harness.core.case import Case
        from harness.core.device import detect
        from harness.engine import runner
        from harness.engine.interpreter import unverifiable_here

        try:
            case = Case.from_dict(case_dict)
        except ValueError as e:
            conn.send({"status": "bad-case", "reason": f"not a valid case: {e}"})
            return
        try:
            dev = detect(device)
        except ValueError as e:
            conn.send({"status": "untestable", "reason": f"device not available: {e}", "adapter": specs[0]})
            return
        adapter, why = _resolve_any(specs, dev.device)
        if adapter is None:
            conn.send({"status": "untestable", "reason": why})
            return
        if case.adapter != adapter.name:
            case = case.replace(adapter=adapter.name)
        r = runner.judge(case, adapter, dev, unverifiable=unverifiable_here(), extra_runs=extra_runs)
        # as JSON text: plain values only, so that unpickling in the parent never imports torch (TorchVersion)
        conn.send({"status": "judged", "result": json.loads(json.dumps(r.to_dict())), "adapter": adapter.name})
    except BaseException as e:  # the harness itself failed here: nothing is known about the kernel
        conn.send({"status": "untestable", "reason": f"harness failed to replay: {type(e).__name__}: {e}"})
    finally:
        conn.close()


def _extra_runs(case_file: CaseFile) -> dict[str, Any] | None:
    """The recorded choice of extra runs: their seed and order, empty when none were drawn (None: drawn anew)."""
    metrics = case_file.recorded.get("metrics")
    found = metrics.get("extra_runs") if isinstance(metrics, dict) else None
    return found if isinstance(found, dict) else None


def replay(case_file: CaseFile, *, adapter: str | None = None, device: str = "auto",
           timeout: float = DEFAULT_TIMEOUT_S) -> Outcome:
    """Judge the case of `case_file` in a spawned child process; never raises for what the kernel does."""
    specs = [adapter] if adapter else case_file.adapter_specs
    ctx = mp.get_context("spawn")  # never fork: the caller may hold a CUDA context
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(sender, case_file.case, specs, device, _extra_runs(case_file)), daemon=True)
    t0 = time.perf_counter()
    proc.start()
    sender.close()
    msg: dict[str, Any] | None = None
    timed_out, answered = False, False
    try:
        if receiver.poll(timeout):  # data, or EOF when the child died without sending
            try:
                msg = receiver.recv()
            except (EOFError, OSError):
                msg = None
        else:
            timed_out = True
        answered = True
    finally:
        receiver.close()
        if timed_out or not answered:  # hung, or this process was interrupted (Ctrl-C, SIGTERM): no waiting for it
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
        return Outcome("fail", f"kernel crashed: the replay process ended ({exit_cause(proc.exitcode)}) before a "
                       "verdict", EXIT_FAIL, name, duration_s=elapsed)
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
        reason = f"the case passed, but the replay process then ended ({exit_cause(proc.exitcode)})"
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


# -- command line -------------------------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> int:
    from harness.store.casefiles import read_case_file

    try:
        case_file = read_case_file(args.case, validate=False)  # the child validates it (keeps torch out of here)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_FILE
    # the case runs in a child process: a crash or hang of the kernel becomes a fail, never this process's death
    outcome = replay(case_file, adapter=args.adapter, device=args.device, timeout=args.timeout)
    print(describe(outcome, case_file), flush=True)
    return outcome.exit_code


def add_parser(sub: Any) -> None:
    """Add the command to the `python -m harness` subparsers."""
    r = sub.add_parser("replay", help="re-run one case file; exit 0 pass, 1 fail, 125 cannot test here")
    r.add_argument("case", help="a case JSON file (a Case, or a result record holding one)")
    r.add_argument("--adapter", help="run this adapter (name or module:object) instead of the case file's")
    r.add_argument("--device", default="auto",
                   help="auto (the GPU if there is one), cpu, cuda or cuda:N")
    r.add_argument("--timeout", type=positive(float), default=300.0,
                   help="seconds before a hanging kernel is killed and the case failed (default 300)")
    r.set_defaults(func=run)
