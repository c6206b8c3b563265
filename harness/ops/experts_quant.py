"""Quantized schemes of the `experts` op: the quant_type x quant_format cells, their inputs, and their error terms.

A scheme fixes three recipes (reference.quant.QuantRecipe): the weights' (quantized by the harness ahead of time,
per expert), the activations' (quantized dynamically by the kernel before GEMM1) and the intermediate's
(re-quantization of the activation output before GEMM2), the last two None for weight-only (a16) schemes.
An adapter adjusts the activation convention with `conventions["act_quant"]` (QuantRecipe fields, e.g.
{"scale_rule": "ue8m0", "eps": 1e-4, "application": "multiply_reciprocal"}) and the weights' with
`conventions["weight_quant"]` (copied into the case's params when it is drawn: weights are inputs); an `eps_dtype` of
`input` in either means x's dtype (the weights are drawn in it);
`conventions["weight_dequant_dtype"]` ("bfloat16"/"float16") says a weight-only kernel rounds dequantized weights
to that dtype before its MMA, `conventions["weight_scale_dtype"]` that it takes the scales in that dtype (rounded).

Kernel inputs (codes in the dtype a kernel takes, scales stacked over the local experts E):
  w13, w2             fp8: torch.float8_e4m3fn; int8: int8; w8a16: uint8; w4a16/mxfp4/nvfp4: uint8, two codes a byte
                      along K; mxfp8: float8_e4m3fn
  w13_scale, w2_scale T: [E]; A: [E, rows, 1]; G128 (fp8 block): [E, ceil(rows/128), ceil(K/128)];
                      G128 (weight-only): [E, rows, K/128]; G32 (MX): uint8 e8m0 [E, rows, K/32];
                      G16 (NVFP4): uint8 e4m3 [E, rows, K/16]
  w13_zp, w2_zp       *_zp schemes: uint8 [E, rows/2, G] (w4a16, packed along rows) or [E, rows, G] (w8a16)
  w13_global_scale, w2_global_scale   nvfp4: fp32 [E] (quant-side convention)
  a13_global_scale, a2_global_scale   nvfp4: fp32 0-d static activation global scales (calibrated on these inputs)

Error model of a re-quantized intermediate (fp8/int8, exact): the kernel's activation a' lies within e_a of the
oracle's a; the unit's scale lies between the scales of amax -/+ max(e_a); the dequantized value of a' is then
bracketed by quantizing a -/+ (e_a + |a| * scale slack) with each candidate scale (rounding is monotone), so an
element away from a rounding boundary contributes no error at all. MX/NVFP4 intermediates (two-level scales) use a
looser bound: one code step at the element's magnitude, with the scale possibly doubled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from harness.core import inputs as gen
from harness.core.case import Case
from harness.ops.group_quant import _midpoints  # the group_quant op's ties, one definition
from reference import experts as ref
from reference.quant import (
    QuantDtype,
    QuantizedTensor,
    QuantRecipe,
    QuantUnit,
    dequantize,
    quantize,
    resolve_eps,
    scale_from_amax,
)
from reference.scales import ScaleLayout

QUANT_TYPES = ("none", "fp8_w8a8", "int8_w8a8", "w8a16", "w8a16_zp", "w4a16", "w4a16_zp", "mxfp8", "mxfp4_a16",
               "mxfp4_a8", "nvfp4")
QUANT_FORMATS = ("-", "T", "A", "G128", "G32", "G16")

#: the quant formats each quant type comes in
FORMATS_OF: dict[str, tuple[str, ...]] = {
    "none": ("-",), "fp8_w8a8": ("T", "A", "G128"), "int8_w8a8": ("T", "A"),
    "w8a16": ("A", "G128"), "w8a16_zp": ("G128",), "w4a16": ("A", "G128"), "w4a16_zp": ("G128",),
    "mxfp8": ("G32",), "mxfp4_a16": ("G32",), "mxfp4_a8": ("G32",), "nvfp4": ("G16",),
}

_UNIT = {"T": {"unit": "tensor"}, "A": {"unit": "row"}}


#: the experts op's activation axis: value -> the oracle's activation (the op spec imports it from here)
ACTIVATIONS = {"silu": "silu_and_mul", "gelu": "gelu_and_mul", "swigluoai": "swigluoai",
               "silu_no_mul": "silu_no_mul", "gelu_no_mul": "gelu_no_mul"}

@dataclass(frozen=True)
class Scheme:
    weight: QuantRecipe
    act: QuantRecipe | None
    #: whether the weights' K must be a multiple of the group (no ragged last group)
    k_multiple: int = 1


def inapplicable(cell: Mapping[str, str]) -> str | None:
    qt, qf = cell.get("quant_type", "none"), cell.get("quant_format", "-")
    if qf not in FORMATS_OF.get(qt, ()):
        return f"quant_type {qt} has no quant_format {qf}"
    if qt != "none" and cell.get("dtype") == "float32":
        return "quantized schemes take bf16/fp16 activations"
    return None


def scheme(case: Case, conventions: Mapping[str, Any]) -> Scheme | None:
    """The recipes of the case's cell with the adapter's conventions applied (None: unquantized), each eps resolved
    by its `eps_dtype` (`input`: x's dtype, the weights' too: they are drawn in it)."""
    sch = _scheme(case, conventions)
    if sch is None or all(r is None or r.eps_dtype.value == "float32" for r in (sch.weight, sch.act)):
        return sch
    dt = case.dtype("x")
    return replace(sch, weight=resolve_eps(sch.weight, dt), act=None if sch.act is None else resolve_eps(sch.act, dt))


def _scheme(case: Case, conventions: Mapping[str, Any]) -> Scheme | None:
    qt, qf = case.features.get("quant_type", "none"), case.features.get("quant_format", "-")
    if qt == "none":
        return None
    act_over = dict(conventions.get("act_quant", case.params.get("act_quant", {})))
    w_over = dict(case.params.get("weight_quant", {}))
    if qt in ("fp8_w8a8", "int8_w8a8"):
        dt = "fp8_e4m3fn" if qt == "fp8_w8a8" else "int8"
        if qf == "G128":
            w = {"unit": "block", "group_size": 128, "block_rows": 128, "ragged_k": True}
            a = {"unit": "group", "group_size": 128}
            k_mult = 128
        else:
            w, a, k_mult = _UNIT[qf], _UNIT[qf], 1
        return Scheme(QuantRecipe(dtype=dt, **{**w, **w_over}), QuantRecipe(dtype=dt, **{**a, **act_over}), k_mult)
    if qt.startswith(("w8a16", "w4a16")):
        dt = qt.removesuffix("_zp")
        unit = {"unit": "row"} if qf == "A" else {"unit": "group", "group_size": 128}
        w = QuantRecipe(dtype=dt, zero_point=qt.endswith("_zp"), **{**unit, **w_over})
        return Scheme(w, None, 128 if qf == "G128" else (2 if dt == "w4a16" else 1))
    if qt == "nvfp4":
        return Scheme(QuantRecipe.nvfp4(**w_over), QuantRecipe.nvfp4(**act_over), 16)
    wdt = "mxfp8" if qt == "mxfp8" else "mxfp4"
    act = None if qt == "mxfp4_a16" else QuantRecipe.mx("mxfp8", **act_over)
    return Scheme(QuantRecipe.mx(wdt, **w_over), act, 32)


def _code_view(codes: torch.Tensor, recipe: QuantRecipe) -> torch.Tensor:
    """Oracle codes (uint8 bit patterns) -> the dtype kernels take."""
    if recipe.dtype in (QuantDtype.FP8_E4M3FN, QuantDtype.MXFP8):
        return codes.view(torch.float8_e4m3fn)
    return codes


def _oracle_codes(codes: torch.Tensor) -> torch.Tensor:
    return codes.view(torch.uint8) if codes.dtype == torch.float8_e4m3fn else codes


def tie_rows(case: Case, x: torch.Tensor) -> None:
    """w8a8 cells: the even rows of x (in place) hold exact ties of the dynamic activation quantization. Each
    unit's amax is 1.75 * qmax * 2^e, so its scale is exactly 1.75 * 2^e (a divisor with an inexact reciprocal),
    and its other elements are that scale times a value halfway between two codes. A correctly rounded x / scale
    lands on the tie (rounded to even); an approximate divide (x * (1 / scale), a fast division) lands an ulp off
    and takes the other code, which random rows show about once in a thousand elements. Exact in bf16/fp16 (at
    most 8 significant bits), but for int8 in bf16 (1.75 * 127 needs 10): left random there."""
    qt, qf = case.features.get("quant_type", "none"), case.features.get("quant_format", "-")
    if qt not in ("fp8_w8a8", "int8_w8a8") or x.numel() == 0 or (qt == "int8_w8a8" and x.dtype != torch.float16):
        return
    qd, qmax, e = ("int8", 127.0, -5) if qt == "int8_w8a8" else ("fp8_e4m3fn", 448.0, -7)
    flat = x.view(-1, x.shape[-1])
    r, k = flat.shape
    seg = 128 if qf == "G128" else k
    g = gen.generator(case, "x_ties")
    sign = torch.where(torch.rand((r, k), generator=g) < 0.5, -1.0, 1.0)
    # peaks about 6 and 7: above any randn row, so that a per-tensor amax is a peak too
    vals = sign * _midpoints(qd, (r, k), g, int8_below=16) * 1.75 * 2.0**e
    starts = torch.arange(0, k, seg)
    # one peak in each group (a ragged last group of G128 is narrower)
    peak = torch.randint(0, seg, (r, len(starts)), generator=g) % (k - starts).clamp(max=seg) + starts
    vals.scatter_(1, peak, sign.gather(1, peak) * qmax * 1.75 * 2.0**e)
    flat[0::2] = vals[0::2].to(x.dtype)


def quantize_weights(found: dict[str, torch.Tensor], sch: Scheme, device: str) -> None:
    """Replace found['w13'], found['w2'] (float) by their codes and add the scale inputs, per expert.

    Quantized where the weights are: the oracle's quantizer is exact on any device (the same codes), and on a GPU
    machine a judge has one CPU thread while its large cases' weights are built on the GPU."""
    for name in ("w13", "w2"):
        w = found[name].float()
        if not w.shape[0]:  # no local experts: empty tensors with the shapes one expert would have
            one = quantize(torch.zeros(w.shape[1:], device=w.device), sch.weight)
            found[name] = _code_view(one.codes, sch.weight)[None][:0].to(device)
            found[f"{name}_scale"] = one.scales[None][:0].to(device)
            continue
        q = _quantized_per_expert(w, sch.weight)
        found[name] = _code_view(q.codes, sch.weight).to(device)
        found[f"{name}_scale"] = q.scales.to(device)
        if sch.weight.zero_point:
            found[f"{name}_zp"] = q.zero_points.to(device)
        if sch.weight.dtype == QuantDtype.NVFP4:
            found[f"{name}_global_scale"] = q.global_scale.to(device)


