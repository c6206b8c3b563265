"""Every convention an adapter can declare, per op: its key, its values, what each means, who uses it.

An adapter's `conventions` tell the oracle how its kernel computes where libraries differ (docs/SEMANTICS.md). This
module is the one list of them: the registry validates every adapter against it (an unknown key or value is an
error naming the valid ones, never silently the oracle's default), and `python -m harness conventions` renders it
(docs/CONVENTIONS.md). The values of an enum-backed key come from the reference enum itself, so the list cannot
drift from what the oracle accepts; a test checks that every key listed here is read by its op.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reference import activations as act_ref
from reference import experts as exp_ref
from reference import formats as fmt_ref
from reference import quant as q_ref
from reference import routing as rt_ref
from reference import scales as sc_ref


@dataclass(frozen=True)
class Convention:
    """One convention key.

    kind: "choice" (one of `values`), "number", "int", "bool", "recipe" (a dict of QuantRecipe fields, only the
    `fields` listed). default: what the oracle assumes when the adapter does not say (None: see `meaning`).
    values: value -> what it means and which libraries use it.
    """

    key: str
    meaning: str
    kind: str = "choice"
    values: Mapping[str, str] = field(default_factory=dict)
    default: Any = None
    fields: tuple[str, ...] = ()

    def check(self, value: Any, where: str) -> None:
        """Raise ValueError naming `where` and the valid values when `value` is not one of this key's."""
        if self.kind == "choice":
            if value not in self.values:
                raise ValueError(f"{where}: convention {self.key}={value!r} is not one of "
                                 f"{', '.join(map(repr, self.values))}")
        elif self.kind == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"{where}: convention {self.key} must be true or false, got {value!r}")
        elif self.kind in ("number", "int"):
            ok = isinstance(value, int) if self.kind == "int" else isinstance(value, (int, float))
            if value is not None and (isinstance(value, bool) or not ok):
                what = "an integer" if self.kind == "int" else "a number"
                raise ValueError(f"{where}: convention {self.key} must be {what}, got {value!r}")
        elif self.kind == "recipe":
            if not isinstance(value, Mapping):
                raise ValueError(f"{where}: convention {self.key} must be a mapping of QuantRecipe fields, got "
                                 f"{type(value).__name__}")
            for k, v in value.items():
                if k not in self.fields:
                    raise ValueError(f"{where}: convention {self.key} has unknown field {k!r}; valid: "
                                     f"{', '.join(self.fields)}")
                RECIPE_FIELDS[k].check(v, f"{where}: {self.key}")


def _choices(enum_cls: type[enum.Enum], said: Mapping[str, str]) -> dict[str, str]:
    """The enum's values (all of them, in order) with what `said` tells about each (empty where nothing)."""
    unknown = set(said) - {m.value for m in enum_cls}
    if unknown:
        raise AssertionError(f"{enum_cls.__name__} has no values {sorted(unknown)}")
    return {m.value: said.get(m.value, "") for m in enum_cls}


# -- QuantRecipe fields an adapter may set (group_quant at top level; act_quant's `quant`, experts' `*_quant`) --

