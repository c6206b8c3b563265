"""reference.activations against per-element float64 formulas written here with `math` (not torch)."""

from __future__ import annotations

import math

import pytest
import torch

from reference.activations import (
    Activation,
    GateLayout,
    GateOrder,
    Rounding,
    activation_output_width,
    apply_activation,
    gelu_and_mul,
    relu2_no_mul,
    silu_and_mul,
    swigluoai,
    swigluoai_uninterleave,
    swiglustep,
)

GATED = [a for a in Activation if not a.value.endswith("_no_mul")]
NO_MUL = [a for a in Activation if a.value.endswith("_no_mul")]
DEFAULT_PARAMS = {  # the documented defaults, restated here (docs/SEMANTICS.md §4)
    Activation.SWIGLUOAI: dict(alpha=1.702, beta=1.0, limit=7.0),
    Activation.SWIGLUOAI_UNINTERLEAVE: dict(alpha=1.702, beta=1.0, limit=7.0),
    Activation.SWIGLUSTEP: dict(limit=7.0),
}
NATIVE_LAYOUT = {Activation.SWIGLUOAI: GateLayout.INTERLEAVED}


# ---------------------------------------------------------------------------------------------------------
# The independent derivation: scalar float64 formulas.


def _sig(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v)) if v >= 0 else math.exp(v) / (1.0 + math.exp(v))


def _silu(g: float) -> float:
    return g * _sig(g)


def _gelu(g: float) -> float:
    return 0.5 * g * (1.0 + math.erf(g / math.sqrt(2.0)))


def _gelu_tanh(g: float) -> float:
    return 0.5 * g * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g**3)))


def _clip(v: float, lo: float, hi: float) -> float:
    return min(max(v, lo), hi)


def act_up_64(name: Activation, g: float, u: float, clamp_limit: float | None = None, **p: float):
    """(activation value, up factor) of one output element in float64, after all clamps.

    The error scale of an element is |gate| * |up factor|: erf/tanh/exp in fp32 are accurate relative
    to the gate, not to a tiny activation value (gelu of a very negative gate cancels).
    """
    p = {**DEFAULT_PARAMS.get(name, {}), **p}
    if clamp_limit is not None:
        g, u = min(g, clamp_limit), _clip(u, -clamp_limit, clamp_limit)
    if name == Activation.SILU_AND_MUL:
        return _silu(g), u
    if name == Activation.GELU_AND_MUL:
        return _gelu(g), u
    if name == Activation.GELU_TANH_AND_MUL:
        return _gelu_tanh(g), u
    if name in (Activation.SWIGLUOAI, Activation.SWIGLUOAI_UNINTERLEAVE):
        lim = p["limit"]
        g, u = min(g, lim), _clip(u, -lim, lim)
        return g * _sig(p["alpha"] * g), u + p["beta"]
    if name == Activation.SWIGLUSTEP:
        lim = p["limit"]
        return min(_silu(g), lim), _clip(u, -lim, lim)
    raise AssertionError(name)


def no_mul_64(name: Activation, v: float) -> float:
    if name == Activation.SILU_NO_MUL:
        return _silu(v)
    if name == Activation.GELU_NO_MUL:
        return _gelu(v)
    return max(v, 0.0) ** 2


def gate_up_columns(i: int, n: int, gate_order: GateOrder, layout: GateLayout) -> tuple[int, int]:
    c0, c1 = (i, n + i) if layout == GateLayout.HALVES else (2 * i, 2 * i + 1)
    return (c0, c1) if gate_order == GateOrder.GATE_FIRST else (c1, c0)


def gated_ref(x, name, gate_order=GateOrder.GATE_FIRST, layout=None, clamp_limit=None, **p):
    """Float64 [T, N] tensors (act * up, act, up, error scale |gate| * |up factor|) from the rows of x."""
    layout = layout or NATIVE_LAYOUT.get(name, GateLayout.HALVES)
    t, w = x.shape
    n = w // 2
    xs = x.double().tolist()
    acts, ups, mag = (torch.zeros(t, n, dtype=torch.float64) for _ in range(3))
    for r in range(t):
        for i in range(n):
            cg, cu = gate_up_columns(i, n, gate_order, layout)
            acts[r, i], ups[r, i] = act_up_64(name, xs[r][cg], xs[r][cu], clamp_limit, **p)
            mag[r, i] = (abs(xs[r][cg]) + abs(acts[r, i])) * abs(ups[r, i])
    return acts * ups, acts, ups, mag


