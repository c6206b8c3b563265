"""A clamp limit that varies per case: an adapter whose kernel takes the activation's limit per call states it per
case with `conventions_for`, and the oracle follows it case by case (docs/CONVENTIONS.md, the activation op's
contract)."""

from __future__ import annotations

from harness import ops
from harness.core.case import Case
from harness.core.device import detect
from harness.engine import runner
from reference import activations as act_ref
from tests.harness.fixtures import case_limit_adapter as fx

CPU = detect("cpu")


def _cases(adapter, activation: str) -> list[Case]:  # type: ignore[no-untyped-def]
    cell = {"activation": activation, "dtype": "float32"}
    fields = [f for f in ops.get("activation").boundary(adapter, cell) if f["shapes"]["T"] > 1]
    return [Case(op="activation", adapter=adapter.name, features=cell, seed=seed, **f)
            for f in fields for seed in range(len(fx.LIMITS))]


def test_the_oracle_follows_a_limit_stated_per_case() -> None:
    for act in fx.ACTIVATIONS:
        cases = _cases(fx.ADAPTER, act)
        assert {fx.limit_of(c) for c in cases} == set(fx.LIMITS)  # the limit does vary over the cases
        for case in cases:
            r = runner.judge(case, fx.ADAPTER, CPU)
            assert r.verdict == "pass", (act, fx.limit_of(case), r.reason)


def test_a_limit_the_adapter_does_not_state_fails_where_it_differs() -> None:
    """The control: the same kernel without its case-dependent statement is judged with the default limit, which
    none of its limits is, so every case fails."""
    assert act_ref.SWIGLUOAI_LIMIT not in fx.LIMITS and act_ref.SWIGLUSTEP_LIMIT not in fx.LIMITS
    for act in fx.ACTIVATIONS:
        for case in _cases(fx.WRONG, act):
            r = runner.judge(case, fx.WRONG, CPU)
            assert r.verdict == "fail", (act, fx.limit_of(case), r.reason)
