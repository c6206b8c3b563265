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

import json
import os
import re
import time
import uuid
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from harness.core import files
from harness.core.paths import public_record
from harness.core.result import SCHEMA_VERSION, Result, strict_json
from harness.store import manifest
from harness.store.casefiles import write_case_file

#: seconds between two checkpoints of a results file's manifest (and at every `pending` record: a kernel that kills
#: its process right after leaves the record vouched for)
CHECKPOINT_S = 1.0


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]


#: how a matrix sweep's results file ends (`<run id>-main.jsonl`, in its results folder, written by its parent)
SWEEP_FILE_SUFFIX = "-main.jsonl"


def sweep_file(results_dir: str | os.PathLike, run_id: str) -> Path:
    """Where sweep `run_id` writes its results (a `--resume` continues the run only if it exists)."""
    return Path(results_dir) / f"{run_id}{SWEEP_FILE_SUFFIX}"


def sweep_run_ids(results_dir: str | os.PathLike) -> list[str]:
    """The sweeps whose results are in `results_dir`, newest first."""
    found = sorted(Path(results_dir).glob(f"*{SWEEP_FILE_SUFFIX}"), key=lambda f: f.stat().st_mtime, reverse=True)
    return [f.name.removesuffix(SWEEP_FILE_SUFFIX) for f in found]


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
        self.tampered = 0  # times another process changed the file and it was restored (check_untouched)
        self._lines: list[str] = []
        self._seen: tuple[int, int, int] | None = None
        self._manifest: manifest.ManifestWriter | None = None
        self._checkpoint = 0.0

    def _open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        _drop_partial_last_line(self.path)  # a resumed run appends after a process killed mid-write
        self._fh = open(self.path, "a", encoding="utf-8")
        data = files.read_bytes(self.path)
        self._lines = [data.decode("utf-8")] if data else []
        self._seen = self._stamp()
        key = manifest.load_key(create=True)
        self._manifest = manifest.ManifestWriter(self.path, self.run_id, key)
        vouched = manifest.vouched_lines(self.path, data, key) if data else set()
        for i, line in enumerate(data.split(b"\n")[:-1]):
            self._manifest.add(line + b"\n", vouched=i in vouched)
        if self._manifest.excluded:
            warnings.warn(f"{self.path}: {len(self._manifest.excluded)} line(s) written before were not the judge's "
                          "or not vouched for by its manifest: kept in the file, excluded by its manifest",
                          stacklevel=4)

    def _write(self, record: dict[str, Any]) -> None:
        if self._fh is None:
            self._open()
        self.check_untouched()
        # results are committed and read elsewhere: no path of this machine in them (harness.core.paths)
        line = json.dumps(strict_json(public_record(record)), sort_keys=True, allow_nan=False) + "\n"
        assert self._fh is not None and self._manifest is not None
        self._fh.write(line)
        self._fh.flush()
        self._lines.append(line)
        self._manifest.add(line.encode("utf-8"))
        self._seen = self._stamp()
        if record.get("kind") == "pending" or time.monotonic() - self._checkpoint >= CHECKPOINT_S:
            self.checkpoint()

    def checkpoint(self, final: bool = False) -> None:
        """Write the manifest of what this store wrote so far (`final`: the run ended)."""
        if self._manifest is not None:
            self._manifest.write(final=final)
            self._checkpoint = time.monotonic()

    def _stamp(self) -> tuple[int, int, int] | None:
        """The file's identity, size and change time (which no process can set back): another writer changes it."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_ctime_ns

    def check_untouched(self, full: bool = False) -> bool:
        """Whether the file still holds exactly what this store wrote; if another process changed, replaced or
        removed it (a kernel host writing into the results), it is rewritten from this store's own record, a
        `tampered` record is added, and `self.tampered` counts it. True when it was untouched.

        The quick check compares inode, size and ctime; a rewrite of the same size within one tick of the kernel's
        coarse clock keeps all three, so `full` (at close) compares the contents whatever the stamp says."""
        if self._fh is None or (not full and self._stamp() == self._seen):
            return True
        text = "".join(self._lines)
        try:
            same = self.path.read_text(encoding="utf-8") == text
        except OSError:
            same = False
        if same:
            self._seen = self._stamp()
            return True
        self.tampered += 1
        self._fh.close()
        note = json.dumps({"kind": "tampered", "schema": SCHEMA_VERSION, "run_id": self.run_id,
                           "note": "the file was changed by another process; rewritten from the judge's record"},
                          sort_keys=True) + "\n"
        self._lines.append(note)
        if self._manifest is not None:
            self._manifest.add(note.encode("utf-8"))
        tmp = self.path.with_name(self.path.name + ".restore")
        tmp.write_text("".join(self._lines), encoding="utf-8")
        os.replace(tmp, self.path)
        self._fh = open(self.path, "a", encoding="utf-8")
        self._seen = self._stamp()
        self.checkpoint()
        return False

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
            path = write_case_file(result, self.directory / "cases")
            if self._manifest is not None:
                self._manifest.add_case_file(path)
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
            self._fh.flush()
            self.check_untouched(full=True)
            self._fh.close()
            self._fh = None
            self.checkpoint(final=True)

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
        data = _read_data(path)
        vouched = manifest.vouched_lines(path, data, manifest.load_key())  # the judge's own records only
        for i, line in enumerate(_decode(path, data)):
            if i not in vouched:
                continue
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
        elif p.is_symlink():
            raise ResultsFileError(f"results path {str(p)!r} is a dangling symbolic link (to {os.readlink(p)!r})")
        else:
            raise ResultsFileError(f"results path {str(p)!r} does not exist")
    return files


def _generations() -> tuple[str, ...]:
    from harness.core.device import GENERATIONS  # imported late: harness.core.device imports torch

    return GENERATIONS


def _is_record(d: Any) -> bool:
    """A result record (it holds a case) or a metadata record (a "kind", no case)."""
    return isinstance(d, dict) and ("case" in d or "kind" in d)


def _read_data(path: Path) -> bytes:
    # committed archives may be gzipped (a full matrix sweep is tens of MB of JSONL); a FIFO, a device, a dangling
    # link or a truncated archive is named, never waited on (harness.core.files)
    try:
        return files.read_bytes(path)
    except files.UnreadableFile as e:
        raise ResultsFileError(f"results file {e}") from None


def _decode(path: Path, data: bytes) -> list[str]:
    try:
        return data.decode("utf-8").split("\n")
    except UnicodeDecodeError as e:
        raise ResultsFileError(f"results file {str(path)!r} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def _read_lines(path: Path) -> list[str]:
    """The lines of a results file, those its manifest excludes blank (a reader that does not authenticate)."""
    data = _read_data(path)
    lines = _decode(path, data)
    for i in manifest.excluded_lines(path):
        if i < len(lines):
            lines[i] = ""
    return lines


def _gated_lines(path: Path, gate: manifest.Gate | None) -> list[str] | None:
    """The lines of a results file a reader may use (None: left out by `gate`; see `_read_lines` without one).
    Files of other data (tuning sweeps) are returned whole: the caller skips them."""
    if gate is None:
        return _read_lines(path)
    data = _read_data(path)
    lines = _decode(path, data)
    if not_a_results_file(lines):
        return lines
    usable = gate.admit(path, data)
    if usable is None:
        return None
    keep = set(usable)
    return [line if i in keep else "" for i, line in enumerate(lines)]


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
                  on_skip: Callable[[Path, str], None] | None,
                  gate: manifest.Gate | None = None) -> Iterator[Result | dict[str, Any]]:
    for _, rec in _iter_file_records(paths, strict, on_skip, gate):
        yield rec


def _iter_file_records(paths: Iterable[str | os.PathLike], strict: bool,
                       on_skip: Callable[[Path, str], None] | None,
                       gate: manifest.Gate | None = None,
                       left_out: list[Path] | None = None) -> Iterator[tuple[Path, Result | dict[str, Any]]]:
    """(file, record) of every record of the files, in file order (with `gate`: of the lines it admits; the files
    it leaves out whole are appended to `left_out`)."""
    for path in result_files(paths):
        lines = _gated_lines(path, gate)
        if lines is None:
            if left_out is not None:
                left_out.append(path)
            continue
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
                    yield path, d
                else:
                    r = Result.from_dict(d)
                    if r.generation and r.generation not in _generations():
                        raise ValueError(f"unknown generation {r.generation!r} (known: {', '.join(_generations())})")
                    yield path, r
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                # the last line, cut (no newline after it, wherever it was cut, even right after a `}`), or
                # unfinished: a writer killed mid-line
                truncated = lineno == last and (last == len(lines) - 1 or not line.endswith("}"))
                if truncated or not strict:
                    continue
                raise ResultsFileError(f"{path}:{lineno + 1}: not a valid result record ({e})") from None


def load(paths: Iterable[str | os.PathLike], *, strict: bool = True,
         on_skip: Callable[[Path, str], None] | None = None,
         gate: manifest.Gate | None = None, skip_older: bool = False) -> tuple[list[Result], list[dict[str, Any]]]:
    """(results, metadata records) of files and folders, read once. A JSONL file that holds other data (see
    `not_a_results_file`) is skipped: `on_skip(path, why)` is told (default: a warning). With `gate`, only the
    lines of results files whose manifest it accepts are read (`gate.notes` names the rest). `skip_older`: files
    that a folder's render index (`harness.store.render_index`) says hold only runs a matrix no longer shows are
    not read, unless what is read shows that the index no longer holds."""
    from harness.store import render_index

    paths = list(paths)
    listed = result_files(paths)
    skips = render_index.skips(listed) if skip_older else render_index.Skips()
    notes = len(gate.notes) if gate is not None else 0
    results: list[Result] = []
    meta: list[dict[str, Any]] = []
    new_runs: set[str] = set()  # run ids of files no index names
    left_out: list[Path] = []
    skipped: list[tuple[Path, str]] = []  # told once the read is final (a read that starts over tells them again)
    tell = on_skip if not skips.older else lambda path, why: skipped.append((path, why))
    for path, rec in _iter_file_records([f for f in listed if f not in skips.older], strict, tell, gate, left_out):
        (results if isinstance(rec, Result) else meta).append(rec)
        if path not in skips.indexed:
            new_runs.add(rec.run_id if isinstance(rec, Result) else str(rec.get("run_id") or ""))
    if skips.older and (new_runs & skips.runs() or skips.shown.intersection(left_out)):
        if gate is not None:
            del gate.notes[notes:]
        return load(paths, strict=strict, on_skip=on_skip, gate=gate)
    for path, why in skipped:
        if on_skip is None:
            warnings.warn(f"skipped {path}: not a results file ({why})", stacklevel=2)
        else:
            on_skip(path, why)
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


# -- runs: which verdicts a matrix shows --------------------------------------------------------------------------

#: verdicts that judged the case (a clean rejection included); not-verifiable and not-installed judged nothing
VERIFIED = ("pass", "fail", "error", "unsupported")
#: generation -> (device key, name) of what besides the generation decides a verdict there
FIDELITY: dict[str, tuple[str, str]] = {"interp": ("triton_version", "Triton")}
#: (generation, what decides its fidelity, adapter): the verdicts of one adapter in one column of the matrix
Slot = tuple[str, str, str]


def lineage(r: Result) -> tuple[str, str]:
    """(generation, what decides its fidelity, e.g. the Triton release of an `interp` verdict; "" elsewhere)."""
    key = FIDELITY.get(r.generation)
    return r.generation, (str(r.device.get(key[0]) or "unknown") if key else "")


def lineage_labels(lineages: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """The column name of each lineage: its generation, named with its fidelity (`interp (Triton 3.9.0)`) where the
    generation has several."""
    found: dict[str, set[str]] = defaultdict(set)
    for g, fid in lineages:
        found[g].add(fid)
    return {(g, fid): f"{g} ({FIDELITY[g][1]} {fid})" if len(fids) > 1 else g
            for g, fids in found.items() for fid in fids}


def short_commit(commit: str) -> str:
    """A commit as people quote it: its first 7 hex digits (anything else, e.g. "unknown", as it is)."""
    c = (commit or "unknown").split("+", 1)[0]
    return c[:7] if re.fullmatch(r"[0-9a-f]{7,40}", c) else c


@dataclass
class Run:
    """The verdicts of one run: the records of one run id, or of the shards of one sharded sweep (the same
    generation, commit, profile and shard count), which together are what one unsharded sweep would have written."""

    key: str
    ids: set[str] = field(default_factory=set)
    sweep: bool = False  # a matrix sweep's `run` record is there (the pytest plugin and older files have none)
    profiles: set[str] = field(default_factory=set)
    last: float = 0.0  # when its latest verdict was judged
    planned: dict[str, int] = field(default_factory=dict)  # adapter -> the cases its plan listed (all shards)
    judged: dict[Slot, set[str]] = field(default_factory=lambda: defaultdict(set))
    seen: set[Slot] = field(default_factory=set)
    verified: set[Slot] = field(default_factory=set)
    files: set[Path] = field(default_factory=set)
    commits: set[tuple[str, bool]] = field(default_factory=set)  # (commit, dirty) of its `run` records
    device_commits: set[tuple[str, bool]] = field(default_factory=set)  # (commit, dirty) its verdicts record

    @property
    def profile(self) -> str:
        return ", ".join(sorted(self.profiles))

    @property
    def commit(self) -> str:
        """The short commit it ran, with "+dirty" when the tree had changes ("unknown" when nothing says)."""
        known = sorted(c for c in (self.commits or self.device_commits) if short_commit(c[0]) != "unknown")
        if not known:
            return "unknown"
        commit, dirty = known[-1]
        return short_commit(commit) + ("+dirty" if dirty or commit.endswith("+dirty") else "")

    def complete(self, slot: Slot) -> bool:
        """Whether every case its plan listed for the slot's adapter has a verdict: not a sweep cut short or
        killed, nor a run without a plan (the pytest plugin's)."""
        want = self.planned.get(slot[2])
        return self.sweep and want is not None and len(self.judged.get(slot, ())) >= want


def _shard_group(d: Mapping[str, Any]) -> str | None:
    """The run key that the shards of one sharded sweep share (None for a run record of an unsharded one)."""
    shard = str(d.get("shard") or "")
    if "/" not in shard:
        return None
    dirty = "+dirty" if d.get("dirty") else ""
    return (f"{d.get('generation')}-{short_commit(str(d.get('commit')))}{dirty}-{d.get('profile')}-"
            f"shards-of-{shard.split('/', 1)[1]}")


class RunSelection:
    """Every run of a set of records, and the run each slot shows (`chosen`): the one that verified something (a
    run whose library was missing judged nothing), then a complete one, then a sweep, then the latest."""

    def __init__(self, records: Iterable[tuple[Path | None, Result | Mapping[str, Any]]]) -> None:
        records = list(records)
        self.key_of: dict[str, str] = {}
        for _, d in records:
            if isinstance(d, Mapping) and d.get("kind") == "run" and (group := _shard_group(d)):
                self.key_of[str(d.get("run_id") or "")] = group
        self.runs: dict[str, Run] = {}
        for path, rec in records:
            self._add(path, rec)
        candidates: dict[Slot, list[Run]] = defaultdict(list)
        for run in self.runs.values():
            for slot in run.seen:
                candidates[slot].append(run)
        self.chosen: dict[Slot, Run] = {
            slot: max(runs, key=lambda run, s=slot: (s in run.verified, run.complete(s), run.sweep, run.last,
                                                     run.key))
            for slot, runs in candidates.items()}

    def run_of(self, run_id: str) -> Run:
        return self.runs[self.key_of.get(run_id, run_id)]

    def is_current(self, r: Result) -> bool:
        """Whether `r` belongs to the run its slot shows."""
        return self.chosen.get((*lineage(r), r.adapter)) is self.run_of(r.run_id)

    def _add(self, path: Path | None, rec: Result | Mapping[str, Any]) -> None:
        rid = rec.run_id if isinstance(rec, Result) else str(rec.get("run_id") or "")
        key = self.key_of.get(rid, rid)
        run = self.runs.setdefault(key, Run(key))
        run.ids.add(rid)
        if path is not None:
            run.files.add(path)
        if isinstance(rec, Result):
            slot = (*lineage(rec), rec.adapter)
            run.seen.add(slot)
            if not (rec.metrics.get("marker") and rec.reason.startswith("not run")):  # never judged
                run.judged[slot].add(rec.case.case_id)
            if rec.verdict in VERIFIED:
                run.verified.add(slot)
            run.last = max(run.last, rec.timestamp)
            run.device_commits.add((str(rec.device.get("commit") or "unknown"), bool(rec.device.get("dirty"))))
        elif rec.get("kind") == "run":
            run.sweep = True
            if rec.get("profile"):
                run.profiles.add(str(rec["profile"]))
            run.commits.add((str(rec.get("commit") or "unknown"), bool(rec.get("dirty"))))
        elif rec.get("kind") == "adapter" and isinstance(rec.get("cases"), int):
            run.planned[rec["adapter"]] = max(run.planned.get(rec["adapter"], 0), rec["cases"])


def select_runs(results: Iterable[Result], meta: Iterable[Mapping[str, Any]] = ()) -> RunSelection:
    """The runs of loaded records (`load`) and the run each (generation, adapter) shows."""
    return RunSelection([*((None, m) for m in meta), *((None, r) for r in results)])


def _selection_of_files(paths: Iterable[str | os.PathLike]) -> RunSelection:
    return RunSelection(_iter_file_records(paths, True, lambda path, why: None))


def current_runs(paths: Iterable[str | os.PathLike]) -> dict[tuple[str, str], Run]:
    """The run the matrix shows for each (generation, adapter) of the result files and folders `paths`: the latest
    complete run of that adapter on that generation (see `RunSelection`). The generation is the matrix's column
    name (`interp (Triton 3.9.0)` where several Triton releases ran the interpreter); `Run.files` are the files
    that hold its records."""
    sel = _selection_of_files(paths)
    labels = lineage_labels(slot[:2] for slot in sel.chosen)
    return {(labels[slot[:2]], slot[2]): run for slot, run in sorted(sel.chosen.items())}


def partition_files(paths: Iterable[str | os.PathLike]) -> tuple[list[Path], list[Path]]:
    """(files of the current runs, files that hold only older runs) of the result files under `paths`. A file of
    other data (tuning sweeps, see `not_a_results_file`) is in neither: only the second list may be pruned."""
    sel = _selection_of_files(paths)
    current = {f for run in sel.chosen.values() for f in run.files}
    every = {f for run in sel.runs.values() for f in run.files}
    return sorted(current), sorted(every - current)
