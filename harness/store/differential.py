"""The differential runs (`python -m harness differential`) that results folders hold, read back for the support
matrix and the results index.

A run is a folder with `cases.jsonl` (one record per case: its class, both sides' verdicts, the case under `replay`)
and `summary.md` (whose first lines name the run, the GPU, the commit and the versions). Its records are not
verdicts: the results loader skips the file (its lines hold no "case"), and this module reads it instead. A run's
generation is its GPU side's; the latest run of a generation is the one whose run id (or, failing that, whose file)
is the newest.

Like a results file, `cases.jsonl` has a manifest the judge writes beside it (`harness.store.manifest`): a reader
passes a `manifest.Gate` and reads only the lines it admits; a run file left out is named in the gate's notes.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core import files as _files
from harness.store import manifest

#: every class a compared case gets, in the order reports list them
CLASSES: tuple[str, ...] = ("agree", "agree_within_contract", "interp_only_failure", "gpu_only_failure",
                            "nondeterministic", "both_fail", "not_comparable")
#: verdicts that judged a kernel's outputs (a case is compared when both sides have one)
JUDGED = ("pass", "fail")
#: a run's files
RUN_FILE = "cases.jsonl"
SUMMARY_FILE = "summary.md"
#: the keys every record has
_RECORD_KEYS = ("case_id", "adapter", "class", "interp", "gpu", "replay")
_STAMP = re.compile(r"\d{8}T\d{6}")


def is_record(d: Any) -> bool:
    """Whether a parsed JSONL line is a differential record."""
    return isinstance(d, dict) and all(k in d for k in _RECORD_KEYS) and d["class"] in CLASSES


def is_run_file(path: str | os.PathLike) -> bool:
    """Whether `path` is a differential run's `cases.jsonl` (by its name and its first record)."""
    path = Path(path)
    if path.name != RUN_FILE or not path.is_file():
        return False
    try:
        with open(path, encoding="utf-8") as fh:
            first = next((line for line in fh if line.strip()), "")
        return is_record(json.loads(first))
    except (OSError, ValueError):
        return False


@dataclass
class Run:
    """One differential run: its folder, id, GPU generation, when it ran (`stamp`, YYYYmmddTHHMMSS) and records;
    `header`: what its summary says of the device, commit and versions (keys absent when it does not say)."""

    folder: Path
    run_id: str
    generation: str
    stamp: str
    records: list[dict[str, Any]]
    header: dict[str, str] = field(default_factory=dict)

    def counts(self) -> Counter:
        return Counter(r["class"] for r in self.records)

    def adapters(self) -> list[str]:
        return sorted({r["adapter"] for r in self.records})


def _records(path: Path, gate: manifest.Gate) -> list[dict[str, Any]] | None:
    """The records of a run file among the lines its manifest vouches for (None: the file is left out); a line that
    is not one (a run killed mid-write) is left out too."""
    data = _files.read_bytes(path)
    usable = gate.admit(path, data)
    if usable is None:
        return None
    lines = data.split(b"\n")
    found = []
    for i in usable:
        try:
            d = json.loads(lines[i])
        except ValueError:
            continue
        if is_record(d):
            found.append(d)
    return found


def _header(folder: Path) -> dict[str, str]:
    """Run id, device, commit, versions and whether it was interrupted, from the run's summary.md."""
    try:
        text = (folder / SUMMARY_FILE).read_text(encoding="utf-8")
    except OSError:
        return {}
    found: dict[str, str] = {}
    patterns = {"run_id": r"^# Differential run (\S+)", "device": r"compiled on `[^`]*` \(([^)]*)\)",
                "commit": r"; commit (\w+(?: \(dirty\))?);", "versions": r"; (torch \S+, Triton \S+?)\.?$"}
    for key, pattern in patterns.items():
        if m := re.search(pattern, text, re.M):
            found[key] = m.group(1)
    if "**Interrupted**" in text:
        found["interrupted"] = "yes"
    return found


