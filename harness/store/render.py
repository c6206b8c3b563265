"""Render the kernel-feature support matrix from result files (markdown for people, JSON for tools).

Nothing is recomputed: every statement comes from recorded verdicts (and the metadata records the sweep writes
next to them).

What is shown: each generation's column holds, for each kernel, the verdicts of one run, the latest complete run
of that kernel on that generation (`harness.store.results.RunSelection`), so that a column says what passes at one
commit. With `history=True` every run is rendered: when the same case was judged more than once in the same
lineage the latest verified verdict counts (a verdict recorded by the parent for a hung or dead worker yields to a
real one, and a not-verifiable or not-installed verdict never replaces a verified one: it only fills a cell that
nothing verified), and a cell whose verdicts come from several runs says so.

A lineage is a generation plus what decides its fidelity (`FIDELITY`): for `interp`, the Triton release whose
interpreter ran the kernels. Verdicts of two lineages are never merged into one: when a generation holds several,
each is shown as a generation of its own, named with it (`interp (Triton 3.9.0)`).

The rule for a feature value (a value of one axis of an op, for one adapter): the cases that exercised it are
those whose cell has that value and whose verdict is pass, fail or error (a clean rejection of an undeclared cell
and a not-verifiable case exercise nothing). The value is listed when every such case passed, and when some
passed and others failed; it is not listed when none passed or none ran.

Failures are told by cause (`harness.core.causes`): per kernel and generation, the failing cases with the same
failing check (or exception type) and the same smallest set of facts that sets them apart from the cases that ran
without that failure. One footnote per cause, on the values it names (on the kernel's name when no shown value
sets it apart), numbered in reading order.
"""

from __future__ import annotations

import dataclasses
import html
import json
import os
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from harness.core.case import OPS
from harness.core.causes import Fact, ran_without, separate, what_failed
from harness.core.device import GENERATIONS
from harness.core.paths import public_record
from harness.core.text import one_line
from harness.store import differential, manifest, read_ahead, seed_table
from harness.store.results import (
    FIDELITY,
    VERIFIED,
    Result,
    RunSelection,
    lineage,
    lineage_labels,
    load,
    result_files,
    select_runs,
)

__all__ = ["FIDELITY", "VERIFIED", "build", "dedupe", "lineage", "render_files", "to_markdown"]

EXERCISED = ("pass", "fail", "error")
MAX_ROWS = 40  # rows per declared-vs-verified table in the markdown (the JSON has them all)
CASE_FILES_PER_NOTE = 2
NOTE_REASON = 320  # characters of a footnote's reason (cut between clauses or words, never inside a number)
#: the sections of the kernel tables, in reading order
SECTIONS = (("third_party", "Third-party kernels"), ("ours", "Our kernels"), ("aids", "Test aids and examples"))


# -- loading ------------------------------------------------------------------------------------------------------

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
        key = _key(r)  # once per result: a case's canonical JSON is most of the time of a dedupe
        old = best.get(key)
        # the run id breaks a tie of equal ranks, so that the order the files are read in never matters
        if old is None or (_rank(r), r.run_id) >= (_rank(old), old.run_id):
            best[key] = r
    cells = {key: _cell_key(r) for key, r in best.items()}
    ran = {cells[key][:3] for key, r in best.items() if r.verdict != "not-installed"}
    verified = {cells[key] for key, r in best.items() if r.verdict in VERIFIED}
    kept = [(key, r) for key, r in best.items() if not (r.verdict == "not-installed" and cells[key][:3] in ran)
            and not (r.verdict == "not-verifiable" and cells[key] in verified)]
    return [r for key, r in sorted(kept, key=lambda kr: (kr[1].adapter, kr[1].generation, kr[0]))]


def _by_lineage(rs: Sequence[Result]) -> list[Result]:
    """The results, those of a generation with several lineages labelled with theirs (`interp (Triton 3.9.0)`)."""
    labels = lineage_labels(lineage(r) for r in rs)
    return [r if labels[lineage(r)] == r.generation else dataclasses.replace(r, generation=labels[lineage(r)])
            for r in rs]


def _base(label: str) -> str:
    """The generation of a label (`interp (Triton 3.9.0)` -> `interp`)."""
    return label.split(" (", 1)[0]


def _gen_order(g: str) -> tuple[int, str]:
    base = _base(g)
    return (GENERATIONS.index(base) if base in GENERATIONS else len(GENERATIONS), g)


def _cell(v: Any) -> str:
    """Text safe inside a markdown table cell: one line, pipes escaped, no raw HTML (an adapter's name or a kernel's
    message could hold some) but for the footnote markers this renderer adds (`<sup>`)."""
    text = html.escape(" ".join(str(v).split()), quote=False).replace("|", "\\|")
    return text.replace("&lt;sup&gt;", "<sup>").replace("&lt;/sup&gt;", "</sup>")


def _prose(text: str) -> str:
    """Markdown prose with no raw HTML from what results files hold (a kernel's message, an adapter's name or
    description): `<`, `>` and `&` escaped outside code spans (a code span shows its text as it is)."""
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an unclosed backtick: no code span, escape everything
        return html.escape(text, quote=False)
    return "`".join(p if i % 2 else html.escape(p, quote=False) for i, p in enumerate(parts))


_AT = re.compile(r"\s\(at [^()]*:\d+(?: in [^()]*)?\)")  # source locations are in the case files
_MARGIN = re.compile(r"outside the error bound \(margin ([^)]*)\)")
#: a margin this large is an error over a bound of 0 (older records clamped the bound to 1e-300 instead of inf)
EXACT_MARGIN = 1e200


def _exact(m: re.Match[str]) -> str:
    try:
        margin = float(m.group(1))
    except ValueError:
        return m.group(0)
    return "differ (bit-exact check)" if not margin < EXACT_MARGIN else m.group(0)


