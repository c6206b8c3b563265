"""Routing rules an adapter declares (`group_scoring`, `unkept_groups`, `renormalize_eps`), judged in-process with
tiny pure-torch routers written for the test: each router computing a rule other than the oracle's default fails
until its adapter declares the rule, then passes; a router that breaks the declared rule still fails."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest
import torch

from harness import registry
from harness.core.case import Case
from harness.engine import runner

GROUPED = {"scoring": "softmax", "correction_bias": "N", "renormalize": "Y", "scaling_placement": "weights",
           "logits_dtype": "float32", "nonfinite_rows": "N"}
PLAIN = {"scoring": "sigmoid", "renormalize": "Y", "correction_bias": "N", "logits_dtype": "float32",
         "nonfinite_rows": "Y"}
Run = Callable[[Case, dict[str, torch.Tensor], dict[str, torch.Tensor]], None]


def _topk_any_tie(t: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k indices, ties broken by a fixed shuffle of the columns (as a GPU top-k may): zero-score picks then
    spread over the groups."""
    perm = torch.randperm(t.shape[-1], generator=torch.Generator().manual_seed(7)).to(t.device)  # a GPU case too
    return perm[torch.sort(t[:, perm], dim=-1, descending=True, stable=True).indices[:, :k]]


def _renormalized(w: torch.Tensor, eps: float | None) -> torch.Tensor:
    total = w.sum(dim=-1, keepdim=True)
    return w / (total if eps is None else total + eps)