def read_run(path: str | os.PathLike, gate: manifest.Gate) -> Run | None:
    """The run whose `cases.jsonl` is `path`, from the lines `gate` admits (None when it leaves the file out)."""
    path = Path(path)
    records = _records(path, gate)
    if records is None:
        return None
    header = _header(path.parent)
    run_id = header.get("run_id") or path.parent.name
    m = _STAMP.search(run_id)
    stamp = m.group(0) if m else time.strftime("%Y%m%dT%H%M%S", time.localtime(path.stat().st_mtime))
    gens = Counter(str((r.get("gpu") or {}).get("generation") or "unknown") for r in records)
    generation = gens.most_common(1)[0][0] if gens else "unknown"
    return Run(path.parent, run_id, generation, stamp, records, header)


def find_runs(paths: Iterable[str | os.PathLike], gate: manifest.Gate) -> list[Run]:
    """The differential runs among `paths` (run files, or folders searched recursively) whose file `gate` admits,
    in no particular order."""
    found: set[Path] = set()
    for p in map(Path, paths):
        candidates = p.rglob(RUN_FILE) if p.is_dir() else [p]
        found.update(f.resolve() for f in candidates if is_run_file(f))
    return [run for f in sorted(found) if (run := read_run(f, gate)) is not None]


def latest(runs: Sequence[Run]) -> list[Run]:
    """The latest run of each generation, by generation."""
    best: dict[str, Run] = {}
    for run in runs:
        old = best.get(run.generation)
        if old is None or (run.stamp, run.run_id, str(run.folder)) > (old.stamp, old.run_id, str(old.folder)):
            best[run.generation] = run
    return [best[g] for g in sorted(best)]


#: the classes whose example case a report names, and where its failing side's verdict sits in a record (for a
#: nondeterministic case, whichever side failed)
_FAILING_SIDE = {"gpu_only_failure": "gpu", "interp_only_failure": "interp", "nondeterministic": None}


# -- per adapter --------------------------------------------------------------------------------------------------

def note(counts: Mapping[str, int], generation: str, examples: Mapping[str, str],
         unjudged: Mapping[str, Mapping[str, int]] | None = None) -> str:
    """What a kernel's counts per class mean, in plain words; `examples`: how to name the example case of each
    disagreeing class that has one (its id, or a link to its case file); `unjudged`: per side ("interp", "gpu"),
    the verdicts of its cases that judged no output (error, unsupported, ...) and how many."""
    parts = []
    if n := counts.get("gpu_only_failure", 0):
        parts.append(f"CPU verdicts do not cover its GPU code: {n} case(s) pass on the interpreter and fail on "
                     f"{generation} (a device-dependent code path, or a declaration only the GPU exposes); e.g. "
                     f"case {examples['gpu_only_failure']}")
    if n := counts.get("interp_only_failure", 0):
        parts.append(f"interpreter fidelity defect: {n} case(s) fail on the interpreter and pass on {generation}; "
                     f"e.g. case {examples['interp_only_failure']}")
    if n := counts.get("nondeterministic", 0):
        parts.append(f"the kernel's own nondeterminism: {n} case(s) fail on one side, whose two runs on the same "
                     f"inputs differ (it reads memory it never wrote, or races); e.g. case "
                     f"{examples['nondeterministic']}")
    if n := counts.get("both_fail", 0):
        parts.append(f"{n} case(s) fail on both")
    compared = sum(counts.values()) - counts.get("not_comparable", 0)
    n = counts.get("not_comparable", 0)
    if compared and not parts:
        parts.append(f"CPU verdicts hold on {generation}" + (f" in the {compared} case(s) compared" if n else ""))
    if n:
        sides = {"interp": "interpreter", "gpu": generation}
        why = "; ".join(f"{sides[k]}: " + ", ".join(f"{c} {v}" for v, c in sorted(unjudged[k].items()))
                        for k in sides if unjudged and unjudged.get(k))
        parts.append((f"{n} case(s) not compared" if compared else "nothing compared")
                     + f" ({why or 'a side did not judge the outputs'})")
    return "; ".join(parts)


def adapter_rows(run: Run) -> list[dict[str, Any]]:
    """One row per adapter of `run`: its cases, counts per class and an example record per disagreeing class (the
    first in the file)."""
    rows = []
    for name in run.adapters():
        recs = [r for r in run.records if r["adapter"] == name]
        counts = Counter(r["class"] for r in recs)
        examples = {cls: next(r for r in recs if r["class"] == cls) for cls in _FAILING_SIDE if counts[cls]}
        unjudged = {k: dict(Counter(str((r.get(k) or {}).get("verdict")) for r in recs
                                    if (r.get(k) or {}).get("verdict") not in JUDGED)) for k in ("interp", "gpu")}
        rows.append({"adapter": name, "generation": run.generation, "run": run.run_id, "cases": len(recs),
                     "counts": {c: counts[c] for c in CLASSES}, "unjudged": unjudged, "examples": examples})
    return rows


