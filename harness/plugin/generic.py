"""The generic tests the pytest plugin runs for every selected adapter (like PyTorch's OpInfo tests).

Collected by `harness.plugin` (not by file name): `pytest --moe-adapter pkg.mod:OBJ` in any repository, or the
adapters published under the `moe_harness.adapters` entry point.

test_declared_cases_pass: the explicit examples, then hypothesis' draws, inside the adapter's declared support on
this device; every verdict is recorded in the results store; a case its shape rule excludes is recorded
unsupported, as in the matrix. A fail or error does not end the search: the test fails once at the end, with every
distinct cause of failure found, each with its case JSON and the command that replays it. Its fixed cases are
`harness.engine.fixed`'s, its search `harness.engine.strategies.property_test`: the coverage report
(`python -m harness coverage`) counts the same plan.
The regions of the adapter's known findings (`Adapter.known`: documented third-party divergences) are left out
of the search; a fixed case inside one that fails only in the finding's declared checks is the finding, not a cause.
test_known_findings_reproduce: each known finding's own case fails as documented (reported xfailed); one that
passes no longer reproduces and fails the test, so that its declaration is removed (only adapters that declare one).
test_undeclared_cells_rejected_cleanly: cells the adapter does not declare must be rejected cleanly (the runner's
`rejects_cleanly`, the rule the matrix applies too), or pass ("works but not claimed"), never crash or return
wrong results.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest
from hypothesis.errors import Flaky

from harness import registry
from harness.core.case import Case
from harness.core.causes import ran_without, what_failed
from harness.core.known import KnownFinding, finding_of
from harness.core.result import Result
from harness.core.text import one_line
from harness.engine import fitting, large_lock, runner
from harness.engine import strategies as hs
from harness.engine.fixed import explicit_examples
from harness.engine.fixed import vacuous_boundary_cases as _vacuous_boundary_cases  # noqa: F401 (tests use it)
from harness.engine.profiles import name_of
from harness.ops import large
from harness.plugin import VERIFIED_PROPERTY

pytestmark = pytest.mark.moe_generic

#: verdicts that verified nothing: the case could not be judged here (an unfaithful interpreter, a missing library)
UNVERIFIED = ("not-verifiable", "not-installed")


def unverified_reasons(results: list[Result], limit: int = 3, width: int = 120) -> str:
    """The distinct reasons of the results that verified nothing, each cut to `width` characters, the first
    `limit` of them."""
    seen = list(dict.fromkeys(f"{r.verdict}: {r.reason}" for r in results if r.verdict in UNVERIFIED))
    cut = [one_line(text, width) for text in seen[:limit]]
    return "; ".join(cut) + (f" (and {len(seen) - limit} more)" if len(seen) > limit else "")


def nothing_verified(results: list[Result]) -> str | None:
    """Why none of `results` verified anything (None when one did, or there are none): a run that judged only
    not-verifiable or not-installed cases has checked nothing and must not read as a pass."""
    if not results or any(r.verdict not in UNVERIFIED for r in results):
        return None
    return f"could not verify any of its {len(results)} cases here: {unverified_reasons(results)}"


def _skip_or_count_unverified(request: pytest.FixtureRequest, name: str, results: list[Result]) -> None:
    """After a generic test of adapter `name` passed: skipped with the reasons when nothing was verified; when only
    some cases were, the count goes into a user property, listed in the terminal summary."""
    if (why := nothing_verified(results)) is not None:
        pytest.skip(f"{name}: {why}")
    verified = sum(r.verdict not in UNVERIFIED for r in results)
    if verified < len(results):
        request.node.user_properties.append(
            (VERIFIED_PROPERTY, f"verified {verified} of {len(results)} cases; the others: "
                                f"{unverified_reasons(results)}"))


def _hosted(request: pytest.FixtureRequest, name: str, device) -> registry.Adapter:  # type: ignore[no-untyped-def]
    """Adapter `name` in its kernel host on this worker's device: its module is never imported here, the judge."""
    from harness.engine import remote
    from harness.plugin import adapter_spec, listed_manifest, local_only

    if (local := local_only(request.config, name)) is not None:
        return local
    spec = adapter_spec(request.config, name)
    manifest = listed_manifest(request.config, name)
    family = remote.manifest_family(spec, manifest) if manifest is not None else None
    try:  # adapters of one family share this worker's kernel host (no host start, no new CUDA context)
        return remote.open_adapter(spec, device.device, family=family)
    except remote.HostError as e:
        pytest.fail(f"{name}: its kernel host could not load it: {e}", pytrace=False)


