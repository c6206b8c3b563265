"""The contract of each op as an adapter author reads it: inputs, case parameters and outputs, declared per op.

A `Contract` says, for every tensor the harness hands a kernel or expects back, its shape in the case's shape
letters, its dtype, what it holds and in which cells it is present, which case parameters (`case.params`) the op
uses and what they mean, and which part of each output the kernel must write. `python -m harness conventions`
renders it into docs/CONVENTIONS.md; tests/harness/test_op_contracts.py checks it against the op itself (the
names `make_inputs` and `outputs` produce in each cell, the shapes and dtypes where the contract states them as
plain expressions, the parameters its cases carry and the op reads), so the reference cannot drift from the code.

Every op's contract is declared here, apart from its spec (an op spec module imports nothing of this one): that test
ties the two together.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.ops import experts_quant as xq
from harness.ops import group_quant as gq
from reference import activations as act_ref

if TYPE_CHECKING:
    from harness.core.case import Case
    from harness.ops.base import Axis, OpSpec

#: an output's `written` when the kernel owes every element
ALL = "every element"

#: which cells an entry is present in: axis -> the values it is present for (every listed axis must match)
Cells = Mapping[str, tuple[str, ...]]


@dataclass(frozen=True)
class Tensor:
    """An input the kernel reads or an output it writes.

    shape: the dims in the case's shape letters, e.g. "[M, k]", "[T, 2N]", "[E_local, W1, K/2]" (a plain expression
    per dim is checked against the op's tensors; anything else, e.g. a sentence, is shown as written).
    dtype: a torch dtype name ("float32", checked) or a description ("x's dtype"). when / unless: the cells it is
    present in (every `when` axis has one of its values, no `unless` axis has one of its); both empty: every cell.
    written (outputs): which part the kernel owes; outside it nothing is compared or required to be written.
    any_strides: the tensor may come in any memory layout (an output: the kernel writes through its strides); the
    draws take each class of `harness.core.layouts` for it, but those an adapter's `layouts` limit leaves out.
    """

    name: str
    shape: str
    dtype: str
    meaning: str
    when: Cells = field(default_factory=dict)
    unless: Cells = field(default_factory=dict)
    written: str = ALL
    any_strides: bool = False

    def present(self, cell: Mapping[str, str]) -> bool:
        return _matches(self.when, self.unless, cell)


@dataclass(frozen=True)
class Param:
    """A case parameter (`case.params[name]`) the op uses: what it is and what it means for the kernel."""

    name: str
    kind: str
    meaning: str
    when: Cells = field(default_factory=dict)
    unless: Cells = field(default_factory=dict)

    def present(self, cell: Mapping[str, str]) -> bool:
        return _matches(self.when, self.unless, cell)


@dataclass(frozen=True)
class Contract:
    """inputs, params, outputs as above; symbols: each shape letter and derived size and what it is; sizes: the
    derived sizes of a case (e.g. E_local), for the shape checks; notes: what no single entry says."""

    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    symbols: Mapping[str, str]
    params: tuple[Param, ...] = ()
    notes: tuple[str, ...] = ()
    sizes: Callable[[Case], Mapping[str, int]] | None = None

    def present(self, cell: Mapping[str, str]) -> tuple[list[Tensor], list[Tensor], list[Param]]:
        """The inputs, outputs and params present in `cell`."""
        return ([t for t in self.inputs if t.present(cell)], [t for t in self.outputs if t.present(cell)],
                [p for p in self.params if p.present(cell)])

    def axes_named(self) -> set[str]:
        """The axes the entries' cell conditions name."""
        entries: list[Tensor | Param] = [*self.inputs, *self.outputs, *self.params]
        return {a for e in entries for a in (*e.when, *e.unless)}


def _matches(when: Cells, unless: Cells, cell: Mapping[str, str]) -> bool:
    return (all(cell.get(a) in vs for a, vs in when.items())
            and not any(cell.get(a) in vs for a, vs in unless.items()))


