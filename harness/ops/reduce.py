"""Op spec `reduce`: weighted unpermute-reduce over the k slots (docs/SEMANTICS.md §5).

With fp32 accumulation the only error a correct kernel may add is the final rounding (1 u of the output format)
plus a random-walk fp32 term, so a kernel that accumulates in bf16 where fp32 is declared falls outside the bound.
With sequential output-dtype accumulation the oracle emulates the sequence, and each add may round either way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from hypothesis import strategies as st

from harness.core import inputs as gen
from harness.core.case import Case
from harness.core.errors import C_DOT, UNIT_ROUNDOFF, unit_roundoff
from harness.core.sizes import boundary_sizes, local_experts, num_experts, top_k
from harness.ops.base import Axis, Check, OpSpec, OutputSpec
from harness.ops.common import lim, yes
from harness.registry import Adapter
from reference import reduce as ref

AXES = (
    Axis("accumulation", "Accumulation", ("fp32", "output_dtype_sequential")),
    Axis("weights_applied", "Weights pre-applied", ("N", "Y")),
    Axis("apply_weight_on_input", "Apply weight on input", ("N", "Y")),
    Axis("expert_map", "Expert map", ("N", "Y")),
    Axis("dtype", "Dtype", ("bfloat16", "float16", "float32")),
)


def make_inputs(case: Case, device: str) -> dict[str, torch.Tensor]:
    m, e, k, hidden = case.shape("M"), case.shape("E"), case.shape("k"), case.shape("K")
    found = {
        "expert_out": gen.randn(case, "expert_out", (m, k, hidden), case.dtype("expert_out"), device),
        "topk_weights": gen.topk_weights(case, m, k, device),
        "topk_ids": gen.topk_ids(case, m, e, k, device),
    }
    if yes(case.features["expert_map"]):
        found["expert_map"] = gen.expert_map(case, e, device, routed=found["topk_ids"])
    return found


def outputs(case: Case, inputs: Mapping[str, torch.Tensor]) -> dict[str, OutputSpec]:
    return {"out": OutputSpec((case.shape("M"), case.shape("K")), case.dtype("expert_out"))}


def _kwargs(case: Case) -> dict[str, Any]:
    f = case.features
    return {"weights_applied": yes(f["weights_applied"]),
            "apply_router_weight_on_input": yes(f["apply_weight_on_input"]),
            "routed_scaling_factor": case.params.get("routed_scaling_factor", 1.0)}


def expected(case: Case, inputs: Mapping[str, torch.Tensor], conventions: Mapping[str, Any]) -> list[Check]:
    cpu = {n: t.detach().cpu() for n, t in inputs.items()}
    acc = ref.ReduceAccumulation(case.features["accumulation"])
    y, w = cpu["expert_out"], cpu["topk_weights"]
    kw = dict(_kwargs(case), expert_map=cpu.get("expert_map"))
    out_dtype = y.dtype
    u_out = unit_roundoff(out_dtype)
    k = case.shape("k")
    # magnitudes: sum over slots of |w * y| (the same reduce on absolute values, in fp64)
    mag = ref.unpermute_reduce(y.double().abs(), w.abs(), cpu["topk_ids"], accumulation=ref.ReduceAccumulation.FP32,
                               **{**kw, "routed_scaling_factor": abs(kw["routed_scaling_factor"])}).abs()
    if acc is ref.ReduceAccumulation.FP32:
        want = ref.unpermute_reduce(y.double(), w, cpu["topk_ids"], accumulation=acc, out_dtype=torch.float64, **kw)
        tiny = float(torch.finfo(out_dtype).smallest_normal)
        bound = C_DOT * UNIT_ROUNDOFF["float32"] * math.sqrt(k) * mag + 1.0 * u_out * want.abs() + tiny
    else:
        want = ref.unpermute_reduce(y, w, cpu["topk_ids"], accumulation=acc, **kw).double()
        # each of the k roundings may go the other way when a kernel's fp32 products differ by an ulp
        bound = 2.0 * k * u_out * mag + float(torch.finfo(out_dtype).smallest_normal)
    return [Check("out", "bounded", expected=want, bound=bound)]


def draw(draw: st.DrawFn, adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    e = draw(num_experts(lim(adapter, "max_E")))
    k = 1 if yes(cell["apply_weight_on_input"]) else draw(top_k(e, lim(adapter, "max_k")))
    m = draw(boundary_sizes(lim(adapter, "block_M"), lim(adapter, "max_M"), minimum=1))  # M = 0: a boundary case
    hidden = draw(boundary_sizes(64, lim(adapter, "max_K"), minimum=1))
    params: dict[str, Any] = {"routed_scaling_factor": draw(st.sampled_from([1.0, 2.5]))}
    if yes(cell["expert_map"]):
        params["local_experts"] = draw(local_experts(e))
    return {"shapes": {"M": m, "E": e, "k": k, "K": hidden}, "dtypes": {"expert_out": cell["dtype"]},
            "routing": draw(st.sampled_from(["random", "skewed", "one_expert"])), "params": params}


def boundary(adapter: Adapter, cell: Mapping[str, str]) -> list[dict[str, Any]]:
    found = []
    for m, e, k, hidden in ((0, 4, 2, 8), (1, 8, 8, 64), (17, 16, 4, 129), (33, 257, 8, 65)):
        if e > lim(adapter, "max_E"):
            continue
        k = 1 if yes(cell["apply_weight_on_input"]) else k
        params: dict[str, Any] = {"routed_scaling_factor": 2.5}
        if yes(cell["expert_map"]):
            params["local_experts"] = e // 2 if m != 1 else 0  # M = 1: the deliberate none-local case
        found.append({"shapes": {"M": m, "E": e, "k": k, "K": hidden}, "dtypes": {"expert_out": cell["dtype"]},
                      "params": params})
    return found


def token_subset(case: Case, inputs: Mapping[str, torch.Tensor], rows: slice) -> tuple[Case, dict[str, torch.Tensor]]:
    sub = {n: (t[rows] if n != "expert_map" else t) for n, t in inputs.items()}
    return case.replace(shapes={**case.shapes, "M": sub["expert_out"].shape[0]}), sub


SPECS = {"reduce": OpSpec(name="reduce", title="Unpermute-reduce", axes=AXES, make_inputs=make_inputs, outputs=outputs,
                          expected=expected, draw=draw, boundary=boundary, token_subset=token_subset,
                          token_outputs=("out",))}
