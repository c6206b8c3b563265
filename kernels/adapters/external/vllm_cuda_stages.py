"""Adapters of vLLM 0.32.0's CUDA stage ops, its real compiled kernels (`_vllm_cuda`: the `_moe_C` and `_C`
stable-ABI extensions of the CUDA wheel), and the experts row as vLLM runs it on a GPU: its Triton `fused_moe_kernel`
(read from its files, `vllm_triton_files`) with these CUDA ops between the GEMMs.

Every op is reached through `_vllm_cuda.ops(namespace)` when a case runs (a CPU test puts stand-ins of the ops'
contracts there). Support and conventions are read from vLLM's CUDA sources of that generation (stable-ABI
`csrc/libtorch_stable/...`) and its Python callers; each adapter calls the op as that caller does.

Routing (`_moe_C`, what `fused_topk` / `fused_topk_bias` call; vLLM allocates fp32 weights, int32 ids):
- `vllm-cuda-topk-softmax` (`routing`, softmax): `topk_softmax(w, ids, token_expert_indices, logits, renormalize,
  bias, is_padding=None)`. `vllm-cuda-topk-sigmoid` (sigmoid): `topk_sigmoid(..., bias, routed_scaling_factor=1.0,
  is_padding=None)`. Scores in fp32 from the logits of any float dtype; the correction bias (fp32) selects, the
  weights are the unbiased scores, renormalized by their sum (1 when the sum is 0). Every E: a fused warp kernel
  for E in 1..512 powers of two and 192/320/384/448/576, else a softmax/sigmoid kernel then a block top-k (the
  `cross_E` sizes). Non-finite scores are clamped to 0 (`nonfinite="zero"`: NaN rows pick 0..k-1, weights 0).
  Ties go to the lower expert index (an argmax that keeps the lower index on equal values, in both kernels).
- `vllm-cuda-grouped-topk` (`grouped_routing`): `grouped_topk(scores, n_group, topk_group, topk, renormalize,
  routed_scaling_factor, bias, scoring_func)`, as vLLM's `fused_grouped_topk` calls it: with a correction bias
  only (vLLM takes its torch path without one), sigmoid as scoring_func 1 on the logits, softmax as
  `torch.softmax(logits)` in the logits' dtype then scoring_func 0. The kernel forms sigmoid, score + bias and the
  top-2 group sums in the logits' dtype (`score_dtype="input"`), renormalizes by sum + 1e-20
  (`renormalize_eps`), keeps the lower index among equal groups and experts. It checks n_group <= 32 and
  topk <= 32 (vLLM's dispatch takes the torch path past them): the `max_num_groups` and `max_k` limits.
  Non-finite logits are not declared (a non-finite expert is skipped in the final selection but not in the group
  scores). scaling_placement=reduce passes a factor of 1. Softmax on fp16 logits is excluded (`FP16_SOFTMAX`).

Align (`_moe_C.moe_align_block_size(topk_ids, E, block, sorted_ids, expert_ids, ntpp, expert_map, None)`), into
the harness's buffers (the same capacity as vLLM's, numel + E * (block - 1)): `exclude` passes the int32 map, as
vLLM does for `ignore_invalid_experts=True` (non-local entries left out, local ids); `keep_invalid_blocks` calls it
without a map and maps the block ids afterwards, as vLLM's wrapper does (`expert_map[expert_ids]`), which also maps
the -1 tail blocks (to the last expert's entry): the tail is then not the kernel's contract (`tail="unwritten"`).
Entries within an expert come in atomic order: not declared deterministic. The op takes E up to 992 (a
1024-thread scan), past the sizes drawn.

Reduce (`_moe_C.moe_sum(expert_out, out, topk_ids, expert_map)`): a plain sum over the k slots in fp32, rounded
once (`accumulation=fp32`). It takes no router weights: vLLM multiplies them in GEMM2's epilogue
(`weights_applied=Y`) or on the input (`apply_weight_on_input=Y`); the cells with neither are excluded. It takes no
routed scaling factor either (vLLM's router folds it into the weights): `max_routed_scaling_factor=1`. Under an
expert map the slots of non-local experts are skipped (topk_ids and the int32 map passed).

Activations (`_C`, what `apply_moe_activation` calls): `silu_and_mul`, `gelu_and_mul`, `gelu_tanh_and_mul`
(out, x): gate first, the activation rounded to x's dtype before the multiply (`round_activation_first`, in the
scalar and the packed paths); `swigluoai_and_mul(out, x, 1.702, 7.0)`: interleaved, clamps, one rounding.

Group quantization (`_C`): `per_token_group_fp8_quant(x, codes, scales, group, 1e-10, -448, 448, ue8m0,
column_major, tma_aligned)` into the harness's buffers (scale strides as vLLM allocates them: the kernel reads
the layout from the strides): s = max(amax, 1e-10) / 448, codes x / s; ue8m0 floors s at 1e-10 before
2^ceil(log2 s), i.e. max(amax / 448, 1e-10) then the rounding (`eps_placement="scale"`). `per_token_group_quant_int8
(x, codes, scales, group, 1e-10, -128, 127)`: s = max(amax, 1e-10) / 127, x / s clamped and truncated (a C++
float-to-int8 conversion). vLLM takes these ops only for a contiguous x: the adapters hand them `x.contiguous()`.

Generations: the wheel's device code is sm75..sm120 (sm80 PTX, sm90 cubins); an sm80 device converts fp8 in
software. Row counts of 0 are returned before the launch where the outputs are empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from harness.core.case import Case
from harness.core.device import DeviceInfo
from harness.core.known import KnownFinding
from harness.registry import Adapter, Unsupported, import_library, register
from kernels.adapters.external import _vllm_cuda
from kernels.adapters.external import vllm_experts as ve
from kernels.adapters.external import vllm_triton_files as vf

Tensors = dict[str, torch.Tensor]

LIBRARY = _vllm_cuda.LIBRARY
GENERATIONS = ("sm80", "sm89", "sm90", "sm100", "sm120")
_FLOATS = ("float32", "bfloat16", "float16")
_DETERMINISTIC = frozenset({"deterministic", "batch_invariant"})


def _check(name: str, support: Mapping[str, tuple[str, ...]], features: Mapping[str, str]) -> None:
    """Reject, naming the feature, a cell the adapter cannot even express."""
    for axis, values in support.items():
        if features.get(axis) not in values:
            raise Unsupported(f"{name} does not support {axis}={features.get(axis)!r}")


# ---------------------------------------------------------------------------------------------------- routing

TOPK_SUPPORT = {"renormalize": ("Y", "N"), "correction_bias": ("N", "Y"), "logits_dtype": _FLOATS,
                "nonfinite_rows": ("N", "Y")}
TOPK_CONVENTIONS = {"nonfinite": "zero", "tie_break": "lower_index"}
#: E just past the fused kernel's sizes: the softmax/sigmoid + block top-k pair
TOPK_CROSS_E = (65, 513)


def _run_topk(scoring: str, case: Case, inputs: Tensors, outputs: Tensors) -> None:
    name = f"vllm-cuda-topk-{scoring}"
    _check(name, {"scoring": (scoring,), **TOPK_SUPPORT}, case.features)
    logits, w, ids = inputs["router_logits"].contiguous(), outputs["topk_weights"], outputs["topk_ids"]
    if logits.shape[0] == 0:
        return
    rows = torch.empty(ids.shape, dtype=torch.int32, device=logits.device)  # token_expert_indices
    renorm, bias = case.features["renormalize"] == "Y", inputs.get("correction_bias")
    ops = _vllm_cuda.ops("_moe_C")
    if scoring == "softmax":
        ops.topk_softmax(w, ids, rows, logits, renorm, bias, None)
    else:
        ops.topk_sigmoid(w, ids, rows, logits, renorm, bias, 1.0, None)


def _run_topk_softmax(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    _run_topk("softmax", case, inputs, outputs)


def _run_topk_sigmoid(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    _run_topk("sigmoid", case, inputs, outputs)


GROUPED_SUPPORT = {"scoring": ("softmax", "sigmoid"), "correction_bias": ("Y",), "renormalize": ("Y", "N"),
                   "scaling_placement": ("weights", "reduce"), "logits_dtype": _FLOATS, "nonfinite_rows": ("N",)}
#: no tie order declared: on sm90 tied groups went to the higher group index in 6 of 140 cases (docs/FINDINGS.md 19)
GROUPED_CONVENTIONS = {"score_dtype": "input", "renormalize_eps": 1e-20}
#: the op's checks: n_group <= 32, topk <= 32; past 8 experts per token it leaves its small-count kernel
GROUPED_LIMITS = {"max_num_groups": 32, "max_k": 32, "cross_k": 9}
#: vLLM's scoring_func ids of the op
SCORING_IDS = {"softmax": 0, "sigmoid": 1}


FP16_SOFTMAX = ("softmax scores formed in fp16 (vLLM's torch.softmax in the logits' dtype) flush below 2^-24: a "
                "weight that small comes back 0, outside the bound the oracle puts on score_dtype=input roundings")


def _grouped_requires(device: DeviceInfo | None, features: Mapping[str, str]) -> str | None:
    if (features.get("scoring"), features.get("logits_dtype")) == ("softmax", "float16"):
        return FP16_SOFTMAX
    return None


def _run_grouped(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    f, p = case.features, case.params
    _check("vllm-cuda-grouped-topk", GROUPED_SUPPORT, f)
    logits = inputs["router_logits"].contiguous()
    if logits.shape[0] == 0:
        return
    # vLLM's fused_grouped_topk: softmax scores formed by torch (in the logits' dtype), sigmoid by the kernel
    scores = torch.softmax(logits, dim=-1) if f["scoring"] == "softmax" else logits
    scale = p.get("routed_scaling_factor", 1.0) if f["scaling_placement"] == "weights" else 1.0
    w, ids = _vllm_cuda.ops("_moe_C").grouped_topk(
        scores, p["num_groups"], p["topk_group"], case.shape("k"), f["renormalize"] == "Y", scale,
        inputs["correction_bias"], SCORING_IDS[f["scoring"]])
    outputs["topk_weights"].copy_(w)
    outputs["topk_ids"].copy_(ids)


_ROUTING: dict[str, Any] = dict(library=LIBRARY, generations=GENERATIONS, properties=_DETERMINISTIC)

NONFINITE_ALL_EXPERTS = KnownFinding(
    finding="docs/FINDINGS.md 15 (non-finite rows with k = E of a few experts: duplicate expert ids)",
    checks=("topk_ids",), features={"nonfinite_rows": ("Y",)}, shapes={"E": {"max": 7}},
    case=Case(op="routing", adapter="vllm-cuda-topk-softmax", seed=164, routing="nonfinite",
              dtypes={"router_logits": "float32"},
              features={"correction_bias": "Y", "logits_dtype": "float32", "nonfinite_rows": "Y", "renormalize": "Y",
                        "scoring": "softmax"},
              shapes={"E": 3, "M": 1, "k": 3}, params={"values": "random"}))

TOPK_SOFTMAX = register(Adapter(
    name="vllm-cuda-topk-softmax", op="routing", source="vllm _moe_C.topk_softmax (CUDA)", run=_run_topk_softmax,
    support={"scoring": ("softmax",), **TOPK_SUPPORT}, conventions=TOPK_CONVENTIONS,
    limits={"cross_E": TOPK_CROSS_E}, known=(NONFINITE_ALL_EXPERTS,), **_ROUTING,
    description="vLLM CUDA topk_softmax (fused softmax + top-k, correction bias, renormalize), fp32 scores"))
TOPK_SIGMOID = register(Adapter(
    name="vllm-cuda-topk-sigmoid", op="routing", source="vllm _moe_C.topk_sigmoid (CUDA)", run=_run_topk_sigmoid,
    support={"scoring": ("sigmoid",), **TOPK_SUPPORT}, conventions=TOPK_CONVENTIONS,
    limits={"cross_E": TOPK_CROSS_E}, **_ROUTING,
    description="vLLM CUDA topk_sigmoid (fused sigmoid + top-k, correction bias, renormalize), fp32 scores"))
_GROUPED_CASE = Case(op="grouped_routing", adapter="vllm-cuda-grouped-topk", seed=0, dtypes={}, shapes={},
                     features={"correction_bias": "Y", "nonfinite_rows": "N", "renormalize": "Y"})
#: FINDINGS 16, softmax: with one group the weights come from (score + bias) - bias in fp32, so a score below half
#: the bias's ulp weighs 0 and larger ones are rounded to that ulp
SOFTMAX_ONE_GROUP_BIASED = KnownFinding(
    finding="docs/FINDINGS.md 16 (softmax with one group: weights from (score + bias) - bias)",
    checks=("topk_weights",), features={"scoring": ("softmax",)}, params={"num_groups": (1,)},
    case=_GROUPED_CASE.replace(
        seed=399514, routing="some_empty", dtypes={"router_logits": "bfloat16"}, shapes={"E": 8, "M": 2, "k": 1},
        features={**_GROUPED_CASE.features, "logits_dtype": "bfloat16", "scaling_placement": "reduce",
                  "scoring": "softmax"},
        params={"num_groups": 1, "routed_scaling_factor": 1.0, "topk_group": 1}))
#: FINDINGS 16, sigmoid: 0.5 * tanh(0.5 x) + 0.5 in fp32 has an absolute error near 2^-25 (tiny sigmoids are 0 or
#: far off), on every path (one group and several)
SIGMOID_TANH_FORM = KnownFinding(
    finding="docs/FINDINGS.md 16 (sigmoid as 0.5 * tanh(0.5 x) + 0.5: absolute error of about 2^-25)",
    checks=("topk_weights",), features={"scoring": ("sigmoid",)},
    case=_GROUPED_CASE.replace(
        seed=261, routing="skewed", dtypes={"router_logits": "float32"}, shapes={"E": 8, "M": 5, "k": 5},
        features={**_GROUPED_CASE.features, "logits_dtype": "float32", "scaling_placement": "weights",
                  "scoring": "sigmoid"},
        params={"num_groups": 2, "routed_scaling_factor": 1.0, "topk_group": 2}))

#: FINDINGS 19: past 8 groups the kernel chooses among the first 8 groups only (direct calls: 16 and 32 groups, E 64
#: and 128, fp32, bf16 and fp16, one token or 171; the generic test: E = 66 in 11 groups as well)
FIRST_EIGHT_GROUPS = KnownFinding(
    finding="docs/FINDINGS.md 19 (past 8 groups, only groups 0-7 are chosen from)",
    checks=("topk_ids",), params={"num_groups": {"min": 9}},
    case=_GROUPED_CASE.replace(
        seed=2, routing="skewed", dtypes={"router_logits": "bfloat16"}, shapes={"E": 64, "M": 171, "k": 1},
        layout={"router_logits": "column_step"},
        features={**_GROUPED_CASE.features, "logits_dtype": "bfloat16", "scaling_placement": "weights",
                  "scoring": "softmax"},
        params={"num_groups": 16, "routed_scaling_factor": 2.5, "topk_group": 2}))

GROUPED_TOPK = register(Adapter(
    name="vllm-cuda-grouped-topk", op="grouped_routing", source="vllm _moe_C.grouped_topk (CUDA)", run=_run_grouped,
    support=GROUPED_SUPPORT, conventions=GROUPED_CONVENTIONS, limits=GROUPED_LIMITS, requires=_grouped_requires,
    known=(SOFTMAX_ONE_GROUP_BIASED, SIGMOID_TANH_FORM, FIRST_EIGHT_GROUPS), **_ROUTING,
    description="vLLM CUDA grouped_topk (DeepSeek V3 noaux_tc: biased top-2 group scores), as fused_grouped_topk "
                "calls it"))


# ------------------------------------------------------------------------------------------------------ align

ALIGN_SUPPORT = {"block_size": ("16", "32", "64", "128"), "expert_map": ("none", "keep_invalid_blocks", "exclude"),
                 "ids_dtype": ("int32", "int64")}


def align_into(topk_ids: torch.Tensor, num_experts: int, block_size: int, sorted_ids: torch.Tensor,
               expert_ids: torch.Tensor, ntpp: torch.Tensor, expert_map: torch.Tensor | None,
               ignore_invalid_experts: bool) -> torch.Tensor:
    """vLLM's moe_align_block_size on given buffers: the CUDA op, with the map only for ignore_invalid_experts,
    else the block ids mapped afterwards. Returns the block ids (a new tensor when mapped)."""
    kernel_map = expert_map.to(torch.int32) if expert_map is not None and ignore_invalid_experts else None
    _vllm_cuda.ops("_moe_C").moe_align_block_size(topk_ids, num_experts, block_size, sorted_ids, expert_ids, ntpp,
                                                  kernel_map, None)
    if expert_map is not None and not ignore_invalid_experts:
        return expert_map[expert_ids.long()]
    return expert_ids


def align_block_size(topk_ids: torch.Tensor, block_size: int, num_experts: int,
                     expert_map: torch.Tensor | None = None, pad_sorted_ids: bool = False,
                     ignore_invalid_experts: bool = False, **kwargs: Any) -> tuple[torch.Tensor, ...]:
    """vLLM's `moe_align_block_size` (Python): its buffers (capacity numel + E * (block - 1), at most numel * block
    when numel < E), then the CUDA op (`align_into`)."""
    numel, dev = topk_ids.numel(), topk_ids.device
    cap = numel + num_experts * (block_size - 1)
    if pad_sorted_ids:
        cap = -(-cap // block_size) * block_size
    if numel < num_experts:
        cap = min(numel * block_size, cap)
    sorted_ids = torch.empty((cap,), dtype=torch.int32, device=dev)
    expert_ids = torch.empty((-(-cap // block_size),), dtype=torch.int32, device=dev)
    ntpp = torch.empty((1,), dtype=torch.int32, device=dev)
    expert_ids = align_into(topk_ids, num_experts, block_size, sorted_ids, expert_ids, ntpp, expert_map,
                            ignore_invalid_experts)
    return sorted_ids, expert_ids, ntpp


def _run_align(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    f = case.features
    _check("vllm-cuda-align", ALIGN_SUPPORT, f)
    eids = outputs["expert_ids"]
    mapped = align_into(inputs["topk_ids"], case.shape("E"), int(f["block_size"]), outputs["sorted_token_ids"],
                        eids, outputs["num_tokens_post_padded"], inputs.get("expert_map"),
                        ignore_invalid_experts=f["expert_map"] != "keep_invalid_blocks")
    if mapped is not eids:
        eids.copy_(mapped)


def _align_conventions(case: Case, device: DeviceInfo) -> dict[str, Any]:
    # keep_invalid_blocks: vLLM maps every block id, the -1 tail included (expert_map[-1], the last expert's)
    return {"tail": "unwritten"} if case.features["expert_map"] == "keep_invalid_blocks" else {}


ALIGN = register(Adapter(
    name="vllm-cuda-align", op="align", source="vllm _moe_C.moe_align_block_size (CUDA)", run=_run_align,
    support=ALIGN_SUPPORT, generations=GENERATIONS, conventions={"invalid_blocks": "per_expert"},
    conventions_for=_align_conventions, library=LIBRARY,
    description="vLLM CUDA moe_align_block_size (atomic count and sort), the expert map as vLLM's wrapper passes "
                "it"))


# ----------------------------------------------------------------------------------------------------- reduce

REDUCE_SUPPORT = {"accumulation": ("fp32",), "weights_applied": ("Y", "N"), "apply_weight_on_input": ("N", "Y"),
                  "expert_map": ("N", "Y"), "dtype": _FLOATS}
UNWEIGHTED = "vLLM's moe_sum takes no router weights: they are applied in GEMM2's epilogue or on the input"
BOTH_WEIGHTS = "weights_applied=Y with apply_weight_on_input=Y: the weight cannot be applied both ways"


def _reduce_requires(device: DeviceInfo | None, features: Mapping[str, str]) -> str | None:
    applied, on_input = features.get("weights_applied") == "Y", features.get("apply_weight_on_input") == "Y"
    if applied and on_input:
        return BOTH_WEIGHTS
    return None if applied or on_input else UNWEIGHTED


def _run_reduce(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    _check("vllm-cuda-moe-sum", REDUCE_SUPPORT, case.features)
    why = _reduce_requires(None, case.features)
    if why:  # the sweep also runs undeclared cells: they must be refused, not summed without weights
        raise Unsupported(why)
    y, out = inputs["expert_out"], outputs["out"]
    if y.shape[0] == 0:
        return
    emap = inputs.get("expert_map")
    ids = inputs["topk_ids"] if emap is not None else None
    _vllm_cuda.ops("_moe_C").moe_sum(y, out, ids, None if emap is None else emap.to(torch.int32))


MOE_SUM = register(Adapter(
    name="vllm-cuda-moe-sum", op="reduce", source="vllm _moe_C.moe_sum (CUDA)", run=_run_reduce,
    support=REDUCE_SUPPORT, requires=_reduce_requires, generations=GENERATIONS,
    # the op writes `out` through its raw pointer as a contiguous [M, K] tensor (vLLM allocates it so)
    limits={"max_routed_scaling_factor": 1, "layouts": {"out": ("contiguous",)}}, library=LIBRARY,
    properties=_DETERMINISTIC,
    description="vLLM CUDA moe_sum: the k slots summed in fp32 (pad-aware under an expert map), no weights"))


# ------------------------------------------------------------------------------------------------ activations

#: the op's activation axis -> vLLM's `_C` op
ACT_OPS = {"silu_and_mul": "silu_and_mul", "gelu_and_mul": "gelu_and_mul", "gelu_tanh_and_mul": "gelu_tanh_and_mul",
           "swigluoai": "swigluoai_and_mul"}
ACT_SUPPORT = {"activation": tuple(ACT_OPS), "dtype": _FLOATS}
#: swigluoai_and_mul's defaults, which apply_moe_activation uses
SWIGLUOAI_ALPHA, SWIGLUOAI_LIMIT = 1.702, 7.0


def _act_rounding(case: Case, device: DeviceInfo) -> dict[str, Any]:
    return {"rounding": "round_once" if case.features["activation"] == "swigluoai" else "round_activation_first"}


def _run_activation(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    _check("vllm-cuda-activation", ACT_SUPPORT, case.features)
    x, out = inputs["x"].contiguous(), outputs["out"]
    if x.shape[0] == 0:
        return
    act = case.features["activation"]
    op = getattr(_vllm_cuda.ops("_C"), ACT_OPS[act])
    if act == "swigluoai":
        op(out, x, SWIGLUOAI_ALPHA, SWIGLUOAI_LIMIT)
    else:
        op(out, x)


ACTIVATION = register(Adapter(
    name="vllm-cuda-activation", op="activation", source="vllm _C.*_and_mul (CUDA)", run=_run_activation,
    support=ACT_SUPPORT, generations=GENERATIONS, library=LIBRARY, properties=_DETERMINISTIC,
    conventions={"gate_order": "gate_first", "alpha": SWIGLUOAI_ALPHA, "beta": 1.0, "limit": SWIGLUOAI_LIMIT},
    conventions_for=_act_rounding,
    description="vLLM CUDA silu_and_mul / gelu_and_mul / gelu_tanh_and_mul / swigluoai_and_mul"))


# --------------------------------------------------------------------------------------------- quantization

_GROUP_SIZES = ("128", "64", "32", "16")
FP8_SUPPORT = {"quant_dtype": ("fp8_e4m3fn",), "unit": ("group",), "group_size": _GROUP_SIZES,
               "scale_rule": ("float", "ue8m0"), "scale_layout": ("row_major", "column_major", "column_major_tma"),
               "input_dtype": _FLOATS}
FP8_CONVENTIONS = {"eps": 1e-10, "scale_formula": "divide", "application": "divide", "ue8m0_form": "ceil_log2",
                   "ue8m0_clamp": False}
INT8_SUPPORT = {"quant_dtype": ("int8",), "unit": ("group",), "group_size": _GROUP_SIZES, "scale_rule": ("float",),
                "scale_layout": ("row_major",), "input_dtype": _FLOATS}
INT8_CONVENTIONS = {"eps": 1e-10, "eps_placement": "amax", "scale_formula": "divide", "application": "divide",
                    "int8_rounding": "truncate"}
FP8_MAX, INT8_MIN, INT8_MAX = 448.0, -128.0, 127.0


def _fp8_eps(case: Case, device: DeviceInfo) -> dict[str, Any]:
    # ue8m0: the kernel floors max(amax, eps) / 448 at 1e-10 before the rounding, the same as max(amax / 448, eps)
    return {"eps_placement": "scale" if case.features["scale_rule"] == "ue8m0" else "amax"}


def _run_fp8(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    f = case.features
    _check("vllm-cuda-group-quant-fp8", FP8_SUPPORT, f)
    x = inputs["x"].contiguous()
    if x.shape[0] == 0:
        return
    layout = f["scale_layout"]
    _vllm_cuda.ops("_C").per_token_group_fp8_quant(
        x, outputs["codes"], outputs["scales"], int(f["group_size"]), FP8_CONVENTIONS["eps"], -FP8_MAX, FP8_MAX,
        f["scale_rule"] == "ue8m0", layout != "row_major", layout == "column_major_tma")


def _run_int8(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    f = case.features
    _check("vllm-cuda-group-quant-int8", INT8_SUPPORT, f)
    x = inputs["x"].contiguous()
    if x.shape[0] == 0:
        return
    _vllm_cuda.ops("_C").per_token_group_quant_int8(x, outputs["codes"], outputs["scales"], int(f["group_size"]),
                                                    INT8_CONVENTIONS["eps"], INT8_MIN, INT8_MAX)


GROUP_QUANT_FP8 = register(Adapter(
    name="vllm-cuda-group-quant-fp8", op="group_quant", source="vllm _C.per_token_group_fp8_quant (CUDA)",
    run=_run_fp8, support=FP8_SUPPORT, conventions=FP8_CONVENTIONS, conventions_for=_fp8_eps,
    generations=GENERATIONS, library=LIBRARY, properties=_DETERMINISTIC,
    description="vLLM CUDA per_token_group_fp8_quant (what per_token_group_quant_fp8 takes on CUDA)"))
GROUP_QUANT_INT8 = register(Adapter(
    name="vllm-cuda-group-quant-int8", op="group_quant", source="vllm _C.per_token_group_quant_int8 (CUDA)",
    run=_run_int8, support=INT8_SUPPORT, conventions=INT8_CONVENTIONS, generations=GENERATIONS, library=LIBRARY,
    properties=_DETERMINISTIC,
    description="vLLM CUDA per_token_group_quant_int8 (truncating cast)"))


# ------------------------------------------------------------------------------------ experts, as vLLM runs it

#: fused_experts_impl's activation quantizers on CUDA: per_token_group_quant_fp8 takes the CUDA op, which divides
#: (the Triton fallback multiplies by 1 / 448)
FP8_GROUP_ACT = {**ve.FP8_GROUP_ACT, "scale_formula": "divide"}
#: the activations vLLM runs as its CUDA ops (the rest: torch's F.silu / F.gelu, as apply_moe_activation does)
_EXPERT_ACT_OPS = {"silu": "silu_and_mul", "gelu": "gelu_and_mul", "swigluoai": "swigluoai_and_mul"}


class CudaOps:
    """The stages of `vllm_triton_files.run_standard_with` as vLLM runs them on CUDA (`StandIns`' counterpart):
    moe_align_block_size, the activation ops, the fp8 quantizers (per-token-group, per-token, per-tensor) and
    moe_sum. vLLM's per-token int8 quantizer is Triton (`per_token_quant_int8`, not in the files taken): it stays
    the stand-in."""

    name = "vllm-triton-experts-cuda-ops"
    module_name = "vllm_moe_cuda_ops"

    @staticmethod
    def align(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        return align_block_size(*args, **kwargs)

    @staticmethod
    def activation(name: str, h: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        if name not in _EXPERT_ACT_OPS:  # silu_no_mul, gelu_no_mul
            fn = torch.nn.functional.silu if name == "silu_no_mul" else torch.nn.functional.gelu
            return fn(h)
        out = torch.empty((h.shape[0], h.shape[1] // 2), dtype=out_dtype, device=h.device)
        getattr(_vllm_cuda.ops("_C"), _EXPERT_ACT_OPS[name])(out, h)
        return out

    @staticmethod
    def quantize(a: torch.Tensor, quant_dtype: Any, flags: Mapping[str, Any],
                 recipe: Mapping[str, Any] | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if quant_dtype != torch.float8_e4m3fn:
            return vf.quantize(a, quant_dtype, flags, recipe)
        return _fp8_quantize(a.contiguous(), flags)

    @staticmethod
    def moe_sum(cache3: torch.Tensor, out: torch.Tensor) -> None:
        _vllm_cuda.ops("_moe_C").moe_sum(cache3, out, None, None)  # fused_experts_impl: no ids, no map


def _fp8_quantize(a: torch.Tensor, flags: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """moe_kernel_quantize_input's fp8 path on CUDA, with the buffers vLLM allocates."""
    ops = _vllm_cuda.ops("_C")
    q = torch.empty(a.shape, dtype=torch.float8_e4m3fn, device=a.device)
    block = flags["block_shape"]
    if block:
        s = torch.empty((a.shape[0], a.shape[1] // block[1]), dtype=torch.float32, device=a.device)
        ops.per_token_group_fp8_quant(a, q, s, block[1], 1e-10, -FP8_MAX, FP8_MAX, False, False, False)
    elif flags["per_channel_quant"]:
        s = torch.empty((a.shape[0], 1), dtype=torch.float32, device=a.device)
        ops.dynamic_per_token_scaled_fp8_quant(q, a, s, None)
    else:
        s = torch.empty(1, dtype=torch.float32, device=a.device)
        ops.dynamic_scaled_fp8_quant(q, a, s)
    return q, s


CUDA_OPS = CudaOps()


@dataclass(frozen=True)
class FilesWithExtensions(_vllm_cuda.ExtensionLibrary):
    """vLLM's fused_moe files (`vllm_triton_files`) beside its CUDA extensions, in one package directory
    (third_party/vllm/ holds both once both scripts ran): present when all are there and a CUDA device is."""

    def load(self) -> None:
        why = self.missing()
        if why is not None:
            raise ImportError(why)
        broken = import_library(_vllm_cuda.LIBRARY)
        if broken:
            raise ImportError(broken)


EXPERTS_LIBRARY = FilesWithExtensions(
    distribution="vllm", module="vllm", written_for=_vllm_cuda.VERSION,
    install="bash scripts/third_party.sh && bash scripts/vllm_cuda.sh (vLLM's fused_moe files and its two CUDA "
            "extension libraries into third_party/vllm/; on a GPU machine: bash scripts/vllm_cuda.sh --unpack)",
    needs=(*vf.LIBRARY.needs, *_vllm_cuda.LIBRARY.needs))


def _experts_conventions(case: Case, device: DeviceInfo) -> dict[str, Any]:
    found = vf.conventions_for(case, device)
    act = case.features.get("activation")
    found["rounding"] = "round_activation_first" if act in ("silu", "gelu") else "round_once"
    found["accumulation"] = "rounded_slots"  # moe_sum: the slots as stored (x.dtype), summed in fp32
    if (case.features.get("quant_type"), case.features.get("quant_format")) == ("fp8_w8a8", "G128"):
        found["act_quant"] = dict(FP8_GROUP_ACT)
    return found


def run_cuda_standard(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    vf.run_standard_with(CUDA_OPS, case, inputs, outputs)


CUDA_STANDARD = register(Adapter(
    name="vllm-triton-experts-cuda-ops", op="experts",
    source=f"vllm/{vf._FM}/fused_moe.py:fused_moe_kernel with vLLM's CUDA ops", run=run_cuda_standard,
    support=vf.SUPPORT, generations=GENERATIONS, conventions=ve.TRITON_CONVENTIONS,
    conventions_for=_experts_conventions, requires=vf.requires, properties=frozenset({"deterministic"}),
    limits={"block_M": 16, "max_E": 512}, library=EXPERTS_LIBRARY,
    description="vLLM fused_moe_kernel / fused_moe_kernel_gptq_awq (Triton, read from its files) in "
                "fused_experts_impl's sequence with vLLM's CUDA ops between the GEMMs: moe_align_block_size, "
                "silu/gelu/swigluoai_and_mul, the fp8 activation quantizers, moe_sum (per-token int8: stand-in)"))