def describe_cells(when: Cells, unless: Cells, axes: tuple[Axis, ...]) -> str:
    """`when`/`unless` in words: "every cell", "expert_map=Y", "quant_type not in (none)"..."""
    values = {a.name: a.values for a in axes}
    parts = []
    for a, vs in when.items():
        rest = [v for v in values.get(a, ()) if v not in vs]
        if len(vs) == 1:
            parts.append(f"{a}={vs[0]}")
        elif rest and len(rest) < len(vs):  # the shorter list: a new axis value lands on the side it is meant for
            parts.append(f"{a} not in ({', '.join(rest)})")
        else:
            parts.append(f"{a} in ({', '.join(vs)})")
    for a, vs in unless.items():
        rest = [v for v in values.get(a, ()) if v not in vs]
        if len(vs) == 1:
            parts.append(f"{a}!={vs[0]}")
        elif rest and len(rest) < len(vs):
            parts.append(f"{a} in ({', '.join(rest)})")
        else:
            parts.append(f"{a} not in ({', '.join(vs)})")
    return ", ".join(parts) or "every cell"


def any_strides(op: str, cell: Mapping[str, str]) -> list[str]:
    """The tensors (inputs and outputs) of `op` present in `cell` whose contract says they may have any strides."""
    c = CONTRACTS.get(op)
    if c is None:
        return []
    return list(dict.fromkeys(t.name for t in (*c.inputs, *c.outputs) if t.any_strides and t.present(cell)))


def contract_of(spec: OpSpec) -> Contract | None:
    """The contract of an op (None: none declared yet)."""
    return CONTRACTS.get(spec.name)


# ------------------------------------------------------------------------- how the harness built the inputs
#: case parameters that say how the harness built a case's inputs (its value classes: harness.ops.base.ValueClass),
#: never something the kernel reads
_NONFINITE_VALUES = Param("values", "str", "how the harness built the non-finite rows: `every_kind` cycles through a "
                          "masked, a NaN, a +inf and an all -inf row, `random` draws them; not for the kernel",
                          when={"nonfinite_rows": ("Y",)})
_COUNTS = Param("counts", "list", "per-expert counts the harness built the routing with (at and around multiples of "
                "a block; filler experts after them); not for the kernel")
_MAP = Param("map", "str", "how the harness built the expert map: `contiguous` (a range of local experts, its first "
             "and last routed) or `random`; not for the kernel")


# -------------------------------------------------------------------------------------------------- routing

_ROUTING = Contract(
    inputs=(
        Tensor("router_logits", "[M, E]", "the cell's logits_dtype",
               "the router's logits, one row per token; rows of `nonfinite_rows=Y` cells hold NaN/Inf (padding "
               "rows of CUDA graphs)", any_strides=True),
        Tensor("correction_bias", "[E]", "float32",
               "DeepSeek-V3's e_score_correction_bias: added to the scores for the selection only; the weights "
               "are the unbiased scores", when={"correction_bias": ("Y",)}),
    ),
    outputs=(
        Tensor("topk_weights", "[M, k]", "float32",
               "the weight of each chosen expert, in the order of topk_ids: its unbiased score (softmax over all "
               "E, or sigmoid), renormalized over the k when `renormalize=Y`; llama4_top1: sigmoid of the chosen "
               "logit. A row with some -inf logits (masked experts) is judged like a finite one; rows with NaN, +inf "
               "or only -inf are judged by the `nonfinite` convention's rule, else for well-formed ids only (they "
               "are written all the same)"),
        Tensor("topk_ids", "[M, k]", "int32",
               "the k chosen experts of each token (global ids in [0, E), distinct); judged as a set in any order"),
    ),
    params=(_NONFINITE_VALUES,),
    symbols={"M": "tokens", "E": "experts", "k": "experts chosen per token"},
)

