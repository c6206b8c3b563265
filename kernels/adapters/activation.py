"""Adapter of the Triton gated activations (`kernels.activation`) for the `activation` op."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from harness.core.case import Case
from harness.registry import Adapter, Unsupported, register
from kernels import activation as kern

SUPPORT = {
    "activation": tuple(kern.ACTIVATIONS),
    "dtype": ("bfloat16", "float16", "float32"),
}
#: what the oracle must follow: gate first, the activation's own layout, fp32 throughout with one rounding at the
#: output, and the activations' default parameters (the kernel's defaults, passed explicitly below)
CONVENTIONS = {"gate_order": "gate_first", "rounding": "round_once", "alpha": 1.702, "beta": 1.0, "limit": 7.0}


def _check(features: Mapping[str, str]) -> None:
    for axis, values in SUPPORT.items():
        if features.get(axis) not in values:
            raise Unsupported(f"triton-activation does not support {axis}={features.get(axis)}")


def run(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
    _check(case.features)
    act = case.features["activation"]
    params = {k: CONVENTIONS[k] for k in kern.PARAMS.get(act, {})}
    kern.gated_activation(inputs["x"], act, out=outputs["out"], **params)


def interp_features(features: Mapping[str, str]) -> set[str]:
    """Interpreter fixes the kernel depends on: bf16 loads/stores (casts), libdevice tanh."""
    need = {"load_store"}
    if features.get("dtype") == "bfloat16":
        need.add("bf16_cast")
    if features.get("activation") == "gelu_tanh_and_mul":
        need.add("libdevice_tanh")
    return need


ADAPTER = register(Adapter(
    name="triton-activation", op="activation", source="kernels.activation", run=run, support=SUPPORT,
    generations=("interp", "sm80", "sm89", "sm90", "sm100", "sm120"), conventions=CONVENTIONS,
    properties=frozenset({"deterministic", "batch_invariant"}), interp_features=interp_features,
    # past the first 1024-column tile (kernels.activation: block_n <= 1024); past the 64 rows of a narrow tile
    limits={"cross_N": 1025, "cross_T": 65},
    description="Triton gated activations, fp32 compute, one rounding at the output",
), replace=True)
