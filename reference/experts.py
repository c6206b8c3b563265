"""End-to-end MoE experts, unquantized and quantized (docs/SEMANTICS.md §2, §5 and §6).

For each token t and slot j with expert e = topk_ids[t, j] (a global id):

    h[t, j] = W13[e] . x[t] + b13[e]              GEMM1, [2N] (or [N] for *_no_mul)
    a[t, j] = act(h[t, j])                          section 4, [N], rounded to x.dtype as real kernels do
    y[t, j] = W2[e] . a[t, j] + b2[e]               GEMM2, [K]
    out[t]  = sum_j w[t, j] * y[t, j]               section 5

Weights are indexed by *local* expert id: without an expert map local = global; with `expert_map [E_global]`
(global -> local id, or -1) slots whose expert is not local contribute nothing (the partial sum of one rank).

Conventions, each an explicit argument with its default:
- activation and its conventions (`reference.activations`): gate_order, layout, alpha, beta, limit,
  clamp_limit, activation_rounding.
- `intermediate_rounding` (`IntermediateRounding`): ACTIVATION_OUTPUT (default) rounds a to x.dtype before
  GEMM2; GEMM1_AND_ACTIVATION_OUTPUT also rounds h to x.dtype before the activation (vLLM's Triton path, which
  stores h in the activation dtype); NONE keeps everything in compute_dtype.
- `weight_placement` (`WeightPlacement`): ACCUMULATOR (default) multiplies the unrounded GEMM2 result by the
  weight; ROUNDED_EXPERT_OUTPUT multiplies y rounded to the output dtype.
- `accumulation` (`Accumulation`): FP32 (default) sums the weighted slots in compute_dtype and rounds once;
  SEQUENTIAL_OUT_DTYPE rounds every weighted slot and every partial sum to the output dtype (vLLM moe_sum);
  ROUNDED_SLOTS rounds every weighted slot to the output dtype and sums them in compute_dtype (a GEMM2 that
  stores its weighted output in the activation dtype, then an fp32 sum).
- `bias_placement` (`BiasPlacement`): ACCUMULATOR (default) adds each GEMM's bias to its unrounded result;
  ROUNDED_OUTPUT rounds the GEMM result to x.dtype, adds the bias and rounds the sum to x.dtype (only where a bias
  is given).
- `apply_router_weight_on_input`: only for k = 1; the weight multiplies x (in compute_dtype, unrounded) before
  GEMM1 and the reduce does not apply it again.
- `compute_dtype`: float32 (default) or float64. All matmuls run with fp32 matmul precision "highest" (true
  IEEE fp32, no TF32), set by this module around each call and restored afterwards: the result does not
  depend on `torch.backends.cuda.matmul.allow_tf32` or `torch.set_float32_matmul_precision` set by the caller.

Quantized schemes (`quant=ExpertsQuant(...)`, with w13 = w2 = None): the weights are the per-expert
`QuantizedTensor`s, dequantized to fp32; x is quantized dynamically by `quant.act` (the adapter's convention:
per-tensor over all tokens, per-token, per-token-group, MX or NVFP4 blocks) and dequantized; the activation output,
after its rounding to x.dtype, is re-quantized by `quant.intermediate` over the local slots (per-tensor: one scale
for every local slot) when the scheme does. With `apply_router_weight_on_input` the weight multiplies the
dequantized x (a kernel applies it to GEMM1's accumulator: equal in exact arithmetic). The products are then exact
in compute_dtype: what an ideal kernel with the same quantized operands computes. An `eps_dtype` of `input` in
either activation recipe means x's dtype (`ExpertsQuant.for_input`).

Vectorized per expert: one host synchronization per call (the per-expert counts), then a loop over local
experts with gathers and two matmuls each; no loop over tokens.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import torch

from reference._checks import FLOAT_DTYPES, INT_INDEX_DTYPES, check_choice, check_int, check_tensor
from reference.activations import (
    Activation,
    GateLayout,
    GateOrder,
    Rounding,
    activation_output_width,
    apply_activation,
    is_gated,
)
from reference.quant import QuantizedTensor, QuantRecipe, dequantize, quantize, resolve_eps

__all__ = [
    "Accumulation",
    "BiasPlacement",
    "ExpertIntermediates",
    "ExpertsQuant",
    "IntermediateRounding",
    "WeightPlacement",
    "batched_experts",
    "expert_intermediates",
    "fused_experts",
]

COMPUTE_DTYPES = (torch.float32, torch.float64)


class WeightPlacement(str, enum.Enum):
    """Where the router weight multiplies the expert output."""

    ACCUMULATOR = "accumulator"  # on the GEMM2 result before any rounding (Triton fused_moe)
    ROUNDED_EXPERT_OUTPUT = "rounded_expert_output"  # on the expert output rounded to the output dtype


class BiasPlacement(str, enum.Enum):
    """Where a GEMM's bias is added."""

    ACCUMULATOR = "accumulator"  # to the unrounded GEMM result (a kernel's epilogue)
    #: to the GEMM result rounded to x.dtype, the sum rounded to x.dtype again (torch `x @ w.T + b` in bf16/fp16:
    #: vLLM's torch reference)
    ROUNDED_OUTPUT = "rounded_output"


