"""Op spec `group_quant`: dynamic quantization of activations per token group, per token or per tensor
(docs/SEMANTICS.md §2): 8-bit (fp8 e4m3fn, int8) with float or power-of-two fp32 scales, the MX formats (mxfp8,
mxfp4: groups of 32 along K with e8m0 scale codes) and NVFP4 (groups of 16, e4m3 block scales, a global scale).

Inputs: x [M, K] (bfloat16/float16/float32; any strides), finite (inputs with NaN/Inf are outside
the contract: the oracle raises on them, so they are never generated). NVFP4 cells add `global_scale`, a float32
0-d tensor g = fp32(amax(x) / (448 * 6)) (dequant side, correctly rounded; 1.0 for an all-zero x): the kernel
takes it as given (a dequant-side library, e.g. torchao's per_tensor_scale, uses g; a quant-side one 1 / g, which
the oracle then forms as fp32(1 / g)).

Outputs:
- `codes` [M, K]: torch.float8_e4m3fn (fp8_e4m3fn, mxfp8) or int8, contiguous; mxfp4 and nvfp4: uint8 [M, K/2],
  two e2m1 codes per byte (element 2i in the low nibble).
- `scales`: group unit: float32 [M, G] (G = K / group_size) as `row_major` (contiguous), `column_major` (strides
  (1, M)) or `column_major_tma` (strides (1, M_pad), M_pad = M rounded up to 4), or int32 [M, ceil(G/4)] with
  strides (1, M_pad) for `packed_ue8m0` (DeepGEMM: byte j of a word = e8m0 code of group 4p + j); token unit:
  float32 [M, 1]; tensor unit: float32 [1]. MX: uint8 [M, G] e8m0 codes (biased exponents), row-major (a kernel
  returning torch.float8_e8m0fnu hands back its uint8 view). NVFP4: uint8 e4m3 codes of the block scales, [M, G]
  row-major, or `swizzle_128x4` (cuBLASLt/CUTLASS: a contiguous uint8 [M rounded up to 128, G rounded up to 4],
  padding 0, reference.scales.swizzle_128x4).

MX cells (quant_dtype mxfp8/mxfp4) take group size 32 and the scale rule `ocp_floor` (OCP: 2^(floor(log2 amax) -
emax_elem)) or `ue8m0` (amax / qmax rounded up to a power of two: torchao's RCEIL; eps, scale_formula and
ue8m0_form say how). Their scales are powers of two, so they are always judged exactly (codes and scale codes).
NVFP4 cells take group size 16 and the `float` rule; the conventions global_scale, nvfp4_scale_form,
nvfp4_block_floor, e2m1_ties, scale_formula and application say how the library forms the block scale and scales x;
they are judged exactly.

Padding contract: the rows M..M_pad-1 of the TMA-aligned and packed storages lie outside the [M, *] views the
kernel writes through, so they are not part of the contract (vLLM allocates them with empty_strided and never
writes them; a GEMM reading them only produces rows that are discarded). Inside a packed word, the bytes of
groups past G *are* part of the contract and must be 0 (compared exactly with the rest of the word).
M = 0 is a valid call: nothing is written except the per-tensor scale, which is the scale of amax = 0.

Judging (the oracle is reference.quant.quantize with a QuantRecipe built from the cell and the adapter's
`conventions`: CONVENTION_KEYS, e.g. eps, eps_dtype, scale_formula, application, e2m1_negative_zero):
- codes: `exact` (bitwise; fp8 codes as bytes - the oracle never produces NaN codes from finite inputs, so any
  NaN code, whatever its pattern, is a mismatch).
- scales: `exact` (bitwise) for power-of-two (ue8m0) scales, packed words, and float scales whenever the adapter
  states its `scale_formula` (the oracle then computes the same correctly rounded formula). An adapter that does
  not state it (or states `scale_ulps` > 0: approximate division, e.g. Triton's fp32 `/` on GPU) gets its float
  scales judged within `scale_ulps` ulps (default 1: `amax / qmax` and `amax * (1/qmax)` differ by at most one)
  of the oracle's - ue8m0 scales within the round-up of that interval - and its codes judged exactly against the
  oracle's quantization of x with the kernel's *own* scales, so the codes stay bit-exact.
- `division="approximate"` (fp32 `/` lowered to an approximate divide, as Triton does on the GPU: div.full.f32,
  within 2 ulp): scales within 2 ulp unless `scale_ulps` says otherwise, and each code must be one that a quotient
  x / s (with the kernel's own s) off by that error can round to: where the exact quotient lies within the error
  of a rounding boundary either neighbouring code is accepted, everywhere else the code is exact. On the
  interpreter, which divides exactly, the kernel's codes are simply the exact ones, so the cell stays verifiable.
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
from harness.core.compare import compare_exact
from harness.core.sizes import edge_sizes, span
from harness.ops.base import Axis, Check, OpSpec, OutputSpec, ValueClass
from harness.ops.common import by_rows, custom, lim, row_subset
from harness.registry import Adapter, Unsupported
from reference import formats
from reference.quant import QuantRecipe, QuantUnit, logical_scales, quantize, scale_from_amax, unit_amax
from reference.scales import EpsPlacement, ScaleLayout, ScaleRule, Ue8m0Form, from_layout, ue8m0_round_up

QUANT_DTYPES = ("fp8_e4m3fn", "int8", "mxfp8", "mxfp4", "nvfp4")
#: the MX element types: groups of 32, e8m0 scale codes
MX_DTYPES = ("mxfp8", "mxfp4")
UNITS = ("group", "token", "tensor")
GROUP_SIZES = ("128", "64", "32", "16", "-")
SCALE_RULES = ("float", "ue8m0", "ocp_floor")
LAYOUTS = ("row_major", "column_major", "column_major_tma", "packed_ue8m0", "swizzle_128x4")
#: the element types whose codes are e2m1 packed two per byte along K
FP4_DTYPES = ("mxfp4", "nvfp4")
INPUT_DTYPES = ("bfloat16", "float16", "float32")
AXES = (
    Axis("quant_dtype", "Quant dtype", QUANT_DTYPES),
    Axis("unit", "Unit", UNITS),
    Axis("group_size", "Group size", GROUP_SIZES),
    Axis("scale_rule", "Scale rule", SCALE_RULES),
    Axis("scale_layout", "Scale layout", LAYOUTS),
    Axis("input_dtype", "Input dtype", INPUT_DTYPES),
)
#: adapter conventions mapped onto QuantRecipe fields (the rest of the recipe comes from the cell)
CONVENTION_KEYS = ("eps", "eps_placement", "scale_formula", "application", "int8_rounding", "ue8m0_clamp",
                   "ue8m0_form", "eps_dtype", "global_scale", "nvfp4_scale_form", "nvfp4_block_floor", "e2m1_ties",
                   "e2m1_negative_zero")
_CODE_DTYPES = {"fp8_e4m3fn": torch.float8_e4m3fn, "int8": torch.int8, "mxfp8": torch.float8_e4m3fn,
                "mxfp4": torch.uint8, "nvfp4": torch.uint8}
_QMAX = {"fp8_e4m3fn": 448.0, "int8": 127.0, "mxfp8": 448.0, "mxfp4": 6.0, "nvfp4": 6.0}
_NVFP4_RANGE = 448.0 * 6.0
_UNIT = {"group": QuantUnit.GROUP, "token": QuantUnit.ROW, "tensor": QuantUnit.TENSOR}
#: kinds of segments (a unit's elements within a row) in the `special` input pattern. `ties_scaled`: rounding
#: ties under a scale of 1.75 * 2^e (not a power of two), where x / s is exactly a tie but x * (1 / s) is often
#: not (fl(1/1.75) is 2^-24 off), so the two scale applications give different codes (a power-of-two scale, or
#: 1.5 or 1.25, cannot tell them apart).
KINDS = ("random", "zero", "tiny", "at_qmax", "ties", "large", "ties_scaled")


def inapplicable(cell: Mapping[str, str]) -> str | None:
    unit, gs = cell["unit"], cell["group_size"]
    if cell["quant_dtype"] in MX_DTYPES:
        if unit != "group" or gs != "32":
            return "MX formats scale groups of 32 along K"
        if cell["scale_rule"] == "float":
            return "MX scales are e8m0 powers of two: the ocp_floor or ue8m0 rule"
        if cell["scale_layout"] not in ("row_major", "swizzle_128x4"):
            return "MX e8m0 scale codes are stored row-major or swizzled (128x4)"
        return None
    if cell["quant_dtype"] == "nvfp4":
        if unit != "group" or gs != "16":
            return "NVFP4 scales groups of 16 along K"
        if cell["scale_rule"] != "float":
            return "NVFP4 block scales are e4m3 values: the float rule"
        if cell["scale_layout"] not in ("row_major", "swizzle_128x4"):
            return "NVFP4 e4m3 block scales are stored row-major or swizzled (128x4)"
        return None
    if cell["scale_layout"] == "swizzle_128x4":
        return "the 128x4 swizzle is a layout of MX / NVFP4 block scale codes"
    if cell["scale_rule"] == "ocp_floor":
        return "the OCP floor rule is the MX formats' scale rule"
    if unit == "group" and gs == "-":
        return "the group unit needs a group size"
    if unit != "group" and gs != "-":
        return f"the {unit} unit has no group size"
    if unit != "group" and cell["scale_layout"] != "row_major":
        return f"one scale per {unit}: the column-major and packed layouts are layouts of group scales"
    packed = cell["scale_layout"] == "packed_ue8m0"
    if packed and (cell["scale_rule"] != "ue8m0" or cell["quant_dtype"] != "fp8_e4m3fn"):
        return "packed_ue8m0 holds e8m0 exponents of fp8 scales: it needs fp8 and the ue8m0 rule"
    return None


def recipe(features: Mapping[str, str], conventions: Mapping[str, Any] | None = None) -> QuantRecipe:
    """The oracle's QuantRecipe for a cell under an adapter's conventions."""
    conventions = conventions or {}
    unit = features["unit"]
    kw = {k: conventions[k] for k in CONVENTION_KEYS if conventions.get(k) is not None}
    if features["quant_dtype"] in MX_DTYPES:
        return QuantRecipe.mx(features["quant_dtype"], scale_rule=features["scale_rule"],
                              layout=features["scale_layout"], **kw)
    if features["quant_dtype"] == "nvfp4":
        return QuantRecipe.nvfp4(layout=features["scale_layout"], **kw)
    return QuantRecipe(dtype=features["quant_dtype"], unit=_UNIT[unit],
                       group_size=int(features["group_size"]) if unit == "group" else 128,
                       scale_rule=features["scale_rule"],
                       layout=features["scale_layout"] if unit == "group" else ScaleLayout.ROW_MAJOR, **kw)


def num_groups(case: Case) -> int:
    f = case.features
    return case.shape("K") // int(f["group_size"]) if f["unit"] == "group" else 1


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def scale_output(features: Mapping[str, str], m: int, g: int) -> OutputSpec:
    """The scales' shape, dtype and contractual strides for a cell (module docstring)."""
    unit, layout = features["unit"], features["scale_layout"]
    if features["quant_dtype"] in (*MX_DTYPES, "nvfp4"):
        if layout == "swizzle_128x4":
            return OutputSpec((_round_up(m, 128), _round_up(g, 4)), torch.uint8)
        return OutputSpec((m, g), torch.uint8)
    if unit == "tensor":
        return OutputSpec((1,), torch.float32)
    if unit == "token":
        return OutputSpec((m, 1), torch.float32)
    if layout == "row_major":
        return OutputSpec((m, g), torch.float32)
    if layout == "column_major":
        return OutputSpec((m, g), torch.float32, (1, m))
    if layout == "column_major_tma":
        return OutputSpec((m, g), torch.float32, (1, _round_up(m, 4)))
    return OutputSpec((m, (g + 3) // 4), torch.int32, (1, _round_up(m, 4)))


def outputs(case: Case, inputs: Mapping[str, torch.Tensor]) -> dict[str, OutputSpec]:
    m, k = case.shape("M"), case.shape("K")
    qd = case.features["quant_dtype"]
    return {"codes": OutputSpec((m, k // 2 if qd in FP4_DTYPES else k), _CODE_DTYPES[qd]),
            "scales": scale_output(case.features, m, num_groups(case))}


# ---------------------------------------------------------------------------------------------------- inputs


def _segments(case: Case) -> tuple[int, int]:
    """(number of segments per row, segment length): the unit's extent along K (a whole row for token/tensor)."""
    k = case.shape("K")
    if case.features["unit"] == "group":
        gs = int(case.features["group_size"])
        return k // gs, gs
    return 1, k


#: the columns at the end of a row that `last_block` puts its amax in: a K block of the kernels' wide loops
LAST_BLOCK = 128


def _amax_in_last_block(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Each row's amax (4 times the rest's) at a random column of its last `LAST_BLOCK` columns, of either sign."""
    m, k = x.shape
    cols = k - 1 - torch.randint(0, min(LAST_BLOCK, k), (m,), generator=g)
    sign = torch.where(torch.rand(m, generator=g) < 0.5, -1.0, 1.0)
    x[torch.arange(m), cols] = sign * 4.0 * x.abs().amax(dim=1)
    return x


def _with_extremes(x: torch.Tensor, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """x [M, units, unit] with, in turn by row, one unit at the input dtype's largest finite value, one at its
    negation (each beside ordinary values) and one whose amax is the smallest normal, with subnormals beside it
    (multiples of tiny / 8: exact in every input dtype); the other units as they were."""
    info = torch.finfo(dtype)
    m, nseg, seg = x.shape
    for r in range(m):
        kind, unit = r % 4, (r // 4 + r) % nseg
        at = int(torch.randint(0, seg, (1,), generator=g))
        if kind in (0, 1):
            x[r, unit, at] = info.max if kind == 0 else -info.max
        elif kind == 2:
            x[r, unit] = torch.randint(-7, 8, (seg,), generator=g).to(torch.float32) * (info.tiny / 8)
            x[r, unit, at] = info.tiny
    return x


def _midpoints(quant_dtype: str, shape: tuple[int, ...], g: torch.Generator, int8_below: int = 127) -> torch.Tensor:
    """|values| exactly halfway between two adjacent codes below qmax (ties of the rounding)."""
    if quant_dtype == "int8":
        return torch.randint(0, int8_below, shape, generator=g).to(torch.float32) + 0.5
    if quant_dtype in FP4_DTYPES:
        table = formats.code_table(formats.FloatFormat.E2M1)
        c = torch.randint(0, 7, shape, generator=g)  # codes 0..6: c + 1 <= 7 (6)
        return (table[c] + table[c + 1]) / 2
    table = formats.code_table(formats.FloatFormat.E4M3FN)
    c = torch.randint(0, 0x7E, shape, generator=g)  # codes 0..125: c + 1 <= 0x7E (448), all finite
    return (table[c] + table[c + 1]) / 2


def make_x(case: Case, m: int, k: int) -> torch.Tensor:
    """x in float32 holding values exact in the input dtype, following params['pattern']: random, special (the
    KINDS per unit), edges (`inputs.edge_rows`: zero rows and groups, amax outliers), last_block (each row's amax
    in its last columns) or zeros."""
    dtype = case.dtype("x")
    g = gen.generator(case, "x")
    qd = case.features["quant_dtype"]
    qmax = _QMAX[qd]
    nseg, seg = _segments(case)
    x = torch.randn((m, nseg, seg), generator=g) * 2.0 ** case.params.get("exponent", 0)
    pattern = case.params.get("pattern", "random")
    if pattern in ("zeros", "edges"):  # the all-zero unit of each unit: a tensor, a row, a group
        outlier = 16.0 if dtype == torch.float16 else gen.OUTLIER  # fp16: 2^8 * 4.5 * 16 stays finite
        return x.reshape(m, k) * 0.0 if pattern == "zeros" else gen.edge_rows(case, x.reshape(m, k), seg,
                                                                               outlier=outlier)
    if pattern == "last_block" and m:
        return _amax_in_last_block(x.reshape(m, k), g)
    if pattern == "extremes":
        return _with_extremes(x, dtype, g).reshape(m, k)
    if pattern != "special" or m == 0:
        return x.reshape(m, k)
    tensor_unit = case.features["unit"] == "tensor"
    shape = (1, 1) if tensor_unit else (m, nseg)  # per-tensor: one kind and exponent for the whole tensor
    kind = torch.randint(0, len(KINDS), shape, generator=g).expand(m, nseg)
    e = torch.randint(-4, 5, shape, generator=g).to(torch.float32).expand(m, nseg)[..., None]
    tiny = 2.0**-20 if dtype == torch.float16 else 2.0**-130  # subnormal in the input dtype
    large = 2.0**4 if dtype == torch.float16 else 2.0**60  # fp16: |x| stays far below 65504 (exponent <= 8)
    sign = torch.where(torch.rand((m, nseg, seg), generator=g) < 0.5, -1.0, 1.0)
    ties = sign * _midpoints(qd, (m, nseg, seg), g) * torch.exp2(e)
    below = x.clamp(-2.0, 2.0) / 2.0 * (qmax * 0.99) * torch.exp2(e)  # |.| < qmax * 2^e
    peak = torch.randint(0, seg, (m, nseg, 1), generator=g)
    at_peak = torch.zeros((m, nseg, seg), dtype=torch.bool).scatter_(2, peak, True)
    if tensor_unit:  # the tensor's amax in one random row only: a max over part of the rows must not find it
        at_peak &= (torch.arange(m) == torch.randint(0, m, (1,), generator=g))[:, None, None]
    # 1.75 * (an int8 midpoint below 16, or any fp8 midpoint) stays exact in bf16 (8 significant bits)
    ties_scaled = sign * _midpoints(qd, (m, nseg, seg), g, int8_below=16) * 1.75 * torch.exp2(e)
    amax_val = sign * qmax * torch.exp2(e)  # the unit's amax is exactly qmax * 2^e: scale 2^e
    k_ = kind[..., None]
    x = torch.where(k_ == 1, x * 0.0, x)  # zeros keep the sign: -0.0 codes
    x = torch.where(k_ == 2, x * tiny, x)
    x = torch.where(k_ == 3, torch.where(at_peak, amax_val, below), x)
    x = torch.where(k_ == 4, torch.where(at_peak, amax_val, ties), x)
    x = torch.where(k_ == 5, x * large, x)
    x = torch.where(k_ == 6, torch.where(at_peak, amax_val * 1.75, ties_scaled), x)
    return x.reshape(m, k)


def nvfp4_global_scale(x: torch.Tensor) -> torch.Tensor:
    """The op's NVFP4 input `global_scale` for x: fp32(amax / (448 * 6)) correctly rounded, 1.0 for amax 0."""
    amax = x.detach().abs().amax().double().cpu() if x.numel() else torch.zeros((), dtype=torch.float64)
    return torch.where(amax == 0, torch.ones_like(amax), amax / _NVFP4_RANGE).to(torch.float32)


def make_inputs(case: Case, device: str) -> dict[str, torch.Tensor]:
    m, k = case.shape("M"), case.shape("K")
    if case.params.get("pattern", "random") == "random" and gen.device_drawn((m, k), device):
        # a case past 2**31 elements: its values drawn where it is judged (`gen.normal`), not built on the CPU
        x = gen.normal(case, "x", (m, k), device, scale=2.0 ** case.params.get("exponent", 0)).to(case.dtype("x"))
    else:
        x = make_x(case, m, k).to(case.dtype("x"))
    out = {"x": gen.in_layout(case, "x", x.to(device))}
    if case.features["quant_dtype"] == "nvfp4":
        out["global_scale"] = nvfp4_global_scale(x).to(device)
    return out


# ---------------------------------------------------------------------------------------------------- oracle


def oracle(x: torch.Tensor, features: Mapping[str, str], conventions: Mapping[str, Any] | None = None,
           scales: torch.Tensor | None = None, *, on_device: bool = False,
           global_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Expected (codes, scales) of x for a cell, in the op's output dtypes and layouts (CPU tensors unless
    on_device: then on x's device, for model-size benchmarks).

    scales: optional logical float32 scales to quantize with (static), as reference.quant.quantize takes them.
    global_scale: NVFP4's input g (dequant side, see the module docstring); default: that of x.
    """
    r = recipe(features, conventions)
    x = x.detach() if on_device else x.detach().cpu()
    m, k = x.shape
    code_dtype = _CODE_DTYPES[features["quant_dtype"]]
    if m == 0:
        g = k // r.group_size if r.unit == QuantUnit.GROUP else 1
        spec = scale_output(features, 0, g)
        s = torch.empty(spec.shape, dtype=spec.dtype)
        if r.unit == QuantUnit.TENSOR:  # the scale of amax = 0
            s = quantize(torch.zeros((1, k)), r).scales.reshape(1)
        return torch.empty((0, k // 2 if features["quant_dtype"] in FP4_DTYPES else k), dtype=code_dtype), s
    if scales is not None and r.unit == QuantUnit.TENSOR:
        scales = scales.reshape(())
    if r.dtype.value == "nvfp4":
        g = (nvfp4_global_scale(x) if global_scale is None else global_scale.detach().cpu()).reshape(())
        if r.global_scale.value == "quant_side":
            g = (1.0 / g.double()).float()  # fp32(1 / g), what a quant-side kernel is handed
        qt = quantize(x, r, global_scale=g.to(x.device))
    else:
        qt = quantize(x, r, scales=scales)
    codes = qt.codes.view(code_dtype) if code_dtype == torch.float8_e4m3fn else qt.codes
    s = qt.scales.reshape(1) if r.unit == QuantUnit.TENSOR else qt.scales
    return codes, s


def _ulp_interval(s: torch.Tensor, ulps: int, rule: str, r: QuantRecipe) -> tuple[torch.Tensor, torch.Tensor]:
    lo, hi = s.clone(), s.clone()
    for _ in range(ulps):
        lo = torch.nextafter(lo, torch.zeros_like(lo)).clamp_min(0.0)
        hi = torch.nextafter(hi, torch.full_like(hi, math.inf))
    if rule == "ue8m0":
        kw = {"clamp_exponent": r.ue8m0_clamp, "form": r.ue8m0_form}
        lo, hi = ue8m0_round_up(lo, **kw), ue8m0_round_up(hi, **kw)
    return lo, hi


def _logical(actual: torch.Tensor, features: Mapping[str, str], m: int, g: int) -> torch.Tensor:
    if features["unit"] == "tensor":
        return actual.reshape(()).float()
    if features["unit"] == "token":
        return actual.float()
    return from_layout(actual.detach().cpu(), features["scale_layout"], m, g)


#: error of an approximate fp32 division (PTX div.full.f32), in ulps of the quotient
APPROX_DIV_ULPS = 2
#: absolute error of an approximate fp32 log2 (PTX lg2.approx.f32: 2^-22.6 documented; rounded up)
APPROX_LOG2_ABS = 2.0**-21


def _approximate_log2_interval(x: torch.Tensor, r: QuantRecipe, ulps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The scales exp2(ceil(log2 s)) can give when log2 is approximate (within APPROX_LOG2_ABS) and s itself is
    within `ulps` of the float rule's: 2^ceil(log2 s_lo - e) .. 2^ceil(log2 s_hi + e), then eps and the clamp."""
    after = r.eps_placement == EpsPlacement.ROUNDED_SCALE
    raw_recipe = dataclasses.replace(r, scale_rule=ScaleRule.FLOAT, layout=ScaleLayout.ROW_MAJOR,
                                     eps_placement=EpsPlacement.SCALE if after else r.eps_placement,
                                     eps=0.0 if after else r.eps)
    raw = scale_from_amax(unit_amax(x, r), raw_recipe, x.dtype)
    s_lo, s_hi = _ulp_interval(raw, ulps, "float", r)
    pos = s_lo > 0
    l_lo = torch.log2(torch.where(pos, s_lo, torch.ones_like(s_lo)).double()) - APPROX_LOG2_ABS
    l_hi = torch.log2(torch.where(s_hi > 0, s_hi, torch.ones_like(s_hi)).double()) + APPROX_LOG2_ABS
    e_lo = torch.where(pos, torch.ceil(l_lo), torch.full_like(l_lo, -2.0**16))
    e_hi = torch.where(s_hi > 0, torch.ceil(l_hi), torch.full_like(l_hi, -2.0**16))
    if r.ue8m0_clamp:
        e_lo, e_hi = e_lo.clamp(-126, 127), e_hi.clamp(-126, 127)
    one = torch.ones_like(l_lo)
    lo, hi = torch.ldexp(one, e_lo.long()).float(), torch.ldexp(one, e_hi.long()).float()
    if after:
        lo, hi = (torch.maximum(t, torch.full_like(t, float(r.eps))) for t in (lo, hi))
    return lo, hi


def _expand(s: torch.Tensor, f: Mapping[str, str], k: int) -> torch.Tensor:
    """Logical scales broadcast to x's [M, K] elements."""
    if f["unit"] == "group":
        return s.repeat_interleave(int(f["group_size"]), dim=1)[:, :k]
    return s.reshape(-1, 1) if f["unit"] == "token" else s.reshape(1, 1)


def _codes_under_approximate_division(x: torch.Tensor, f: Mapping[str, str], conventions: Mapping[str, Any],
                                      got_s: torch.Tensor, actual: torch.Tensor) -> Any:
    """Accept exactly the codes a quotient x / s off by the division's error can round to (s: the kernel's)."""
    application = recipe(f, conventions).application.value
    steps = APPROX_DIV_ULPS + (1 if application == "divide" else 2)  # + the reciprocal's product rounding
    s = _expand(got_s.double(), f, x.shape[1])
    q = torch.where(s == 0, torch.zeros_like(s), x.double() / torch.where(s == 0, torch.ones_like(s), s)).float()
    lo, hi = q.clone(), q.clone()
    for _ in range(steps):
        lo, hi = torch.nextafter(lo, torch.full_like(lo, -math.inf)), torch.nextafter(hi, torch.full_like(hi, math.inf))
    # the quotients lo and hi quantized as they are (static scale 1: the division by it is exact), by the cell's
    # own element rounding (fp8 RNE with saturation, or the declared int8 rounding)
    plain = {**{k: v for k, v in conventions.items() if k in CONVENTION_KEYS}, "application": "divide"}
    ones = torch.ones_like(got_s)
    bounds = [oracle(v, f, plain, scales=ones)[0] for v in (lo, hi)]
    val = [t.float() for t in (actual.detach().cpu(), *bounds)]
    low, high = torch.minimum(val[1], val[2]), torch.maximum(val[1], val[2])
    bad = ~((val[0] >= low) & (val[0] <= high))
    ambiguous = int((val[1] != val[2]).sum())
    n = int(bad.sum())
    if n:
        i = tuple(bad.nonzero()[0].tolist())
        return custom("codes", False, f"codes: {n} of {bad.numel()} codes are not what x / s (the kernel's own "
                      f"scales) rounds to under an approximate division (<= {APPROX_DIV_ULPS} ulp); first at "
                      f"{list(i)}: got {val[0][i].item()!r}, allowed [{low[i].item()!r}, {high[i].item()!r}]",
                      mismatches=n)
    return custom("codes", True, ambiguous=ambiguous)


def expected(case: Case, inputs: Mapping[str, torch.Tensor], conventions: Mapping[str, Any]) -> list[Check]:
    x = inputs["x"].detach().cpu()
    f = case.features
    codes, scales = oracle(x, f, conventions, global_scale=inputs.get("global_scale"))
    stated = conventions.get("scale_formula") is not None
    approximate = conventions.get("division") == "approximate"
    ulps = int(conventions.get("scale_ulps", APPROX_DIV_ULPS if approximate else 0 if stated else 1))
    empty = x.shape[0] == 0
    r = recipe(f, conventions)
    approx_log2 = (conventions.get("log2") == "approximate" and f["scale_rule"] == "ue8m0"
                   and r.ue8m0_form == Ue8m0Form.CEIL_LOG2 and not empty)
    if approx_log2 and f["quant_dtype"] in MX_DTYPES:
        raise ValueError("an approximate log2 is not modelled for the MX formats' ue8m0 rule")
    # MX: power-of-two scales applied exactly, an e8m0 code each: nothing for a division or a ulp to change
    if (ulps == 0 and not approx_log2) or (empty and f["unit"] != "tensor") or f["quant_dtype"] in (*MX_DTYPES,
                                                                                                  "nvfp4"):
        return [Check("codes", "exact", expected=codes), Check("scales", "exact", expected=scales)]

    m, g = x.shape[0], num_groups(case)
    if empty:  # no rows, but the per-tensor scale of amax = 0 is still computed (by a division)
        want = scales.reshape(())
    else:
        want = logical_scales(quantize(x, dataclasses.replace(r, layout=ScaleLayout.ROW_MAJOR)))
        want = want.reshape(()) if f["unit"] == "tensor" else want
    lo, hi = _ulp_interval(want, ulps, f["scale_rule"], r)
    if approx_log2:
        lo, hi = _approximate_log2_interval(x, r, ulps)
    pow2_rule = f["scale_rule"] == "ue8m0"

    def judge_scales(actual: torch.Tensor, _: Mapping[str, torch.Tensor]) -> Any:
        if f["scale_layout"] == "packed_ue8m0":
            return compare_exact("scales", actual, scales)  # words of powers of two: no ulp slack to give
        got = _logical(actual.detach().cpu(), f, m, g)
        bad = ~((got >= lo) & (got <= hi))
        if pow2_rule:  # between two allowed powers of two only a power of two (or the interval's own ends)
            mant, _ = torch.frexp(got.double())
            bad |= ~((mant == 0.5) | (got == lo) | (got == hi))
        n = int(bad.sum())
        if n:
            i = tuple(bad.nonzero()[0].tolist())
            return custom("scales", False, f"scales: {n} of {bad.numel()} scales outside {ulps} ulp of the oracle's; "
                          f"first at {list(i)}: got {got[i].item()!r}, allowed [{lo[i].item()!r}, {hi[i].item()!r}]",
                          mismatches=n)
        return custom("scales", True, ulps=ulps)

    def judge_codes(actual: torch.Tensor, outs: Mapping[str, torch.Tensor]) -> Any:
        got_s = _logical(outs["scales"].detach().cpu(), f, m, g)
        if not bool(torch.isfinite(got_s).all()) or bool((got_s < 0).any()):
            return custom("codes", False, "codes: cannot be judged against the kernel's own scales, which are "
                          "not finite and >= 0")
        if approximate:
            return _codes_under_approximate_division(x, f, conventions, got_s.contiguous(), actual)
        own, _ = oracle(x, f, conventions, scales=got_s.contiguous())
        return compare_exact("codes", actual, own)

    return [Check("codes", "custom", judge=judge_codes), Check("scales", "custom", judge=judge_scales)]


def stages(case: Case, inputs: Mapping[str, torch.Tensor], conventions: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The oracle's own codes and scales of x (what the kernel's are judged against where the codes are judged
    with the kernel's own scales)."""
    codes, scales = oracle(inputs["x"], case.features, conventions, global_scale=inputs.get("global_scale"))
    return {"oracle_codes": codes, "oracle_scales": scales}


# ------------------------------------------------------------------------------------------------- strategies


def _fields(cell: Mapping[str, str], m: int, k: int, pattern: str, *, exponent: int = 0,
            non_contiguous: bool = False) -> dict[str, Any]:
    return {"shapes": {"M": m, "K": k}, "dtypes": {"x": cell["input_dtype"]},
            "params": {"pattern": pattern, "exponent": exponent},
            "layout": {"x": "row_padded"} if non_contiguous else {}}


def draw(draw: st.DrawFn, adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    m = draw(edge_sizes(span(adapter, "M"), lim(adapter, "block_M")))  # M = 0: a boundary case
    max_k = lim(adapter, "max_K")
    if cell["unit"] == "group":
        gs = int(cell["group_size"])
        sp = span(adapter, "K", multiple=gs, usual=max(max_k, 9 * gs))
        k = draw(st.one_of(st.sampled_from([1, 2, 3, 4, 5, 9]), st.integers(1, max(1, max_k // gs))).map(
            lambda n: sp.fit(gs * n)))
    else:
        k = draw(edge_sizes(span(adapter, "K"), 64))
    pattern = draw(st.sampled_from(["random", "special", "special", "edges", "edges"]))
    return _fields(cell, m, k, pattern, exponent=draw(st.integers(-8, 8)))  # x's layout: strategies.cases


def boundary(adapter: Adapter, cell: Mapping[str, str]) -> list[dict[str, Any]]:
    """M = 1, 0, 17 (off the row tile), 33; K = one group, several (odd number of groups: a partial packed word),
    and DeepSeek-V3's 7168; per-token rows wider than one register tile (9000)."""
    if cell["unit"] == "group":
        gs = int(cell["group_size"])
        ks = (gs, 3 * gs, 2 * gs, 5 * gs, 7168, 9 * gs)
    else:
        ks = (100, 1, 64, 257, 7168, 9000)
    ms = (1, 5, 0, 17, 2, 33)
    pats = ("special", "special", "random", "random", "random", "special")
    return [_fields(cell, m, k, p, exponent=i % 3 - 1, non_contiguous=i == 1)
            for i, (m, k, p) in enumerate(zip(ms, ks, pats))]


def _zero_units_fields(adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    """Rows holding an all-zero unit (the whole tensor for the tensor unit) and amax outliers (`edges`)."""
    k = 3 * int(cell["group_size"]) if cell["unit"] == "group" else 130
    return _fields(cell, 5, k, "zeros" if cell["unit"] == "tensor" else "edges")


def _has_zero_unit(case: Case, inputs: Mapping[str, torch.Tensor]) -> bool:
    _, seg = _segments(case)
    return gen.has_zero_unit(inputs["x"], case.shape("K") if case.features["unit"] == "tensor" else seg) and (
        case.features["unit"] == "tensor" or bool(inputs["x"].detach().abs().amax() > 0))


ZERO_UNITS = ValueClass("zero_units", lambda a, c: True, ("unit",), _zero_units_fields, _has_zero_unit)

#: rows past 8k columns (8320 = 65 groups of 128: two blocks of 4096 and a partial one) with few rows
WIDE_K = 8320


def _last_block_present(case: Case, inputs: Mapping[str, torch.Tensor]) -> bool:
    """Rows past 8192 columns, each with its amax in the last `LAST_BLOCK` columns."""
    x = inputs["x"].detach().cpu().float()
    return x.shape[1] > 8192 and x.shape[0] > 0 and bool(
        (x.abs().argmax(dim=1) >= x.shape[1] - LAST_BLOCK).all())


#: the amax in the last block of a row past 8k columns: a reduction over the row's blocks must reach its tail
LAST_BLOCK_AMAX = ValueClass("last_block_amax", lambda a, c: True, ("unit",),
                             lambda a, c: _fields(c, 2, WIDE_K, "last_block"), _last_block_present, sized=True)


#: the input dtype's largest finite value (and its negation) and smallest normal (subnormals beside it), in
#: units with ordinary values beside them: the scale of max finite must stay finite with codes at the code range's
#: edge; a smallest-normal amax gives the scale of max(amax, eps). One case per input dtype too: fp16's 65504 and
#: 6.1e-5 (above eps) reach other code than bf16's and fp32's 3.4e38 and 1.2e-38 (below eps)
DTYPE_EXTREMES = ValueClass("dtype_extremes", lambda a, c: True, ("unit", "input_dtype"),
                            lambda a, c: _fields(c, 5, 3 * int(c["group_size"]) if c["unit"] == "group" else 130,
                                                 "extremes"),
                            lambda case, inputs: gen.has_extremes(inputs["x"], case.dtype("x")))


# per-tensor rows depend on the whole batch: an adapter declaring unit=tensor cannot claim batch invariance
_x_subset = row_subset("M")


def token_subset(case: Case, inputs: Mapping[str, torch.Tensor], rows: slice) -> tuple[Case, dict[str, torch.Tensor]]:
    """The rows of x; NVFP4's global scale stays the batch's (it is an input, not computed from the rows)."""
    sub_case, sub = _x_subset(case, inputs, rows)
    return sub_case, {**{k: v for k, v in inputs.items() if k != "x"}, **sub}


SPECS = {"group_quant": OpSpec(name="group_quant", title="Dynamic quantization (group / token / tensor)", axes=AXES,
                               make_inputs=make_inputs, outputs=outputs, expected=expected, draw=draw,
                               boundary=boundary, token_subset=token_subset, token_outputs=("codes", "scales"),
                               inapplicable=inapplicable, value_classes=(ZERO_UNITS, LAST_BLOCK_AMAX, DTYPE_EXTREMES),
                               stages=stages)}


# --------------------------------------------------------------------------------------------- reference adapter


def _run_reference(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
    for axis in AXES:
        if case.features.get(axis.name) not in axis.values:
            raise Unsupported(f"reference-group-quant: unknown {axis.name}={case.features.get(axis.name)!r}")
    if case.features.get("unit") == "tensor":  # one scale over every row
        _quantize_whole(case, inputs, outputs, on_device=False)
    else:
        by_rows(_quantize_whole, "group_quant", "M", case, inputs, outputs)


def _quantize_whole(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor], *,
                    on_device: bool) -> None:
    codes, scales = oracle(inputs["x"], case.features, global_scale=inputs.get("global_scale"), on_device=on_device)
    outputs["codes"].copy_(codes)
    outputs["scales"].copy_(scales)


REFERENCE_ADAPTERS = [Adapter(
    name="reference-group-quant", op="group_quant", source="reference", run=_run_reference,
    support={a.name: a.values for a in AXES}, properties=frozenset({"deterministic"}),
    description="reference.quant.quantize (QuantRecipe defaults: eps 1e-10 on amax, divide, half_even int8)",
)]
