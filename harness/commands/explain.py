"""`python -m harness explain CASE.json`: which declared conventions would make a failing case pass.

The kernel runs once on the case's inputs, in its kernel host as in a replay (this process judges, it never imports
the adapter's module); its outputs are then judged again against the oracle under every alternative value of each
convention key of the op, one key at a time, then pairs of the changes that reduced the error
(`harness.engine.explain`). It prints the changes that would make the case pass, then those that reduce its error,
with the margin (error / bound) each leaves, and saves the inputs, the kernel's outputs and the oracle's expected
values and intermediate stages to one file for `torch.load`. Exit codes as replay's: 0 the case passes, 1 it fails,
125 it cannot be run here, 2 an unreadable case file or an unknown adapter.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.commands import positive
from harness.commands.replay import EXIT_BAD_FILE, EXIT_FAIL, EXIT_PASS, EXIT_UNTESTABLE, exit_code_for
from harness.store.casefiles import CaseFile

if TYPE_CHECKING:
    from harness.engine.explain import Exploration, Judged
    from harness.engine.runner import OneRun

#: seconds of re-judging after which progress is printed (to stderr), and between two progress lines
PROGRESS_AFTER_S = 3.0
#: alternatives listed (those that pass first, then those that reduce the error)
SHOWN = 10


class Stop(Exception):
    """Explain cannot go on: `code` is its exit code, the message its one line."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def _adapter(case_file: CaseFile, spec: str | None, device: str) -> Any:
    """The adapter in a kernel host of its own (`remote.open_adapter`)."""
    from harness.engine import remote

    if spec is not None:
        try:
            return remote.open_adapter(spec, device)
        except ValueError as e:
            raise Stop(EXIT_BAD_FILE, f"unknown adapter {spec!r}: {e}") from None
        except Exception as e:
            raise Stop(EXIT_UNTESTABLE, f"not runnable here: adapter {spec!r}: {type(e).__name__}: {e}") from None
    problems = []
    for s in case_file.adapter_specs:
        try:
            return remote.open_adapter(s, device)
        except Exception as e:
            problems.append(f"{s}: {type(e).__name__}: {e}")
    raise Stop(EXIT_UNTESTABLE, "not runnable here: adapter not importable (" + "; ".join(problems) + "); name one "
               "with --adapter")


def run_case(case_file: CaseFile, *, adapter: str | None, device: str, timeout: float | None) -> OneRun:
    """The case's kernel run once on this device."""
    from harness.core.device import prepare_interpreter

    prepare_interpreter(device)  # before any kernel module imports triton
    from harness.core.case import Case
    from harness.core.device import detect
    from harness.engine import runner
    from harness.engine.interpreter import unverifiable_here

    try:
        case = Case.from_dict(case_file.case)
    except ValueError as e:
        raise Stop(EXIT_BAD_FILE, f"not a valid case: {e}") from None
    try:
        dev = detect(device)
    except ValueError as e:
        raise Stop(EXIT_UNTESTABLE, f"not runnable here: device not available: {e}") from None
    found = _adapter(case_file, adapter, dev.device)
    if found.op != case.op:
        raise Stop(EXIT_BAD_FILE, f"adapter {found.name!r} is a {found.op} adapter; the case is a {case.op} case")
    if case.adapter != found.name:
        case = case.replace(adapter=found.name)
    return runner.run_once(case, found, dev, unverifiable=unverifiable_here(), timeout=timeout)


def _progress() -> Any:
    t0 = time.perf_counter()
    last = [t0]

    def report(done: int, total: int) -> None:
        now = time.perf_counter()
        if now - t0 >= PROGRESS_AFTER_S and (now - last[0] >= PROGRESS_AFTER_S or done == total):
            last[0] = now
            print(f"explain: judged {done} of {total} alternatives ({now - t0:.0f} s)", file=sys.stderr, flush=True)

    return report


def _margin(j: Judged) -> str:
    parts = [] if j.margin is None else [f"margin {j.margin:.3g}"]
    if j.max_error is not None:
        parts.append(f"error {j.max_error:.3g}")
    if not j.passed and j.mismatches:
        parts.append(f"{j.mismatches} wrong")
    return ", ".join(parts)