def _clip(text: str, n: int) -> str:
    """`text` cut to about `n` characters between clauses, else between words: a number is never cut."""
    if len(text) <= n:
        return text
    head = text[: n - 4]
    at = head.rfind("; ")
    if at < n // 2:
        at = head.rfind(" ")
    return (head[:at] if at > 0 else head).rstrip(",;:") + " ..."


def _reason(reason: str, n: int = NOTE_REASON) -> str:
    """A verdict's reason as a reader wants it: one line, no source locations, a bound of 0 called a bit-exact
    check (not an astronomical margin), cut only between clauses or words."""
    text = _MARGIN.sub(_exact, _AT.sub("", reason))
    if "(bit-exact check)" in text:
        text = re.sub(r", bound 0(?: \(exact: the bound is 0 there\))?(?=;|$)", "", text)
    return _clip(one_line(text, 10**6), n)


def _display(value: str) -> str:
    return "N/A" if value == "-" else value


# -- causes of failure ----------------------------------------------------------------------------------------------

#: how a routing pattern reads in a footnote
ROUTING_WORDS = {"skewed": "skewed expert popularity", "one_expert": "every token routed to the same experts",
                 "some_empty": "experts that receive no token", "ties": "tied router scores",
                 "nonfinite": "NaN/Inf router logits", "random": "random routing"}
#: dimensions whose 0 is an empty batch
BATCH_DIMS = ("M", "T")


def _fact_text(f: Fact, titles: Mapping[str, str]) -> str:
    kind, name, value = f
    if kind == "feature":
        return f"{titles.get(name, name)} = {_display(value)}"
    if kind == "shape":
        return f"an empty batch ({name} = 0)" if name in BATCH_DIMS else f"{name} = 0"
    return ROUTING_WORDS.get(name, f"routing pattern {name}")


def _detail(r: Result) -> str:
    """What went wrong, in full: the exception raised, or the failing checks with the values got and expected."""
    text = _reason(r.reason)
    m = re.match(r"kernel (raised[^:]*): (.*)$", text)
    if m and "`" not in m.group(2):
        return f"{m.group(1).replace('raised', 'raises', 1)} `{m.group(2)}`"
    return text


class _Cause:
    """One cause of failure of one kernel: what failed and the facts that set its cases apart, per generation."""

    def __init__(self, what: tuple[str, str], facts: tuple[Fact, ...]) -> None:
        self.what, self.facts = what, facts
        self.cases: dict[str, tuple[list[Result], int]] = {}  # generation -> (its cases, cases that ran there)
        self.id = 0

    def scope(self, titles: Mapping[str, str]) -> str:
        """The facts the cause names, in words ("" for none)."""
        return " with ".join(_fact_text(f, titles) for f in self.facts)

    def text(self, titles: Mapping[str, str]) -> str:
        where = " and ".join(f"{g} ({len(rs)} of {n} cases)"
                             for g, (rs, n) in sorted(self.cases.items(), key=lambda t: _gen_order(t[0])))
        scope = (f"Fails for {self.scope(titles)} on {where}" if self.facts else
                 f"Fails on {where}, in cases that no feature value sets apart (their sizes or data decide)")
        return f"{scope}: {_detail(self.first())}"

    def first(self) -> Result:
        return self.cases[min(self.cases, key=_gen_order)][0][0]

    def named(self) -> set[tuple[str, str]]:
        """The (axis, value) pairs the cause names."""
        return {(f[1], f[2]) for f in self.facts if f[0] == "feature"}


def _causes(ex: Sequence[Result], axes: Sequence[Mapping[str, Any]], gens: Sequence[str]) -> list[_Cause]:
    """The causes of the kernel's failing cases: per generation, its failing cases by what failed, each split by
    the facts that set them apart from the cases that ran without that failure; the same cause on several
    generations is one."""
    names = [a["name"] for a in axes]
    found: dict[tuple[tuple[str, str], tuple[Fact, ...]], _Cause] = {}
    for g in gens:
        ran = [r for r in ex if r.generation == g]
        by_what: dict[tuple[str, str], list[Result]] = defaultdict(list)
        for r in ran:
            if r.verdict != "pass":
                by_what[what_failed(r)].append(r)
        for what in sorted(by_what):
            fine = [o for o in ran if ran_without(o, what)]
            for facts, cases in separate(by_what[what], fine, names):
                cause = found.setdefault((what, facts), _Cause(what, facts))
                cause.cases[g] = (cases, len(ran))
    return [found[k] for k in sorted(found, key=lambda k: (len(k[1]) == 0, k))]


# -- the model (what the JSON holds and the markdown shows) --------------------------------------------------------

class _CaseFiles:
    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.files: dict[str, dict[str, Any]] = {}

    def add(self, r: Result) -> str:
        # names come from results files: never let one steer the path out of the folder
        label = re.sub(r"[^A-Za-z0-9.]+", "-", r.generation).strip("-")  # interp (Triton 3.9.0): interp-Triton-3.9.0
        stem = re.sub(r"[^A-Za-z0-9._-]", "_", f"{r.adapter}-{label}-{r.case.case_id}").lstrip(".")
        path = f"{self.folder}/{stem}.json"
        # the fields of a judge's case file that a replay reads (harness.store.casefiles): the adapter_object too
        self.files[path] = {"case": r.case.to_dict(), "adapter_object": r.metrics.get("adapter_object"),
                            "generation": _base(r.generation), "verdict": r.verdict, "declared": r.declared,
                            "reason": r.reason}
        return path

    def add_differential(self, adapter: str, generation: str, content: dict[str, Any]) -> str:
        """The case file of a differential run's example case (`harness.store.differential.case_file`)."""
        case_id = content["differential"]["case_id"]
        stem = re.sub(r"[^A-Za-z0-9._-]", "_", f"{adapter}-differential-{generation}-{case_id}")
        path = f"{self.folder}/{stem.lstrip('.')}.json"
        self.files[path] = content
        return path


