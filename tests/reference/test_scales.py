"""reference.scales: scale rules against float64/frexp/bit derivations, layouts against address formulas."""

from __future__ import annotations

import math

import pytest
import torch

from reference import scales as S


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _amax_samples() -> torch.Tensor:
    g = _gen(0)
    a = torch.rand(4000, generator=g) * torch.exp2(torch.randint(-30, 30, (4000,), generator=g).float())
    return torch.cat([a.bfloat16().float(), torch.tensor([0.0, 1e-45, 1e-38, 448.0, 1.0, 3.0e38])])


@pytest.mark.parametrize("formula", ["divide", "multiply_reciprocal"])
@pytest.mark.parametrize("placement", ["amax", "scale"])
def test_float_scale_against_float64(formula: str, placement: str) -> None:
    amax, qmax, eps = _amax_samples(), 448.0, 1e-10
    eps32 = float(torch.tensor(eps, dtype=torch.float32))
    a64 = amax.double()
    if placement == "amax":
        a64 = a64.clamp(min=eps32)
    if formula == "divide":
        want = (a64 / qmax).float()  # float64 then one rounding = correctly rounded fp32 division
    else:
        want = (a64 * float(torch.tensor(1.0 / qmax, dtype=torch.float32))).float()
    if placement == "scale":
        want = want.clamp(min=eps32)
    got = S.float_scale(amax, qmax, eps=eps, eps_placement=placement, formula=formula)
    assert torch.equal(got, want)


def test_divide_and_multiply_reciprocal_formulas_really_differ() -> None:
    amax = _amax_samples()
    a = S.float_scale(amax, 448.0, formula="divide")
    b = S.float_scale(amax, 448.0, formula="multiply_reciprocal")
    diff = a != b
    assert 0.05 < diff.float().mean().item() < 0.95  # a real convention, not a corner case
    ulps = (a.view(torch.int32) - b.view(torch.int32)).abs()
    assert int(ulps.max()) == 1


def _ue8m0_frexp(s: torch.Tensor, clamp: bool) -> torch.Tensor:
    out = []
    for v in s.double().tolist():
        if v == 0.0:
            e = 1 if clamp else 0  # code 0 (2^-127): e8m0 has no zero
        elif v < 2.0**-126:
            e = 1  # fp32 subnormal: exponent field 0 plus 1 (the bit form never yields 2^-127)
        else:
            m, ex = math.frexp(v)  # v = m * 2^ex, m in [0.5, 1); a power of two has m == 0.5
            e = (ex - 1 if m == 0.5 else ex) + 127  # biased exponent of the power of two >= v
            if clamp:
                e = min(max(e, 1), 254)
        out.append(math.inf if e >= 255 else 2.0 ** (e - 127))
    return torch.tensor(out, dtype=torch.float64).float()


@pytest.mark.parametrize("clamp", [False, True])
def test_ue8m0_round_up_against_frexp(clamp: bool) -> None:
    pow2 = torch.exp2(torch.arange(-126, 127, 7).float())
    above1 = torch.nextafter(pow2, torch.full_like(pow2, math.inf))
    above2 = torch.nextafter(above1, torch.full_like(pow2, math.inf))
    below = torch.nextafter(pow2, torch.zeros_like(pow2))
    tiny = torch.tensor([0.0, 1e-45, 2.0**-127, 2.0**-126 * 0.75, 1e-40, 2.0**127 * 1.5])
    s = torch.cat([pow2, above1, above2, below, tiny, _amax_samples() / 448])
    got = S.ue8m0_round_up(s, clamp_exponent=clamp)
    assert torch.equal(got, _ue8m0_frexp(s, clamp))


def test_ue8m0_float_form_disagrees_one_ulp_above_a_power_of_two() -> None:
    # documents why the bit form is the rule: 2^ceil(log2 s) in fp32 misses s = 1024 * (1 + 2^-23)
    s = torch.nextafter(torch.tensor([1024.0, 2.0**20]), torch.tensor(math.inf))
    float_form = torch.exp2(torch.ceil(torch.log2(s)))
    assert float_form.tolist() == [1024.0, 2.0**20]
    assert S.ue8m0_round_up(s).tolist() == [2048.0, 2.0**21]