def _explain(r: Result) -> str:
    return (f"{r.verdict}: {r.reason}\n  case: {r.case.to_json()}\n"
            f"  replay: save the case JSON to case.json and run `python -m harness replay case.json`")


def test_declared_cases_pass(moe_adapter_name, moe_shard, moe_device, moe_results, moe_unverifiable,  # type: ignore[no-untyped-def]
                             moe_profile, request) -> None:
    adapter = _hosted(request, moe_adapter_name, moe_device)
    moe_device = adapter.device_for(moe_device)  # a CPU-native kernel is judged on `cpu`, not `interp`
    cells = hs.declared_cells(adapter, moe_device)
    if cells and (missing := adapter.not_installed()) is not None:
        _record_not_installed(adapter, cells, moe_device, moe_results)
        pytest.skip(f"{moe_adapter_name}: not installed, its {len(cells)} declared cells recorded as such: {missing}")
    if not cells:
        pytest.skip(f"{moe_adapter_name} declares no cell on {moe_device.generation} (reported as unsupported)")
    index, count = moe_shard
    all_cells = cells
    if count > 1:  # this item's share: every count-th cell (round robin when there are fewer cells than shards)
        cells = cells[index::count] or [cells[index % len(cells)]]

    search = _Search(adapter, moe_device, moe_results, moe_unverifiable)
    deliberate: set[str] = set()
    # judged here, not as hypothesis @example: hypothesis would stop at the first that fails; each shard takes its
    # share of the explicit examples of every cell (on a GPU their large threshold shapes are the slow ones)
    # the GPU profiles' cases past 2**31 elements, on a GPU only: one at a time on the machine, so each is judged
    # between two draws when no other process judges one (`_Search.large_if_free`), after the draws otherwise
    mine = explicit_examples(adapter, all_cells, name_of(moe_profile) if moe_device.is_cuda else None)[index::count]
    deliberate.update(c.case_id for c in mine)
    for pinned in (c for c in mine if not large.holds(c)):
        search.example(pinned)

    search.large = [c for c in mine if large.holds(c)]
    search.run(hs.property_test(adapter, cells, moe_device, moe_profile, search, moe_shard, moe_adapter_name))
    while search.large:  # those the lock never let through between the draws
        search.example(search.large.pop(0))
    if report := search.report():
        pytest.fail(report, pytrace=False)
    _fail_on_vacuous_cells(search.judged, deliberate)
    _skip_or_count_unverified(request, moe_adapter_name, search.judged)


#: verdicts a declared case may end with: passed, not checkable here, or excluded by the adapter's shape rule
#: (`requires` with shapes, `<dim>_multiple` limits: the runner reports it unsupported without running it)
ACCEPTED = ("pass", "not-verifiable", "unsupported")

#: the distinct causes of failure one property test finds before it stops looking and reports them
MAX_CAUSES = 8

#: kernel-host deaths (a crash, a lost CUDA context, a hang) after which a property test judges no more cases of
#: that cell: each costs a fresh host with a fresh CUDA context (seconds on a loaded GPU), and a kernel that kills
#: its host on every case of a cell has said so by then (other cells are still searched)
DEATHS_PER_CELL = 2

#: (verdict, what failed, the separating features: the (axis, value) pairs of the cell that set it apart)
Cause = tuple[str, str, tuple[tuple[str, str], ...]]


def failure_cause(r: Result, judged: Iterable[Result]) -> Cause:
    """What a failure is, to tell one bug from another: its verdict, what failed, and its separating features: the
    values of its cell that no case of `judged` had that ran to its checks without this failure (passed, or failed
    another way; a crash tells nothing of the checks). None when each value ran fine elsewhere: then the shapes or
    the data decide."""
    what = what_failed(r)
    fine = {kv for o in judged if ran_without(o, what) for kv in o.case.features.items()}
    return (*what, tuple(sorted(kv for kv in r.case.features.items() if kv not in fine)))


