"""No vacuous cases: an all-zero or empty expected output tests nothing, so such cases are
deliberate boundary cases, never draws; each verdict records what it exercised; the generic test fails for a
declared cell that only vacuous cases backed."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import registry
from harness.core.case import Case
from harness.core.result import Result
from harness.engine import runner
from harness.engine import strategies as hs
from harness.ops import experts as experts_op
from harness.ops import get as get_op
from harness.ops.base import Check
from harness.plugin.generic import _fail_on_vacuous_cells, _vacuous_boundary_cases


def _result(features: dict[str, str], vacuous: bool, seed: int, verdict: str = "pass") -> Result:
    case = Case(op="activation", adapter="a", features=features, shapes={"T": 1, "N": 1}, seed=seed)
    return Result(case=case, verdict=verdict, metrics={"exercised": {"vacuous": vacuous}})


def test_exercised_summary() -> None:
    zeros = Check("out", "bounded", expected=torch.zeros(3, 4))
    some = Check("out", "bounded", expected=torch.tensor([0.0, 1.0]))
    ids = Check("ids", "exact", expected=torch.zeros(2, dtype=torch.int32))  # integer zeros are values, not absence
    empty = Check("out", "bounded", expected=torch.zeros(0, 8))
    masked = Check("out", "bounded", expected=torch.tensor([1.0, 0.0]), mask=torch.tensor([False, True]))
    assert runner.exercised([zeros])["vacuous"]
    assert not runner.exercised([zeros, some])["vacuous"]
    assert runner.exercised([some])["nonzero"] == 1
    assert not runner.exercised([ids])["vacuous"]
    assert runner.exercised([empty])["vacuous"]
    assert runner.exercised([masked])["vacuous"]  # the only non-zero value is outside the contract
    assert not runner.exercised([Check("out", "custom")])["vacuous"]  # no expected tensor: cannot tell


def test_a_cell_backed_only_by_vacuous_cases_fails_the_generic_test() -> None:
    a, b = {"activation": "x", "dtype": "bfloat16"}, {"activation": "y", "dtype": "bfloat16"}
    _fail_on_vacuous_cells([_result(a, True, 1), _result(a, False, 2), _result(b, False, 3)], set())
    with pytest.raises(AssertionError, match="activation=y"):
        _fail_on_vacuous_cells([_result(a, False, 1), _result(b, True, 2)], set())
    deliberate = _result(b, True, 4)
    _fail_on_vacuous_cells([_result(a, False, 1), deliberate], {deliberate.case.case_id})


def test_verdicts_record_what_they_exercised(device_info) -> None:  # type: ignore[no-untyped-def]
    adapter = registry.resolve("reference-activation")
    cell = hs.declared_cells(adapter, device_info)[0]
    (empty,) = _vacuous_boundary_cases(adapter, [cell])
    r = runner.judge(empty, adapter, device_info)
    assert r.verdict == "pass" and r.metrics["exercised"]["vacuous"]
    full = Case(op="activation", adapter=adapter.name, features=cell, shapes={"T": 3, "N": 8},
                dtypes={"x": cell["dtype"]})
    r = runner.judge(full, adapter, device_info)
    assert r.verdict == "pass" and not r.metrics["exercised"]["vacuous"]
    assert r.metrics["exercised"]["nonzero"] > 0


@pytest.mark.parametrize("name", ["triton-experts", "triton-reduce", "triton-align"])
def test_draws_are_never_vacuous(name: str, device_info) -> None:  # type: ignore[no-untyped-def]
    """No token, no local expert, or an expert map that excludes every routed expert: never drawn."""
    adapter = registry.resolve(name)
    spec = get_op(adapter.op)
    cells = [c for c in hs.declared_cells(adapter, device_info) if c.get("expert_map", "N") not in ("N", "none")]
    assert cells
    # the routing and the map are all the check reads: the experts' inputs without their quantized weights (the
    # GPU profile's sizes made quantizing every expert most of this test: 56 s on an H200, 1.2 s on 2 CPU cores)
    make_inputs = experts_op.unquantized_inputs if adapter.op == "experts" else spec.make_inputs

    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=hs.cases(adapter, cells), data=st.data())
    def check(case: Case, data: st.DataObject) -> None:
        if case.features.get("format") == "batched":
            return
        assert case.shapes["M"] >= 1
        assert case.params["local_experts"] >= 1
        inputs = make_inputs(case, "cpu")
        routed = inputs["topk_ids"].long().reshape(-1)
        assert bool((inputs["expert_map"].long()[routed] >= 0).any()), case

    check()


def test_the_generic_test_runs_both_vacuous_boundary_cases_on_purpose(device_info) -> None:  # type: ignore[no-untyped-def]
    adapter = registry.resolve("triton-experts")
    found = _vacuous_boundary_cases(adapter, hs.declared_cells(adapter, device_info))
    assert sorted(("M" if c.shapes["M"] == 0 else "local") for c in found) == ["M", "local"]
    assert all(c.shapes["M"] > 0 for c in found if c.params.get("local_experts") == 0)