def test_ue8m0_ceil_log2_in_the_e8m0_range() -> None:
    """Where the scale is an e8m0 byte, the ceil_log2 exponent is clamped to [-127, 127]: ceil(log2 s) by hand."""
    above = torch.nextafter(torch.tensor(2.0**-127), torch.tensor(1.0)).item()  # 2^-127 + 2^-149
    s = torch.tensor([0.0, 2.0**-149, 2.0**-140, 2.0**-128, 2.0**-127, above, 0.75 * 2.0**-126, 2.0**-126, 3.0])
    # ceil(log2 s): -inf, -149, -140, -128, -127, -127 (log2 is -127 + 3.4e-7, which fp32 rounds to -127 itself:
    # its ulp there is 2^-17), -126, -126, 2; the first six clamp to -127
    want = [2.0**-127] * 6 + [2.0**-126, 2.0**-126, 4.0]
    assert S.ue8m0_round_up(s, form="ceil_log2", e8m0_range=True).tolist() == want
    # without the range: what exp2(ceil(log2 s)) gives in fp32 (0 and subnormals below 2^-127)
    assert S.ue8m0_round_up(s, form="ceil_log2").tolist() == [0.0, 2.0**-149, 2.0**-140, 2.0**-128, *want[4:]]
    # DeepGEMM's narrower clamp still wins; the bit form is in the range already
    both = S.ue8m0_round_up(s, form="ceil_log2", e8m0_range=True, clamp_exponent=True)
    assert both.tolist() == [2.0**-126] * 8 + [4.0]
    assert torch.equal(S.ue8m0_round_up(s, e8m0_range=True), S.ue8m0_round_up(s))
    got = S.compute_scale(torch.tensor([0.0, 2.0**-130]), 448.0, "ue8m0", eps=0.0, ue8m0_form="ceil_log2",
                          e8m0_range=True)
    assert got.tolist() == [2.0**-127, 2.0**-127]


def test_ocp_floor_against_exponent_bits() -> None:
    amax = _amax_samples()
    amax = amax[amax < 2.0**126]
    for emax in (8, 2):
        bits = amax.view(torch.int32).to(torch.int64)
        exp = ((bits >> 23) & 0xFF) - 127  # floor(log2) for normal numbers; -127 for zero and subnormals
        want = torch.exp2((exp - emax).clamp(min=-127).double()).float()
        assert torch.equal(S.ocp_floor_scale(amax, emax), want)
    assert S.compute_scale(torch.tensor([0.0, 6.0, 7.9]), 6.0, "ocp_floor", emax_elem=2).tolist() == [
        2.0**-127, 1.0, 1.0]


@pytest.mark.parametrize("application", ["divide", "multiply_reciprocal"])
def test_apply_scale_against_float64(application: str) -> None:
    g = _gen(1)
    x = torch.randn(64, 32, generator=g) * 100
    s = torch.rand(64, 1, generator=g) + 0.01
    s[3] = 0.0
    if application == "divide":
        want = (x.double() / s.double()).float()
    else:
        want = (x.double() * (1.0 / s).double()).float()  # 1/s rounded to fp32 first
    want[3] = 0.0
    got = S.apply_scale(x, s, application)
    assert torch.equal(got, want)
    assert torch.equal(S.apply_scale(x.bfloat16(), s, application), S.apply_scale(x.bfloat16().float(), s, application))


# ------------------------------------------------------------------------------------------------- layouts


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    st = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8).set_(st, 0, (st.nbytes(),), (1,))


def _storage_elems(t: torch.Tensor) -> torch.Tensor:
    n = t.untyped_storage().nbytes() // t.element_size()
    return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (n,), (1,))


@pytest.mark.parametrize("m", [1, 5, 8])
def test_column_major_and_tma_layouts(m: int) -> None:
    s = torch.arange(m * 3, dtype=torch.float32).view(m, 3) + 1
    cm = S.to_layout(s, "column_major")
    assert cm.shape == (m, 3) and cm.stride() == (1, m) and torch.equal(cm, s)
    tma = S.to_layout(s, "column_major_tma")
    mp = (m + 3) // 4 * 4
    assert tma.shape == (m, 3) and tma.stride() == (1, mp) and torch.equal(tma, s)
    raw = _storage_elems(tma)
    assert raw.numel() == 3 * mp
    for i in range(m):
        for j in range(3):
            assert raw[j * mp + i] == s[i, j]
    assert int((raw != 0).sum()) == m * 3  # padding is zero
    for layout, stored in (("column_major", cm), ("column_major_tma", tma), ("row_major", s)):
        assert torch.equal(S.from_layout(stored, layout, m, 3), s)


