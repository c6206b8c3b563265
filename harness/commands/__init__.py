"""Front ends of `python -m harness`: one module per command, each with `add_parser(sub)` and `run(args)`."""

from __future__ import annotations

import argparse
import math
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


def note_skipped(path: Path, why: str) -> None:
    """The one-line note for a JSONL file in a results folder that holds other data (tuning sweeps)."""
    print(f"note: skipped {path}: not a results file ({why})", file=sys.stderr)
