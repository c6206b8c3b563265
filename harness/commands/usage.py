"""Usage errors answered before anything heavy loads.

`check(args)` runs on the parsed command line before the command does: each rule reads only the arguments, the
file system and plain name lists taken from the code that owns them (no torch, no kernel host, no adapter import),
so a mistyped argument costs a fraction of a second instead of a torch import and a sweep's start-up. A rule
raises `UsageError` with one line that names the argument and what it takes. What needs more (a registered
adapter's name, a CUDA index past the device count, a revision of a repository) is left to the command.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

# all light (no torch at import): the names the rules accept come from the modules that own them
from harness.commands.bench import SHAPES, bench_ops, parse_schemes
from harness.commands.conventions import OP_ORDER
from harness.commands.differential import TEST_SIDES_ENV
from harness.commands.golden import stored
from harness.commands.replay import EXIT_UNTESTABLE
from harness.core.device import DEVICE_FORM, DEVICE_FORMS, cuda_absent
from harness.core.sweep_args import parse_shard
from harness.store.casefiles import read_case_file
from harness.store.results import sweep_file, sweep_run_ids

#: the exit status of a usage error (argparse's)
EXIT_USAGE = 2


class UsageError(Exception):
    """A bad command line: the message is one line naming the argument; `code` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


Rule = Callable[[argparse.Namespace], None]


def check(args: argparse.Namespace) -> None:
    """Raise `UsageError` for the first rule of `args.command` that the arguments break."""
    for rule in RULES.get(getattr(args, "command", None) or "", ()):
        rule(args)


# -- devices -------------------------------------------------------------------------------------------------------

def device_form(args: argparse.Namespace) -> None:
    if not DEVICE_FORM.fullmatch(args.device):
        raise UsageError(f"--device must be {DEVICE_FORMS}, got {args.device!r}")


def _gpu_here(device: str, code: int = EXIT_USAGE) -> None:
    if device.startswith("cuda") and (why := cuda_absent()):
        raise UsageError(f"--device {device}: no CUDA device here ({why}); use auto or cpu", code)


def gpu_present(args: argparse.Namespace) -> None:
    """A CUDA device asked for where there plainly is none (where there may be one, torch decides later)."""
    if not getattr(args, "sources", None):  # matrix --from renders only: the device is not used
        _gpu_here(args.device)


def gpu_to_replay(args: argparse.Namespace) -> None:
    """replay and explain: a device that is not here means the case cannot be tested here (their exit 125)."""
    _gpu_here(args.device, EXIT_UNTESTABLE)


def gpu_to_compare(args: argparse.Namespace) -> None:
    if not os.environ.get(TEST_SIDES_ENV, "").strip() and (why := cuda_absent()):
        raise UsageError(f"differential compares the interpreter with compiled kernels and needs a CUDA GPU: {why}")


# -- what a sweep names --------------------------------------------------------------------------------------------

def shard(args: argparse.Namespace) -> None:
    if args.shard is not None:
        try:
            parse_shard(args.shard)
        except ValueError as e:
            raise UsageError(str(e)) from None


#: `module:object`, optionally `#name` (registry.SELECT): dotted Python names on both sides of the colon
_NAME = r"[^\W\d]\w*(\.[^\W\d]\w*)*"
_OBJECT_SPEC = re.compile(rf"{_NAME}:{_NAME}(#.+)?")


def adapter_spec(spec: str) -> None:
    """A spec that can name nothing: empty, or a `module:object` that is not two dotted names. Whether a name is
    registered needs the adapters imported: left to the command."""
    if not spec.strip():
        raise UsageError("--adapter must be an adapter name, a group (all, external) or module:object, got ''")
    if ":" in spec and not _OBJECT_SPEC.fullmatch(spec):
        raise UsageError(f"--adapter {spec!r} is not module:object (two dotted Python names, e.g. "
                         "my_pkg.adapters:ADAPTER, optionally #name to pick one of a list)")


def adapters(args: argparse.Namespace) -> None:
    given = args.adapter if isinstance(args.adapter, list) else [args.adapter] if args.adapter is not None else []
    for spec in given:
        adapter_spec(spec)


def resume(args: argparse.Namespace) -> None:
    if not args.resume or args.sources:
        return
    if not sweep_file(args.results_dir, args.resume).is_file():
        runs = sweep_run_ids(args.results_dir) if Path(args.results_dir).is_dir() else []
        there = (f"runs there, newest first: {', '.join(runs[:5])}" + (", ..." if len(runs) > 5 else "")
                 if runs else "it holds no sweep")
        raise UsageError(f"--resume {args.resume!r}: no results of that run in --results-dir {args.results_dir} "
                         f"({there})")


# -- files and folders ---------------------------------------------------------------------------------------------

def _existing(flag: str, paths: Iterable[str]) -> None:
    for p in paths:
        if not os.path.exists(p):
            raise UsageError(f"{flag}: {p!r} does not exist (a results file or folder)")