class Accumulation(str, enum.Enum):
    """How the weighted slots of a token are summed."""

    FP32 = "fp32"  # in compute_dtype, one final rounding (SGLang, DeepGEMM, FlashInfer)
    SEQUENTIAL_OUT_DTYPE = "sequential_out_dtype"  # slot by slot, rounding each add to the output dtype
    #: each weighted slot rounded to the output dtype (a kernel storing its GEMM2 output in that dtype), then
    #: summed in compute_dtype and rounded once
    ROUNDED_SLOTS = "rounded_slots"


class IntermediateRounding(str, enum.Enum):
    """Which intermediates are rounded to the input dtype, as a kernel storing them in that dtype does."""

    NONE = "none"
    ACTIVATION_OUTPUT = "activation_output"
    GEMM1_AND_ACTIVATION_OUTPUT = "gemm1_and_activation_output"


@dataclass(frozen=True)
class ExpertIntermediates:
    """Per-(token, slot) intermediates in compute_dtype; rows of non-local slots are zero.

    h: `[M, k, W1]` GEMM1 output plus bias (W1 = 2N, or N for *_no_mul), after the GEMM1 rounding if any.
    a: `[M, k, N]` activation output, after the intermediate rounding if any.
    y: `[M, k, K]` GEMM2 output plus bias, before the router weight.
    local: `[M, k]` bool, True where the slot's expert is local (has weights here).
    """

    h: torch.Tensor
    a: torch.Tensor
    y: torch.Tensor
    local: torch.Tensor