def _only(e: BaseException, types: tuple[type[BaseException], ...]) -> bool:
    """Whether `e` is one of `types`, or hypothesis' group of several distinct failures, each one of them."""
    inner = getattr(e, "exceptions", None)
    if inner is not None and not isinstance(e, (*types, Flaky)):
        return bool(inner) and all(_only(x, types) for x in inner)
    return isinstance(e, types)


class _Search:
    """The cases of one property test, each judged once (hypothesis replays cases, and the search reruns it), and
    its failures by cause."""

    def __init__(self, adapter: registry.Adapter, device, results, unverifiable: set[str] | None) -> None:  # type: ignore[no-untyped-def]
        self.adapter, self.device, self.results, self.unverifiable = adapter, device, results, unverifiable
        self.seen: dict[str, Result] = {}  # case_id -> its verdict
        self.judged: list[Result] = []  # every case judged, except those the shape rule excludes
        self.failed: list[Result] = []
        self.keys: dict[str, Cause] = {}  # case_id -> its cause, fixed when first asked (hypothesis replays it)
        self.causes: dict[Cause, Result] = {}  # the causes found, each with its case (shrunk where hypothesis did)
        self.errors: dict[Cause, type[AssertionError]] = {}
        self.raised: dict[Cause, Result] = {}
        self.known: list[Result] = []  # fixed cases that failed as a known finding declares
        self.excluded = 0  # draws inside a known finding's region, not judged
        self.deaths: dict[tuple[tuple[str, str], ...], int] = {}  # cell -> its cases that ended their kernel host
        self.unjudged = 0  # cases of such cells not judged (`DEATHS_PER_CELL`)
        self.large: list[Case] = []  # cases past 2**31 elements still to judge (`large_if_free`)

    def given_up(self, case: Case) -> bool:
        """Whether `case` is not judged: a new case of a cell whose cases ended their kernel host DEATHS_PER_CELL
        times."""
        if case.case_id in self.seen or self.deaths.get(_cell(case), 0) < DEATHS_PER_CELL:
            return False
        self.unjudged += 1
        return True

    def judge(self, case: Case) -> Result:
        if (r := self.seen.get(case.case_id)) is None:
            self.results.begin(case, self.device.to_dict(), self.device.generation)  # resolved if the kernel kills us
            r = self.seen[case.case_id] = runner.judge(case, self.adapter, self.device, unverifiable=self.unverifiable)
            self.results.append(r)
            if r.metrics.get("host_died") or r.metrics.get("timeout"):
                self.deaths[_cell(case)] = self.deaths.get(_cell(case), 0) + 1
            if r.verdict != "unsupported":
                self.judged.append(r)
            if as_known(self.adapter.known, r) is not None:
                self.known.append(r)
            elif r.verdict not in ACCEPTED:
                self.failed.append(r)
        return r

    def cause(self, r: Result) -> Cause | None:
        if r.verdict in ACCEPTED or as_known(self.adapter.known, r) is not None:
            return None
        if r.case.case_id not in self.keys:
            self.keys[r.case.case_id] = failure_cause(r, self.judged)
        return self.keys[r.case.case_id]

    def example(self, case: Case) -> None:
        """An explicit example (judged before the search; a large-offsets one after it); the cause of its failure is
        known to the search."""
        if self.given_up(case):
            return
        if (key := self.cause(self.judge(case))) is not None:
            self.causes.setdefault(key, self.seen[case.case_id])

    def large_if_free(self) -> None:
        """Judge the large cases still to judge now if no process of the machine judges one (they take a machine-wide
        lock). Left for after the draws, the large cases of the items that start together (the longest, first) met
        at the lock: on an H200 the item holding one took up to 69 s longer than its adapter's other shards."""
        while self.large and large_lock.free():
            self.example(self.large.pop(0))

    def prop(self, case: Case) -> None:
        """hypothesis' test. A case of a cause not found yet raises that cause's own exception type (hypothesis tells
        distinct types apart and never shrinks one into another); a found cause passes, so the search goes on. A
        large case still to judge goes first when the machine's lock for them is free (`large_if_free`)."""
        self.large_if_free()
        if finding_of(self.adapter.known, case) is not None:
            self.excluded += 1  # the finding's region: its own case is judged every run instead
            return
        if self.given_up(case):
            return
        r = self.judge(case)
        key = self.cause(r)
        if key is None or key in self.causes:
            return
        self.raised[key] = r  # the last raise of a cause is hypothesis' replay of its shrunk case
        name = f"FailureCause{len(self.errors) + 1}"
        raise self.errors.setdefault(key, type(name, (AssertionError,), {}))(_explain(r))

    def run(self, test: Callable[[], None]) -> None:
        """Run hypothesis until it finds no new cause, or MAX_CAUSES are known. It stops at its first failure when
        shrinking is off (the ci profile) and soon after it otherwise; each rerun draws the same cases again (already
        judged) and goes past the causes found."""
        while len(self.causes) < MAX_CAUSES:
            self.raised = {}
            try:
                test()
                return
            except Exception as e:
                if not self.raised or not _only(e, tuple(self.errors.values())):
                    raise
            self.causes.update(self.raised)

    def report(self) -> str:
        """Every distinct cause of failure (grouped again with all that was judged by the end), each with one case and
        how to replay it; "" when nothing failed."""
        groups: dict[Cause, list[Result]] = {}
        for r in self.failed:
            groups.setdefault(failure_cause(r, self.judged), []).append(r)
        chosen = {id(r) for r in self.causes.values()}
        parts = [f"{len(groups)} distinct cause(s) of failure among {len(self.judged)} judged cases"
                 + (f" (the search stopped after {MAX_CAUSES} causes)" if len(self.causes) >= MAX_CAUSES else "")]
        if self.unjudged:
            given_up = sum(n >= DEATHS_PER_CELL for n in self.deaths.values())
            parts.append(f"{self.unjudged} case(s) of {given_up} cell(s) not judged: each of those cells' cases had "
                         f"ended the kernel host {DEATHS_PER_CELL} times (crash, lost CUDA context or hang)")
        for n, ((verdict, what, separating), found) in enumerate(groups.items(), 1):
            where = (", ".join(f"{k}={v}" for k, v in separating) if separating
                     else "no feature value sets it apart (each ran without it elsewhere)")
            r = next((x for x in found if id(x) in chosen), found[0])
            parts.append(f"cause {n}: {verdict} ({what}) where {where}; {len(found)} failing case(s), one of them:\n"
                         f"  {_explain(r)}")
        return "\n".join(parts) if groups else ""