def _value(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _line(i: int, j: Judged) -> str:
    return f"  {i}. {'pass' if j.passed else 'fail'}  {_margin(j):<34} {j.describe()}"


def report(one: OneRun, found: Exploration) -> str:
    """What explain prints: the declared verdict, the changes that would make it pass, those that reduce its
    error, what changed nothing, what was not tried."""
    case, d = one.case, found.declared
    n = len(found.singles) + len(found.pairs)
    lines = [f"{one.result.verdict}: {case.adapter} on {one.judging.device.generation}, case {case.case_id} "
             f"({case.op}: {', '.join(f'{k}={v}' for k, v in case.features.items())})",
             f"  declared conventions: {_margin(d)}: {d.reason}",
             f"  the kernel ran once; its outputs were judged again under {len(found.singles)} single changes and "
             f"{len(found.pairs)} pairs ({n} in all, {found.seconds:.1f} s)"]
    better = found.improvements()
    passing = [j for j in better if j.passed]
    lines.append("declarations that would make it pass (best first):" if passing else
                 "no single change or pair of the conventions makes it pass")
    lines += [_line(i + 1, j) for i, j in enumerate(passing[:SHOWN])]
    failing = [j for j in better if not j.passed]
    if failing and len(passing) < SHOWN:
        lines.append("changes that reduce the error without passing:")
        lines += [_line(len(passing) + i + 1, j) for i, j in enumerate(failing[:SHOWN - len(passing)])]
    if (left := len(better) - SHOWN) > 0:
        lines.append(f"  ... and {left} more (the saved file's meta['ranking'] lists them all)")
    if quiet := found.no_effect():
        lines.append(f"no effect on this case: {', '.join(quiet)}")
    refused = [", ".join(f"{c.label}={_value(c.value)}" for c in j.changes) for j in found.singles if j.error]
    if refused:
        lines.append(f"not applicable to this case (the oracle refused them): {', '.join(refused)}")
    lines += [f"not tried: {k}: {why}" for k, why in found.not_tried.items()]
    return "\n".join(lines)


def save(one: OneRun, path: Path, found: Exploration | None) -> None:
    """Write the case's tensors and `meta` for `torch.load`."""
    import torch

    from harness.engine import explain

    better = found.improvements() if found is not None else []
    data = explain.tensors(one, better[0] if better else None)
    data["meta"].update({
        "case": one.case.to_dict(), "adapter": one.case.adapter, "conventions": one.conventions,
        "verdict": one.result.verdict, "reason": one.result.reason,
        "margin": one.result.metrics.get("margin"), "generation": one.judging.device.generation,
        "ranking": [j.to_dict() for j in better],
        "best": better[0].to_dict() if better else None})
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, path)


def _out_path(args: argparse.Namespace, case_file: CaseFile) -> Path:
    if args.out:
        return Path(args.out)
    from harness.core.case import Case

    return Path(args.case).resolve().parent / f"{Case.from_dict(case_file.case).case_id}.explain.pt"


def explain_case(args: argparse.Namespace) -> int:
    from harness.store.casefiles import read_case_file

    try:
        case_file = read_case_file(args.case)
    except ValueError as e:
        raise Stop(EXIT_BAD_FILE, str(e)) from None
    one = run_case(case_file, adapter=args.adapter, device=args.device, timeout=args.timeout)
    result = one.result
    out = _out_path(args, case_file)
    if one.outputs is None:  # gated, raised, or failed an integrity check: nothing to judge again
        code = exit_code_for(result.verdict, result.reason)
        print(f"{result.verdict}: {one.case.adapter}: {result.reason}\n  nothing to explain: the kernel gave no "
              "outputs the oracle could judge again", flush=True)
        if one.inputs is not None:
            save(one, out, None)
            print(f"wrote {out}", flush=True)
        return code
    if result.verdict == "pass":
        print(f"pass: {one.case.adapter}, case {one.case.case_id}: the kernel's outputs match the oracle under its "
              "declared conventions; nothing to explain" + _recorded(case_file), flush=True)
        return EXIT_PASS
    from harness.engine import explain

    found = explain.explore(one, _progress())
    print(report(one, found), flush=True)
    save(one, out, found)
    print(f"wrote {out}: torch.load() gives inputs (input.*), the kernel's outputs (output.*), the oracle's expected "
          "values (expected.*, bound.*, mask.*; best.* under the first change above) and stages (stage.*), and meta",
          flush=True)
    return EXIT_FAIL


def _recorded(case_file: CaseFile) -> str:
    rec = case_file.recorded.get("verdict")
    return f" (recorded: {rec}: {case_file.recorded.get('reason', '')})" if rec and rec != "pass" else ""


def run(args: argparse.Namespace) -> int:
    try:
        return explain_case(args)
    except Stop as e:
        print(f"error: {e}" if e.code == EXIT_BAD_FILE else str(e), file=sys.stderr)
        return e.code


def add_parser(sub: Any) -> None:
    """Add the command to the `python -m harness` subparsers."""
    r = sub.add_parser(
        "explain", help="which declared conventions would make a failing case pass",
        description="Run the case's kernel once, then judge its outputs again under every alternative value of "
        "each convention key of its op (one key at a time, then pairs of those that reduce the error), and print "
        "the declarations that would make it pass, best first, with the margin (error / bound) each leaves. Saves "
        "the inputs, the kernel's outputs and the oracle's expected values and stages for torch.load. Exit 0 the "
        "case passes, 1 it fails, 125 it cannot run here, 2 an unreadable case file or an unknown adapter.")
    r.add_argument("case", help="a case JSON file (<results-dir>/cases/<case-id>.json, a Case, or a result record)")
    r.add_argument("--adapter", help="run this adapter (name or module:object) instead of the case file's")
    r.add_argument("--out", help="where to save the tensors (default: <case-id>.explain.pt next to the case file)")
    r.add_argument("--device", default="auto",
                   help="auto (the GPU if there is one), cpu, cuda or cuda:N")
    r.add_argument("--timeout", type=positive(float), default=300.0,
                   help="seconds before a hanging kernel run is given up (default 300)")
    r.set_defaults(func=run)
