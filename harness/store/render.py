"""Render the kernel-feature support matrix from result files (markdown for people, JSON for tools).

Nothing is recomputed: every statement comes from recorded verdicts (and the metadata records the sweep writes
next to them). Several generations (and runs) merge; when the same case was judged more than once in the same
lineage, the latest verified verdict counts (a verdict recorded by the parent for a hung or dead worker yields to a
real one, and a not-verifiable or not-installed verdict never replaces a verified one: it only fills a cell that
nothing verified).

A lineage is a generation plus what decides its fidelity (`FIDELITY`): for `interp`, the Triton release whose
interpreter ran the kernels. Verdicts of two lineages are never merged into one: when a generation holds several,
each is shown as a generation of its own, named with it (`interp (Triton 3.9.0)`).

The rule for a feature value (a value of one axis of an op, for one adapter): the cases that exercised it are
those whose cell has that value and whose verdict is pass, fail or error (a clean rejection of an undeclared cell
and a not-verifiable case exercise nothing). The value is listed when every such case passed; it is listed with a
footnote (which generation, where, how many) when some failed; it is not listed when none passed or none ran.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from harness.core.case import OPS
from harness.core.device import GENERATIONS
from harness.core.text import one_line
from harness.store.results import Result, load

EXERCISED = ("pass", "fail", "error")
MAX_ROWS = 40  # rows per declared-vs-verified table in the markdown (the JSON has them all)
CASE_FILES_PER_NOTE = 2


# -- loading ------------------------------------------------------------------------------------------------------

#: verdicts that judged the case (a clean rejection included); not-verifiable and not-installed judged nothing
VERIFIED = ("pass", "fail", "error", "unsupported")
#: generation -> (device key, name) of what besides the generation decides a verdict there
FIDELITY: dict[str, tuple[str, str]] = {"interp": ("triton_version", "Triton")}


def lineage(r: Result) -> tuple[str, str]:
    """(generation, what decides its fidelity, e.g. the Triton release of an `interp` verdict; "" elsewhere)."""
    key = FIDELITY.get(r.generation)
    return r.generation, (str(r.device.get(key[0]) or "unknown") if key else "")


def _key(r: Result) -> tuple[str, str, str]:
    return (*lineage(r), r.case.to_json())


def _rank(r: Result) -> tuple[int, bool, float]:
    """Verified beats not-verifiable beats not-installed (a run that judged nothing says nothing about one that
    did), then a real verdict beats a parent's marker, then the latest wins."""
    tier = 2 if r.verdict in VERIFIED else 1 if r.verdict == "not-verifiable" else 0
    return tier, "marker" not in r.metrics, r.timestamp


def _cell_key(r: Result) -> tuple[str, str, str, str]:
    return (r.adapter, *lineage(r), json.dumps(r.case.features, sort_keys=True))


def dedupe(results: Iterable[Result]) -> list[Result]:
    """One result per (lineage, case), ranked by `_rank`; a not-verifiable case only fills a cell its lineage
    verified nothing of, a not-installed one only an adapter its lineage ran nothing of."""
    best: dict[tuple[str, str, str], Result] = {}
    for r in results:
        old = best.get(_key(r))
        if old is None or _rank(r) >= _rank(old):
            best[_key(r)] = r
    ran = {_cell_key(r)[:3] for r in best.values() if r.verdict != "not-installed"}
    verified = {_cell_key(r) for r in best.values() if r.verdict in VERIFIED}
    kept = [r for r in best.values() if not (r.verdict == "not-installed" and _cell_key(r)[:3] in ran)
            and not (r.verdict == "not-verifiable" and _cell_key(r) in verified)]
    return sorted(kept, key=lambda r: (r.adapter, r.generation, _key(r)))


def _by_lineage(rs: Sequence[Result]) -> list[Result]:
    """The results, those of a generation with several lineages labelled with theirs (`interp (Triton 3.9.0)`)."""
    seen: dict[str, set[str]] = defaultdict(set)
    for r in rs:
        seen[r.generation].add(lineage(r)[1])
    split = {g for g, found in seen.items() if len(found) > 1}
    return [dataclasses.replace(r, generation=f"{r.generation} ({FIDELITY[r.generation][1]} {lineage(r)[1]})")
            if r.generation in split else r for r in rs]


def _base(label: str) -> str:
    """The generation of a label (`interp (Triton 3.9.0)` -> `interp`)."""
    return label.split(" (", 1)[0]


def _gen_order(g: str) -> tuple[int, str]:
    base = _base(g)
    return (GENERATIONS.index(base) if base in GENERATIONS else len(GENERATIONS), g)


def _cell(v: Any) -> str:
    """Text safe inside a markdown table cell."""
    return " ".join(str(v).split()).replace("|", "\\|")


def _short(reason: str, n: int = 110) -> str:
    return one_line(re.sub(r"\s\(at [^()]*:\d+\)", "", reason), n)  # source locations are in the case files


def _display(value: str) -> str:
    return "N/A" if value == "-" else value


