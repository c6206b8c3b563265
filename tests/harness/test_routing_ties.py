"""Routing judged under ties at group level, masked (-Inf) experts and the non-finite rules, with tiny pure-torch
routers written for the test: a bf16 grouped top-k that breaks group ties its own way passes, one that keeps a
clearly worse group fails; a router that selects a masked expert fails; a router with torch's NaN behaviour passes
only when it declares `nonfinite="propagate"`."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest
import torch

from harness import ops, registry
from harness.core.case import Case
from harness.engine import runner
from reference import routing as ref

GROUPED = {"scoring": "sigmoid", "correction_bias": "Y", "renormalize": "Y", "scaling_placement": "weights",
           "logits_dtype": "bfloat16", "nonfinite_rows": "N"}
PLAIN = {"scoring": "softmax", "renormalize": "Y", "correction_bias": "N", "logits_dtype": "float32",
         "nonfinite_rows": "Y"}
Run = Callable[[Case, dict[str, torch.Tensor], dict[str, torch.Tensor]], None]


def _topk_high_index(t: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k indices, ties toward the *higher* index (the oracle prefers the lower one)."""
    n = t.shape[-1]
    return n - 1 - torch.sort(t.flip(-1), dim=-1, descending=True, stable=True).indices[..., :k]


def _grouped_router(keep_worse: bool = False) -> Run:
    """vLLM-style torch grouped top-k on the logits' dtype (bf16 scores), ties broken toward higher indices; with
    keep_worse, the last kept group is replaced by the worst group."""

    def run(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
        x, bias, p = inputs["router_logits"], inputs.get("correction_bias"), case.params
        scores = torch.softmax(x, dim=-1) if case.features["scoring"] == "softmax" else torch.sigmoid(x)
        biased = scores if bias is None else scores + bias
        m, e = x.shape
        g, tg = p["num_groups"], p["topk_group"]
        by_group = biased.view(m, g, e // g)
        group_scores = by_group.max(dim=-1).values if bias is None else by_group.topk(2, dim=-1).values.sum(-1)
        kept = _topk_high_index(group_scores, tg)
        if keep_worse:
            kept[:, -1] = torch.sort(group_scores, dim=-1, stable=True).indices[:, 0]
        group_mask = torch.zeros(m, g, dtype=torch.bool, device=x.device).scatter(1, kept, True)
        masked = biased.masked_fill(~group_mask.repeat_interleave(e // g, dim=1), float("-inf"))
        ids = _topk_high_index(masked, case.shape("k"))
        w = scores.gather(1, ids)
        if case.features["renormalize"] == "Y":
            w = w / w.sum(dim=-1, keepdim=True)
        outputs["topk_weights"].copy_(w.float() * p.get("routed_scaling_factor", 1.0))
        outputs["topk_ids"].copy_(ids.to(torch.int32))
    return run


def _torch_router(mask_bug: bool = False) -> Run:
    """Plain softmax top-k as torch code computes it in fp32: NaN ranked first, NaN weights for NaN, +Inf and all
    -Inf rows, a plain renormalization. With mask_bug, masked (-Inf) experts are taken for the best ones."""

    def run(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
        x = inputs["router_logits"].float()
        if mask_bug:
            x = torch.where(x.isneginf(), torch.full_like(x, 30.0), x)
        w, ids = torch.softmax(x, dim=-1).topk(case.shape("k"), dim=-1)
        if case.features["renormalize"] == "Y":
            w = w / w.sum(dim=-1, keepdim=True)
        outputs["topk_weights"].copy_(w)
        outputs["topk_ids"].copy_(ids.to(torch.int32))
    return run


def _oracle_zero_router(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
    w, ids = ref.topk_route(inputs["router_logits"], case.shape("k"), renormalize=case.features["renormalize"] == "Y")
    outputs["topk_weights"].copy_(w)
    outputs["topk_ids"].copy_(ids)


def _adapter(op: str, cell: dict[str, str], run: Run, **conventions: str) -> registry.Adapter:
    return registry.Adapter(name=f"test-{op}", op=op, source="test", run=run,
                            support={k: (v,) for k, v in cell.items()}, conventions=conventions)


def _grouped_cases(routing: str = "ties", dtype: str = "bfloat16") -> Iterable[Case]:
    for scoring, bias in (("sigmoid", "Y"), ("softmax", "N"), ("sigmoid", "N")):
        cell = {**GROUPED, "scoring": scoring, "correction_bias": bias, "logits_dtype": dtype}
        for seed in range(4):
            yield Case(op="grouped_routing", adapter="test-grouped_routing", features=cell, seed=seed,
                       shapes={"M": 48, "E": 32, "k": 6}, dtypes={"router_logits": dtype}, routing=routing,
                       params={"num_groups": 8, "topk_group": 3, "routed_scaling_factor": 2.5})


def _verdicts(adapter: registry.Adapter, cases: Iterable[Case], device_info) -> list[str]:  # type: ignore[no-untyped-def]
    found = []
    for case in cases:
        r = runner.judge(case, adapter, device_info)
        assert r.verdict in ("pass", "fail"), f"{r.verdict}: {r.reason}"
        found.append(r.verdict)
    return found


# --------------------------------------------------------------------------------------------- group ties


def test_ties_pattern_draws_tied_groups_for_grouped_routing() -> None:
    spec = ops.get("grouped_routing")
    exact = saturated = 0
    for case in _grouped_cases():
        inputs = spec.make_inputs(case, "cpu")
        x, bias = inputs["router_logits"], inputs.get("correction_bias")
        s = torch.softmax(x.double(), dim=1) if case.features["scoring"] == "softmax" else torch.sigmoid(x.double())
        by_group = (s if bias is None else s + bias.double()).view(48, 8, 4).to(torch.float32)  # fp32 scores
        group_scores = by_group.amax(dim=2) if bias is None else by_group.topk(2, dim=2).values.sum(dim=2)
        top = group_scores.sort(dim=1, descending=True).values
        exact += int((top[:, :-1] == top[:, 1:]).any(dim=1).sum())
        saturated += int((x.float() >= 8).sum(dim=1).ge(4).sum())
    assert exact >= 100 and saturated >= 40  # of 12 * 48 rows
    cell = {**GROUPED}
    adapter = _adapter("grouped_routing", cell, _grouped_router())
    assert any(b["routing"] == "ties" for b in spec.boundary(adapter, cell))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_grouped_router_breaking_group_ties_its_own_way_passes(dtype: str, device_info) -> None:  # type: ignore[no-untyped-def]
    # bf16: scores rounded to bf16 (declared); fp32: torch's sigmoid saturates to 1.0 where the oracle's is 1 - 2^-24
    conventions = {"score_dtype": "input"} if dtype == "bfloat16" else {}
    adapter = _adapter("grouped_routing", {**GROUPED, "logits_dtype": dtype}, _grouped_router(), **conventions)
    cases = list(_grouped_cases(dtype=dtype))
    assert set(_verdicts(adapter, cases, device_info)) == {"pass"}
    # and it did keep other groups than the oracle: judged against the oracle's group choice, rows fail
    spec, differs = ops.get("grouped_routing"), 0
    for case in cases:
        inputs = spec.make_inputs(case, "cpu")
        outs = {n: torch.empty(o.shape, dtype=o.dtype) for n, o in spec.outputs(case, inputs).items()}
        adapter.run(case, inputs, outs)
        sel = ref.grouped_topk_selection_scores(
            inputs["router_logits"], 6, num_groups=8, topk_group=3, scoring=case.features["scoring"],
            correction_bias=inputs.get("correction_bias"))
        differs += int((~ref.valid_topk_selection(sel, outs["topk_ids"], atol=1e-6)).sum())
    assert differs >= 20


def test_grouped_router_keeping_a_clearly_worse_group_fails(device_info) -> None:  # type: ignore[no-untyped-def]
    adapter = _adapter("grouped_routing", GROUPED, _grouped_router(keep_worse=True), score_dtype="input")
    verdicts = _verdicts(adapter, _grouped_cases("random"), device_info)
    assert verdicts == ["fail"] * len(verdicts)


# ------------------------------------------------------------------------------------------ masked experts


def _plain_cases(renormalize: str = "Y") -> list[Case]:
    cell = {**PLAIN, "renormalize": renormalize}
    return [Case(op="routing", adapter="test-routing", features=cell, seed=seed, shapes={"M": 32, "E": 16, "k": 4},
                 dtypes={"router_logits": "float32"}, routing="nonfinite") for seed in range(4)]


def test_nonfinite_pattern_draws_masked_rows() -> None:
    spec, masked = ops.get("routing"), 0
    for case in _plain_cases():
        x = spec.make_inputs(case, "cpu")["router_logits"]
        masked += int((ref.finite_or_masked_rows(x) & x.isneginf().any(dim=1)).sum())
    assert masked >= 16


def test_masked_experts_are_judged_without_a_declaration(device_info) -> None:  # type: ignore[no-untyped-def]
    good = _adapter("routing", PLAIN, _torch_router())
    assert set(_verdicts(good, _plain_cases(), device_info)) == {"pass"}
    bad = _adapter("routing", PLAIN, _torch_router(mask_bug=True))
    assert set(_verdicts(bad, _plain_cases(), device_info)) == {"fail"}


# ------------------------------------------------------------------------------------------ non-finite rows


def test_torch_nan_behaviour_passes_only_when_declared(device_info) -> None:  # type: ignore[no-untyped-def]
    for renormalize in ("Y", "N"):
        cases = _plain_cases(renormalize)
        cell = cases[0].features
        assert set(_verdicts(_adapter("routing", cell, _torch_router(), nonfinite="propagate"), cases,
                             device_info)) == {"pass"}
        assert set(_verdicts(_adapter("routing", cell, _torch_router(), nonfinite="zero"), cases,
                             device_info)) == {"fail"}
        # the other way round: the ZERO rule's outputs do not pass for the declared PROPAGATE rule
        assert set(_verdicts(_adapter("routing", cell, _oracle_zero_router, nonfinite="propagate"), cases,
                             device_info)) == {"fail"}
        assert set(_verdicts(_adapter("routing", cell, _oracle_zero_router, nonfinite="zero"), cases,
                             device_info)) == {"pass"}
