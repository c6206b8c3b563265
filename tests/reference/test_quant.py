"""reference.quant against independent derivations: float64 arithmetic, torch's (pinned) fp8 casts, brute-force
e2m1 rounding, explicit per-element formulas for packing and zero points, and round-trip invariants."""

from __future__ import annotations

import json
import math

import pytest
import torch

from reference import formats
from reference.quant import QuantizedTensor, QuantRecipe, dequantize, logical_scales, quantize

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _x(m: int, k: int, seed: int = 0) -> torch.Tensor:
    g = _gen(seed)
    return torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-3, 4, (m, 1), generator=g).float())


def _e2m1_brute(y: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 code by search over the 8 magnitudes, ties to the even code; y already within [-6, 6]."""
    dist = (y.double().abs()[..., None] - E2M1).abs()
    best = dist.min(dim=-1, keepdim=True).values
    mag = ((dist == best).to(torch.int64) * (10 - torch.arange(8) % 2)).argmax(dim=-1)
    return (mag + 8 * torch.signbit(y).to(torch.int64)).to(torch.uint8)


# ------------------------------------------------------------------------------------------- fp8 and int8


@pytest.mark.parametrize("application", ["divide", "multiply_reciprocal"])
@pytest.mark.parametrize("group", [64, 128])
def test_fp8_group_codes_against_float64_and_torch_cast(application: str, group: int) -> None:
    x = _x(6, 256, seed=group).bfloat16()
    qt = quantize(x, QuantRecipe(group_size=group, application=application))
    xg = x.double().view(6, -1, group)
    amax = xg.abs().amax(-1).clamp(min=float(torch.tensor(1e-10)))
    s = (amax / 448.0).float()
    s64 = s.double()[..., None]
    y = (xg / s64) if application == "divide" else (xg * (1.0 / s).double()[..., None])
    want = y.float().clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).view(6, 256)
    assert torch.equal(qt.scales, s)
    assert torch.equal(qt.codes, want)


def test_qmax_over_amax_application_against_float64() -> None:
    """DeepGEMM's older helpers scale by `qmax / max(amax, eps)`, which torch evaluates as reciprocal() * qmax: two
    fp32 roundings (fp32(1/a), then the product), not by 1/s: other codes, same stored scale."""
    x = _x(16, 256, seed=7).bfloat16()
    recipe = QuantRecipe(group_size=128, application="qmax_over_amax", eps=1e-4)
    qt = quantize(x, recipe)
    xg = x.double().view(16, -1, 128)
    amax = xg.abs().amax(-1).clamp(min=float(torch.tensor(1e-4)))
    recip = (1.0 / amax).float().double()  # fp32(1 / a), via exact float64
    factor = (recip * 448.0).float().double()[..., None]  # fp32(fp32(1 / a) * 448): the product is exact in fp64
    want = (xg * factor).float().clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).view(16, 256)
    assert torch.equal(qt.codes, want)
    assert torch.equal(qt.scales, (amax / 448.0).float())
    divide = quantize(x, QuantRecipe(group_size=128, eps=1e-4))
    assert torch.equal(divide.scales, qt.scales) and not torch.equal(divide.codes, qt.codes)
    with pytest.raises(ValueError, match="qmax_over_amax"):
        QuantRecipe(application="qmax_over_amax", scale_rule="ue8m0")


def test_qmax_over_amax_is_what_torch_computes_not_the_correctly_rounded_quotient() -> None:
    x = torch.zeros(1, 128, dtype=torch.bfloat16)
    x[0, 0], x[0, 1] = -0.5625, 3.0
    qt = quantize(x, QuantRecipe(application="qmax_over_amax", eps=1e-4))
    assert int(qt.codes[0, 0]) == 0xEB  # -88
    # the PyTorch expression the convention models (pins torch's scalar / tensor as reciprocal then multiply)
    amax = x.float().abs().amax(dim=-1, keepdim=True).clamp(min=1e-4)
    helper = (x.float() * (448.0 / amax)).to(torch.float8_e4m3fn).view(torch.uint8)
    assert int(helper[0, 0]) == 0xEB
    # one rounding of 448 / 3 would give -80 (0xea): the factors differ by one ulp
    rounded_once = (torch.tensor(448.0 / 3.0).float() * x.float()).to(torch.float8_e4m3fn).view(torch.uint8)
    assert int(rounded_once[0, 0]) == 0xEA


def test_per_tensor_and_per_row_scales() -> None:
    x = _x(4, 40)
    qt = quantize(x, QuantRecipe(unit="tensor", dtype="fp8_e5m2"))
    assert qt.scales.shape == () and qt.scales.item() == (x.abs().max().double() / 57344.0).float().item()
    qt = quantize(x, QuantRecipe(unit="row"))
    assert qt.scales.shape == (4, 1)
    assert torch.equal(qt.scales[:, 0], (x.abs().amax(1).double() / 448.0).float())


def test_ragged_k_groups_and_block_edges() -> None:
    x = _x(130, 200, seed=3)
    with pytest.raises(ValueError, match="group_size 128 does not divide K=200"):
        quantize(x, QuantRecipe())
    qt = quantize(x, QuantRecipe(ragged_k=True))
    assert torch.equal(qt.scales[:, 1], (x[:, 128:].abs().amax(1).double() / 448).float())
    qb = quantize(x, QuantRecipe(unit="block"))
    assert qb.scales.shape == (2, 2)
    for i, rows in enumerate((slice(0, 128), slice(128, 130))):
        for j, cols in enumerate((slice(0, 128), slice(128, 200))):
            assert qb.scales[i, j] == (x[rows, cols].abs().max().double() / 448).float()
    assert (dequantize(qb) - x).abs().max() <= x.abs().max() / 16


@pytest.mark.parametrize(
    ("rounding", "want"),
    [
        ("half_even", [0, 2, 2, -0, -2, -2, 0, 127, 127, -128, 4, -4, 1]),
        ("half_away", [1, 2, 3, -1, -2, -3, 0, 127, 127, -128, 4, -4, 1]),
        ("truncate", [0, 1, 2, 0, -1, -2, 0, 127, 127, -128, 3, -3, 0]),
    ],
)
def test_int8_rounding_rules_at_ties(rounding: str, want: list[int]) -> None:
    v = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 127.5, 200.0, -200.0, 3.7, -3.7, 0.99999994])
    qt = quantize(v[None], QuantRecipe(dtype="int8", unit="row", int8_rounding=rounding), scales=torch.ones(1, 1))
    assert qt.codes.dtype == torch.int8
    assert qt.codes[0].tolist() == want


def test_all_zero_group_denormal_amax_and_zero_scale() -> None:
    x = torch.zeros(2, 256)
    x[1, :128] = 1e-41  # denormal amax: eps wins
    qt = quantize(x, QuantRecipe())
    eps_scale = (torch.tensor(1e-10).double() / 448).float()
    assert torch.equal(qt.scales, eps_scale.expand(2, 2))
    assert int(qt.codes.to(torch.int64).sum()) == 0
    qt0 = quantize(x, QuantRecipe(eps=0.0))
    assert qt0.scales[0].tolist() == [0.0, 0.0]  # zero scale -> zero codes, no NaN
    assert bool(torch.isfinite(dequantize(qt0)).all()) and int(qt0.codes[0].to(torch.int64).sum()) == 0


def test_non_finite_inputs_are_rejected() -> None:
    for bad in (math.nan, math.inf, -math.inf):
        x = torch.ones(1, 128)
        x[0, 5] = bad
        with pytest.raises(ValueError, match="x contains NaN or inf"):
            quantize(x, QuantRecipe())


def test_amax_exactly_at_qmax_is_lossless_for_representable_values() -> None:
    codes = torch.arange(0, 0x7F, dtype=torch.int64).to(torch.uint8)  # every finite non-negative e4m3fn code
    vals = formats.decode(codes, "e4m3fn")
    x = torch.cat([vals, -vals])[None]
    qt = quantize(x, QuantRecipe(unit="row"))
    assert qt.scales.item() == 1.0
    assert torch.equal(dequantize(qt), x)


def test_non_contiguous_inputs() -> None:
    x = _x(256, 64, seed=5)
    for view in (x.t(), x[:, ::2].t()[:, :128], x.t()[:, 1::2]):
        assert not view.is_contiguous()
        a, b = quantize(view, QuantRecipe()), quantize(view.contiguous(), QuantRecipe())
        assert torch.equal(a.codes, b.codes) and torch.equal(a.scales, b.scales)


@pytest.mark.parametrize("dtype", ["fp8_e4m3fn", "fp8_e4m3fnuz", "fp8_e5m2"])
def test_quant_of_dequant_is_identity_for_every_code(dtype: str) -> None:
    fmt = dtype.removeprefix("fp8_")
    vals = formats.code_table(fmt)
    keep = torch.isfinite(vals)
    codes = torch.arange(256, dtype=torch.int64).to(torch.uint8)[keep]
    s = torch.tensor([[0.125]])
    qt = QuantizedTensor(codes=codes[None], scales=s, recipe=QuantRecipe(dtype=dtype, unit="row"),
                         shape=(1, int(keep.sum())))
    again = quantize(dequantize(qt), qt.recipe)
    assert again.scales.item() == 0.125
    same = (again.codes == qt.codes) | ((codes == 0x80) & (again.codes == 0))  # fnuz has no -0
    assert bool(same.all())


def test_int8_quant_of_dequant_for_every_code() -> None:
    codes = torch.arange(-128, 128, dtype=torch.int64).to(torch.int8)[None]
    r = QuantRecipe(dtype="int8", unit="row")
    x = dequantize(QuantizedTensor(codes=codes, scales=torch.tensor([[0.5]]), recipe=r, shape=(1, 256)))
    assert torch.equal(quantize(x, r, scales=torch.tensor([[0.5]])).codes, codes)


@pytest.mark.parametrize(
    "recipe",
    [QuantRecipe(), QuantRecipe(dtype="fp8_e5m2", unit="row"), QuantRecipe(dtype="fp8_e4m3fnuz", group_size=32),
     QuantRecipe(scale_rule="ue8m0"), QuantRecipe(dtype="int8", int8_rounding="half_away")],
    ids=lambda r: f"{r.dtype.value}-{r.unit.value}-{r.scale_rule.value}",
)
def test_dequant_of_quant_within_half_a_step(recipe: QuantRecipe) -> None:
    x = _x(8, 256, seed=7)
    qt = quantize(x, recipe)
    s = dequantize(QuantizedTensor(codes=torch.ones_like(qt.codes), scales=qt.scales, recipe=recipe,
                                   shape=qt.shape)) if recipe.dtype.value == "int8" else None
    err = (dequantize(qt) - x).abs()
    if s is not None:  # int8: half a scale
        assert bool((err <= 0.5 * s * (1 + 1e-6)).all())
        return
    sp = formats.spec(recipe.dtype.value.removeprefix("fp8_"))
    sc = logical_scales(qt).repeat_interleave(recipe.group_size if recipe.unit.value == "group" else 256, -1)
    y = (x / sc).abs().double()
    step = torch.exp2(torch.floor(torch.log2(y.clamp(min=2.0 ** sp.emin))) - sp.man_bits)
    assert bool((err.double() <= 0.5 * step * sc.double() * (1 + 1e-6)).all())


# --------------------------------------------------------------------------------------------- MX, NVFP4


def test_mxfp4_against_brute_force_and_packing_order() -> None:
    x = _x(4, 64, seed=11)
    qt = quantize(x, QuantRecipe.mx("mxfp4"))
    xb = x.double().view(4, 2, 32)
    amax = xb.abs().amax(-1)
    e = torch.floor(torch.log2(amax)) - 2
    assert torch.equal(qt.scales.to(torch.int64), (e + 127).to(torch.int64))
    y = (xb / torch.exp2(e)[..., None]).clamp(-6, 6).view(4, 64)
    want = _e2m1_brute(y)
    assert torch.equal(qt.codes & 0xF, want[:, 0::2]) and torch.equal(qt.codes >> 4, want[:, 1::2])


def test_mxfp8_ocp_floor_clamps_overflowing_elements() -> None:
    x = torch.zeros(1, 32)
    x[0, :3] = torch.tensor([486.4, -300.0, 1.0])  # floor(log2 486.4) = 8 -> scale 2^0, 486.4 > 448 clamps
    qt = quantize(x, QuantRecipe.mx("mxfp8"))
    assert qt.scales.tolist() == [[127]]
    assert dequantize(qt)[0, :3].tolist() == [448.0, -288.0, 1.0]
    qu = quantize(x, QuantRecipe.mx("mxfp8", scale_rule="ue8m0"))  # ceil rule: no overflow, coarser
    assert qu.scales.tolist() == [[128]] and dequantize(qu)[0, 0].item() == 480.0


def test_mx_round_trip_every_e2m1_code() -> None:
    vals = formats.code_table("e2m1") * 0.25  # amax 1.5 -> scale 2^(0 - 2)
    x = torch.cat([vals, vals])[None]
    qt = quantize(x, QuantRecipe.mx("mxfp4"))
    assert qt.scales.tolist() == [[125]]
    assert torch.equal(dequantize(qt), x)


@pytest.mark.parametrize("convention", ["quant_side", "dequant_side"])
def test_nvfp4_against_float64_derivation(convention: str) -> None:
    x = _x(3, 64, seed=13)
    qt = quantize(x, QuantRecipe.nvfp4(global_scale=convention))
    amax_t = x.abs().max().double()
    g = (2688.0 / amax_t if convention == "quant_side" else amax_t / 2688.0).float()
    assert qt.global_scale.item() == g.item()
    per = (x.double().view(3, 4, 16).abs().amax(-1) / 6.0).float().double()
    sb = (per * g.double() if convention == "quant_side" else per / g.double()).float()
    sb_codes = sb.to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(qt.scales, sb_codes)
    sbd = sb_codes.view(torch.float8_e4m3fn).double()
    es = (sbd / g.double() if convention == "quant_side" else sbd * g.double()).float()
    y = (x.double().view(3, 4, 16) / es.double()[..., None]).float().clamp(-6, 6).view(3, 64)
    want = _e2m1_brute(y)
    assert torch.equal(formats.unpack_nibbles(qt.codes), want)
    err = (dequantize(qt) - x).abs()
    assert bool((err <= es.repeat_interleave(16, -1) * 1.0 + 1e-7).all())  # at most half the top step (2)


# ------------------------------------------------------------------------------------------- weight-only


def test_w4a16_packing_and_implicit_zero_point() -> None:
    g = _gen(17)
    q = torch.randint(0, 16, (2, 4, 8), generator=g)
    packed = (q[..., 0::2] | (q[..., 1::2] << 4)).to(torch.uint8)  # element k in byte k//2 at shift 4*(k%2)
    s = torch.rand(2, 4, 2, generator=g) + 0.5
    qt = QuantizedTensor(codes=packed, scales=s, recipe=QuantRecipe(dtype="w4a16", group_size=4), shape=(2, 4, 8))
    want = torch.empty(2, 4, 8)
    for e in range(2):
        for n in range(4):
            for k in range(8):
                byte = int(packed[e, n, k // 2])
                want[e, n, k] = ((byte >> (4 * (k % 2))) & 0xF) - 8
                want[e, n, k] *= s[e, n, k // 4]
    assert torch.equal(dequantize(qt), want)
    qt8 = QuantizedTensor(codes=q.to(torch.uint8) * 16, scales=s, recipe=QuantRecipe(dtype="w8a16", group_size=4),
                          shape=(2, 4, 8))
    assert torch.equal(dequantize(qt8), (q * 16 - 128).float() * s.repeat_interleave(4, -1))


def test_w4a16_zero_points_packed_along_n() -> None:
    x = _x(6, 64, seed=19)[None]  # [E=1, N=6, K=64]
    r = QuantRecipe(dtype="w4a16", group_size=32, zero_point=True)
    qt = quantize(x, r)
    assert qt.codes.shape == (1, 6, 32) and qt.zero_points.shape == (1, 3, 2) and qt.scales.shape == (1, 6, 2)
    out = dequantize(qt)
    for n in range(6):
        for k in range(64):
            zp = (int(qt.zero_points[0, n // 2, k // 32]) >> (4 * (n % 2))) & 0xF
            code = (int(qt.codes[0, n, k // 2]) >> (4 * (k % 2))) & 0xF
            assert out[0, n, k] == torch.tensor(float(code - zp)) * qt.scales[0, n, k // 32]
    assert bool(((out - x).abs() <= qt.scales.repeat_interleave(32, -1) * 0.5 * (1 + 1e-6)).all())


def test_weight_only_symmetric_round_trip() -> None:
    x = _x(4, 64, seed=23)[None]
    for dtype, half in (("w4a16", 7.0), ("w8a16", 127.0)):
        qt = quantize(x, QuantRecipe(dtype=dtype, group_size=16))
        s = (x.double().view(1, 4, 4, 16).abs().amax(-1) / half).float()
        assert torch.equal(qt.scales, s)
        assert bool(((dequantize(qt) - x).abs() <= s.repeat_interleave(16, -1) * 0.5 * (1 + 1e-6)).all())


# ----------------------------------------------------------------------------------- layouts and recipes


def test_scale_layouts_in_quantize() -> None:
    x = _x(5, 256, seed=29)
    base = quantize(x, QuantRecipe(scale_rule="ue8m0"))
    for layout in ("column_major", "column_major_tma", "packed_ue8m0"):
        qt = quantize(x, QuantRecipe(scale_rule="ue8m0", layout=layout))
        assert torch.equal(qt.codes, base.codes)
        assert torch.equal(logical_scales(qt), base.scales) or layout == "packed_ue8m0"
        assert torch.equal(dequantize(qt), dequantize(base))
    assert quantize(x, QuantRecipe(layout="column_major_tma")).scales.stride() == (1, 8)
    qs = quantize(x[:, :64], QuantRecipe.nvfp4(layout="swizzle_128x4"))
    assert qs.scales.shape == (128, 4)
    assert torch.equal(dequantize(qs), dequantize(quantize(x[:, :64], QuantRecipe.nvfp4())))


@pytest.mark.parametrize("layout", ["row_major", "column_major", "packed_ue8m0"])
def test_ue8m0_all_zero_unit_with_eps_0_gets_code_0(layout: str) -> None:
    """An all-zero group under ue8m0 with eps 0: scale code 0 (2^-127), as cvt.rp.satfinite.ue8m0x2.f32 and
    torchao give, never NaN (0xFF) or 0; its elements dequantize to zeros."""
    x = _x(6, 256, seed=31).bfloat16()
    x[2, 128:] = 0.0
    qt = quantize(x, QuantRecipe(scale_rule="ue8m0", eps=0.0, layout=layout))
    s = logical_scales(qt)
    assert s[2, 1].item() == 2.0**-127 and bool((s > 0).all())
    assert formats.encode(s[2, 1], "e8m0").item() == 0
    if layout == "packed_ue8m0":
        assert int(qt.scales[2, 0]) >> 8 & 0xFF == 0  # byte 1 of the word: group 1
    assert bool((qt.codes[2, 128:] == 0).all())
    out = dequantize(qt)
    assert bool(torch.isfinite(out).all()) and bool((out[2, 128:] == 0).all())
    assert torch.equal(out[[0, 1, 3, 4, 5]], dequantize(quantize(x, QuantRecipe(scale_rule="ue8m0")))[[0, 1, 3, 4, 5]])


@pytest.mark.parametrize("dtype", ["mxfp8", "mxfp4"])
def test_mx_ue8m0_all_zero_block_with_eps_0_gets_code_0(dtype: str) -> None:
    x = _x(4, 64, seed=37)
    x[1, :32] = 0.0
    qt = quantize(x, QuantRecipe.mx(dtype, scale_rule="ue8m0", eps=0.0))
    assert int(qt.scales[1, 0]) == 0 and bool((qt.scales != 0xFF).all())
    out = dequantize(qt)
    assert bool(torch.isfinite(out).all()) and bool((out[1, :32] == 0).all())


@pytest.mark.parametrize("dtype", ["mxfp8", "mxfp4"])
def test_mx_ceil_log2_all_zero_block_gets_byte_0(dtype: str) -> None:
    """ceil_log2 with eps 0 on an all-zero block: log2(0 / qmax) = -inf, clamped to -127: byte 0 (2^-127, as torchao's
    RCEIL stores), never 0xFF (NaN), and the block dequantizes to zeros."""
    x = torch.zeros(2, 64)
    x[0, 32:] = 1.0  # 1 / qmax rounds up to 2^-8 (mxfp8: 1/448) or 2^-2 (mxfp4: 1/6)
    qt = quantize(x, QuantRecipe.mx(dtype, scale_rule="ue8m0", eps=0.0, ue8m0_form="ceil_log2"))
    assert qt.scales.tolist() == [[0, 127 - 8 if dtype == "mxfp8" else 127 - 2], [0, 0]]
    assert int(qt.codes[1].to(torch.int64).abs().sum()) == 0
    out = dequantize(qt)
    assert out[:, :32].tolist() == [[0.0] * 32] * 2 and out[1].tolist() == [0.0] * 64
    assert out[0, 32:].tolist() == [1.0] * 32


def test_fp8_packed_ceil_log2_all_zero_group_gets_byte_0() -> None:
    # the packed layout stores e8m0 bytes too: the zero group's scale is 2^-127 (byte 0), not 0 (which cannot pack)
    x = torch.zeros(1, 64)
    x[0, 32:] = 448.0
    qt = quantize(x, QuantRecipe(group_size=32, scale_rule="ue8m0", eps=0.0, ue8m0_form="ceil_log2",
                                 layout="packed_ue8m0"))
    assert int(qt.scales[0, 0]) == 127 << 8  # byte 0: group 0 (byte 0), byte 1: group 1 (448 / 448 = 1 = 2^0)
    assert logical_scales(qt).tolist() == [[2.0**-127, 1.0]]
    assert dequantize(qt).tolist() == [[0.0] * 32 + [448.0] * 32]


# (x, e4m3fn code, value): amax / 448 has exponent below -127, so the scale is 2^-127 and the code is x * 2^127
_TINY_MXFP8 = [
    (2.0**-130, 0x20, 2.0**-130),  # 2^-3: exponent field -3 + 7 = 4, mantissa 0
    (-(2.0**-126), 0xC0, -(2.0**-126)),  # -2: sign, exponent field 1 + 7 = 8
    (2.0**-133, 0x08, 2.0**-133),  # 2^-6, e4m3's smallest normal (bf16's smallest subnormal)
    (3.0 * 2.0**-136, 0x03, 3.0 * 2.0**-136),  # 3 * 2^-9: the subnormal with mantissa 3
    (1.5 * 2.0**-136, 0x02, 2.0**-135),  # 1.5 * 2^-9: halfway between mantissas 1 and 2, to the even one
    (2.0**-149, 0x00, 0.0),  # 2^-22 is under half e4m3's smallest subnormal 2^-9: rounds to +0
    (448.0 * 2.0**-127, 0x7E, 448.0 * 2.0**-127),  # amax / 448 = 2^-127 exactly: byte 0, code 448
]


@pytest.mark.parametrize(("v", "code", "value"), _TINY_MXFP8)
def test_mx_ceil_log2_tiny_amax_codes_use_the_stored_scale(v: float, code: int, value: float) -> None:
    """Blocks whose ceil(log2(amax / qmax)) is below -127: the exponent is clamped to -127 before the codes are
    computed, so the codes are x / 2^-127 and dequantize to x (once they computed with 2^-138 for x = 2^-130: code
    0x78 = 256, stored as byte 0, dequantized 2^-119)."""
    x = torch.zeros(1, 32)
    x[0, 0] = v
    qt = quantize(x, QuantRecipe.mx("mxfp8", scale_rule="ue8m0", eps=0.0, ue8m0_form="ceil_log2"))
    assert qt.scales.tolist() == [[0]]
    assert qt.codes.tolist() == [[code] + [0] * 31]
    assert dequantize(qt)[0, 0].item() == value
    assert dequantize(qt, torch.float64)[0, 0].item() == value


def test_mxfp4_ceil_log2_tiny_amax_codes_use_the_stored_scale() -> None:
    # amax 3 * 2^-127: amax / 6 = 2^-128, clamped to 2^-127; 3 and 0.5 are e2m1 codes 5 and 1, -1 is 0xA
    x = torch.zeros(1, 32)
    x[0, :3] = torch.tensor([3.0 * 2.0**-127, 2.0**-128, -(2.0**-127)])
    qt = quantize(x, QuantRecipe.mx("mxfp4", scale_rule="ue8m0", eps=0.0, ue8m0_form="ceil_log2"))
    assert qt.scales.tolist() == [[0]]
    assert qt.codes[0, :2].tolist() == [0x15, 0x0A] and int(qt.codes[0, 2:].to(torch.int64).sum()) == 0
    assert torch.equal(dequantize(qt), x)


def test_fp8_packed_ceil_log2_tiny_amax_codes_use_the_stored_scale() -> None:
    x = torch.zeros(1, 32)
    x[0, 0] = 2.0**-130
    qt = quantize(x, QuantRecipe(group_size=32, scale_rule="ue8m0", eps=0.0, ue8m0_form="ceil_log2",
                                 layout="packed_ue8m0"))
    assert int(qt.scales[0, 0]) == 0 and qt.codes[0, 0].view(torch.uint8).item() == 0x20
    assert dequantize(qt)[0, 0].item() == 2.0**-130
    # stored as fp32, the same recipe keeps the unclamped scale 2^ceil(log2(2^-130 / 448)) = 2^-138: x / s = 2^8
    qf = quantize(x, QuantRecipe(group_size=32, scale_rule="ue8m0", eps=0.0, ue8m0_form="ceil_log2"))
    assert qf.scales.tolist() == [[2.0**-138]] and qf.codes[0, 0].view(torch.uint8).item() == 0x78


def test_recipe_json_round_trip_and_validation() -> None:
    r = QuantRecipe.mx("mxfp8", scale_rule="ue8m0", layout="swizzle_128x4")
    d = json.loads(json.dumps(r.to_dict()))
    assert d["scale_rule"] == "ue8m0" and QuantRecipe.from_dict(d) == r
    with pytest.raises(ValueError, match="scale_rule must be one of"):
        QuantRecipe.from_dict({**d, "scale_rule": "ceil"})
    with pytest.raises(ValueError, match="unknown keys: colour"):
        QuantRecipe.from_dict({**d, "colour": 1})
    with pytest.raises(ValueError, match="group_size must be 32"):
        QuantRecipe.mx("mxfp4", group_size=16)
    with pytest.raises(ValueError, match="packed_ue8m0 needs"):
        QuantRecipe(layout="packed_ue8m0")
    with pytest.raises(ValueError, match="dtype must be one of"):
        QuantRecipe(dtype="fp6")


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="x must have dtype"):
        quantize(torch.ones(2, 128, dtype=torch.int32), QuantRecipe())
    with pytest.raises(ValueError, match=r"scales must have shape \[2, 1\]"):
        quantize(torch.ones(2, 128), QuantRecipe(unit="row"), scales=torch.ones(2))
    with pytest.raises(ValueError, match="K must be even"):
        quantize(torch.ones(2, 33), QuantRecipe(dtype="w4a16", unit="row"))
    qt = quantize(torch.ones(2, 128), QuantRecipe())
    with pytest.raises(ValueError, match=r"scales must have shape \[2, 1\]"):
        dequantize(QuantizedTensor(qt.codes, torch.ones(2, 2), qt.recipe, qt.shape))
    with pytest.raises(ValueError, match="codes must have dtype"):
        dequantize(QuantizedTensor(qt.codes.to(torch.int8), qt.scales, qt.recipe, qt.shape))
    with pytest.raises(ValueError, match="must be powers of two"):
        from reference.scales import to_layout

        to_layout(qt.scales, "packed_ue8m0")