def assert_within(out: torch.Tensor, ref: torch.Tensor, mag: torch.Tensor) -> None:
    """|out - ref| <= half an ulp of out's dtype (relative) + 64 fp32 ulps of the operand magnitudes."""
    u_out = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
    bound = u_out[out.dtype] * ref.abs() + 64 * 2.0**-24 * (mag + ref.abs()) + 1e-30
    if out.dtype == torch.float64:
        bound = 1e-13 * (mag + ref.abs()) + 1e-300
    err = (out.double() - ref).abs()
    worst = (err / bound).max().item() if err.numel() else 0.0
    assert worst <= 1.0, f"error/bound up to {worst:.3g}"


def _x(t: int, w: int, seed: int, dtype=torch.bfloat16, scale: float = 4.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(t, w, generator=g) * scale).to(dtype)  # values beyond +-7 exercise the clamps


# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", GATED, ids=lambda a: a.value)
@pytest.mark.parametrize("gate_order", list(GateOrder), ids=lambda v: v.value)
@pytest.mark.parametrize("layout", list(GateLayout), ids=lambda v: v.value)
@pytest.mark.parametrize("out_dtype", [None, torch.float32])
def test_gated_matches_float64_formula(name, gate_order, layout, out_dtype) -> None:
    x = _x(6, 32, seed=1)
    out = apply_activation(name, x, gate_order=gate_order, layout=layout, out_dtype=out_dtype)
    assert out.shape == (6, 16) and out.dtype == (out_dtype or x.dtype)
    ref, _, _, mag = gated_ref(x, name, gate_order, layout)
    assert_within(out, ref, mag)


@pytest.mark.parametrize("name", GATED, ids=lambda a: a.value)
def test_gated_default_layout_and_fp64(name) -> None:
    x = _x(4, 20, seed=2, dtype=torch.float64)
    out = apply_activation(name, x)
    assert out.dtype == torch.float64
    ref, _, _, mag = gated_ref(x, name)
    assert_within(out, ref, mag)


@pytest.mark.parametrize("name", NO_MUL, ids=lambda a: a.value)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_no_mul_matches_float64_formula(name, dtype) -> None:
    x = _x(5, 12, seed=3, dtype=dtype)
    out = apply_activation(name, x)
    assert out.shape == x.shape and out.dtype == dtype
    ref = torch.tensor([[no_mul_64(name, v) for v in row] for row in x.double().tolist()], dtype=torch.float64)
    assert_within(out, ref, x.double().abs() ** (2 if name == Activation.RELU2_NO_MUL else 1))


@pytest.mark.parametrize("name", GATED, ids=lambda a: a.value)
def test_rounding_conventions_are_observably_different(name) -> None:
    # scale 1: fp32 gelu of very negative gates is inaccurate relative to its tiny value, flipping roundings
    x = _x(64, 128, seed=4, scale=1.0)
    once = apply_activation(name, x, rounding=Rounding.ROUND_ONCE)
    first = apply_activation(name, x, rounding=Rounding.ROUND_ACTIVATION_FIRST)
    _, act, up, _ = gated_ref(x, name)
    ref_once = (act * up).to(torch.bfloat16)
    ref_first = (act.to(torch.bfloat16).double() * up).to(torch.bfloat16)
    # each convention matches its own formula (up to rare fp32-vs-fp64 ties) ...
    assert (once == ref_once).float().mean() > 0.99
    assert (first == ref_first).float().mean() > 0.99
    # ... and the two differ on a visible fraction of elements
    assert (once != first).float().mean() > 0.1


def test_round_activation_first_intermediate_dtype() -> None:
    x = _x(32, 64, seed=5, dtype=torch.float32)
    _, act, up, mag = gated_ref(x, Activation.SILU_AND_MUL)
    out = silu_and_mul(x, rounding=Rounding.ROUND_ACTIVATION_FIRST, intermediate_dtype=torch.bfloat16)
    assert out.dtype == torch.float32
    assert_within(out, act.to(torch.bfloat16).double() * up, mag)


def test_gate_order_and_layout_are_observable() -> None:
    x = _x(4, 16, seed=6)
    outs = [silu_and_mul(x, gate_order=o, layout=lay) for o in GateOrder for lay in GateLayout]
    for i in range(len(outs)):
        for j in range(i):
            assert not torch.equal(outs[i], outs[j])
    # the uninterleaved swigluoai equals swigluoai on halves, and differs from the interleaved one
    assert torch.equal(swigluoai_uninterleave(x), swigluoai(x, layout=GateLayout.HALVES))
    assert not torch.equal(swigluoai_uninterleave(x), swigluoai(x))


def _one(gate: float, up: float, dtype=torch.float64) -> torch.Tensor:
    return torch.tensor([[gate, up]], dtype=dtype)


