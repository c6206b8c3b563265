"""Adapters of the Triton routing kernels (`kernels.routing`): `triton-routing` and `triton-grouped-routing`.

Declared: every scoring, renormalize, correction bias, logits dtype and NaN/Inf-row cell of the two ops, except
Llama-4 top-1 with renormalize or a bias (not a routing anyone uses; rejected naming the feature). Non-finite rows
follow the oracle's `zero` rule exactly, so they are judged like finite rows, not only for well-formed ids.
Limits: E <= 1024 (a row lives in registers), k <= 32. Deterministic and batch invariant (no atomics; the block
shape depends on E only).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from harness.core.case import Case
from harness.core.device import GENERATIONS, DeviceInfo
from harness.ops.routing import GROUPED_AXES, ROUTING_AXES
from harness.registry import Adapter, Unsupported, register
from kernels import routing as kr


def _interp_features(features: Mapping[str, str]) -> set[str]:
    """Interpreter fixes the kernels rely on: loads/stores, fp32 reductions, libdevice exp, casts of bf16 logits."""
    need = {"load_store", "reduce_fp32", "libdevice_exp"}
    if features.get("logits_dtype") == "bfloat16":
        need.add("bf16_cast")
    return need


_SOURCE = "kernels.routing"
_COMMON = dict(
    source=_SOURCE,
    conventions={"nonfinite": "zero", "tie_break": "lower_index"},  # k rounds of argmax, the first maximum
    properties=frozenset({"deterministic", "batch_invariant"}),
    # 65 rows: past one program's rows (kernels.routing.block_rows: at most 64 on the interpreter, 32 on a GPU)
    limits={"max_E": kr.MAX_E, "max_k": kr.MAX_K, "cross_M": 65},
    generations=tuple(g for g in GENERATIONS if g != "cpu"),  # Triton needs a GPU or its interpreter
    interp_features=_interp_features,
)


def _all(axes: tuple) -> dict[str, tuple[str, ...]]:
    return {a.name: a.values for a in axes}


def _llama4_plain(device: DeviceInfo | None, f: Mapping[str, str]) -> str | None:
    if f.get("scoring") == "llama4_top1":
        for axis in ("renormalize", "correction_bias"):
            if f.get(axis) == "Y":
                return f"llama4_top1 takes no {axis} (top-1 on the logits, weight sigmoid(logit))"
    return None


def _run_routing(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
    f = case.features
    why = _llama4_plain(None, f)
    if why:
        raise Unsupported(why)
    kr.topk_route(inputs["router_logits"], case.shape("k"), scoring=f["scoring"], renormalize=f["renormalize"] == "Y",
                  correction_bias=inputs.get("correction_bias"), out_weights=outputs["topk_weights"],
                  out_ids=outputs["topk_ids"])


def _run_grouped(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
    f, p = case.features, case.params
    scale = p.get("routed_scaling_factor", 1.0) if f["scaling_placement"] == "weights" else 1.0
    kr.grouped_topk_route(inputs["router_logits"], case.shape("k"), num_groups=p["num_groups"],
                          topk_group=p["topk_group"], scoring=f["scoring"],
                          correction_bias=inputs.get("correction_bias"), renormalize=f["renormalize"] == "Y",
                          routed_scaling_factor=scale,
                          out_weights=outputs["topk_weights"], out_ids=outputs["topk_ids"])


ROUTING = register(Adapter(
    name="triton-routing", op="routing", run=_run_routing, support=_all(ROUTING_AXES), requires=_llama4_plain,
    description="Triton top-k routing: softmax / sigmoid / Llama-4 top-1, renormalize, correction bias", **_COMMON),
    replace=True)
GROUPED = register(Adapter(
    name="triton-grouped-routing", op="grouped_routing", run=_run_grouped, support=_all(GROUPED_AXES),
    description="Triton grouped top-k routing (DeepSeek V2/V3), any E % G == 0", **_COMMON), replace=True)