# -- the model (what the JSON holds and the markdown shows) --------------------------------------------------------

class _Notes:
    """Footnotes, one per distinct set of failing cases (values failing in the same cases share one)."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._by_key: dict[Any, int] = {}

    def get(self, key: Any) -> int | None:
        return self._by_key.get(key)

    def add(self, key: Any, text: str, case_files: Sequence[str]) -> int:
        self.items.append({"id": len(self.items) + 1, "text": text, "case_files": list(case_files)})
        self._by_key[key] = len(self.items)
        return len(self.items)


class _CaseFiles:
    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.files: dict[str, dict[str, Any]] = {}

    def add(self, r: Result) -> str:
        # names come from results files: never let one steer the path out of the folder
        label = re.sub(r"[^A-Za-z0-9.]+", "-", r.generation).strip("-")  # interp (Triton 3.9.0): interp-Triton-3.9.0
        stem = re.sub(r"[^A-Za-z0-9._-]", "_", f"{r.adapter}-{label}-{r.case.case_id}").lstrip(".")
        path = f"{self.folder}/{stem}.json"
        self.files[path] = {"case": r.case.to_dict(), "generation": _base(r.generation), "verdict": r.verdict,
                            "declared": r.declared, "reason": r.reason}
        return path


def _kind(info: Mapping[str, Any]) -> str:
    if info.get("source") == "reference":
        return "reference"
    return "test_aid" if info.get("test_aid") else "kernel"


def _axes_of(op: str, info: Mapping[str, Any], results: Sequence[Result]) -> list[dict[str, Any]]:
    """Axis names, titles and value order: from the sweep's metadata, else the op spec, else the records."""
    if info.get("axes"):
        return [dict(a) for a in info["axes"]]
    try:
        from harness import ops

        return [{"name": a.name, "title": a.title, "values": list(a.values)} for a in ops.get(op).axes]
    except ValueError:
        names: list[str] = []
        for r in results:
            names += [k for k in r.case.features if k not in names]
        return [{"name": n, "title": n, "values": sorted({r.case.features.get(n, "") for r in results})}
                for n in names]


def _where(failing: Sequence[Result], passing: Sequence[Result], axes: Sequence[Mapping[str, Any]],
           skip: str) -> str:
    """What the failing cases share that the passing ones lack (axis values, sizes, routing pattern).

    The smallest set (one attribute, else two) that every failing case has and no passing case has all of is the
    cause as far as the cases tell ("bias = Y, apply weight on input = Y"). Without one, the shared attributes that
    the fewest passing cases have, rarest first."""
    if not passing:
        return ""
    shared: list[tuple[str, Callable[[Result], bool]]] = []
    for a in axes:
        if a["name"] == skip:
            continue
        vals = {r.case.features.get(a["name"]) for r in failing}
        if len(vals) == 1:
            v = next(iter(vals))
            shared.append((f"{a['title']} = {_display(str(v))}",
                           lambda r, n=a["name"], v=v: r.case.features.get(n) == v))
    n_features = len(shared)  # feature values first: sizes of one failing case are unique, so they always
    keys = set.intersection(*(set(r.case.shapes) for r in failing))  # separate, yet rarely are the cause
    for k in sorted(keys):
        vals = {r.case.shapes[k] for r in failing}
        if len(vals) == 1:
            v = next(iter(vals))
            shared.append((f"{k} = {v}", lambda r, k=k, v=v: r.case.shapes.get(k) == v))
    routes = {r.case.routing for r in failing}
    if len(routes) == 1:
        v = next(iter(routes))
        shared.append((f"routing {v}", lambda r, v=v: r.case.routing == v))
    for pool in (shared[:n_features], shared):
        for size in (1, 2):
            for combo in itertools.combinations(pool, size):
                if not any(all(has(p) for _, has in combo) for p in passing):
                    return ", ".join(text for text, _ in combo)
    # no small set separates them: the shared attributes the passing cases have least often
    share = [(sum(has(p) for p in passing), i, text) for i, (text, has) in enumerate(shared)]
    return ", ".join(text for n, _, text in sorted(share)[:4] if n < len(passing))


def _selection_text(sel: Mapping[str, Mapping[str, Any]], infos: Mapping[str, Mapping[str, Any]],
                    run_meta: Sequence[Mapping[str, Any]]) -> str:
    """How the cells of one generation's run(s) were chosen, per op."""
    if not sel:
        return "not recorded"
    per_op: dict[str, list[tuple[str, Mapping[str, Any]]]] = defaultdict(list)
    for a, s in sel.items():
        per_op[infos.get(a, {}).get("op", a)].append((a, s))
    pairwise = []
    for op in sorted(per_op):
        ss = [s for _, s in per_op[op] if s.get("selection") == "pairwise"]
        if ss:
            lo, hi = min(s["cells"] for s in ss), max(s["cells"] for s in ss)
            text = f"{op} {lo if lo == hi else f'{lo}-{hi}'} of {ss[0]['cells_total']}"
            # runs of different profiles merged: say which adapters had every cell
            every = sorted(a for a, s in per_op[op] if s.get("selection") != "pairwise")
            if every:
                text += f" (every cell for {', '.join(every)})"
            pairwise.append(text)
    limit = next((m.get("quick_all_cells") for m in run_meta if m.get("quick_all_cells")), None)
    cases = sorted({m.get("cases_per_cell") for m in run_meta if m.get("cases_per_cell")})
    per_case = f"; up to {', '.join(map(str, cases))} cases per cell" if cases else ""
    if not pairwise:
        return "every cell" + per_case
    bigger = f" (ops with more than {limit} cells)" if limit else ""
    return "pairwise covering set" + bigger + ": " + ", ".join(pairwise) + "; every cell of the others" + per_case