def _kind(info: Mapping[str, Any]) -> str:
    if info.get("source") == "reference":
        return "reference"
    return "test_aid" if info.get("test_aid") else "kernel"


def _section(info: Mapping[str, Any], kind: str, libraries: Sequence[str]) -> str:
    """Third-party (an adapter of a library), ours, or a test aid or example (an adapter that says so)."""
    if kind == "test_aid" or str(info.get("description", "")).lower().startswith("example"):
        return "aids"
    return "third_party" if info.get("library") or libraries else "ours"


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


def _device_names(dev_list: Sequence[Mapping[str, Any]], g: str) -> list[str]:
    return sorted({(d.get("device_name") or d.get("device") or "?")
                   + (f" (sm_{d['capability'][0]}{d['capability'][1]})" if d.get("capability") else "")
                   + (", Triton interpreter" if _base(g) == "interp" else "") for d in dev_list})


def _generation_info(g: str, rs: Sequence[Result], runs: Sequence[Mapping[str, Any]],
                     selection: Mapping[tuple[str, str], Mapping[str, Any]],
                     infos: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Provenance of one generation: devices, versions, commits, profiles, cell selection and verdict counts."""
    recs = [r for r in rs if r.generation == g]
    dev_list = [json.loads(d) for d in sorted({json.dumps(r.device, sort_keys=True) for r in recs})]
    run_meta = [m for m in runs if m.get("generation") == g]
    sel = {a: s for (a, gg), s in selection.items() if gg == g}
    profiles = sorted({s.get("profile") for s in sel.values() if s.get("profile")}
                      | {m["profile"] for m in run_meta if m.get("profile")})
    return {
        "generation": g, "devices": _device_names(dev_list, g),
        "torch": sorted({str(d.get("torch_version")) for d in dev_list}),
        "triton": sorted({str(d.get("triton_version")) for d in dev_list}),
        "python": sorted({str(d.get("python_version")) for d in dev_list}),
        "commits": _commits(dev_list, run_meta), "profiles": profiles or ["not recorded"],
        "selection": _selection_text(sel, infos, run_meta),
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


def _per_generation(recs: Sequence[Result], gens: Sequence[str],
                    run_label: Callable[[Result], str]) -> dict[str, dict[str, Any]]:
    """The adapter's status, exercised and passed counts, verdict counts and run(s) on each generation."""
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
                      "counts": dict(sorted(Counter(r.verdict for r in gr).items())),
                      "runs": sorted({run_label(r) for r in gr})}
    return per_gen


def _axes_out(kind: str, axes: Sequence[Mapping[str, Any]], recs: Sequence[Result], gens: Sequence[str],
              declared_vals: Mapping[str, set[Any]], causes: Sequence[_Cause]) -> list[dict[str, Any]]:
    """Per axis, each swept value's status, declaration, counts (overall and per generation) and the causes of
    failure that name it (their footnotes are numbered later, in reading order)."""
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
            values.append({
                "value": v, "status": _status(len(vr), len(passed)),
                "declared": v in declared_vals.get(a["name"], set()),
                "exercised": len(vr), "passed": len(passed),
                "by_generation": {g: [sum(r.verdict == "pass" for r in vr if r.generation == g),
                                      sum(r.generation == g for r in vr)] for g in gens
                                  if any(r.generation == g for r in vr)},
                "causes": [c for c in causes if (a["name"], str(v)) in c.named()] if kind != "reference" else [],
            })
        axes_out.append({"name": a["name"], "title": a["title"], "values": values})
    return axes_out


def _shown(v: Mapping[str, Any]) -> bool:
    """Whether a value is listed: some case exercised it (one that only failed is listed struck through)."""
    return v["status"] in ("pass", "partial", "fail")


def _attach(axes_out: list[dict[str, Any]], causes: Sequence[_Cause]) -> list[_Cause]:
    """Keep each cause only on the shown values it names; the causes that name no shown value go on the row."""
    on_values = set()
    for ax in axes_out:
        for v in ax["values"]:
            v["causes"] = v["causes"] if _shown(v) else []
            on_values.update(id(c) for c in v["causes"])
    return [c for c in causes if id(c) not in on_values]


