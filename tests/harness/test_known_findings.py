"""Known findings (`harness.core.known`): a documented third-party divergence is left out of the generic test's
search, its own case must still fail as declared every run, the matrix still judges it, the coverage report shows
the region, and a declaration that excludes nothing or everything is refused."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import plugin, registry
from harness.core.case import Case
from harness.core.device import detect
from harness.core.known import KnownFinding
from harness.core.result import Result
from harness.engine import strategies as hs
from harness.engine.profiles import PROFILES
from harness.plugin.generic import _Search, known_outcome
from harness.store.results import ResultStore, load_results
from tests.harness.fixtures import known_adapters as ka

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = "tests.harness.fixtures.known_adapters"


def _adapter(**change: object) -> registry.Adapter:
    """KNOWN_OK with its finding's fields replaced."""
    return dataclasses.replace(ka.KNOWN_OK, known=(ka.region("known-ok", **change),))


@pytest.mark.parametrize(("change", "words"), [
    ({"features": {}, "shapes": {}}, "covers every case of the adapter"),
    ({"features": {"dtype": ("float32", "bfloat16")}, "shapes": {}}, "covers every case the adapter declares"),
    ({"features": {"dtype": ("float32", "bfloat16")}, "shapes": {"T": {"min": 0}}}, "covers every case"),
    ({"features": {"dtype": ("float16",)}}, "does not declare (no case has it)"),
    ({"features": {"dtype": ()}}, "non-empty tuple"),
    ({"features": {"colour": ("red",)}}, "axis 'colour'"),
    ({"shapes": {"T": ()}}, "non-empty tuple of sizes"),
    ({"shapes": {"T": {"min": 5, "max": 2}}}, "min <= max"),
    ({"shapes": {"Q": (1,)}}, "dim 'Q'"),
    ({"shapes": {"T": (1,)}}, "lies outside its region"),
    ({"checks": ()}, "checks must name"),
    ({"finding": " "}, "where it is documented"),
])
def test_a_declaration_that_is_empty_or_covers_everything_is_refused(change: dict, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        _adapter(**change)


def test_a_finding_whose_case_is_of_an_undeclared_cell_is_refused() -> None:
    case = ka.region("known-ok").case.replace(features={"activation": "gelu_and_mul", "dtype": "bfloat16"})
    with pytest.raises(ValueError, match="its case's cell is not declared"):
        _adapter(case=case, features={"dtype": ("bfloat16",)})


def test_the_region_holds_its_cases_only() -> None:
    found = ka.region("known-ok")
    case = found.case
    assert found.contains(case) and found.describe() == "dtype in {bfloat16}, T >= 1"
    assert not found.contains(case.replace(features={**case.features, "dtype": "float32"}))
    assert not found.contains(case.replace(shapes={"T": 0, "N": 63}))
    assert KnownFinding.from_dict(json.loads(json.dumps(found.to_dict()))) == found


def _result(found: KnownFinding, verdict: str, failed: list[str]) -> Result:
    return Result(case=found.case, verdict=verdict, reason=f"why {verdict}", metrics={"failed_checks": failed})


def test_the_findings_case_must_fail_as_declared() -> None:
    found = ka.region("known-ok")
    assert known_outcome(found, _result(found, "fail", ["out"]))[0] == "reproduced"
    gone = known_outcome(found, _result(found, "pass", []))
    assert gone[0] == "gone" and "no longer reproduces" in gone[1]
    assert known_outcome(found, _result(found, "fail", ["out", "written:out"]))[0] == "other"  # a check not declared
    # the judging drew the extra runs (at random, one in eight): they fail the same declared check again
    assert known_outcome(found, _result(found, "fail", ["out", "repeat:out", "fresh_inputs:out"]))[0] == "reproduced"
    assert known_outcome(found, _result(found, "fail", ["out", "repeat:written:out"]))[0] == "other"
    assert known_outcome(found, _result(found, "error", []))[0] == "other"
    assert known_outcome(found, _result(found, "not-verifiable", []))[0] == "unverified"


class _Store:
    def begin(self, *args: object) -> None:
        pass

    def append(self, r: Result) -> None:
        pass


def _search(adapter: registry.Adapter) -> _Search:
    """The generic test's search over the adapter's cells, in this process (the ci profile)."""
    device = adapter.device_for(detect("cpu"))
    search = _Search(adapter, device, _Store(), set())
    search.run(hs.property_test(adapter, hs.declared_cells(adapter, device), device, PROFILES["ci"], search))
    return search


def test_the_search_leaves_the_region_out_and_finds_a_failure_outside_it() -> None:
    undeclared = _search(ka.UNDECLARED)  # the same bug, not declared: the search finds it
    assert "distinct cause(s) of failure" in undeclared.report()
    declared = _search(ka.KNOWN_OK)
    found = ka.KNOWN_OK.known[0]
    assert declared.report() == "" and not any(found.contains(r.case) for r in declared.judged)
    outside = _search(ka.BUG_OUTSIDE)  # the declared region is left out, the bug outside it is still found
    assert outside.report() and outside.failed
    assert all(r.case.features["dtype"] == "float32" for r in outside.failed)


def test_a_known_fixed_case_is_not_a_cause_but_another_failure_inside_the_region_is() -> None:
    search = _Search(ka.KNOWN_OK, ka.KNOWN_OK.device_for(detect("cpu")), _Store(), set())
    case = ka.KNOWN_OK.known[0].case
    search.example(case)
    assert search.report() == "" and [r.case.case_id for r in search.known] == [case.case_id]
    wrong_check = dataclasses.replace(ka.KNOWN_OK, known=(ka.region("known-ok", checks=("finite:out",)),))
    other = _Search(wrong_check, wrong_check.device_for(detect("cpu")), _Store(), set())
    other.example(case)
    assert "fail (out)" in other.report()


def _pytest(tmp_path: Path, *args: str) -> tuple[int, str]:
    plugin_arg = plugin.load_args()
    cmd = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *plugin_arg, "-p", "no:randomly",
           "harness/plugin/generic.py", "--moe-results-dir", str(tmp_path / "results"), "--moe-device", "cpu", *args]
    p = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1"),
                       capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout + p.stderr


