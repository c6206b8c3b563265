"""Front ends of `python -m harness`: one module per command, each with `add_parser(sub)` and `run(args)`."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path


def positive(kind: type) -> Callable[[str], float]:
    """An argparse type: a finite number of `kind` (int or float) greater than zero, else one clear usage error."""

    what = "an integer" if kind is int else "a number"

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} > 0, got {text!r}") from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"expected {what} > 0, got {text!r}")
        return value

    return parse


class SkippedFiles:
    """Collects the JSONL files of result folders that hold other data (tuning sweeps, probes): one summary line
    instead of one line each (`verbose` lists them)."""

    def __init__(self, verbose: bool = False) -> None:
        self.verbose = verbose
        self.found: list[tuple[Path, str]] = []

    def __call__(self, path: Path, why: str) -> None:
        self.found.append((Path(path), why))

    def report(self) -> None:
        if not self.found:
            return
        where = _rel(Path(os.path.commonpath([os.path.abspath(p.parent) for p, _ in self.found])))
        n = len(self.found)
        print(f"note: skipped {n} file{'s' if n > 1 else ''} that hold{'s' if n == 1 else ''} no verdicts (tuning or "
              f"probe data) under {where}" + (":" if self.verbose else "; --verbose lists them"), file=sys.stderr)
        for p, why in self.found if self.verbose else ():
            print(f"  {_rel(p)}: {why}", file=sys.stderr)


def _rel(p: Path) -> str:
    try:
        rel = os.path.relpath(p)
    except ValueError:  # another drive
        return str(p)
    return str(p) if rel.startswith("..") else rel


def emit(text: str, out: str | None) -> None:
    """`text` written to the file `out` (saying so), or to stdout where there is none."""
    if out:
        with open(out, "w") as f:
            f.write(text)
        print(f"wrote {out}")
    else:
        sys.stdout.write(text)