def _grouped_router(group_scoring: str, fill: float = float("-inf"), eps: float | None = None,
                    ignore_groups: bool = False) -> Run:
    """Grouped top-k in fp32 torch: groups scored by `group_scoring`, unkept experts filled with `fill`, weights
    renormalized by sum (+ eps); with ignore_groups, a plain top-k over every expert."""

    def run(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
        x, bias, p = inputs["router_logits"].float(), inputs.get("correction_bias"), case.params
        scores = torch.softmax(x, dim=-1) if case.features["scoring"] == "softmax" else torch.sigmoid(x)
        biased = scores if bias is None else scores + bias
        m, e = x.shape
        by_group = biased.view(m, p["num_groups"], -1)
        gs = by_group.amax(dim=-1) if group_scoring == "max" else by_group.topk(2, dim=-1).values.sum(dim=-1)
        kept = torch.zeros_like(gs, dtype=torch.bool).scatter(1, gs.topk(p["topk_group"], dim=-1).indices, True)
        mask = kept.repeat_interleave(e // p["num_groups"], dim=1) | ignore_groups
        ids = _topk_any_tie(biased.masked_fill(~mask, fill), case.shape("k"))
        w = _renormalized(scores.gather(1, ids), eps) * p["routed_scaling_factor"]
        outputs["topk_weights"].copy_(w)
        outputs["topk_ids"].copy_(ids.to(torch.int32))
    return run


def _plain_router(eps: float | None) -> Run:
    """Top-k in fp32 torch with NaN propagating (torch.topk ranks NaN first), weights by sum (+ eps)."""

    def run(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
        x = inputs["router_logits"].float()
        scores = torch.softmax(x, dim=-1) if case.features["scoring"] == "softmax" else torch.sigmoid(x)
        w, ids = scores.topk(case.shape("k"), dim=-1)
        outputs["topk_weights"].copy_(_renormalized(w, eps))
        outputs["topk_ids"].copy_(ids.to(torch.int32))
    return run


def _adapter(op: str, cell: dict[str, str], run: Run, **conventions: object) -> registry.Adapter:
    return registry.Adapter(name=f"test-{op}", op=op, source="test", run=run,
                            support={k: (v,) for k, v in cell.items()}, conventions=conventions)


def _cases(op: str, cell: dict[str, str], routing: str, shapes: dict[str, int], params: dict,
           seeds: int = 4) -> list[Case]:
    return [Case(op=op, adapter=f"test-{op}", features=cell, seed=seed, shapes=shapes,
                 dtypes={"router_logits": cell["logits_dtype"]}, routing=routing, params=params)
            for seed in range(seeds)]


def _verdicts(adapter: registry.Adapter, cases: Iterable[Case], device_info) -> set[str]:  # type: ignore[no-untyped-def]
    found = set()
    for case in cases:
        r = runner.judge(case, adapter, device_info)
        assert r.verdict in ("pass", "fail"), f"{r.verdict}: {r.reason}"
        found.add(r.verdict)
    return found


GROUPS = {"num_groups": 8, "topk_group": 3, "routed_scaling_factor": 2.5}


# ------------------------------------------------------------------------------------------ group_scoring


@pytest.mark.parametrize(("scoring", "bias", "rule"), [("softmax", "N", "top2_sum"), ("sigmoid", "Y", "max")])
def test_group_scoring_other_than_the_default_passes_only_when_declared(scoring: str, bias: str, rule: str,
                                                                        device_info) -> None:  # type: ignore[no-untyped-def]
    cell = {**GROUPED, "scoring": scoring, "correction_bias": bias}
    cases = _cases("grouped_routing", cell, "random", {"M": 48, "E": 32, "k": 6}, GROUPS)
    router = _grouped_router(rule)
    assert _verdicts(_adapter("grouped_routing", cell, router), cases, device_info) == {"fail"}
    assert _verdicts(_adapter("grouped_routing", cell, router, group_scoring=rule), cases, device_info) == {"pass"}
    other = "max" if rule == "top2_sum" else "top2_sum"
    assert _verdicts(_adapter("grouped_routing", cell, router, group_scoring=other), cases, device_info) == {"fail"}


def test_declared_group_scoring_still_judges_group_ties(device_info) -> None:  # type: ignore[no-untyped-def]
    # the ties pattern copies groups: the router's own tie-break keeps other groups than the oracle's
    cell = {**GROUPED, "scoring": "sigmoid", "correction_bias": "N"}
    cases = _cases("grouped_routing", cell, "ties", {"M": 48, "E": 32, "k": 6}, GROUPS)
    adapter = _adapter("grouped_routing", cell, _grouped_router("top2_sum"), group_scoring="top2_sum")
    assert _verdicts(adapter, cases, device_info) == {"pass"}


# ------------------------------------------------------------------------------------------ unkept_groups


ZERO_CASES = dict(shapes={"M": 64, "E": 16, "k": 4}, params={"num_groups": 4, "topk_group": 2,
                                                               "routed_scaling_factor": 2.5, "values": "random"})


def test_zero_filled_unkept_groups_pass_only_when_declared(device_info) -> None:  # type: ignore[no-untyped-def]
    # masked rows (some -inf logits) leave kept groups with fewer than k positive scores; non-finite rows are
    # judged for their ids' form only (no nonfinite rule declared)
    cell = {**GROUPED, "nonfinite_rows": "Y"}
    cases = _cases("grouped_routing", cell, "nonfinite", **ZERO_CASES, seeds=6)
    router = _grouped_router("max", fill=0.0)
    assert "fail" in _verdicts(_adapter("grouped_routing", cell, router), cases, device_info)
    assert _verdicts(_adapter("grouped_routing", cell, router, unkept_groups="zero_filled"), cases,
                     device_info) == {"pass"}
    # the declaration frees the zero-score slots only: a router that ignores the groups still fails
    flat = _grouped_router("max", fill=0.0, ignore_groups=True)
    assert "fail" in _verdicts(_adapter("grouped_routing", cell, flat, unkept_groups="zero_filled"), cases,
                               device_info)


# ---------------------------------------------------------------------------------------- renormalize_eps


EPS_CASES = dict(shapes={"M": 16, "E": 16, "k": 4}, params={"values": "every_kind"})


@pytest.mark.parametrize("op", ["routing", "grouped_routing"])
def test_sum_plus_eps_with_nan_propagating_passes_only_when_declared(op: str, device_info) -> None:  # type: ignore[no-untyped-def]
    if op == "routing":
        cell, router = PLAIN, _plain_router(eps=1e-20)
        cases = _cases(op, cell, "nonfinite", **EPS_CASES, seeds=2)
    else:
        cell = {**GROUPED, "scoring": "sigmoid", "nonfinite_rows": "Y"}
        router = _grouped_router("max", eps=1e-20)
        cases = _cases(op, cell, "nonfinite", EPS_CASES["shapes"],
                       {**EPS_CASES["params"], "num_groups": 4, "topk_group": 2, "routed_scaling_factor": 2.5},
                       seeds=2)
    # all -inf rows: sigmoid scores 0, weights 0 / 1e-20 = 0 (propagate expects 0 / 0 = NaN); NaN rows: NaN
    # weights (zero expects 0)
    for policy in ("propagate", "zero"):
        assert _verdicts(_adapter(op, cell, router, nonfinite=policy), cases, device_info) == {"fail"}
    assert _verdicts(_adapter(op, cell, router, nonfinite="propagate", renormalize_eps=1e-20), cases,
                     device_info) == {"pass"}
    # softmax: an all -inf row is NaN before the division, so both rules agree there
    soft = {**cell, "scoring": "softmax"}
    assert _verdicts(_adapter(op, soft, router, nonfinite="propagate", renormalize_eps=1e-20),
                     [c.replace(features=soft) for c in cases], device_info) == {"pass"}


def test_declared_eps_fails_a_plain_division(device_info) -> None:  # type: ignore[no-untyped-def]
    cases = _cases("routing", PLAIN, "nonfinite", **EPS_CASES, seeds=2)
    adapter = _adapter("routing", PLAIN, _plain_router(eps=None), nonfinite="propagate", renormalize_eps=1e-20)
    assert _verdicts(adapter, cases, device_info) == {"fail"}  # 0 / 0 = NaN where 0 is expected


def test_a_negative_eps_is_an_error_naming_it(device_info) -> None:  # type: ignore[no-untyped-def]
    case = _cases("routing", PLAIN, "nonfinite", **EPS_CASES, seeds=1)[0]
    r = runner.judge(case, _adapter("routing", PLAIN, _plain_router(eps=None), renormalize_eps=-1.0), device_info)
    assert r.verdict == "error" and "renormalize_eps must be a finite number >= 0" in r.reason, r.reason
    with pytest.raises(ValueError, match="group_scoring='top3'"):
        _adapter("grouped_routing", GROUPED, _grouped_router("max"), group_scoring="top3")


# ---------------------------------------------------------------------------------------------- tie_break


def _ordered_topk(t: torch.Tensor, k: int, higher: bool) -> torch.Tensor:
    """Top-k indices with exact ties toward the lower index, or toward the higher one."""
    if not higher:
        return torch.sort(t, dim=-1, descending=True, stable=True).indices[:, :k]
    flipped = torch.sort(t.flip(-1), dim=-1, descending=True, stable=True).indices[:, :k]
    return t.shape[-1] - 1 - flipped


def _tie_router(higher_groups: bool, higher_experts: bool) -> Run:
    """fp32 routing (grouped when the case has groups) whose exact ties go to the lower or the higher index."""

    def run(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
        x, p = inputs["router_logits"].float(), case.params
        scores = torch.softmax(x, dim=-1) if case.features["scoring"] == "softmax" else torch.sigmoid(x)
        m, e = x.shape
        select = scores
        if "num_groups" in p:
            gs = scores.view(m, p["num_groups"], -1).amax(dim=-1)
            kept = torch.zeros_like(gs, dtype=torch.bool).scatter(
                1, _ordered_topk(gs, p["topk_group"], higher_groups), True)
            select = scores.masked_fill(~kept.repeat_interleave(e // p["num_groups"], dim=1), float("-inf"))
        ids = _ordered_topk(select, case.shape("k"), higher_experts)
        w = _renormalized(scores.gather(1, ids), None) * p.get("routed_scaling_factor", 1.0)
        outputs["topk_weights"].copy_(w)
        outputs["topk_ids"].copy_(ids.to(torch.int32))
    return run


@pytest.mark.parametrize(("op", "higher_groups", "higher_experts"),
                         [("routing", False, True), ("grouped_routing", True, False),
                          ("grouped_routing", False, True)])
def test_a_declared_lower_index_tie_break_is_judged(op: str, higher_groups: bool, higher_experts: bool,
                                                    device_info) -> None:  # type: ignore[no-untyped-def]
    # the ties pattern copies logits (and groups): exact ties at the declared level
    cell = {**PLAIN, "nonfinite_rows": "N", "scoring": "softmax"} if op == "routing" else {**GROUPED}
    shapes = {"M": 48, "E": 32, "k": 6}
    cases = _cases(op, cell, "ties", shapes, GROUPS if op == "grouped_routing" else {})
    lower, higher = _tie_router(False, False), _tie_router(higher_groups, higher_experts)
    assert _verdicts(_adapter(op, cell, higher), cases, device_info) == {"pass"}  # undeclared: any tie-break
    assert _verdicts(_adapter(op, cell, lower, tie_break="lower_index"), cases, device_info) == {"pass"}
    assert _verdicts(_adapter(op, cell, higher, tie_break="lower_index"), cases, device_info) == {"fail"}
    # no exact tie (random logits): the rule has nothing to judge, the router passes
    rand = _cases(op, cell, "random", shapes, GROUPS if op == "grouped_routing" else {})
    assert _verdicts(_adapter(op, cell, higher, tie_break="lower_index"), rand, device_info) == {"pass"}


# groups 0 and 2 of this row differ in their logits (12, 16 against 12, 17) but their fp32 top-2 sums tie exactly in
# the oracle's arithmetic (its sigmoid rounded once from float64); torch's fp32 sigmoid of 12 is an ulp lower, which
# breaks the tie toward group 2: a kernel computing it so keeps groups 1 and 2 with no tie to break
ROUNDED_TIE = [12.0, -4.0, 0.0, 16.0, -3.0, 20.0, -1.0, 17.0, 12.0, -2.0, -2.0, 17.0, -2.0, -1.0, 12.0, 12.0]
TIE_BIAS = [-0.375, 0.0, -1.125, 0.375] * 4


@pytest.mark.parametrize(("copied", "verdict"), [(False, True), (True, False)])
def test_group_ties_of_different_inputs_are_not_judged_by_the_tie_rule(copied: bool, verdict: bool) -> None:
    from harness.ops import routing as spec

    cell = {**GROUPED, "scoring": "sigmoid", "correction_bias": "Y", "renormalize": "N", "logits_dtype": "float16"}
    params = {"num_groups": 4, "topk_group": 2, "routed_scaling_factor": 2.5}
    case = Case(op="grouped_routing", adapter="test-grouped_routing", features=cell, seed=0,
                shapes={"M": 1, "E": 16, "k": 4}, dtypes={"router_logits": "float16"}, routing="ties", params=params)
    logits = torch.tensor([ROUNDED_TIE], dtype=torch.float16)
    if copied:  # group 2 a copy of group 0: a tie in any arithmetic, which the rule breaks toward group 0
        logits[0, 8:12] = logits[0, 0:4]
    inputs = {"router_logits": logits, "correction_bias": torch.tensor(TIE_BIAS)}
    ids = torch.tensor([[7, 11, 5, 8]], dtype=torch.int32)  # groups 1 and 2 kept, a valid choice either way
    check = {c.name: c for c in spec.expected(case, inputs, {"tie_break": "lower_index"})}["topk_ids"]
    found = check.judge(ids, {"topk_ids": ids})
    assert found.passed is verdict, found.reason
    assert verdict or "break exact ties" in found.reason


def test_expert_ties_that_only_the_oracles_fp32_rounding_makes_are_not_judged() -> None:
    """Two experts of different logits and biases whose biased scores are equal only after the oracle's fp32 add:
    a kernel an ulp off in its sigmoid picks the other one with no tie to break."""
    from harness.ops import routing as spec
    from reference import routing as ref

    cell = {**PLAIN, "correction_bias": "Y", "nonfinite_rows": "N", "renormalize": "N"}
    logits = torch.tensor([[1.0, 0.5, -3.0]])
    s = ref.topk_selection_scores(logits, 1, scoring="sigmoid")[0].double()
    gap = torch.tensor(float(s[0] - s[1]))
    bias = torch.tensor([0.0, float(torch.nextafter(gap, torch.tensor(1.0))), 0.0])  # an ulp of the bias past it
    assert float(s[1]) + float(bias[1]) != float(s[0])  # different in float64 ...
    assert (ref.topk_selection_scores(logits, 1, scoring="sigmoid")[0] + bias)[:2].unique().numel() == 1  # ... tied
    case = Case(op="routing", adapter="test-routing", features=cell, seed=0, shapes={"M": 1, "E": 3, "k": 1},
                dtypes={"router_logits": "float32"}, routing="random", params={})
    ids = torch.tensor([[1]], dtype=torch.int32)  # the higher index of the tie
    check = {c.name: c for c in spec.expected(case, {"router_logits": logits, "correction_bias": bias},
                                               {"tie_break": "lower_index"})}["topk_ids"]
    found = check.judge(ids, {"topk_ids": ids})
    assert found.passed, found.reason
