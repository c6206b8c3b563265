"""Append-only JSONL results store.

One file per run and per process (pytest-xdist workers write their own). Each line is one `Result`, written and
flushed as soon as it is judged, so a crash loses nothing already judged. The loader merges files and tolerates a
truncated last line (the mark of a process killed mid-write).

A line may also be a metadata record (a JSON object with a "kind" key, no "case"): the matrix sweep writes one
per run ("run", "run_end") and per adapter ("adapter": source, declared support, cell selection), so a matrix can
be rendered from the files alone. `iter_results` skips those lines; `load_meta` returns them. Files written before
metadata records existed are read unchanged.
"""

from __future__ import annotations

import gzip
import json
import os
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from harness.core.result import SCHEMA_VERSION, Result, strict_json
from harness.store.casefiles import write_case_file


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]


def _drop_partial_last_line(path: Path) -> None:
    """Cut an unterminated last line (a writer killed mid-line) so that appended lines do not continue it."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as fh:
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) == b"\n":
            return
        fh.seek(0)
        fh.truncate(fh.read().rfind(b"\n") + 1)


class ResultStore:
    """Writes results of one run (one process) to `<dir>/<run_id>[-<worker>].jsonl`, one flushed line each."""

    def __init__(self, directory: str | os.PathLike, run_id: str | None = None, worker: str | None = None):
        self.directory = Path(os.path.abspath(directory))  # fixed at start: a later chdir cannot move the file
        self.run_id = run_id or new_run_id()
        stem = self.run_id + (f"-{worker}" if worker else "")
        self.path = self.directory / f"{stem}.jsonl"
        self._fh: IO[str] | None = None
        self.count = 0

    def _write(self, record: dict[str, Any]) -> None:
        if self._fh is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            _drop_partial_last_line(self.path)  # a resumed run appends after a process killed mid-write
            self._fh = open(self.path, "a", encoding="utf-8")
        self._fh.write(json.dumps(strict_json(record), sort_keys=True, allow_nan=False) + "\n")
        self._fh.flush()

    def append(self, result: Result) -> None:
        result.run_id = result.run_id or self.run_id
        self._write(result.to_dict())
        self.count += 1
        if result.verdict in ("fail", "error"):
            self._write_case_file(result)

    def _write_case_file(self, result: Result) -> None:
        """A failure also becomes a replayable `<dir>/cases/<case-id>.json` (harness.store.casefiles); the line is kept
        even when that file cannot be written."""
        try:
            write_case_file(result, self.directory / "cases")
        except (OSError, TypeError, ValueError) as e:
            import warnings

            warnings.warn(f"could not write the case file of {result.case.case_id}: {e}", stacklevel=3)

    def begin(self, case: Any, device: dict[str, Any], generation: str) -> None:
        """Write a `pending` record before a case runs: if the process dies inside the kernel, `resolve_pending`
        turns it into an error verdict with a case file (the result line written after judging resolves it)."""
        self.append_meta("pending", {"pending": case.to_dict(), "case_id": case.case_id, "device": device,
                                     "generation": generation})

    @property
    def fault_path(self) -> Path:
        """Where this process's fatal-signal traceback goes (faulthandler), next to its results."""
        return self.path.with_suffix(".faults")

    def append_meta(self, kind: str, record: dict[str, Any]) -> None:
        """Write one metadata record (not a verdict; not counted)."""
        self._write({"kind": kind, "schema": SCHEMA_VERSION, "run_id": self.run_id, **record})

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def resolve_pending(directory: str | os.PathLike, prefix: str, cause: str = "") -> list[Result]:
    """Turn every `pending` record of the files `<directory>/<prefix>*.jsonl` that no verdict followed (its process
    died inside the kernel) into an error verdict, appended to the same file with its case file. The reason names
    `cause` and the fatal error faulthandler wrote next to the file (e.g. "Segmentation fault"), if any."""
    from harness.core.case import Case

    found: list[Result] = []
    for path in sorted(Path(directory).glob(f"{prefix}*.jsonl")):
        open_cases: dict[str, dict[str, Any]] = {}
        for line in _read_lines(path):
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(d, dict):
                continue
            if d.get("kind") == "pending":
                open_cases[d.get("case_id", "")] = d
            elif "case" in d:
                try:
                    open_cases.pop(Result.from_dict(d).case.case_id, None)
                except (KeyError, TypeError, ValueError):
                    continue
        if not open_cases:
            continue
        fault = _fault_text(path.with_suffix(".faults"))
        store = ResultStore(path.parent, run_id=path.stem)
        for rec in open_cases.values():
            why = "; ".join(w for w in (cause, fault) if w)
            r = Result(case=Case.from_dict(rec["pending"]), verdict="error",
                       reason=f"the process died while the kernel ran this case ({why or 'no cause recorded'}): no "
                              "verdict was written by it", generation=rec.get("generation", ""),
                       device=rec.get("device", {}), metrics={"exception": "process died"})
            store.append(r)
            found.append(r)
        store.close()
    return found