_GROUPED = dataclasses.replace(
    _ROUTING,
    outputs=(
        Tensor("topk_weights", "[M, k]", "float32",
               "the weight of each chosen expert, in the order of topk_ids: its unbiased score, renormalized over "
               "the k when `renormalize=Y`, then times `routed_scaling_factor` when `scaling_placement=weights`"),
        _ROUTING.outputs[1]),
    params=(
        Param("num_groups", "int", "G: the E experts form G contiguous groups of E/G (G divides E)"),
        Param("topk_group", "int", "how many groups each token keeps (the best by group score); the k experts are "
              "chosen within them (k <= topk_group * E/G)"),
        Param("routed_scaling_factor", "float",
              "the model's scaling factor: with `scaling_placement=weights` the kernel multiplies the weights by "
              "it; with `scaling_placement=reduce` it does not (the reduce op applies it)"),
        _NONFINITE_VALUES,
    ),
)

# ---------------------------------------------------------------------------------------------------- align

#: what align's outputs owe past their used part (the align op's conventions may say more)
ALIGN_TAIL = ("past the used part: by the `tail` convention: `written` (the default) like the oracle, which fills "
              "sorted_token_ids with the sentinel M*k and expert_ids with -1; `unwritten`: not part of the contract "
              "(neither required written, compared, nor checked for determinism)")


