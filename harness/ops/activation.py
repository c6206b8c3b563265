"""Op spec `activation`: gated activations and the no-mul variants (docs/SEMANTICS.md §4).

Judged `bounded` against the oracle's unrounded fp32 result computed with the adapter's conventions: the bound is
one rounding of the output format plus a few dozen fp32 ulps (the GPU's exp/erf/tanh are approximations).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from hypothesis import strategies as st

from harness.core import inputs as gen
from harness.core.case import Case
from harness.core.errors import UNIT_ROUNDOFF, elementwise_bound, rounding_bracket, unit_roundoff
from harness.core.sizes import edge_sizes, span
from harness.ops.base import Axis, Check, OpSpec, OutputSpec, ValueClass
from harness.ops.common import lim
from harness.registry import Adapter
from reference import activations as ref

DTYPES = ("bfloat16", "float16", "float32")
AXES = (
    Axis("activation", "Activation", tuple(a.value for a in ref.Activation)),
    Axis("dtype", "Dtype", DTYPES),
)
#: conventions the oracle takes from an adapter (strings are converted to the reference enums)
_CONVENTION_KEYS = ("gate_order", "layout", "clamp_limit", "rounding", "alpha", "beta", "limit")
#: the activation parameters each activation accepts (reference.activations.apply_activation rejects others)
_PARAMS_OF = {"swigluoai": ("alpha", "beta", "limit"), "swigluoai_uninterleave": ("alpha", "beta", "limit"),
              "swiglustep": ("limit",)}


def oracle_kwargs(conventions: Mapping[str, Any], activation: str) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    gated = ref.is_gated(activation)
    for key in _CONVENTION_KEYS:
        if key not in conventions or conventions[key] is None:
            continue
        if not gated and key in ("gate_order", "layout", "clamp_limit", "rounding"):
            continue
        if key in ("alpha", "beta", "limit") and key not in _PARAMS_OF.get(activation, ()):
            continue
        v = conventions[key]
        kw[key] = {"gate_order": ref.GateOrder, "layout": ref.GateLayout, "rounding": ref.Rounding}.get(
            key, lambda x: x)(v)
    return kw


#: relative error, in units of the input dtype's unit roundoff, that inner roundings to the input dtype add where a
#: kernel's fp32 transcendental lands on the other side of a rounding boundary than the oracle's: act(gate) moves
#: to a neighbour (2u); with every step rounded, the sigmoid and the products after it as well. A worst case on
#: every element: the activation and experts ops bracket the roundings instead (`rounded_activation`); act_quant
#: still pays this.
_INNER_ROUNDINGS = {ref.Rounding.ROUND_ONCE: 0.0, ref.Rounding.ROUND_ACTIVATION_FIRST: 2.0,
                    ref.Rounding.EVERY_STEP: 6.0}


def inner_rounding_slack(rounding: ref.Rounding | str | None, dtype: torch.dtype) -> float:
    """Relative slack for the inner roundings of a gated activation's `rounding` convention (None: round once)."""
    return _INNER_ROUNDINGS[ref.Rounding(rounding or "round_once")] * unit_roundoff(dtype)


def with_extremes(case: Case, x: torch.Tensor, dtype: torch.dtype, *, beside: float | None = None) -> torch.Tensor:
    """x [T, W] (float32) with, by row in turn, the dtype's largest finite value, its negation and its smallest
    normal (two subnormals, multiples of tiny / 8, beside it) at an even column of the first half and an odd column
    of the second: in gate and up under either layout and gate order, never the two parts of one output column.
    Every fourth row stays as it was. beside: the other values of the extreme rows scaled into [-beside, beside]
    (act_quant keeps act(gate) * up finite in fp32 that way); None: left ordinary, so products overflow."""
    x = x.clone()
    t, w = x.shape
    half = w // 2
    if half < 2:
        return x
    info = torch.finfo(dtype)
    g = gen.generator(case, "extremes")
    evens, odds = list(range(0, half, 2)), [c for c in range(half, w) if c % 2]
    for r in range(t):
        kind = r % 4
        if kind == 3:
            continue
        if beside is not None:
            x[r] = x[r] / x[r].abs().amax().clamp_min(1e-30) * beside
        c0 = evens[int(torch.randint(0, len(evens), (1,), generator=g))]
        c1 = next(c for c in odds[int(torch.randint(0, len(odds), (1,), generator=g)):] + odds if c != c0 + half)
        value = (info.max, -info.max, info.tiny)[kind]
        x[r, c0] = x[r, c1] = value
        if kind == 2:  # subnormals beside the smallest normal
            others = [c for c in range(w) if c not in (c0, c1)][:2]
            x[r, others] = torch.tensor([3.0, -5.0])[: len(others)] * (info.tiny / 8)
    return x


