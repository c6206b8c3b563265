"""Format rules the oracle declares beyond its defaults, each checked bit for bit against a direct emulation written
here (torch casts and operators, Python's math and struct), never against the oracle's own encoders:
- eps rounded to bfloat16 / float16 whatever the input dtype (`eps_dtype`);
- a per-tensor scale stored as torch's `1 / (448 / amax)` (`scale_formula="reciprocal_of_qmax_over_amax"`);
- fp4 (e2m1) codes without a negative zero (`e2m1_negative_zero="never"`);
- the NaN code of fp8 e5m2 (`formats.encode(..., nan_code=...)`), and e4m3fn's only one;
- how far the two forms of the ue8m0 round-up differ (`ue8m0_form`), as reference.scales says.
Each test also shows that the rule matters: the default gives other bits on the same inputs.
"""

from __future__ import annotations

import math
import struct

import pytest
import torch

from reference import formats
from reference import scales as sc
from reference.quant import QuantRecipe, logical_scales, quantize
from reference.scales import float_scale, ue8m0_round_up

FP8_MAX = 448.0
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


# ---------------------------------------------------------------------------------------------------- eps_dtype


@pytest.mark.parametrize("eps_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_eps_in_a_named_dtype_is_torch_clamp_with_that_eps(eps_dtype: torch.dtype, x_dtype: torch.dtype) -> None:
    """torch code `x.float().abs().amax(-1).clamp(min=eps_t)` with eps a tensor of that dtype, per group of 64."""
    eps = 1e-3  # neither a bf16 nor an fp16 value
    x = (torch.randn(6, 128, generator=_gen(1)) * 3).to(x_dtype)
    x[1, :64] = (torch.rand(64, generator=_gen(2)) * eps * 0.5).to(x_dtype)  # a group below eps
    x[3, 64:] = 0.0  # an all-zero group
    eps_t = torch.tensor(eps).to(eps_dtype).to(torch.float32)
    xg = x.float().reshape(6, 2, 64)
    s = xg.abs().amax(-1, keepdim=True).clamp(min=eps_t) / FP8_MAX
    codes = (xg / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8).reshape(6, 128)
    name = "bfloat16" if eps_dtype == torch.bfloat16 else "float16"
    qt = quantize(x, QuantRecipe(group_size=64, eps=eps, eps_dtype=name))
    assert torch.equal(qt.codes, codes)
    assert torch.equal(_bits(logical_scales(qt)), _bits(s.squeeze(-1)))
    if x_dtype == eps_dtype:  # `input` is the same rounding here
        assert torch.equal(quantize(x, QuantRecipe(group_size=64, eps=eps, eps_dtype="input")).codes, codes)
    default = logical_scales(quantize(x, QuantRecipe(group_size=64, eps=eps)))
    assert not torch.equal(_bits(default), _bits(s.squeeze(-1)))  # fp32(eps): the two guarded groups differ


# ------------------------------------------------------------------------- 1 / (448 / amax) as torch computes it


def test_reciprocal_of_qmax_over_amax_is_torch_one_over_448_over_amax() -> None:
    """The brief's example: amax 185 (a bf16 value) gives 0.41294640302658081, the other forms 0.41294643282890320."""
    amax = torch.tensor([185.0])
    torch_form = 1 / (FP8_MAX / amax)
    assert f"{torch_form.item():.17g}" == "0.41294640302658081"
    got = float_scale(amax, FP8_MAX, formula="reciprocal_of_qmax_over_amax")
    assert torch.equal(_bits(got), _bits(torch_form))
    for other in ("divide", "multiply_reciprocal", "reciprocal_of_factor"):
        assert f"{float_scale(amax, FP8_MAX, formula=other).item():.17g}" == "0.4129464328289032", other


def test_per_tensor_scale_and_codes_of_torch_code_dividing_448_by_amax() -> None:
    """torch code quantizing per tensor: factor = 448 / amax (fp32 tensor), codes of x * factor, 1 / factor stored.
    Random amaxes: about one in four gives a scale other than amax / 448."""
    xs = [(torch.randn(3, 64, generator=_gen(s)) * (s + 1) * 7).to(torch.bfloat16) for s in range(40)]
    differ = 0
    for x in xs:
        factor = FP8_MAX / x.float().abs().amax()
        codes = (x.float() * factor).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
        scale = 1 / factor
        r = QuantRecipe(unit="tensor", scale_formula="reciprocal_of_qmax_over_amax", application="qmax_over_amax")
        qt = quantize(x, r)
        assert torch.equal(qt.codes, codes)
        assert torch.equal(_bits(qt.scales.reshape(1)), _bits(scale.reshape(1)))
        differ += int(quantize(x, QuantRecipe(unit="tensor", application="qmax_over_amax")).scales != scale)
    assert differ >= 3, differ


def test_reciprocal_of_qmax_over_amax_of_zero_is_zero_and_not_for_nvfp4() -> None:
    assert float_scale(torch.zeros(1), FP8_MAX, eps=0.0, formula="reciprocal_of_qmax_over_amax").item() == 0.0
    with pytest.raises(ValueError, match="reciprocal_of_qmax_over_amax"):
        QuantRecipe.nvfp4(scale_formula="reciprocal_of_qmax_over_amax")
    with pytest.raises(ValueError, match="eps_placement 'amax'"):
        QuantRecipe(scale_formula="reciprocal_of_qmax_over_amax", eps_placement="scale")


# ------------------------------------------------------------------------------------------ e2m1 negative zero


def _e2m1_codes(y: torch.Tensor, negative_zero: bool) -> torch.Tensor:
    """e2m1 codes of y by distance to the eight magnitudes (ties to the even code); the sign bit on every negative
    value, or only on those whose magnitude code is not 0."""
    d = (y.double().abs().clamp(max=6.0)[..., None] - E2M1_VALUES).abs()
    best = d.min(dim=-1, keepdim=True).values
    mag = ((d == best) * (2 - torch.arange(8) % 2)).argmax(dim=-1)  # an even code wins a tie
    neg = torch.signbit(y) if negative_zero else torch.signbit(y) & (mag != 0)
    return (mag | (neg.to(torch.int64) << 3)).to(torch.uint8)


def _mxfp4(x: torch.Tensor, negative_zero: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """OCP MXFP4 by hand: scale 2^(floor(log2 amax) - 2) per 32, codes packed low nibble first, e8m0 bytes."""
    xg = x.float().reshape(x.shape[0], -1, 32)
    e = torch.floor(torch.log2(xg.abs().amax(-1, keepdim=True).double())) - 2
    codes = _e2m1_codes(xg / torch.exp2(e).float(), negative_zero).reshape(x.shape)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8), (e.squeeze(-1) + 127).to(torch.uint8)


def test_mxfp4_without_negative_zero_is_the_emulation_that_drops_its_sign() -> None:
    x = torch.randn(8, 128, generator=_gen(5)).to(torch.bfloat16)
    for never in (True, False):
        codes, scales = _mxfp4(x, negative_zero=not never)
        qt = quantize(x, QuantRecipe.mx("mxfp4", e2m1_negative_zero="never" if never else "kept"))
        assert torch.equal(qt.codes, codes) and torch.equal(qt.scales, scales), never
    kept, never = _mxfp4(x, True)[0], _mxfp4(x, False)[0]
    assert int((kept != never).sum()) > 20  # many negative values round to zero: the codes differ
    assert torch.equal(formats.decode(formats.unpack_nibbles(kept), "e2m1").abs(),
                       formats.decode(formats.unpack_nibbles(never), "e2m1").abs())


def test_nvfp4_without_negative_zero_only_clears_the_sign_of_zero_codes() -> None:
    x = torch.randn(4, 64, generator=_gen(6))
    kept = formats.unpack_nibbles(quantize(x, QuantRecipe.nvfp4()).codes)
    never = formats.unpack_nibbles(quantize(x, QuantRecipe.nvfp4(e2m1_negative_zero="never")).codes)
    assert int((kept == 0x8).sum()) > 0
    assert torch.equal(never, torch.where(kept == 0x8, torch.zeros_like(kept), kept))


def test_encode_negative_zero_never_on_every_signed_format() -> None:
    y = torch.tensor([-0.0, -1e-30, -0.2, 0.0, -0.3, -448.0])
    assert formats.encode(y, "e2m1", negative_zero="never").tolist() == _e2m1_codes(y, False).tolist()
    for fmt, dt in (("e4m3fn", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        cast = y.to(dt).view(torch.uint8)  # torch keeps the sign of zero
        assert formats.encode(y, fmt).tolist() == cast.tolist()
        want = torch.where(cast.view(dt).float() == 0, torch.zeros_like(cast), cast)
        assert formats.encode(y, fmt, negative_zero="never").tolist() == want.tolist()
    with pytest.raises(ValueError, match="negative_zero must be one of 'kept', 'never'"):
        formats.encode(y, "e2m1", negative_zero="drop")


# --------------------------------------------------------------------------------------------------- NaN codes


def test_e5m2_nan_code_is_declarable_and_e4m3fn_has_one() -> None:
    nans = torch.tensor([float("nan"), -float("nan")])
    # default: torch's cast (all mantissa bits set, sign kept)
    assert formats.encode(nans, "e5m2").tolist() == nans.to(torch.float8_e5m2).view(torch.uint8).tolist()
    assert formats.encode(nans, "e4m3fn").tolist() == nans.to(torch.float8_e4m3fn).view(torch.uint8).tolist()
    assert formats.encode(nans, "e4m3fn").tolist() == [0x7F, 0xFF]
    for mantissa in (0b01, 0b10, 0b11):  # S.11111.mm, mm != 0: an e5m2 NaN (0b10: IEEE quiet, ml_dtypes' choice)
        code = (0b11111 << 2) | mantissa
        got = formats.encode(nans, "e5m2", nan_code=code)
        assert got.tolist() == [code, 0x80 | code]
        assert bool(got.view(torch.float8_e5m2).float().isnan().all())  # torch reads them as NaN too
    assert formats.encode(torch.tensor([1.0, -2.0]), "e5m2", nan_code=0x7E).tolist() == [0x3C, 0xC0]  # no NaN
    with pytest.raises(ValueError, match="nan_code of e5m2 must be one of 0x7F, 0x7E, 0x7D, got 124"):
        formats.encode(nans, "e5m2", nan_code=0x7C)  # +inf
    with pytest.raises(ValueError, match="nan_code of e4m3fn must be one of 0x7F, got 126"):
        formats.encode(nans, "e4m3fn", nan_code=0x7E)  # 448
    with pytest.raises(ValueError, match="e2m1 must be one of none"):
        formats.encode(torch.zeros(1), "e2m1", nan_code=0x7)


# ----------------------------------------------------------------------------------- the two ue8m0 round-ups


def _fp32(v: float) -> float:
    return struct.unpack("<f", struct.pack("<f", v))[0]


def _exponent_bits(s: float) -> float:
    """Biased exponent + 1 when a mantissa bit is set (from the fp32 bit pattern)."""
    b = struct.unpack("<I", struct.pack("<f", s))[0]
    code = (b >> 23) + (1 if b & 0x7FFFFF else 0)
    return 2.0 ** (code - 127)


def _ceil_log2(s: float) -> float:
    """2^ceil(fp32(log2 s)): Python's log2 of the exact value (a double), rounded to fp32."""
    return 2.0 ** math.ceil(_fp32(math.log2(s)))


def _ulps_differing_above(k: int, depth: int = 40) -> int:
    """How many of the fp32 scales 2^k (1 + j 2^-23), j = 1..depth, the two forms round to different powers."""
    s = [2.0**k * (1 + j * 2.0**-23) for j in range(1, depth + 1)]
    return sum(_exponent_bits(v) != _ceil_log2(v) for v in s)


def test_the_ue8m0_forms_differ_as_reference_scales_says() -> None:
    ks = list(range(-126, 128))
    n = {k: _ulps_differing_above(k) for k in ks}
    want = {1: range(4, 8), 2: range(8, 16), 5: range(16, 32), 11: range(32, 64), 22: range(64, 128)}
    for count, span in want.items():
        for k in span:
            assert n[k] == count, (k, n[k])
            if k < 126:  # a negative k as |k| - 1 (normal scales end at 2^-126)
                assert n[-(k + 1)] == count, (-(k + 1), n[-(k + 1)])
    assert all(n[k] == 0 for k in (-4, -3, -2, -1, 0, 1, 2, 3))
    # the differing ones are the first ulps above 2^k: exponent_bits 2^(k+1), ceil_log2 2^k; the oracle agrees
    s = torch.tensor([2.0**k * (1 + j * 2.0**-23) for k in ks for j in range(1, 24)], dtype=torch.float32)
    bits_form = torch.tensor([_exponent_bits(v) for v in s.tolist()], dtype=torch.float32)
    log_form = torch.tensor([_ceil_log2(v) for v in s.tolist()], dtype=torch.float32)
    assert torch.equal(ue8m0_round_up(s), bits_form)
    assert torch.equal(ue8m0_round_up(s, form="ceil_log2"), log_form)
    # never below a power of two
    below = [2.0**k * (1 - j * 2.0**-24) for k in ks for j in range(1, 24)]
    assert all(_exponent_bits(_fp32(v)) == _ceil_log2(_fp32(v)) for v in below)
    assert "22 for 64 <= k <= 127" in sc.__doc__ and "2^-127 + 11 ulps" in sc.__doc__


def test_the_ue8m0_forms_on_subnormal_scales() -> None:
    """exponent_bits makes every subnormal 2^-126; ceil_log2 gives at most 2^-127 up to 2^-127 + 11 ulps (2^22 +
    11 of the 2^23 - 1 subnormals), 2^-126 above. Sampled: the ends of each region and a spread between."""
    tiny = 2.0**-149
    ulps = [1, 2, 3, 1000, 2**21, 2**22 - 1, 2**22, 2**22 + 1, 2**22 + 11, 2**22 + 12, 2**22 + 13, 3 * 2**21,
            2**23 - 1]
    s = [j * tiny for j in ulps]
    assert all(_exponent_bits(v) == 2.0**-126 for v in s)
    log_form = [_ceil_log2(v) for v in s]
    differ = [j for j, v in zip(ulps, log_form) if v != 2.0**-126]
    assert differ == [j for j in ulps if j <= 2**22 + 11]
    assert all(v <= 2.0**-127 for v, j in zip(log_form, ulps) if j <= 2**22 + 11)
    st = torch.tensor(s, dtype=torch.float32)
    assert ue8m0_round_up(st).tolist() == [2.0**-126] * len(s)
    assert ue8m0_round_up(st, form="ceil_log2").tolist() == log_form
    e8m0 = ue8m0_round_up(st, form="ceil_log2", e8m0_range=True).tolist()  # stored as a byte: 2^-127 at least
    assert e8m0 == [max(v, 2.0**-127) for v in log_form]