RECIPE_FIELDS: dict[str, Convention] = {c.key: c for c in (
    Convention("scale_rule", "how a unit's scale comes from its amax", values=_choices(sc_ref.ScaleRule, {
        "float": "s = max(amax, eps) / qmax in fp32", "ue8m0": "s rounded up to a power of two (DeepGEMM, "
        "vLLM's ue8m0 quantizers)", "ocp_floor": "OCP MX: 2^(floor(log2 amax) - emax)"})),
    Convention("eps", "the guard of an all-zero unit (float rule)", kind="number", default=1e-10),
    Convention("eps_placement", "where eps applies", values=_choices(sc_ref.EpsPlacement, {
        "amax": "max(amax, eps) / qmax (vLLM, SGLang)", "scale": "max(amax / qmax, eps)",
        "rounded_scale": "max(ue8m0(amax / qmax), eps): after the power-of-two rounding (vLLM's QuantFP8 native "
        "path)"}), default="amax"),
    Convention("eps_dtype", "the dtype eps is rounded to before it guards amax (as torch converts a Python "
               "scalar: to fp32, then to that dtype)", values=_choices(q_ref.EpsDtype, {
                   "float32": "fp32(eps)", "bfloat16": "bf16(eps), whatever the input dtype",
                   "float16": "fp16(eps), whatever the input dtype",
                   "input": "eps rounded to the dtype of the tensor quantized: x's (group_quant, act_quant); the "
                   "activations' for the experts op's recipes, weights included (torch "
                   "`x.abs().amax().clamp(min=eps)` on bf16/fp16: vLLM's torch reference of group quantization)"}),
               default="float32"),
    Convention("scale_formula", "how the float scale is computed", values=_choices(sc_ref.ScaleFormula, {
        "divide": "amax / qmax, correctly rounded", "multiply_reciprocal": "amax * fp32(1 / qmax)",
        "reciprocal_of_factor": "fp32(1 / fp32(qmax / amax)): the reciprocal of the factor x is multiplied by "
        "(torchao's fp8 blockwise quantizers)",
        "reciprocal_of_qmax_over_amax": "fp32(1 / f), f = fp32(fp32(1 / amax) * qmax): the reciprocal of the factor "
        "torch code `qmax / amax` computes (a scalar over a tensor is reciprocal() * scalar), e.g. a per-tensor "
        "scale stored as `1 / (448 / amax)`: amax 185 gives 0.41294640302658081, the other forms "
        "0.41294643282890320"}),
        default="divide"),
    Convention("ue8m0_clamp", "clamp the ue8m0 exponent to [1, 254] (DeepGEMM)", kind="bool", default=False),
    Convention("ue8m0_form", "how the ue8m0 rule rounds up to a power of two", values=_choices(sc_ref.Ue8m0Form, {
        "exponent_bits": "exponent + 1 when any mantissa bit is set (hardware cvt.rp, DeepGEMM, torchao's "
        "Triton)", "ceil_log2": "2^ceil(fp32 log2 s) (vLLM's CUDA and Triton quantizers, torchao RCEIL eager): "
        "2^k, not 2^(k+1), for s up to 22 ulps above a power of two 2^k (1 ulp for 4 <= k <= 7, rising to 22 "
        "for 64 <= k <= 127 and k <= -65: reference.scales), and at most 2^-127 for the subnormal s up to "
        "2^-127 + 11 ulps, where exponent_bits gives 2^-126"}), default="exponent_bits"),
    Convention("application", "how elements are scaled before rounding", values=_choices(sc_ref.ScaleApplication, {
        "divide": "x / s, correctly rounded (vLLM's CUDA quantizers, Triton's div_rn)",
        "multiply_reciprocal": "x * fp32(1 / s) (DeepGEMM's current helpers: x * (1 / sf))",
        "qmax_over_amax": "x * (qmax / max(amax, eps)) as PyTorch computes it (float rule only)",
        "qmax_over_amax_rn": "x * fp32(qmax / max(amax, eps)), the factor rounded once (torchao's fp8 blockwise "
        "Triton quantizers, float64 quotient)"}),
        default="divide"),
    Convention("int8_rounding", "int8 rounding of x / s", values=_choices(q_ref.Int8Rounding, {
        "half_even": "vLLM scaled_int8_quant", "half_away": "per_token_quant_int8",
        "truncate": "per_token_group_quant_int8"}), default="half_even"),
    Convention("global_scale", "what NVFP4's per-tensor scale holds", values=_choices(q_ref.GlobalScaleConvention, {
        "quant_side": "gs = 448*6 / amax (vLLM, FlashInfer)", "dequant_side": "g = amax / (448*6)"}),
        default="quant_side"),
    Convention("zero_point", "asymmetric weights with explicit zero points", kind="bool", default=False),
    Convention("nvfp4_scale_form", "how NVFP4 scales x from its block and global scales",
               values=_choices(q_ref.Nvfp4ScaleForm, {
                   "element_scale": "es = s_blk / gs (quant side) or s_blk * g, applied per `application`",
                   "global_reciprocal": "es = s_blk * fp32(1 / gs) (vLLM)",
                   "reciprocal_over_block": "x * fp32(r / s_blk), r = gs or fp32(1 / g) (torchao)"}),
               default="element_scale"),
    Convention("nvfp4_block_floor", "NVFP4 block scales clamped below at 2^-6 before their e4m3 encoding "
               "(torchao)", kind="bool", default=False),
    Convention("e2m1_ties", "tie rule of fp4 (e2m1) element codes", values=_choices(fmt_ref.Ties, {
        "even": "round half to even (PTX cvt.rn, torchao, vLLM)", "toward_zero": "halves round down in magnitude "
        "(DeepGEMM's fp4 cast)"}), default="even"),
    Convention("e2m1_negative_zero", "the code of a negative fp4 (e2m1) element that rounds to zero",
               values=_choices(fmt_ref.NegativeZero, {
                   "kept": "0x8, the negative zero (PTX cvt, torchao, ml_dtypes)",
                   "never": "0x0: the sign only on non-zero codes (quantizers that add the sign after a magnitude "
                   "lookup); the values are equal, the codes compared exactly are not"}), default="kept"),
    Convention("ragged_k", "the last group along K may be shorter", kind="bool", default=False),
)}
_ACT_QUANT_FIELDS = ("eps", "eps_placement", "eps_dtype", "scale_formula", "application", "ue8m0_clamp",
                     "ue8m0_form")