def make_inputs(case: Case, device: str) -> dict[str, torch.Tensor]:
    t, n = case.shape("T"), case.shape("N")
    width = 2 * n if ref.is_gated(case.features["activation"]) else n
    # scale 3: exercise the saturating and clamped regions (swigluoai limit 7) as well as the middle
    x = gen.randn(case, "x", (t, width), case.dtype("x"), device, scale=3.0)
    if case.params.get("values") == "extremes":
        x = gen.in_layout(case, "x", with_extremes(case, x.float().cpu(), x.dtype).to(x.dtype).to(device))
    return {"x": x}


def outputs(case: Case, inputs: Mapping[str, torch.Tensor]) -> dict[str, OutputSpec]:
    return {"out": OutputSpec((case.shape("T"), case.shape("N")), case.dtype("x"))}


def expected(case: Case, inputs: Mapping[str, torch.Tensor], conventions: Mapping[str, Any]) -> list[Check]:
    act = case.features["activation"]
    x = inputs["x"].detach().cpu()
    kw = oracle_kwargs(conventions, act)
    want = ref.apply_activation(act, x, out_dtype=torch.float32, **kw)
    # float64: at the dtype's largest finite value the operands' product overflows fp32 (an infinite bound)
    mag = operand_magnitude(x.double(), act, conventions)
    want, exact = overflowed(want, x.dtype)
    bound = torch.where(exact, 0.0, elementwise_bound(want, x.dtype, ulps_fp32=16, magnitude=mag))
    rounding = ref.Rounding(kw.pop("rounding", ref.Rounding.ROUND_ONCE))
    if rounding != ref.Rounding.ROUND_ONCE:
        # the inner roundings, bracketed: the kernel's operands are exact (its input is x), so only its fp32
        # transcendentals can move an inner value across a rounding boundary; (1 + u): the output rounding of it
        h = x.double()
        _, e_inner = rounded_activation(h, torch.zeros_like(h), act, kw, rounding, x.dtype, centre=want.double())
        bound = bound + (1 + unit_roundoff(x.dtype)) * e_inner.float()
    return [Check("out", "bounded", expected=want, bound=bound)]


