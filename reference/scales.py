"""Scale rules, scale application and scale layouts of quantized MoE kernels (docs/SEMANTICS.md §2).

Scale rules (`ScaleRule`), all computed in float32 from amax = max |x| over a quantization unit:
- `float`: scale = max(amax, eps) / qmax (`EpsPlacement.AMAX`, vLLM/SGLang kernels with eps 1e-10, DeepGEMM's
  helpers with amax clamped at 1e-4) or max(amax / qmax, eps) (`EpsPlacement.SCALE`); the division is either a
  true division `amax / qmax` or `amax * fp32(1/qmax)` (`ScaleFormula`), which differ by one ulp for many inputs.
- `ue8m0`: the `float` scale rounded *up* to a power of two (`Ue8m0Form`): by its bits (`exponent_bits`, the
  default: biased exponent + 1 when any mantissa bit is set, as hardware `cvt.rp` does; a zero scale gets code 0,
  2^-127) or in floating point as 2^ceil(fp32(log2 s)) (`ceil_log2`: vLLM's CUDA and Triton quantizers, torchao's
  RCEIL eager path; a zero scale stays 0, except where the scale is stored as an e8m0 byte: there the exponent is
  clamped to [-127, 127] first, so a zero or tiny scale is 2^-127, byte 0). The two differ (exponent_bits 2^(k+1),
  ceil_log2 2^k) for the first n ulps above a power of two 2^k, where fp32 log2 rounds to k itself: n = 1 for
  4 <= k <= 7, 2 for 8 <= k <= 15, 5 up to 31, 11 up to 63 and 22 for 64 <= k <= 127 (a negative k as k' = |k| - 1:
  1 for -8 <= k <= -5, ..., 22 for k <= -65); never for |k| <= 3, k = -4, or below a power of two. They differ
  also for the subnormal scales up to 2^-127 + 11 ulps (2^22 + 11 of the 2^23 - 1 subnormals), where exponent_bits
  gives 2^-126 and ceil_log2 2^ceil(log2 s) <= 2^-127, and for 0 (2^-127 and 0). Optionally clamped to codes
  [1, 254] as DeepGEMM does. torch's cast to float8_e8m0fnu rounds to nearest and cannot produce these.
- `ocp_floor`: OCP Microscaling: 2^(floor(log2 amax) - emax_elem), clamped to the e8m0 range [2^-127, 2^127];
  amax == 0 gives 2^-127. Elements that then exceed qmax are clamped by the quantizer.

Application (`ScaleApplication`): `divide` x / s, `multiply_reciprocal` x * fp32(1/s), or `qmax_over_amax`
x * fp32(fp32(1/max(amax, eps)) * qmax) (PyTorch's `x * (qmax / amax)`), all in float32.

Layouts (`ScaleLayout`) of a logical float32 scale matrix [M, G] (M rows/tokens, G groups along K):
- `row_major`: contiguous [M, G].
- `column_major`: storage [G, M], returned as its transposed [M, G] view (strides (1, M)).
- `column_major_tma`: storage [G, M_pad] with M_pad = M rounded up to 4 (16 bytes of fp32, TMA alignment),
  padding 0, returned as an [M, G] view with strides (1, M_pad).
- `packed_ue8m0` (DeepGEMM on Blackwell): int32 [MN, ceil(G/4)] with strides (1, MN_pad), MN_pad = MN rounded up
  to 4; byte j (little-endian) of int32 p holds the e8m0 code (biased exponent) of group 4p + j; missing groups
  are 0. The scales must be powers of two.
- `swizzle_128x4` (NVFP4 / MX block scales, cuBLASLt/CUTLASS): rows padded to 128 and columns to 4 (padding 0),
  element (m, k) stored at flat offset ((m//128) * ceil(G/4) + k//4) * 512 + (m%32)*16 + ((m//32)%4)*4 + k%4 of a
  contiguous [M_pad, G_pad] tensor of the input's dtype (uint8 codes in practice).
Each layout has an inverse (`from_layout`).
"""

from __future__ import annotations

import enum

import torch

from reference import formats
from reference._checks import check_choice, check_int, check_tensor

