"""What a sweep's command line names, readable without importing the sweep (which loads torch): the plan profiles
and the `--shard K/N` syntax. `harness.sweep.selection` plans by them; the command line checks them first."""

from __future__ import annotations

import re

#: the plan profiles, smallest first (`harness.sweep.selection.CASES_PER_CELL` gives each its cases per cell)
PROFILES: tuple[str, ...] = ("quick", "full")


def parse_shard(text: str | None) -> tuple[int, int]:
    """(K, N) of a `--shard K/N` value; ValueError naming --shard and its form otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not m:
        raise ValueError(f"--shard must be K/N (e.g. 1/4), got {text!r}")
    index, count = int(m.group(1)), int(m.group(2))
    check_shard(index, count)
    return index, count


def check_shard(index: int, count: int) -> None:
    if count < 1 or not 1 <= index <= count:
        raise ValueError(f"--shard must be K/N with 1 <= K <= N, got {index}/{count}")
