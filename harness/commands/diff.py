"""`python -m harness diff A B`: the matrix cells whose verdict differs between two result sets.

A and B are result files or folders (two generations, e.g. `results/interp` vs `results/sm90`, or two commits). A cell
is (adapter, feature cell); when both sides hold the same several generations, the generation is part of the cell too.
Within one side, the latest verdict of each case counts (a sweep's dead-worker marker loses to a real verdict). A cell's
verdict is the worst of its cases' (fail > error > pass > not-verifiable > unsupported > not-installed); two cells
differ when that differs or when a case run on both sides got different verdicts. For each differing cell the table
names case files to replay: the failing side's `cases/<id>.json` next to its results when it exists, otherwise one
written into `cases_dir`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.commands import SkippedFiles
from harness.store.results import Result, ResultsFileError, load, result_files

#: a cell's verdict is the first of these present among its cases
_SEVERITY = ("fail", "error", "pass", "not-verifiable", "unsupported", "not-installed")
_BAD = ("fail", "error")
CASES_PER_CELL = 2


@dataclass
class Side:
    """One result set: its label, the latest result per (generation, case id), and where each came from."""

    label: str
    results: dict[tuple[str, str], Result] = field(default_factory=dict)
    origin: dict[tuple[str, str], Path] = field(default_factory=dict)  # the folder of the results file

    @property
    def generations(self) -> list[str]:
        return sorted({g for g, _ in self.results})


def load_side(paths: str | os.PathLike | Sequence[str | os.PathLike], label: str | None = None,
              on_skip: SkippedFiles | None = None) -> Side:
    """Read result files/folders into a `Side` (raises ResultsFileError for a bad file); JSONL files of other data
    are told to `on_skip` (default: a warning each)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    side = Side(label or ", ".join(map(str, paths)))
    for root in map(Path, paths):
        refuse_case_file(root)
        for f in result_files([root]):  # .jsonl and .jsonl.gz
            for r in load([f], on_skip=on_skip)[0]:
                key = (r.generation, r.case.case_id)
                old = side.results.get(key)
                rank = ("marker" not in r.metrics, r.timestamp)
                if old is None or rank >= ("marker" not in old.metrics, old.timestamp):
                    side.results[key] = r
                    side.origin[key] = f.parent
    return side


_TAKES = "diff compares two result stores, each a JSONL file or a folder of them (e.g. results/interp results/sm90)"


