"""Adapter of the Triton fused activation + per-token-group fp8 quant kernel (`kernels.act_quant`)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from harness.core.case import Case
from harness.registry import Adapter, Unsupported, register
from kernels import act_quant as kern
from kernels.activation import GATED, PARAMS
from kernels.adapters import activation as activation_adapter

SUPPORT = {
    "activation": tuple(a for a in ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul", "swigluoai",
                                    "swigluoai_uninterleave", "swiglustep") if a in GATED),
    "dtype": ("bfloat16", "float16", "float32"),
    "group_size": ("128", "64"),
    "scale_rule": ("float", "ue8m0"),
    "scale_layout": ("row_major", "column_major", "column_major_tma", "packed_ue8m0"),
    "clamp_limit": ("N", "Y"),
}
#: gate first in the activation's own layout, fp32 activation straight into the quantizer (act_rounding fp32), and
#: the quantizer of vLLM's per_token_group_quant_fp8: max(amax, 1e-10) / 448 by true division, x / scale, ue8m0
#: rounding up by the bits without DeepGEMM's exponent clamp
CONVENTIONS = {
    "gate_order": "gate_first", "rounding": "round_once", "alpha": 1.702, "beta": 1.0, "limit": 7.0,
    "act_rounding": "fp32",
    "quant": {"eps": 1e-10, "eps_placement": "amax", "scale_formula": "divide", "application": "divide",
              "ue8m0_clamp": False},
}


def _check(features: Mapping[str, str]) -> None:
    for axis, values in SUPPORT.items():
        if features.get(axis) not in values:
            raise Unsupported(f"triton-act-quant does not support {axis}={features.get(axis)}")
    if features["scale_layout"] == "packed_ue8m0" and features["scale_rule"] != "ue8m0":
        raise Unsupported("triton-act-quant: scale_layout=packed_ue8m0 needs scale_rule=ue8m0")


def run(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
    f = case.features
    _check(f)
    act = f["activation"]
    params = {k: CONVENTIONS[k] for k in PARAMS.get(act, {})}
    kern.act_quant(
        inputs["x"], act, group_size=int(f["group_size"]), scale_rule=f["scale_rule"],
        scale_layout=f["scale_layout"], eps=CONVENTIONS["quant"]["eps"],
        clamp_limit=float(case.params["clamp_limit"]) if f["clamp_limit"] == "Y" else None,
        codes=outputs["codes"], scales=outputs["scales"], **params,
    )


def interp_features(features: Mapping[str, str]) -> set[str]:
    """Interpreter fixes the kernel depends on: the activation kernel's (bf16 loads, libdevice tanh), plus fp8
    stores and fp32 reductions (the group amax)."""
    return activation_adapter.interp_features(features) | {"reduce_fp32", "fp8_cast"}


ADAPTER = register(Adapter(
    name="triton-act-quant", op="act_quant", source="kernels.act_quant", run=run, support=SUPPORT,
    generations=("interp", "sm89", "sm90", "sm100", "sm120"), conventions=CONVENTIONS,  # fp8 stores: sm89+
    properties=frozenset({"deterministic", "batch_invariant"}), interp_features=interp_features,
    # kernels.act_quant: 8 rows and 512 columns a program; 640 is past 512 for groups of 128 and of 64
    limits={"cross_T": 9, "cross_N": 640},
    description="Triton fused gated activation + per-token-group fp8 quant (one pass)",
), replace=True)
