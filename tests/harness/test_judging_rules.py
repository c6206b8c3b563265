"""Judging rules the matrix and the pytest plugin share: what counts as rejecting an undeclared cell cleanly (one
rule, the same verdict in both), a case the support rule excludes by shape is unsupported under pytest too, and a
property test that fails reports every distinct cause it found, not only the first."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import registry, sweep
from harness.core.case import Case
from harness.core.device import detect
from harness.core.result import Result
from harness.engine import runner
from harness.engine.profiles import PROFILES
from harness.plugin import generic
from harness.store import render
from harness.store.results import load_meta, load_results
from tests.harness.test_plugin import _pytest as child_pytest

FIXTURES = "tests.harness.fixtures.rule_adapters"
BARE, NAMED = f"{FIXTURES}:BARE_ASSERT", f"{FIXTURES}:NAMED"


def _raised(make: type[BaseException], *args: str, cause: BaseException | None = None) -> BaseException:
    try:
        raise make(*args) from cause
    except BaseException as e:  # with a traceback and its cause, as the runner sees it
        return e


@pytest.mark.parametrize(("error", "clean"), [
    (_raised(AssertionError), False),  # a bare assert: says nothing
    (_raised(IndexError, "index 7 is out of bounds for dimension 0"), False),  # a crash naming nothing of the cell
    (_raised(ValueError, "no gelu-and-mul epilogue"), True),  # names the value (spaces, case and `-` ignored)
    (_raised(ValueError, "unsupported Activation"), True),  # names the axis
    (_raised(RuntimeError, "launch failed", cause=_raised(KeyError, "gelu_and_mul")), True),  # its cause names it
    (_raised(registry.Unsupported, "only the fused path"), True),  # a deliberate rejection with a message
    (_raised(NotImplementedError, "later"), True),
    (_raised(registry.Unsupported), False),  # deliberate, but silent
    (_raised(NotImplementedError), False),
    (_raised(AttributeError, "'NoneType' object has no attribute 'shape'"), False),  # "none" only inside a word
    (_raised(TypeError, "expected a float32 or none tensor"), True),
])
def test_what_rejects_an_undeclared_cell_cleanly(error: BaseException, clean: bool) -> None:
    cell = {"activation": "gelu_and_mul", "dtype": "float32", "expert_map": "none"}
    assert runner.rejects_cleanly(error, cell) is clean


def _undeclared_verdicts(results: list[Result], adapter: str) -> dict[str, set[str]]:
    """Cell -> the verdicts of its undeclared cases."""
    found: dict[str, set[str]] = collections.defaultdict(set)
    for r in results:
        if r.adapter == adapter and not r.declared:
            found[",".join(f"{k}={v}" for k, v in sorted(r.case.features.items()))].add(r.verdict)
    return found


def test_the_matrix_and_pytest_classify_a_rejection_the_same_way(tmp_path: Path) -> None:
    """A bare `assert` is an error in both front ends; a message naming the value is unsupported in both."""
    sweep.run_sweep([BARE, NAMED], detect("cpu"), str(tmp_path / "sweep"), profile="quick", run_id="t", jobs=1,
                    case_timeout=120, out=None)
    swept = load_results([tmp_path / "sweep"])
    code, out, err = child_pytest(tmp_path, "-k", "test_undeclared_cells_rejected_cleanly",
                                  "--moe-device", "cpu", "--moe-adapter", BARE, "--moe-adapter", NAMED)
    tested = load_results([tmp_path / "results"])
    for name, verdict in (("rejects-with-bare-assert", "error"), ("rejects-naming-the-value", "unsupported")):
        in_matrix, in_pytest = _undeclared_verdicts(swept, name), _undeclared_verdicts(tested, name)
        assert in_matrix and in_pytest and set(in_pytest) <= set(in_matrix), (in_matrix, in_pytest)
        assert all(v == {verdict} for v in in_matrix.values()), in_matrix
        assert all(v == {verdict} for v in in_pytest.values()), in_pytest
    # the matrix lists the bare assert's cells among its bugs, and the named rejection's nowhere
    model = render.build(swept, load_meta([tmp_path / "sweep"]))
    unclean = {row["adapter"] for row in model["declared_vs_verified"]["undeclared_not_rejected"]}
    assert unclean == {"rejects-with-bare-assert"}, unclean
    # pytest fails the bare assert's test, saying why, and passes the other
    assert code == 1 and "1 failed, 1 passed" in out, out[-3000:] + err[-2000:]
    failed = [line for line in out.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1 and "rejects-with-bare-assert" in failed[0], out[-3000:]
    assert "naming none of its axes or values: AssertionError" in out, out[-3000:]


def test_a_boundary_example_the_shape_rule_excludes_is_unsupported_under_pytest(tmp_path: Path) -> None:
    """The adapter's rule excludes M = 0 (its kernel would crash there): the explicit empty-batch examples follow
    the rule (moved to sizes it accepts), and one that is still judged is recorded unsupported, as the matrix
    reports it, never failed; the test passes."""
    code, out, err = child_pytest(tmp_path, "-k", "test_declared_cases_pass",
                                  "--moe-device", "cpu", "--moe-adapter", f"{FIXTURES}:NO_EMPTY_BATCH")
    assert code == 0 and "1 passed" in out, out[-3000:] + err[-2000:]
    results = load_results([tmp_path / "results"])
    empty = [r for r in results if r.case.shapes["M"] == 0]
    assert all(r.verdict == "unsupported" and "no empty batch" in r.reason for r in empty), \
        [(r.verdict, r.reason) for r in empty]
    assert any(r.verdict == "pass" for r in results)
    # an empty batch judged all the same (a case file, a replay) is unsupported, its kernel never run
    from tests.harness.fixtures.rule_adapters import NO_EMPTY_BATCH

    cell = next(iter(NO_EMPTY_BATCH.declared_cells({a: v for a, v in NO_EMPTY_BATCH.support.items()})))
    case = Case(op=NO_EMPTY_BATCH.op, adapter=NO_EMPTY_BATCH.name, features=cell, seed=0,
                shapes={"M": 0, "E": 8, "k": 2}, dtypes={"router_logits": cell.get("logits_dtype", "float32")})
    r = runner.judge(case, NO_EMPTY_BATCH, detect("cpu"))
    assert r.verdict == "unsupported" and "no empty batch" in r.reason, (r.verdict, r.reason)


def test_a_failing_property_test_names_every_distinct_cause(tmp_path: Path) -> None:
    """Two independent bugs (a crash on an empty batch, wrong results for one activation): both are reported,
    each with its case and replay command."""
    code, out, err = child_pytest(tmp_path, "-k", "test_declared_cases_pass",
                                  "--moe-device", "cpu", "--moe-adapter", f"{FIXTURES}:TWO_BUGS")
    assert code == 1, out[-3000:] + err[-2000:]
    assert "2 distinct cause(s) of failure" in out, out[-4000:]
    assert "cause 1: error (RuntimeError)" in out and "cannot launch a grid of 0 programs" in out, out[-4000:]
    assert "(out) where activation=gelu_and_mul" in out, out[-4000:]
    assert out.count("python -m harness replay case.json") >= 2, out[-4000:]


# ------------------------------------------------------------------- the search itself, on causes only drawn cases hit

def _crash_on_odd_tokens_and_wrong_gelu(case: Case, inputs: dict, outputs: dict) -> None:
    if case.shapes["T"] % 2:
        raise RuntimeError("odd token count")
    registry.resolve("reference-activation").run(case, inputs, outputs)
    if case.features["activation"] == "gelu_and_mul":
        outputs["out"].add_(1)


class _Store:
    def __init__(self) -> None:
        self.appended: list[Result] = []

    def begin(self, *args: object) -> None:
        pass

    def append(self, r: Result) -> None:
        self.appended.append(r)


@pytest.mark.parametrize("profile", ["ci", "gpu"])  # hypothesis without shrinking, and with it
def test_the_search_goes_past_its_first_failure(profile: str) -> None:
    """Causes that only drawn cases hit: hypothesis stops at its first failure (at once without a shrink phase),
    the search reruns it past each cause found until none is new; every case is judged and recorded once."""
    reference = registry.resolve("reference-activation")
    adapter = registry.Adapter(name="odd-and-gelu", op="activation", source="tests", support=reference.support,
                               run=_crash_on_odd_tokens_and_wrong_gelu, test_aid=True)
    pool = [Case(op="activation", adapter=adapter.name, features={"activation": act, "dtype": "float32"},
                 shapes={"T": t, "N": 16}, dtypes={"x": "float32"}, seed=1)
            for act in ("silu_and_mul", "gelu_and_mul") for t in (2, 3, 4)]
    store = _Store()
    search = generic._Search(adapter, detect("cpu"), store, None)
    calls = []

    def prop(case):  # type: ignore[no-untyped-def]
        calls.append(case.case_id)
        search.prop(case)

    search.run(settings(PROFILES[profile], max_examples=40)(given(case=st.sampled_from(pool))(prop)))
    causes = {(verdict, what) for verdict, what, _ in search.causes}
    assert causes == {("error", "RuntimeError"), ("fail", "out")}, search.causes
    report = search.report()
    assert "2 distinct cause(s)" in report and "where activation=gelu_and_mul" in report, report
    ids = [r.case.case_id for r in store.appended]
    assert len(ids) == len(set(ids)) and len(calls) > len(ids), (len(ids), len(calls))
