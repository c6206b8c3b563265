"""`python -m harness`: the command-line interface."""

from __future__ import annotations

import argparse
import sys

from harness import __version__


def _cmd_golden(args: argparse.Namespace) -> int:
    from harness import golden

    names = args.names or list(golden.cases())
    unknown = [n for n in names if n not in golden.cases()]
    if unknown:
        print(f"error: unknown golden case(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    bad = 0
    for name in names:
        if args.regenerate:
            print(f"wrote {golden.write(name)}")
            continue
        try:
            problems = golden.mismatches(name)
        except FileNotFoundError as e:
            problems = [str(e)]
        bad += bool(problems)
        print(f"{'ok  ' if not problems else 'DIFF'} {name}" + (f": {'; '.join(problems)}" if problems else ""))
    return 1 if bad else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness", description=__doc__)
    p.add_argument("--version", action="version", version=f"moe-harness {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    g = sub.add_parser("golden", help="check or regenerate the committed golden vectors")
    g.add_argument("names", nargs="*", help="golden case names (default: all)")
    g.add_argument("--regenerate", action="store_true", help="recompute and overwrite the stored files")
    g.set_defaults(func=_cmd_golden)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    return int(args.func(args))