def _failing_rows(name: str, ex: Sequence[Result], axes: Sequence[Mapping[str, Any]], files: _CaseFiles,
                  cause_of: Mapping[int, _Cause]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rows of cells with a failing case: (declared cells, undeclared cells that were not rejected cleanly), each
    with the causes of its failing cases (`cause_of`: id of a result -> its cause)."""
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
               "reason": _reason(bad[0].reason), "case_file": files.add(bad[0]),
               "causes": list({id(cause_of[id(r)]): cause_of[id(r)] for r in bad}.values())}
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
    return [{"adapter": name, "generation": g, "cases": n, "reason": _reason(reason, 160)}
            for (g, reason), n in sorted(nv.items(), key=lambda t: (_gen_order(t[0][0]), t[0][1]))]


def _not_installed_rows(name: str, recs: Sequence[Result]) -> list[dict[str, Any]]:
    """Per generation, the cases of an adapter whose library was missing, with the reason (how to install it)."""
    rows: dict[str, list[Result]] = defaultdict(list)
    for r in recs:
        if r.verdict == "not-installed":
            rows[r.generation].append(r)
    return [{"adapter": name, "generation": g, "cases": len(rs), "reason": rs[0].reason} for g, rs in rows.items()]


# -- runs shown ---------------------------------------------------------------------------------------------------

class _Runs:
    """The runs whose verdicts are rendered, each with a label people can quote: its commit (`4228dd0`,
    `cbe51f1+dirty`), with `#2`, `#3` for later runs of the same commit."""

    def __init__(self, sel: RunSelection, rs: Sequence[Result]) -> None:
        self.sel = sel
        present = {sel.run_of(r.run_id).key: sel.run_of(r.run_id) for r in rs}
        self.label: dict[str, str] = {}
        seen: Counter = Counter()
        for run in sorted(present.values(), key=lambda run: (run.last, run.key)):
            seen[run.commit] += 1
            self.label[run.key] = run.commit + (f" #{seen[run.commit]}" if seen[run.commit] > 1 else "")

    def of(self, r: Result) -> str:
        return self.label[self.sel.run_of(r.run_id).key]


def _slot(r: Result) -> tuple[str, str, str]:
    """The (generation, fidelity, adapter) of a result whose generation may be labelled with its lineage."""
    base = _base(r.generation)
    key = FIDELITY.get(base)
    return base, (str(r.device.get(key[0]) or "unknown") if key else ""), r.adapter


def _run_rows(rs: Sequence[Result], runs: _Runs, meta: Sequence[Mapping[str, Any]],
              infos: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (generation, run) rendered: device, versions, profile, the kernels it shows, its cell selection
    and whether each kernel's plan was judged in full."""
    by: dict[tuple[str, str], list[Result]] = defaultdict(list)
    for r in rs:
        by[(r.generation, runs.sel.run_of(r.run_id).key)].append(r)
    meta_of: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for m in meta:
        meta_of[runs.sel.run_of(str(m.get("run_id") or "")).key].append(m)
    rows = []
    for (g, key), recs in sorted(by.items(), key=lambda t: (_gen_order(t[0][0]), runs.label[t[0][1]])):
        run = runs.sel.runs[key]
        dev_list = [json.loads(d) for d in sorted({json.dumps(r.device, sort_keys=True) for r in recs})]
        kernels = sorted({r.adapter for r in recs})
        _, selection = _collect_meta([m for m in meta_of[key] if m.get("generation") == _base(g)])
        run_meta = [m for m in meta_of[key] if m.get("kind") == "run"]
        slots = {_slot(r) for r in recs}
        incomplete = [f"{s[2]} ({len(run.judged.get(s, ()))} of {run.planned[s[2]]} cases)" for s in sorted(slots)
                      if run.sweep and s[2] in run.planned and not run.complete(s)]
        rows.append({
            "run": runs.label[key], "generation": g, "sweep": run.sweep, "commit": run.commit,
            "devices": _device_names(dev_list, g), "torch": sorted({str(d.get("torch_version")) for d in dev_list}),
            "triton": sorted({str(d.get("triton_version")) for d in dev_list}), "libraries": _libraries(recs),
            "profile": run.profile or "not recorded", "kernels": kernels, "incomplete": incomplete,
            "selection": _selection_text({a: s for (a, _), s in selection.items() if a in kernels}, infos, run_meta),
            "verdicts": len(recs)})
    return rows


# -- building the model -------------------------------------------------------------------------------------------

def _current(results: Sequence[Result], meta: Sequence[Mapping[str, Any]],
             sel: RunSelection) -> tuple[list[Result], list[Mapping[str, Any]]]:
    """The verdicts of the runs shown, and the metadata those runs wrote (an adapter's declared support is the one
    of the run it is shown from)."""
    shown = [r for r in results if sel.is_current(r)]
    chosen = {(run.key, slot[2]) for slot, run in sel.chosen.items()}
    keys = {key for key, _ in chosen}
    kept = [m for m in meta if sel.run_of(str(m.get("run_id") or "")).key in keys
            and (m.get("kind") != "adapter" or (sel.run_of(str(m.get("run_id") or "")).key, m.get("adapter"))
                 in chosen)]
    return shown, kept


def _display_order(adapters: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The kernels in the order the markdown shows them: by section, the experts ops first then the stage ops in
    OPS order (unknown ops last), then by name; the reference adapters last."""
    sections = [s for s, _ in SECTIONS] + ["reference"]
    ops_order = ["experts", *[op for op in OPS if op != "experts"]]

    def key(a: Mapping[str, Any]) -> tuple[int, int, str, str]:
        op = a["op"]
        return (sections.index(a["section"]), ops_order.index(op) if op in ops_order else len(ops_order), op,
                a["name"])

    return sorted(adapters, key=key)


def _number(adapters: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]],
            titles: Mapping[str, Mapping[str, str]], files: _CaseFiles) -> list[dict[str, Any]]:
    """Number the causes in reading order (tables in order, each left to right and top to bottom: a row's name,
    then its values), replace them by their numbers, and return the footnotes (with their case files)."""
    notes: list[dict[str, Any]] = []

    def number(c: _Cause, adapter: str) -> int:
        if not c.id:
            c.id = len(notes) + 1
            paths = [files.add(r) for rs, _ in (c.cases[g] for g in sorted(c.cases, key=_gen_order))
                     for r in rs][:CASE_FILES_PER_NOTE]
            notes.append({"id": c.id, "adapter": adapter, "text": c.text(titles[adapter]),
                          "scope": c.scope(titles[adapter]), "case_files": paths,
                          "what": list(c.what), "facts": [list(f) for f in c.facts],
                          "generations": {g: [len(rs), n] for g, (rs, n) in c.cases.items()}})
        return c.id

    for a in adapters:
        a["notes"] = [number(c, a["name"]) for c in a["notes"]]
        for ax in a["axes"]:
            for v in ax["values"]:
                v["notes"] = [number(c, a["name"]) for c in v.pop("causes")]
    for row in rows:  # every cause is on a row or a value: numbered above
        row["notes"] = sorted(c.id for c in row.pop("causes"))
    return notes


def _adapter_out(name: str, recs: Sequence[Result], infos: Mapping[str, Mapping[str, Any]], gens: Sequence[str],
                 runs: _Runs) -> tuple[dict[str, Any], dict[str, Any]]:
    """A kernel's row of the model, and what the declared-vs-verified tables need of it."""
    op = recs[0].case.op
    info = _adapter_info(name, infos)
    kind = _kind(info)
    axes = _axes_of(op, info, recs)
    declared_vals = _declared_values(info, axes, recs)
    ex = [r for r in recs if r.verdict in EXERCISED]
    causes = _causes(ex, axes, gens) if kind != "reference" else []
    axes_out = _axes_out(kind, axes, recs, gens, declared_vals, causes)
    libraries = _libraries(recs)
    row = {"name": name, "op": op, "op_title": info.get("op_title", op), "kind": kind,
           "section": "reference" if kind == "reference" else _section(info, kind, libraries),
           "source": info.get("source", ""), "description": info.get("description", ""), "libraries": libraries,
           "generations": _per_generation(recs, gens, runs.of), "axes": axes_out, "notes": _attach(axes_out, causes)}
    extra = {"ex": ex, "axes": axes, "declared": declared_vals, "titles": {a["name"]: a["title"] for a in axes},
             "cause_of": {id(r): c for c in causes for rs, _ in c.cases.values() for r in rs}}
    return row, extra


def build(results: Iterable[Result], meta: Iterable[Mapping[str, Any]] = (), *, command: str = "",
          sources: Sequence[str] = (), cases_folder: str = "SUPPORT_MATRIX.cases",
          history: bool = False, differential_runs: Sequence[differential.Run] = ()) -> dict[str, Any]:
    """The support matrix as a JSON-serializable dict (`to_markdown` renders it): each kernel's verdicts on each
    generation from the run `harness.store.results.RunSelection` chooses, or from every run with `history`; and
    what the latest of the `differential_runs` of each generation found."""
    results, meta = list(results), list(meta)
    sel = select_runs(results, meta)
    shown, shown_meta = (results, meta) if history else _current(results, meta, sel)
    # the latest run's metadata last (it wins where runs differ), whatever the order the files were read in
    shown_meta = sorted(shown_meta, key=lambda m: (sel.run_of(str(m.get("run_id") or "")).last,
                                                   sel.run_of(str(m.get("run_id") or "")).key))
    rs = _by_lineage(dedupe(shown))
    runs = _Runs(sel, rs)
    infos, selection = _collect_meta(shown_meta)
    files = _CaseFiles(cases_folder)
    by_adapter: dict[str, list[Result]] = defaultdict(list)
    for r in rs:
        by_adapter[r.adapter].append(r)
    gens = sorted({r.generation for r in rs}, key=_gen_order)
    run_records = [m for m in shown_meta if m.get("kind") == "run"]
    generations = [_generation_info(g, rs, run_records, selection, infos) for g in gens]

    built = {name: _adapter_out(name, recs, infos, gens, runs) for name, recs in by_adapter.items()}
    adapters_out = [dict(a) for a in _display_order([row for row, _ in built.values()])]
    dv: dict[str, list[dict[str, Any]]] = {k: [] for k in ("claimed_but_failing", "undeclared_not_rejected",
                                                           "working_not_claimed", "not_verifiable", "not_installed")}
    for a in adapters_out:
        if a["kind"] == "reference":
            continue
        name, x = a["name"], built[a["name"]][1]
        claimed, bad = _failing_rows(name, x["ex"], x["axes"], files, x["cause_of"])
        dv["claimed_but_failing"] += claimed
        dv["undeclared_not_rejected"] += bad
        dv["working_not_claimed"] += _working_rows(name, x["ex"], x["axes"], a["axes"], x["declared"])
        dv["not_verifiable"] += _unverifiable_rows(name, by_adapter[name])
        dv["not_installed"] += _not_installed_rows(name, by_adapter[name])
    notes = _number(adapters_out, dv["claimed_but_failing"] + dv["undeclared_not_rejected"],
                    {n: x["titles"] for n, (_, x) in built.items()}, files)
    return {
        "title": "Kernel-feature support matrix",
        "command": command,
        "sources": list(sources),
        "history": history,
        "verdicts": len(rs),
        "generations": generations,
        "runs": _run_rows(rs, runs, shown_meta, infos),
        "adapters": adapters_out,
        "seed_table": seed_table.build(adapters_out),
        "declared_vs_verified": dv,
        "footnotes": notes,
        "differential": differential.build(differential_runs, files.add_differential),
        "case_files": files.files,
    }


# -- markdown -----------------------------------------------------------------------------------------------------

def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    return tabulate([[_cell(c) for c in row] for row in rows], headers=[_cell(h) for h in headers],
                    tablefmt="github", disable_numparse=True)


def _sup(notes: Sequence[int]) -> str:
    return f"<sup>{','.join(map(str, notes))}</sup>" if notes else ""


def _value_text(v: Mapping[str, Any]) -> str:
    if v["status"] == "fail":
        return f"~~{_display(v['value'])}~~{_sup(v['notes'])}"
    return f"{_display(v['value'])}{'' if v['declared'] else '*'}{_sup(v['notes'])}"


def _values_cell(ax: Mapping[str, Any]) -> str:
    shown = [_value_text(v) for v in ax["values"] if _shown(v)]
    return ", ".join(shown) if shown else "(none)"


def _gens_cell(a: Mapping[str, Any], history: bool) -> str:
    """Where the kernel passed (its counts are in the Generations section), and where some case failed."""
    found = []
    for g, s in a["generations"].items():
        words = [f"partial: {s['passed']} of {s['exercised']}"] if s["status"] == "partial" else []
        if history and len(s["runs"]) > 1:
            words.append(f"mixes {len(s['runs'])} runs")
        if s["status"] in ("pass", "partial"):
            found.append(f"{g} ({'; '.join(words)})" if words else g)
    return ", ".join(found) if found else "(none)"


def _name_cell(a: Mapping[str, Any]) -> str:
    return a["name"] + (" (test aid)" if a["kind"] == "test_aid" else "")


def _sources_block(op_adapters: Sequence[Mapping[str, Any]]) -> list[str]:
    """The legend under a table: each kernel's source (and library version), and what it is."""
    lines = ["Sources:", ""]
    for a in op_adapters:
        text = f"`{a['source']}`" if a["source"] else "(not recorded)"
        text += f" ({', '.join(a['libraries'])})" if a.get("libraries") else ""
        text += f": {_clip(one_line(a['description'], 10**6), 200)}" if a.get("description") else ""
        lines.append(_prose(f"- {a['name']}: {text}"))
    return lines


def _notes_block(notes: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = []
    for n in notes:
        files = ", ".join(f"[{Path(p).stem.rsplit('-', 1)[-1]}]({p})" for p in n["case_files"])
        lines.append(f"{n['id']}. {_prose(n['text'])}" + (f"; case files: {files}" if files else ""))
    return lines


def _values_row(a: Mapping[str, Any]) -> list[str]:
    if not any(s["exercised"] for s in a["generations"].values()):
        if any(s["status"] == "not installed" for s in a["generations"].values()):
            return ["not installed"] * len(a["axes"])  # its library is missing where it was run
        return ["not run"] * len(a["axes"])  # e.g. a CUDA-only kernel seen on interp only
    return [_values_cell(ax) for ax in a["axes"]]


def _op_section(title: str, op_adapters: Sequence[Mapping[str, Any]], notes: Mapping[int, Mapping[str, Any]],
                history: bool) -> list[str]:
    axes_titles = [ax["title"] for ax in op_adapters[0]["axes"]]
    rows = [[_name_cell(a) + _sup(a["notes"]), *_values_row(a), _gens_cell(a, history)] for a in op_adapters]
    used = sorted({i for a in op_adapters for i in a["notes"]}
                  | {i for a in op_adapters for ax in a["axes"] for v in ax["values"] for i in v["notes"] if _shown(v)})
    out = [f"### {title}", "", _table(["Kernel", *axes_titles, "Generations verified"], rows), "",
           *_sources_block(op_adapters), ""]
    if used:
        out += [*_notes_block([notes[i] for i in used]), ""]
    return out


HOW_TO_READ = [
    "How to read the tables:",
    "",
    "- A feature column lists the values that some case exercised: every such case passed, or some did and a "
    "footnote says what failed; ~~struck through~~: every case that exercised it failed. A value that never ran "
    "(rejected cleanly as undeclared, or not verifiable) is not listed. `*`: works, but the kernel does not declare "
    "it; N/A: the axis does not apply.",
    "- A footnote is one cause of failure: what failed (a check, with the values got and expected, or the exception "
    "raised) and the feature values or shape facts that set its cases apart from the cases that passed. It is on "
    "the values it names, or on the kernel's name when no feature value sets it apart (e.g. an empty batch).",
    "- Generations verified: where every case passed; `partial: P of N` where P of the N cases that ran passed. The "
    "Generations section has the counts, with how many passing cases were non-vacuous (their expected output was "
    "not all zeros or empty: cases that could have failed).",
    "- Each generation shows, for each kernel, the verdicts of one run: the latest complete run of that kernel on "
    "that generation (see \"Runs shown\" for their commits, devices and versions; `--history` renders every run). "
    "Quick runs sweep a pairwise covering set of the cells of large ops, full runs every cell.",
]


def _header(model: Mapping[str, Any]) -> list[str]:
    """Title, how to regenerate, the results read and how to read the tables."""
    out = [f"# {model['title']}", "",
           "Generated from recorded verdicts; do not edit by hand. Regenerate with (`--out PATH` picks where it is "
           "written):", "",
           "```bash", model["command"] or "python -m harness matrix", "```", ""]
    if model["sources"]:
        # what older runs the sources hold is not said: pruning them leaves the matrix as it is
        which = ("every run (`--history`)" if model.get("history")
                 else f"the {len({r['run'] for r in model['runs']})} current run(s) listed under \"Runs shown\"; "
                 "older runs are left out (`--history` renders them)")
        out += ["Results read: " + ", ".join(f"`{s}`" for s in model["sources"])
                + f"; shown: {model['verdicts']} verdicts of {which}.", ""]
    return [*out, *HOW_TO_READ, ""]


def _kernel_sections(kernels: Sequence[Mapping[str, Any]], notes: Mapping[int, Mapping[str, Any]],
                     history: bool) -> list[str]:
    """Per section (third-party, ours, test aids and examples), one table per op in display order."""
    out: list[str] = []
    for section, title in SECTIONS:
        group = [a for a in kernels if a["section"] == section]
        if not group:
            continue
        body: list[str] = []
        for op in dict.fromkeys(a["op"] for a in group):
            op_group = [a for a in group if a["op"] == op]
            body += _op_section(f"{op_group[0]['op_title']} (`{op}`)", op_group, notes, history)
        if section == "aids":  # not what a reader of the matrix came for: folded
            body = ["<details><summary>Test aids (not production kernels) and examples</summary>", "", *body,
                    "</details>", ""]
        out += [f"## {title}", "", *body]
    return out or ["## Kernels", "", "(none)", ""]


def _runs_section(model: Mapping[str, Any]) -> list[str]:
    """The provenance of what is shown: one row per run and generation, then each run's kernels and cells."""
    out = ["## Runs shown", ""]
    rows = model.get("runs", [])
    if not rows:
        return [*out, "(none)", ""]
    out += [_table(["Run", "Generation", "Device", "torch", "Triton", "Libraries", "Profile", "Kernels", "Verdicts"],
                   [[r["run"], r["generation"], "; ".join(r["devices"]), ", ".join(r["torch"]), ", ".join(r["triton"]),
                     ", ".join(r["libraries"]) or "-", r["profile"], str(len(r["kernels"])), str(r["verdicts"])]
                    for r in rows]), ""]
    for r in rows:
        what = "" if r["sweep"] else " (no sweep record: the pytest plugin's verdicts, or older files)"
        cut = f"; not judged in full: {', '.join(r['incomplete'])}" if r["incomplete"] and r["sweep"] else ""
        out.append(_prose(f"- {r['run']} on {r['generation']}{what}: {', '.join(r['kernels'])}; cells: "
                          f"{r['selection']}{cut}"))
    return [*out, ""]


def _count_cell(s: Mapping[str, Any], fail: str, history: bool = False) -> str:
    """One generation's status with its counts and run(s) (`fail` is the word shown when some case failed)."""
    runs = s.get("runs", [])
    at = (f", mixes {len(runs)} runs" if history and len(runs) > 1 else f" @ {runs[0]}") if runs else ""
    if s["status"] == "pass":
        backed = "" if s.get("nonvacuous") is None else f"; {s['nonvacuous']} non-vacuous"
        return f"pass ({s['exercised']}{backed}){at}"
    if s["status"] in ("fail", "partial"):
        return f"{fail} ({s['exercised'] - s['passed']} of {s['exercised']}){at}"
    return s["status"] + (at if s["status"] != "not run" else "")


def _generations_section(kernels: Sequence[Mapping[str, Any]], gens: Sequence[str], history: bool) -> list[str]:
    """Each kernel's status and counts per generation, with the run they come from."""
    out = ["## Generations", ""]
    if kernels:
        out += [_table(["Kernel", "Op", *gens],
                       [[_name_cell(a), a["op"], *[_count_cell(a["generations"][g], "fail", history) for g in gens]]
                        for a in kernels]),
                "", "Counts are cases that ran (pass, fail or error); clean rejections of undeclared cells and "
                "not-verifiable cases are not counted. `@ run`: the run they come from (see \"Runs shown\").", ""]
    else:
        out += ["(no kernel results)", ""]
    return out


def _capped(rows: list[list[Any]], total: int) -> list[list[Any]]:
    """The rows, with a last row saying how many more the JSON has when there were more than MAX_ROWS."""
    return rows + ([[f"... and {total - MAX_ROWS} more (see the JSON)"] + [""] * (len(rows[0]) - 1)]
                   if total > MAX_ROWS else [])


def _by_cause(rows: Sequence[Mapping[str, Any]], notes: Mapping[int, Mapping[str, Any]]) -> list[list[str]]:
    """The failing cells grouped by (kernel, generation, cause): one table row each, naming the footnote."""
    groups: dict[tuple[str, str, int], list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        for n in r["notes"]:
            groups[(r["adapter"], r["generation"], n)].append(r)
    out = []
    for (adapter, g, n), cells in sorted(groups.items(), key=lambda t: (t[0][2], _gen_order(t[0][1]))):
        failing, ran = notes[n]["generations"].get(g, [0, 0])
        out.append([adapter, g, notes[n]["scope"] or "(no feature value sets them apart)",
                    f"{failing} of {ran}", str(len(cells)), str(n)])
    return out


def _bug_tables(dv: Mapping[str, Any], notes: Mapping[int, Mapping[str, Any]]) -> list[str]:
    """The declared cells that fail, and the undeclared cells that were not rejected cleanly, by cause."""
    out: list[str] = []
    for key, title, blurb in (
            ("claimed_but_failing", "Claimed but failing (bugs)", "Declared cells with a failing or erroring case."),
            ("undeclared_not_rejected", "Not claimed, and not rejected cleanly (bugs)",
             "Undeclared cells must be rejected with an exception; these returned wrong results, crashed or hung.")):
        rows = _by_cause(dv[key], notes)
        out += [f"### {title}", "", blurb + " One row per cause; the footnote says what fails, with case files.", ""]
        if rows:
            out += [_table(["Kernel", "Generation", "Fails for", "Failing cases", "Cells", "Footnote"],
                           _capped(rows[:MAX_ROWS], len(rows))), ""]
        else:
            out += ["None.", ""]
    return out


def _declared_section(dv: Mapping[str, Any], notes: Mapping[int, Mapping[str, Any]]) -> list[str]:
    """Declared vs verified: the bug tables, what works unclaimed, and what could not be verified."""
    out = ["## Declared vs verified", "", *_bug_tables(dv, notes)]
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


def _oracle_section(refs: Sequence[Mapping[str, Any]], gens: Sequence[str], history: bool) -> list[str]:
    """The reference adapters' status per generation (any failure there is the oracle's)."""
    out = ["## Oracle self-test (reference adapters)", "",
           "The oracle run through the full harness path (inputs, integrity checks, comparisons); every case must "
           "pass.", ""]
    if refs:
        out += [_table(["Adapter", "Op", *gens],
                       [[a["name"], a["op"], *[_count_cell(a["generations"][g], "FAIL", history) for g in gens]]
                        for a in refs]), ""]
    else:
        out += ["(no reference results)", ""]
    return out


def to_markdown(model: Mapping[str, Any]) -> str:
    """The markdown document for a model built by `build`."""
    gens = [g["generation"] for g in model["generations"]]
    notes = {n["id"]: n for n in model["footnotes"]}
    history = bool(model.get("history"))
    adapters = _display_order(model["adapters"])
    kernels = [a for a in adapters if a["kind"] != "reference"]
    refs = [a for a in adapters if a["kind"] == "reference"]
    out = _header(model)
    out += seed_table.to_markdown(model.get("seed_table") or [], _table)
    out += _kernel_sections(kernels, notes, history)
    out += _runs_section(model)
    out += _generations_section(kernels, gens, history)
    out += differential.to_markdown(model.get("differential") or {}, _table)
    out += _declared_section(model["declared_vs_verified"], notes)
    out += _oracle_section(refs, gens, history)
    return "\n".join(_wrapped(out)).rstrip() + "\n"


#: prose lines are wrapped to this width (tables are not: a table row is one line)
PROSE_WIDTH = 120


def _wrapped(lines: Sequence[str]) -> list[str]:
    """The lines, each long line of prose (a paragraph or a list item, outside code blocks and tables) wrapped at
    PROSE_WIDTH with its list item's indent, so that the markdown reads in a terminal or a diff as well."""
    import textwrap

    out: list[str] = []
    fenced = False
    for line in "\n".join(lines).split("\n"):
        fenced ^= line.startswith("```")
        if fenced or line.startswith(("|", "```", "<", "#")) or len(line) <= PROSE_WIDTH:
            out.append(line)
            continue
        marker = re.match(r"(?:- |\d+\. )?", line).group(0)
        parts = textwrap.wrap(line, PROSE_WIDTH, subsequent_indent=" " * len(marker), break_long_words=False,
                              break_on_hyphens=False)
        for part in parts:  # a line that would start a list, quote or heading stays on the line before
            if out and len(parts) > 1 and part is not parts[0] and _BLOCK_START.match(part.lstrip()):
                out[-1] += " " + part.lstrip()
            else:
                out.append(part)
    return out


_BLOCK_START = re.compile(r"(?:[-*+>#]|\d+[.)])(?:\s|$)")


def render_files(paths: Sequence[str | os.PathLike], out: str | os.PathLike, *, command: str = "",
                 strict: bool = True, shown_sources: Sequence[str] | None = None,
                 on_skip: Callable[[Path, str], None] | None = None,
                 on_kept: Callable[[list[Path]], None] | None = None, history: bool = False,
                 on_left_out: Callable[[str], None] | None = None,
                 ahead: read_ahead.ReadAhead | None = None) -> tuple[Path, Path, int]:
    """Render result files into `out` (markdown), `out` with .json, and the failing cases' files; returns
    (markdown path, JSON path, number of verdicts shown). JSONL files of other data under the given folders are
    skipped (`on_skip(path, why)`, default a warning). Only results files whose manifest matches are read
    (`harness.store.manifest.Gate`): each file or part left out is named in one line to `on_left_out` (default a
    warning). Case files the previous render into `out` wrote and this one does not are removed, unless git tracks
    them: those are kept and passed to `on_kept`. `history`: render every run, not only the current ones. `ahead`:
    a read of some of `paths` made beforehand with the same `strict` and `history`, used while it holds
    (`harness.store.read_ahead`)."""
    found: list[Path] = []
    gate = manifest.Gate()
    try:
        loaded = _read_with(ahead, paths, strict, _diverted(on_skip, found), gate, history)
        if loaded is None:
            loaded = load(paths, strict=strict, on_skip=_diverted(on_skip, found), gate=gate, skip_older=not history)
        results, meta = loaded
        runs = differential.find_runs(found, gate)  # their manifests checked by the same gate
    finally:
        for note in gate.notes:
            if on_left_out is not None:
                on_left_out(note)
            else:
                import warnings

                warnings.warn(note, stacklevel=2)
    if not results:
        raise ValueError(f"no results in {', '.join(map(str, paths))}")
    md_path = Path(out)
    folder = md_path.stem + ".cases"
    sources = list(shown_sources) if shown_sources is not None else [str(p) for p in paths]
    # committed and read elsewhere: results of any age name no path of the machine (harness.core.paths)
    model = public_record(build(results, meta, command=command, sources=sources, cases_folder=folder,
                                history=history, differential_runs=runs))
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


def _read_with(ahead: read_ahead.ReadAhead | None, paths: Sequence[str | os.PathLike], strict: bool,
               on_skip: Callable[[Path, str], None], gate: manifest.Gate,
               history: bool) -> tuple[list[Result], list[dict[str, Any]]] | None:
    """(results, metadata) of `paths`: the files `ahead` did not read, read now, before what it read, as one read of
    all of them would give; None (nothing told, nothing noted) when its read does not hold or cannot be added."""
    pre = ahead.take() if ahead is not None and ahead.strict == strict and ahead.history == history else None
    if pre is None:
        return None
    theirs = {str(p) for p in pre.paths}
    own = [p for p in paths if str(p) not in theirs]
    if len(own) + len(theirs) != len(paths):
        return None
    own_files = result_files(own)
    told: list[tuple[Path, str]] = []
    notes = manifest.Gate(gate.key)
    results, meta = load(own_files, strict=strict, on_skip=lambda path, why: told.append((path, why)), gate=notes,
                         skip_older=not history)
    ids = {r.run_id for r in results} | {str(m.get("run_id") or "") for m in meta}
    if not pre.takes(own_files, ids):
        return None
    for path, why in told + pre.skipped:
        on_skip(path, why)
    gate.notes += notes.notes + pre.notes
    return results + pre.results, meta + pre.meta


def _diverted(on_skip: Callable[[Path, str], None] | None, found: list[Path]) -> Callable[[Path, str], None]:
    """`on_skip` (default: a warning), less the differential runs' files, which go into `found`: they hold no
    verdicts, but the matrix shows what they found."""

    def skip(path: Path, why: str) -> None:
        if differential.is_run_file(path):
            found.append(path)
        elif on_skip is not None:
            on_skip(path, why)
        else:
            import warnings

            warnings.warn(f"skipped {path}: not a results file ({why})", stacklevel=4)

    return skip


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
