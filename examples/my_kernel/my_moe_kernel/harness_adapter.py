"""moe-harness adapter of `my_moe_kernel.silu_mul`: what it declares, its conventions, how to run it.

Registered by the entry point in ../pyproject.toml (group `moe_harness.adapters`), or named on the command line
as `my_moe_kernel.harness_adapter:ADAPTER`.
"""

from __future__ import annotations

import torch

from harness.adapters import Adapter, Unsupported
from harness.case import Case
from my_moe_kernel.swiglu import silu_mul

#: what the kernel claims, per feature axis of the `activation` op (harness/ops/activation.py)
SUPPORT = {"activation": ("silu_and_mul",), "dtype": ("float32", "float16", "bfloat16")}
#: how the oracle must compute to judge it: gate in the first half, fp32 math rounded once at the output
CONVENTIONS = {"gate_order": "gate_first", "layout": "halves", "rounding": "round_once"}


def run(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
    # Reject what the kernel does not do with a message naming the feature (the harness checks that).
    for axis, value in case.features.items():
        if value not in SUPPORT.get(axis, ()):
            raise Unsupported(f"my-silu-mul does not support {axis}={value}")
    silu_mul(inputs["x"], out=outputs["out"])


def interp_features(features: dict[str, str]) -> set[str]:
    """Triton-interpreter fixes this kernel relies on (harness.interpreter): bf16 loads and stores."""
    return {"load_store"} | ({"bf16_cast"} if features.get("dtype") == "bfloat16" else set())


ADAPTER = Adapter(
    name="my-silu-mul", op="activation", source="my_moe_kernel.swiglu", run=run, support=SUPPORT,
    generations=("interp", "sm80", "sm89", "sm90", "sm100", "sm120"), conventions=CONVENTIONS,
    properties=frozenset({"deterministic", "batch_invariant"}), interp_features=interp_features,
    description="example: row-streaming Triton SiLU-and-mul",
)
