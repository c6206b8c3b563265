"""Op spec `experts`: end-to-end fused experts, standard (sorted-token) and batched formats (docs/SEMANTICS.md §6).

Judged `bounded` with the error model of harness.core.errors, propagated through the layer:
  GEMM1   e_h = C_DOT * u_acc * sqrt(K) * (|x| . |W13|)            (+ u_in * |h| if h is stored rounded)
  act     e_a = |d act/d gate| e_h_gate + |d act/d up| e_h_up + u_inter * |a| + fp32 ulps * |a|
  GEMM2   e_y = C_DOT * u_acc * sqrt(N) * (|a| . |W2|) + (e_a . |W2|)
  reduce  e   = sum_j |w_j| e_y_j + C_DOT * u32 * sqrt(k) * sum_j |w_j y_j| + C_OUT * u_out * |out|
The activation's Jacobian comes from autograd on the fp64 intermediates, so every activation gets its own slope.
Declared roundings are bracketed (harness.core.errors.rounding_bracket): an element pays for one only where the
kernel's value, within its error of the oracle's, may round to a neighbour; inner activation roundings (act(gate)
first, every step of swigluoai) step by step (harness.ops.activation.rounded_activation); the re-quantized
intermediate by its exact code range, and its scale's movement once, on each unit's signed partial dot
(experts_quant.requant_terms). Loose by design: fp8_mma_promoted (harness.core.errors.FP8_MMA_REL: the tensor core's
partial sums are not rounded in a documented way, so only a relative worst case on |products| is sound), and the
quantized schemes' floor: each bracket is paid as a worst case summed over N (docs/BOUNDS.md).

Outside the contract: inputs whose GEMM products or sums pass fp32's range (x or weights near the dtype's largest
finite value). Whether an fp32 dot's partial sums overflow depends on the order of the kernel's adds, which the
fp64 oracle cannot know, so no value class puts the dtype's largest finite value here (the reduce op's does).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch
from hypothesis import strategies as st

from harness.core import inputs as gen
from harness.core.case import Case
from harness.core.errors import C_DOT, C_OUT, FP8_MMA_REL, UNIT_ROUNDOFF, rounding_bracket, unit_roundoff
from harness.core.sizes import edge_sizes, span
from harness.ops import experts_quant as xq
from harness.ops.activation import operand_magnitude, oracle_kwargs, rounded_activation
from harness.ops.base import Axis, Check, OpSpec, OutputSpec, ValueClass
from harness.ops.common import (
    centred_counts,
    draw_experts,
    draw_map,
    draw_top_k,
    ends_routed,
    expert_maps,
    experts_fitted,
    lim,
    map_fields,
    near_multiple_counts,
    rows_for_counts,
    yes,
)
from harness.ops.experts_quant import ACTIVATIONS
from harness.registry import Adapter
from reference import activations as acts
from reference import experts as ref
from reference.quant import QuantRecipe, QuantUnit

#: the seed tables' activation names -> the oracle's

AXES = (
    Axis("format", "Input act. format", ("standard", "batched")),
    Axis("quant_type", "Quant types", xq.QUANT_TYPES),
    Axis("quant_format", "Quant formats", xq.QUANT_FORMATS),
    Axis("activation", "Activation functions", tuple(ACTIVATIONS)),
    Axis("apply_weight_on_input", "Apply weight on input", ("N", "Y")),
    Axis("expert_map", "Expert map", ("N", "Y")),
    Axis("dtype", "Dtype", ("bfloat16", "float16", "float32")),
    Axis("bias", "Biases", ("N", "Y")),
)


def _act(case: Case) -> str:
    return ACTIVATIONS[case.features["activation"]]


def _batched(case: Case) -> bool:
    return case.features["format"] == "batched"


def make_inputs(case: Case, device: str) -> dict[str, torch.Tensor]:
    found = unquantized_inputs(case, device)
    sch = xq.scheme(case, {})
    if sch is not None:
        xq.quantize_weights(found, sch, device)
        xq.calibrate_act_global_scales(case, found, sch)
    return found


def unquantized_inputs(case: Case, device: str) -> dict[str, torch.Tensor]:
    """The inputs before the weights are quantized (tokens, routing, expert map, counts as `make_inputs` builds
    them): what the value classes read, without the cost of quantizing every expert's weights."""
    e, hidden, n = case.shape("E"), case.shape("K"), case.shape("N")
    dt = case.dtype("x")
    e_local = case.params.get("local_experts", e)
    w1 = 2 * n if acts.is_gated(_act(case)) else n
    found = {"w13": gen.weights(case, "w13", (e_local, w1, hidden), dt, device),
             "w2": gen.weights(case, "w2", (e_local, hidden, n), dt, device)}
    if yes(case.features["bias"]):
        found["w13_bias"] = gen.randn(case, "b13", (e_local, w1), dt, device, scale=0.1)
        found["w2_bias"] = gen.randn(case, "b2", (e_local, hidden), dt, device, scale=0.1)
    if _batched(case):
        _batched_tokens(case, found, e_local, hidden, device)
    else:
        _standard_tokens(case, found, device)
        if case.params.get("values") == "order":
            _order_sensitive(case, found)
    xq.tie_rows(case, found["x"])
    _boundary_values(case, found)
    return found


#: rows past a batched count hold x times this: any statistic taken over them (a per-tensor amax) moves by far
PADDING_POISON = 2.0**10


def _batched_tokens(case: Case, found: dict[str, torch.Tensor], e_local: int, hidden: int, device: str) -> None:
    t = case.shape("max_tokens")
    counts = torch.randint(0, t + 1, (e_local,), generator=gen.generator(case, "counts"), dtype=torch.int32)
    if case.params.get("counts") is not None:
        counts = torch.tensor(case.params["counts"], dtype=torch.int32)
    if e_local and not bool(counts.any()):  # no token anywhere tests nothing: the first expert gets them all
        counts[0] = t
    found["x"] = gen.randn(case, "x", (e_local, t, hidden), case.dtype("x"), device)
    found["expert_num_tokens"] = counts.to(device)


