"""What a failure is, and what sets its failing cases apart from the cases that ran without it.

Shared by the pytest plugin (the failures one property test found, reported by cause) and the matrix renderer (a
row's failures, one footnote per cause). A cause is what failed (the failing checks, or the exception type) and the
smallest set of facts about the case (feature values, a zero dimension, the routing pattern) that every case of the
cause has and no case that ran without the failure has all of.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence

from harness.core.result import Result

#: one fact about a case: ("feature", axis, value), ("shape", dimension, "0") or ("routing", pattern, "")
Fact = tuple[str, str, str]

#: "kernel raised: RuntimeError: ..." and "kernel raised on its second run: ValueError: ..."
_RAISED = re.compile(r"^kernel [^:]*?\braised\b[^:]*: ([A-Za-z_][\w.]*)(?::|$)")

#: checks of the extra runs a judging draws at random (harness.engine.runner): they repeat the first run's checks,
#: so a case that failed those too is the same bug as one that was not drawn for them
EXTRA_RUNS = ("repeat:", "fresh_inputs:")


def what_failed(r: Result) -> tuple[str, str]:
    """The verdict and what failed: the failing checks of a `fail`; for an `error`, the exception type (read from
    the reason where older records lack it) or how the worker was lost (hang, died)."""
    if r.verdict == "error":
        if r.metrics.get("marker"):
            return r.verdict, str(r.metrics["marker"])
        if r.metrics.get("exception_type"):
            return r.verdict, str(r.metrics["exception_type"])
        m = _RAISED.match(r.reason)
        return r.verdict, m.group(1) if m else r.reason.split(":", 1)[0]
    if r.verdict == "fail":
        checks = list(r.metrics.get("failed_checks", []))
        first = [c for c in checks if not c.startswith(EXTRA_RUNS)]
        return r.verdict, ", ".join(first or sorted(checks)) or r.reason.split(":", 1)[0]
    return r.verdict, ""


def ran_without(o: Result, what: tuple[str, str]) -> bool:
    """Whether `o` ran to its checks without the failure `what`: it passed, or it failed other checks. A case that
    raised tells nothing of the checks it never reached."""
    return o.verdict == "pass" or (o.verdict == "fail" and what_failed(o) != what)


def facts(r: Result, axes: Sequence[str] = ()) -> list[Fact]:
    """The facts a cause may name about a case: its feature values (the `axes` first, in their order), each of its
    dimensions that is 0 (an empty batch), and its routing pattern when it is not a random one. Other sizes are left
    out: one failing case's sizes always set it apart, yet are rarely what it failed for."""
    names = [a for a in axes if a in r.case.features] + sorted(set(r.case.features) - set(axes))
    found: list[Fact] = [("feature", a, str(r.case.features[a])) for a in names]
    found += [("shape", k, "0") for k, v in sorted(r.case.shapes.items()) if v == 0]
    if r.case.routing and r.case.routing != "random":
        found.append(("routing", str(r.case.routing), ""))
    return found


def _candidates(failing: Sequence[list[Fact]], axes: Sequence[str]) -> list[tuple[Fact, ...]]:
    """Sets of one or two facts that some failing case has, simplest first: one fact before two, feature values
    before shape facts; each set's facts in the order of the axes."""
    seen: dict[Fact, int] = {}
    for fs in failing:
        for f in fs:
            seen.setdefault(f, len(seen))

    def place(f: Fact) -> tuple[int, int, int]:
        where = axes.index(f[1]) if f[0] == "feature" and f[1] in axes else len(axes)
        return f[0] != "feature", where, seen[f]

    pairs = {tuple(sorted(p, key=place)) for fs in failing for p in itertools.combinations(fs, 2)}

    def rank(c: tuple[Fact, ...]) -> tuple[int, list[tuple[int, int, int]]]:
        return len(c), sorted(place(f) for f in c)

    return sorted([(f,) for f in seen], key=rank) + sorted(pairs, key=rank)


def separate(failing: Sequence[Result], fine: Iterable[Result],
             axes: Sequence[str] = ()) -> list[tuple[tuple[Fact, ...], list[Result]]]:
    """Split the cases of one failure into causes: each a set of one or two facts that all its cases have and no
    `fine` case (one that ran without the failure) has all of, with its cases. The set that covers the most cases
    not yet covered is taken first (the simpler one on a tie), so one cause over many values stays one cause.
    Cases that no such set covers form a last group with no facts: the sizes or the data decide them."""
    fine_facts = [set(facts(o, axes)) for o in fine]
    case_facts = [set(facts(r, axes)) for r in failing]
    valid = [c for c in _candidates([facts(r, axes) for r in failing], axes)
             if not any(set(c) <= ff for ff in fine_facts)]
    left = list(range(len(failing)))
    causes: list[tuple[tuple[Fact, ...], list[Result]]] = []
    while left:
        best, covered = (), []
        for c in valid:
            got = [i for i in left if set(c) <= case_facts[i]]
            if len(got) > len(covered):
                best, covered = c, got
        if not covered:
            break
        causes.append((best, [failing[i] for i in covered]))
        left = [i for i in left if i not in covered]
    if left:
        causes.append(((), [failing[i] for i in left]))
    return causes