def refuse_case_file(path: Path) -> None:
    """A case file (one case to re-run) given where result stores go: raises ResultsFileError saying what diff takes
    and what runs a case file, rather than calling a valid case file invalid JSONL. Any file that is one JSON
    document over several lines (a case file, a rendered matrix's `.json`) cannot be JSONL results."""
    if not path.is_file() or path.suffix != ".json":
        return
    from harness.store.casefiles import parse_case_file

    text = path.read_text(encoding="utf-8", errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return  # not one JSON document: read as results, which says what is wrong with it
    if "\n" not in text:
        return  # one line: a results file of one record, or read as results and refused there
    try:
        parse_case_file(data, validate=False)
    except (ValueError, KeyError, TypeError):
        raise ResultsFileError(f"{path} is a JSON document, not results: {_TAKES}") from None
    raise ResultsFileError(f"{path} is a case file (one case), not results: {_TAKES}; to re-run a case file use: "
                           f"python -m harness replay {path}")


def _cell_of(r: Result, with_generation: bool) -> tuple[str, ...]:
    cell = ", ".join(f"{k}={v}" for k, v in sorted(r.case.features.items()))
    return (r.adapter, cell, r.generation if with_generation else "")


def cell_verdict(verdicts: Iterable[str]) -> str:
    present = set(verdicts)
    return next((v for v in _SEVERITY if v in present), "not run")


def _summary(verdicts: Sequence[str]) -> str:
    if not verdicts:
        return "not run"
    counts = Counter(verdicts)
    worst = cell_verdict(verdicts)
    if len(counts) == 1:
        return f"{worst} ({len(verdicts)})"
    return f"{worst} ({counts[worst]} of {len(verdicts)}; " + ", ".join(
        f"{counts[v]} {v}" for v in _SEVERITY if v in counts and v != worst) + ")"


@dataclass
class CellDiff:
    adapter: str
    cell: str
    generation: str  # "" unless cells are compared per generation
    a: list[Result]
    b: list[Result]
    changed_cases: list[str]  # case ids run on both sides with different verdicts

    @property
    def a_verdict(self) -> str:
        return cell_verdict(r.verdict for r in self.a)

    @property
    def b_verdict(self) -> str:
        return cell_verdict(r.verdict for r in self.b)


@dataclass
class Diff:
    a: Side
    b: Side
    differing: list[CellDiff]
    only_a: list[CellDiff]
    only_b: list[CellDiff]
    same: int


def diff(a: Side, b: Side) -> Diff:
    """Compare two sides cell by cell."""
    per_gen = a.generations == b.generations and len(a.generations) > 1
    cells: dict[tuple[str, ...], tuple[list[Result], list[Result]]] = defaultdict(lambda: ([], []))
    for index, side in enumerate((a, b)):
        for r in side.results.values():
            cells[_cell_of(r, per_gen)][index].append(r)
    differing, only_a, only_b, same = [], [], [], 0
    for (adapter, cell, gen), (ra, rb) in sorted(cells.items()):
        va = {r.case.case_id: r.verdict for r in ra}
        vb = {r.case.case_id: r.verdict for r in rb}
        changed = sorted(c for c in va.keys() & vb.keys() if va[c] != vb[c])
        d = CellDiff(adapter, cell, gen, ra, rb, changed)
        if not rb:
            only_a.append(d)
        elif not ra:
            only_b.append(d)
        elif changed or d.a_verdict != d.b_verdict:
            differing.append(d)
        else:
            same += 1
    return Diff(a, b, differing, only_a, only_b, same)


def _failing_cases(d: CellDiff) -> list[tuple[str, Result]]:
    """The cases to replay for a differing cell: failing ones whose verdict changed first, then other failing."""
    picked: list[tuple[str, Result]] = []
    for which, rs in (("A", d.a), ("B", d.b)):
        changed = [r for r in rs if r.verdict in _BAD and r.case.case_id in d.changed_cases]
        picked += [(which, r) for r in changed]
    if not picked:
        for which, rs in (("A", d.a), ("B", d.b)):
            picked += [(which, r) for r in rs if r.verdict in _BAD]
    return picked[:CASES_PER_CELL]


def case_file_for(side: Side, r: Result, cases_dir: Path) -> Path:
    """The case file of a failing result: the one written next to its results, else a new one in `cases_dir`."""
    from harness.store.casefiles import write_case_file

    origin = side.origin.get((r.generation, r.case.case_id))
    if origin is not None:
        for folder in (origin, *origin.parents[:2]):
            existing = folder / "cases" / f"{r.case.case_id}.json"
            if existing.is_file():
                return existing
    return write_case_file(r, cases_dir)


def _rel(p: Path) -> str:
    try:
        return os.path.relpath(p)
    except ValueError:
        return str(p)


def _cell_text(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(result: Diff, *, cases_dir: str | os.PathLike = "results/diff-cases", list_all: bool = False) -> str:
    """The differing cells as a markdown table, with the replay commands of their failing cases."""
    a, b = result.a, result.b
    out = [f"# Verdict differences: A = {a.label} vs B = {b.label}", "",
           f"- A: {a.label} ({', '.join(a.generations) or 'no results'}; {len(a.results)} cases)",
           f"- B: {b.label} ({', '.join(b.generations) or 'no results'}; {len(b.results)} cases)", ""]
    rows = list(result.differing)
    if list_all:
        rows += result.only_a + result.only_b
    if not rows:
        out.append("No cell differs.")
    else:
        per_gen = any(d.generation for d in rows)
        head = ["adapter", "cell", *(["generation"] if per_gen else []), "A", "B", "replay"]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for d in rows:
            replays = []
            for which, r in _failing_cases(d):
                path = case_file_for(a if which == "A" else b, r, Path(cases_dir))
                replays.append(f"{which}: `python -m harness replay {_rel(path)}`")
            cols = [d.adapter, d.cell, *([d.generation] if per_gen else []),
                    _summary([r.verdict for r in d.a]), _summary([r.verdict for r in d.b]),
                    "<br>".join(replays) or "-"]
            out.append("| " + " | ".join(_cell_text(c) for c in cols) + " |")
    out += ["", f"{len(result.differing)} cell(s) differ, {result.same} agree; {len(result.only_a)} only in A, "
            f"{len(result.only_b)} only in B" + ("" if list_all or not (result.only_a or result.only_b)
                                                  else " (listed with --all)") + "."]
    return "\n".join(out) + "\n"


# -- command line -------------------------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> int:

    skipped = SkippedFiles(args.verbose)
    try:
        a, b = load_side(args.a, on_skip=skipped), load_side(args.b, on_skip=skipped)
        for side, path in ((a, args.a), (b, args.b)):
            if not side.results:  # an empty or wholly unreadable side would make "no cell differs" a lie
                raise ResultsFileError(f"no results in {path}")
    except (ResultsFileError, ValueError) as e:
        skipped.report()
        print(f"error: {e}", file=sys.stderr)
        return 2
    skipped.report()
    d = diff(a, b)
    text = to_markdown(d, cases_dir=args.cases_dir, list_all=args.all)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(f"wrote {args.out}: {len(d.differing)} cell(s) differ")
    else:
        print(text, end="")
    return 1 if d.differing else 0


def add_parser(sub: Any) -> None:
    """Add the command to the `python -m harness` subparsers."""
    d = sub.add_parser("diff", help="cells whose verdict differs between two result sets (markdown)",
                       description="Compare two result sets (files or folders: two generations, two commits) "
                       "cell by cell; print the differing cells as a markdown table with the case files to replay. "
                       "Exit 0 when none differ, 1 when some do, 2 for an unreadable input (a case file is not "
                       "results: replay runs it).")
    d.add_argument("a", help="results A (a JSONL file or a folder)")
    d.add_argument("b", help="results B (a JSONL file or a folder)")
    d.add_argument("--cases-dir", default="results/local/diff-cases",
                   help="where case files are written for failing cases that have none next to their results")
    d.add_argument("--all", action="store_true", help="also list cells run on one side only")
    d.add_argument("--out", help="write the markdown here instead of printing it")
    d.add_argument("--verbose", action="store_true", help="list the files of result folders that hold no verdicts")
    d.set_defaults(func=run)