def _status(exercised: int, passed: int) -> str:
    if exercised == 0:
        return "not run"
    return "pass" if passed == exercised else "partial" if passed else "fail"


def _fail_text(by_gen: Mapping[str, tuple[list[Result], list[Result]]], axes: Sequence[Mapping[str, Any]],
               skip: str, files: _CaseFiles, exercised: Mapping[str, int]) -> tuple[str, list[str]]:
    parts, paths = [], []
    for gen in sorted(by_gen, key=_gen_order):
        failing, passing = by_gen[gen]
        if not failing:
            continue
        where = _where(failing, passing, axes, skip)
        n = exercised.get(gen, len(failing) + len(passing))
        parts.append(f"fails {'for ' + where + ' ' if where else ''}on {gen}: {len(failing)} of {n} cases "
                     f"({_short(failing[0].reason, 90)})")
        paths += [files.add(r) for r in failing[:CASE_FILES_PER_NOTE]]
    return "; ".join(parts), paths


def _collect_meta(meta: Sequence[Mapping[str, Any]]) -> tuple[dict[str, dict[str, Any]],
                                                               dict[tuple[str, str], dict[str, Any]]]:
    """Adapter metadata merged per adapter, and the recorded cell selection per (adapter, generation)."""
    infos: dict[str, dict[str, Any]] = {}
    selection: dict[tuple[str, str], dict[str, Any]] = {}
    for m in meta:
        if m.get("kind") == "adapter":
            infos.setdefault(m["adapter"], {}).update({k: v for k, v in m.items() if v not in (None, "", [], {})})
            if m.get("selection"):
                selection[(m["adapter"], m.get("generation", ""))] = {
                    k: m.get(k) for k in ("profile", "selection", "cells", "cells_total", "cases")}
    return infos, selection


def _commits(dev_list: Sequence[Mapping[str, Any]], run_meta: Sequence[Mapping[str, Any]]) -> list[str]:
    """The short commits the devices ran, falling back to the run's record where a device did not know it."""
    commits = set()
    for d in dev_list:
        c = d.get("commit") or "unknown"
        if c == "unknown":
            c = next((m.get("commit") for m in run_meta if m.get("commit") not in (None, "unknown")), c)
        commits.add(c[:10] + (" (dirty)" if d.get("dirty") else ""))
    return sorted(commits)


def _libraries(recs: Sequence[Result]) -> list[str]:
    """The library versions whose kernels ran in `recs` (not those of adapters unsupported or missing there)."""
    return sorted({str(r.metrics["library"]) for r in recs if r.metrics.get("library") and r.verdict in EXERCISED})


