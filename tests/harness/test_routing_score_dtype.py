"""Routing convention `score_dtype="input"`: a router computing softmax, top-k and renormalization in bf16/fp16 (torch
code on the logits' dtype, as vLLM's native grouped_topk) passes only when it declares so, and a real weight error
still fails under that declaration."""

from __future__ import annotations

import dataclasses

import torch

from harness import ops, registry
from harness.core.case import Case
from harness.engine import runner

CELL = {"scoring": "softmax", "renormalize": "Y", "correction_bias": "N", "logits_dtype": "bfloat16",
        "nonfinite_rows": "N"}


def _half_precision_router(error: float = 0.0):  # type: ignore[no-untyped-def]
    def run(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
        logits = inputs["router_logits"]  # bf16: every step below rounds to bf16
        w, ids = torch.softmax(logits, dim=-1).topk(case.shape("k"), dim=-1)
        w = w / w.sum(dim=-1, keepdim=True)
        outputs["topk_weights"].copy_(w.float() * (1 + error))
        outputs["topk_ids"].copy_(ids.to(torch.int32))
    return run


def _verdicts(adapter: registry.Adapter, device_info) -> set[str]:  # type: ignore[no-untyped-def]
    spec = ops.get("routing")
    found = set()
    for seed in range(6):
        case = Case(op="routing", adapter=adapter.name, features=CELL, seed=seed,
                    shapes={"M": 64, "E": 64, "k": 6}, dtypes={"router_logits": "bfloat16"})
        assert spec.inapplicable is None or spec.inapplicable(CELL) is None
        found.add(runner.judge(case, adapter, device_info).verdict)
    return found


def test_half_precision_scores_need_the_declaration(device_info) -> None:  # type: ignore[no-untyped-def]
    base = registry.Adapter(name="bf16-router", op="routing", source="test", run=_half_precision_router(),
                            support={k: (v,) for k, v in CELL.items()})
    assert "fail" in _verdicts(base, device_info)  # judged at fp32 precision: bf16 weights are off
    declared = dataclasses.replace(base, conventions={"score_dtype": "input"})
    assert _verdicts(declared, device_info) == {"pass"}
    # (4 + k) bf16 roundings are 3.9% at k = 6: a row's common factor (the bf16 sum of k weights) can be off by
    # that much, so only a larger error is certain to show
    wrong = dataclasses.replace(declared, run=_half_precision_router(error=0.05))
    assert "fail" in _verdicts(wrong, device_info)
