"""Committed results read in a thread while a sweep judges, so that its render reads only the sweep's own files.

`python -m harness matrix` renders its verdicts with every committed result. Reading those (about 12,000 records
parsed, their manifests and render indexes checked) was most of the render's seconds after the last verdict. The
command starts a `ReadAhead` of them once the sweep's planning is over (the planning's thread needs the
interpreter's lock more); `render_files` takes its read when it still holds:
- every file it read, every manifest beside one and every render index above one has the size and modification time
  it had before the read, and the listing of the same paths finds the same files;
- the other files of the render (the sweep's) lie under no folder a render index covers, and hold no run id that an
  index lets a read skip (a resumed committed run would make those files current again).
Otherwise the render reads every file itself, as it did without one: the same matrix either way.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.result import Result
from harness.store import manifest, render_index
from harness.store.results import load, result_files

__all__ = ["Read", "ReadAhead", "files_stamps"]

Stamp = tuple[int, int] | None


def _stamp(path: Path) -> Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def files_stamps(listed: Sequence[Path]) -> dict[Path, Stamp]:
    """(size, modification time) of every file a read of `listed` depends on: the files, their manifests and the
    render indexes above them (None where absent)."""
    found: dict[Path, Stamp] = {}
    for f in listed:
        found[f] = _stamp(f)
        m = manifest.manifest_path(f)
        found[m] = _stamp(m)
    for root in render_index.roots(listed):
        index = root / render_index.INDEX_NAME
        found[index] = _stamp(index)
    return found


@dataclass
class Read:
    """What a read of some paths found: `load`'s results and metadata, the files it passed to `on_skip` with why
    (other data, differential runs among them), the manifest gate's notes, and what it depended on."""

    paths: list[str]
    results: list[Result] = field(default_factory=list)
    meta: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stamps: dict[Path, Stamp] = field(default_factory=dict)
    older_runs: set[str] = field(default_factory=set)

    def current(self) -> bool:
        """Whether a read of the same paths now would read the same bytes."""
        try:
            listed = result_files(self.paths)
        except ValueError:
            return False
        return files_stamps(listed) == self.stamps

    def takes(self, others: Sequence[Path], ids: set[str]) -> bool:
        """Whether a render may add this read to its own of files `others` holding run ids `ids` (see the module)."""
        return not render_index.roots(others) and not (ids & self.older_runs)


class ReadAhead:
    """Reads `paths` (files or folders of results) in a daemon thread from `start`, as `render_files` would with
    `strict` and `history`; `take` waits for it and returns the read while it holds (`Read.current`), else None."""

    def __init__(self, paths: Sequence[str | os.PathLike], *, strict: bool = True, history: bool = False) -> None:
        self.paths = [str(p) for p in paths]
        self.strict, self.history = strict, history
        self._read: Read | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Begin the read (once; later calls do nothing)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="moe-harness-read-ahead", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        try:
            listed = result_files(self.paths)
            read = Read(self.paths, stamps=files_stamps(listed), older_runs=render_index.older_runs(listed))
            gate = manifest.Gate()
            read.results, read.meta = load(listed, strict=self.strict, gate=gate, skip_older=not self.history,
                                           on_skip=lambda path, why: read.skipped.append((path, why)))
            read.notes = list(gate.notes)
        except Exception:  # anything a read can raise, the render's own read raises again, with its context
            return
        self._read = read

    def take(self) -> Read | None:
        """The read, once done, when it still holds; None when it was never started, failed or no longer holds."""
        thread = self._thread
        if thread is None:
            return None
        thread.join()
        read = self._read
        return read if read is not None and read.current() else None