def overflowed(want: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp32 result with the output rounding's overflow applied (a value past `dtype`'s range rounds to inf:
    silu(max) * up, relu(max)^2), and where it is not finite: there the kernel must give that value exactly."""
    rounded = want.to(dtype).float()
    want = torch.where(torch.isinf(rounded), rounded, want)
    return want, ~torch.isfinite(want)


def rounded_activation(h: torch.Tensor, e_h: torch.Tensor, act: str, act_kw: Mapping[str, Any],
                       rounding: ref.Rounding, dt: torch.dtype, centre: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """A gated activation with inner roundings to `dt` (ROUND_ACTIVATION_FIRST or EVERY_STEP), on float64 rows h
    [R, W] that a kernel knows within e_h: (a, e_a), a the oracle's value before the output rounding (float64) and
    e_a a bound on |a' - a| for a kernel computing the same formula in fp32 from any h' within e_h.

    Each rounding is bracketed, never paid as u |a| on every element: a kernel's operand within e of the oracle's
    rounds to the same value unless it is within e of a rounding boundary (rounding is monotone, so the interval
    of what it can round to is spanned by the rounded ends). act_kw: the activation's conventions (gate_order,
    layout, clamp_limit, alpha, beta, limit), without `rounding`. `centre`: measure e_a from this value instead
    (another honest evaluation, e.g. the oracle's in fp32: it lies in the same interval as any kernel's).
    """
    if rounding == ref.Rounding.EVERY_STEP and act in ("swigluoai", "swigluoai_uninterleave"):
        a, lo, hi = _every_step_swiglu(h, e_h, act, act_kw, dt)
    else:  # single-function activations (silu, gelu...) have one inner rounding under EVERY_STEP: act(gate)'s
        a, e_a = _activation_first(h, e_h, act, act_kw, dt)
        lo, hi = a - e_a, a + e_a
    c = a if centre is None else centre
    return a, torch.maximum(hi - c, c - lo).clamp_min(0)


#: relative fp32 slack per elementary operation of a kernel (its exp/erf/sigmoid are approximations)
_FP32_OP = 64 * UNIT_ROUNDOFF["float32"]


def _gate_up_index(act: str, act_kw: Mapping[str, Any], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    order = ref.GateOrder(act_kw.get("gate_order", ref.GateOrder.GATE_FIRST))
    layout = act_kw.get("layout") or (ref.GateLayout.INTERLEAVED if act == "swigluoai" else ref.GateLayout.HALVES)
    cols = torch.arange(width, dtype=torch.float64)[None, :]
    gate_idx, up_idx = (t[0].long() for t in ref._split(cols, order, ref.GateLayout(layout)))
    return gate_idx, up_idx


def _activation_first(h: torch.Tensor, e_h: torch.Tensor, act: str, act_kw: Mapping[str, Any],
                      dt: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """a = round(act(gate)) * up' and its error bound, with act(gate)'s rounding to dt bracketed: a kernel's
    act(gate), within e_g of the oracle's, rounds to a different value only near a rounding boundary, so most
    elements get no slack for it (adding u |a| everywhere made the bound several times looser)."""
    gate_idx, up_idx = _gate_up_index(act, act_kw, h.shape[1])
    swiglu = act in ("swigluoai", "swigluoai_uninterleave")
    beta = float(act_kw.get("beta", ref.SWIGLUOAI_BETA)) if swiglu else 0.0
    # act(gate) alone: the same activation with every up element set to the value whose transform is 1
    h1 = h.clone()
    h1[:, up_idx] = 1.0 - beta
    hg = h1.requires_grad_(True)
    g = ref.apply_activation(act, hg, **act_kw)
    (grad,) = torch.autograd.grad(g.sum(), hg)
    g = g.detach()
    gate = h[:, gate_idx]
    e_g = grad[:, gate_idx].abs() * e_h[:, gate_idx] + _FP32_OP * (g.abs() + gate.abs() * (gate.abs() + 1))
    rg = g.to(dt).double()
    up_t = _up_transform(h[:, up_idx], act, act_kw)
    a = rg * up_t
    e_a = up_t.abs() * rounding_bracket(g, e_g, dt) + rg.abs() * e_h[:, up_idx] + _FP32_OP * a.abs()
    return a, e_a


def _up_transform(up: torch.Tensor, act: str, act_kw: Mapping[str, Any]) -> torch.Tensor:
    """up as the activation multiplies it (clamps, + beta); its slope is 1 inside the clamps, 0 outside."""
    swiglu = act in ("swigluoai", "swigluoai_uninterleave")
    limits = [act_kw.get("clamp_limit")]
    if swiglu:
        limits.append(act_kw.get("limit", ref.SWIGLUOAI_LIMIT))
    elif act == "swiglustep":
        limits.append(act_kw.get("limit", ref.SWIGLUSTEP_LIMIT))
    for v in limits:
        if v is not None:
            up = up.clamp(-float(v), float(v))
    return up + (float(act_kw.get("beta", ref.SWIGLUOAI_BETA)) if swiglu else 0.0)


def _every_step_swiglu(h: torch.Tensor, e_h: torch.Tensor, act: str, act_kw: Mapping[str, Any],
                       dt: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """swigluoai with every operation rounded to dt (reference.activations EVERY_STEP):
        z = r(g alpha), sig = r(sigmoid(z)), glu = r(g sig), upb = r(u + beta), a = glu upb,
    g, u the clamped gate and up; returns (a, lo, hi), the oracle's value and the interval of any kernel's.
    Carried as intervals: each step maps its operands' intervals through the
    (monotone, or for products corner-wise) operation, widens by the kernel's fp32 error of it and rounds the ends
    (rounding is monotone), so a step's rounding costs something only where the interval straddles a boundary."""
    gate_idx, up_idx = _gate_up_index(act, act_kw, h.shape[1])
    alpha = float(act_kw.get("alpha", ref.SWIGLUOAI_ALPHA))
    beta = float(act_kw.get("beta", ref.SWIGLUOAI_BETA))
    limit = float(act_kw.get("limit", ref.SWIGLUOAI_LIMIT))
    clamp = act_kw.get("clamp_limit")

    def rnd(t: torch.Tensor) -> torch.Tensor:
        return t.to(dt).double()

    def widen(lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rnd(lo - _FP32_OP * lo.abs()), rnd(hi + _FP32_OP * hi.abs())

    def times(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]
              ) -> tuple[torch.Tensor, torch.Tensor]:
        c = torch.stack([a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]])
        return c.amin(dim=0), c.amax(dim=0)

    def clamped(v: torch.Tensor, gate: bool) -> torch.Tensor:
        for bound in (clamp, limit):
            if bound is not None:
                v = v.clamp(max=float(bound)) if gate else v.clamp(-float(bound), float(bound))
        return v

    g, u = h[:, gate_idx], h[:, up_idx]
    eg, eu = e_h[:, gate_idx], e_h[:, up_idx]
    g_iv = (clamped(g - eg, True), clamped(g + eg, True))  # clamps are monotone
    u_iv = (clamped(u - eu, False), clamped(u + eu, False))
    z = widen(g_iv[0] * alpha, g_iv[1] * alpha)  # alpha > 0 keeps the order
    sig = widen(torch.sigmoid(z[0]), torch.sigmoid(z[1]))
    glu = widen(*times(g_iv, sig))
    upb = widen(u_iv[0] + beta, u_iv[1] + beta)
    lo, hi = times(glu, upb)
    lo, hi = lo - _FP32_OP * lo.abs(), hi + _FP32_OP * hi.abs()  # the product's own fp32 rounding
    # the oracle's value (its steps in float64, rounded to dt where the convention rounds)
    a = ref.apply_activation(act, h, rounding=ref.Rounding.EVERY_STEP, intermediate_dtype=dt,
                             out_dtype=torch.float64, **act_kw)
    return a, torch.minimum(lo, a), torch.maximum(hi, a)