def test_the_generic_tests_xfail_the_finding_fail_outside_it_and_fail_when_it_is_gone(tmp_path: Path) -> None:
    code, out = _pytest(tmp_path, *(f"--moe-adapter={FIXTURES}:{n}" for n in ("KNOWN_OK", "BUG_OUTSIDE", "GONE")))
    lines = {m[2]: m[1] for m in re.finditer(r"^(PASSED|FAILED|XFAIL|SKIPPED|ERROR) (\S+)", out, re.M)}

    def outcome(test: str, name: str) -> str:
        return next((v for k, v in lines.items() if k.endswith(f"{test}[{name}]")), "absent")

    assert code == 1, out[-4000:]
    assert outcome("test_declared_cases_pass", "known-ok-shard0") == "PASSED", out[-4000:]
    assert outcome("test_undeclared_cells_rejected_cleanly", "known-ok") == "PASSED", out[-4000:]
    assert outcome("test_known_findings_reproduce", "known-ok") == "XFAIL", out[-4000:]
    assert "a fake finding: bfloat16 outputs off by one" in out and "reproduces: fail (out)" in out
    assert outcome("test_declared_cases_pass", "known-bug-outside-shard0") == "FAILED", out[-4000:]
    assert outcome("test_known_findings_reproduce", "known-bug-outside") == "XFAIL", out[-4000:]
    assert outcome("test_declared_cases_pass", "known-gone-shard0") == "PASSED", out[-4000:]
    assert outcome("test_known_findings_reproduce", "known-gone") == "FAILED", out[-4000:]
    assert "no longer reproduces" in out
    # the finding's case is recorded as what it is: a fail
    recorded = [r for r in load_results([tmp_path / "results"])
                if r.case.case_id == ka.region(r.case.adapter).case.case_id]
    assert {(r.adapter, r.verdict) for r in recorded} >= {("known-ok", "fail"), ("known-gone", "pass")}


def test_only_adapters_that_declare_a_finding_get_its_test(tmp_path: Path) -> None:
    code, out = _pytest(tmp_path, "--collect-only", "--moe-adapter", "reference-activation",
                        "--moe-adapter", f"{FIXTURES}:KNOWN_OK")
    assert code == 0, out[-3000:]
    assert "test_known_findings_reproduce[known-ok]" in out and "NOTSET" not in out
    code, out = _pytest(tmp_path, "--collect-only", "--moe-adapter", "reference-activation")
    assert code == 0 and "test_known_findings_reproduce" not in out, out[-3000:]


