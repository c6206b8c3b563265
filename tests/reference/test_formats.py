"""reference.formats against torch's float8 dtypes (every code, dense sweeps, midpoints) and against brute force.

Where torch 2.13's eager cast differs from the oracle's definition (saturation, e8m0 rounding/sign/zero), the
current torch behaviour is pinned explicitly so that a torch upgrade that changes it is noticed.
"""

from __future__ import annotations

import math

import pytest
import torch

from reference import formats
from reference.formats import E8M0Rounding, FloatFormat, decode, encode

TORCH_DT = {
    FloatFormat.E4M3FN: torch.float8_e4m3fn,
    FloatFormat.E4M3FNUZ: torch.float8_e4m3fnuz,
    FloatFormat.E5M2: torch.float8_e5m2,
    FloatFormat.E8M0: torch.float8_e8m0fnu,
}
FP8 = [FloatFormat.E4M3FN, FloatFormat.E4M3FNUZ, FloatFormat.E5M2]
ALL_CODES = torch.arange(256, dtype=torch.int64).to(torch.uint8)
E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # from the OCP MX spec, codes 0..7


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal as float32 bit patterns, any NaN equal to any NaN."""
    na, nb = torch.isnan(a), torch.isnan(b)
    return torch.equal(na, nb) and torch.equal(a[~na].view(torch.int32), b[~nb].view(torch.int32))


def _same_codes(a: torch.Tensor, b: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Elementwise code equality, NaN codes compared by pattern (any NaN code equals any NaN code)."""
    da, db = decode(a, fmt), decode(b, fmt)
    return (a == b) | (torch.isnan(da) & torch.isnan(db))


@pytest.mark.parametrize("fmt", [*FP8, FloatFormat.E8M0])
def test_decode_every_code_matches_torch(fmt: FloatFormat) -> None:
    ours = decode(ALL_CODES, fmt)
    theirs = ALL_CODES.view(TORCH_DT[fmt]).float()
    assert _same_bits(ours, theirs)


def test_decode_e2m1_every_code_matches_spec_table() -> None:
    codes = torch.arange(16, dtype=torch.int64).to(torch.uint8)
    want = torch.tensor(E2M1_VALUES + [-v for v in E2M1_VALUES])
    got = decode(codes, "e2m1")
    assert torch.equal(got, want)
    assert torch.equal(torch.signbit(got), torch.arange(16) >= 8)  # code 8 is -0


@pytest.mark.parametrize(
    ("fmt", "max_value", "nan_count", "inf_count"),
    [("e4m3fn", 448.0, 2, 0), ("e4m3fnuz", 240.0, 1, 0), ("e5m2", 57344.0, 6, 2), ("e8m0", 2.0**127, 1, 0)],
)
def test_code_table_counts(fmt: str, max_value: float, nan_count: int, inf_count: int) -> None:
    t = formats.code_table(fmt).double()
    assert t[torch.isfinite(t)].abs().max().item() == max_value
    assert int(torch.isnan(t).sum()) == nan_count
    assert int(torch.isinf(t).sum()) == inf_count
    assert formats.spec(fmt).max_value == max_value


def _sweep_points(fmt: FloatFormat) -> torch.Tensor:
    """Every finite value, every midpoint between neighbours, one fp32 ulp either side, the overflow edge."""
    t = formats.code_table(fmt)
    pos = torch.unique(t[torch.isfinite(t) & (t >= 0)]).double()
    mids = (pos[1:] + pos[:-1]) / 2
    sp = formats.spec(fmt)
    nxt = sp.max_value + 2.0 ** (sp.emax - sp.man_bits)  # the first value past max, if the format went on
    edge = torch.tensor([sp.max_value, (sp.max_value + nxt) / 2, nxt, nxt * 1.5, 1e30], dtype=torch.float64)
    base = torch.cat([pos, mids, edge]).float()
    up = torch.nextafter(base, torch.full_like(base, math.inf))
    down = torch.nextafter(base, torch.zeros_like(base))
    v = torch.cat([base, up, down])
    return torch.cat([v, -v])


#: torch's eager fp32 -> e4m3fn cast saturates from 2.13 on (docs/SEMANTICS.md §2: <= 2.12 gives NaN above 464).
TORCH_E4M3FN_SATURATES = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13)


def _dense_fp32() -> torch.Tensor:
    """A dense sweep of fp32 bit patterns over the whole range (subnormals included), both signs."""
    bits = torch.arange(0, 0x7F800000, 4093, dtype=torch.int64).to(torch.int32)
    v = bits.view(torch.float32)
    return torch.cat([v, -v])


