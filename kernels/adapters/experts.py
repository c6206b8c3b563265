"""Adapters of the fused-experts kernels for the `experts` op.

- `triton-experts`: kernels.fused_experts (standard sorted-token format), Triton; unquantized and the quantized
  schemes of TRITON_QUANT (kernels.quant_gemm): fp8_w8a8 T/A/G128, int8_w8a8 T/A, w8a16/w4a16 A/G128 and _zp.
- `triton-batched-experts`: kernels.batched_experts (batched format), the same Triton GEMM kernel.
- `naive-batched-experts`: kernels.naive_batched, plain torch, a test aid (the seed table's "naive batched").
- `torch-grouped-mm-experts`: kernels.torch_grouped_mm over torch._grouped_mm (CUTLASS, bf16, sm90/sm100).
- `torch-scaled-grouped-mm-experts`: kernels.torch_grouped_mm over torch._scaled_grouped_mm (CUTLASS fp8 rowwise,
  sm90): fp8_w8a8 T/A, standard and batched; K and N multiples of 16 (the `K_multiple`/`N_multiple` limits).
- `gluon-experts-fp8-fast`: kernels.gluon_experts, both GEMMs in Gluon (sm90 only): fp8_w8a8 G128, silu, bf16/fp16,
  fast accumulation (as triton-experts-fp8-fast).

Each declares exactly the cells it implements; any other cell raises `Unsupported` naming the axis and value.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from harness.core.case import Case
from harness.core.device import DeviceInfo
from harness.engine.interpreter import triton_gemm_features
from harness.registry import Adapter, Unsupported, register
from kernels import batched_experts as bk
from kernels import fused_experts as fk
from kernels import gluon_experts as ge
from kernels import naive_batched as nk
from kernels import quant_gemm as qg
from kernels import torch_grouped_mm as gk

Tensors = dict[str, torch.Tensor]

ACTIVATIONS = {"silu": "silu_and_mul", "gelu": "gelu_and_mul", "swigluoai": "swigluoai",
               "silu_no_mul": "silu_no_mul", "gelu_no_mul": "gelu_no_mul"}
_UNQUANTIZED = {"quant_type": ("none",), "quant_format": ("-",)}
_ALL_DTYPES = ("bfloat16", "float16", "float32")

#: activation conventions shared by every adapter here: gate first, each activation's own layout (halves;
#: interleaved for swigluoai), its default parameters, fp32 evaluation rounded once
#: swigluoai's constants as gpt-oss specifies them (stated here, never read from the kernel: a wrong constant in
#: the kernel must fail, not be followed by the oracle)
_ACT_CONVENTIONS = {"gate_order": "gate_first", "rounding": "round_once", "alpha": 1.702, "beta": 1.0, "limit": 7.0}

#: quantized cells of the standard Triton path (kernels.quant_gemm): quant_type -> its formats
TRITON_QUANT = {"fp8_w8a8": ("T", "A", "G128"), "int8_w8a8": ("T", "A"), "w8a16": ("A", "G128"),
                "w8a16_zp": ("G128",), "w4a16": ("A", "G128"), "w4a16_zp": ("G128",)}
TRITON_STANDARD = {"format": ("standard",), "quant_type": ("none", *TRITON_QUANT),
                   "quant_format": ("-", *sorted({f for fs in TRITON_QUANT.values() for f in fs})),
                   "activation": tuple(ACTIVATIONS), "apply_weight_on_input": ("N", "Y"), "expert_map": ("N", "Y"),
                   "dtype": _ALL_DTYPES, "bias": ("N", "Y")}
TRITON_BATCHED = {**TRITON_STANDARD, "format": ("batched",), "apply_weight_on_input": ("N",), "expert_map": ("N",)}
NAIVE_BATCHED = {**TRITON_BATCHED, **_UNQUANTIZED}
#: no apply-weight-on-input: torch._grouped_mm rounds x.W13 to bf16 before any weight could be applied, so
#: round(x.W) * w can never match the convention's round((w x).W)
GROUPED_MM = {"format": ("standard", "batched"), **_UNQUANTIZED, "activation": tuple(ACTIVATIONS),
              "apply_weight_on_input": ("N",), "expert_map": ("N", "Y"), "dtype": ("bfloat16",),
              "bias": ("N",)}

#: Triton paths: h stays fp32, a is rounded to x.dtype, the router weight on GEMM2's fp32 accumulator, each
#: weighted slot stored in x.dtype and summed in fp32 with one rounding,
#: fp32 inputs multiplied in IEEE fp32 (input_precision="ieee", never TF32),
#: slots of non-local experts left out of the layout (and of the sum).
TRITON_CONVENTIONS = {**_ACT_CONVENTIONS, "intermediate_rounding": "activation_output",
                      "weight_placement": "accumulator", "accumulation": "rounded_slots", "matmul_precision": "ieee"}
#: quantized cells: x and the intermediate are quantized by kernels.group_quant with the default recipe
#: (float scale rule, eps 1e-10 on amax, correctly rounded x / s, int8 half to even), stated explicitly except
#: scale_rule: act_quant is applied to every quant type's recipe, and MX recipes reject the float rule.
#: Weight-only schemes multiply exact integers (q - zp) in x.dtype and scale the fp32 dot: no
#: weight_dequant_dtype rounding.
TRITON_QUANT_CONVENTIONS = {**TRITON_CONVENTIONS, "act_quant": {
    "eps": 1e-10, "eps_placement": "amax", "scale_formula": "divide", "application": "divide",
    "int8_rounding": "half_even"}}
NAIVE_CONVENTIONS = {**_ACT_CONVENTIONS, "intermediate_rounding": "gemm1_and_activation_output",
                     "matmul_precision": "ieee"}
GROUPED_MM_CONVENTIONS = {**_ACT_CONVENTIONS, "intermediate_rounding": "gemm1_and_activation_output",
                          "weight_placement": "rounded_expert_output", "accumulation": "fp32",
                          "matmul_precision": "ieee"}
#: fp8_w8a8 T/A over torch._scaled_grouped_mm. Unlike torch._grouped_mm, apply-weight-on-input is expressible: the
#: weight multiplies GEMM1's fp32 row scale before the bf16 rounding. T is one scale per tensor (activations) and
#: per expert (weights), passed as rowwise scales broadcast to every row / column.
SCALED_GROUPED_MM = {"format": ("standard", "batched"), "quant_type": ("fp8_w8a8",),
                     "quant_format": gk.SCALED_FORMATS, "activation": tuple(ACTIVATIONS),
                     "apply_weight_on_input": ("N", "Y"), "expert_map": ("N", "Y"), "dtype": ("bfloat16",),
                     "bias": ("N",)}
#: GEMM outputs rounded to bf16 by torch (h before the activation, y before the router weight), activation and
#: reduce in fp32; activations quantized by the Triton path's recipe (kernels.quant_gemm.quantize_activation)
#: the CUTLASS fp8 kernel (use_fast_accum=False) promotes its tensor-core partial sums to fp32 only every few MMAs:
#: measured on an H200, its outputs are not those of an fp32 accumulation of the same codes near bf16 rounding
#: boundaries, so it declares that precision (harness.core.errors.FP8_MMA_REL)
SCALED_GROUPED_MM_CONVENTIONS = {**GROUPED_MM_CONVENTIONS, "matmul_precision": "fp8_mma_promoted",
                                 "act_quant": dict(TRITON_QUANT_CONVENTIONS["act_quant"])}


def _check(name: str, support: Mapping[str, tuple[str, ...]], features: Mapping[str, str]) -> None:
    for axis, value in features.items():
        if value not in support.get(axis, ()):
            raise Unsupported(f"{name} does not support {axis}={value}")


def _biases(inputs: Tensors) -> dict[str, torch.Tensor]:
    return {b: inputs[b] for b in ("w13_bias", "w2_bias") if b in inputs}


def _interp_features(features: Mapping[str, str]) -> set[str]:
    """Interpreter fixes the Triton kernels depend on: loads/stores, histogram/cumsum (reduce_fp32 covers the
    checked reductions), and per dtype the dot and the casts to the narrow type."""
    need = triton_gemm_features(features.get("dtype"))
    qt = features.get("quant_type", "none")
    # fp8 dots run with max_num_imprecise_acc=0 (promoted to fp32 per MMA), so fast accumulation is not relied on
    if qt == "fp8_w8a8":
        need |= {"fp8_cast", "fp8_dot"}
    elif qt == "int8_w8a8":
        need |= {"int8_dot", "fp_to_int_overflow"}
    return need


def _quant(features: Mapping[str, str], inputs: Tensors) -> qg.ExpertsQuant | None:
    qt = features.get("quant_type", "none")
    if qt == "none":
        return None
    return qg.ExpertsQuant(qt, features["quant_format"], inputs["w13_scale"], inputs["w2_scale"],
                           inputs.get("w13_zp"), inputs.get("w2_zp"))


def _triton_requires(device: DeviceInfo, features: Mapping[str, str]) -> str | None:
    qt, qf = features.get("quant_type", "none"), features.get("quant_format", "-")
    if qt != "none" and qf not in TRITON_QUANT.get(qt, ()):
        return f"triton-experts has no {qt} {qf} path"
    if qt == "fp8_w8a8" and device.capability is not None and tuple(device.capability) < (8, 9):
        return "tl.dot on fp8 operands needs sm89 or newer"
    return None


def _run_standard(name: str, support: Mapping[str, tuple[str, ...]], case: Case, inputs: Tensors,
                  outputs: Tensors, **options: object) -> None:
    _check(name, support, case.features)
    f = case.features
    fk.fused_experts(inputs["x"], inputs["w13"], inputs["w2"], inputs["topk_weights"], inputs["topk_ids"],
                     activation=ACTIVATIONS[f["activation"]], expert_map=inputs.get("expert_map"),
                     apply_router_weight_on_input=f["apply_weight_on_input"] == "Y", out=outputs["out"],
                     quant=_quant(f, inputs), **options, **_biases(inputs))


def _run_triton(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    _run_standard("triton-experts", TRITON_STANDARD, case, inputs, outputs)


def _run_triton_batched(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    _check("triton-batched-experts", TRITON_BATCHED, case.features)
    bk.batched_experts(inputs["x"], inputs["expert_num_tokens"], inputs["w13"], inputs["w2"],
                       activation=ACTIVATIONS[case.features["activation"]], out=outputs["out"],
                       quant=_quant(case.features, inputs), **_biases(inputs))


def _run_naive(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    _check("naive-batched-experts", NAIVE_BATCHED, case.features)
    nk.naive_batched_experts(inputs["x"], inputs["expert_num_tokens"], inputs["w13"], inputs["w2"],
                             activation=ACTIVATIONS[case.features["activation"]], out=outputs["out"],
                             **_biases(inputs))


def run_grouped_mm(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    _check("torch-grouped-mm-experts", GROUPED_MM, case.features)
    f = case.features
    act = ACTIVATIONS[f["activation"]]
    if f["format"] == "batched":
        gk.grouped_mm_batched_experts(inputs["x"], inputs["expert_num_tokens"], inputs["w13"], inputs["w2"],
                                      activation=act, out=outputs["out"])
    else:
        gk.grouped_mm_experts(inputs["x"], inputs["w13"], inputs["w2"], inputs["topk_weights"], inputs["topk_ids"],
                              activation=act, expert_map=inputs.get("expert_map"),
                              apply_router_weight_on_input=f["apply_weight_on_input"] == "Y", out=outputs["out"])


def _grouped_mm_requires(device: DeviceInfo, features: Mapping[str, str]) -> str | None:
    if not gk.available():
        return f"torch {torch.__version__} has no torch._grouped_mm"
    if device.capability is None or device.capability[0] not in (9, 10):
        return ("torch._grouped_mm runs its CUTLASS kernel only on sm90/sm100 (elsewhere torch falls back to a "
                "loop of mm, which is not the kernel under test)")
    return None


def run_scaled_grouped_mm(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    name = "torch-scaled-grouped-mm-experts"
    _check(name, SCALED_GROUPED_MM, case.features)
    f = case.features
    k_dim, n = inputs["x"].shape[-1], inputs["w2"].shape[-1]
    if k_dim % gk.SCALED_ALIGN or n % gk.SCALED_ALIGN:
        raise Unsupported(f"{name} needs K and N multiples of {gk.SCALED_ALIGN}, got K={k_dim}, N={n}")
    act = ACTIVATIONS[f["activation"]]
    quant = {"w13_scale": inputs["w13_scale"], "w2_scale": inputs["w2_scale"], "quant_format": f["quant_format"]}
    if f["format"] == "batched":
        gk.scaled_grouped_mm_batched_experts(inputs["x"], inputs["expert_num_tokens"], inputs["w13"], inputs["w2"],
                                             activation=act, out=outputs["out"], **quant)
    else:
        gk.scaled_grouped_mm_experts(inputs["x"], inputs["w13"], inputs["w2"], inputs["topk_weights"],
                                     inputs["topk_ids"], activation=act, expert_map=inputs.get("expert_map"),
                                     apply_router_weight_on_input=f["apply_weight_on_input"] == "Y",
                                     out=outputs["out"], **quant)


def _scaled_grouped_mm_requires(device: DeviceInfo, features: Mapping[str, str]) -> str | None:
    if not gk.scaled_available():
        return f"torch {torch.__version__} has no torch._scaled_grouped_mm"
    if device.capability is None or tuple(device.capability) != (9, 0):
        return ("torch._scaled_grouped_mm's fp8 rowwise grouped kernel (CUTLASS) runs only on sm90 (compute "
                "capability 9.0); elsewhere torch raises")
    return None


def _consistent_batched(device: DeviceInfo, features: Mapping[str, str]) -> str | None:
    if features.get("format") == "batched" and (features.get("apply_weight_on_input") == "Y"
                                                or features.get("expert_map") == "Y"):
        return "the batched format carries no router weights or expert map (they belong to the prepare step)"
    return None


def _grouped_requires(device: DeviceInfo, features: Mapping[str, str]) -> str | None:
    return _consistent_batched(device, features) or _grouped_mm_requires(device, features)


def _scaled_grouped_requires(device: DeviceInfo, features: Mapping[str, str]) -> str | None:
    return _consistent_batched(device, features) or _scaled_grouped_mm_requires(device, features)


_TRITON_GENERATIONS = ("interp", "sm80", "sm89", "sm90", "sm100", "sm120")
#: strategies: shape edges around block_M = 32, the interpreter's block (its split tail runs 16-row tiles, so an
#: expert with more than 16 rows takes the full tile); E up to 512 so the boundary cases include E=257
_TRITON_LIMITS = {"block_M": 32, "max_E": 512,
                  # the final reduce's 256-column tile (kernels.fused_experts: _pow2(K, 16, 256)), a second program
                  "cross_K": {"at": 257, "where": {"quant_format": ("-", "T", "A")}}}
_TRITON_BATCHED_LIMITS = {"block_M": 32, "max_E": 512}  # no final reduce

TRITON = register(Adapter(
    name="triton-experts", op="experts", source="kernels.fused_experts", run=_run_triton, support=TRITON_STANDARD,
    generations=_TRITON_GENERATIONS, conventions=TRITON_QUANT_CONVENTIONS, properties=frozenset({"deterministic"}),
    limits=_TRITON_LIMITS, interp_features=_interp_features, requires=_triton_requires,
    description="Triton fused experts, sorted-token format: align kernel, GEMM1 + activation, GEMM2 with the "
                "router weight on the fp32 accumulator, fp32 reduce",
), replace=True)

def _run_triton_fp8_fast(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    _run_standard("triton-experts-fp8-fast", TRITON_FP8_FAST, case, inputs, outputs, fp8_fast_accum=True)


#: fused_experts(fp8_fast_accum=True): the fp8 cells only
TRITON_FP8_FAST = {**TRITON_STANDARD, "quant_type": ("fp8_w8a8",), "quant_format": TRITON_QUANT["fp8_w8a8"]}

TRITON_FP8_FAST_ADAPTER = register(Adapter(
    name="triton-experts-fp8-fast", op="experts", source="kernels.fused_experts", run=_run_triton_fp8_fast,
    support=TRITON_FP8_FAST, generations=("interp", "sm89", "sm90", "sm100", "sm120"),
    # the tensor core sums each K block (<= 128 products) in its reduced precision before the fp32 add
    conventions={**TRITON_QUANT_CONVENTIONS, "matmul_precision": "fp8_mma_promoted"},
    properties=frozenset({"deterministic"}), limits=_TRITON_LIMITS, interp_features=_interp_features,
    requires=_triton_requires,
    description="triton-experts with fp8 fast accumulation (fp8_fast_accum=True; vLLM's numerics): each K block's "
                "fp8 dot summed by the tensor core in reduced precision, then added in fp32",
), replace=True)

TRITON_BATCHED_ADAPTER = register(Adapter(
    name="triton-batched-experts", op="experts", source="kernels.batched_experts", run=_run_triton_batched,
    support=TRITON_BATCHED, generations=_TRITON_GENERATIONS,
    # its GEMMs stop at each expert's count: the rows past it are never written
    conventions={**TRITON_QUANT_CONVENTIONS, "padding_rows": "untouched"},
    properties=frozenset({"deterministic"}), limits=_TRITON_BATCHED_LIMITS, interp_features=_interp_features,
    requires=_triton_requires,
    description="Triton experts on the batched format [E, max_tokens, K] (GEMM1 + activation, GEMM2)",
), replace=True)

NAIVE = register(Adapter(
    name="naive-batched-experts", op="experts", source="kernels.naive_batched", run=_run_naive,
    support=NAIVE_BATCHED, conventions=NAIVE_CONVENTIONS, properties=frozenset({"deterministic"}),
    test_aid=True, description="plain-torch batched experts, one expert at a time (test aid)",
), replace=True)

GROUPED_MM_ADAPTER = register(Adapter(
    name="torch-grouped-mm-experts", op="experts", source="kernels.torch_grouped_mm", run=run_grouped_mm,
    support=GROUPED_MM, generations=("sm90", "sm100"), conventions=GROUPED_MM_CONVENTIONS,
    properties=frozenset({"deterministic"}), limits={"max_E": gk.MAX_GROUPS}, requires=_grouped_requires,
    description="torch._grouped_mm (CUTLASS bf16 grouped GEMM) for both GEMMs; activation, router weight and "
                "reduce in fp32 torch",
), replace=True)

SCALED_GROUPED_MM_ADAPTER = register(Adapter(
    name="torch-scaled-grouped-mm-experts", op="experts", source="kernels.torch_grouped_mm",
    run=run_scaled_grouped_mm, support=SCALED_GROUPED_MM, generations=("sm90",),
    conventions=SCALED_GROUPED_MM_CONVENTIONS, properties=frozenset({"deterministic"}),
    limits={"max_E": gk.MAX_GROUPS, "K_multiple": gk.SCALED_ALIGN, "N_multiple": gk.SCALED_ALIGN},
    requires=_scaled_grouped_requires,
    description="torch._scaled_grouped_mm (CUTLASS fp8 rowwise grouped GEMM, sm90) for both GEMMs, fp8_w8a8 "
                "per-token/per-channel (A) and per-tensor/per-expert (T) scales; quantization by the Triton "
                "recipe, activation, router weight and reduce in fp32 torch",
), replace=True)


#: kernels.gluon_experts: fp8 G128 with silu_and_mul, no bias, map or weight on the input
GLUON = {"format": ("standard",), "quant_type": ("fp8_w8a8",), "quant_format": ("G128",), "activation": ("silu",),
         "apply_weight_on_input": ("N",), "expert_map": ("N",), "dtype": ("bfloat16", "float16"), "bias": ("N",)}
_GLUON_LIMITS = {"block_M": ge.BLOCK_M, "max_E": 512, "K_multiple": ge.ALIGN, "N_multiple": ge.ALIGN}


def _gluon_requires(device: DeviceInfo, features: Mapping[str, str]) -> str | None:
    if device.capability is None or tuple(device.capability) != (9, 0):
        return "Gluon's warp-group MMAs (wgmma) exist on sm90 (compute capability 9.0) only"
    return ge.missing_api() or None


def _run_gluon(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    name = "gluon-experts-fp8-fast"
    _check(name, GLUON, case.features)
    k_dim, n = inputs["x"].shape[-1], inputs["w2"].shape[-1]
    if k_dim % ge.ALIGN or n % ge.ALIGN:
        raise Unsupported(f"{name} needs K and N multiples of {ge.ALIGN} (TMA rows), got K={k_dim}, N={n}")
    ge.gluon_fused_experts(inputs["x"], inputs["w13"], inputs["w2"], inputs["topk_weights"], inputs["topk_ids"],
                           _quant(case.features, inputs), out=outputs["out"])


GLUON_ADAPTER = register(Adapter(
    name="gluon-experts-fp8-fast", op="experts", source="kernels.gluon_experts", run=_run_gluon, support=GLUON,
    generations=("sm90",), conventions={**TRITON_QUANT_CONVENTIONS, "matmul_precision": "fp8_mma_promoted"},
    properties=frozenset({"deterministic"}), limits=_GLUON_LIMITS, requires=_gluon_requires,
    description="fp8 G128 fused experts with fast accumulation, both GEMMs in Gluon (TMA rings, asynchronous "
                "warp-group MMAs; sm90): x copied into expert order, silu in GEMM1's epilogue, router weight and "
                "slot scatter in GEMM2's",
), replace=True)
