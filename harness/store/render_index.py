"""Which committed result files hold only runs the support matrix no longer shows, so that a render reads past them.

A results folder (`results/<generation>/`) keeps every run ever committed, while the matrix shows one run per
(generation, adapter) (`harness.store.results.RunSelection`); parsing every record of every superseded run was most
of a render's time. `render-index.json` in the folder names each of its results files by path, with the sha256 of
its bytes and of its manifest's, the run ids it holds and whether it is `older`: no run of it is shown. A render
(not `--history`) of every file an index names (and any others) reads past an older file whose bytes still
hash as indexed. Why that shows the same matrix:

- files added since can only replace a slot's run with one the selection ranks higher, so an older run stays older;
- but a run that new files add records to (a resumed or merged run) may rank higher than before: when a file read
  holds a run id that a skipped file holds too, the skipped files are read after all;
- a file the index names that is gone, changed, or left out by the manifest gate may have held a shown run: then
  the index is not used at all.

`python scripts/results_readme.py` writes the index with results/README.md (`harness.store.record.write_render_index`;
`--check` says when either is stale). A stale index costs a render time, never a verdict.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.core import files
from harness.store import manifest

__all__ = ["INDEX_NAME", "SCHEMA", "Skips", "digest", "older_runs", "roots", "skips", "text"]

INDEX_NAME = "render-index.json"
SCHEMA = 1


def digest(path: Path) -> str:
    """sha256 of the file's bytes and of its manifest's (what the manifest gate reads)."""
    h = hashlib.sha256(files.read_bytes(path, decompress=False))
    m = manifest.manifest_path(path)
    h.update(b"\0manifest\0" + (m.read_bytes() if m.is_file() else b""))
    return h.hexdigest()


def text(index: dict[str, Any]) -> str:
    """The index file's text."""
    return json.dumps(index, indent=1, sort_keys=True) + "\n"


class Skips:
    """The files a render may read past (`older`), and what says it must read them after all."""

    def __init__(self) -> None:
        self.older: dict[Path, set[str]] = {}  # skipped file -> its run ids
        self.shown: set[Path] = set()  # files the indexes call current: a render must read all of them whole
        self.indexed: set[Path] = set()  # every file an intact index names

    def runs(self) -> set[str]:
        return set().union(*self.older.values()) if self.older else set()


def _entry_ok(e: Any) -> bool:
    return (isinstance(e, dict) and isinstance(e.get("sha256"), str) and isinstance(e.get("older"), bool)
            and isinstance(e.get("runs"), list) and all(isinstance(r, str) for r in e["runs"]))


def _load(root: Path) -> dict[str, Any] | None:
    """The index in `root`; None when there is none, or it is not one this version wrote (a render then reads all)."""
    path = root / INDEX_NAME
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(index, dict) or index.get("schema") != SCHEMA or not isinstance(index.get("files"), dict):
        return None
    if not all(isinstance(rel, str) and _entry_ok(e) for rel, e in index["files"].items()):
        return None
    return index


def roots(listed: Sequence[Path]) -> list[Path]:
    """The folders holding an index among the listed files' ancestors."""
    found: dict[Path, bool] = {}
    for f in listed:
        for d in f.parents:
            if d not in found:
                found[d] = (d / INDEX_NAME).is_file()
    return sorted(d for d, has in found.items() if has)


def skips(listed: list[Path]) -> Skips:
    """What a render of the results files `listed` may read past: the older files of each index found beside them
    (in a folder above them), unless a file the index names is not listed, or changed (then none of its)."""
    found = Skips()
    present = set(listed)
    for root in roots(listed):
        index = _load(root)
        if index is None:
            continue
        entries = {root / rel: e for rel, e in index["files"].items()}
        try:
            intact = all(f in present and digest(f) == e.get("sha256") for f, e in entries.items())
        except (OSError, ValueError):
            intact = False
        if not intact:
            continue
        found.indexed.update(entries)
        for f, e in entries.items():
            if e.get("older"):
                found.older[f] = set(e.get("runs", []))
            else:
                found.shown.add(f)
    return found


def older_runs(listed: Sequence[Path]) -> set[str]:
    """Every run id that an index above the files `listed` names for an older file, whether or not the index still
    holds (what a read of them may skip, at most)."""
    found: set[str] = set()
    for root in roots(listed):
        index = _load(root)
        for e in (index or {}).get("files", {}).values():
            if e.get("older"):
                found.update(e.get("runs", []))
    return found