def test_the_matrix_still_judges_and_records_the_region(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness import sweep

    monkeypatch.setitem(registry._REGISTRY, "known-ok", ka.KNOWN_OK)
    store = ResultStore(tmp_path, run_id="known")
    sweep.sweep(["known-ok"], detect("cpu"), store, out=None)
    store.close()
    found = ka.KNOWN_OK.known[0]
    inside = [r for r in load_results([tmp_path]) if r.declared and found.contains(r.case)]
    assert inside and all(r.verdict == "fail" for r in inside)


def test_the_coverage_report_shows_the_excluded_region() -> None:
    from harness.commands.coverage import render, summary
    from harness.engine import coverage as cov

    report = cov.adapter_coverage(ka.KNOWN_OK, cov.device_for("interp"), PROFILES["ci"])
    assert len(report.known) == 1 and report.known[0].startswith("dtype in {bfloat16}, T >= 1: known finding")
    text = render([report], "ci", "interp")
    assert "- known-ok: excluded region: dtype in {bfloat16}, T >= 1" in text
    assert "known-finding regions excluded from the search: known-ok (1)" in summary([report], "ci", "interp", 1.0)


def test_the_sglang_finding_is_the_documented_one() -> None:
    """Its case is the committed case file's, its region is top-k 1 with a token, and FINDINGS.md has the entry."""
    from kernels.adapters.external import sglang_triton as sg

    found = sg.EXPERTS.known[0]
    doc = json.loads((ROOT / "docs/findings/sglang-triton-topk1-unwritten-intermediate.json").read_text())
    assert found.case.case_id == Case.from_dict(doc["case"]).case_id
    assert {c["name"] for c in doc["comparisons"] if not c["passed"]} <= set(found.checks)
    number = re.match(r"docs/FINDINGS\.md (\d+) ", found.finding)
    assert number and f"### {number[1]}. Top-k 1 on the portable path" in (ROOT / "docs/FINDINGS.md").read_text()
    case = found.case
    assert found.contains(case.replace(shapes={**case.shapes, "E": 1, "M": 40}))
    assert not found.contains(case.replace(shapes={**case.shapes, "k": 2}))
    assert not found.contains(case.replace(shapes={**case.shapes, "M": 0}))  # no token: it returns at once


def _grouped(**change: object) -> KnownFinding:
    """A region constrained by an op parameter (grouped routing's num_groups), as vllm-cuda-grouped-topk declares."""
    found = KnownFinding(
        finding="a fake finding: one group", checks=("topk_weights",), features={"scoring": ("softmax",)},
        params={"num_groups": (1,)},
        case=Case(op="grouped_routing", adapter="fake-grouped", features={"scoring": "softmax"},
                  shapes={"E": 8, "M": 2, "k": 1}, params={"num_groups": 1, "topk_group": 1}, seed=0))
    return dataclasses.replace(found, **change)


def test_a_region_can_be_bounded_by_an_op_parameter() -> None:
    from harness.core.known import validate

    found = _grouped()
    case = found.case
    assert found.contains(case) and found.describe() == "scoring in {softmax}, num_groups = 1"
    assert not found.contains(case.replace(params={"num_groups": 4, "topk_group": 2}))
    assert not found.contains(case.replace(params={}))  # a case without the parameter lies outside
    assert KnownFinding.from_dict(json.loads(json.dumps(found.to_dict()))) == found
    ranged = _grouped(params={"num_groups": {"min": 2}}, case=case.replace(params={"num_groups": 2}))
    assert ranged.contains(ranged.case) and not ranged.contains(case) and "num_groups >= 2" in ranged.describe()
    # the search's test: a drawn case's fields carry its params
    adapter = type("A", (), {"known": (found,)})()
    assert hs.known_region(adapter, case.features, {"shapes": case.shapes, "params": case.params})
    assert not hs.known_region(adapter, case.features, {"shapes": case.shapes, "params": {"num_groups": 2}})
    support = {"scoring": ("softmax", "sigmoid")}
    validate(found, "fake-grouped", "grouped_routing", support, {})
    # a region bounded by a parameter never covers the whole space, even with every feature value named
    validate(_grouped(features={"scoring": ("softmax", "sigmoid")}), "fake-grouped", "grouped_routing", support, {})
    for change, words in [({"params": {"groups": (1,)}}, "params names 'groups'"),
                          ({"params": {"num_groups": ()}}, "non-empty tuple of ints or a range"),
                          ({"params": {"num_groups": {"min": 3, "max": 1}}}, "non-empty tuple of ints or a range"),
                          ({"params": {"num_groups": (2,)}}, "lies outside its region")]:
        with pytest.raises(ValueError, match=re.escape(words)):
            validate(_grouped(**change), "fake-grouped", "grouped_routing", support, {})