def _align_sizes(case: Case) -> dict[str, int]:
    bs = int(case.features["block_size"])
    cap = case.shape("M") * case.shape("k") + case.shape("E") * (bs - 1)
    return {"block_size": bs, "cap": cap, "blocks": -(-cap // bs)}


_ALIGN = Contract(
    inputs=(
        Tensor("topk_ids", "[M, k]", "the cell's ids_dtype", "global expert ids in [0, E) chosen by the router"),
        Tensor("expert_map", "[E]", "int32", "global id -> local id on this rank, or -1 where the expert lives "
               "elsewhere (expert parallelism); the local ids are 0..E_local-1, each once",
               unless={"expert_map": ("none",)}),
    ),
    params=(Param("local_experts", "int", "how many of the E experts are local (the rest map to -1); 0: none",
                  unless={"expert_map": ("none",)}),
            _COUNTS, dataclasses.replace(_MAP, unless={"expert_map": ("none",)})),
    outputs=(
        Tensor("sorted_token_ids", "[cap]", "int32",
               "for each kept expert in ascending id, its flattened (token, slot) indices t*k + j (in any order), "
               "padded with the sentinel M*k to a multiple of block_size",
               written=f"the used part, the first num_tokens_post_padded[0] entries: always; {ALIGN_TAIL}"),
        Tensor("expert_ids", "[blocks]", "int32",
               "the expert of each block of the used part (local id under a map, -1 for a kept non-local one)",
               written=f"the blocks of the used part: always; {ALIGN_TAIL}"),
        Tensor("num_tokens_post_padded", "[1]", "int32",
               "the length of the used part: the sum over kept experts of their count rounded up to block_size"),
    ),
    symbols={"M": "tokens", "E": "experts", "k": "slots per token", "block_size": "the cell's block_size",
             "cap": "M*k + E*(block_size - 1), the worst-case capacity", "blocks": "ceil(cap / block_size)"},
    sizes=_align_sizes,
    notes=("Expert-map cells: where the entries of non-local experts go (blocks of their own with expert id -1, or "
           "none) is the cell's `expert_map` value; under `keep_invalid_blocks`, the `invalid_blocks` convention "
           "says whether each non-local expert has its own blocks (`per_expert`) or all of them are pooled into "
           "leading blocks (`pooled_first`) (docs/SEMANTICS.md §3).",),
)



# ----------------------------------------------------------------------------------------------- activation

_GATED = tuple(a.value for a in act_ref.Activation if act_ref.is_gated(a))
_LIMITED = tuple(a for a in _GATED if a.startswith(("swigluoai", "swiglustep")))

_ACTIVATION = Contract(
    inputs=(
        Tensor("x", "[T, 2*N]", "the cell's dtype",
               "gate and up parts of each row, stored as the `gate_order` and `layout` conventions say (default: "
               "[gate | up] halves; interleaved even/odd columns for swigluoai)", when={"activation": _GATED}),
        Tensor("x", "[T, N]", "the cell's dtype", "the rows the activation is applied to elementwise",
               unless={"activation": _GATED}),
    ),
    outputs=(Tensor("out", "[T, N]", "x's dtype", "act(gate) * up (gated), act(x) (no-mul), rounded once to x's "
                    "dtype unless the `rounding` convention says otherwise"),),
    symbols={"T": "tokens (rows)", "N": "output columns"},
    notes=(
        "Clamp limits are conventions, not case parameters: `limit` (swigluoai's / swiglustep's own clamp, "
        f"default {act_ref.SWIGLUOAI_LIMIT}) and `clamp_limit` (a clamp of gate (max) and up (+-) before the "
        f"activation). Activations that take `limit`: {', '.join(_LIMITED)}.",
        "A kernel whose limit is a per-call argument states it per case with `Adapter.conventions_for(case, "
        "device)` (e.g. `{\"limit\": limit_of(case)}`) and passes the same value to the kernel in `run`; derive it "
        "from what a case keeps when its rows are cut for the batch-invariance run (its seed, N, dtype), not from "
        "T. The value is then part of the adapter's conventions for that case, so replays follow it.",
    ),
)

# --------------------------------------------------------------------------------------------------- reduce

_REDUCE = Contract(
    inputs=(
        Tensor("expert_out", "[M, k, K]", "the cell's dtype",
               "y[t, j]: the output of expert topk_ids[t, j] for token t, one row per (token, slot), already "
               "unpermuted; with `weights_applied=Y` it already carries the router weight"),
        Tensor("topk_weights", "[M, k]", "float32",
               "the router weight of each slot; not applied again when `weights_applied=Y` or "
               "`apply_weight_on_input=Y` (then k = 1)"),
        Tensor("topk_ids", "[M, k]", "int32", "the global expert id of each slot; only read to apply the expert "
               "map"),
        Tensor("expert_map", "[E]", "int32", "global id -> local id or -1: slots whose expert is not local "
               "contribute nothing, whatever their expert_out row holds (even NaN)", when={"expert_map": ("Y",)}),
    ),
    params=(
        Param("routed_scaling_factor", "float",
              "multiplies each token's fp32 sum (after the weights): out[t] = factor * sum_j w[t, j] * y[t, j]. "
              "The kernel applies it (SGLang's placement; a router that folds it into its weights, "
              "`scaling_placement=weights`, pairs with factor 1). Under `output_dtype_sequential` it multiplies "
              "the rounded sum, which is rounded again"),
        Param("local_experts", "int", "how many of the E experts are local; 0: none (every token's sum is 0)",
              when={"expert_map": ("Y",)}),
        Param("values", "str", "how the harness built expert_out: `order` puts a big term, its negation and a term "
              "2^26 smaller in each token's slots (summation order changes the rounded result), `random` does "
              "not; not for the kernel"),
        _COUNTS, dataclasses.replace(_MAP, when={"expert_map": ("Y",)}),
    ),
    outputs=(Tensor("out", "[M, K]", "expert_out's dtype",
                    "routed_scaling_factor * sum over local slots j of w[t, j] * y[t, j] (w left out where "
                    "already applied), summed as the `accumulation` axis says", any_strides=True),),
    symbols={"M": "tokens", "E": "experts", "k": "slots per token", "K": "hidden size"},
)

# ------------------------------------------------------------------------------------------------- group_quant

_GROUP_SCALES = ("row_major", "column_major", "column_major_tma")

_GROUP_QUANT = Contract(
    inputs=(
        Tensor("x", "[M, K]", "the cell's input_dtype",
               "the activations to quantize, finite", any_strides=True),
        Tensor("global_scale", "[]", "float32", "NVFP4's given global scale g = fp32(amax(x) / (448 * 6)) (dequant "
               "side; 1.0 for an all-zero x)", when={"quant_dtype": ("nvfp4",)}),
    ),
    params=(
        Param("pattern", "str", "how the harness built x (`random`; `special`: rounding ties and scale "
              "boundaries; `edges`: zero rows and groups, amax outliers; `zeros`); not for the kernel"),
        Param("exponent", "int", "x's magnitude, 2^exponent (how the harness built x); not for the kernel"),
    ),
    outputs=(
        Tensor("codes", "[M, K]", "float8_e4m3fn (fp8_e4m3fn, mxfp8) or int8", "the quantized values",
               unless={"quant_dtype": gq.FP4_DTYPES}),
        Tensor("codes", "[M, K/2]", "uint8", "e2m1 codes, two per byte (element 2i in the low nibble)",
               when={"quant_dtype": gq.FP4_DTYPES}),
        Tensor("scales", "[M, G]", "float32 (MX: uint8 e8m0 codes; NVFP4: uint8 e4m3 codes)",
               "one scale per group; row_major contiguous, column_major strides (1, M), column_major_tma strides "
               "(1, M rounded up to 4): the rows past M are padding, not part of the contract",
               when={"unit": ("group",), "scale_layout": _GROUP_SCALES}),
        Tensor("scales", "[M, ceil(G/4)]", "int32", "DeepGEMM's packed e8m0: byte j of word p is the code of "
               "group 4p + j, strides (1, M rounded up to 4); bytes of groups past G must be 0",
               when={"unit": ("group",), "scale_layout": ("packed_ue8m0",)}),
        Tensor("scales", "[128*ceil(M/128), 4*ceil(G/4)]", "uint8", "the block scale codes swizzled for "
               "cuBLASLt/CUTLASS (reference.scales.swizzle_128x4), padding 0",
               when={"unit": ("group",), "scale_layout": ("swizzle_128x4",)}),
        Tensor("scales", "[M, 1]", "float32", "one scale per token", when={"unit": ("token",)}),
        Tensor("scales", "[1]", "float32", "one scale for the whole tensor (M = 0: the scale of amax 0)",
               when={"unit": ("tensor",)}),
    ),
    symbols={"M": "tokens (rows)", "K": "columns", "G": "groups per row, K / group_size"},
    sizes=lambda case: {"G": case.shape("K") // int(case.features["group_size"])}
    if case.features["unit"] == "group" else {},
)

# --------------------------------------------------------------------------------------------------- act_quant

_ACT_QUANT = Contract(
    inputs=(Tensor("x", "[T, 2*N]", "the cell's dtype", "gate and up parts of each row, as the `gate_order` and "
                   "`layout` conventions say"),),
    params=(Param("clamp_limit", "float", "L: gate' = min(gate, L), up' = clamp(up, -L, L) in fp32, before the "
                  "activation and its own clamps", when={"clamp_limit": ("Y",)}),
            Param("values", "str", "how the harness built x: `edges` puts zero rows, zero groups and amax outliers "
                  "in it, `random` does not; not for the kernel")),
    outputs=(
        Tensor("codes", "[T, N]", "float8_e4m3fn", "the activation's values quantized per group of group_size "
               "columns"),
        Tensor("scales", "[T, G]", "float32", "one scale per group: row_major contiguous, column_major strides "
               "(1, T), column_major_tma strides (1, T rounded up to 4)",
               unless={"scale_layout": ("packed_ue8m0",)}),
        Tensor("scales", "[T, ceil(G/4)]", "int32", "packed e8m0: byte j of word p is the exponent of group "
               "4p + j, strides (1, T rounded up to 4), missing groups 0", when={"scale_layout": ("packed_ue8m0",)}),
    ),
    symbols={"T": "tokens (rows)", "N": "output columns", "G": "groups per row, N / group_size"},
    sizes=lambda case: {"G": case.shape("N") // int(case.features["group_size"])},
)

# ----------------------------------------------------------------------------------------------------- experts

_QUANTIZED = tuple(q for q in xq.QUANT_TYPES if q != "none")
_PACKED = ("w4a16", "w4a16_zp", "mxfp4_a16", "mxfp4_a8", "nvfp4")  # two 4-bit codes a byte along K
_W8A8 = ("fp8_w8a8", "int8_w8a8")
_STANDARD = {"format": ("standard",)}


def _weights(name: str, rows: str, red: str, what: str) -> tuple[Tensor, ...]:
    """A weight's codes, scales and extras in every quantized scheme: rows x red, red the reduction dim."""
    e = f"E_local, {rows}"
    scale = f"{name}_scale"
    return (
        Tensor(name, f"[{e}, {red}]", "x's dtype", what, when={"quant_type": ("none",)}),
        Tensor(name, f"[{e}, {red}]", "fp8_w8a8, mxfp8: float8_e4m3fn; int8_w8a8: int8; w8a16*: uint8",
               "the same weights quantized per expert (codes)", unless={"quant_type": ("none", *_PACKED)}),
        Tensor(name, f"[{e}, {red}/2]", "uint8", f"the same weights as 4-bit codes, two per byte along {red} "
               "(element 2i in the low nibble)", when={"quant_type": _PACKED}),
        Tensor(scale, "[E_local]", "float32", "one scale per expert", when={"quant_format": ("T",)}),
        Tensor(scale, f"[{e}, 1]", "float32", "one scale per output channel", when={"quant_format": ("A",)}),
        Tensor(scale, f"[E_local, ceil({rows}/128), ceil({red}/128)]", "float32", "one scale per 128 x 128 block",
               when={"quant_format": ("G128",), "quant_type": _W8A8}),
        Tensor(scale, f"[{e}, {red}/128]", "float32", "one scale per group of 128 along the reduction dim",
               when={"quant_format": ("G128",)}, unless={"quant_type": _W8A8}),
        Tensor(scale, f"[{e}, {red}/32]", "uint8", "e8m0 scale codes, one per 32 along the reduction dim",
               when={"quant_format": ("G32",)}),
        Tensor(scale, f"[{e}, {red}/16]", "uint8", "e4m3 block scale codes, one per 16 along the reduction dim",
               when={"quant_format": ("G16",)}),
        Tensor(f"{name}_zp", f"[{e}, {red}/128]", "uint8", "zero points (w8a16_zp)",
               when={"quant_type": ("w8a16_zp",)}),
        Tensor(f"{name}_zp", f"[E_local, {rows}/2, {red}/128]", "uint8", "zero points, two per byte along the "
               "rows (w4a16_zp)", when={"quant_type": ("w4a16_zp",)}),
        Tensor(f"{name}_global_scale", "[E_local]", "float32", "NVFP4's per-expert global scale (quant side)",
               when={"quant_type": ("nvfp4",)}),
    )


_EXPERTS = Contract(
    inputs=(
        Tensor("x", "[M, K]", "the cell's dtype", "the tokens' hidden states", when=_STANDARD),
        Tensor("x", "[E_local, max_tokens, K]", "the cell's dtype",
               "each local expert's tokens, already gathered (the batched layout, docs/SEMANTICS.md §3)",
               when={"format": ("batched",)}),
        Tensor("expert_num_tokens", "[E_local]", "int32", "how many rows of x[e] are real tokens of expert e",
               when={"format": ("batched",)}),
        Tensor("topk_weights", "[M, k]", "float32",
               "the router weight of each slot: multiplies the slot's expert output (GEMM2's result) before the "
               "sum, or x before GEMM1 when `apply_weight_on_input=Y` (k = 1). It already carries any routed "
               "scaling factor: the experts op applies none of its own", when=_STANDARD),
        Tensor("topk_ids", "[M, k]", "int32", "the global expert id of each (token, slot)", when=_STANDARD),
        Tensor("expert_map", "[E]", "int32", "global id -> local id (the index into the weights) or -1: slots of "
               "non-local experts contribute nothing", when={**_STANDARD, "expert_map": ("Y",)}),
        *_weights("w13", "W1", "K", "GEMM1's weights per local expert, [out, in] (h = x @ w13[e].T): the W1 "
                  "rows are gate and up stacked, their order and layout per the `gate_order` / `layout` "
                  "conventions"),
        *_weights("w2", "K", "N", "GEMM2's weights per local expert, [out, in] (y = a @ w2[e].T)"),
        Tensor("w13_bias", "[E_local, W1]", "x's dtype", "GEMM1's bias, added as `bias_placement` says",
               when={"bias": ("Y",)}),
        Tensor("w2_bias", "[E_local, K]", "x's dtype", "GEMM2's bias", when={"bias": ("Y",)}),
        Tensor("a13_global_scale", "[]", "float32", "NVFP4's static global scale of x (calibrated on the case's "
               "inputs)", when={"quant_type": ("nvfp4",)}),
        Tensor("a2_global_scale", "[]", "float32", "NVFP4's static global scale of the intermediate",
               when={"quant_type": ("nvfp4",)}),
    ),
    params=(
        Param("local_experts", "int", "E_local, how many of the E experts are local (the weights hold those); 0: "
              "none, the output is all zeros", when={**_STANDARD, "expert_map": ("Y",)}),
        Param("weight_quant", "recipe", "the adapter's `weight_quant` convention, copied into the case because "
              "the weights are inputs quantized ahead of time", unless={"quant_type": ("none",)}),
        Param("act_quant", "recipe", "the adapter's `act_quant` convention, copied with it",
              unless={"quant_type": ("none",)}),
        Param("values", "str", "how the harness built x: `edges` puts zero rows, zero groups and amax outliers in "
              "it, `random` does not; not for the kernel"),
        dataclasses.replace(_COUNTS, meaning="per-expert counts the harness built the routing (standard: slots of "
                            "each global expert, filler experts after them) or expert_num_tokens (batched) with, at "
                            "and around multiples of the block; not for the kernel"),
        dataclasses.replace(_MAP, when={**_STANDARD, "expert_map": ("Y",)}),
    ),
    outputs=(
        Tensor("out", "[M, K]", "x's dtype", "sum over local slots j of w[t, j] * y[t, j], y = W2[e] . "
               "act(W13[e] . x[t] + b13[e]) + b2[e], e the slot's local expert", when=_STANDARD),
        Tensor("out", "[E_local, max_tokens, K]", "x's dtype", "out[e, r] = W2[e] . act(W13[e] . x[e, r]), no "
               "router weight and no reduce", when={"format": ("batched",)},
               written="rows r < expert_num_tokens[e] of each expert; the rows past them by the `padding_rows` "
               "convention: `free` (the default) not part of the contract, `untouched` never written"),
    ),
    symbols={"M": "tokens", "E": "experts (global)", "k": "slots per token", "K": "hidden size",
             "N": "intermediate size", "E_local": "local experts: params local_experts, else E",
             "W1": "2N for gated activations, N for *_no_mul", "max_tokens": "rows per expert (batched format)"},
    sizes=lambda case: {"E_local": case.params.get("local_experts", case.shape("E")),
                        "W1": 2 * case.shape("N") if act_ref.is_gated(xq.ACTIVATIONS[case.features["activation"]])
                        else case.shape("N")},
    notes=("The weights are indexed by local expert id: without an expert map local = global.",
           "Quantized cells take x unquantized (bf16/fp16): the kernel quantizes it (and the intermediate) itself, "
           "as the scheme and the `act_quant` convention say (docs/SEMANTICS.md §6).",
           "Scale shapes: `rows` is W1 for w13 and K for w2; the reduction dim is K for w13 and N for w2."),
)

CONTRACTS: dict[str, Contract] = {
    "routing": _ROUTING,
    "grouped_routing": _GROUPED,
    "align": _ALIGN,
    "activation": _ACTIVATION,
    "reduce": _REDUCE,
    "group_quant": _GROUP_QUANT,
    "act_quant": _ACT_QUANT,
    "experts": _EXPERTS,
}


def dims(shape: str, sizes: Mapping[str, int]) -> tuple[int, ...] | None:
    """The dims of `shape` ("[M, 2*N]") for these sizes; None when a dim is not a plain expression of them."""
    if not (shape.startswith("[") and shape.endswith("]")):
        return None
    inner = shape[1:-1].strip()
    found = []
    for dim in inner.split(",") if inner else []:
        try:
            # the contract's own text (code, not input), with nothing but the sizes and ceil in scope
            v = eval(dim, {"__builtins__": {}, "ceil": math.ceil}, dict(sizes))
        except Exception:
            return None
        if not isinstance(v, (int, float)) or v != int(v):
            return None
        found.append(int(v))
    return tuple(found)


def sizes_of(contract: Contract, case: Case) -> dict[str, Any]:
    """The case's shape letters plus the contract's derived sizes."""
    return {**case.shapes, **(contract.sizes(case) if contract.sizes else {})}