def test_swigluoai_clamps_by_hand() -> None:
    a = 1.702
    cases = [  # (gate, up) -> expected, from the formula by hand
        (10.0, 2.0, 7.0 * _sig(a * 7.0) * 3.0),  # gate clamped above
        (-10.0, 2.0, -10.0 * _sig(-a * 10.0) * 3.0),  # gate not clamped below
        (1.0, 9.0, 1.0 * _sig(a) * 8.0),  # up clamped above
        (1.0, -9.0, 1.0 * _sig(a) * -6.0),  # up clamped below
    ]
    for gate, up, want in cases:
        got = swigluoai(torch.tensor([[gate, up]], dtype=torch.float64)).item()
        assert got == pytest.approx(want, rel=1e-12), (gate, up)
    got = swigluoai(_one(2.0, 1.0), alpha=1.0, beta=0.5, limit=1.5).item()
    assert got == pytest.approx(1.5 * _sig(1.5) * 1.5, rel=1e-12)


def test_swiglustep_clamps_after_the_activation() -> None:
    x = torch.tensor([[10.0, 3.0, 2.0, -9.0]], dtype=torch.float64)  # gates 10, 3; ups 2, -9
    got = swiglustep(x).tolist()[0]
    assert got[0] == pytest.approx(7.0 * 2.0, rel=1e-12)  # min(silu(10), 7) = 7, not silu(7)
    assert got[1] == pytest.approx(_silu(3.0) * -7.0, rel=1e-12)
    assert swiglustep(_one(3.0, 1.0), limit=2.0).item() == pytest.approx(2.0, rel=1e-12)


@pytest.mark.parametrize("name", GATED, ids=lambda a: a.value)
def test_clamp_limit_before_the_activation(name) -> None:
    x = _x(4, 32, seed=7, dtype=torch.float32)
    out = apply_activation(name, x, clamp_limit=1.5, out_dtype=torch.float64)
    ref, _, _, mag = gated_ref(x, name, clamp_limit=1.5)
    assert_within(out.float(), ref, mag)
    got = silu_and_mul(torch.tensor([[5.0, -5.0, 3.0, -3.0]], dtype=torch.float64), clamp_limit=2.0)
    assert got.tolist()[0] == pytest.approx([_silu(2.0) * 2.0, _silu(-5.0) * -2.0], rel=1e-12)


def test_activation_output_width() -> None:
    assert activation_output_width("silu_and_mul", 8) == 4
    assert activation_output_width(Activation.SWIGLUOAI, 0) == 0
    assert activation_output_width(Activation.RELU2_NO_MUL, 7) == 7
    with pytest.raises(ValueError, match="width must be even"):
        activation_output_width(Activation.GELU_AND_MUL, 7)
    with pytest.raises(ValueError, match="activation must be one of"):
        activation_output_width("swish", 8)


def test_empty_and_string_names() -> None:
    x = torch.zeros(0, 8, dtype=torch.bfloat16)
    assert apply_activation("gelu_and_mul", x).shape == (0, 4)
    assert torch.equal(apply_activation("relu2_no_mul", _x(2, 4, 8)), relu2_no_mul(_x(2, 4, 8)))


def test_validation_messages() -> None:
    x = _x(2, 8, 9)
    with pytest.raises(ValueError, match="x must be 2-D"):
        silu_and_mul(x.reshape(-1))
    with pytest.raises(ValueError, match="x must have dtype"):
        silu_and_mul(x.to(torch.int32))
    with pytest.raises(ValueError, match="x must have an even number of columns"):
        gelu_and_mul(_x(2, 7, 9))
    with pytest.raises(ValueError, match="gate_order must be one of"):
        silu_and_mul(x, gate_order="second")
    with pytest.raises(ValueError, match="layout must be one of"):
        silu_and_mul(x, layout="zigzag")
    with pytest.raises(ValueError, match="rounding must be one of"):
        silu_and_mul(x, rounding="twice")
    with pytest.raises(ValueError, match="out_dtype must be one of"):
        silu_and_mul(x, out_dtype=torch.int8)
    with pytest.raises(ValueError, match="clamp_limit must be > 0"):
        silu_and_mul(x, clamp_limit=-1.0)
    with pytest.raises(ValueError, match="limit must be > 0"):
        swigluoai(x, limit=0.0)
    with pytest.raises(ValueError, match="alpha is not a parameter of activation 'silu_and_mul'"):
        apply_activation("silu_and_mul", x, alpha=1.0)
    with pytest.raises(ValueError, match="beta is not a parameter of activation 'swiglustep'"):
        apply_activation("swiglustep", x, beta=1.0)
    with pytest.raises(ValueError, match="clamp_limit is not defined for non-gated activation"):
        apply_activation("silu_no_mul", x, clamp_limit=1.0)
    with pytest.raises(ValueError, match="gate_order is not defined for non-gated activation"):
        apply_activation("gelu_no_mul", x, gate_order=GateOrder.UP_FIRST)
    with pytest.raises(ValueError, match="activation must be one of"):
        apply_activation("tanh", x)