__all__ = [
    "EpsPlacement",
    "ScaleApplication",
    "ScaleFormula",
    "ScaleLayout",
    "ScaleRule",
    "Ue8m0Form",
    "apply_scale",
    "compute_scale",
    "float_scale",
    "from_layout",
    "ocp_floor_scale",
    "pack_ue8m0",
    "swizzle_128x4",
    "to_column_major",
    "to_column_major_tma",
    "to_layout",
    "ue8m0_round_up",
    "unpack_ue8m0",
    "unswizzle_128x4",
]


class ScaleRule(str, enum.Enum):
    """How a unit's scale is derived from its amax (module docstring)."""

    FLOAT = "float"
    UE8M0 = "ue8m0"
    OCP_FLOOR = "ocp_floor"


class EpsPlacement(str, enum.Enum):
    """Where eps guards the scale: `amax` -> max(amax, eps) / qmax; `scale` -> max(amax / qmax, eps), before any
    power-of-two rounding; `rounded_scale` -> max(round(amax / qmax), eps), after the `ue8m0` rounding (vLLM's
    QuantFP8 native path: `exp2(ceil(log2(amax / qmax))).clamp(min=eps)`; the same as `scale` for the float rule)."""

    AMAX = "amax"
    SCALE = "scale"
    ROUNDED_SCALE = "rounded_scale"


class Ue8m0Form(str, enum.Enum):
    """How the `ue8m0` rule rounds a scale up to a power of two (module docstring)."""

    EXPONENT_BITS = "exponent_bits"
    CEIL_LOG2 = "ceil_log2"


class ScaleFormula(str, enum.Enum):
    """`divide`: amax / qmax (correctly rounded); `multiply_reciprocal`: amax * fp32(1 / qmax);
    `reciprocal_of_factor`: fp32(1 / fp32(qmax / amax)), the reciprocal of the correctly rounded factor the kernel
    multiplies by (torchao's fp8 blockwise quantizers: the factor in float64 rounded once to fp32, its reciprocal
    stored; an amax of 0 gives the factor inf and the scale 0);
    `reciprocal_of_qmax_over_amax`: fp32(1 / f) with f = fp32(fp32(1 / amax) * qmax), the factor as PyTorch code
    `qmax / amax` on an fp32 tensor computes it (a Python scalar divided by a tensor is `reciprocal() * scalar`:
    two roundings; the factor application `qmax_over_amax` multiplies by); torch code storing `1 / (448 / amax)`.
    An amax of 185 gives 0.41294640302658081 here, 0.41294643282890320 by the three forms above. amax here is
    max(amax, eps)."""

    DIVIDE = "divide"
    MULTIPLY_RECIPROCAL = "multiply_reciprocal"
    RECIPROCAL_OF_FACTOR = "reciprocal_of_factor"
    RECIPROCAL_OF_QMAX_OVER_AMAX = "reciprocal_of_qmax_over_amax"


class ScaleApplication(str, enum.Enum):
    """How elements are scaled before rounding: `divide` x / s; `multiply_reciprocal` x * fp32(1 / s);
    `qmax_over_amax` x * fp32(fp32(1 / max(amax, eps)) * qmax): what PyTorch code `x * (qmax / amax)` computes
    (torch evaluates a Python scalar divided by a tensor as reciprocal() * scalar, on CPU and CUDA), i.e. DeepGEMM's
    older per-token/per-block cast helpers; the factor comes from amax directly, not from the stored scale
    amax / qmax (`float` rule only). DeepGEMM's current helpers compute sf = amax.clamp(1e-4) / 448, then
    x * (1 / sf): that is `multiply_reciprocal` (with eps 1e-4 on amax, and scale formula `multiply_reciprocal`
    where `amax / 448` runs on CUDA, which multiplies by the scalar's reciprocal, `divide` on CPU).
    `qmax_over_amax_rn`: x * fp32(qmax / max(amax, eps)) with the factor correctly rounded (formed in float64 and
    rounded once: torchao's fp8 blockwise Triton quantizers); also from amax, `float` rule only. An amax of 0 (eps
    0) gives the factor 0 here: zero codes, as a zero scale does."""

    DIVIDE = "divide"
    MULTIPLY_RECIPROCAL = "multiply_reciprocal"
    QMAX_OVER_AMAX = "qmax_over_amax"
    QMAX_OVER_AMAX_RN = "qmax_over_amax_rn"


