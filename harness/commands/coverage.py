"""`python -m harness coverage [--profile ci] [--adapter NAME] [--op OP]`: what a profile's generic test exercises.

For each adapter (default: the adapters this project ships) the cases its generic test judges under the profile,
its fixed cases and hypothesis' draws with the same seed, are counted against what the adapter declares: each
declared value of each feature axis, each value class per family, each expert-map shape, each boundary kind,
each declared threshold (`harness.engine.coverage`); the sizes each dim takes are summarised; each adapter's known
findings show as the regions the search excludes. No kernel runs.
A table per op (`--json`: the counts as JSON; `--out FILE` writes either), then one summary line. Exit 1 when
something declared gets no case (a gap, listed), 0 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from harness.commands import emit

DEFAULT_GENERATION = "interp"


def _count(row: Any) -> str:
    if row is None:
        return "-"
    if row.status == "n/a":
        return "n/a"
    if row.status == "gap":
        return "**0**"
    return f"{row.drawn}+{row.fixed}"


def _op_table(reports: Sequence[Any]) -> list[str]:
    """Rows (declared things) by adapter columns: drawn+fixed cases, **0** for a gap, n/a, - where not declared."""
    names = [r.adapter for r in reports]
    items: dict[tuple[str, str], dict[str, Any]] = {}
    ranks: dict[tuple[str, str], Any] = {}
    for r in reports:
        for row in r.rows:
            items.setdefault((row.section, row.item), {})[r.adapter] = row
            ranks.setdefault((row.section, row.item), row.order())
    items = dict(sorted(items.items(), key=lambda kv: ranks[kv[0]]))
    lines = ["| declared | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for (section, item), by in items.items():
        lines.append(f"| {section} `{item}` | " + " | ".join(_count(by.get(n)) for n in names) + " |")
    return lines


def _size_table(reports: Sequence[Any]) -> list[str]:
    lines = ["| adapter | dim | cases | min | p25 | p50 | p75 | max | cases at |", "|" + "---|" * 9]
    for r in reports:
        for d in r.dims:
            q = d.quantiles
            at = ", ".join(f"{k}: {v}" for k, v in d.at.items())
            lines.append(f"| {r.adapter} | {d.dim} | {d.count} | {q['min']} | {q['p25']} | {q['p50']} | {q['p75']} "
                         f"| {q['max']} | {at} |")
    return lines


def _notes(reports: Sequence[Any]) -> list[str]:
    lines = []
    for r in reports:
        lines += [f"- {r.adapter}: gap: {row.section} `{row.item}`" for row in r.gaps()]
        lines += [f"- {r.adapter}: n/a: {row.section} `{row.item}`: {row.why}" for row in r.rows
                  if row.status == "n/a"]
        lines += [f"- {r.adapter}: {n} case(s) turned away ({why})" for why, n in r.turned_away.items()]
        lines += [f"- {r.adapter}: excluded region: {region}" for region in r.known]
        if r.excluded:
            lines.append(f"- {r.adapter}: {r.excluded} drawn case(s) inside its excluded region(s), not judged")
    return lines


def render(reports: Sequence[Any], profile: str, generation: str) -> str:
    """The report as markdown: per op, its table of declared things by adapter, its size table, its notes."""
    lines = [f"# Draw coverage: profile `{profile}`, generation `{generation}`", "",
             "Cases of each adapter's generic test that exercise each declared thing: `drawn+fixed` (hypothesis' "
             "draws under the profile, the fixed cases every run judges); **0**: declared and never exercised (a "
             "gap); n/a: cannot apply (see the notes); -: not declared by that adapter.", ""]
    skipped = [f"{r.adapter} ({r.skipped})" for r in reports if r.skipped]
    if skipped:
        lines += ["Nothing drawn here for: " + "; ".join(skipped) + ".", ""]
    for op in dict.fromkeys(r.op for r in reports if not r.skipped):
        mine = [r for r in reports if r.op == op and not r.skipped]
        lines += [f"## `{op}`", "", "Cases judged (drawn+fixed): "
                  + ", ".join(f"{r.adapter} {r.drawn}+{r.fixed} of {r.cells} cells" for r in mine) + ".", "",
                  *_op_table(mine), "", "Sizes (every judged case):", "", *_size_table(mine), ""]
        if notes := _notes(mine):
            lines += ["Notes:", "", *notes, ""]
    return "\n".join(lines).rstrip() + "\n"


def summary(reports: Sequence[Any], profile: str, generation: str, seconds: float) -> str:
    """One line: what was counted, and the gaps (or none)."""
    counted = [r for r in reports if not r.skipped]
    gaps = [f"{r.adapter} {row.section} {row.item}" for r in counted for row in r.gaps()]
    cases = sum(r.drawn + r.fixed for r in counted)
    head = (f"coverage ({profile}, {generation}): {len(counted)} adapter(s), {cases} case(s) "
            f"({sum(r.drawn for r in counted)} drawn), {seconds:.1f}s: ")
    regions = [f"{r.adapter} ({len(r.known)})" for r in counted if r.known]
    known = f"; known-finding regions excluded from the search: {', '.join(regions)}" if regions else ""
    return head + (f"{len(gaps)} gap(s): " + "; ".join(gaps) if gaps else "every declared thing exercised") + known


def _adapters(names: Sequence[str], op: str | None) -> list[Any]:
    from harness import registry
    from harness.engine.coverage import builtin_adapters

    if names:
        found = [a for spec in registry.expand(names) for a in registry.resolve_all(spec)]
    else:
        found = builtin_adapters()
    return [a for a in found if op is None or a.op == op]


def run(args: argparse.Namespace) -> int:
    from harness.core.device import prepare_interpreter

    prepare_interpreter("cpu")  # the report builds inputs on the CPU; adapter modules import Triton
    os.environ.setdefault("HARNESS_SCALE", "small" if args.generation in ("interp", "cpu") else "large")
    from harness import ops
    from harness.engine import coverage as cov
    from harness.engine.profiles import PROFILES

    t0 = time.perf_counter()
    try:
        if args.op is not None and args.op not in ops.available():
            raise ValueError(f"--op must be one of {', '.join(sorted(ops.available()))}, got {args.op!r}")
        device = cov.device_for(args.generation)
        adapters = _adapters(args.adapter, args.op)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    reports = cov.coverage(adapters, device, PROFILES[args.profile])
    line = summary(reports, args.profile, args.generation, time.perf_counter() - t0)
    text = (json.dumps({"profile": args.profile, "generation": args.generation, "summary": line,
                        "adapters": [r.to_dict() for r in reports]}, indent=1) + "\n" if args.json
            else render(reports, args.profile, args.generation))
    emit(text, args.out)
    print(line)
    return 1 if any(r.gaps() for r in reports) else 0


def add_parser(sub: Any) -> None:
    from harness.core.device import GENERATIONS
    from harness.engine.profiles import PROFILES

    c = sub.add_parser("coverage", help="what a profile's generic test exercises of each declaration (no kernel runs)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--profile", default="ci", choices=list(PROFILES), help="the hypothesis profile (default ci)")
    c.add_argument("--adapter", action="append", default=[],
                   help="only this adapter (repeatable; module:object ok; 'all', 'external'); default: the adapters "
                        "this project ships")
    c.add_argument("--op", default=None, help="only the adapters of this op")
    c.add_argument("--generation", default=DEFAULT_GENERATION, choices=list(GENERATIONS),
                   help=f"the device generation the cells are declared for (default {DEFAULT_GENERATION}: the CPU "
                        "machine CI runs on)")
    c.add_argument("--out", default=None, help="write the report to this file")
    c.add_argument("--json", action="store_true", help="the counts as JSON instead of markdown")
    c.set_defaults(func=run)