_EXPERT_QUANT_FIELDS = ("scale_rule", "eps", "eps_placement", "eps_dtype", "scale_formula", "ue8m0_clamp",
                        "ue8m0_form",
                        "application", "int8_rounding", "global_scale", "nvfp4_scale_form", "nvfp4_block_floor",
                        "e2m1_ties")

# -- per op --------------------------------------------------------------------------------------------------------

_ACTIVATION = (
    Convention("gate_order", "which part of a gated input is the gate", values=_choices(act_ref.GateOrder, {
        "gate_first": "vLLM, SGLang", "up_first": "TRT-LLM, FlashInfer"}), default="gate_first"),
    Convention("layout", "how gate and up are stored (default: the activation's own: interleaved for swigluoai)",
               values=_choices(act_ref.GateLayout, {"halves": "[gate | up]", "interleaved": "even/odd columns"})),
    Convention("rounding", "where a gated activation rounds to the output dtype", values=_choices(act_ref.Rounding, {
        "round_once": "fp32 throughout, one rounding (Triton kernels)",
        "round_activation_first": "act(gate) rounded before the multiply (vLLM CUDA)",
        "every_step": "every operation rounded to the input dtype, as torch code in that dtype (vLLM's native "
        "swigluoai)"}), default="round_once"),
    Convention("alpha", "swigluoai's alpha", kind="number", default=act_ref.SWIGLUOAI_ALPHA),
    Convention("beta", "swigluoai's beta", kind="number", default=act_ref.SWIGLUOAI_BETA),
    Convention("limit", "swigluoai's / swiglustep's clamp limit", kind="number", default=act_ref.SWIGLUOAI_LIMIT),
    Convention("clamp_limit", "a clamp of gate (max) and up (+-) before the activation (None: none)",
               kind="number"),
)