@pytest.mark.parametrize("fmt", FP8)
def test_encode_matches_torch_cast_on_midpoints_and_dense_sweep(fmt: FloatFormat) -> None:
    x = torch.cat([_sweep_points(fmt), _dense_fp32()])
    # torch >= 2.13 saturates e4m3fn, older torch does not; e4m3fnuz/e5m2 never saturate (pinned below)
    ours = encode(x, fmt, saturate=fmt == FloatFormat.E4M3FN and TORCH_E4M3FN_SATURATES)
    theirs = x.to(TORCH_DT[fmt]).view(torch.uint8)
    same = _same_codes(ours, theirs, fmt)
    assert bool(same.all()), f"{fmt.value}: {x[~same][:5].tolist()} -> ours {ours[~same][:5].tolist()}, torch " \
        f"{theirs[~same][:5].tolist()}"


@pytest.mark.parametrize("fmt", FP8)
def test_encode_decode_round_trip_every_code(fmt: FloatFormat) -> None:
    vals = decode(ALL_CODES, fmt)
    back = encode(vals, fmt, saturate=False)
    assert bool(_same_codes(back, ALL_CODES, fmt).all())
    finite = torch.isfinite(vals)
    assert torch.equal(back[finite], ALL_CODES[finite])  # finite codes come back byte for byte (incl. -0)


def test_encode_from_float64_rounds_once() -> None:
    # 1 + 2^-4 + 2^-40 is just above the e4m3fn midpoint between 1 and 1.125; via fp32 it would be a tie -> 1
    x = torch.tensor([1.0 + 2.0**-4 + 2.0**-40], dtype=torch.float64)
    assert encode(x, "e4m3fn").item() == 0x39  # 1.125
    assert encode(x.float(), "e4m3fn").item() == 0x38  # 1.0 (tie to even after fp32 rounding)


def test_overflow_behaviour_per_format() -> None:
    big = torch.tensor([1e6, -1e6, math.inf, -math.inf])
    assert encode(big, "e4m3fn", saturate=True).tolist() == [0x7E, 0xFE, 0x7E, 0xFE]
    assert encode(big, "e4m3fn", saturate=False).tolist() == [0x7F, 0xFF, 0x7F, 0xFF]
    assert encode(big, "e4m3fnuz", saturate=True).tolist() == [0x7F, 0xFF, 0x7F, 0xFF]
    assert encode(big, "e4m3fnuz", saturate=False).tolist() == [0x80] * 4
    assert encode(big, "e5m2", saturate=True).tolist() == [0x7B, 0xFB, 0x7B, 0xFB]
    assert encode(big, "e5m2", saturate=False).tolist() == [0x7C, 0xFC, 0x7C, 0xFC]
    # the rounding edge: 464 is the midpoint 448|480 and ties to 448 (even mantissa), above it overflows
    edge = torch.tensor([464.0, float(torch.nextafter(torch.tensor(464.0), torch.tensor(500.0)))])
    assert encode(edge, "e4m3fn", saturate=False).tolist() == [0x7E, 0x7F]
    assert encode(torch.tensor([6.9, 7.0, 7.1, 100.0, -math.inf]), "e2m1").tolist() == [7, 7, 7, 7, 15]
    with pytest.raises(ValueError, match="overflow e2m1"):
        encode(torch.tensor([7.0]), "e2m1", saturate=False)
    assert encode(torch.tensor([6.9]), "e2m1", saturate=False).tolist() == [7]  # rounds to 6: no overflow


def test_nan_and_zero_codes() -> None:
    x = torch.tensor([math.nan, -math.nan, 0.0, -0.0, -1e-30])
    assert encode(x, "e4m3fn").tolist() == [0x7F, 0xFF, 0x00, 0x80, 0x80]
    assert encode(x, "e4m3fnuz").tolist() == [0x80, 0x80, 0x00, 0x00, 0x00]  # no -0 in fnuz: 0x80 is NaN
    assert encode(x, "e5m2").tolist() == [0x7F, 0xFF, 0x00, 0x80, 0x80]
    assert encode(x, "e8m0").tolist() == [0xFF, 0xFF, 0xFF, 0xFF, 0xFF]
    with pytest.raises(ValueError, match="NaN"):
        encode(torch.tensor([math.nan]), "e2m1")