def classes_text(counts: Mapping[str, int]) -> str:
    """`775: 499 agree, 154 agree_within_contract, ...` (classes with no case left out)."""
    return f"{sum(counts.values())}: " + ", ".join(f"{counts[c]} {c}" for c in CLASSES if counts.get(c))


# -- the support matrix's section ---------------------------------------------------------------------------------



def case_file(record: Mapping[str, Any], cls: str, run: Run) -> dict[str, Any]:
    """A replayable case file (`harness.store.casefiles.read_case_file` reads it) of a record's failing side."""
    key = _FAILING_SIDE.get(cls, "gpu") or next(
        (k for k in ("interp", "gpu") if (record.get(k) or {}).get("verdict") == "fail"), "gpu")
    side = record.get(key) or {}
    return {"case": record["replay"], "generation": side.get("generation", ""), "verdict": side.get("verdict", ""),
            "declared": side.get("declared"), "reason": side.get("reason", ""),
            "differential": {"run": run.run_id, "class": cls, "case_id": record["case_id"],
                             **{k: (record.get(k) or {}).get("verdict") for k in ("interp", "gpu")}}}


def _where(folder: Path) -> str:
    """A run's folder as a reader names it: relative to the working directory, else nothing (no machine path)."""
    try:
        rel = os.path.relpath(folder)
    except ValueError:  # another drive
        return ""
    return "" if rel.startswith("..") else Path(rel).as_posix()


def _order(run: Run) -> tuple[int, str]:
    from harness.core.device import GENERATIONS

    return (GENERATIONS.index(run.generation) if run.generation in GENERATIONS else len(GENERATIONS), run.generation)


def build(runs: Sequence[Run], add_case_file: Any) -> dict[str, Any]:
    """The matrix's section: the latest run of each generation (`runs`) and one row per adapter and run, with a
    note whose example cases link to case files (`add_case_file(adapter, generation, content) -> path`)."""
    shown = sorted(latest(runs), key=_order)
    rows = []
    for run in shown:
        for row in adapter_rows(run):
            examples = row.pop("examples")
            files = {cls: add_case_file(row["adapter"], run.generation, case_file(rec, cls, run))
                     for cls, rec in examples.items()}
            links = {cls: f"[`{rec['case_id']}`]({files[cls]})" for cls, rec in examples.items()}
            rows.append({**row, "case_files": files,
                         "note": note(row["counts"], run.generation, links, row["unjudged"])})
    return {"runs": [{"run": run.run_id, "generation": run.generation, "folder": _where(run.folder),
                      "cases": len(run.records), **run.header} for run in shown],
            "rows": sorted(rows, key=lambda r: r["adapter"])}


def to_markdown(section: Mapping[str, Any], table: Any) -> list[str]:
    """The section's markdown lines (none without a run); `table(headers, rows)` draws a table."""
    if not section.get("runs"):
        return []
    runs = "; ".join(f"`{r['run']}` on {r['generation']}" + (f" ({r['device']})" if r.get("device") else "")
                     + (f", in `{r['folder']}`" if r.get("folder") else "")
                     + (" (interrupted: not every case was judged)" if r.get("interrupted") else "")
                     for r in section["runs"])
    rows = [[r["adapter"], r["generation"], str(r["cases"]), *[str(r["counts"][c] or "") for c in CLASSES],
             r["note"]] for r in section["rows"]]
    return ["## Interpreter against the GPU", "",
            "Each Triton kernel's cases judged by Triton's interpreter on the CPU and compiled on the GPU, on the same "
            "inputs (`python -m harness differential`); its CPU verdicts hold on that GPU where the two agree "
            "(`agree`: bit-identical outputs; `agree_within_contract`: both pass, the outputs differ within the "
            f"contract). The latest run of each generation: {runs}."
            + (" An example case links to its case file (`python -m harness replay FILE` runs it)."
               if any(r["case_files"] for r in section["rows"]) else ""), "",
            table(["Kernel", "Generation", "Cases", *CLASSES, "Note"], rows), ""]