def _cell(case: Case) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(case.features.items()))


def as_known(known: tuple[KnownFinding, ...], r: Result) -> KnownFinding | None:
    """The known finding that `r` is: a `fail` inside its region whose failed checks it declares (None: `r` is
    something else, judged as usual)."""
    found = finding_of(known, r.case)
    if found is None or r.verdict != "fail" or not found.expected(r.metrics.get("failed_checks", [])):
        return None
    return found


def _record_not_installed(adapter: registry.Adapter, cells: list[dict[str, str]], device, results) -> None:  # type: ignore[no-untyped-def]
    """One `not-installed` verdict per declared cell: the runner's gate answers it without running anything, so
    without the judging's snapshot and restore of the process state (`runner.gated_verdict`, as a sweep's planning
    gives it; 7 ms a case on a CPU core, hundreds of cells for one library's adapter). Each cell's case is its
    first boundary case that fits, and only that one is fitted (fitting a moved case builds its inputs and oracle on
    the CPU: fitting every one, to keep the first, was 74 s of a GPU suite's workers)."""
    fitting.ask_rules_at_once(adapter, None, cells)  # a hosted adapter's rule for every cell in one request
    for cell in cells:
        first = fitting.boundary(adapter, cell, most=1)[0]
        case = Case(op=adapter.op, adapter=adapter.name, features=dict(cell), **first)
        results.append(runner.gated_verdict(case, adapter, device) or runner.judge(case, adapter, device))


def _fail_on_vacuous_cells(judged: list[Result], deliberate: set[str]) -> None:
    """A declared cell whose every drawn case passed vacuously (an all-zero or empty expected output, which any
    kernel that clears its output passes) was not tested: say so instead of passing."""
    cells: dict[str, list[bool]] = {}
    for r in judged:
        if r.verdict != "pass" or r.case.case_id in deliberate:
            continue
        key = ", ".join(f"{k}={v}" for k, v in sorted(r.case.features.items()))
        cells.setdefault(key, []).append(bool(r.metrics.get("exercised", {}).get("vacuous", False)))
    empty = [key for key, vac in cells.items() if all(vac)]
    assert not empty, ("declared cells exercised only by vacuous cases (all-zero or empty expected output: nothing "
                       "was tested): " + "; ".join(empty))