def _standard_tokens(case: Case, found: dict[str, torch.Tensor], device: str) -> None:
    m, k, e = case.shape("M"), case.shape("k"), case.shape("E")
    found["x"] = gen.randn(case, "x", (m, case.shape("K")), case.dtype("x"), device)
    found["topk_weights"] = gen.topk_weights(case, m, k, device)
    if k == 1:  # rows of one weight would all be 1.0 after normalizing: a dropped weight would go unseen
        found["topk_weights"] = gen.uniform(case, "topk_weights", (m, 1), 0.05, 1.0, device)
    if case.params.get("values") == "zero_weights":  # ZERO_WEIGHTS: exact zeros, whole rows and single slots
        found["topk_weights"] = gen.zero_weights(case, found["topk_weights"])
    counts = case.params.get("counts")
    found["topk_ids"] = (gen.topk_ids(case, m, e, k, device) if counts is None
                         else gen.ids_for_counts(case, counts, m, k, device))
    if yes(case.features["expert_map"]):
        # the map keeps the first routed expert local: the last token's, whose row `edges` never zeroes
        found["expert_map"] = gen.expert_map(case, e, device, routed=found["topk_ids"].flip(0))


#: the order-sensitive slots' weight ratio: 2^26, past fp32's 24 bits
ORDER_SMALL = 2.0**-26


def _order_sensitive(case: Case, found: dict[str, torch.Tensor]) -> None:
    """In place (unquantized, k >= 3, no map): expert 1 mirrors expert 0 (same W13, negated W2 and b2), and every
    token takes both with one weight, and a third expert with that weight times 2^-26: summed in slot order, the
    third slot survives only where it comes after the cancelling pair, so a summation that starts at another slot
    gives another result."""
    ids, w = found["topk_ids"], found["topk_weights"]
    m, k = ids.shape
    g = gen.generator(case, "order")
    for name, sign in (("w13", 1.0), ("w2", -1.0), ("w13_bias", 1.0), ("w2_bias", -1.0)):
        if name in found:
            found[name][1] = found[name][0] * sign
    for t in range(m):
        slots = torch.randperm(k, generator=g).tolist()
        others = (torch.randperm(case.shape("E") - 2, generator=g) + 2)[: k - 2].tolist()
        ids[t, slots[0]], ids[t, slots[1]] = 0, 1
        for j, e in zip(slots[2:], others):
            ids[t, j] = e
        w[t, slots[1]] = w[t, slots[0]]
        w[t, slots[2]] = w[t, slots[0]] * ORDER_SMALL


def _boundary_values(case: Case, found: dict[str, torch.Tensor]) -> None:
    """In place: `values="edges"` puts zero rows, zero groups and amax outliers into x (`inputs.edge_rows`);
    the batched format's rows past each count are poisoned (PADDING_POISON), always."""
    x = found["x"]
    # each expert's valid rows of the batched format (each keeps a row with values), the tokens of the standard one
    blocks = ([x[e, : int(n)] for e, n in enumerate(found["expert_num_tokens"].tolist()) if n] if _batched(case)
              else [x])
    if case.params.get("values") == "edges" and x.numel():
        mult = _multiple(case.features)
        for rows in blocks:
            rows.copy_(gen.edge_rows(case, rows.float(), mult if mult > 2 else rows.shape[1], outlier=16.0))
    if _batched(case) and x.numel():
        past = torch.arange(x.shape[1], device=x.device)[None, :] >= found["expert_num_tokens"][:, None].long()
        x[past] = x[past] * PADDING_POISON


def outputs(case: Case, inputs: Mapping[str, torch.Tensor]) -> dict[str, OutputSpec]:
    return {"out": OutputSpec(tuple(inputs["x"].shape), case.dtype("x"))}


def _oracle_kwargs(case: Case, conventions: Mapping[str, Any]) -> dict[str, Any]:
    kw = oracle_kwargs(conventions, _act(case))
    if "rounding" in kw:
        kw["activation_rounding"] = kw.pop("rounding")
    kw["activation"] = _act(case)
    if "intermediate_rounding" in conventions:
        kw["intermediate_rounding"] = ref.IntermediateRounding(conventions["intermediate_rounding"])
    if "bias_placement" in conventions:
        kw["bias_placement"] = ref.BiasPlacement(conventions["bias_placement"])
    return kw


def _reduce_kwargs(conventions: Mapping[str, Any]) -> dict[str, Any]:
    """The reduce's conventions (standard format only)."""
    kw: dict[str, Any] = {}
    if "weight_placement" in conventions:
        kw["weight_placement"] = ref.WeightPlacement(conventions["weight_placement"])
    if "accumulation" in conventions:
        kw["accumulation"] = ref.Accumulation(conventions["accumulation"])
    return kw


def _per_slot_matmul(rows: torch.Tensor, w: torch.Tensor, ids: torch.Tensor,
                     magnitude: bool = False) -> torch.Tensor:
    """rows [R, in] times w[ids[r]]^T -> [R, out] (a loop over experts; ids < 0 give zero rows), with |w| where
    `magnitude`. Each expert's weights are converted to rows' dtype (and made absolute) alone: whole float64 copies
    of a large case's weights held several times its inputs."""
    out = torch.zeros(rows.shape[0], w.shape[1], dtype=rows.dtype, device=rows.device)
    for e in ids.unique().tolist():
        if e < 0:
            continue
        sel = ids == e
        we = w[e].to(rows.dtype)
        out[sel] = rows[sel] @ (we.abs() if magnitude else we).T
    return out


def _gated_sum(t: torch.Tensor, act: str, conventions: Mapping[str, Any]) -> torch.Tensor:
    """Sum the two h elements (gate and up) that feed each activation output, in the activation's layout."""
    if not acts.is_gated(act):
        return t
    layout = conventions.get("layout") or ("interleaved" if act == "swigluoai" else "halves")
    if layout == "interleaved":
        return t[..., 0::2] + t[..., 1::2]
    half = t.shape[-1] // 2
    return t[..., :half] + t[..., half:]


def input_code_error(x: torch.Tensor, quant: ref.ExpertsQuant | None, conventions: Mapping[str, Any],
                     valid: torch.Tensor | None = None) -> torch.Tensor | None:
    """Bound on |the kernel's dequantized GEMM1 input - the oracle's| per element of x [R, K] (float64), or None where
    they are equal: only under `division=approximate`, whose quotients may round an element next to a code boundary
    to the other neighbour, and move the scale by a few ulps (bracketed as a re-quantization of an exact x)."""
    if quant is None or quant.act is None or conventions.get("division") != "approximate" or x.shape[0] == 0:
        return None
    rows = x.reshape(-1, x.shape[-1]).double()
    ok = torch.ones(rows.shape[0], dtype=torch.bool, device=rows.device) if valid is None else valid
    return xq.requant_error(rows, torch.zeros_like(rows), quant.act, ok, quant.act_global_scale).reshape(x.shape)