def _fault_text(path: Path) -> str:
    """The first line of a faulthandler dump ("Fatal Python error: Segmentation fault"), or ""."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


class ResultsFileError(ValueError):
    """A results file that cannot be read (not a truncated last line: real corruption)."""


def result_files(paths: Iterable[str | os.PathLike]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files.extend(sorted([*p.rglob("*.jsonl"), *p.rglob("*.jsonl.gz")]))
        elif p.exists():
            files.append(p)
        else:
            raise ResultsFileError(f"results path {str(p)!r} does not exist")
    return files


def _generations() -> tuple[str, ...]:
    from harness.core.device import GENERATIONS  # imported late: harness.core.device imports torch

    return GENERATIONS


def _is_record(d: Any) -> bool:
    """A result record (it holds a case) or a metadata record (a "kind", no case)."""
    return isinstance(d, dict) and ("case" in d or "kind" in d)


def _read_lines(path: Path) -> list[str]:
    # committed archives may be gzipped (a full matrix sweep is tens of MB of JSONL)
    with (gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")) as fh:
        return fh.read().split("\n")


def not_a_results_file(lines: list[str]) -> str | None:
    """Why a JSONL file is other data (tuning sweeps, logs as JSON) rather than results: its first line is a JSON
    value that is neither a result nor a metadata record. None for a results file (or one that cannot tell: an
    unreadable first line is judged line by line, so corruption still raises)."""
    first = next((line for line in lines if line.strip()), None)
    if first is None:
        return None
    try:
        d = json.loads(first)
    except json.JSONDecodeError:
        return None
    return None if _is_record(d) else "its first line is not a result record"


def _iter_records(paths: Iterable[str | os.PathLike], strict: bool,
                  on_skip: Callable[[Path, str], None] | None) -> Iterator[Result | dict[str, Any]]:
    for path in result_files(paths):
        lines = _read_lines(path)
        why = not_a_results_file(lines)
        if why:
            if on_skip is None:
                warnings.warn(f"skipped {path}: not a results file ({why})", stacklevel=3)
            else:
                on_skip(path, why)
            continue
        last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
        for lineno, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                if isinstance(d, dict) and "kind" in d and "case" not in d:
                    yield d
                else:
                    r = Result.from_dict(d)
                    if r.generation and r.generation not in _generations():
                        raise ValueError(f"unknown generation {r.generation!r} (known: {', '.join(_generations())})")
                    yield r
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                truncated = lineno == last and not line.endswith("}")
                if truncated or not strict:
                    continue
                raise ResultsFileError(f"{path}:{lineno + 1}: not a valid result record ({e})") from None


def load(paths: Iterable[str | os.PathLike], *, strict: bool = True,
         on_skip: Callable[[Path, str], None] | None = None) -> tuple[list[Result], list[dict[str, Any]]]:
    """(results, metadata records) of files and folders, read once. A JSONL file that holds other data (see
    `not_a_results_file`) is skipped: `on_skip(path, why)` is told (default: a warning)."""
    results: list[Result] = []
    meta: list[dict[str, Any]] = []
    for rec in _iter_records(paths, strict, on_skip):
        (results if isinstance(rec, Result) else meta).append(rec)
    return results, meta


def iter_results(paths: Iterable[str | os.PathLike], *, strict: bool = True) -> Iterator[Result]:
    """Results from files and directories (searched recursively for *.jsonl and *.jsonl.gz); metadata records are
    skipped.

    A truncated final line (a process killed mid-write) is skipped. A bad line elsewhere raises
    `ResultsFileError` naming file and line, unless `strict` is False (then it is skipped).
    """
    for rec in _iter_records(paths, strict, None):
        if isinstance(rec, Result):
            yield rec


def load_meta(paths: Iterable[str | os.PathLike], *, strict: bool = True) -> list[dict[str, Any]]:
    """The metadata records (see the module docstring) of the given files, in file order."""
    return [rec for rec in _iter_records(paths, strict, None) if not isinstance(rec, Result)]


def load_results(paths: Iterable[str | os.PathLike], *, strict: bool = True) -> list[Result]:
    return list(iter_results(paths, strict=strict))
