"""Conventions that reproduce a library's numerics bit for bit, each checked against an
independent derivation: the library's formula written here as plain torch code in the library's own dtypes (torch's
casts and operators, not the oracle's encoders), or an analytic statement of what the formula gives.

Each test also shows that the convention matters: on the same inputs the oracle's default differs, so a wrong
convention (or one the oracle silently ignored) fails.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.core import conventions as conv
from harness.ops import experts as experts_op
from harness.ops import group_quant as gq_op
from reference import activations as act
from reference import experts as ex
from reference import formats
from reference.quant import QuantRecipe, logical_scales, quantize
from reference.scales import ue8m0_round_up

FP8_MAX = 448.0
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------------ float-form UE8M0


def _ceil_log2_analytic(k: int, j: int) -> float:
    """2^ceil(fp32(log2 s)) for s = 2^k (1 + j 2^-23), j >= 1 small, from the spacing of fp32 numbers near k.

    log2 s = k + d with d = log2(1 + j 2^-23) ~ j 2^-23 / ln 2 (irrational: never a tie). fp32 rounds k + d to k
    when d is below half the spacing of fp32 numbers on that side of k, and then ceil gives k; otherwise the
    rounded value is above k and ceil gives k + 1.
    """
    d = math.log2(1 + j * 2.0**-23)
    if k == 0:
        return 2.0  # d itself is representable: above 0
    mag = abs(k)
    e = math.floor(math.log2(mag))
    # k > 0: k + d lies above |k|, in |k|'s binade; k < 0: |k| - d lies below |k|, in the binade under it when
    # |k| is a power of two (half the spacing)
    spacing = 2.0 ** (e - 23) if k > 0 or mag != 2**e else 2.0 ** (e - 24)
    return 2.0**k if d < spacing / 2 else 2.0 ** (k + 1)


def test_ue8m0_ceil_log2_matches_the_analytic_spacing_rule() -> None:
    ks = [k for k in range(-40, 41)]
    js = [1, 2, 3, 5]
    s = torch.tensor([2.0**k * (1 + j * 2.0**-23) for k in ks for j in js], dtype=torch.float32)
    want = torch.tensor([_ceil_log2_analytic(k, j) for k in ks for j in js], dtype=torch.float32)
    got = ue8m0_round_up(s, form="ceil_log2")
    assert torch.equal(got, want)
    bits = ue8m0_round_up(s)  # the bit form always rounds these up to 2^(k+1)
    assert torch.equal(bits, torch.tensor([2.0 ** (k + 1) for k in ks for _ in js], dtype=torch.float32))
    assert int((got != bits).sum()) > 100  # the forms differ on most of them: the convention matters


def test_ue8m0_ceil_log2_is_torch_exp2_ceil_log2_on_random_scales() -> None:
    g = _gen(1)
    e = torch.randint(-60, 60, (4096,), generator=g).double()
    s = (torch.rand(4096, generator=g, dtype=torch.float64) + 1) * torch.exp2(e)
    s = torch.cat([s.float(), torch.nextafter(torch.exp2(e).float(), torch.tensor(math.inf)), torch.zeros(3)])
    assert torch.equal(ue8m0_round_up(s, form="ceil_log2"), torch.exp2(torch.ceil(torch.log2(s))))


# ------------------------------------------------------------------ MX scales by ceil_log2 (torchao's RCEIL)


def mx_rceil_blocks(dtype: torch.dtype, seed: int = 3) -> torch.Tensor:
    """[R, 32] blocks: all-zero (+0 and -0), tiny amax from 2^-118 down to fp32's smallest subnormal (amax / 448
    under 2^-127: byte 0), the two amax that give exactly 2^-127 and 2^-126, a normal block holding a subnormal,
    and random blocks over 2^-30..2^30. Shared with the comparison against torchao itself (tests/external)."""
    g = _gen(seed)
    tiny = torch.randn(32, 32, generator=g) * torch.exp2(-torch.arange(118, 150, dtype=torch.float32))[:, None]
    edges = torch.zeros(4, 32)
    edges[0] = FP8_MAX * 2.0**-127
    edges[1, ::3] = FP8_MAX * 2.0**-126
    edges[2], edges[2, 5] = 1.0, 2.0**-140
    edges[3, 0] = -(2.0**-149)
    normal = torch.randn(24, 32, generator=g) * torch.exp2(torch.randint(-30, 31, (24, 1), generator=g).float())
    return torch.cat([torch.zeros(1, 32), -torch.zeros(1, 32), tiny, edges, normal]).to(dtype)


def _torchao_rceil_mxfp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao's to_mx RCEIL for mxfp8 in torch's own ops: byte = clamp(ceil(log2(amax / 448)), -127, 127) + 127, x
    multiplied by 2^(127 - byte) (byte 0 by 2^127, as torchao's main branch does; torchao 0.18 by 1.0), clamped to
    +-448 and cast to float8_e4m3fn."""
    xb = x.float().view(x.shape[0], -1, 32)
    e = torch.clamp(torch.ceil(torch.log2(xb.abs().amax(-1, keepdim=True) / FP8_MAX)), -127, 127)
    codes = (xb * torch.exp2(-e)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    return codes.view(x.shape), (e + 127).to(torch.uint8).squeeze(-1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_mx_ceil_log2_is_torchao_rceil_on_zero_tiny_and_random_blocks(dtype: torch.dtype) -> None:
    x = mx_rceil_blocks(dtype)
    codes, scales = _torchao_rceil_mxfp8(x)
    qt = quantize(x, QuantRecipe.mx("mxfp8", scale_rule="ue8m0", eps=0.0, ue8m0_form="ceil_log2"))
    assert torch.equal(qt.scales, scales) and torch.equal(qt.codes, codes)
    assert int((scales == 0).sum()) > 30  # the zero and tiny blocks really have byte 0
    # the bit form (the default) rounds the tiny blocks' subnormal scales up to 2^-126 instead: byte 1
    bits = quantize(x, QuantRecipe.mx("mxfp8", scale_rule="ue8m0", eps=0.0))
    assert int((bits.scales != scales).sum()) > 10


# ------------------------------------------------------- eps after the power-of-two rounding (vLLM QuantFP8)


def _special_rows(dtype: torch.dtype, groups: int = 4, size: int = 128) -> torch.Tensor:
    """Rows mixing random groups, all-zero groups, tiny groups (amax below eps) and groups whose amax / 448 is one
    ulp above a power of two."""
    g = _gen(2)
    rows = torch.randn(8, groups * size, generator=g, dtype=torch.float32)
    rows[1, :size] = 0
    rows[2, size:2 * size] *= 1e-9
    for r, k in ((3, -12), (4, 3), (5, -20)):
        amax = float(torch.tensor(2.0**k * (1 + 2**-23), dtype=torch.float32)) * FP8_MAX
        rows[r, :size] = rows[r, :size].clamp(-1, 1) * 0.5 * amax
        rows[r, 7] = amax
    return rows.to(dtype)


def _vllm_quantfp8_native(x: torch.Tensor, eps: float, group: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """QuantFP8's native group path with ue8m0: the scale rounded up as exp2(ceil(log2 s)), then clamped at eps."""
    xg = x.view(x.shape[0], -1, group)
    absmax = xg.abs().amax(dim=-1, keepdim=True).float()
    s = torch.exp2(torch.ceil(torch.log2(absmax / FP8_MAX))).clamp(min=eps)
    q = (xg / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(x.shape).view(torch.uint8), s.squeeze(-1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_eps_after_rounding_with_ceil_log2_is_vllm_quantfp8(dtype: torch.dtype) -> None:
    x = _special_rows(dtype)
    eps = 1.0 / (FP8_MAX * 512.0)  # vLLM's _FP8_MIN_SCALING_FACTOR: not a power of two
    codes, scales = _vllm_quantfp8_native(x, eps)
    r = QuantRecipe(scale_rule="ue8m0", ue8m0_form="ceil_log2", eps=eps, eps_placement="rounded_scale")
    qt = quantize(x, r)
    assert torch.equal(qt.codes, codes)
    assert torch.equal(logical_scales(qt), scales)
    # eps before the rounding (the other placements) rounds eps itself up to 2^-17: the all-zero group differs
    before = quantize(x, QuantRecipe(scale_rule="ue8m0", ue8m0_form="ceil_log2", eps=eps, eps_placement="scale"))
    assert not torch.equal(logical_scales(before), scales)
    # and the bit form differs on the groups one ulp above a power of two (only fp32 inputs can be that close:
    # the next bf16 above 448 * 2^k is 450 * 2^k)
    bit_form = quantize(x, QuantRecipe(scale_rule="ue8m0", eps=eps, eps_placement="rounded_scale"))
    assert torch.equal(logical_scales(bit_form), scales) == (dtype == torch.bfloat16)


# ----------------------------------------------------------------------- eps in the input dtype (bf16/fp16)


def _vllm_native_group_quant(x: torch.Tensor, eps: float, group: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's torch reference of per-token-group fp8 quantization: amax clamped at eps in x's dtype."""
    xg = x.reshape(-1, group)
    amax = xg.abs().max(dim=-1, keepdim=True)[0].clamp(min=eps).to(torch.float32)
    s = amax / FP8_MAX
    q = (xg / s).clamp(min=-FP8_MAX, max=FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(x.shape).view(torch.uint8), s.reshape(x.shape[0], -1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_eps_in_input_dtype_is_torch_clamp_in_that_dtype(dtype: torch.dtype) -> None:
    eps = 1e-10 if dtype == torch.bfloat16 else 1e-7  # fp16: an eps that is not an fp16 value either
    x = _special_rows(dtype)
    x[2, 128:256] = (torch.rand(128, generator=_gen(3)) * eps * 0.9).to(dtype)  # amax below eps
    codes, scales = _vllm_native_group_quant(x, eps)
    qt = quantize(x, QuantRecipe(eps=eps, eps_dtype="input"))
    assert torch.equal(qt.codes, codes)
    assert torch.equal(logical_scales(qt), scales)
    default = quantize(x, QuantRecipe(eps=eps))  # fp32(eps): the all-zero and tiny groups get other scales
    assert not torch.equal(logical_scales(default), scales)


# ---------------------------------------------------------------------------------------------- e2m1 ties


def _e2m1_nearest(x: torch.Tensor, ties_toward_zero: bool) -> torch.Tensor:
    """e2m1 codes by distance to the eight magnitudes: ties to the even code, or down (`torch.bucketize` over
    the midpoints with right=False sends a midpoint to the lower value)."""
    a = x.double().abs().clamp(max=6.0)
    if ties_toward_zero:
        mids = (E2M1_VALUES[1:] + E2M1_VALUES[:-1]) / 2
        idx = torch.bucketize(a, mids, right=False)
    else:
        d = (a[..., None] - E2M1_VALUES).abs()
        best = d.min(dim=-1, keepdim=True).values
        cand = (d == best) * (torch.arange(8) % 2 == 0) + (d == best) * 0.5  # prefer an even code on a tie
        idx = cand.argmax(dim=-1)
    return (idx | (torch.signbit(x).to(torch.int64) << 3)).to(torch.uint8)


def test_e2m1_ties_by_an_independent_search() -> None:
    mids = ((E2M1_VALUES[1:] + E2M1_VALUES[:-1]) / 2).tolist()
    x = torch.tensor([*mids, *[-m for m in mids], 0.1, 0.7, 2.2, 5.9, 7.0, -0.3], dtype=torch.float32)
    x = torch.cat([x, torch.randn(2000, generator=_gen(4)) * 3])
    for ties in (False, True):
        got = formats.encode(x, formats.FloatFormat.E2M1, ties="toward_zero" if ties else "even")
        assert torch.equal(got, _e2m1_nearest(x, ties)), ties
    down = formats.encode(x[:7], formats.FloatFormat.E2M1, ties="toward_zero")
    even = formats.encode(x[:7], formats.FloatFormat.E2M1)
    assert int((down != even).sum()) == 3  # 0.75, 1.75 and 3.5 go down; 0.25, 1.25, 2.5, 5 are even below


def test_mxfp4_recipe_honours_e2m1_ties() -> None:
    # each group's amax is 6 (scale 1 under the OCP floor rule): elements are their own e2m1 quotients
    x = torch.tensor([[6.0, 0.75, 1.75, 3.5, -0.75, 0.25, 2.5, 5.0] * 4], dtype=torch.float32)
    down = quantize(x, QuantRecipe.mx("mxfp4", e2m1_ties="toward_zero"))
    even = quantize(x, QuantRecipe.mx("mxfp4"))
    unpack = formats.unpack_nibbles
    assert torch.equal(unpack(down.codes), _e2m1_nearest(x, True))
    assert torch.equal(unpack(even.codes), _e2m1_nearest(x, False))


# --------------------------------------------------------------------------------------- NVFP4 scale forms


def _nvfp4_input() -> torch.Tensor:
    x = torch.randn(16, 64, generator=_gen(5)) * 2
    x[3, 16:32] *= 1e-6  # a block far below the tensor's amax: its block scale is under e4m3's normal range
    x[4, :16] = 0
    return x


def _with_ties(x: torch.Tensor, es: torch.Tensor) -> torch.Tensor:
    """x with every element but each block's largest set to an e2m1 midpoint times the block's element scale es
    [R, B] (rounded to fp32): quotients at a rounding boundary, where one rounding more or less in the scale
    decides the code. The block amax, hence every scale, stays the same."""
    mids = ((E2M1_VALUES[1:] + E2M1_VALUES[:-1]) / 2).float()
    xb = x.reshape(x.shape[0], -1, 16).clone()
    keep = xb.abs().argmax(dim=-1, keepdim=True)
    pick = mids[torch.randint(0, 7, xb.shape, generator=_gen(9))] * torch.where(xb < 0, -1.0, 1.0)
    ties = pick * es.unsqueeze(-1)
    return torch.where(torch.arange(16) == keep, xb, ties).reshape(x.shape)


def _e4m3(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float8_e4m3fn).to(torch.float32)


def _vllm_nvfp4(x: torch.Tensor, gs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's torch reference: s_blk = e4m3(gs * (amax * (1/6))), x * 1/(s_blk * (1/gs)), zero-guarded."""
    def recip(t: torch.Tensor) -> torch.Tensor:
        return torch.where(t == 0, torch.zeros_like(t), 1.0 / t)

    xb = x.reshape(x.shape[0], -1, 16)
    vec_max = xb.abs().amax(dim=-1, keepdim=True)
    s = _e4m3((gs * (vec_max * (1.0 / 6.0))).clamp(-448, 448))
    out_scale = recip(s * recip(gs))
    y = (xb * out_scale).clamp(-6, 6).reshape(x.shape)
    return _e2m1_nearest(y, False), s.squeeze(-1)


def _torchao_nvfp4(x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao's two-level path: s_blk = e4m3(clamp((amax / 6) / g, 2^-6, 448)), x * ((1 / g) / s_blk)."""
    xb = x.reshape(x.shape[0], -1, 16)
    block = xb.abs().amax(dim=-1) / 6.0
    s = _e4m3(torch.clamp(block / g, min=2.0**-6, max=448.0))
    y = (xb * ((1.0 / g) / s).unsqueeze(-1)).clamp(-6, 6).reshape(x.shape)
    return _e2m1_nearest(y, False), s


def _codes_and_block_scales(qt) -> tuple[torch.Tensor, torch.Tensor]:
    return formats.unpack_nibbles(qt.codes), formats.decode(logical_scales(qt), formats.FloatFormat.E4M3FN)


def test_nvfp4_global_reciprocal_is_vllm() -> None:
    x = _nvfp4_input()
    gs = (448.0 * 6.0 / x.abs().amax()).float()
    codes, s = _vllm_nvfp4(x, gs)
    r = QuantRecipe.nvfp4(scale_formula="multiply_reciprocal", nvfp4_scale_form="global_reciprocal",
                          application="multiply_reciprocal")
    got_codes, got_s = _codes_and_block_scales(quantize(x, r, global_scale=gs))
    assert torch.equal(got_s, s)
    assert torch.equal(got_codes, codes)
    # at rounding boundaries s_blk / gs (the default form) and s_blk * fp32(1 / gs) give different codes
    xt = _with_ties(x, s / gs)
    codes_t, _ = _vllm_nvfp4(xt, gs)
    assert torch.equal(_codes_and_block_scales(quantize(xt, r, global_scale=gs))[0], codes_t)
    default = quantize(xt, QuantRecipe.nvfp4(scale_formula="multiply_reciprocal", application="multiply_reciprocal"),
                       global_scale=gs)
    assert not torch.equal(_codes_and_block_scales(default)[0], codes_t)


def test_nvfp4_reciprocal_over_block_with_floor_is_torchao() -> None:
    x = _nvfp4_input()
    g = (x.abs().amax() / (448.0 * 6.0)).float()
    codes, s = _torchao_nvfp4(x, g)
    r = QuantRecipe.nvfp4(global_scale="dequant_side", nvfp4_scale_form="reciprocal_over_block",
                          application="multiply_reciprocal", nvfp4_block_floor=True)
    got_codes, got_s = _codes_and_block_scales(quantize(x, r, global_scale=g))
    assert torch.equal(got_s, s)
    assert torch.equal(got_codes, codes)
    no_floor = quantize(x, QuantRecipe.nvfp4(global_scale="dequant_side", nvfp4_scale_form="reciprocal_over_block",
                                             application="multiply_reciprocal"), global_scale=g)
    assert not torch.equal(_codes_and_block_scales(no_floor)[1], s)  # the tiny block's scale
    # at rounding boundaries x / (s_blk * g) (the default form) and x * ((1 / g) / s_blk) give different codes
    xt = _with_ties(x, s * g)
    codes_t, _ = _torchao_nvfp4(xt, g)
    assert torch.equal(_codes_and_block_scales(quantize(xt, r, global_scale=g))[0], codes_t)
    plain = quantize(xt, QuantRecipe.nvfp4(global_scale="dequant_side", nvfp4_block_floor=True), global_scale=g)
    assert not torch.equal(_codes_and_block_scales(plain)[0], codes_t)


def test_nvfp4_reciprocal_over_block_needs_multiply_reciprocal() -> None:
    with pytest.raises(ValueError, match="multiply_reciprocal"):
        QuantRecipe.nvfp4(nvfp4_scale_form="reciprocal_over_block")


# ------------------------------------------------------------------------------ every step rounded (swigluoai)


def _vllm_swigluoai_native(x: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    gate, up = x[..., ::2], x[..., 1::2]
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    glu = gate * torch.sigmoid(gate * alpha)
    return (up + 1) * glu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_step_swigluoai_is_torch_native_in_the_input_dtype(dtype: torch.dtype) -> None:
    x = (torch.randn(64, 512, generator=_gen(6)) * 4).to(dtype)
    want = _vllm_swigluoai_native(x)
    got = act.apply_activation("swigluoai", x, rounding="every_step")
    assert torch.equal(got, want)
    first = act.apply_activation("swigluoai", x, rounding="round_activation_first")
    assert int((first != want).sum()) > 0


def test_every_step_is_activation_first_for_single_op_activations() -> None:
    x = (torch.randn(16, 64, generator=_gen(7)) * 3).to(torch.bfloat16)
    for name in ("silu_and_mul", "gelu_and_mul"):
        a = act.apply_activation(name, x, rounding="every_step")
        b = act.apply_activation(name, x, rounding="round_activation_first")
        assert torch.equal(a, b), name


# ---------------------------------------------------------------------- GEMM bias after the output rounding


def test_bias_after_rounding_is_torch_matmul_plus_bias_in_bf16() -> None:
    """One expert, top-1 with weight 1: out = y. Integer-valued weights and inputs make every matmul exact in fp32,
    so torch's bf16 `x @ w.T + b` (one rounding of the product, one of the sum) is an exact derivation."""
    g = _gen(8)
    m, k_dim, n = 16, 8, 8
    x = torch.randint(-3, 4, (m, k_dim), generator=g).to(torch.bfloat16)
    w13 = torch.randint(-3, 4, (1, n, k_dim), generator=g).to(torch.bfloat16)
    w2 = torch.randint(-3, 4, (1, k_dim, n), generator=g).to(torch.bfloat16)
    b13 = (torch.randn(1, n, generator=g) * 4).to(torch.bfloat16)
    b2 = (torch.randn(1, k_dim, generator=g) * 4).to(torch.bfloat16)
    h = x @ w13[0].T + b13[0]
    a = (torch.relu(h).float() ** 2).to(torch.bfloat16)
    want = a @ w2[0].T + b2[0]
    ids = torch.zeros(m, 1, dtype=torch.int64)
    weights = torch.ones(m, 1)
    kw = dict(activation="relu2_no_mul", w13_bias=b13, w2_bias=b2)
    got = ex.fused_experts(x, w13, w2, weights, ids, bias_placement="rounded_output", **kw)
    assert torch.equal(got, want)
    default = ex.fused_experts(x, w13, w2, weights, ids, **kw)
    assert not torch.equal(default, want)


# ----------------------------------------------------------------------- declared through an adapter's conventions


def test_new_conventions_validate_and_reach_the_oracle() -> None:
    conv.validate("group_quant", {"ue8m0_form": "ceil_log2", "eps_dtype": "input", "eps_placement": "rounded_scale"},
                  "t")
    f = {"quant_dtype": "fp8_e4m3fn", "unit": "group", "group_size": "128", "scale_rule": "ue8m0",
         "scale_layout": "row_major", "input_dtype": "bfloat16"}
    r = gq_op.recipe(f, {"ue8m0_form": "ceil_log2", "eps_dtype": "input", "eps_placement": "rounded_scale"})
    assert (r.ue8m0_form.value, r.eps_dtype.value, r.eps_placement.value) == ("ceil_log2", "input", "rounded_scale")
    conv.validate("experts", {"bias_placement": "rounded_output", "rounding": "every_step", "weight_quant": {
        "nvfp4_scale_form": "global_reciprocal", "nvfp4_block_floor": True, "e2m1_ties": "toward_zero"}}, "t")
    from harness.core.case import Case

    case = Case(op="experts", adapter="t", features={"activation": "swigluoai"}, shapes={})
    kw = experts_op._oracle_kwargs(case, {"bias_placement": "rounded_output", "rounding": "every_step"})
    assert kw["bias_placement"] == ex.BiasPlacement.ROUNDED_OUTPUT
    assert kw["activation_rounding"] == act.Rounding.EVERY_STEP
    for bad in ({"ue8m0_form": "ceil"}, {"eps_dtype": "bf16"}):
        with pytest.raises(ValueError, match="not one of"):
            conv.validate("group_quant", bad, "t")


# ------------------------------------------------------------ fp8 blockwise: the factor rounded once (torchao)


def _torchao_blockwise_act(x: torch.Tensor, eps: float = 1e-12, group: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao's 1 x group fp8 activation quantizer: factor = fp32(448 / clamp(amax, eps) in float64), codes of
    x * factor, the reciprocal 1 / factor stored (fp32 division)."""
    xg = x.float().reshape(x.shape[0], -1, group)
    amax = xg.abs().amax(dim=-1, keepdim=True).clamp(min=torch.tensor(eps, dtype=torch.float32)).double()
    factor = (FP8_MAX / amax).float()
    q = (xg * factor).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(x.shape).view(torch.uint8), (1.0 / factor).squeeze(-1)


def _factor_ties(amax: float) -> torch.Tensor:
    """An fp32 unit of amax `amax` whose other elements are e4m3 midpoints divided by fp32(448 / amax): their
    products with that factor lie at rounding boundaries, where a factor one ulp off picks the other code."""
    tab = formats.code_table("e4m3fn")
    mids = ((tab[1:0x7E] + tab[2:0x7F]) / 2).double()
    factor = (FP8_MAX / torch.tensor(amax, dtype=torch.float64)).float().double()
    row = (mids / factor).float().repeat(2)[:127]
    return torch.cat([torch.tensor([amax]), row])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_qmax_over_amax_rn_with_reciprocal_of_factor_is_torchao_blockwise(dtype: torch.dtype) -> None:
    x = _special_rows(dtype)
    x[6, :128] = (torch.randn(128, generator=_gen(10)) * 1e-14).to(dtype)  # amax below eps 1e-12
    codes, scales = _torchao_blockwise_act(x)
    r = QuantRecipe(eps=1e-12, scale_formula="reciprocal_of_factor", application="qmax_over_amax_rn")
    qt = quantize(x, r)
    assert torch.equal(qt.codes, codes)
    assert torch.equal(logical_scales(qt), scales)
    default = quantize(x, QuantRecipe(eps=1e-12))  # amax / 448 stored: its last bit differs from 1 / factor
    assert not torch.equal(logical_scales(default), scales)


def test_qmax_over_amax_rn_codes_differ_from_one_more_rounding_and_from_division() -> None:
    # an amax whose fp32(448 / amax) differs from fp32(fp32(1 / amax) * 448) (by one ulp)
    cand = 1 + torch.arange(1, 4096, dtype=torch.float64) / 4096
    differ = (FP8_MAX / cand).float() != ((1 / cand).float().double() * FP8_MAX).float()
    a = float(cand[differ][0])
    x = torch.stack([_factor_ties(a), _factor_ties(3.5)])
    codes, scales = _torchao_blockwise_act(x)
    r = QuantRecipe(eps=1e-12, scale_formula="reciprocal_of_factor", application="qmax_over_amax_rn")
    qt = quantize(x, r)
    assert torch.equal(qt.codes, codes) and torch.equal(logical_scales(qt), scales)
    for other in ("qmax_over_amax", "divide"):
        assert not torch.equal(quantize(x, QuantRecipe(eps=1e-12, application=other)).codes, codes), other