#: a bound over more elements than this (rows x GEMM1 width) is taken a chunk of rows at a time: its float64
#: intermediates of a large-offsets case (a few hundred rows of width 2**22) held over 100 GiB on an H200
BOUND_CHUNK_ELEMENTS = 1 << 25


def _bound(case: Case, w13: torch.Tensor, w2: torch.Tensor, cpu: Mapping[str, torch.Tensor],
           conventions: Mapping[str, Any], x_rows: torch.Tensor, ids: torch.Tensor, kw: Mapping[str, Any],
           quant: ref.ExpertsQuant | None = None, e_x_rows: torch.Tensor | None = None) -> torch.Tensor:
    """`_rows_bound`, a chunk of rows at a time where the rows are many and wide (`BOUND_CHUNK_ELEMENTS`): each
    row's bound is its own, except under one scale over every row of the intermediate (a tensor unit)."""
    step = max(1, BOUND_CHUNK_ELEMENTS // max(1, int(w13.shape[1])))
    one_scale = quant is not None and quant.intermediate is not None and quant.intermediate.unit == QuantUnit.TENSOR
    if one_scale or x_rows.shape[0] <= step:
        return _rows_bound(case, w13, w2, cpu, conventions, x_rows, ids, kw, quant, e_x_rows)
    return torch.cat([_rows_bound(case, w13, w2, cpu, conventions, x_rows[r:r + step], ids[r:r + step], kw, quant,
                                  None if e_x_rows is None else e_x_rows[r:r + step])
                      for r in range(0, x_rows.shape[0], step)])


def _rows_bound(case: Case, w13: torch.Tensor, w2: torch.Tensor, cpu: Mapping[str, torch.Tensor],
                conventions: Mapping[str, Any], x_rows: torch.Tensor, ids: torch.Tensor, kw: Mapping[str, Any],
                quant: ref.ExpertsQuant | None = None, e_x_rows: torch.Tensor | None = None) -> torch.Tensor:
    """Per-row error bound of the expert output y before the router weight: [R, K]. w13, w2: the weights the
    oracle multiplies by (dequantized for a quantized scheme; converted to float64 an expert at a time); x_rows:
    its GEMM1 input rows; e_x_rows: how far the kernel's GEMM1 input rows may be from them (`input_code_error`),
    None: equal."""
    dt = cpu["x"].dtype
    u_acc = UNIT_ROUNDOFF["tf32"] if conventions.get("matmul_precision") == "tf32" else UNIT_ROUNDOFF["float32"]
    # weight-only kernels that round dequantized weights before their MMA: one more rounding per product
    u_w = unit_roundoff(conventions["weight_dequant_dtype"]) if "weight_dequant_dtype" in conventions else 0.0
    if "weight_scale_dtype" in conventions:  # the kernel's scales rounded from the harness's fp32: once more
        u_w += unit_roundoff(conventions["weight_scale_dtype"])
    # fp8 tensor-core partial sums kept at ~14 bits between fp32 promotions: a relative term on |products|
    if conventions.get("matmul_precision") == "fp8_mma_promoted":
        u_w += 2 * FP8_MMA_REL
    hidden, n = w2.shape[1], w2.shape[2]
    rounded_bias = kw.get("bias_placement") == ref.BiasPlacement.ROUNDED_OUTPUT
    h = _per_slot_matmul(x_rows.double(), w13, ids)
    mag_h = _per_slot_matmul(x_rows.double().abs(), w13, ids, magnitude=True)
    has_b13 = "w13_bias" in cpu and cpu["w13_bias"].shape[0] > 0
    if has_b13:  # the kernel's fp32 add of the bias: one more rounding, relative to |b| as well
        mag_h = mag_h + torch.where((ids >= 0)[:, None], cpu["w13_bias"].double()[ids.clamp_min(0)].abs(), 0.0)
    e_h = (C_DOT * u_acc * math.sqrt(hidden) + u_w) * mag_h
    if e_x_rows is not None:  # codes the kernel's quantizer may round the other way, through GEMM1
        e_h = e_h + _per_slot_matmul(e_x_rows, w13, ids, magnitude=True)
    if has_b13:
        h, e_h = _add_bias(h, e_h, cpu["w13_bias"], ids, dt if rounded_bias else None)
    rounding = kw.get("intermediate_rounding", ref.IntermediateRounding.ACTIVATION_OUTPUT)
    if rounding == ref.IntermediateRounding.GEMM1_AND_ACTIVATION_OUTPUT:
        e_h = rounding_bracket(h, e_h, dt)  # the kernel stores h in x.dtype, as the oracle does
        h = h.to(dt).double()
    act_kw = {k: v for k, v in kw.items()
              if k not in ("activation", "activation_rounding", "intermediate_rounding", "bias_placement")}
    inner = kw.get("activation_rounding", acts.Rounding.ROUND_ONCE)
    if inner != acts.Rounding.ROUND_ONCE and acts.is_gated(kw["activation"]):
        # inner roundings (act(gate) first, or every step of swigluoai): bracketed step by step
        a, e_a = rounded_activation(h, e_h, kw["activation"], act_kw, inner, dt)
    else:
        hg = h.clone().requires_grad_(True)
        a = acts.apply_activation(kw["activation"], hg, **act_kw)
        (grad,) = torch.autograd.grad(a.sum(), hg)
        a = a.detach()
        # fp32 evaluation: relative to the operands where the activation cancels (gelu's negative tail)
        mag = torch.maximum(a.abs(), operand_magnitude(h, kw["activation"], conventions))
        e_a = _gated_sum(grad.abs() * e_h, kw["activation"], conventions) + 64 * UNIT_ROUNDOFF["float32"] * mag
    if rounding != ref.IntermediateRounding.NONE:
        # both round a to x.dtype: they differ only where a is within e_a of a rounding boundary
        e_a = rounding_bracket(a, e_a, dt)
        a = a.to(dt).double()
    scale_rel = None
    if quant is not None and quant.intermediate is not None:
        # the kernel re-quantizes its own a' (within e_a of a): bracket what that can do to the codes, and take
        # the movement of each unit's scale apart (one factor on the unit's whole dot, not on every |element|)
        e_a, scale_rel = xq.requant_terms(a, e_a, quant.intermediate, ids >= 0, quant.intermediate_global_scale)
        a = quant.quantize_intermediate(a, ids >= 0)
    e_y = (C_DOT * u_acc * math.sqrt(n) + u_w) * _per_slot_matmul(a.abs(), w2, ids, magnitude=True)
    e_y = e_y + _per_slot_matmul(e_a, w2, ids, magnitude=True)
    if scale_rel is not None and bool((scale_rel > 0).any()):
        e_y = e_y + _unit_dots(a, w2, ids, scale_rel, quant.intermediate)
    if rounded_bias and "w2_bias" in cpu and cpu["w2_bias"].shape[0] > 0:
        # the rounding of the GEMM result before the bias, and of the sum: brackets (the oracle rounds the same)
        _, e_y = _add_bias(_per_slot_matmul(a, w2, ids), e_y, cpu["w2_bias"], ids, dt)
    return e_y


def _unit_dots(a: torch.Tensor, w2: torch.Tensor, ids: torch.Tensor, rel: torch.Tensor,
               recipe: QuantRecipe) -> torch.Tensor:
    """sum over the quantization units u of a's rows: rel_u * |a_u . W2_u| ([R, K]), the bound on what a scale that
    moved by at most rel_u (relative) does to GEMM2: every element of the unit is multiplied by the same s' / s, so
    the unit's signed partial dot moves by that factor (summing rel |a| |W2| per element would pay the cancellation
    of the dot as if it were error)."""
    if recipe.unit != QuantUnit.GROUP:  # row or tensor: one factor per row
        return rel[:, :1] * _per_slot_matmul(a, w2, ids).abs()
    out = torch.zeros(a.shape[0], w2.shape[1], dtype=a.dtype, device=a.device)
    for g in range(0, a.shape[1], recipe.group_size):
        cols = slice(g, g + recipe.group_size)
        out = out + rel[:, g:g + 1] * _per_slot_matmul(a[:, cols], w2[:, :, cols], ids).abs()
    return out


def _add_bias(r: torch.Tensor, e: torch.Tensor, bias: torch.Tensor, ids: torch.Tensor,
              rounded: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A GEMM result r [R, W] (float64) with error bound e, plus each row's expert bias; `rounded`: the result is
    rounded to that dtype before the add and the sum after it (BiasPlacement.ROUNDED_OUTPUT)."""
    b = torch.where((ids >= 0)[:, None], bias.double()[ids.clamp_min(0)], 0.0)
    if rounded is None:
        return r + b, e
    e = rounding_bracket(r, e, rounded)
    r = r.to(rounded).double() + b
    return r.to(rounded).double(), rounding_bracket(r, e, rounded)


def _weights64(cpu: Mapping[str, torch.Tensor], quant: ref.ExpertsQuant | None,
               dev: torch.device) -> tuple[Any, Any, torch.Tensor, torch.Tensor]:
    """(the oracle's weight arguments, the weights its bound multiplies by): plain (the bound converts them to
    float64 an expert at a time, exactly), or dequantized from the scheme (float64)."""
    if quant is None:
        return cpu["w13"], cpu["w2"], cpu["w13"], cpu["w2"]
    return (None, None, *quant.dequantized_weights(dev))


def _batched_parts(case: Case, cpu: Mapping[str, torch.Tensor], conventions: Mapping[str, Any],
                   kw: Mapping[str, Any], quant: ref.ExpertsQuant | None) -> tuple[torch.Tensor, ...]:
    """The batched format's expected output, bound and mask."""
    dev = cpu["x"].device
    biases = {b: cpu[b] for b in ("w13_bias", "w2_bias") if b in cpu}
    w13, w2, w13_64, w2_64 = _weights64(cpu, quant, dev)
    want = ref.batched_experts(cpu["x"], cpu["expert_num_tokens"], w13, w2, **kw, **biases, quant=quant,
                               compute_dtype=torch.float64, out_dtype=torch.float64)
    e_loc, t, hidden = cpu["x"].shape
    rows = cpu["x"].reshape(e_loc * t, hidden)
    mask = (torch.arange(t, device=dev)[None, :] < cpu["expert_num_tokens"][:, None].long())
    ids = torch.where(mask.reshape(-1), torch.arange(e_loc, device=dev).repeat_interleave(t), -1)
    e_rows = input_code_error(rows, quant, conventions, ids >= 0)
    if quant is not None:
        rows = quant.quantize_input(rows, ids >= 0)
    mask = mask[..., None].expand_as(want)
    # the bound of the rows that hold a token only (the rest are outside the mask): a large case's padding rows
    # made most of its float64 intermediates
    held = ids >= 0
    bound = torch.zeros(rows.shape[0], want.shape[-1], dtype=torch.float64, device=dev)
    bound[held] = _bound(case, w13_64, w2_64, cpu, conventions, rows[held], ids[held], kw, quant,
                         None if e_rows is None else e_rows[held])
    return want, bound.reshape(want.shape), mask


def _per_expert(cpu: Mapping[str, torch.Tensor], quant: ref.ExpertsQuant, e: int) -> tuple[dict[str, torch.Tensor],
                                                                                           ref.ExpertsQuant]:
    """Expert e's batch as a batched case of one expert (the `act_quant_scope=expert` convention)."""
    part = {n: t[e:e + 1] for n, t in cpu.items() if t.dim() > 0 and t.shape[0] == cpu["x"].shape[0]}
    return part, dataclasses.replace(quant, w13=quant.w13[e:e + 1], w2=quant.w2[e:e + 1])


def _batched_checks(case: Case, cpu: Mapping[str, torch.Tensor], conventions: Mapping[str, Any],
                    kw: Mapping[str, Any], quant: ref.ExpertsQuant | None) -> list[Check]:
    if quant is not None and conventions.get("act_quant_scope") == "expert" and cpu["x"].shape[0] > 0:
        parts = []
        for e in range(cpu["x"].shape[0]):
            part, part_quant = _per_expert(cpu, quant, e)
            parts.append(_batched_parts(case, part, conventions, kw, part_quant))
        want, bound, mask = (torch.cat([p[i] for p in parts]) for i in range(3))
    else:
        want, bound, mask = _batched_parts(case, cpu, conventions, kw, quant)
    dt = cpu["x"].dtype
    bound = bound + C_OUT * unit_roundoff(dt) * want.abs() + float(torch.finfo(dt).smallest_normal)
    untouched = ~mask if conventions.get("padding_rows") == "untouched" else None  # rows past each count
    return [Check("out", "bounded", expected=want, bound=bound, mask=mask, untouched=untouched)]


def router_weights(w: torch.Tensor, x_dtype: torch.dtype, conventions: Mapping[str, Any]) -> torch.Tensor:
    """The router weights the kernel multiplies by: `w` rounded to the `router_weight_dtype` convention's dtype
    (`input`: x's), kept in w's dtype."""
    name = conventions.get("router_weight_dtype", "float32")
    dt = x_dtype if name == "input" else getattr(torch, name)
    return w.to(dt).to(w.dtype)


def _oracle_inputs(inputs: Mapping[str, torch.Tensor], conventions: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The inputs as the oracle takes them: the router weights rounded as the kernel rounds them."""
    # The oracle runs where the inputs are (fp64 on a GPU is fast; real shapes on a CPU are not).
    cpu = {n: t.detach() for n, t in inputs.items()}
    if "topk_weights" in cpu:
        cpu["topk_weights"] = router_weights(cpu["topk_weights"], cpu["x"].dtype, conventions)
    return cpu


def _quant_of(case: Case, cpu: Mapping[str, torch.Tensor], conventions: Mapping[str, Any]) -> ref.ExpertsQuant | None:
    sch = xq.scheme(case, conventions)
    requantize = conventions.get("intermediate_quant", "requantized") == "requantized"
    return None if sch is None else xq.to_experts_quant(cpu, sch, requantize=requantize)


def stages(case: Case, inputs: Mapping[str, torch.Tensor], conventions: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The standard format's per-(token, slot) intermediates in float64 (reference.experts.ExpertIntermediates):
    GEMM1 output, activation output, GEMM2 output before the router weight, and which slots are local. The batched
    format has none (its oracle computes each expert's batch whole)."""
    if _batched(case):
        return {}
    cpu = _oracle_inputs(inputs, conventions)
    quant = _quant_of(case, cpu, conventions)
    w13, w2, _, _ = _weights64(cpu, quant, cpu["x"].device)
    inter = ref.expert_intermediates(cpu["x"], w13, w2, cpu["topk_weights"], cpu["topk_ids"],
                                     **_oracle_kwargs(case, conventions),
                                     **{b: cpu[b] for b in ("w13_bias", "w2_bias") if b in cpu},
                                     expert_map=cpu.get("expert_map"),
                                     apply_router_weight_on_input=yes(case.features["apply_weight_on_input"]),
                                     compute_dtype=torch.float64, quant=quant)
    return {"gemm1_out": inter.h, "activation_out": inter.a, "gemm2_out": inter.y, "slot_is_local": inter.local}


def expected(case: Case, inputs: Mapping[str, torch.Tensor], conventions: Mapping[str, Any]) -> list[Check]:
    cpu = _oracle_inputs(inputs, conventions)
    dev = cpu["x"].device
    kw = _oracle_kwargs(case, conventions)
    dt = cpu["x"].dtype
    u_out = unit_roundoff(dt)
    biases = {b: cpu[b] for b in ("w13_bias", "w2_bias") if b in cpu}
    tiny = float(torch.finfo(dt).smallest_normal)
    quant = _quant_of(case, cpu, conventions)
    if _batched(case):
        return _batched_checks(case, cpu, conventions, kw, quant)
    w13, w2, w13_64, w2_64 = _weights64(cpu, quant, dev)
    on_input = yes(case.features["apply_weight_on_input"])
    red = _reduce_kwargs(conventions)
    m, k = cpu["topk_ids"].shape
    ids = cpu["topk_ids"].long()
    if "expert_map" in cpu:
        ids = cpu["expert_map"].long()[ids]
    w = cpu["topk_weights"].double()
    x_in = cpu["x"].double() if quant is None else quant.quantize_input(cpu["x"])
    x_rows = x_in.repeat_interleave(k, dim=0)
    e_x = input_code_error(cpu["x"], quant, conventions)
    e_x_rows = None if e_x is None else e_x.repeat_interleave(k, dim=0)
    if on_input:
        x_rows = x_rows * w.reshape(-1, 1)
        e_x_rows = None if e_x_rows is None else e_x_rows * w.abs().reshape(-1, 1)
    e_y = _bound(case, w13_64, w2_64, cpu, conventions, x_rows, ids.reshape(-1), kw, quant, e_x_rows)
    e_y = e_y.reshape(m, k, cpu["x"].shape[1])
    inter = ref.expert_intermediates(cpu["x"], w13, w2, cpu["topk_weights"], cpu["topk_ids"],
                                     **kw, **biases, expert_map=cpu.get("expert_map"),
                                     apply_router_weight_on_input=on_input, compute_dtype=torch.float64, quant=quant)
    if red.get("accumulation") == ref.Accumulation.SEQUENTIAL_OUT_DTYPE:
        return [_sequential_check(inter, e_y, w, on_input, red, dt)]  # its own centre: no oracle sum needed
    # in float64 the output-dtype roundings of these conventions would vanish: round to x.dtype where they do
    want = ref.fused_experts(cpu["x"], w13, w2, cpu["topk_weights"], cpu["topk_ids"], **kw, **biases,
                             expert_map=cpu.get("expert_map"), apply_router_weight_on_input=on_input,
                             compute_dtype=torch.float64, out_dtype=dt if red else torch.float64, quant=quant,
                             **red).double()
    if red.get("weight_placement") == ref.WeightPlacement.ROUNDED_EXPERT_OUTPUT:
        e_y = rounding_bracket(inter.y, e_y, dt)  # y is rounded to the output dtype before the weight
    wa = torch.ones_like(w) if on_input else w.abs()
    wy = (wa[..., None] * inter.y.abs() * inter.local[..., None]).sum(dim=1)
    e_slot = wa[..., None] * e_y
    if red.get("accumulation") == ref.Accumulation.ROUNDED_SLOTS:
        # each weighted slot is rounded to the output dtype: bracket it (its fp32 product adds 2u32 before that)
        slot = inter.y if on_input else inter.y * w[..., None]
        e_slot = rounding_bracket(slot, e_slot + 2 * UNIT_ROUNDOFF["float32"] * slot.abs(), dt)
    ey = (e_slot * inter.local[..., None]).sum(dim=1)
    bound = ey + C_DOT * UNIT_ROUNDOFF["float32"] * math.sqrt(k) * wy + C_OUT * u_out * want.abs() + tiny
    return [Check("out", "bounded", expected=want, bound=bound)]


def _sequential_check(inter: ref.ExpertIntermediates, e_y: torch.Tensor, w: torch.Tensor, on_input: bool,
                      red: Mapping[str, Any], dt: torch.dtype) -> Check:
    """A slot-by-slot sum in the output dtype, judged step by step: every value a kernel can reach, given each
    expert output y' within e_y of the oracle's, is inside [lo, hi], carried through each rounding (rounding and
    addition are monotone, so the interval's ends are the ends of what the steps can give). A kernel that sums in
    fp32 and rounds once lands outside wherever a step's rounding mattered."""
    u32 = UNIT_ROUNDOFF["float32"]

    def rnd(t: torch.Tensor) -> torch.Tensor:
        return t.to(dt).double()

    y_lo, y_hi = inter.y - e_y, inter.y + e_y
    if red.get("weight_placement") == ref.WeightPlacement.ROUNDED_EXPERT_OUTPUT:
        y_lo, y_hi = rnd(y_lo), rnd(y_hi)
    if not on_input:  # router weights are >= 0: the product keeps the order; its fp32 rounding adds u32 each way
        y_lo, y_hi = y_lo * w[..., None], y_hi * w[..., None]
    s_lo, s_hi = rnd(y_lo - u32 * y_lo.abs()), rnd(y_hi + u32 * y_hi.abs())
    local = inter.local[..., None]
    lo = torch.zeros_like(inter.y[:, 0])
    hi = torch.zeros_like(lo)
    for j in range(inter.y.shape[1]):  # non-local slots add nothing
        lo = torch.where(local[:, j], rnd(lo + s_lo[:, j]), lo)
        hi = torch.where(local[:, j], rnd(hi + s_hi[:, j]), hi)
    return Check("out", "bounded", expected=(lo + hi) / 2, bound=(hi - lo) / 2)


def _quant_params(adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    """Conventions that shape the inputs (weights are quantized ahead of time) travel in the case."""
    if cell.get("quant_type", "none") == "none":
        return {}
    return {key: dict(adapter.conventions[key]) for key in ("weight_quant", "act_quant") if key in adapter.conventions}


def _multiple(cell: Mapping[str, str]) -> int:
    """K and N of a quantized cell are multiples of its group (weights quantized along both, as checkpoints are)."""
    qt = cell.get("quant_type", "none")
    if qt == "none":
        return 1
    fmt = cell.get("quant_format", "-")
    return {"G128": 128, "G32": 32, "G16": 16}.get(fmt, 2 if qt.startswith("w4a16") else 1)


def _multiples(adapter: Adapter, cell: Mapping[str, str]) -> tuple[int, int]:
    """(K, N) multiples: the cell's group and the adapter's `K_multiple` / `N_multiple` limits (e.g. 16 for a kernel
    whose rows must be 16-byte aligned)."""
    mult = _multiple(cell)
    return (math.lcm(mult, int(adapter.limits.get("K_multiple", 1))),
            math.lcm(mult, int(adapter.limits.get("N_multiple", 1))))


def _fit(v: int, mult: int) -> int:
    return max(mult, -(-v // mult) * mult) if mult > 1 else v


def _sizes(adapter: Adapter, dim: str, cell_mult: int) -> st.SearchStrategy[int]:
    """K or N within the adapter's <dim> limits: tile edges where no multiple above 2 applies; for a cell quantized
    in groups of `mult` (G128, G32...) or an adapter's `<dim>_multiple`, one to several multiples, at least three
    possible even where the default max_<dim> allows fewer, so that the scale of group g > 0 (along K and along N)
    is indexed at every scale: a scale read one group off is invisible with one group."""
    sp = span(adapter, dim, multiple=cell_mult)
    if sp.multiple <= 2:
        return edge_sizes(sp, lim(adapter, f"block_{dim}"))
    sp = span(adapter, dim, multiple=cell_mult, usual=max(3 * sp.multiple, lim(adapter, f"max_{dim}")))
    most = max(1, (sp.high or sp.low) // sp.multiple)
    return st.one_of(st.sampled_from(sorted({1, 2, 3})), st.integers(1, most)).map(lambda q: sp.fit(q * sp.multiple))


def draw(draw: st.DrawFn, adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    e = draw_experts(draw, adapter, cap=64)
    hidden = draw(_sizes(adapter, "K", _multiple(cell)))
    n = draw(_sizes(adapter, "N", _multiple(cell)))
    params: dict[str, Any] = {**_quant_params(adapter, cell), "values": draw(st.sampled_from(["random", "edges"]))}
    block = lim(adapter, "block_M")
    near = [v for v in gen.near_multiples((max(block // 2, 1), block)) if v <= block + 1]  # cheap: one block
    counts = [draw(st.sampled_from(near)) for _ in range(min(e, 4))] if draw(st.booleans()) else None
    if cell["format"] == "batched":
        t = draw(edge_sizes(span(adapter, "max_tokens"), block))
        if counts is not None:  # a few experts at and around multiples of the block and of its half
            e = experts_fitted(adapter, len(counts))
            counts += [0] * (e - len(counts))
            t, params["counts"] = span(adapter, "max_tokens").fit_up(max(counts) + 1), counts
        return {"shapes": {"E": e, "K": hidden, "N": n, "max_tokens": t}, "dtypes": {"x": cell["dtype"]},
                "params": params}
    k = 1 if yes(cell["apply_weight_on_input"]) else draw_top_k(draw, adapter, e)
    m = draw(_tokens(adapter, block, k))
    if counts is not None:  # a few experts' slot counts at and around multiples of the block, the rest filler
        while len(counts) > 1 and -(-sum(counts) // k) > adapter.limits.get("max_M", sum(counts)):
            counts.pop()  # no more slots than the rows of a declared max_M hold
        m, counts = rows_for_counts(adapter, "M", counts, k)
        e = experts_fitted(adapter, max(e, len(counts)))
        params["counts"] = counts + [0] * (e - len(counts))
    if yes(cell["expert_map"]):
        params.update(draw_map(draw, adapter, e))
    routing = draw(st.sampled_from(["random", "skewed", "one_expert", "some_empty"]))
    return {"shapes": {"M": m, "E": e, "k": k, "K": hidden, "N": n}, "dtypes": {"x": cell["dtype"]},
            "routing": routing, "params": params}


def _tokens(adapter: Adapter, block: int, k: int) -> st.SearchStrategy[int]:
    """M: edges of the block and of its half (a kernel may run half-height tiles for an expert's last block), and
    decode batches of at most 16 routed slots (kernels switch to a per-slot path there: ours, vLLM's). M = 0 and no
    local expert are boundary cases (their output is all zeros), never drawn."""
    sp = span(adapter, "M")
    return st.one_of(edge_sizes(sp, max(block // 2, 1)), edge_sizes(sp, block),
                     st.integers(min_value=1, max_value=max(1, min(16 // k, sp.high or 16))).map(sp.fit))


def boundary(adapter: Adapter, cell: Mapping[str, str]) -> list[dict[str, Any]]:
    found = []
    block = lim(adapter, "block_M")
    k_mult, n_mult = _multiples(adapter, cell)
    qparams = _quant_params(adapter, cell)
    # the last two are the deliberate vacuous cases (all-zero output): no token, and no local expert; E=257 with
    # k=1: every routed slot costs an interpreted kernel program per expert on the CPU (k=4 was 4x the slots)
    for m, e, k, hidden, n, rout in ((1, 4, 2, 32, 16, "random"), (block + 1, 8, 2, 65, 33, "some_empty"),
                                     (2 * block - 1, 257, 1, 16, 16, "random"), (9, 8, 8, 48, 24, "one_expert"),
                                     (0, 4, 2, 32, 16, "random"), (3, 4, 2, 32, 16, "random")):
        if e > lim(adapter, "max_E"):
            continue
        hidden, n = _fit(hidden, k_mult), _fit(n, n_mult)
        if rout == "some_empty" and k_mult > 2:  # several scale groups along K and N (G128: K = 384, N = 256)
            hidden, n = 3 * k_mult, 2 * n_mult
        if cell["format"] == "batched":
            if m == 0:
                continue
            found.append({"shapes": {"E": min(e, 16), "K": hidden, "N": n, "max_tokens": m},
                          "dtypes": {"x": cell["dtype"]}, "params": dict(qparams)})
            continue
        k = 1 if yes(cell["apply_weight_on_input"]) else k
        # under a map: half the experts local, every one (the identity map, a DP-only rank), or none
        local = {3: 0, 9: e}.get(m, e // 2)
        params = map_fields(adapter, e, local) if yes(cell["expert_map"]) else {}
        found.append({"shapes": {"M": m, "E": e, "k": k, "K": hidden, "N": n}, "dtypes": {"x": cell["dtype"]},
                      "routing": rout, "params": {**params, **qparams}})
    return found


# ------------------------------------------------------------------------------------------- value classes


def _small_dims(adapter: Adapter, cell: Mapping[str, str]) -> tuple[int, int]:
    """(K, N): the cheapest sizes of the cell, two groups along K where it is quantized in groups."""
    k_mult, n_mult = _multiples(adapter, cell)
    return (2 * k_mult if k_mult > 2 else _fit(32, k_mult)), _fit(16, n_mult)


def _tokens_fields(adapter: Adapter, cell: Mapping[str, str], counts: list[int], params: dict[str, Any],
                   *, e: int | None = None) -> dict[str, Any]:
    """Case fields whose per-expert counts are `counts` (batched: the tokens of each local expert; standard: the
    slots of each global expert, `e` of them)."""
    hidden, n = _small_dims(adapter, cell)
    params = {**_quant_params(adapter, cell), **params}
    if cell["format"] == "batched":
        e = experts_fitted(adapter, len(counts))
        return {"shapes": {"E": e, "K": hidden, "N": n,
                           "max_tokens": span(adapter, "max_tokens").fit_up(max(counts) + 1)},
                "dtypes": {"x": cell["dtype"]}, "params": {**params, "counts": counts + [0] * (e - len(counts))}}
    k = 1 if yes(cell["apply_weight_on_input"]) else 2
    designed = len(counts)
    m, counts = rows_for_counts(adapter, "M", counts, k)
    if yes(cell["expert_map"]) and params.get("map") == "contiguous":  # the counts move with the map's range
        e, counts = centred_counts(adapter, counts, params["local_experts"], max(e or 0, designed))
    e = experts_fitted(adapter, max(e or 0, len(counts)))
    counts = counts + [0] * (e - len(counts))
    if yes(cell["expert_map"]):
        params.update(map_fields(adapter, e, params.get("local_experts", e), params.get("map", "random")))
    return {"shapes": {"M": m, "E": e, "k": k, "K": hidden, "N": n}, "dtypes": {"x": cell["dtype"]},
            "params": {**params, "counts": counts}}


def _zero_rows_fields(adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    return _tokens_fields(adapter, cell, [3, 2, 4, 1], {"values": "edges"})


def _zero_rows_present(case: Case, inputs: Mapping[str, torch.Tensor]) -> bool:
    x = inputs["x"].reshape(-1, inputs["x"].shape[-1])
    mult = _multiple(case.features)
    return gen.has_zero_unit(x, mult if mult > 2 else x.shape[1])


def _block_counts_fields(adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    """Counts at and around multiples of the block and of its half (the split tail's tile); under an expert map a
    contiguous range of 6 local experts among 10, the first and last of them routed, the second empty; the batched
    format's rows past each count poisoned (always)."""
    counts = gen.near_multiples((lim(adapter, "block_M") // 2, lim(adapter, "block_M")))[1:-1]
    if cell["format"] != "batched" and yes(cell["expert_map"]):
        b = lim(adapter, "block_M") // 2
        return _tokens_fields(adapter, cell, [5, 3, b, 0, b + 1, 2 * b - 1, 2 * b + 1, 2 * b, 4, 1],
                              {"local_experts": 6, "map": "contiguous"})
    return _tokens_fields(adapter, cell, counts + ([0] if cell["format"] == "batched" else []), {})


def _block_counts_present(case: Case, inputs: Mapping[str, torch.Tensor]) -> bool:
    if _batched(case):
        counts, poisoned = inputs["expert_num_tokens"], _poisoned_padding(case, inputs)
    else:
        ids = inputs["topk_ids"].cpu().long()
        if "expert_map" in inputs:
            if not ends_routed(inputs["topk_ids"], inputs["expert_map"]):
                return False
            ids = inputs["expert_map"].cpu().long()[ids]
        counts, poisoned = torch.bincount(ids[ids >= 0].reshape(-1)), True
    # the case is built around its adapter's block_M, which this check cannot see: any power-of-two block of a
    # GEMM's rows (32 on our kernels' interpreter) and its half (the split tail's tile)
    return poisoned and any(near_multiple_counts(counts, b) and near_multiple_counts(counts, b // 2)
                            for b in (16, 32, 64, 128))


def _tensor_scale_fields(adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    return _tokens_fields(adapter, cell, [3, 1, 0, 2], {})


def _poisoned_padding(case: Case, inputs: Mapping[str, torch.Tensor]) -> bool:
    """Rows past the counts whose values dwarf the valid rows' (any statistic over them moves)."""
    x = inputs["x"].detach().cpu().float().abs()
    past = torch.arange(x.shape[1])[None, :] >= inputs["expert_num_tokens"].cpu()[:, None].long()
    return bool(past.any()) and float(x[past].amax()) > 16 * float(x[~past].amax())


def _order_fields(adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    return {"shapes": {"M": 6, "E": 6, "k": 4, "K": 32, "N": 16}, "dtypes": {"x": cell["dtype"]},
            "params": {"values": "order"}}


def _order_present(case: Case, inputs: Mapping[str, torch.Tensor]) -> bool:
    """Some token takes two mirrored experts and a slot weighted 2^24 or more below them."""
    ids, w = inputs["topk_ids"].cpu(), inputs["topk_weights"].cpu()
    mirrored = bool(torch.equal(inputs["w2"][1].cpu(), -inputs["w2"][0].cpu()))
    pair = (ids == 0).any(dim=1) & (ids == 1).any(dim=1)
    spread = w.amax(dim=1) >= 2.0**24 * w.amin(dim=1)
    return mirrored and bool((pair & spread).any())


def _zero_weights_fields(adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    """Router weights of exactly 0 (`inputs.zero_weights`: whole rows and single slots), as saturated sigmoids,
    masked or padded slots and EP dispatch leave them."""
    return _tokens_fields(adapter, cell, [3, 2, 4, 1], {"values": "zero_weights"})


def _zero_weights_present(case: Case, inputs: Mapping[str, torch.Tensor]) -> bool:
    return "topk_weights" in inputs and gen.has_zero_weights(inputs["topk_weights"])


#: the many-experts class: E past 255 (ids that int8 and uint8 wrap), with the top-k of DeepSeek-V3
MANY_E, MANY_K = 384, 8


def _many_experts_fields(adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    """E = 384, top-k 8, two tokens: 16 routed slots (a decode batch: the kernels' per-slot path), ids drawn at
    random across the experts, so past 127 and 255."""
    hidden, n = _small_dims(adapter, cell)
    k = 1 if yes(cell["apply_weight_on_input"]) else MANY_K
    e = span(adapter, "E").fit_up(MANY_E)
    params = map_fields(adapter, e, e // 2) if yes(cell["expert_map"]) else {}
    return {"shapes": {"M": 2, "E": e, "k": k, "K": hidden, "N": n}, "dtypes": {"x": cell["dtype"]},
            "routing": "random", "params": {**params, **_quant_params(adapter, cell)}}


def _many_experts_present(case: Case, inputs: Mapping[str, torch.Tensor]) -> bool:
    return "topk_ids" in inputs and bool((inputs["topk_ids"] > 255).any())


#: the most routed slots of a decode batch: kernels run one program per slot up to there (ours, vLLM's)
DECODE_SLOTS = 16


def _nonlocal_decode_fields(adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    """A decode batch (8 routed slots) in which every one of 8 experts is routed once and half of them are not
    local: slots whose expert the map sends to -1 beside local ones, on the kernels' per-slot path."""
    return _tokens_fields(adapter, cell, [1] * 8, {"local_experts": 4}, e=8)


def _nonlocal_decode_present(case: Case, inputs: Mapping[str, torch.Tensor]) -> bool:
    """At most DECODE_SLOTS routed slots, some of a local expert and some of one the map sends to -1."""
    ids = inputs.get("topk_ids")
    if ids is None or "expert_map" not in inputs or not 0 < ids.numel() <= DECODE_SLOTS:
        return False
    local = inputs["expert_map"].detach().cpu().long()[ids.detach().cpu().long()]
    return bool((local < 0).any() and (local >= 0).any())


def _nonlocal_decode_applies(adapter: Adapter, cell: Mapping[str, str]) -> bool:
    return cell["format"] == "standard" and yes(cell["expert_map"]) and expert_maps(adapter) != "identity"


def _w8a8(cell: Mapping[str, str]) -> bool:
    return cell.get("quant_type") in ("fp8_w8a8", "int8_w8a8")


SUMMATION_ORDER = ValueClass(
    "summation_order", lambda a, c: c["format"] == "standard" and c["quant_type"] == "none"
    and not yes(c["expert_map"]) and not yes(c["apply_weight_on_input"]), (), _order_fields, _order_present)
ZERO_ROWS = ValueClass("zero_rows", lambda a, c: _w8a8(c), ("quant_format",), _zero_rows_fields, _zero_rows_present)
BLOCK_COUNTS = ValueClass("block_counts", lambda a, c: True, ("format", "expert_map"), _block_counts_fields,
                          _block_counts_present)
ZERO_WEIGHTS = ValueClass("zero_weights", lambda a, c: c["format"] == "standard", ("apply_weight_on_input",),
                          _zero_weights_fields, _zero_weights_present)
#: unquantized cells only: the ids are what it is about, and 384 experts' quantized weights cost seconds on a CPU
MANY_EXPERTS = ValueClass("many_experts", lambda a, c: c["format"] == "standard" and c["quant_type"] == "none"
                          and lim(a, "max_E") >= MANY_E, (), _many_experts_fields, _many_experts_present, sized=True)
#: EP dispatch at decode: slots of non-local experts (-1 after the map) on the per-slot path, which must neither
#: read expert -1's weights nor add its router weight's share
NONLOCAL_DECODE_SLOTS = ValueClass("nonlocal_decode_slots", _nonlocal_decode_applies, ("apply_weight_on_input",),
                                   _nonlocal_decode_fields, _nonlocal_decode_present)
#: rows past the counts beside a statistic over rows (the per-tensor activation scale)
PADDING_UNDER_TENSOR_SCALE = ValueClass(
    "padding_rows_under_a_tensor_scale", lambda a, c: c["format"] == "batched" and _w8a8(c)
    and c["quant_format"] == "T", ("quant_type",), _tensor_scale_fields, _poisoned_padding)


def input_elements(case: Case) -> int:
    """The elements of the weights and the tokens (the rest is smaller), as `make_inputs` builds them."""
    e_local = case.params.get("local_experts", case.shape("E"))
    hidden, n = case.shape("K"), case.shape("N")
    tokens = case.shape("E") * case.shape("max_tokens") if _batched(case) else case.shape("M")
    return e_local * 3 * n * hidden + tokens * hidden


SPECS = {"experts": OpSpec(name="experts", title="Fused experts", axes=AXES, make_inputs=make_inputs, outputs=outputs,
                           expected=expected, draw=draw, boundary=boundary, inapplicable=xq.inapplicable,
                           value_classes=(ZERO_ROWS, BLOCK_COUNTS, PADDING_UNDER_TENSOR_SCALE, SUMMATION_ORDER,
                                          ZERO_WEIGHTS, MANY_EXPERTS, NONLOCAL_DECODE_SLOTS),
                           input_elements=input_elements, stages=stages, class_inputs=unquantized_inputs)}