def _folder(flag: str, path: str | None) -> None:
    """A folder to write into: may be missing (it is made), must not be a file nor lie under one."""
    if not path:
        return
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{flag}: {path!r} is a file, not a folder (give a folder; a missing one is made)")
    _parent_folder(flag, p)


def _file(flag: str, path: str | None) -> None:
    """A file to write: must not be a folder nor lie under a file."""
    if not path:
        return
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag}: {path!r} is a folder, not a file (give a file name)")
    _parent_folder(flag, p)


def _parent_folder(flag: str, p: Path) -> None:
    above = next((a for a in p.absolute().parents if a.exists()), None)
    if above is not None and not above.is_dir():
        raise UsageError(f"{flag}: {str(p)!r} lies under {str(above)!r}, which is a file, not a folder")


def case_file(args: argparse.Namespace) -> None:
    """The CASE argument: a readable JSON case file (structure and case fields; no torch)."""
    try:
        read_case_file(args.case)
    except ValueError as e:
        raise UsageError(f"CASE: {e}") from None


def _out_file(args: argparse.Namespace) -> None:
    _file("--out", args.out)


def _out_folder(args: argparse.Namespace) -> None:
    _folder("--out", args.out)


def matrix_files(args: argparse.Namespace) -> None:
    _existing("--from", args.sources or ())
    if not args.sources:
        _folder("--results-dir", args.results_dir)


def diff_files(args: argparse.Namespace) -> None:
    _existing("A", [args.a])
    _existing("B", [args.b])
    _folder("--cases-dir", args.cases_dir)


def bisect_files(args: argparse.Namespace) -> None:
    if args.repo is not None and not os.path.isdir(args.repo):
        raise UsageError(f"--repo: {args.repo!r} is not a folder (give a git repository's folder)")
    _file("--log", args.log)


# -- names the commands take ---------------------------------------------------------------------------------------

def conventions_op(args: argparse.Namespace) -> None:
    if args.op is not None and args.op not in OP_ORDER:
        raise UsageError(f"--op must be one of {', '.join(OP_ORDER)}, got {args.op!r}")


def bench_names(args: argparse.Namespace) -> None:
    known = ["reference-experts", *bench_ops()]
    if args.op not in known:
        raise UsageError(f"--op must be one of {', '.join(known)}, got {args.op!r}")
    if unknown := [s for s in args.shape if s not in SHAPES]:
        raise UsageError(f"--shape must be among {', '.join(SHAPES)}, got {', '.join(map(repr, unknown))}")


def bench_experts_options(args: argparse.Namespace) -> None:
    given = [flag for flag, value in (("--quant", args.quant), ("--against-vllm", args.against_vllm),
                                      ("--m", args.m)) if value]
    if given and args.op != "experts":
        raise UsageError(f"{', '.join(given)}: for --op experts only, got --op {args.op}")
    try:
        parse_schemes(args.quant)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if bad := [m for m in args.m if m < 1]:
        raise UsageError(f"--m must be token counts >= 1, got {', '.join(map(str, bad))}")
    if args.against_vllm and not Path(args.against_vllm).expanduser().exists():
        raise UsageError(f"--against-vllm: {args.against_vllm!r} does not exist (a vLLM wheel or source tree)")


def golden_names(args: argparse.Namespace) -> None:
    """Checking needs a stored file per name; a new case (--regenerate) is known only once its module is imported."""
    if args.regenerate:
        return
    known = stored()
    if unknown := [n for n in args.names if n not in known]:
        raise UsageError(f"NAME must be among the stored golden cases ({', '.join(known)}), got "
                         f"{', '.join(map(repr, unknown))} (a new case: --regenerate NAME)")


def perf_table_args(args: argparse.Namespace) -> None:
    if args.out and args.folders:
        raise UsageError("give bench run folders (printed) or --out FILE (its blocks name their folders), not both")
    if not args.out and not args.folders:
        raise UsageError("give bench run folders (results/<generation>/bench/<run id>), or --out FILE")
    if bad := [f for f in args.folders if not os.path.isdir(f)]:
        raise UsageError(f"RUN_DIR: {', '.join(map(repr, bad))} is not a folder (a bench run's folder)")
    if args.out and not os.path.isfile(args.out):
        raise UsageError(f"--out: {args.out!r} is not a file (a document holding perf-table blocks)")


RULES: dict[str, tuple[Rule, ...]] = {
    "matrix": (device_form, shard, adapters, matrix_files, _out_file, resume, gpu_present),
    "replay": (device_form, adapters, case_file, gpu_to_replay),
    "explain": (device_form, adapters, case_file, _out_file, gpu_to_replay),
    "diff": (diff_files, _out_file),
    "bisect": (device_form, adapters, case_file, bisect_files, gpu_present),
    "bench": (device_form, bench_names, bench_experts_options, gpu_present),
    "golden": (golden_names,),
    "conventions": (conventions_op, _out_file),
    "coverage": (adapters, conventions_op, _out_file),
    "differential": (adapters, _out_folder, gpu_to_compare),
    "perf-table": (perf_table_args,),
}