def _generation_info(g: str, rs: Sequence[Result], runs: Sequence[Mapping[str, Any]],
                     selection: Mapping[tuple[str, str], Mapping[str, Any]],
                     infos: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Provenance of one generation: devices, versions, commits, profiles, cell selection and verdict counts."""
    recs = [r for r in rs if r.generation == g]
    devs = {json.dumps(r.device, sort_keys=True) for r in recs}
    dev_list = [json.loads(d) for d in sorted(devs)]
    run_meta = [m for m in runs if m.get("generation") == g]
    sel = {a: s for (a, gg), s in selection.items() if gg == g}
    sel_text = _selection_text(sel, infos, run_meta)
    profiles = sorted({s.get("profile") for s in sel.values() if s.get("profile")}
                      | {m["profile"] for m in run_meta if m.get("profile")})
    names = sorted({(d.get("device_name") or d.get("device") or "?")
                    + (f" (sm_{d['capability'][0]}{d['capability'][1]})" if d.get("capability") else "")
                    + (", Triton interpreter" if _base(g) == "interp" else "") for d in dev_list})
    return {
        "generation": g, "devices": names,
        "torch": sorted({str(d.get("torch_version")) for d in dev_list}),
        "triton": sorted({str(d.get("triton_version")) for d in dev_list}),
        "python": sorted({str(d.get("python_version")) for d in dev_list}),
        "commits": _commits(dev_list, run_meta), "profiles": profiles or ["not recorded"], "selection": sel_text,
        "libraries": _libraries(recs),
        "verdicts": len(recs), "counts": dict(sorted(Counter(r.verdict for r in recs).items())),
    }


def _adapter_info(name: str, infos: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any]:
    """The adapter's recorded metadata (reference adapters are known by name when none was recorded)."""
    info = infos.get(name, {})
    if not info and name.startswith("reference-"):  # records older than the sweep's metadata
        info = {"source": "reference"}
    return info


def _declared_values(info: Mapping[str, Any], axes: Sequence[Mapping[str, Any]],
                     recs: Sequence[Result]) -> dict[str, set[Any]]:
    """The values the adapter declares, per axis."""
    if info.get("support"):
        return {a["name"]: set(info["support"].get(a["name"], ())) for a in axes}
    # older records: a value is declared when some declared case used it
    return {a["name"]: {r.case.features.get(a["name"]) for r in recs if r.declared} for a in axes}


def _per_generation(recs: Sequence[Result], gens: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The adapter's status, exercised and passed counts, and verdict counts on each generation."""
    per_gen = {}
    for g in gens:
        gr = [r for r in recs if r.generation == g]
        ge = [r for r in gr if r.verdict in EXERCISED]
        gp = sum(r.verdict == "pass" for r in ge)
        st = _status(len(ge), gp)
        if not gr:
            st = "not run"
        elif all(r.verdict == "not-installed" for r in gr):
            st = "not installed"
        elif not ge and any(r.verdict == "not-verifiable" for r in gr):
            st = "not verifiable"
        recorded = [r for r in ge if r.verdict == "pass" and "exercised" in r.metrics]
        per_gen[g] = {"status": st, "exercised": len(ge), "passed": gp,
                      # passing cases that tested something (None: verdicts from before this was recorded)
                      "nonvacuous": sum(not r.metrics["exercised"].get("vacuous", False) for r in recorded)
                      if recorded else None,
                      "counts": dict(sorted(Counter(r.verdict for r in gr).items()))}
    return per_gen


def _value_note(name: str, vr: Sequence[Result], ex: Sequence[Result], axes: Sequence[Mapping[str, Any]],
                gens: Sequence[str], per_gen: Mapping[str, Mapping[str, Any]], notes: _Notes,
                files: _CaseFiles) -> int:
    """The footnote of a partly failing value (values failing in the same cases share one)."""
    failing = [r for r in vr if r.verdict != "pass"]
    # described against every passing case of the adapter on the same generation
    split = {g: ([r for r in failing if r.generation == g],
                 [r for r in ex if r.generation == g and r.verdict == "pass"]) for g in gens}
    key = (name, tuple(_key(r) for r in failing))
    note = notes.get(key)
    if note is None:
        text, paths = _fail_text(split, axes, "", files, {g: s["exercised"] for g, s in per_gen.items()})
        note = notes.add(key, text, paths)
    return note


def _axes_out(name: str, kind: str, axes: Sequence[Mapping[str, Any]], recs: Sequence[Result],
              gens: Sequence[str], declared_vals: Mapping[str, set[Any]], per_gen: Mapping[str, Mapping[str, Any]],
              notes: _Notes, files: _CaseFiles) -> list[dict[str, Any]]:
    """Per axis, each swept value's status, declaration, counts (overall and per generation) and footnote."""
    ex = [r for r in recs if r.verdict in EXERCISED]
    axes_out = []
    for a in axes:
        order = list(a.get("values") or [])
        order += sorted({r.case.features.get(a["name"]) for r in recs} - set(order) - {None})
        values = []
        for v in order:
            vr = [r for r in ex if r.case.features.get(a["name"]) == v]
            if not vr and not any(r.case.features.get(a["name"]) == v for r in recs):
                continue  # never swept (an inapplicable or unselected value): nothing to say
            passed = [r for r in vr if r.verdict == "pass"]
            st = _status(len(vr), len(passed))
            entry: dict[str, Any] = {
                "value": v, "status": st, "declared": v in declared_vals.get(a["name"], set()),
                "exercised": len(vr), "passed": len(passed),
                "by_generation": {g: [sum(r.verdict == "pass" for r in vr if r.generation == g),
                                      sum(r.generation == g for r in vr)] for g in gens
                                  if any(r.generation == g for r in vr)},
                "note": None,
            }
            if st == "partial" and kind != "reference":
                entry["note"] = _value_note(name, vr, ex, axes, gens, per_gen, notes, files)
            values.append(entry)
        axes_out.append({"name": a["name"], "title": a["title"], "values": values})
    return axes_out


def _failing_rows(name: str, ex: Sequence[Result], axes: Sequence[Mapping[str, Any]],
                  files: _CaseFiles) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rows of cells with a failing case: (declared cells, undeclared cells that were not rejected cleanly)."""
    claimed_failing: list[dict[str, Any]] = []
    unclean: list[dict[str, Any]] = []
    groups: dict[tuple[str, str, bool], list[Result]] = defaultdict(list)
    for r in ex:
        if r.verdict != "pass":
            groups[(r.generation, json.dumps(r.case.features, sort_keys=True), r.declared)].append(r)
    for (g, feats, declared), bad in sorted(groups.items(), key=lambda t: (_gen_order(t[0][0]), t[0][1:])):
        total = sum(1 for r in ex if r.generation == g and json.dumps(r.case.features, sort_keys=True) == feats)
        cell = {a["name"]: bad[0].case.features[a["name"]] for a in axes if a["name"] in bad[0].case.features}
        cell.update({k: v for k, v in bad[0].case.features.items() if k not in cell})
        row = {"adapter": name, "generation": g, "cell": cell, "failing": len(bad), "cases": total,
               "reason": _short(bad[0].reason), "case_file": files.add(bad[0])}
        (claimed_failing if declared else unclean).append(row)
    return claimed_failing, unclean


def _working_rows(name: str, ex: Sequence[Result], axes: Sequence[Mapping[str, Any]],
                  axes_out: Sequence[Mapping[str, Any]], declared_vals: Mapping[str, set[Any]]) -> list[dict[str, Any]]:
    """Rows of what works but is not declared: undeclared values, and cells the adapter's `requires` excludes."""
    working = []
    for ax in axes_out:
        for v in ax["values"]:
            if not v["declared"] and v["status"] == "pass":
                working.append({"adapter": name, "feature": f"{ax['title']} = {_display(v['value'])}",
                                "generations": sorted(v["by_generation"], key=_gen_order), "cases": v["passed"]})
    undeclared_cells = [r for r in ex if not r.declared and r.verdict == "pass" and all(
        r.case.features.get(a["name"]) in declared_vals.get(a["name"], set()) for a in axes)]
    if undeclared_cells:
        cells = {json.dumps(r.case.features, sort_keys=True) for r in undeclared_cells}
        working.append({"adapter": name, "feature": f"{len(cells)} cell(s) of declared values that the adapter "
                        "excludes (its `requires` rule)",
                        "generations": sorted({r.generation for r in undeclared_cells}, key=_gen_order),
                        "cases": len(undeclared_cells)})
    return working


def _unverifiable_rows(name: str, recs: Sequence[Result]) -> list[dict[str, Any]]:
    """Rows of not-verifiable cases, counted per (generation, reason)."""
    nv: dict[tuple[str, str], int] = Counter()
    for r in recs:
        if r.verdict == "not-verifiable":
            nv[(r.generation, r.reason)] += 1
    return [{"adapter": name, "generation": g, "cases": n, "reason": _short(reason, 160)}
            for (g, reason), n in sorted(nv.items(), key=lambda t: (_gen_order(t[0][0]), t[0][1]))]


def _not_installed_rows(name: str, recs: Sequence[Result]) -> list[dict[str, Any]]:
    """Per generation, the cases of an adapter whose library was missing, with the reason (how to install it)."""
    rows: dict[str, list[Result]] = defaultdict(list)
    for r in recs:
        if r.verdict == "not-installed":
            rows[r.generation].append(r)
    return [{"adapter": name, "generation": g, "cases": len(rs), "reason": rs[0].reason} for g, rs in rows.items()]


def build(results: Iterable[Result], meta: Iterable[Mapping[str, Any]] = (), *, command: str = "",
          sources: Sequence[str] = (), cases_folder: str = "SUPPORT_MATRIX.cases") -> dict[str, Any]:
    """The support matrix as a JSON-serializable dict (`to_markdown` renders it)."""
    rs = _by_lineage(dedupe(results))
    meta = list(meta)
    runs = [m for m in meta if m.get("kind") == "run"]
    infos, selection = _collect_meta(meta)
    notes, files = _Notes(), _CaseFiles(cases_folder)
    by_adapter: dict[str, list[Result]] = defaultdict(list)
    for r in rs:
        by_adapter[r.adapter].append(r)
    gens = sorted({r.generation for r in rs}, key=_gen_order)
    generations = [_generation_info(g, rs, runs, selection, infos) for g in gens]

    adapters_out = []
    claimed_failing, unclean, working, unverifiable, not_installed = [], [], [], [], []
    for name in sorted(by_adapter):
        recs = by_adapter[name]
        op = recs[0].case.op
        info = _adapter_info(name, infos)
        kind = _kind(info)
        axes = _axes_of(op, info, recs)
        declared_vals = _declared_values(info, axes, recs)
        ex = [r for r in recs if r.verdict in EXERCISED]
        per_gen = _per_generation(recs, gens)
        # notes and case files are numbered in the order met: value footnotes first, then failing rows
        axes_out = _axes_out(name, kind, axes, recs, gens, declared_vals, per_gen, notes, files)
        adapters_out.append({"name": name, "op": op, "op_title": info.get("op_title", op), "kind": kind,
                             "source": info.get("source", ""), "description": info.get("description", ""),
                             "libraries": _libraries(recs),
                             "generations": per_gen, "axes": axes_out})
        if kind == "reference":
            continue
        claimed, bad = _failing_rows(name, ex, axes, files)
        claimed_failing += claimed
        unclean += bad
        working += _working_rows(name, ex, axes, axes_out, declared_vals)
        unverifiable += _unverifiable_rows(name, recs)
        not_installed += _not_installed_rows(name, recs)

    return {
        "title": "Kernel-feature support matrix",
        "command": command,
        "sources": list(sources),
        "verdicts": len(rs),
        "generations": generations,
        "adapters": adapters_out,
        "declared_vs_verified": {"claimed_but_failing": claimed_failing, "undeclared_not_rejected": unclean,
                                 "working_not_claimed": working, "not_verifiable": unverifiable,
                                 "not_installed": not_installed},
        "footnotes": notes.items,
        "case_files": files.files,
    }


# -- markdown -----------------------------------------------------------------------------------------------------

def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    return tabulate([[_cell(c) for c in row] for row in rows], headers=[_cell(h) for h in headers],
                    tablefmt="github", disable_numparse=True)


def _sup(note: int | None) -> str:
    return f"<sup>{note}</sup>" if note else ""


def _values_cell(ax: Mapping[str, Any]) -> str:
    shown = [f"{_display(v['value'])}{'' if v['declared'] else '*'}{_sup(v['note'])}"
             for v in ax["values"] if v["status"] in ("pass", "partial")]
    return ", ".join(shown) if shown else "(none)"


def _gens_cell(a: Mapping[str, Any]) -> str:
    found = []
    for g, s in a["generations"].items():
        backed = "" if s.get("nonvacuous") is None else f"{s['nonvacuous']} non-vacuous"
        if s["status"] == "pass":
            found.append(f"{g} ({backed})" if backed else g)
        elif s["status"] == "partial":
            found.append(f"{g} (partial: {s['passed']} of {s['exercised']}" + (f"; {backed})" if backed else ")"))
    return ", ".join(found) if found else "(none)"


def _name_cell(a: Mapping[str, Any]) -> str:
    return a["name"] + (" (test aid)" if a["kind"] == "test_aid" else "")


def _source_cell(a: Mapping[str, Any]) -> str:
    text = f"`{a['source']}`" if a["source"] else "(not recorded)"
    return text + (f" ({', '.join(a['libraries'])})" if a.get("libraries") else "")


def _notes_block(notes: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = []
    for n in notes:
        files = ", ".join(f"[{Path(p).stem.rsplit('-', 1)[-1]}]({p})" for p in n["case_files"])
        lines.append(f"{n['id']}. {n['text']}" + (f"; case files: {files}" if files else ""))
    return lines


def _op_section(title: str, op_adapters: Sequence[Mapping[str, Any]], notes: Mapping[int, Mapping[str, Any]],
                level: str = "##") -> list[str]:
    axes_titles = [ax["title"] for ax in op_adapters[0]["axes"]]
    def values(a: Mapping[str, Any]) -> list[str]:
        if not any(s["exercised"] for s in a["generations"].values()):
            if any(s["status"] == "not installed" for s in a["generations"].values()):
                return ["not installed"] * len(a["axes"])  # its library is missing where it was run
            return ["not run"] * len(a["axes"])  # e.g. a CUDA-only kernel seen on interp only
        return [_values_cell(ax) for ax in a["axes"]]

    rows = [[_name_cell(a), *values(a), _gens_cell(a), _source_cell(a)] for a in op_adapters]
    used = sorted({v["note"] for a in op_adapters for ax in a["axes"] for v in ax["values"]
                   if v["note"] and v["status"] in ("pass", "partial")})
    out = [f"{level} {title}", "", _table(["Kernel", *axes_titles, "Generations verified", "Source"], rows), ""]
    if used:
        out += [*_notes_block([notes[i] for i in used]), ""]
    return out


def _header(model: Mapping[str, Any]) -> list[str]:
    """Title, how to regenerate, the results read, the generations' provenance and how to read the tables."""
    out = [f"# {model['title']}", "",
           "Generated from recorded verdicts; do not edit by hand. Regenerate with (`--out PATH` picks where it is "
           "written):", "",
           "```bash", model["command"] or "python -m harness matrix", "```", ""]
    if model["sources"]:
        out += ["Results read: " + ", ".join(f"`{s}`" for s in model["sources"]) + f" ({model['verdicts']} verdicts).",
                ""]
    out += [_table(["Generation", "Device", "torch", "Triton", "Libraries", "Commit", "Profile", "Cell selection",
                    "Verdicts"],
                   [[g["generation"], "; ".join(g["devices"]), ", ".join(g["torch"]), ", ".join(g["triton"]),
                     ", ".join(g.get("libraries") or ["-"]), ", ".join(g["commits"]), ", ".join(g["profiles"]),
                     g["selection"],
                     str(g["verdicts"])] for g in model["generations"]]), ""]
    out += ["How to read the tables: a feature value is listed when every case that exercised it passed (on every "
            "generation that ran it); a value with a footnote passed in some cases and failed in others; a value "
            "that never passed, or never ran (rejected cleanly as undeclared, or not verifiable), is not listed. "
            "`*` marks a value that works but that the kernel does not declare; \"N non-vacuous\" counts the passing "
            "cases whose expected output was not all zeros or empty (cases that could have failed). Quick runs sweep "
            "a pairwise covering set of the cells of large ops (every pair of values of two axes appears in some "
            "cell), full runs every cell; not-applicable combinations are never swept or shown. A generation whose "
            "verdicts come from several Triton releases of the interpreter is shown once per release (`interp "
            "(Triton 3.9.0)`): the interpreter's fidelity depends on it.", ""]
    return out


def _kernel_sections(kernels: Sequence[Mapping[str, Any]], notes: Mapping[int, Mapping[str, Any]]) -> list[str]:
    """The experts kernels' table, then one table per stage op (in OPS order, unknown ops last)."""
    experts = [a for a in kernels if a["op"] == "experts"]
    out = _op_section("Experts kernels", experts, notes) if experts else ["## Experts kernels", "", "(none)", ""]
    stage_ops = [op for op in OPS if op != "experts" and any(a["op"] == op for a in kernels)]
    stage_ops += sorted({a["op"] for a in kernels} - set(OPS))
    out += ["## Stage kernels", ""]
    if not stage_ops:
        out += ["(none)", ""]
    for op in stage_ops:
        group = [a for a in kernels if a["op"] == op]
        out += _op_section(f"{group[0]['op_title']} (`{op}`)", group, notes, level="###")
    return out


def _count_cell(s: Mapping[str, Any], fail: str) -> str:
    """One generation's status with its counts (`fail` is the word shown when some case failed)."""
    if s["status"] == "pass":
        return f"pass ({s['exercised']})"
    if s["status"] in ("fail", "partial"):
        return f"{fail} ({s['exercised'] - s['passed']} of {s['exercised']})"
    return s["status"]


def _generations_section(kernels: Sequence[Mapping[str, Any]], gens: Sequence[str]) -> list[str]:
    """Each kernel's status and counts per generation."""
    out = ["## Generations", ""]
    if kernels:
        out += [_table(["Kernel", "Op", *gens],
                       [[_name_cell(a), a["op"], *[_count_cell(a["generations"][g], "fail") for g in gens]]
                        for a in kernels]),
                "", "Counts are cases that ran (pass, fail or error); clean rejections of undeclared cells and "
                "not-verifiable cases are not counted.", ""]
    else:
        out += ["(no kernel results)", ""]
    return out


def _capped(rows: list[list[Any]], total: int) -> list[list[Any]]:
    """The rows, with a last row saying how many more the JSON has when there were more than MAX_ROWS."""
    return rows + ([[f"... and {total - MAX_ROWS} more (see the JSON)"] + [""] * (len(rows[0]) - 1)]
                   if total > MAX_ROWS else [])


def _cell_text(cell: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in cell.items())


def _bug_tables(dv: Mapping[str, Any]) -> list[str]:
    """The declared cells that fail, and the undeclared cells that were not rejected cleanly."""
    out: list[str] = []
    for key, title, blurb in (
            ("claimed_but_failing", "Claimed but failing (bugs)", "Declared cells with a failing or erroring case."),
            ("undeclared_not_rejected", "Not claimed, and not rejected cleanly (bugs)",
             "Undeclared cells must be rejected with an exception; these returned wrong results, crashed or hung.")):
        rows = dv[key]
        out += [f"### {title}", "", blurb, ""]
        if rows:
            body = [[r["adapter"], r["generation"], _cell_text(r["cell"]), f"{r['failing']} of {r['cases']}",
                     r["reason"], f"[case]({r['case_file']})"] for r in rows[:MAX_ROWS]]
            out += [_table(["Kernel", "Generation", "Cell", "Failing", "First reason", "Case file"],
                           _capped(body, len(rows))), ""]
        else:
            out += ["None.", ""]
    return out


def _declared_section(dv: Mapping[str, Any]) -> list[str]:
    """Declared vs verified: the bug tables, what works unclaimed, and what could not be verified."""
    out = ["## Declared vs verified", "", *_bug_tables(dv)]
    out += ["### Working but not claimed", ""]
    if dv["working_not_claimed"]:
        out += [_table(["Kernel", "Feature", "Generations", "Cases passed"],
                       [[r["adapter"], r["feature"], ", ".join(r["generations"]), str(r["cases"])]
                        for r in dv["working_not_claimed"][:MAX_ROWS]]), ""]
    else:
        out += ["None.", ""]
    out += ["### Not installed here", "",
            "Adapters of third-party libraries that were missing where these verdicts were recorded: nothing of "
            "theirs ran (install the library and run again).", ""]
    if dv.get("not_installed"):
        out += [_table(["Kernel", "Generation", "Cases", "Reason"],
                       [[r["adapter"], r["generation"], str(r["cases"]), r["reason"]]
                        for r in dv["not_installed"][:MAX_ROWS]]), ""]
    else:
        out += ["None.", ""]
    out += ["### Not verifiable here", ""]
    if dv["not_verifiable"]:
        out += [_table(["Kernel", "Generation", "Cases", "Reason"],
                       [[r["adapter"], r["generation"], str(r["cases"]), r["reason"]]
                        for r in dv["not_verifiable"][:MAX_ROWS]]), ""]
    else:
        out += ["None.", ""]
    return out


def _oracle_section(refs: Sequence[Mapping[str, Any]], gens: Sequence[str]) -> list[str]:
    """The reference adapters' status per generation (any failure there is the oracle's)."""
    out = ["## Oracle self-test (reference adapters)", "",
           "The oracle run through the full harness path (inputs, integrity checks, comparisons); every case must "
           "pass.", ""]
    if refs:
        out += [_table(["Adapter", "Op", *gens],
                       [[a["name"], a["op"], *[_count_cell(a["generations"][g], "FAIL") for g in gens]]
                        for a in refs]), ""]
    else:
        out += ["(no reference results)", ""]
    return out


def to_markdown(model: Mapping[str, Any]) -> str:
    """The markdown document for a model built by `build`."""
    gens = [g["generation"] for g in model["generations"]]
    notes = {n["id"]: n for n in model["footnotes"]}
    adapters = model["adapters"]
    kernels = [a for a in adapters if a["kind"] != "reference"]
    refs = [a for a in adapters if a["kind"] == "reference"]
    out = _header(model)
    out += _kernel_sections(kernels, notes)
    out += _generations_section(kernels, gens)
    out += _declared_section(model["declared_vs_verified"])
    out += _oracle_section(refs, gens)
    return "\n".join(out).rstrip() + "\n"


def render_files(paths: Sequence[str | os.PathLike], out: str | os.PathLike, *, command: str = "",
                 strict: bool = True, shown_sources: Sequence[str] | None = None,
                 on_skip: Callable[[Path, str], None] | None = None,
                 on_kept: Callable[[list[Path]], None] | None = None) -> tuple[Path, Path, int]:
    """Render result files into `out` (markdown), `out` with .json, and the failing cases' files; returns
    (markdown path, JSON path, number of verdicts). JSONL files of other data under the given folders are skipped
    (`on_skip(path, why)`, default a warning). Case files the previous render into `out` wrote and this one does
    not are removed, unless git tracks them: those are kept and passed to `on_kept`."""
    results, meta = load(paths, strict=strict, on_skip=on_skip)
    if not results:
        raise ValueError(f"no results in {', '.join(map(str, paths))}")
    md_path = Path(out)
    folder = md_path.stem + ".cases"
    sources = list(shown_sources) if shown_sources is not None else [str(p) for p in paths]
    model = build(results, meta, command=command, sources=sources, cases_folder=folder)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    json_path = md_path.with_suffix(".json")
    case_dir = md_path.parent / folder
    previous = _previous_case_files(json_path, case_dir)
    md_path.write_text(to_markdown(model), encoding="utf-8")
    json_path.write_text(json.dumps(model, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    written = set()
    for rel, record in model["case_files"].items():
        p = md_path.parent / rel
        if not p.resolve().is_relative_to(case_dir.resolve()):
            raise ValueError(f"case file {rel!r} would be written outside {case_dir}")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        written.add(p.resolve())
    kept = _remove_stale(sorted(previous - written), case_dir)
    if kept and on_kept is not None:
        on_kept(kept)
    return md_path, json_path, model["verdicts"]


def _previous_case_files(json_path: Path, case_dir: Path) -> set[Path]:
    """The case files the render that wrote `json_path` wrote (only those inside `case_dir`: the JSON could have
    been edited by anyone)."""
    try:
        listed = json.loads(json_path.read_text(encoding="utf-8")).get("case_files", {})
    except (OSError, ValueError, AttributeError):
        return set()
    inside = case_dir.resolve()
    found = {(json_path.parent / rel).resolve() for rel in listed if isinstance(rel, str)}
    return {p for p in found if p.suffix == ".json" and p.parent == inside}


def _remove_stale(stale: Sequence[Path], case_dir: Path) -> list[Path]:
    """Remove stale case files of an earlier render that git does not track; return the tracked ones (kept)."""
    if not stale:
        return []
    tracked = _git_tracked(case_dir)
    if tracked is None:  # cannot tell what is committed: remove nothing
        return [p for p in stale if p.exists()]
    kept = []
    for p in stale:
        if p.name in tracked:
            kept.append(p)
        else:
            p.unlink(missing_ok=True)
    return kept


def _git_tracked(folder: Path) -> set[str] | None:
    """Names of the files git tracks in `folder`; empty outside a repository, None when git cannot answer."""
    import subprocess

    if not folder.is_dir():
        return set()
    try:
        done = subprocess.run(["git", "ls-files", "-z", "--", "."], cwd=folder, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return set() if b"not a git repository" in done.stderr else None
    return {Path(n).name for n in done.stdout.decode("utf-8", "replace").split("\0") if n and "/" not in n}
