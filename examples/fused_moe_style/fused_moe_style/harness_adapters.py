"""moe-harness adapters for two kernels in the style of vLLM's Triton MoE path.

- `STYLE_FUSED_MOE` (op `experts`): `kernels.fused_experts.fused_experts` run as vLLM's `fused_moe_kernel` computes:
  fp32 inputs multiplied as TF32 (Triton's default `tl.dot` precision), and the slots summed like vLLM's `moe_sum`
  (slot by slot in the activation dtype when 2 <= top-k <= 4, in fp32 otherwise). Both depend on the case, so they
  are said by `conventions_for`, not by the fixed `conventions`. vLLM's kernel multiplies the GEMM1 bias by the
  router weight when it applies the weight on the input, so that combination is excluded by `requires`.
- `STYLE_GROUP_QUANT_DIV` (op `group_quant`): a per-token-group 8-bit quantizer whose elements and scales are
  divided with Triton's fp32 `/` (`div.full.f32` on NVIDIA GPUs, within 2 ulp): it declares `division="approximate"`.

Named on the command line as `fused_moe_style.harness_adapters:STYLE_FUSED_MOE` (or `:STYLE_GROUP_QUANT_DIV`), or
found by name (`style-fused-moe`, `style-group-quant-div`) through the entry points in ../pyproject.toml once
installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness.adapters import Adapter, Unsupported
from harness.case import Case
from kernels import fused_experts as fk
from kernels.adapters import experts as ea
from kernels.adapters import group_quant as gqa
from kernels.group_quant import group_quant

Tensors = dict[str, torch.Tensor]

# ----------------------------------------------------------------------------------------------------- experts

#: the declared cells (feature axes of harness/ops/experts.py): standard format, unquantized or fp8 W8A8 with
#: 128-wide block scales (DeepSeek-style checkpoints), every activation, bf16/fp16/fp32
EXPERTS_SUPPORT: dict[str, tuple[str, ...]] = {
    "format": ("standard",), "quant_type": ("none", "fp8_w8a8"), "quant_format": ("-", "G128"),
    "activation": tuple(ea.ACTIVATIONS), "apply_weight_on_input": ("N", "Y"), "expert_map": ("N", "Y"),
    "dtype": ("bfloat16", "float16", "float32"), "bias": ("N", "Y")}
#: the case-independent conventions: those of the project's Triton experts kernel (activation in fp32 rounded once,
#: a rounded to x.dtype, router weight on GEMM2's fp32 accumulator, the fp8 activation recipe); conventions_for
#: overrides the two that depend on the case
EXPERTS_CONVENTIONS: dict[str, Any] = dict(ea.TRITON_QUANT_CONVENTIONS)
#: top-k values (inclusive) for which the reduce rounds every partial sum to the output dtype (vLLM's moe_sum)
SEQUENTIAL_K = fk.MOE_SUM_SEQUENTIAL_K

BIAS_ON_INPUT_WEIGHT = ("vLLM's fused_moe_kernel multiplies the GEMM1 bias by the router weight when it applies the "
                        "weight on the input: bias=Y with apply_weight_on_input=Y is not supported")


def experts_requires(device: Any, features: Mapping[str, str]) -> str | None:
    """The support rule beyond the product of EXPERTS_SUPPORT (device None: planning for any device)."""
    if features.get("bias") == "Y" and features.get("apply_weight_on_input") == "Y":
        return BIAS_ON_INPUT_WEIGHT
    cap = getattr(device, "capability", None)
    if features.get("quant_type") == "fp8_w8a8" and cap is not None and tuple(cap) < (8, 9):
        return "tl.dot on fp8 operands needs sm89 or newer"
    return None


def experts_conventions_for(case: Case, device: Any) -> dict[str, Any]:
    """What depends on the case: TF32 products for fp32 inputs (other dtypes multiply exactly, so "ieee" stays),
    and moe_sum's reduce: sequential in the output dtype for 2 <= k <= 4, an fp32 sum of the rounded slots else."""
    found: dict[str, Any] = {}
    if case.features.get("dtype") == "float32":
        found["matmul_precision"] = "tf32"
    k = case.shapes.get("k")
    if k is not None:  # (batched cases have no k; this adapter rejects them)
        found["accumulation"] = "sequential_out_dtype" if SEQUENTIAL_K[0] <= k <= SEQUENTIAL_K[1] else "rounded_slots"
    return found