@dataclass(frozen=True)
class ExpertsQuant:
    """A quantized experts scheme (docs/SEMANTICS.md §6): weights quantized ahead of time, activations dynamically.

    w13, w2: one `QuantizedTensor` per local expert, logical shapes [W1, K] and [K, N] (per-expert scales: a
    per-tensor weight scale is one scale per expert). act: the recipe that quantizes x before GEMM1, with the
    adapter's convention (None: activations stay unquantized, w8a16/w4a16/mxfp4-a16). intermediate: the recipe
    that re-quantizes the activation output (after its rounding to x.dtype) before GEMM2 (None: not
    re-quantized). act_global_scale / intermediate_global_scale: NVFP4's static per-tensor global scales.
    Products are then computed in compute_dtype from the dequantized operands: the oracle of what an exact kernel
    with these quantized operands computes.
    """

    w13: tuple[QuantizedTensor, ...]
    w2: tuple[QuantizedTensor, ...]
    act: QuantRecipe | None = None
    intermediate: QuantRecipe | None = None
    act_global_scale: torch.Tensor | None = None
    intermediate_global_scale: torch.Tensor | None = None
    #: logical per-expert shapes ([W1, K], [K, N]); needed only when there are no local experts
    expert_shapes: tuple[tuple[int, int], tuple[int, int]] | None = None
    #: dequantized weights per device: one oracle call dequantizes once, not in every function it goes through
    _dequantized: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("w13", "w2"):
            v = getattr(self, name)
            if not isinstance(v, (tuple, list)) or not all(isinstance(q, QuantizedTensor) for q in v):
                raise ValueError(f"{name} must be a sequence of QuantizedTensor (one per local expert)")
            object.__setattr__(self, name, tuple(v))
        if not self.w13 and self.expert_shapes is None:
            raise ValueError("expert_shapes must be given when there are no local experts (w13 is empty)")
        if len(self.w13) != len(self.w2):
            raise ValueError(f"w13 and w2 must hold one QuantizedTensor per local expert each, got {len(self.w13)} "
                             f"and {len(self.w2)}")
        for name in ("act", "intermediate"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, QuantRecipe):
                raise ValueError(f"{name} must be a QuantRecipe or None, got {type(v).__name__}")

    def dequantized_weights(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """float64 [E, W1, K] and [E, K, N] on `device`: the exact values code * scale (computed once per device;
        treat them as read-only)."""
        key = str(torch.device(device))
        if key not in self._dequantized:
            if not self.w13:
                (w1, k), (k2, n) = self.expert_shapes  # type: ignore[misc]
                found = (torch.zeros(0, w1, k, dtype=torch.float64, device=device),
                         torch.zeros(0, k2, n, dtype=torch.float64, device=device))
            else:
                found = (torch.stack([dequantize(q, torch.float64) for q in self.w13]).to(device),
                         torch.stack([dequantize(q, torch.float64) for q in self.w2]).to(device))
            self._dequantized[key] = found
        return self._dequantized[key]

    def for_input(self, dtype: torch.dtype) -> ExpertsQuant:
        """This scheme for activations of `dtype` (x's): an `eps_dtype` of `input` in act and intermediate resolved
        to it (reference.quant.resolve_eps). The intermediate is quantized from float rows, so its dtype is known
        only here. Shares the dequantized weights; self when nothing changes."""
        act, inter = (None if r is None else resolve_eps(r, dtype) for r in (self.act, self.intermediate))
        if act == self.act and inter == self.intermediate:
            return self
        found = replace(self, act=act, intermediate=inter)
        object.__setattr__(found, "_dequantized", self._dequantized)
        return found

    def quantize_input(self, rows: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """x rows [R, K] quantized and dequantized (exactly, float64) by `act`; rows outside `valid` are zeroed
        first. Without a recipe the rows are returned unchanged (in float32 if they were lower precision)."""
        return _fake_quant(rows, valid, self.act, self.act_global_scale)

    def quantize_intermediate(self, rows: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Activation rows [R, N] re-quantized by `intermediate` (as `quantize_input`)."""
        return _fake_quant(rows, valid, self.intermediate, self.intermediate_global_scale)


def _fake_quant(rows: torch.Tensor, valid: torch.Tensor | None, recipe: QuantRecipe | None,
                global_scale: torch.Tensor | None) -> torch.Tensor:
    r = rows if rows.dtype == torch.float64 else rows.to(torch.float32)
    if valid is not None:
        r = torch.where(valid[:, None], r, torch.zeros_like(r))
    if recipe is None or r.shape[0] == 0:
        return r
    # Quantization reads fp32 (rows rounded to x.dtype are exact in it); the dequantized products are exact.
    # An eps in the `input` dtype: that of rows of x (float rows: see ExpertsQuant.for_input).
    recipe = resolve_eps(recipe, torch.float32 if rows.dtype == torch.float64 else rows.dtype)
    return dequantize(quantize(r.to(torch.float32), recipe, global_scale=global_scale), torch.float64)


@contextlib.contextmanager
def _ieee_fp32_matmul() -> Iterator[None]:
    """Run fp32 matmuls in true IEEE fp32 (no TF32), restoring the caller's setting afterwards."""
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved)


@dataclass(frozen=True)
class _ActConv:
    activation: Activation
    gate_order: GateOrder
    layout: GateLayout | None
    alpha: float | None
    beta: float | None
    limit: float | None
    clamp_limit: float | None
    rounding: Rounding


def _check_common(
    x_dtype: torch.dtype,
    k_dim: int,
    w13: object,
    w2: object,
    activation: Activation | str,
    w13_bias: object,
    w2_bias: object,
    intermediate_rounding: object,
    activation_rounding: object,
    compute_dtype: object,
    out_dtype: object,
    weight_dtype: torch.dtype | None = None,
) -> tuple[int, int, int]:
    """Validate the weights and shared options; returns (E_local, W1, N). Weights are in x's dtype (or
    `weight_dtype`: float64 for the exactly dequantized weights of a quantized scheme)."""
    wd = weight_dtype or x_dtype
    w13 = check_tensor("w13", w13, ndim=3, dtypes=(wd,))
    e_local, w1 = w13.shape[0], w13.shape[1]
    check_tensor("w13", w13, shape=[None, None, k_dim])
    if is_gated(activation) and w1 % 2:
        raise ValueError(f"w13 must have an even dim 1 (gate and up) for activation {activation!r}, got {w1}")
    n = activation_output_width(activation, w1)
    check_tensor("w2", w2, ndim=3, dtypes=(wd,), shape=[e_local, k_dim, n])
    if w13_bias is not None:
        check_tensor("w13_bias", w13_bias, dtypes=FLOAT_DTYPES, shape=[e_local, w1])
    if w2_bias is not None:
        check_tensor("w2_bias", w2_bias, dtypes=FLOAT_DTYPES, shape=[e_local, k_dim])
    check_choice("intermediate_rounding", intermediate_rounding, list(IntermediateRounding))
    check_choice("activation_rounding", activation_rounding, list(Rounding))
    if intermediate_rounding == IntermediateRounding.NONE and activation_rounding != Rounding.ROUND_ONCE:
        raise ValueError("activation_rounding must be ROUND_ONCE when intermediate_rounding is NONE")
    check_choice("compute_dtype", compute_dtype, COMPUTE_DTYPES)
    if out_dtype is not None:
        check_choice("out_dtype", out_dtype, FLOAT_DTYPES)
    return e_local, w1, n


def _gemm1_act(
    xs: torch.Tensor,
    e: int,
    w13: torch.Tensor,
    w13_bias: torch.Tensor | None,
    conv: _ActConv,
    intermediate_rounding: IntermediateRounding,
    io_dtype: torch.dtype,
    cd: torch.dtype,
    bias_placement: BiasPlacement = BiasPlacement.ACCUMULATOR,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows `xs [R, K]` (compute dtype) through GEMM1 and the activation of local expert e: (h, a)."""
    h = _plus_bias(xs @ w13[e].to(cd).T, w13_bias, e, bias_placement, io_dtype)
    if intermediate_rounding == IntermediateRounding.GEMM1_AND_ACTIVATION_OUTPUT:
        h = h.to(io_dtype).to(cd)
    a = apply_activation(
        conv.activation, h, gate_order=conv.gate_order, layout=conv.layout, alpha=conv.alpha, beta=conv.beta,
        limit=conv.limit, clamp_limit=conv.clamp_limit, rounding=conv.rounding,
        intermediate_dtype=io_dtype if conv.rounding != Rounding.ROUND_ONCE else None,
        out_dtype=cd,
    )
    if intermediate_rounding != IntermediateRounding.NONE:
        a = a.to(io_dtype).to(cd)
    return h, a


def _plus_bias(r: torch.Tensor, bias: torch.Tensor | None, e: int, placement: BiasPlacement,
               io_dtype: torch.dtype) -> torch.Tensor:
    """A GEMM result r (compute dtype) plus expert e's bias, by `placement`."""
    if bias is None:
        return r
    if placement == BiasPlacement.ROUNDED_OUTPUT:
        return (r.to(io_dtype).to(r.dtype) + bias[e].to(r.dtype)).to(io_dtype).to(r.dtype)
    return r + bias[e].to(r.dtype)


def _gemm2(a: torch.Tensor, e: int, w2: torch.Tensor, w2_bias: torch.Tensor | None, cd: torch.dtype,
           io_dtype: torch.dtype, bias_placement: BiasPlacement = BiasPlacement.ACCUMULATOR) -> torch.Tensor:
    return _plus_bias(a @ w2[e].to(cd).T, w2_bias, e, bias_placement, io_dtype)


def _weights(w13: object, w2: object, quant: ExpertsQuant | None,
             device: torch.device) -> tuple[object, object]:
    """The weights to multiply by: the given tensors, or the dequantized ones of a quantized scheme."""
    if quant is None:
        return w13, w2
    if not isinstance(quant, ExpertsQuant):
        raise ValueError(f"quant must be an ExpertsQuant or None, got {type(quant).__name__}")
    if w13 is not None or w2 is not None:
        raise ValueError("w13 and w2 must be None when quant is given (the weights are quant.w13 and quant.w2)")
    return quant.dequantized_weights(device)


def _local_ids(topk_ids: torch.Tensor, expert_map: torch.Tensor | None) -> torch.Tensor:
    ids = topk_ids.long()
    return ids if expert_map is None else expert_map.long()[ids]


def _check_routing(
    x: torch.Tensor,
    topk_weights: object,
    topk_ids: object,
    expert_map: object,
    e_local: int,
    apply_router_weight_on_input: object,
) -> None:
    m = x.shape[0]
    topk_ids = check_tensor("topk_ids", topk_ids, ndim=2, dtypes=INT_INDEX_DTYPES)
    if topk_ids.shape[0] != m:
        raise ValueError(f"topk_ids must have shape [{m}, k] (one row per token of x), got {list(topk_ids.shape)}")
    k = topk_ids.shape[1]
    check_int("k (topk_ids.shape[1])", k, min_value=1)
    check_tensor("topk_weights", topk_weights, dtypes=FLOAT_DTYPES, shape=[m, k])
    if expert_map is None:
        e_global = e_local
    else:
        expert_map = check_tensor("expert_map", expert_map, ndim=1, dtypes=INT_INDEX_DTYPES)
        e_global = expert_map.shape[0]
        local = expert_map[expert_map >= 0].sort().values
        if bool((expert_map < -1).any()) or not torch.equal(
            local.long().cpu(), torch.arange(e_local, dtype=torch.long)
        ):
            raise ValueError(
                f"expert_map must map global ids to -1 or to each local id 0..{e_local - 1} (w13.shape[0]) "
                "exactly once"
            )
    if topk_ids.numel() and bool(((topk_ids < 0) | (topk_ids >= e_global)).any()):
        raise ValueError(f"topk_ids must be in [0, {e_global}) (the number of global experts)")
    if not isinstance(apply_router_weight_on_input, bool):
        raise ValueError("apply_router_weight_on_input must be a bool")
    if apply_router_weight_on_input and k != 1:
        raise ValueError(f"apply_router_weight_on_input requires k = 1 (topk_ids.shape[1]), got {k}")


def expert_intermediates(
    x: torch.Tensor,
    w13: torch.Tensor | None,
    w2: torch.Tensor | None,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: Activation | str = Activation.SILU_AND_MUL,
    gate_order: GateOrder = GateOrder.GATE_FIRST,
    layout: GateLayout | None = None,
    alpha: float | None = None,
    beta: float | None = None,
    limit: float | None = None,
    clamp_limit: float | None = None,
    activation_rounding: Rounding = Rounding.ROUND_ONCE,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    bias_placement: BiasPlacement = BiasPlacement.ACCUMULATOR,
    expert_map: torch.Tensor | None = None,
    apply_router_weight_on_input: bool = False,
    intermediate_rounding: IntermediateRounding = IntermediateRounding.ACTIVATION_OUTPUT,
    compute_dtype: torch.dtype = torch.float32,
    quant: ExpertsQuant | None = None,
) -> ExpertIntermediates:
    """The per-(token, slot) intermediates h, a, y of `fused_experts` (see `ExpertIntermediates`).

    Arguments as `fused_experts` (weight placement, accumulation and out_dtype concern only the reduce).
    With `apply_router_weight_on_input`, h is computed from the weighted input.
    """
    x = check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    w13, w2 = _weights(w13, w2, quant, x.device)
    e_local, w1, n = _check_common(
        x.dtype, x.shape[1], w13, w2, activation, w13_bias, w2_bias, intermediate_rounding,
        activation_rounding, compute_dtype, None, torch.float64 if quant is not None else None,
    )
    _check_routing(x, topk_weights, topk_ids, expert_map, e_local, apply_router_weight_on_input)
    conv = _ActConv(Activation(activation), gate_order, layout, alpha, beta, limit, clamp_limit,
                    activation_rounding)
    bp = BiasPlacement(check_choice("bias_placement", bias_placement, list(BiasPlacement)))
    m, k = topk_ids.shape
    kd = x.shape[1]
    cd = compute_dtype
    quant = None if quant is None else quant.for_input(x.dtype)
    xc = x.to(cd) if quant is None else quant.quantize_input(x).to(cd)
    if apply_router_weight_on_input:
        xc = xc * topk_weights.to(cd)  # [M, 1] broadcast over K
    local_ids = _local_ids(topk_ids, expert_map).reshape(-1)  # [M*k], -1 where not local
    h = torch.zeros(m * k, w1, dtype=cd, device=x.device)
    a = torch.zeros(m * k, n, dtype=cd, device=x.device)
    y = torch.zeros(m * k, kd, dtype=cd, device=x.device)
    # Group the (token, slot) pairs by local expert: one sort, one host sync for the counts.
    order = torch.argsort(local_ids, stable=True)
    counts = torch.bincount(local_ids + 1, minlength=e_local + 1).tolist()  # counts[0]: non-local slots
    segments = []
    start = counts[0]
    for e in range(e_local):
        segments.append((e, order[start:start + counts[e + 1]]))
        start += counts[e + 1]
    segments = [(e, pairs) for e, pairs in segments if pairs.numel()]
    with _ieee_fp32_matmul():
        for e, pairs in segments:
            h[pairs], a[pairs] = _gemm1_act(xc[pairs // k], e, w13, w13_bias, conv, intermediate_rounding, x.dtype,
                                            cd, bp)
        if quant is not None:  # re-quantized over the local slots only (others hold no activation)
            a = quant.quantize_intermediate(a, local_ids >= 0).to(cd)
        for e, pairs in segments:
            y[pairs] = _gemm2(a[pairs], e, w2, w2_bias, cd, x.dtype, bp)
    return ExpertIntermediates(
        h=h.reshape(m, k, w1), a=a.reshape(m, k, n), y=y.reshape(m, k, kd),
        local=(local_ids >= 0).reshape(m, k),
    )


def fused_experts(
    x: torch.Tensor,
    w13: torch.Tensor | None,
    w2: torch.Tensor | None,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: Activation | str = Activation.SILU_AND_MUL,
    gate_order: GateOrder = GateOrder.GATE_FIRST,
    layout: GateLayout | None = None,
    alpha: float | None = None,
    beta: float | None = None,
    limit: float | None = None,
    clamp_limit: float | None = None,
    activation_rounding: Rounding = Rounding.ROUND_ONCE,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    bias_placement: BiasPlacement = BiasPlacement.ACCUMULATOR,
    expert_map: torch.Tensor | None = None,
    apply_router_weight_on_input: bool = False,
    weight_placement: WeightPlacement = WeightPlacement.ACCUMULATOR,
    intermediate_rounding: IntermediateRounding = IntermediateRounding.ACTIVATION_OUTPUT,
    accumulation: Accumulation = Accumulation.FP32,
    compute_dtype: torch.dtype = torch.float32,
    out_dtype: torch.dtype | None = None,
    quant: ExpertsQuant | None = None,
) -> torch.Tensor:
    """MoE experts plus reduce: out[t] = sum_j w[t, j] * W2[e] . act(W13[e] . x[t]).

    x: `[M, K]` float. w13: `[E_local, 2N, K]` (`[E_local, N, K]` for *_no_mul), w2: `[E_local, K, N]`, both
    in x.dtype. topk_weights: `[M, k]` float (fp32 in practice), topk_ids: `[M, k]` int32/int64 global ids in
    [0, E_global). w13_bias `[E_local, 2N]`, w2_bias `[E_local, K]`: optional, any float dtype.
    expert_map `[E_global]` int: global -> local id or -1; each local id 0..E_local-1 exactly once.
    quant: a quantized scheme (then w13 = w2 = None; module docstring).
    Returns `[M, K]` in out_dtype (default x.dtype). Conventions and defaults: see the module docstring.
    """
    check_choice("weight_placement", weight_placement, list(WeightPlacement))
    check_choice("accumulation", accumulation, list(Accumulation))
    if out_dtype is not None:
        check_choice("out_dtype", out_dtype, FLOAT_DTYPES)
    inter = expert_intermediates(
        x, w13, w2, topk_weights, topk_ids, activation=activation, gate_order=gate_order, layout=layout,
        alpha=alpha, beta=beta, limit=limit, clamp_limit=clamp_limit, activation_rounding=activation_rounding,
        w13_bias=w13_bias, w2_bias=w2_bias, bias_placement=bias_placement, expert_map=expert_map,
        apply_router_weight_on_input=apply_router_weight_on_input, intermediate_rounding=intermediate_rounding,
        compute_dtype=compute_dtype, quant=quant,
    )
    od = out_dtype or x.dtype
    cd = compute_dtype
    y = inter.y
    if weight_placement == WeightPlacement.ROUNDED_EXPERT_OUTPUT:
        y = y.to(od).to(cd)
    if apply_router_weight_on_input:
        weighted = y  # the weight was applied to the input
    else:
        weighted = y * topk_weights.to(cd).unsqueeze(-1)  # [M, k, K]
    weighted = weighted * inter.local.unsqueeze(-1)  # non-local slots contribute nothing
    if accumulation == Accumulation.ROUNDED_SLOTS:
        weighted = weighted.to(od).to(cd)
    if accumulation in (Accumulation.FP32, Accumulation.ROUNDED_SLOTS):
        return weighted.sum(dim=1).to(od)
    out = torch.zeros(x.shape[0], x.shape[1], dtype=od, device=x.device)
    for j in range(weighted.shape[1]):  # slot by slot (k is small), each add rounded to od
        out = (out.to(cd) + weighted[:, j].to(od).to(cd)).to(od)
    return out


def batched_experts(
    x: torch.Tensor,
    expert_num_tokens: torch.Tensor,
    w13: torch.Tensor | None,
    w2: torch.Tensor | None,
    *,
    activation: Activation | str = Activation.SILU_AND_MUL,
    gate_order: GateOrder = GateOrder.GATE_FIRST,
    layout: GateLayout | None = None,
    alpha: float | None = None,
    beta: float | None = None,
    limit: float | None = None,
    clamp_limit: float | None = None,
    activation_rounding: Rounding = Rounding.ROUND_ONCE,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    bias_placement: BiasPlacement = BiasPlacement.ACCUMULATOR,
    intermediate_rounding: IntermediateRounding = IntermediateRounding.ACTIVATION_OUTPUT,
    compute_dtype: torch.dtype = torch.float32,
    out_dtype: torch.dtype | None = None,
    quant: ExpertsQuant | None = None,
) -> torch.Tensor:
    """Experts on the batched layout: out[e, r] = W2[e] . act(W13[e] . x[e, r]) for r < expert_num_tokens[e].

    x: `[E, max_tokens, K]` float (E = local experts), expert_num_tokens: `[E]` int32/int64 in
    [0, max_tokens]; weights and activation conventions as `fused_experts`. No router weight and no reduce
    (they belong to the finalize step). Returns `[E, max_tokens, K]` in out_dtype (default x.dtype), rounded
    once from compute_dtype; rows at or beyond the count are zero here but are not part of the contract.
    """
    x = check_tensor("x", x, ndim=3, dtypes=FLOAT_DTYPES)
    e, max_tokens, kd = x.shape
    w13, w2 = _weights(w13, w2, quant, x.device)
    check_tensor("w13", w13, ndim=3)
    if w13.shape[0] != e:
        raise ValueError(f"w13 must have shape [{e}, *, {kd}] (one expert per batch of x), got {list(w13.shape)}")
    _e_local, _w1, _n = _check_common(
        x.dtype, kd, w13, w2, activation, w13_bias, w2_bias, intermediate_rounding, activation_rounding,
        compute_dtype, out_dtype, torch.float64 if quant is not None else None,
    )
    ent = check_tensor("expert_num_tokens", expert_num_tokens, dtypes=INT_INDEX_DTYPES, shape=[e])
    counts = ent.tolist()
    if any(c < 0 or c > max_tokens for c in counts):
        raise ValueError(f"expert_num_tokens must be in [0, {max_tokens}] (x.shape[1]), got {counts}")
    conv = _ActConv(Activation(activation), gate_order, layout, alpha, beta, limit, clamp_limit,
                    activation_rounding)
    bp = BiasPlacement(check_choice("bias_placement", bias_placement, list(BiasPlacement)))
    od = out_dtype or x.dtype
    cd = compute_dtype
    valid = torch.arange(max_tokens, device=x.device)[None, :] < ent.to(x.device).long()[:, None]  # [E, T]
    if quant is None:
        xc = x.to(cd)
    else:  # rows beyond the counts hold no token: they must not move a per-tensor scale
        quant = quant.for_input(x.dtype)
        xc = quant.quantize_input(x.reshape(e * max_tokens, kd), valid.reshape(-1)).reshape(x.shape).to(cd)
    n = w2.shape[2]
    a = torch.zeros(e, max_tokens, n, dtype=cd, device=x.device)
    out = torch.zeros(e, max_tokens, kd, dtype=od, device=x.device)
    with _ieee_fp32_matmul():
        for i, cnt in enumerate(counts):
            if cnt:
                _h, a[i, :cnt] = _gemm1_act(xc[i, :cnt], i, w13, w13_bias, conv, intermediate_rounding, x.dtype, cd,
                                            bp)
        if quant is not None:
            a = quant.quantize_intermediate(a.reshape(e * max_tokens, n), valid.reshape(-1)).reshape(a.shape).to(cd)
        for i, cnt in enumerate(counts):
            if cnt:
                out[i, :cnt] = _gemm2(a[i, :cnt], i, w2, w2_bias, cd, x.dtype, bp).to(od)
    return out