@pytest.mark.parametrize(("mn", "groups"), [(5, 3), (8, 4), (3, 9), (130, 7)])
def test_packed_ue8m0_against_address_formula(mn: int, groups: int) -> None:
    g = _gen(mn)
    e = torch.randint(-127, 128, (mn, groups), generator=g)
    s = torch.exp2(e.double()).float()
    packed = S.pack_ue8m0(s)
    gp, mnp = (groups + 3) // 4, (mn + 3) // 4 * 4
    assert packed.dtype == torch.int32 and packed.shape == (mn, gp) and packed.stride() == (1, mnp)
    raw = _storage_bytes(packed)
    assert raw.numel() == 4 * gp * mnp
    seen = torch.zeros_like(raw, dtype=torch.bool)
    for i in range(mn):
        for j in range(groups):
            addr = ((j // 4) * mnp + i) * 4 + j % 4  # int32 (p = j//4, row i) at p*MN_pad + i; byte j%4 LE
            assert int(raw[addr]) == int(e[i, j]) + 127
            seen[addr] = True
    assert int(raw[~seen].to(torch.int64).sum()) == 0  # missing groups and padding rows are 0
    assert torch.equal(S.unpack_ue8m0(packed, groups), s)
    assert torch.equal(S.from_layout(packed, "packed_ue8m0", mn, groups), s)


def test_packed_ue8m0_rejects_non_powers_of_two() -> None:
    with pytest.raises(ValueError, match="must be powers of two"):
        S.pack_ue8m0(torch.tensor([[1.0, 3.0]]))
    with pytest.raises(ValueError, match="must be powers of two"):
        S.pack_ue8m0(torch.tensor([[1.0, 0.0]]))
    # a power of two below 2^-127 has no byte: packing it as byte 0 would store a larger scale than was used
    with pytest.raises(ValueError, match=r"must be powers of two in \[2\^-127, 2\^127\]"):
        S.pack_ue8m0(torch.tensor([[1.0, 2.0**-128]]))
    assert S.unpack_ue8m0(S.pack_ue8m0(torch.tensor([[2.0**-127, 2.0**127]])), 2).tolist() == [[2.0**-127, 2.0**127]]


@pytest.mark.parametrize(("m", "kc"), [(1, 1), (33, 5), (128, 4), (200, 9)])
def test_swizzle_128x4_against_address_formula(m: int, kc: int) -> None:
    g = _gen(m * kc)
    s = torch.randint(1, 256, (m, kc), generator=g, dtype=torch.int64).to(torch.uint8)
    sw = S.swizzle_128x4(s)
    mp, kp = (m + 127) // 128 * 128, (kc + 3) // 4 * 4
    assert sw.shape == (mp, kp) and sw.is_contiguous() and sw.dtype == torch.uint8
    flat = sw.view(-1)
    kt = (kc + 3) // 4
    hit = torch.zeros(flat.numel(), dtype=torch.bool)
    for i in range(m):
        for k in range(kc):
            off = ((i // 128) * kt + k // 4) * 512 + (i % 32) * 16 + ((i // 32) % 4) * 4 + k % 4
            assert flat[off] == s[i, k], (i, k, off)
            hit[off] = True
    assert int(flat[~hit].to(torch.int64).sum()) == 0  # padding is zero
    assert torch.equal(S.unswizzle_128x4(sw, m, kc), s)
    assert torch.equal(S.from_layout(S.to_layout(s, "swizzle_128x4"), "swizzle_128x4", m, kc), s)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="rule must be one of"):
        S.compute_scale(torch.ones(2), 448.0, "round")
    with pytest.raises(ValueError, match="emax_elem is required"):
        S.compute_scale(torch.ones(2), 448.0, "ocp_floor")
    with pytest.raises(ValueError, match="amax must have dtype"):
        S.float_scale(torch.ones(2, dtype=torch.float64), 448.0)
    with pytest.raises(ValueError, match="s must be finite"):
        S.ue8m0_round_up(torch.tensor([math.nan]))
    with pytest.raises(ValueError, match="scales must have shape"):
        S.from_layout(torch.ones(3, 2), "row_major", 2, 3)
    with pytest.raises(ValueError, match="swizzled must have shape"):
        S.unswizzle_128x4(torch.ones(128, 3), 5, 3)
    with pytest.raises(ValueError, match="layout must be one of"):
        S.to_layout(torch.ones(2, 2), "diagonal")