def operand_magnitude(x: torch.Tensor, act: str, conventions: Mapping[str, Any]) -> torch.Tensor:
    """Per output element, the size of what the fp32 evaluation multiplies: (|gate| + 1) * (|up| + 1) for a gated
    activation (which part is the gate does not matter), |x| * (|x| + 1) for the no-mul ones (relu2 squares)."""
    if not ref.is_gated(act):
        return x.abs() * (x.abs() + 1)
    layout = conventions.get("layout") or ("interleaved" if act == "swigluoai" else "halves")
    if layout == "interleaved":
        p0, p1 = x[..., 0::2], x[..., 1::2]
    else:
        p0, p1 = x.chunk(2, dim=-1)
    return (p0.abs() + 1) * (p1.abs() + 1)


def _fit_n(adapter: Adapter, n: int) -> int:
    """N moved up to a size the adapter's N limits allow (a kernel that needs N % 8 == 0 is judged at such N)."""
    return span(adapter, "N").fit_up(n)


def draw(draw: st.DrawFn, adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    t = draw(edge_sizes(span(adapter, "T"), lim(adapter, "block_T")))  # T = 0: a boundary case
    n = draw(edge_sizes(span(adapter, "N"), lim(adapter, "block_N")))
    return {"shapes": {"T": t, "N": n}, "dtypes": {"x": cell["dtype"]}}


def boundary(adapter: Adapter, cell: Mapping[str, str]) -> list[dict[str, Any]]:
    return [{"shapes": {"T": t, "N": _fit_n(adapter, n)}, "dtypes": {"x": cell["dtype"]}}
            for t, n in ((0, 8), (1, 1), (7, 63), (17, 64), (33, 129))]


def token_subset(case: Case, inputs: Mapping[str, torch.Tensor], rows: slice) -> tuple[Case, dict[str, torch.Tensor]]:
    x = inputs["x"][rows]
    return case.replace(shapes={**case.shapes, "T": x.shape[0]}), {"x": x}


def _extremes_fields(adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    return {"shapes": {"T": 4, "N": _fit_n(adapter, 8)}, "dtypes": {"x": cell["dtype"]},
            "params": {"values": "extremes"}}


#: the dtype's largest finite value, its negation and its smallest normal in gate and up, beside ordinary values,
#: per dtype: act(-max) is -0 (exp(max) overflows to inf, never inf / inf), act(max) * up may round to inf in the
#: output dtype (the oracle's result then is that inf, required exactly), clamps (swigluoai) take max to the limit
DTYPE_EXTREMES = ValueClass("dtype_extremes", lambda a, c: True, ("dtype",), _extremes_fields,
                            lambda case, inputs: gen.has_extremes(inputs["x"], case.dtype("x")))

SPECS = {"activation": OpSpec(name="activation", title="Gated activations", axes=AXES, make_inputs=make_inputs,
                              outputs=outputs, expected=expected, draw=draw, boundary=boundary,
                              token_subset=token_subset, token_outputs=("out",), value_classes=(DTYPE_EXTREMES,))}