class ScaleLayout(str, enum.Enum):
    """Memory layout of a scale matrix [M, G] (module docstring)."""

    ROW_MAJOR = "row_major"
    COLUMN_MAJOR = "column_major"
    COLUMN_MAJOR_TMA = "column_major_tma"
    PACKED_UE8M0 = "packed_ue8m0"
    SWIZZLE_128X4 = "swizzle_128x4"


def _enum(name: str, v: object, cls: type[enum.Enum]) -> enum.Enum:
    if isinstance(v, str) and not isinstance(v, cls):
        check_choice(name, v, [m.value for m in cls])
        return cls(v)
    return check_choice(name, v, list(cls))  # type: ignore[return-value]


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def _materialize(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    # A real (non-broadcast) operand, so that no kernel takes a scalar fast path (e.g. multiply by reciprocal).
    return t.to(torch.float32).expand(like.shape).contiguous()


def float_scale(
    amax: torch.Tensor,
    qmax: float,
    *,
    eps: float = 1e-10,
    eps_placement: EpsPlacement | str = EpsPlacement.AMAX,
    formula: ScaleFormula | str = ScaleFormula.DIVIDE,
) -> torch.Tensor:
    """The `float` rule in float32: max(amax, eps) / qmax (or max(amax / qmax, eps), or with * fp32(1/qmax)).
    With eps_placement `rounded_scale` eps is not applied here (`compute_scale` applies it after rounding).

    amax: float32, any shape, >= 0. qmax: the format's largest value (448, 57344, 127, 6, ...). eps >= 0.
    Returns float32 of amax's shape.
    """
    check_tensor("amax", amax, dtypes=(torch.float32,))
    eps_placement = _enum("eps_placement", eps_placement, EpsPlacement)
    formula = _enum("formula", formula, ScaleFormula)
    if not (isinstance(qmax, (int, float)) and qmax > 0):
        raise ValueError(f"qmax must be a positive number, got {qmax!r}")
    if not (isinstance(eps, (int, float)) and eps >= 0):
        raise ValueError(f"eps must be a non-negative number, got {eps!r}")
    eps_t = torch.full_like(amax, float(eps))
    q = torch.full_like(amax, float(qmax))
    a = torch.maximum(amax, eps_t) if eps_placement == EpsPlacement.AMAX else amax
    if formula == ScaleFormula.RECIPROCAL_OF_FACTOR:
        # fp32(qmax / a) correctly rounded: float64 holds more than 2 * 24 + 2 bits, so its quotient rounded to
        # float32 is (double rounding of a division is innocuous there); then fp32 1 / factor (0 where a is 0)
        factor = (q.to(torch.float64) / a.to(torch.float64)).to(torch.float32)
        s = 1.0 / factor
    elif formula == ScaleFormula.RECIPROCAL_OF_QMAX_OVER_AMAX:
        # fp32(1 / a) (correctly rounded from float64, as above; inf where a is 0), then the product rounded once
        recip = (1.0 / a.to(torch.float64)).to(torch.float32)
        factor = (recip.to(torch.float64) * q.to(torch.float64)).to(torch.float32)
        s = 1.0 / factor
    else:
        s = a / q if formula == ScaleFormula.DIVIDE else a * (1.0 / q)
    if eps_placement == EpsPlacement.SCALE:
        s = torch.maximum(s, eps_t)
    return s  # ROUNDED_SCALE: compute_scale applies eps after the rounding


def ue8m0_round_up(
    s: torch.Tensor,
    *,
    clamp_exponent: bool = False,
    form: Ue8m0Form | str = Ue8m0Form.EXPONENT_BITS,
    e8m0_range: bool = False,
) -> torch.Tensor:
    """Round float32 scales up to powers of two.

    form `exponent_bits` (default): the e8m0 code is the biased exponent, + 1 if any mantissa bit is set; the
    result is 2^(code - 127). s == 0 (an all-zero unit with eps 0) has code 0, i.e. 2^-127 (what hardware
    `cvt.rp.satfinite.ue8m0x2.f32` and torchao give; never 0, which e8m0 cannot hold). A subnormal s becomes
    2^-126. Codes above 254 (s above 2^127) give inf without the clamp.
    form `ceil_log2`: 2^ceil(l) with l = log2(s) correctly rounded to float32, as `exp2(ceil(log2(s)))` computes
    in float32: s == 0 gives 0 (log2 0 = -inf); an exponent below -149 gives 0, below -126 an fp32 subnormal.
    e8m0_range (set where the scale is stored as an e8m0 byte: MX scales, the packed_ue8m0 layout): the
    `ceil_log2` exponent is clamped to [-127, 127], what a byte holds: a scale whose exponent falls below -127
    (s == 0 included) gives 2^-127 (byte 0), so the result is exactly the stored scale (torchao's RCEIL byte,
    clamp(ceil(log2(amax / qmax)), -127, 127) + 127). The `exponent_bits` form is in that range already.
    clamp_exponent (DeepGEMM): the exponent is clamped to [-126, 127] (codes [1, 254]).
    s: float32, finite, >= 0. Returns float32.
    """
    check_tensor("s", s, dtypes=(torch.float32,))
    form = _enum("form", form, Ue8m0Form)
    if not bool(torch.isfinite(s).all()) or bool((s < 0).any()):
        raise ValueError("s must be finite and >= 0 to round up to a power of two")
    if form == Ue8m0Form.CEIL_LOG2:
        pos = s > 0
        # float64 log2 is within 1 ulp of float64: rounding it to float32 is the correctly rounded fp32 log2
        l32 = torch.log2(torch.where(pos, s, torch.ones_like(s)).to(torch.float64)).to(torch.float32)
        e = torch.where(pos, torch.ceil(l32).to(torch.int64), -(2**16))  # log2 0 = -inf: 2^e = 0
        if e8m0_range:
            e = e.clamp(-127, 127)
        if clamp_exponent:
            e = e.clamp(-126, 127)
        return torch.ldexp(torch.ones_like(s, dtype=torch.float64), e).to(torch.float32)
    bits = s.view(torch.int32).to(torch.int64)
    exp = (bits >> 23) & 0xFF
    man = bits & 0x7FFFFF
    code = exp + (man != 0).to(torch.int64)
    if clamp_exponent:
        code = code.clamp(1, 254)
    # 2^(code - 127) exactly: code 0 is the fp32 subnormal 2^-127, code 255 overflows to inf
    return torch.ldexp(torch.ones_like(s, dtype=torch.float64), code - 127).to(torch.float32)


def ocp_floor_scale(amax: torch.Tensor, emax_elem: int) -> torch.Tensor:
    """OCP MX scale 2^(floor(log2 amax) - emax_elem) in float32, exponent clamped to [-127, 127].

    amax: float32, finite, >= 0; amax == 0 gives 2^-127 (the smallest e8m0 value).
    emax_elem: floor(log2 qmax) of the element format (8 e4m3fn, 15 e5m2, 2 e2m1).
    """
    check_tensor("amax", amax, dtypes=(torch.float32,))
    check_int("emax_elem", emax_elem, min_value=0)
    if not bool(torch.isfinite(amax).all()) or bool((amax < 0).any()):
        raise ValueError("amax must be finite and >= 0 for the ocp_floor rule")
    _, fexp = torch.frexp(amax.to(torch.float64))
    e = fexp.to(torch.int64) - 1 - emax_elem
    e = torch.where(amax == 0, torch.full_like(e, -127), e).clamp(-127, 127)
    return torch.ldexp(torch.ones_like(amax, dtype=torch.float64), e).to(torch.float32)


def compute_scale(
    amax: torch.Tensor,
    qmax: float,
    rule: ScaleRule | str = ScaleRule.FLOAT,
    *,
    eps: float = 1e-10,
    eps_placement: EpsPlacement | str = EpsPlacement.AMAX,
    formula: ScaleFormula | str = ScaleFormula.DIVIDE,
    ue8m0_clamp: bool = False,
    emax_elem: int | None = None,
    ue8m0_form: Ue8m0Form | str = Ue8m0Form.EXPONENT_BITS,
    e8m0_range: bool = False,
) -> torch.Tensor:
    """Scale of each unit from its float32 amax by `rule` (default `float`); float32 of amax's shape.

    `float` and `ue8m0` use qmax, eps, eps_placement, formula (and ue8m0_clamp: DeepGEMM's exponent clamp,
    ue8m0_form: how the rounding up is computed, e8m0_range: the scale is stored as an e8m0 byte, see
    `ue8m0_round_up`); `ocp_floor` uses emax_elem (required) and ignores the others.
    """
    rule = _enum("rule", rule, ScaleRule)
    if rule == ScaleRule.OCP_FLOOR:
        if emax_elem is None:
            raise ValueError("emax_elem is required for the ocp_floor rule")
        return ocp_floor_scale(amax, emax_elem)
    eps_placement = _enum("eps_placement", eps_placement, EpsPlacement)
    s = float_scale(amax, qmax, eps=eps, eps_placement=eps_placement, formula=formula)
    if rule == ScaleRule.UE8M0:
        s = ue8m0_round_up(s, clamp_exponent=ue8m0_clamp, form=ue8m0_form, e8m0_range=e8m0_range)
    if eps_placement == EpsPlacement.ROUNDED_SCALE:
        s = torch.maximum(s, torch.full_like(s, float(eps)))
    return s


def apply_scale(
    x: torch.Tensor, s: torch.Tensor, application: ScaleApplication | str = ScaleApplication.DIVIDE
) -> torch.Tensor:
    """x / s (`divide`, default) or x * fp32(1 / s) (`multiply_reciprocal`), in float32.

    x: float tensor (converted to float32 first); s: float32 broadcastable to x. Where s == 0 the result is x * 0,
    a zero of x's sign (a zero scale quantizes its whole unit to zero codes, as production kernels guard it: a
    reciprocal taken as 0 for a zero scale, then x * 0).
    """
    check_tensor("x", x, dtypes=(torch.float16, torch.bfloat16, torch.float32))
    check_tensor("s", s, dtypes=(torch.float32,))
    application = _enum("application", application, ScaleApplication)
    if application in (ScaleApplication.QMAX_OVER_AMAX, ScaleApplication.QMAX_OVER_AMAX_RN):
        raise ValueError(f"application {application.value!r} needs amax, not the scale: use reference.quant.quantize")
    x32 = x.to(torch.float32)
    s32 = _materialize(s, x32)
    safe = torch.where(s32 == 0, torch.ones_like(s32), s32)
    y = x32 / safe if application == ScaleApplication.DIVIDE else x32 * (1.0 / safe)
    return torch.where(s32 == 0, x32 * 0.0, y)


# ----------------------------------------------------------------------------------------------- layouts


def _check_2d(name: str, s: torch.Tensor) -> torch.Tensor:
    return check_tensor(name, s, ndim=2)


def to_column_major(s: torch.Tensor) -> torch.Tensor:
    """[M, G] -> the same values as an [M, G] view of a contiguous [G, M] storage (strides (1, M))."""
    _check_2d("scales", s)
    m, g = s.shape
    return s.t().contiguous().as_strided((m, g), (1, m))


def to_column_major_tma(s: torch.Tensor, align: int = 4) -> torch.Tensor:
    """[M, G] -> [M, G] view (strides (1, M_pad)) of a zero-padded [G, M_pad] storage, M_pad = M rounded up to align."""
    _check_2d("scales", s)
    m, g = s.shape
    storage = torch.zeros(g, _round_up(m, align), dtype=s.dtype, device=s.device)
    storage[:, :m] = s.t()
    return storage.as_strided((m, g), (1, storage.shape[1]))


def _is_pow2(s: torch.Tensor) -> torch.Tensor:
    f, _ = torch.frexp(s.to(torch.float64))
    return torch.isfinite(s) & (s > 0) & (f == 0.5)


def pack_ue8m0(s: torch.Tensor) -> torch.Tensor:
    """DeepGEMM packed UE8M0: float32 powers of two [MN, G] -> int32 [MN, ceil(G/4)], strides (1, MN_pad).

    Byte j (little-endian) of int32 column p is the e8m0 code of group 4p + j; groups past G are 0;
    MN_pad = MN rounded up to 4 (padding rows 0). Raises ValueError if a scale is not a power of two in
    [2^-127, 2^127].
    """
    check_tensor("scales", s, ndim=2, dtypes=(torch.float32,))
    # below 2^-127 the byte would silently hold a larger scale than the codes were computed with
    if not bool(_is_pow2(s).all()) or bool((s > 2.0**127).any()) or bool((s < 2.0**-127).any()):
        raise ValueError("scales must be powers of two in [2^-127, 2^127] (ue8m0 or ocp_floor rule) to pack into "
                         "the ue8m0 layout")
    mn, g = s.shape
    gp = (g + 3) // 4
    codes = torch.zeros(mn, gp * 4, dtype=torch.int64, device=s.device)
    codes[:, :g] = formats.encode(s, formats.FloatFormat.E8M0).to(torch.int64)
    c = codes.view(mn, gp, 4)
    word = c[..., 0] | (c[..., 1] << 8) | (c[..., 2] << 16) | (c[..., 3] << 24)  # unsigned 32-bit value
    word = torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)
    storage = torch.zeros(gp, _round_up(mn, 4), dtype=torch.int32, device=s.device)
    storage[:, :mn] = word.t()
    return storage.as_strided((mn, gp), (1, storage.shape[1]))