def experts_interp_features(features: Mapping[str, str]) -> set[str]:
    """Those of the Triton experts kernel, plus the TF32 dot emulation for fp32 inputs."""
    need = ea._interp_features(features)
    if features.get("dtype") == "float32":
        need.add("tf32_dot")
    return need


def run_experts(case: Case, inputs: Tensors, outputs: Tensors, *, fp32_precision: str = "tf32",
                reduce: str = "moe_sum") -> None:
    f = case.features
    for axis, value in f.items():
        if value not in EXPERTS_SUPPORT.get(axis, ()):
            raise Unsupported(f"style-fused-moe does not support {axis}={value}")
    # bias=Y with apply_weight_on_input=Y is excluded by experts_requires alone, not repeated here: the harness
    # still runs that undeclared cell to see what the kernel does with it (clean rejection, right answer, or a bug)
    fk.fused_experts(inputs["x"], inputs["w13"], inputs["w2"], inputs["topk_weights"], inputs["topk_ids"],
                     activation=ea.ACTIVATIONS[f["activation"]], expert_map=inputs.get("expert_map"),
                     apply_router_weight_on_input=f["apply_weight_on_input"] == "Y", out=outputs["out"],
                     quant=ea._quant(f, inputs), fp32_precision=fp32_precision, reduce=reduce,
                     **ea._biases(inputs))


STYLE_FUSED_MOE = Adapter(
    name="style-fused-moe", op="experts", source="kernels.fused_experts", run=run_experts,
    support=EXPERTS_SUPPORT, generations=ea._TRITON_GENERATIONS, conventions=EXPERTS_CONVENTIONS,
    conventions_for=experts_conventions_for, requires=experts_requires, properties=frozenset({"deterministic"}),
    limits=ea._TRITON_LIMITS, interp_features=experts_interp_features,
    description="example: Triton fused experts as vLLM's fused_moe_kernel computes (TF32 for fp32, moe_sum reduce)",
)

# -------------------------------------------------------------------------------------------------- group quant

#: per-token-group and per-token fp8/int8 quantization with float scales, in the layouts vLLM's Triton quantizer
#: writes (row-major, column-major, column-major TMA-aligned); the axes are those of harness/ops/group_quant.py
QUANT_SUPPORT: dict[str, tuple[str, ...]] = {
    "quant_dtype": ("fp8_e4m3fn", "int8"), "unit": ("group", "token"), "group_size": ("128", "64", "32", "16", "-"),
    "scale_rule": ("float",), "scale_layout": ("row_major", "column_major", "column_major_tma"),
    "input_dtype": ("bfloat16", "float16", "float32")}
#: scale = max(amax, 1e-10) / qmax and codes = x / scale, both by fp32 `/`: approximate on the GPU
QUANT_CONVENTIONS: dict[str, Any] = {**gqa.CONVENTIONS, "division": "approximate"}


def run_group_quant(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    f = case.features
    for axis, value in f.items():
        if value not in QUANT_SUPPORT.get(axis, ()):
            raise Unsupported(f"style-group-quant-div does not support {axis}={value}")
    group = f["unit"] == "group"
    group_quant(inputs["x"], dtype=f["quant_dtype"], unit=f["unit"], group_size=int(f["group_size"]) if group else 128,
                scale_rule=f["scale_rule"], layout=f["scale_layout"], eps=QUANT_CONVENTIONS["eps"],
                int8_rounding=QUANT_CONVENTIONS["int8_rounding"], fast_division=True, out=outputs["codes"],
                scales=outputs["scales"])


STYLE_GROUP_QUANT_DIV = Adapter(
    name="style-group-quant-div", op="group_quant", source="kernels.group_quant", run=run_group_quant,
    support=QUANT_SUPPORT, generations=("interp", "sm80", "sm89", "sm90", "sm100", "sm120"),
    conventions=QUANT_CONVENTIONS, requires=gqa.requires, properties=frozenset({"deterministic"}),
    interp_features=gqa._interp_features,
    description="example: Triton per-token-group quantizer dividing with fp32 '/' (approximate on the GPU)",
)