_ROUTING_GROUPS = (
    Convention("group_scoring", "how a group is scored to choose the topk_group kept ones, on its selection scores "
               "(biased where a correction bias is given; undeclared: top2_sum with a correction bias, max without)",
               values=_choices(rt_ref.GroupScoring, {
                   "max": "the group's largest selection score",
                   "top2_sum": "the sum of the group's two largest selection scores (a group of one expert: its "
                   "one score)"})),
    Convention("unkept_groups", "the selection score of the experts in groups not kept",
               values=_choices(rt_ref.UnkeptGroups, {
                   "excluded": "-inf: never chosen (vLLM, SGLang)",
                   "zero_filled": "0 (routers masking with masked_fill(..., 0.0)): tied with the kept experts of "
                   "selection score 0 (masked, underflowed) and above the negative biased ones, so where the kept "
                   "groups hold fewer than k positive selection scores the rest may come from any group; such an "
                   "expert's weight is still its unbiased score"}),
               default="excluded"),
)

BY_OP: dict[str, tuple[Convention, ...]] = {
    "routing": (
        Convention("nonfinite", "what happens to rows with a NaN or +Inf logit or only -Inf ones (undeclared: only "
                   "their ids' form is judged; -Inf beside finite logits is a masked expert, judged always)",
                   values=_choices(rt_ref.NonFinitePolicy, {
                       "zero": "non-finite scores become 0 (vLLM's CUDA kernel)",
                       "propagate": "IEEE arithmetic: NaN ranks first, NaN weights where a NaN or 0/0 reaches them "
                       "(torch code without guards, e.g. vLLM's torch routers)",
                       "raise": "the oracle refuses such rows (judged for their ids' form only)"})),
        Convention("score_dtype", "the precision scores, selection and weights are computed in", values={
            "float32": "fp32 (the CUDA kernels; torch code that casts the logits to fp32 first)",
            "input": "the logits' dtype (torch code on bf16/fp16 logits, e.g. vLLM's native grouped_topk): every "
            "score, sum and quotient rounded to it, so near-ties within its rounding may select either expert",
            "input_every_step": "as `input`, and the exponent too (exp(logit - logsumexp) in the logits' dtype, "
            "vLLM's CPURouter softmax top-k): weights off by u * (|logit| + 2 |logsumexp|) more"},
            default="float32"),
        Convention("tie_break", "which of exactly tied experts (and groups) are chosen (undeclared: any; the ids "
                   "are judged as a set)", values={
                       "any": "any of them: set semantics (torch.topk, whose order is unspecified)",
                       "lower_index": "the lower expert index, and the lower group index among tied groups (vLLM's "
                       "CUDA top-k, for reproducible selection): a choice that swaps exactly tied scores otherwise "
                       "fails; near ties within the scores' rounding stay free"},
                   default="any"),
        Convention("renormalize_eps", "the renormalization's guard: weights divided by their sum + this (finite, "
                   ">= 0; 0: the plain sum, a zero sum giving zeros under nonfinite=zero and 0/0 = NaN under "
                   "propagate); > 0, e.g. 1e-20: a zero sum gives zeros and a NaN sum NaN under every nonfinite "
                   "rule", kind="number", default=0.0),
    ),
    "align": (
        Convention("tail", "which part of sorted_token_ids and expert_ids the kernel writes (the used part: the first "
                   "num_tokens_post_padded entries and their blocks' expert ids)", values={
                       "written": "the whole buffers: every element must be written, expert_ids past the used "
                       "blocks must be -1 (the oracle; this project's Triton kernel); sorted_token_ids past the "
                       "used part may hold any value (the oracle writes the sentinel)",
                       "unwritten": "only the used part: the tail is neither required written, nor compared, nor "
                       "part of the determinism check (kernels whose GEMMs never read it: SGLang's leaves expert_ids' "
                       "tail unwritten, some vLLM versions fill it with 0)"},
                   default="written"),
        Convention("invalid_blocks", "in expert_map=keep_invalid_blocks cells, how the entries of non-local experts "
                   "are grouped into their -1 blocks (not read in other cells)", values={
                       "per_expert": "each non-local expert's entries padded in blocks of their own, at its place "
                       "in expert order (vLLM moe_align_block_size)",
                       "pooled_first": "all non-local entries pooled, padded once to a multiple of block_size, in "
                       "blocks before every local expert's (SGLang moe_align_block_size, whose non-local ids "
                       "are -1)"},
                   default="per_expert"),
    ),
    "reduce": (),
    "activation": _ACTIVATION,
    "act_quant": (
        *(c for c in _ACTIVATION if c.key != "clamp_limit"),  # the cell's clamp_limit axis decides that one
        Convention("act_rounding", "the activation output before quantization", values={
            "fp32": "kept in fp32 (a fused kernel)", "input_dtype": "rounded to the input dtype first (an "
            "unfused activation, then a quantizer)"}, default="fp32"),
        Convention("quant", "the quantizer's recipe details", kind="recipe", fields=_ACT_QUANT_FIELDS),
    ),
    "group_quant": (
        *(RECIPE_FIELDS[k] for k in ("eps", "eps_placement", "eps_dtype", "scale_formula", "application",
                                     "int8_rounding", "ue8m0_clamp", "ue8m0_form", "global_scale",
                                     "nvfp4_scale_form", "nvfp4_block_floor", "e2m1_ties",
                                     "e2m1_negative_zero")),
        Convention("division", "how the kernel's fp32 divisions round", values={
            "correctly_rounded": "IEEE division (CUDA's `/`, Triton's tl.div_rn, PyTorch)",
            "approximate": "Triton's fp32 `/` on NVIDIA GPUs (div.full.f32, within 2 ulp): codes next to a "
            "rounding boundary may take either neighbour"}, default="correctly_rounded"),
        Convention("log2", "how the kernel's fp32 log2 rounds (the ue8m0 rule in its ceil_log2 form)", values={
            "correctly_rounded": "IEEE-accurate log2 (CUDA log2f, torch)",
            "approximate": "Triton's tl.log2 on NVIDIA GPUs (lg2.approx.f32, within 2^-21): a scale whose log2 lies "
            "that close to an integer may be either power of two (vLLM's Triton group quantizer)"},
            default="correctly_rounded"),
        Convention("scale_ulps", "how many fp32 ulps the kernel's scales may differ from the oracle's (default 0 "
                   "when scale_formula is stated, else 1)", kind="int"),
    ),
    "experts": (
        *_ACTIVATION,
        Convention("intermediate_rounding", "which intermediates are stored in the input dtype",
                   values=_choices(exp_ref.IntermediateRounding, {
                       "none": "fp32 throughout", "activation_output": "the activation output (Triton fused_moe)",
                       "gemm1_and_activation_output": "GEMM1's output and the activation's (unfused GEMMs)"})),
        Convention("bias_placement", "where a GEMM's bias is added", values=_choices(exp_ref.BiasPlacement, {
            "accumulator": "to the fp32 GEMM result (kernel epilogues)",
            "rounded_output": "to the GEMM result rounded to the input dtype, the sum rounded again (torch `x @ w.T "
            "+ b` in bf16: vLLM's torch reference)"}), default="accumulator"),
        Convention("weight_placement", "where the router weight multiplies the expert output",
                   values=_choices(exp_ref.WeightPlacement, {
                       "accumulator": "on GEMM2's fp32 result (Triton fused_moe)",
                       "rounded_expert_output": "on the expert output rounded to the output dtype"})),
        Convention("division", "how the kernel's fp32 divisions in its activation quantizers round (the scale "
                   "amax / qmax and the quotient x / scale of the GEMM1 input)", values={
                       "correctly_rounded": "IEEE division (CUDA's `/`, Triton's tl.div_rn, PyTorch)",
                       "approximate": "Triton's fp32 `/` on NVIDIA GPUs (div.full.f32, within 2 ulp): a GEMM1 input "
                       "code next to a rounding boundary may take either neighbour (SGLang's Triton quantizers)"},
                   default="correctly_rounded"),
        Convention("router_weight_dtype", "the dtype the kernel rounds the router weights (topk_weights) to before "
                   "it multiplies by them", values={
                       "float32": "as given (fp32)",
                       "bfloat16": "rounded to bf16 first (vLLM's make_routing_data for OpenAI's triton_kernels)",
                       "float16": "rounded to fp16 first",
                       "input": "rounded to the case's activation dtype (x's) first, whatever it is: one "
                       "declaration for a kernel serving several dtypes (fp32 x: as given)"},
                   default="float32"),
        Convention("accumulation", "how a token's weighted slots are summed", values=_choices(exp_ref.Accumulation, {
            "fp32": "fp32, one final rounding (SGLang, DeepGEMM, FlashInfer)",
            "sequential_out_dtype": "slot by slot in the output dtype",
            "rounded_slots": "each slot rounded to the output dtype, then an fp32 sum (vLLM moe_sum)"})),
        Convention("matmul_precision", "the GEMMs' arithmetic", values={
            "ieee": "fp32 accumulation of exact products", "tf32": "fp32 inputs rounded to TF32 (torch's "
            "allow_tf32, Triton's default fp32 dot)", "fp8_mma_promoted": "sm90 fp8 MMAs whose partial sums are "
            "promoted to fp32 only every few steps (CUTLASS, DeepGEMM)"}, default="ieee"),
        Convention("weight_dequant_dtype", "a weight-only kernel rounds dequantized weights to this dtype before "
                   "its MMA", values={"bfloat16": "", "float16": ""}),
        Convention("weight_scale_dtype", "a weight-only kernel takes its weight scales in this dtype: the harness's "
                   "fp32 scales are rounded to it (one more rounding on every weight; Marlin)",
                   values={"bfloat16": "", "float16": ""}),
        Convention("padding_rows", "the batched format's rows at or past each expert's count", values={
            "free": "not part of the contract: the kernel may write anything there (grouped GEMMs over whole "
            "batches: torch._grouped_mm)",
            "untouched": "never written, left as the caller had them (masked GEMMs that stop at the count: this "
            "project's Triton batched kernel)"}, default="free"),
        Convention("act_quant", "the activation quantizer's recipe (quantized cells)", kind="recipe",
                   fields=_EXPERT_QUANT_FIELDS),
        Convention("intermediate_quant", "whether the activation output is re-quantized before GEMM2 (w8a8 cells)",
                   values={"requantized": "by the act_quant recipe, as x before GEMM1 (fused_moe kernels)",
                           "none": "GEMM2 multiplies the unquantized activation output by the dequantized W2 "
                                   "(vLLM's NaiveBatchedExperts)"}, default="requantized"),
        Convention("act_quant_scope", "what a per-tensor activation scale spans in the batched format (w8a8 "
                   "cells)", values={"batch": "the whole input, every expert's batch together",
                                     "expert": "each expert's batch on its own (vLLM's batched prepare quantizes "
                                               "expert by expert: one scale per expert)"}, default="batch"),
        Convention("weight_quant", "how the harness quantizes the weights it gives the kernel", kind="recipe",
                   fields=_EXPERT_QUANT_FIELDS),
    ),
}
BY_OP["grouped_routing"] = (*BY_OP["routing"], *_ROUTING_GROUPS)


def for_op(op: str) -> dict[str, Convention]:
    return {c.key: c for c in BY_OP.get(op, ())}


def validate(op: str, conventions: Mapping[str, Any], where: str) -> None:
    """Raise ValueError naming `where`, the key and the valid keys or values, for a convention `op` does not
    have or a value it does not take."""
    if not isinstance(conventions, Mapping):
        raise ValueError(f"{where}: conventions must be a mapping, got {type(conventions).__name__}")
    known = for_op(op)
    for key, value in conventions.items():
        if key not in known:
            valid = ", ".join(known) or "none (this op has no conventions)"
            raise ValueError(f"{where}: unknown convention {key!r} for op {op}; valid: {valid}")
        known[key].check(value, where)