#: elements per oracle call when experts' weights are quantized together: small experts go several to a call (a
#: call's own cost is most of a small expert's), large ones one to a call (a call's temporaries stay in cache: all
#: 257 experts of 256 x 128 at once took 5x as long as one by one)
BATCH_ELEMENTS = 1 << 16


def _quantized_per_expert(w: torch.Tensor, recipe: QuantRecipe) -> QuantizedTensor:
    """Each expert's weight w[e] quantized on its own, stacked along a leading E. A row's, a K group's or a row
    block's scale never spans two experts (the oracle takes E as a batch dimension), so those quantize several
    experts per call, up to `BATCH_ELEMENTS`: the same codes and scales as one call per expert, in a fifth of the
    time on the quick matrix's small shapes. A tensor unit and NVFP4's global scale cover the whole tensor, and
    other scale layouts take a 2-D weight: those go one expert per call."""
    if recipe.unit != QuantUnit.TENSOR and recipe.dtype != QuantDtype.NVFP4 and recipe.layout == ScaleLayout.ROW_MAJOR:
        step = max(1, BATCH_ELEMENTS // max(1, w[0].numel()))
        parts, join = [w[i:i + step] for i in range(0, w.shape[0], step)], torch.cat  # each part keeps its E
    else:
        parts, join = list(w), torch.stack
    qs = [quantize(p, recipe) for p in parts]
    joined = {f: None if getattr(qs[0], f) is None else join([getattr(q, f) for q in qs])
              for f in ("codes", "scales", "global_scale", "zero_points")}
    return QuantizedTensor(recipe=recipe, shape=tuple(w.shape), **joined)


def calibrate_act_global_scales(case: Case, found: dict[str, torch.Tensor], sch: Scheme) -> None:
    """NVFP4: static activation global scales from these inputs' amax (x) and the unquantized intermediate's."""
    if sch.act is None or sch.act.dtype != QuantDtype.NVFP4:
        return
    from reference.quant import _nvfp4_global  # the convention's formula, one place

    quant = to_experts_quant(found, sch)
    x = found["x"]
    rows = x.reshape(-1, x.shape[-1]).float().cpu()
    a = _unquantized_intermediate(case, found, quant)
    found["a13_global_scale"] = _nvfp4_global(rows.abs().amax() if rows.numel() else torch.tensor(0.0),
                                              sch.act).to(x.device)
    found["a2_global_scale"] = _nvfp4_global(a.abs().amax().float() if a.numel() else torch.tensor(0.0),
                                             sch.act).to(x.device)


def _unquantized_intermediate(case: Case, found: Mapping[str, torch.Tensor], quant: ref.ExpertsQuant) -> torch.Tensor:
    w13, w2 = quant.dequantized_weights(torch.device("cpu"))
    x = found["x"].cpu().double()  # unquantized: no rounding of the activation matters for a calibration
    if x.dim() == 3:
        x = x.reshape(-1, x.shape[-1])
        ids = torch.arange(w13.shape[0]).repeat_interleave(found["x"].shape[1])[:, None]
        return ref.expert_intermediates(x, w13, w2, torch.ones_like(ids, dtype=torch.float32), ids,
                                        activation=_activation(case), compute_dtype=torch.float64).a
    return ref.expert_intermediates(x, w13, w2, found["topk_weights"].cpu(), found["topk_ids"].cpu(),
                                    activation=_activation(case),
                                    expert_map=found["expert_map"].cpu() if "expert_map" in found else None,
                                    compute_dtype=torch.float64).a


def _activation(case: Case) -> str:
    return ACTIVATIONS[case.features["activation"]]


def to_experts_quant(inputs: Mapping[str, torch.Tensor], sch: Scheme, *, requantize: bool = True) -> ref.ExpertsQuant:
    """The oracle's view of the quantized inputs: one QuantizedTensor per expert and the activation recipes
    (`requantize=False`: the intermediate stays unquantized, the `intermediate_quant=none` convention). The codes
    stay where the inputs are: the oracle dequantizes them there (exactly, on any device)."""
    per: dict[str, list[QuantizedTensor]] = {}
    logical: dict[str, tuple[int, int]] = {}
    for name in ("w13", "w2"):
        codes = _oracle_codes(inputs[name])
        scales = inputs[f"{name}_scale"]
        e = codes.shape[0]
        k = codes.shape[-1] * (2 if sch.weight.dtype in (QuantDtype.W4A16, QuantDtype.MXFP4, QuantDtype.NVFP4) else 1)
        shape = (codes.shape[1], k)
        logical[name] = shape
        per[name] = [QuantizedTensor(
            codes=codes[i], scales=scales[i], recipe=sch.weight, shape=shape,
            global_scale=inputs[f"{name}_global_scale"][i] if f"{name}_global_scale" in inputs else None,
            zero_points=inputs[f"{name}_zp"][i] if f"{name}_zp" in inputs else None) for i in range(e)]
    gs = {}
    if "a13_global_scale" in inputs:
        gs = {"act_global_scale": inputs["a13_global_scale"],
              "intermediate_global_scale": inputs["a2_global_scale"]}
    return ref.ExpertsQuant(per["w13"], per["w2"], act=sch.act, intermediate=sch.act if requantize else None,
                            expert_shapes=(logical["w13"], logical["w2"]), **gs)


# ------------------------------------------------------------------------------------------------- error model


def requant_error(a: torch.Tensor, e_a: torch.Tensor, recipe: QuantRecipe, valid: torch.Tensor,
                  global_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Bound on |dequant(quant(a')) - dequant(quant(a))| for any a' with |a' - a| <= e_a (rows [R, N], float64).

    Rows outside `valid` are zero (no activation). See the module docstring for the method. This is the two
    terms of `requant_terms` added per element (the scale movement paid on |dequant(quant(a))|); a caller that
    multiplies the re-quantized rows by a matrix can instead pay the scale term on the signed dot (`requant_terms`).
    """
    e_code, rel = requant_terms(a, e_a, recipe, valid, global_scale)
    if recipe.dtype not in (QuantDtype.FP8_E4M3FN, QuantDtype.INT8) or not bool(valid.any()):
        return e_code
    d = torch.zeros_like(a)
    d[valid] = dequantize(quantize(a[valid].float(), replace(recipe, layout="row_major")), torch.float64)
    return e_code + d.abs() * rel


def requant_terms(a: torch.Tensor, e_a: torch.Tensor, recipe: QuantRecipe, valid: torch.Tensor,
                  global_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The two parts of a kernel's re-quantization error, for any a' with |a' - a| <= e_a (rows [R, N], float64).

    With s, q the oracle's scale and code of an element and s', q' the kernel's,
        dequant' - dequant = (q' - q) s' + q (s' - s).
    Returns (e_code, rel), both [R, N]: e_code bounds |q' - q| s' per element (zero unless a' may cross a code
    boundary: the exact code range of a' / s' over the box of a' and s' is taken), rel bounds |s' - s| / s, the
    same for every element of a quantization unit (row, group, tensor): the second part is rel times the unit's
    own dequantized values, one signed factor for the whole unit. Rows outside `valid` are zero. MX/NVFP4
    (two-level scales): one code step per element, rel = 0.
    """
    e_code, rel = torch.zeros_like(a), torch.zeros_like(a)
    if not bool(valid.any()):
        return e_code, rel
    av, ev = a[valid], e_a[valid]
    if recipe.dtype in (QuantDtype.FP8_E4M3FN, QuantDtype.INT8):
        e_code[valid], rel[valid] = _bracketed(av, ev, recipe)
    else:
        e_code[valid] = _one_step(av, ev, recipe)
    return e_code, rel


def _units(t: torch.Tensor, recipe: QuantRecipe) -> torch.Tensor:
    """Per-unit max of t [R, N] in the unit's logical scale shape ([] tensor, [R, 1] row, [R, G] group)."""
    if recipe.unit == QuantUnit.TENSOR:
        return t.amax()
    if recipe.unit == QuantUnit.ROW:
        return t.amax(dim=1, keepdim=True)
    g = recipe.group_size
    pad = (-t.shape[1]) % g
    tp = torch.nn.functional.pad(t, (0, pad))
    return tp.reshape(t.shape[0], -1, g).amax(dim=2)


def _expand(s: torch.Tensor, like: torch.Tensor, recipe: QuantRecipe) -> torch.Tensor:
    if recipe.unit in (QuantUnit.TENSOR, QuantUnit.ROW):
        return s.expand_as(like) if s.dim() else s.expand(like.shape)
    return s.repeat_interleave(recipe.group_size, dim=1)[:, : like.shape[1]]


def _code_values(t: torch.Tensor, recipe: QuantRecipe) -> torch.Tensor:
    """The code value (as a number, scale 1) each quotient t = a / s rounds to under `recipe` (float64)."""
    unit = replace(recipe, layout="row_major", application="divide")
    t32 = t.clamp(-1e30, 1e30).float()  # saturated either way; float32 has no inf to quantize
    ones = torch.ones_like(_units(t32.abs(), unit))
    return dequantize(quantize(t32, unit, scales=ones), torch.float64)


def _bracketed(a: torch.Tensor, e: torch.Tensor, recipe: QuantRecipe) -> tuple[torch.Tensor, torch.Tensor]:
    """(e_code, rel) of `requant_terms` for fp8/int8 (scales from each unit's amax)."""
    base = dequantize(quantize(a.float(), replace(recipe, layout="row_major")), torch.float64)
    amax = _units(a.abs(), recipe).float()
    amax_lo = _units((a.abs() - e).clamp_min(0), recipe).float()
    amax_hi = _units(a.abs() + e, recipe).float()
    # scales are monotone in amax: the kernel's s' lies in [s_lo, s_hi]
    s, s_lo, s_hi = (_expand(scale_from_amax(m, recipe), a, recipe).double() for m in (amax, amax_lo, amax_hi))
    q = base / s.clamp_min(1e-38)
    # a' / s' is monotone in a' and in s' (direction by sign): its range is spanned by the four corners; 2^-21
    # relative covers the kernel's form of the quotient (x * fp32(1 / s), qmax / amax factors: fp32 roundings)
    corners = [(a + side) / sc.clamp_min(1e-38) for side in (-e, e) for sc in (s_lo, s_hi)]
    t_lo = torch.minimum(torch.minimum(corners[0], corners[1]), torch.minimum(corners[2], corners[3]))
    t_hi = torch.maximum(torch.maximum(corners[0], corners[1]), torch.maximum(corners[2], corners[3]))
    q_lo = _code_values(t_lo - 2**-21 * t_lo.abs(), recipe)
    q_hi = _code_values(t_hi + 2**-21 * t_hi.abs(), recipe)
    # codes between the ends: monotone rounding keeps them between the ends' codes
    e_code = torch.maximum((q_lo - q).abs(), (q_hi - q).abs()) * s_hi + 2**-22 * a.abs()
    rel = torch.maximum(s_hi - s, s - s_lo) / s.clamp_min(1e-38)
    return e_code, rel


def _one_step(a: torch.Tensor, e: torch.Tensor, recipe: QuantRecipe) -> torch.Tensor:
    mant = 3 if recipe.dtype == QuantDtype.MXFP8 else 1  # e4m3 elements, else e2m1
    sub = 2.0**-9 if mant == 3 else 0.5
    amax = _units(a.abs(), recipe).double()
    # scales of MX are 2^(floor(log2 amax) - emax); NVFP4 effective scales are about amax / 6: bound both by amax
    s = _expand(amax, a, recipe) * (2.0**-8 if mant == 3 else 2.0**-2) * 2
    return 2 * (a.abs() * 2.0**-mant + sub * s) + e