def test_undeclared_cells_rejected_cleanly(moe_adapter_name, moe_device, moe_results,  # type: ignore[no-untyped-def]
                                           moe_unverifiable, request) -> None:
    adapter = _hosted(request, moe_adapter_name, moe_device)
    moe_device = adapter.device_for(moe_device)
    if moe_device.generation not in adapter.generations:
        pytest.skip(f"{moe_adapter_name} does not run on {moe_device.generation} (reported as unsupported)")
    if (missing := adapter.not_installed()) is not None:
        pytest.skip(f"{moe_adapter_name}: not installed (its declared cells are recorded as such): {missing}")
    cells = hs.undeclared_cells(adapter, moe_device)  # only where they will be judged (a rule asked for each)
    problems = []
    judged: list[Result] = []
    for cell in cells[:12]:
        bounds = fitting.boundary(adapter, cell)
        fields = bounds[min(1, len(bounds) - 1)]
        case = runner.Case(op=adapter.op, adapter=adapter.name, features=cell, **fields)
        moe_results.begin(case, moe_device.to_dict(), moe_device.generation)
        # the fixture also installs the interpreter's fidelity fixes: without them (this test alone in a process)
        # an interpreted bf16 tl.dot returns garbage
        r = runner.judge(case, adapter, moe_device, unverifiable=moe_unverifiable)
        moe_results.append(r)
        judged.append(r)
        # works but not claimed (reported by the matrix), not checkable by this interpreter, or rejected cleanly
        # (the runner's rejects_cleanly: a rejection naming nothing of the cell is an error there, as in the matrix)
        if r.verdict not in ("pass", "not-verifiable", "unsupported"):
            problems.append(f"undeclared cell {cell}: {_explain(r)}")
    assert not problems, "\n".join(problems)
    _skip_or_count_unverified(request, moe_adapter_name, judged)


def known_outcome(found: KnownFinding, r: Result) -> tuple[str, str]:
    """How a known finding's own case came out: ("reproduced" | "gone" | "other" | "unverified", in words)."""
    doc = f"{r.adapter}: known finding {found.finding!r} ({found.describe()})"
    if as_known((found,), r) is not None:
        return "reproduced", f"{doc} reproduces: fail ({what_failed(r)[1]})"
    if r.verdict == "pass":
        return "gone", (f"{doc} no longer reproduces: its case passed. Remove the declaration (and say so in the "
                        f"findings document) so that its region is searched again.\n  case: {r.case.to_json()}")
    if r.verdict in UNVERIFIED:
        return "unverified", f"{doc}: {r.verdict}: {r.reason}"
    return "other", (f"{doc}: its case did not fail as declared (expected a fail of some of "
                     f"{', '.join(found.checks)}):\n  {_explain(r)}")


def test_known_findings_reproduce(moe_known_adapter, moe_device, moe_results, moe_unverifiable,  # type: ignore[no-untyped-def]
                                  request) -> None:
    """Strict expected failure: each known finding's case must fail as declared (xfailed); a pass, or another
    failure, fails this test."""
    adapter = _hosted(request, moe_known_adapter, moe_device)
    moe_device = adapter.device_for(moe_device)
    if not any(adapter.declares(k.case.features, moe_device)[0] for k in adapter.known):
        pytest.skip(f"{moe_known_adapter}: no known finding's case is declared on {moe_device.generation}")
    if (missing := adapter.not_installed()) is not None:
        pytest.skip(f"{moe_known_adapter}: not installed: {missing}")
    outcomes: dict[str, list[str]] = {}
    for found in adapter.known:
        if not adapter.declares(found.case.features, moe_device)[0]:
            continue
        moe_results.begin(found.case, moe_device.to_dict(), moe_device.generation)
        r = runner.judge(found.case, adapter, moe_device, unverifiable=moe_unverifiable)
        moe_results.append(r)
        kind, text = known_outcome(found, r)
        outcomes.setdefault(kind, []).append(text)
    if problems := outcomes.get("gone", []) + outcomes.get("other", []):
        pytest.fail("\n".join(problems), pytrace=False)
    if not outcomes.get("reproduced"):
        pytest.skip("; ".join(outcomes.get("unverified", [])))
    pytest.xfail("; ".join(outcomes["reproduced"]))