def test_e2m1_rounding_midpoints() -> None:
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.5, 7.0, 1e9, 0.2500001, 4.9999])
    want = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 6.0, 0.5, 4.0]
    assert decode(encode(x, "e2m1"), "e2m1").tolist() == want
    assert decode(encode(-x, "e2m1"), "e2m1").tolist() == [-w for w in want]


def test_e2m1_against_brute_force_nearest_even() -> None:
    table = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    x = torch.linspace(-7.5, 7.5, 6001, dtype=torch.float64)
    x = torch.cat([x, (table[1:] + table[:-1]) / 2, -(table[1:] + table[:-1]) / 2])
    dist = (x.abs().clamp(max=6.0)[:, None] - table[None, :]).abs()
    best = dist.min(dim=1, keepdim=True).values
    cand = (dist == best).to(torch.int64) * (10 - (torch.arange(8) % 2))  # prefer the even code on a tie
    mag_code = cand.argmax(dim=1)
    want = mag_code + 8 * torch.signbit(x).to(torch.int64)
    assert torch.equal(encode(x, "e2m1").to(torch.int64), want)


def _e8m0_brute(x: float, rounding: str) -> int:
    m, e = math.frexp(x)  # x = m * 2^e, m in [0.5, 1)
    k = e - 1
    f = 2 * m
    if rounding == "up":
        k += f > 1
    elif rounding == "nearest_away":
        k += f >= 1.5
    elif rounding == "nearest_even":
        k += f > 1.5 or (f == 1.5 and (k + 127) % 2 == 1)
    return min(max(k + 127, 0), 255)


@pytest.mark.parametrize("rounding", [r.value for r in E8M0Rounding])
def test_e8m0_rounding_modes_against_frexp(rounding: str) -> None:
    vals = [1.0, 1.5, 3.0, 6.0, 0.75, 1.4999999, 1.5000001, 2.0**-127, 2.0**-130, 1e-45, 2.0**126 * 1.2, 7.0]
    x = torch.tensor(vals, dtype=torch.float32)
    want = [_e8m0_brute(float(v), rounding) for v in x.double()]
    assert encode(x, "e8m0", e8m0_rounding=rounding, saturate=False).tolist() == want


def test_e8m0_saturation() -> None:
    x = torch.tensor([2.0**127 * 1.9, math.inf])
    assert encode(x, "e8m0", e8m0_rounding="up", saturate=True).tolist() == [254, 254]
    assert encode(x, "e8m0", e8m0_rounding="up", saturate=False).tolist() == [255, 255]


def test_e8m0_nearest_away_matches_torch_on_positive_normal_values() -> None:
    x = _dense_fp32()
    x = torch.cat([x[x >= 2.0**-126], torch.tensor([1.5, 3.0, 6.0, 0.75, 2.0**-126 * 1.5, 2.0**127 * 1.5])])
    ours = encode(x, "e8m0", e8m0_rounding="nearest_away", saturate=False)
    theirs = x.to(torch.float8_e8m0fnu).view(torch.uint8)
    same = _same_codes(ours, theirs, FloatFormat.E8M0)
    assert bool(same.all()), x[~same][:5].tolist()


# ------------------------------------------------------------------ pins of torch 2.13's eager cast behaviour

_PIN = ("torch's eager cast changed ({what}). The oracle does not depend on it (it encodes from bit fields), but "
        "tests and adapters that use torch's casts may: update this pin and docs/SEMANTICS.md §2 (torch's casts).")


def test_pin_torch_e4m3fn_cast_overflow() -> None:
    got = torch.tensor([464.0, 464.5, 500.0, 1e9, math.inf, -math.inf]).to(torch.float8_e4m3fn).view(torch.uint8)
    if TORCH_E4M3FN_SATURATES:  # seen on torch 2.13 (CPU)
        want, what = [0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE], "no longer saturates to +-448"
    else:  # seen on torch 2.11 (CPU and CUDA): above the 464 midpoint overflow becomes NaN, sign kept
        want, what = [0x7E, 0x7F, 0x7F, 0x7F, 0x7F, 0xFF], "now differs from the non-saturating NaN rule"
    assert got.tolist() == want, _PIN.format(what=f"fp32->e4m3fn overflow {what}: {got.tolist()}")


