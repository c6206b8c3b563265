"""`python -m harness`: verify MoE kernels against the reference oracle.

Commands (one module each in `harness.commands`):
  matrix   run the deterministic sweep on this device and record every verdict
  replay   re-run one case file and print its verdict (exit 0 pass, 1 fail, 125 cannot test here)
  explain  which declared conventions would make a failing case pass (its kernel run once, re-judged)
  diff     the cells whose verdict differs between two result sets
  bisect   git-bisect the first commit where a case fails (this repository or an external kernel's)
  bench    time the kernels (or the oracle) on this device
  golden   check or regenerate the committed golden vectors
  conventions  every convention key and value, and the inputs' layouts, per op
  coverage  what a profile's generic test exercises of each adapter's declarations (no kernel runs)
  differential  judge the Triton kernels on the interpreter and on this GPU, and compare (a GPU machine)
"""

from __future__ import annotations

import argparse
import sys

from harness import __version__
from harness.commands import (
    bench,
    bisect,
    conventions,
    coverage,
    diff,
    differential,
    explain,
    golden,
    matrix,
    perf_table,
    replay,
    usage,
)

COMMANDS = (matrix, replay, explain, diff, bisect, bench, perf_table, golden, conventions, coverage, differential)


def build_parser() -> argparse.ArgumentParser:
    # the subparsers list the commands: the description is the first line only, not the docstring's list again
    p = argparse.ArgumentParser(prog="python -m harness", description=(__doc__ or "").strip().splitlines()[0])
    p.add_argument("--version", action="version", version=f"moe-harness {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for command in COMMANDS:
        command.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:  # before the command imports torch or starts a kernel host: a mistyped argument is told at once
        usage.check(args)
    except usage.UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.code
    return int(args.func(args))
