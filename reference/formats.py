"""Exact encode/decode of the narrow floating-point formats used by quantized MoE kernels.

Every format is described by its bit fields (sign, exponent, mantissa, bias) and converted with explicit
round-to-nearest-even arithmetic in float64, never through torch's own casts: the point of this module is to be
an independent definition that torch's casts (and kernels) can be checked against.

Formats (value of a code with sign s, exponent field e, mantissa field m):

| format    | bits | e/m | bias | max    | inf | NaN codes          | notes                                   |
|-----------|------|-----|------|--------|-----|--------------------|-----------------------------------------|
| e4m3fn    | 8    | 4/3 | 7    | 448    | no  | S.1111.111         | e=15 is a normal binade except m=7      |
| e4m3fnuz  | 8    | 4/3 | 8    | 240    | no  | 0x80 only          | no negative zero; e=15 fully normal     |
| e5m2      | 8    | 5/2 | 15   | 57344  | yes | S.11111.{01,10,11} | IEEE-like; S.11111.00 is +-inf          |
| e2m1      | 4    | 2/1 | 1    | 6      | no  | none               | magnitudes 0 .5 1 1.5 2 3 4 6           |
| e8m0      | 8    | 8/0 | 127  | 2^127  | no  | 0xFF               | unsigned, 2^(code-127); no zero         |

e=0 codes are subnormal: m * 2^(1 - bias - mbits).

Rounding: round to nearest, ties to even (the code with an even mantissa; `ties="toward_zero"` for casts that
break ties downward), computed with an unbounded exponent
range first; a result whose magnitude exceeds the format's max has *overflowed*. Overflow with
`saturate=True` gives +-max (also for +-inf inputs, like PTX `cvt.satfinite`); with `saturate=False`:
e4m3fn -> NaN with the input's sign (S.1111.111), e4m3fnuz -> 0x80 (its only NaN), e5m2 -> +-inf, e2m1 ->
ValueError (it has no inf or NaN code), e8m0 -> 0xFF. NaN inputs give the format's NaN code (sign kept where
the format has a signed NaN: e4m3fn 0x7F/0xFF, e5m2 0x7F/0xFF by default; e5m2 has three NaN mantissas and
`nan_code` picks one, e.g. 0x7E/0xFE, the IEEE quiet NaN that ml_dtypes gives); e2m1 has none and rejects NaN with
ValueError. Values that round to zero keep their sign (-0 is 0x80 in e4m3fn and e5m2, 0x8 in e2m1) unless
`negative_zero="never"` (quantizers whose zero code carries no sign), except in e4m3fnuz where every zero is 0x00.
e8m0 encodes positive values only: zero, negatives and NaN give 0xFF, values below 2^-127 give code 0 (the
smallest), and its rounding direction is an argument (see `E8M0Rounding`).
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

import torch

from reference._checks import check_choice, check_tensor

__all__ = [
    "NAN_CODES",
    "E8M0Rounding",
    "FloatFormat",
    "FormatSpec",
    "NegativeZero",
    "Ties",
    "code_table",
    "decode",
    "encode",
    "pack_nibbles",
    "spec",
    "unpack_nibbles",
]

_INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class FloatFormat(str, enum.Enum):
    """The narrow formats this module encodes and decodes (value is the name used in JSON)."""

    E4M3FN = "e4m3fn"
    E4M3FNUZ = "e4m3fnuz"
    E5M2 = "e5m2"
    E2M1 = "e2m1"
    E8M0 = "e8m0"


class E8M0Rounding(str, enum.Enum):
    """How `encode(..., FloatFormat.E8M0)` rounds a positive value to a power of two.

    `nearest_even`: nearest power of two, a value exactly 1.5 * 2^k (the linear midpoint) goes to the even code.
    `nearest_away`: the same but midpoints go up (what torch 2.13's cast to float8_e8m0fnu does).
    `up`: the smallest power of two >= x (ceil). `down`: the largest power of two <= x (floor).
    """

    NEAREST_EVEN = "nearest_even"
    NEAREST_AWAY = "nearest_away"
    UP = "up"
    DOWN = "down"


class Ties(str, enum.Enum):
    """How `encode` rounds a value exactly halfway between two codes of a signed format.

    `even`: to the code with an even mantissa (IEEE, PTX `cvt.rn`, torch's casts; the default).
    `toward_zero`: to the smaller magnitude (an fp4 cast written as a search over the midpoints with `x <= mid`
    going down, e.g. DeepGEMM's e2m1 cast, `torch.bucketize(|x|, midpoints)`).
    """

    EVEN = "even"
    TOWARD_ZERO = "toward_zero"


class NegativeZero(str, enum.Enum):
    """The code `encode` gives a negative value that rounds to zero (and -0 itself), in a signed format.

    `kept`: the negative zero code, sign bit set (IEEE, PTX `cvt`, torch's casts; the default).
    `never`: the positive zero code (a quantizer that forms the sign from `x < 0` after rounding, or looks the
    magnitude up and adds the sign only to non-zero codes: the values are equal, the bits are not).
    e4m3fnuz has no negative zero: its zeros are 0x00 either way.
    """

    KEPT = "kept"
    NEVER = "never"


@dataclass(frozen=True)
class FormatSpec:
    """Bit-field description of a format. `max_value` is the largest finite magnitude."""

    fmt: FloatFormat
    bits: int
    exp_bits: int
    man_bits: int
    bias: int
    signed: bool
    max_value: float
    has_inf: bool

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal binade (also the exponent of subnormals)."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """floor(log2(max_value)): the 'emax_elem' of the OCP MX spec (8 for e4m3fn, 2 for e2m1)."""
        return int(torch.tensor(self.max_value, dtype=torch.float64).log2().floor().item())

    @property
    def num_codes(self) -> int:
        return 1 << self.bits


_SPECS = {
    FloatFormat.E4M3FN: FormatSpec(FloatFormat.E4M3FN, 8, 4, 3, 7, True, 448.0, False),
    FloatFormat.E4M3FNUZ: FormatSpec(FloatFormat.E4M3FNUZ, 8, 4, 3, 8, True, 240.0, False),
    FloatFormat.E5M2: FormatSpec(FloatFormat.E5M2, 8, 5, 2, 15, True, 57344.0, True),
    FloatFormat.E2M1: FormatSpec(FloatFormat.E2M1, 4, 2, 1, 1, True, 6.0, False),
    FloatFormat.E8M0: FormatSpec(FloatFormat.E8M0, 8, 8, 0, 127, False, 2.0**127, False),
}


def spec(fmt: FloatFormat | str) -> FormatSpec:
    """The bit-field description of `fmt` (a `FloatFormat` or its string value)."""
    fmt = _as_format(fmt)
    return _SPECS[fmt]


def _as_format(fmt: object) -> FloatFormat:
    if isinstance(fmt, str) and not isinstance(fmt, FloatFormat):
        check_choice("fmt", fmt, [f.value for f in FloatFormat])
        return FloatFormat(fmt)
    return check_choice("fmt", fmt, list(FloatFormat))  # type: ignore[return-value]


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """2**e for an integer tensor e, exactly, in float64.

    For -1022 <= e <= 1023, 2**e is the normal float64 whose biased exponent field is e + 1023 and whose mantissa
    is 0: built from those bits (torch.ldexp computes a power, several times slower on the CPU). Other e (subnormal
    results, overflow) go through ldexp."""
    e = e.to(torch.int64)
    bits = (e.clamp(-1022, 1023) + 1023) << 52
    built = bits.view(torch.float64)
    in_range = (e >= -1022) & (e <= 1023)
    if bool(in_range.all()):
        return built
    return torch.where(in_range, built, torch.ldexp(torch.ones_like(e, dtype=torch.float64), e))


#: the positive NaN codes of each 8-bit signed format (the first is the default: all mantissa bits set)
NAN_CODES = {FloatFormat.E4M3FN: (0x7F,), FloatFormat.E4M3FNUZ: (0x80,), FloatFormat.E5M2: (0x7F, 0x7E, 0x7D)}


def _nan_code(sp: FormatSpec, sign: torch.Tensor, positive: int | None = None) -> torch.Tensor:
    if sp.fmt == FloatFormat.E4M3FNUZ:
        return torch.full_like(sign, 0x80)
    return (sign << 7) | (0x7F if positive is None else positive)  # default: e4m3fn S.1111.111, e5m2 S.11111.11


def _encode_signed(x: torch.Tensor, sp: FormatSpec, saturate: bool, ties: Ties = Ties.EVEN,
                   negative_zero: NegativeZero = NegativeZero.KEPT, nan_code: int | None = None) -> torch.Tensor:
    x = x.to(torch.float64)
    sign = torch.signbit(x).to(torch.int64)
    finite = torch.isfinite(x)
    a = torch.where(finite, x.abs(), torch.zeros_like(x))

    # Round with an unbounded exponent range: the quantum is 2^(e - mbits), e = max(floor(log2 a), emin).
    _, fexp = torch.frexp(a)  # a = f * 2^fexp with f in [0.5, 1): floor(log2 a) = fexp - 1
    e = torch.clamp(fexp.to(torch.int64) - 1, min=sp.emin)
    quantum = _pow2(e - sp.man_bits)
    r = a / quantum  # exact
    n = torch.round(r)  # half-to-even
    if ties == Ties.TOWARD_ZERO:
        n = torch.where(r - torch.floor(r) == 0.5, torch.floor(r), n)
    v = n * quantum  # the rounded magnitude (may have carried into the next binade)

    # Bit fields of the rounded magnitude (meaningful where 0 < v <= max).
    _, vexp = torch.frexp(v)
    ev = vexp.to(torch.int64) - 1
    normal = v >= 2.0**sp.emin
    exp_field = torch.where(normal, ev + sp.bias, torch.zeros_like(ev))
    man_scaled = torch.where(normal, v / _pow2(ev - sp.man_bits) - 2.0**sp.man_bits, v / 2.0 ** (sp.emin - sp.man_bits))
    man_field = man_scaled.to(torch.int64)
    sign_shift = sp.bits - 1
    code = (sign << sign_shift) | (exp_field << sp.man_bits) | man_field

    if sp.fmt == FloatFormat.E4M3FNUZ or negative_zero == NegativeZero.NEVER:  # every zero is the +0 code
        code = torch.where(v == 0, torch.zeros_like(code), code)

    # The largest finite code: e4m3fn's top binade stops at mantissa 6 (mantissa 7 is NaN).
    max_code = {FloatFormat.E4M3FN: 0x7E, FloatFormat.E4M3FNUZ: 0x7F, FloatFormat.E5M2: 0x7B, FloatFormat.E2M1: 0x7}[
        sp.fmt
    ]
    sat_code = (sign << sign_shift) | max_code
    overflow = (v > sp.max_value) | torch.isinf(x)
    if saturate:
        code = torch.where(overflow, sat_code, code)
    elif sp.fmt == FloatFormat.E5M2:
        code = torch.where(overflow, (sign << 7) | 0x7C, code)
    elif sp.fmt == FloatFormat.E2M1:
        if bool(overflow.any()):
            raise ValueError("x has values that overflow e2m1 (|x| rounds above 6 or is inf) and e2m1 has no "
                             "inf/NaN code: use saturate=True")
    else:
        code = torch.where(overflow, _nan_code(sp, sign), code)

    nan = torch.isnan(x)
    if sp.fmt == FloatFormat.E2M1:
        if bool(nan.any()):
            raise ValueError("x contains NaN, which e2m1 cannot encode")
    else:
        code = torch.where(nan, _nan_code(sp, sign, nan_code), code)
    return code.to(torch.uint8)


def _encode_e8m0(x: torch.Tensor, saturate: bool, rounding: E8M0Rounding) -> torch.Tensor:
    x = x.to(torch.float64)
    valid = torch.isfinite(x) & (x > 0)
    a = torch.where(valid, x, torch.ones_like(x))
    f, fexp = torch.frexp(a)  # a = (2f) * 2^(fexp-1), 2f in [1, 2)
    k = fexp.to(torch.int64) - 1
    frac = 2.0 * f  # in [1, 2), exact
    if rounding == E8M0Rounding.UP:
        k = k + (frac > 1.0).to(torch.int64)
    elif rounding == E8M0Rounding.NEAREST_AWAY:
        k = k + (frac >= 1.5).to(torch.int64)
    elif rounding == E8M0Rounding.NEAREST_EVEN:
        # a midpoint goes to the even code: stay at k when k + 127 is even, else go up to k + 1
        tie_up = (frac == 1.5) & ((k + 127) % 2 == 1)
        k = k + ((frac > 1.5) | tie_up).to(torch.int64)
    code = k + 127
    code = torch.clamp(code, min=0)  # below 2^-127: the smallest code
    over = code > 254
    code = torch.where(over, torch.full_like(code, 254 if saturate else 255), code)
    if saturate:
        code = torch.where(torch.isposinf(x), torch.full_like(code, 254), code)
    code = torch.where(valid | (saturate & torch.isposinf(x)), code, torch.full_like(code, 255))
    return code.to(torch.uint8)


def encode(
    x: torch.Tensor,
    fmt: FloatFormat | str,
    *,
    saturate: bool = True,
    e8m0_rounding: E8M0Rounding | str = E8M0Rounding.NEAREST_EVEN,
    ties: Ties | str = Ties.EVEN,
    negative_zero: NegativeZero | str = NegativeZero.KEPT,
    nan_code: int | None = None,
) -> torch.Tensor:
    """Encode floats to codes of `fmt`, exactly (round to nearest, ties by `ties`), one uint8 code per element.

    x: any shape, dtype float16/bfloat16/float32/float64 (values are taken exactly; float64 is rounded once).
    fmt: a `FloatFormat`. e2m1 codes occupy the low 4 bits (use `pack_nibbles` for two per byte).
    saturate (default True): overflow (and +-inf) gives +-max; otherwise the format's overflow result
        (module docstring: e4m3fn NaN, e4m3fnuz 0x80, e5m2 inf, e2m1 ValueError, e8m0 0xFF).
    e8m0_rounding: only for e8m0 (default nearest_even); see `E8M0Rounding`.
    ties: signed formats only (default even); see `Ties`.
    negative_zero: signed formats only (default kept); see `NegativeZero`.
    nan_code: the code of a positive NaN input (in e4m3fn and e5m2 a negative NaN gets the sign bit too), one of
        `NAN_CODES[fmt]`;
        None: the format's default (e4m3fn and e5m2 0x7F, e4m3fnuz 0x80). Only e5m2 has a choice (0x7D, 0x7E, 0x7F).
    Returns a uint8 tensor of x's shape.
    """
    check_tensor("x", x, dtypes=_INPUT_DTYPES)
    fmt = _as_format(fmt)
    if isinstance(e8m0_rounding, str) and not isinstance(e8m0_rounding, E8M0Rounding):
        check_choice("e8m0_rounding", e8m0_rounding, [r.value for r in E8M0Rounding])
        e8m0_rounding = E8M0Rounding(e8m0_rounding)
    check_choice("e8m0_rounding", e8m0_rounding, list(E8M0Rounding))
    if isinstance(ties, str) and not isinstance(ties, Ties):
        check_choice("ties", ties, [t.value for t in Ties])
        ties = Ties(ties)
    check_choice("ties", ties, list(Ties))
    if isinstance(negative_zero, str) and not isinstance(negative_zero, NegativeZero):
        check_choice("negative_zero", negative_zero, [n.value for n in NegativeZero])
        negative_zero = NegativeZero(negative_zero)
    check_choice("negative_zero", negative_zero, list(NegativeZero))
    if nan_code is not None and nan_code not in NAN_CODES.get(fmt, ()):
        valid = ", ".join(f"0x{c:02X}" for c in NAN_CODES.get(fmt, ())) or "none (it has no NaN code to choose)"
        raise ValueError(f"nan_code of {fmt.value} must be one of {valid}, got {nan_code!r}")
    if fmt == FloatFormat.E8M0:
        return _encode_e8m0(x, saturate, e8m0_rounding)  # type: ignore[arg-type]
    return _encode_signed(x, _SPECS[fmt], saturate, ties, negative_zero, nan_code)  # type: ignore[arg-type]


def decode(codes: torch.Tensor, fmt: FloatFormat | str) -> torch.Tensor:
    """Decode uint8 codes of `fmt` to float32 (exact: every value of these formats is an fp32 value).

    codes: uint8, any shape; for e2m1 only the low 4 bits may be set (unpacked codes, see `unpack_nibbles`).
    Returns float32 of the same shape; NaN codes decode to NaN, e5m2 inf codes to +-inf, negative zeros to -0.0.
    Each code is looked up in the format's table (`code_table`, decoded from the bit fields once per device), so a
    large tensor costs one gather instead of a dozen full-size temporaries.
    """
    check_tensor("codes", codes, dtypes=(torch.uint8,))
    fmt = _as_format(fmt)
    if fmt == FloatFormat.E2M1 and bool((codes > 0xF).any()):
        raise ValueError("codes for e2m1 must be in [0, 15] (unpack packed bytes with unpack_nibbles first)")
    return _table(fmt, codes.device)[codes.long()]


@functools.cache
def _table(fmt: FloatFormat, device: torch.device) -> torch.Tensor:
    sp = _SPECS[fmt]
    return _decode_fields(torch.arange(sp.num_codes, dtype=torch.int64), sp).to(device)


def _decode_fields(c: torch.Tensor, sp: FormatSpec) -> torch.Tensor:
    """The value of each int64 code `c` of format `sp`, from its sign, exponent and mantissa fields (float32)."""
    fmt = sp.fmt
    if fmt == FloatFormat.E8M0:
        val = _pow2(c - sp.bias)
        return torch.where(c == 0xFF, torch.full_like(val, float("nan")), val).to(torch.float32)

    s = (c >> (sp.bits - 1)) & 1
    e = (c >> sp.man_bits) & ((1 << sp.exp_bits) - 1)
    m = c & ((1 << sp.man_bits) - 1)
    sub = m.to(torch.float64) * 2.0 ** (sp.emin - sp.man_bits)
    nor = (m + (1 << sp.man_bits)).to(torch.float64) * _pow2(e - sp.bias - sp.man_bits)
    mag = torch.where(e == 0, sub, nor)
    top = (1 << sp.exp_bits) - 1
    if fmt == FloatFormat.E4M3FN:
        mag = torch.where((e == top) & (m == 7), torch.full_like(mag, float("nan")), mag)
    elif fmt == FloatFormat.E4M3FNUZ:
        mag = torch.where(c == 0x80, torch.full_like(mag, float("nan")), mag)
    elif fmt == FloatFormat.E5M2:
        mag = torch.where(e == top, torch.where(m == 0, float("inf"), float("nan")), mag)
    val = torch.where(s == 1, -mag, mag)
    if fmt == FloatFormat.E4M3FNUZ:
        val = torch.where(c == 0x80, mag, val)
    return val.to(torch.float32)


def code_table(fmt: FloatFormat | str) -> torch.Tensor:
    """float32 value of every code of `fmt`, indexed by code (256 entries; 16 for e2m1)."""
    return _table(spec(fmt).fmt, torch.device("cpu")).clone()


def pack_nibbles(codes: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Pack 4-bit codes two per byte along `dim`: element 2i in the low nibble, 2i+1 in the high nibble.

    codes: uint8 with values in [0, 15]; size along `dim` must be even. Returns uint8 with that size halved.
    Used for e2m1 (FP4) elements along K and for int4 weights/zero points (along K or N).
    """
    check_tensor("codes", codes, dtypes=(torch.uint8,))
    size = codes.shape[dim]
    if size % 2:
        raise ValueError(f"codes must have an even size along dim {dim} to pack two per byte, got {size}")
    if bool((codes > 0xF).any()):
        raise ValueError("codes must be 4-bit values in [0, 15] to pack")
    c = codes.movedim(dim, -1).to(torch.int64)
    packed = c[..., 0::2] | (c[..., 1::2] << 4)
    return packed.to(torch.uint8).movedim(-1, dim).contiguous()


def unpack_nibbles(packed: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Inverse of `pack_nibbles`: uint8 bytes -> uint8 4-bit codes, size along `dim` doubled."""
    check_tensor("packed", packed, dtypes=(torch.uint8,))
    p = packed.movedim(dim, -1).to(torch.int64)
    out = torch.stack([p & 0xF, (p >> 4) & 0xF], dim=-1).flatten(-2)
    return out.to(torch.uint8).movedim(-1, dim).contiguous()