def test_pin_torch_fnuz_and_e5m2_casts_do_not_saturate() -> None:
    fnuz = torch.tensor([247.9, 248.0, 1e9, math.inf]).to(torch.float8_e4m3fnuz).view(torch.uint8)
    assert fnuz.tolist() == [0x7F, 0x80, 0x80, 0x80], _PIN.format(what=f"e4m3fnuz overflow: {fnuz.tolist()}")
    e5 = torch.tensor([61439.0, 61440.0, 1e9, -math.inf]).to(torch.float8_e5m2).view(torch.uint8)
    assert e5.tolist() == [0x7B, 0x7C, 0x7C, 0xFC], _PIN.format(what=f"e5m2 overflow: {e5.tolist()}")


def test_pin_torch_nan_codes_keep_sign() -> None:
    x = torch.tensor([math.nan, -math.nan])
    got = {fmt.value: x.to(TORCH_DT[fmt]).view(torch.uint8).tolist() for fmt in FP8}
    want = {"e4m3fn": [0x7F, 0xFF], "e4m3fnuz": [0x80, 0x80], "e5m2": [0x7F, 0xFF]}
    assert got == want, _PIN.format(what=f"NaN codes {got}")


def test_pin_torch_e8m0_cast_rounds_ties_up_ignores_sign_and_maps_zero_to_code_0() -> None:
    x = torch.tensor([1.5, 3.0, 6.0, -2.0, -3.0, 0.0, -0.0, 2.0**127 * 1.5])
    got = x.to(torch.float8_e8m0fnu).view(torch.uint8).tolist()
    want = [128, 129, 130, 128, 129, 0, 0, 255]
    assert got == want, _PIN.format(what=f"fp32->e8m0 gives {got} for {x.tolist()}")
    # the oracle's own definition differs on purpose: ties to even by default, non-positive values are NaN
    assert encode(x, "e8m0", saturate=False).tolist() == [128, 128, 130, 255, 255, 255, 255, 254]


def test_pin_torch_e8m0_cast_rounds_fp32_subnormals_by_their_bits() -> None:
    # 2^-127 * (1 + 2^-10) is nearest to 2^-127 (code 0), but torch rounds on the raw mantissa bits -> 2^-126
    x = torch.tensor([2.0**-127 * (1 + 2.0**-10), 2.0**-127, 2.0**-128])
    got = x.to(torch.float8_e8m0fnu).view(torch.uint8).tolist()
    assert got == [1, 0, 0], _PIN.format(what=f"fp32 subnormal -> e8m0 gives {got}")
    assert encode(x, "e8m0", e8m0_rounding="nearest_away").tolist() == [0, 0, 0]


def test_pack_nibbles_order_and_round_trip() -> None:
    codes = torch.tensor([[1, 2, 3, 15], [0, 8, 9, 0]], dtype=torch.uint8)
    packed = formats.pack_nibbles(codes)
    assert packed.tolist() == [[0x21, 0xF3], [0x80, 0x09]]  # element 2i low nibble, 2i+1 high
    assert torch.equal(formats.unpack_nibbles(packed), codes)
    along_rows = formats.pack_nibbles(codes, dim=0)
    assert along_rows.tolist() == [[0x01, 0x82, 0x93, 0x0F]]
    assert torch.equal(formats.unpack_nibbles(along_rows, dim=0), codes)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="fmt must be one of"):
        encode(torch.zeros(2), "e3m4")
    with pytest.raises(ValueError, match="x must have dtype"):
        encode(torch.zeros(2, dtype=torch.int32), "e4m3fn")
    with pytest.raises(ValueError, match="codes must have dtype"):
        decode(torch.zeros(2, dtype=torch.int8), "e4m3fn")
    with pytest.raises(ValueError, match=r"codes for e2m1 must be in \[0, 15\]"):
        decode(torch.tensor([16], dtype=torch.uint8), "e2m1")
    with pytest.raises(ValueError, match="even size"):
        formats.pack_nibbles(torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="e8m0_rounding must be one of"):
        encode(torch.ones(1), "e8m0", e8m0_rounding="sideways")


def test_powers_of_two_are_exact_over_the_whole_exponent_range() -> None:
    """The encoder's 2**e helper, against Python's own ldexp: the normal range (built from exponent bits), the
    subnormal results below it and the overflow above it (both through torch.ldexp)."""
    from reference.formats import _pow2

    e = torch.arange(-1100, 1100)
    want = torch.tensor([math.ldexp(1.0, k) if k <= 1023 else math.inf for k in e.tolist()], dtype=torch.float64)
    assert torch.equal(_pow2(e), want)
    assert torch.equal(_pow2(e[100:1500].to(torch.int32)), want[100:1500])  # all normal, int32 exponents