def unpack_ue8m0(packed: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Inverse of `pack_ue8m0`: int32 [MN, ceil(G/4)] (any strides) -> float32 powers of two [MN, num_groups]."""
    check_tensor("packed", packed, ndim=2, dtypes=(torch.int32,))
    check_int("num_groups", num_groups, min_value=1)
    if packed.shape[1] != (num_groups + 3) // 4:
        raise ValueError(f"packed must have {(num_groups + 3) // 4} columns for {num_groups} groups, "
                         f"got {packed.shape[1]}")
    w = packed.to(torch.int64) & 0xFFFFFFFF
    codes = torch.stack([(w >> (8 * j)) & 0xFF for j in range(4)], dim=-1).flatten(1)[:, :num_groups]
    return formats.decode(codes.to(torch.uint8), formats.FloatFormat.E8M0)


def swizzle_128x4(s: torch.Tensor) -> torch.Tensor:
    """[M, G] block scales (any dtype) -> contiguous [M_pad, G_pad] in the 128x4 swizzled order (module docstring)."""
    _check_2d("scales", s)
    m, g = s.shape
    mp, gp = _round_up(m, 128), _round_up(g, 4)
    padded = torch.zeros(mp, gp, dtype=s.dtype, device=s.device)
    padded[:m, :g] = s
    # padded[mt*128 + m4*32 + m32, kt*4 + k4] goes to flat ((mt*Kt + kt)*32 + m32)*16 + m4*4 + k4
    t = padded.view(mp // 128, 4, 32, gp // 4, 4).permute(0, 3, 2, 1, 4)
    return t.contiguous().view(mp, gp)


def unswizzle_128x4(swizzled: torch.Tensor, m: int, num_groups: int) -> torch.Tensor:
    """Inverse of `swizzle_128x4`: back to the logical [m, num_groups] (contiguous)."""
    check_int("m", m, min_value=1)
    check_int("num_groups", num_groups, min_value=1)
    mp, gp = _round_up(m, 128), _round_up(num_groups, 4)
    check_tensor("swizzled", swizzled, shape=(mp, gp))
    t = swizzled.contiguous().view(mp // 128, gp // 4, 32, 4, 4).permute(0, 3, 2, 1, 4)
    return t.reshape(mp, gp)[:m, :num_groups].contiguous()


def to_layout(s: torch.Tensor, layout: ScaleLayout | str) -> torch.Tensor:
    """Store a logical [M, G] scale matrix in `layout` (see the module docstring for each layout)."""
    layout = _enum("layout", layout, ScaleLayout)
    _check_2d("scales", s)
    if layout == ScaleLayout.ROW_MAJOR:
        return s.contiguous()
    if layout == ScaleLayout.COLUMN_MAJOR:
        return to_column_major(s)
    if layout == ScaleLayout.COLUMN_MAJOR_TMA:
        return to_column_major_tma(s)
    if layout == ScaleLayout.PACKED_UE8M0:
        return pack_ue8m0(s)
    return swizzle_128x4(s)


def from_layout(stored: torch.Tensor, layout: ScaleLayout | str, m: int, num_groups: int) -> torch.Tensor:
    """Inverse of `to_layout`: the logical contiguous [m, num_groups] matrix (float32 for packed_ue8m0)."""
    layout = _enum("layout", layout, ScaleLayout)
    check_int("m", m, min_value=1)
    check_int("num_groups", num_groups, min_value=1)
    if layout == ScaleLayout.PACKED_UE8M0:
        check_tensor("scales", stored, shape=(m, (num_groups + 3) // 4))
        return unpack_ue8m0(stored, num_groups)
    if layout == ScaleLayout.SWIZZLE_128X4:
        return unswizzle_128x4(stored, m, num_groups)
    check_tensor("scales", stored, shape=(m, num_groups))
    return stored.contiguous()
