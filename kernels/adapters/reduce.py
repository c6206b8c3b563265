"""Adapter of the Triton unpermute-reduce (`kernels.reduce.unpermute_reduce`), op `reduce`."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from harness.core.case import Case
from harness.core.device import DeviceInfo
from harness.registry import Adapter, Unsupported, register
from kernels import reduce as kernel

SUPPORT = {
    "accumulation": ("fp32", "output_dtype_sequential"),
    "weights_applied": ("N", "Y"),
    "apply_weight_on_input": ("N", "Y"),
    "expert_map": ("N", "Y"),
    "dtype": ("bfloat16", "float16", "float32"),
}
_BOTH = "weights_applied=Y with apply_weight_on_input=Y: the weight cannot be applied both ways"


def _both(f: Mapping[str, str]) -> bool:
    return f.get("weights_applied") == "Y" and f.get("apply_weight_on_input") == "Y"


def _consistent(device: DeviceInfo, f: Mapping[str, str]) -> str | None:
    return _BOTH if _both(f) else None


def _run(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
    f = case.features
    for axis, values in SUPPORT.items():
        if f[axis] not in values:
            raise Unsupported(f"triton-reduce does not support {axis}={f[axis]}")
    if _both(f):
        raise Unsupported(f"triton-reduce: {_BOTH}")
    kernel.unpermute_reduce(
        inputs["expert_out"], inputs["topk_weights"], inputs["topk_ids"], out=outputs["out"],
        accumulation=f["accumulation"], weights_applied=f["weights_applied"] == "Y",
        apply_router_weight_on_input=f["apply_weight_on_input"] == "Y", expert_map=inputs.get("expert_map"),
        routed_scaling_factor=case.params.get("routed_scaling_factor", 1.0))


def _interp_features(f: Mapping[str, str]) -> set[str]:
    # bf16 rows are widened to fp32 and the result rounded back: the interpreter's bf16 casts must be faithful.
    return {"bf16_cast"} if f.get("dtype") == "bfloat16" else set()


register(Adapter(
    name="triton-reduce", op="reduce", source="kernels.reduce", run=_run, support=SUPPORT, requires=_consistent,
    # fp32: terms and sum in fp32 in slot order, one rounding; sequential: vLLM moe_sum rounding per add.
    # The routed scaling factor multiplies the fp32 sum (the op's params carry it; no convention to state).
    properties=frozenset({"deterministic", "batch_invariant"}),
    limits={"cross_K": 1025},  # past one program's 1024 columns (kernels.reduce._block_for)
    interp_features=_interp_features,
    description="one program per (token, column block), k loads in flight, fp32 terms in slot order",
))
