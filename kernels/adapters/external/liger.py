"""Liger Kernel's Triton gated activations (liger-kernel 0.8.5) for the `activation` op.

- `liger-swiglu`: `liger_kernel.ops.swiglu.swiglu_forward(a, b)`: silu(a) * b, a the gate. It computes silu in fp32,
  casts it to the input dtype, then multiplies in that dtype: rounding `round_activation_first` (one rounding of
  the activation, one of the product; the product of two values of the input dtype is exact in fp32, so the
  multiply rounds once whatever the hardware does).
- `liger-geglu`: `liger_kernel.ops.geglu.geglu_forward(a, b)`: the tanh form of GELU only (Liger has no erf
  GeGLU kernel), same rounding; tanh from Triton's libdevice.

Liger takes the gate and up halves as two tensors addressed with one row stride, so the adapter hands it the two
halves of the op's gate-first input as contiguous tensors (the op's input is [T, 2N], gate first). Its forward
launches one program per row with the whole row in one block (up to 65536 columns; wider rows raise), so there is
no column tile to cross. Liger does not take an output buffer: its results replace the harness's. Every other
activation of the op is undeclared (the adapter rejects it). fp32, bf16 and fp16 inputs are declared: the kernels
are dtype-generic.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from harness.core.case import Case
from harness.registry import Adapter, Library, Unsupported, library_module, register

LIBRARY = Library(distribution="liger-kernel", module="liger_kernel", written_for="0.8.5",
                  install="pip install liger-kernel==0.8.5 (or: tox -e external)")
DTYPES = ("bfloat16", "float16", "float32")
#: Liger's forwards one row per program, the whole row in one block (liger_kernel.ops.utils.calculate_settings)
LIMITS = {"max_N": 65536}


def _halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = x.shape[-1] // 2
    return x[:, :n].contiguous(), x[:, n:].contiguous()


def _runner(activation: str, module: str, function: str):  # type: ignore[no-untyped-def]
    def run(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        f = case.features
        if f.get("activation") != activation or f.get("dtype") not in DTYPES:
            raise Unsupported(f"Liger has no kernel for activation={f.get('activation')} dtype={f.get('dtype')}")
        forward = getattr(library_module(LIBRARY, module), function)
        a, b = _halves(inputs["x"])
        return {"out": forward(a, b)[2]}

    return run


def _interp(activation: str):  # type: ignore[no-untyped-def]
    def features(cell: Mapping[str, str]) -> set[str]:
        need = {"load_store", "float_args"} if activation == "silu_and_mul" else {"load_store"}
        if cell.get("dtype") == "bfloat16":
            need.add("bf16_cast")
        if activation == "gelu_tanh_and_mul":
            need.add("libdevice_tanh")
        return need

    return features


_CONVENTIONS = {"gate_order": "gate_first", "rounding": "round_activation_first"}
_GENERATIONS = ("interp", "sm80", "sm89", "sm90", "sm100", "sm120")

def _adapter(name: str, activation: str, module: str, function: str, description: str) -> Adapter:
    """One Liger forward as an adapter of the `activation` op (one activation, every dtype)."""
    return register(Adapter(
        name=name, op="activation", source=f"{module}.{function}", run=_runner(activation, module, function),
        support={"activation": (activation,), "dtype": DTYPES}, generations=_GENERATIONS, conventions=_CONVENTIONS,
        properties=frozenset({"deterministic", "batch_invariant"}), limits=LIMITS,
        interp_features=_interp(activation), library=LIBRARY, description=description), replace=True)


SWIGLU = _adapter("liger-swiglu", "silu_and_mul", "liger_kernel.ops.swiglu", "swiglu_forward",
                  "Liger SwiGLU forward: silu(gate) in fp32, rounded to the input dtype, times up")
GEGLU = _adapter("liger-geglu", "gelu_tanh_and_mul", "liger_kernel.ops.geglu", "geglu_forward",
                 "Liger GeGLU forward (tanh GELU only): gelu_tanh(gate) in fp32, rounded to the input dtype, times up")
