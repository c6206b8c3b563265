"""Gated activations of MoE experts (docs/SEMANTICS.md §4).

A gated activation takes the GEMM1 output `x [T, 2N]`, splits it into a *gate* half and an *up* half, and
returns `act(gate) * up` of shape `[T, N]`. The `*_no_mul` activations take `x [T, N]` and apply the
activation elementwise. Libraries agree on the formulas but differ on these conventions, each an explicit
argument here:

- `gate_order`: which of the two parts is the gate (`GATE_FIRST`, vLLM/SGLang; `UP_FIRST`, TRT-LLM/FlashInfer).
- `layout`: how the two parts are stored (`HALVES`: first N columns and last N columns; `INTERLEAVED`: even
  and odd columns). The default (`None`) is the activation's own layout: `INTERLEAVED` for `swigluoai`,
  `HALVES` for everything else.
- `clamp_limit`: optional clamp of fused act+quant kernels, applied to the inputs *before* the activation:
  gate clamped above at `clamp_limit`, up clamped to `[-clamp_limit, clamp_limit]`.
- `rounding`: `ROUND_ONCE` computes everything in fp32 and rounds once to the output dtype;
  `ROUND_ACTIVATION_FIRST` rounds `act(gate)` to `intermediate_dtype` (default: the input dtype) before the
  multiply, as vLLM's CUDA kernels do; `EVERY_STEP` rounds the result of every elementary operation of the
  formula to `intermediate_dtype`, as torch code running in that dtype does (vLLM's `forward_native`): for
  swigluoai g * alpha, sigmoid of that, g * sigmoid, up + beta and the product are each rounded (each computed in
  fp32 from rounded operands); the other activations are one torch function each (F.silu, F.gelu), so for them it
  is ROUND_ACTIVATION_FIRST. For `*_no_mul` all three are the same.

Arithmetic is done in fp32 (fp64 when the input is fp64), the parameters (alpha, beta, limit) taken in that
compute dtype like the inputs. Each activation value act(gate) is evaluated in float64 and rounded once to the
compute dtype (for fp32: the correctly rounded value, up to float64's own ~1e-16 error); the clamps, `up + beta`,
the multiply and the final rounding are single IEEE operations. The result therefore depends on the input values
only, never on strides, batch size or row length (torch's CPU sigmoid/silu/gelu kernels do: their vectorized and
scalar code paths differ by an ulp). The output dtype is the input dtype unless `out_dtype` is given;
`out_dtype=torch.float32` returns the unrounded fp32 value (what the experts oracle and fused act+quant need).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable

import torch

from reference._checks import FLOAT_DTYPES, check_choice, check_int, check_tensor

__all__ = [
    "SWIGLUOAI_ALPHA",
    "SWIGLUOAI_BETA",
    "SWIGLUOAI_LIMIT",
    "SWIGLUSTEP_LIMIT",
    "Activation",
    "GateLayout",
    "GateOrder",
    "Rounding",
    "activation_output_width",
    "apply_activation",
    "gelu_and_mul",
    "gelu_no_mul",
    "gelu_tanh_and_mul",
    "is_gated",
    "relu2_no_mul",
    "silu_and_mul",
    "silu_no_mul",
    "swigluoai",
    "swigluoai_uninterleave",
    "swiglustep",
]

SWIGLUOAI_ALPHA = 1.702
SWIGLUOAI_BETA = 1.0
SWIGLUOAI_LIMIT = 7.0
SWIGLUSTEP_LIMIT = 7.0


class Activation(str, enum.Enum):
    """Names of the activations (the values are the names used by vLLM)."""

    SILU_AND_MUL = "silu_and_mul"
    GELU_AND_MUL = "gelu_and_mul"
    GELU_TANH_AND_MUL = "gelu_tanh_and_mul"
    SWIGLUOAI = "swigluoai"
    SWIGLUOAI_UNINTERLEAVE = "swigluoai_uninterleave"
    SWIGLUSTEP = "swiglustep"
    SILU_NO_MUL = "silu_no_mul"
    GELU_NO_MUL = "gelu_no_mul"
    RELU2_NO_MUL = "relu2_no_mul"


class GateOrder(str, enum.Enum):
    """Which part of a gated input is the gate."""

    GATE_FIRST = "gate_first"  # first half (or even columns) is the gate: vLLM, SGLang
    UP_FIRST = "up_first"  # second half (or odd columns) is the gate: TRT-LLM, FlashInfer


class GateLayout(str, enum.Enum):
    """How gate and up are stored along the last dimension of a gated input."""

    HALVES = "halves"  # [part0 (N columns) | part1 (N columns)]
    INTERLEAVED = "interleaved"  # part0 in even columns, part1 in odd columns


class Rounding(str, enum.Enum):
    """Where a gated activation rounds to a narrow dtype."""

    ROUND_ONCE = "round_once"  # fp32 throughout, one rounding of the product to the output dtype
    ROUND_ACTIVATION_FIRST = "round_activation_first"  # act(gate) rounded before the multiply (vLLM CUDA)
    EVERY_STEP = "every_step"  # every elementary operation rounded (torch code in the input dtype)


_NO_MUL = (Activation.SILU_NO_MUL, Activation.GELU_NO_MUL, Activation.RELU2_NO_MUL)
# Which of alpha / beta / limit each activation takes, with its defaults.
_PARAMS: dict[Activation, dict[str, float]] = {
    Activation.SWIGLUOAI: {"alpha": SWIGLUOAI_ALPHA, "beta": SWIGLUOAI_BETA, "limit": SWIGLUOAI_LIMIT},
    Activation.SWIGLUOAI_UNINTERLEAVE: {
        "alpha": SWIGLUOAI_ALPHA, "beta": SWIGLUOAI_BETA, "limit": SWIGLUOAI_LIMIT,
    },
    Activation.SWIGLUSTEP: {"limit": SWIGLUSTEP_LIMIT},
}


def _as_activation(name: object) -> Activation:
    if isinstance(name, str) and not isinstance(name, Activation):
        try:
            return Activation(name)
        except ValueError:
            pass
    return check_choice("activation", name, list(Activation))  # type: ignore[return-value]


def is_gated(name: Activation | str) -> bool:
    """True for activations that take `[T, 2N]` (gate and up), False for the `*_no_mul` ones."""
    return _as_activation(name) not in _NO_MUL


def activation_output_width(name: Activation | str, width: int) -> int:
    """Output width of activation `name` for an input of last dimension `width`.

    Gated activations halve it (`width` must be even); `*_no_mul` keep it. Raises ValueError otherwise.
    """
    act = _as_activation(name)
    check_int("width", width, min_value=0)
    if act in _NO_MUL:
        return width
    if width % 2:
        raise ValueError(f"width must be even for gated activation {act.value!r}, got {width}")
    return width // 2


# ---------------------------------------------------------------------------------------------------------
# The elementwise formulas, on tensors already in the compute dtype. Each is evaluated in float64 and rounded
# once to the compute dtype (module docstring). Only exp and erfc are used: torch's CPU kernels for them give
# the same bits for every stride and length. 1 + erf and 1 + tanh are rewritten so that nothing cancels.


def _sigmoid64(z: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + torch.exp(-z))


def _silu(g: torch.Tensor) -> torch.Tensor:
    g64 = g.to(torch.float64)
    return (g64 * _sigmoid64(g64)).to(g.dtype)  # g * sigmoid(g)


def _gelu_erf(g: torch.Tensor) -> torch.Tensor:
    # 0.5 g (1 + erf(g / sqrt 2)), with 1 + erf(z) = erfc(-z): exact also in the negative tail
    g64 = g.to(torch.float64)
    return (0.5 * g64 * torch.erfc(-g64 * math.sqrt(0.5))).to(g.dtype)


def _gelu_tanh(g: torch.Tensor) -> torch.Tensor:
    # 0.5 g (1 + tanh(y)), y = sqrt(2/pi) (g + 0.044715 g^3), with 0.5 (1 + tanh(y)) = sigmoid(2y)
    g64 = g.to(torch.float64)
    y = math.sqrt(2.0 / math.pi) * (g64 + 0.044715 * g64 * g64 * g64)
    return (g64 * _sigmoid64(2.0 * y)).to(g.dtype)


def _swiglu_oai(alpha: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def act(g: torch.Tensor) -> torch.Tensor:
        a = float(torch.tensor(alpha, dtype=g.dtype))  # the parameter in the compute dtype, like the inputs
        g64 = g.to(torch.float64)
        return (g64 * _sigmoid64(a * g64)).to(g.dtype)  # g * sigmoid(alpha * g)

    return act


def _swiglu_oai_steps(alpha: float, beta: float) -> Callable[[torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor]:
    """swigluoai as torch code in a narrow dtype runs it: every operation computed in the compute dtype from
    rounded operands and rounded to `rd` (the final product is left to the caller's output rounding)."""
    def run(g: torch.Tensor, u: torch.Tensor, rd: torch.dtype) -> torch.Tensor:
        cd = g.dtype
        a = float(torch.tensor(alpha, dtype=cd))  # a Python scalar operand is taken in the compute dtype
        b = float(torch.tensor(beta, dtype=cd))

        def r(t: torch.Tensor) -> torch.Tensor:
            return t.to(rd).to(cd)

        z = r(g * a)
        sig = r(_sigmoid64(z.to(torch.float64)).to(cd))
        glu = r(g * sig)
        return glu * r(u + b)

    return run


def _relu2(g: torch.Tensor) -> torch.Tensor:
    r = torch.relu(g)
    return r * r


# ---------------------------------------------------------------------------------------------------------
# Shared plumbing.


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _check_x(x: object) -> torch.Tensor:
    return check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)


def _check_out_dtype(name: str, dtype: object) -> None:
    if dtype is not None:
        check_choice(name, dtype, FLOAT_DTYPES)


def _check_limit(name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{name} must be a number, got {type(v).__name__}")
    v = float(v)
    if not v > 0:  # also rejects NaN
        raise ValueError(f"{name} must be > 0, got {v}")
    return v


def _check_number(name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{name} must be a number, got {type(v).__name__}")
    return float(v)


def _split(
    x: torch.Tensor, gate_order: GateOrder, layout: GateLayout
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split `x [T, 2N]` into (gate, up), each `[T, N]`."""
    check_choice("gate_order", gate_order, list(GateOrder))
    check_choice("layout", layout, list(GateLayout))
    if x.shape[1] % 2:
        raise ValueError(f"x must have an even number of columns for a gated activation, got {list(x.shape)}")
    if layout == GateLayout.HALVES:
        n = x.shape[1] // 2
        part0, part1 = x[:, :n], x[:, n:]
    else:
        part0, part1 = x[:, 0::2], x[:, 1::2]
    return (part0, part1) if gate_order == GateOrder.GATE_FIRST else (part1, part0)


def _gated(
    x: object,
    act: Callable[[torch.Tensor], torch.Tensor],
    *,
    gate_order: GateOrder,
    layout: GateLayout,
    up_transform: Callable[[torch.Tensor], torch.Tensor] | None,
    pre_clamp: float | None,
    clamp_limit: float | None,
    rounding: Rounding,
    intermediate_dtype: torch.dtype | None,
    out_dtype: torch.dtype | None,
    steps: Callable[[torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor] | None = None,
) -> torch.Tensor:
    """out = act(gate') * up_transform(up'), with gate', up' the inputs after the optional clamps. `steps`: the
    whole formula with every operation rounded (EVERY_STEP), where it is more than one operation."""
    x = _check_x(x)
    check_choice("rounding", rounding, list(Rounding))
    _check_out_dtype("out_dtype", out_dtype)
    _check_out_dtype("intermediate_dtype", intermediate_dtype)
    if clamp_limit is not None:
        clamp_limit = _check_limit("clamp_limit", clamp_limit)
    gate, up = _split(x, gate_order, layout)
    cd = _compute_dtype(x)
    gate, up = gate.to(cd), up.to(cd)
    # Input clamps: the optional fused-kernel clamp_limit first, then the activation's own (swigluoai).
    for lim in (clamp_limit, pre_clamp):
        if lim is not None:
            gate = gate.clamp(max=lim)
            up = up.clamp(min=-lim, max=lim)
    if rounding == Rounding.EVERY_STEP and steps is not None:
        return steps(gate, up, intermediate_dtype or x.dtype).to(out_dtype or x.dtype)
    g = act(gate)
    if rounding != Rounding.ROUND_ONCE:
        g = g.to(intermediate_dtype or x.dtype).to(cd)
    if up_transform is not None:
        up = up_transform(up)
    return (g * up).to(out_dtype or x.dtype)


def _no_mul(
    x: object, act: Callable[[torch.Tensor], torch.Tensor], out_dtype: torch.dtype | None
) -> torch.Tensor:
    x = _check_x(x)
    _check_out_dtype("out_dtype", out_dtype)
    return act(x.to(_compute_dtype(x))).to(out_dtype or x.dtype)


# ---------------------------------------------------------------------------------------------------------
# Public activations.


def silu_and_mul(
    x: torch.Tensor,
    *,
    gate_order: GateOrder = GateOrder.GATE_FIRST,
    layout: GateLayout = GateLayout.HALVES,
    clamp_limit: float | None = None,
    rounding: Rounding = Rounding.ROUND_ONCE,
    intermediate_dtype: torch.dtype | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """silu(gate) * up, silu(g) = g * sigmoid(g).

    x: `[T, 2N]` float (fp16, bf16, fp32, fp64). Returns `[T, N]` in `out_dtype` (default x.dtype).
    Conventions (module docstring): gate_order (GATE_FIRST), layout (HALVES), clamp_limit (None: no clamp),
    rounding (ROUND_ONCE; ROUND_ACTIVATION_FIRST and EVERY_STEP round silu(gate) to `intermediate_dtype`, default
    x.dtype).
    """
    return _gated(
        x, _silu, gate_order=gate_order, layout=layout, up_transform=None, pre_clamp=None,
        clamp_limit=clamp_limit, rounding=rounding, intermediate_dtype=intermediate_dtype, out_dtype=out_dtype,
    )


def gelu_and_mul(
    x: torch.Tensor,
    *,
    gate_order: GateOrder = GateOrder.GATE_FIRST,
    layout: GateLayout = GateLayout.HALVES,
    clamp_limit: float | None = None,
    rounding: Rounding = Rounding.ROUND_ONCE,
    intermediate_dtype: torch.dtype | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """gelu(gate) * up with the exact (erf) gelu: gelu(g) = 0.5 * g * (1 + erf(g / sqrt(2))).

    Shapes, dtypes and conventions as `silu_and_mul`.
    """
    return _gated(
        x, _gelu_erf, gate_order=gate_order, layout=layout, up_transform=None, pre_clamp=None,
        clamp_limit=clamp_limit, rounding=rounding, intermediate_dtype=intermediate_dtype, out_dtype=out_dtype,
    )


def gelu_tanh_and_mul(
    x: torch.Tensor,
    *,
    gate_order: GateOrder = GateOrder.GATE_FIRST,
    layout: GateLayout = GateLayout.HALVES,
    clamp_limit: float | None = None,
    rounding: Rounding = Rounding.ROUND_ONCE,
    intermediate_dtype: torch.dtype | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """gelu_tanh(gate) * up, gelu_tanh(g) = 0.5 * g * (1 + tanh(sqrt(2/pi) * (g + 0.044715 * g^3))).

    Shapes, dtypes and conventions as `silu_and_mul`.
    """
    return _gated(
        x, _gelu_tanh, gate_order=gate_order, layout=layout, up_transform=None, pre_clamp=None,
        clamp_limit=clamp_limit, rounding=rounding, intermediate_dtype=intermediate_dtype, out_dtype=out_dtype,
    )


def swigluoai(
    x: torch.Tensor,
    *,
    alpha: float = SWIGLUOAI_ALPHA,
    beta: float = SWIGLUOAI_BETA,
    limit: float = SWIGLUOAI_LIMIT,
    gate_order: GateOrder = GateOrder.GATE_FIRST,
    layout: GateLayout = GateLayout.INTERLEAVED,
    clamp_limit: float | None = None,
    rounding: Rounding = Rounding.ROUND_ONCE,
    intermediate_dtype: torch.dtype | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """gpt-oss SwiGLU: g = min(gate, limit), u = clamp(up, -limit, limit), out = g * sigmoid(alpha * g) * (u + beta).

    x: `[T, 2N]`, gate in the even columns and up in the odd ones by default (layout INTERLEAVED,
    gate_order GATE_FIRST). Defaults alpha = 1.702, beta = 1.0, limit = 7.0. With ROUND_ACTIVATION_FIRST
    the rounded "activation" is g * sigmoid(alpha * g); with EVERY_STEP every operation is rounded (module
    docstring). Other arguments as `silu_and_mul`.
    """
    alpha, beta = _check_number("alpha", alpha), _check_number("beta", beta)
    limit = _check_limit("limit", limit)
    return _gated(
        x, _swiglu_oai(alpha), gate_order=gate_order, layout=layout,
        up_transform=lambda u: u + beta, pre_clamp=limit, clamp_limit=clamp_limit, rounding=rounding,
        intermediate_dtype=intermediate_dtype, out_dtype=out_dtype, steps=_swiglu_oai_steps(alpha, beta),
    )


def swigluoai_uninterleave(
    x: torch.Tensor,
    *,
    alpha: float = SWIGLUOAI_ALPHA,
    beta: float = SWIGLUOAI_BETA,
    limit: float = SWIGLUOAI_LIMIT,
    gate_order: GateOrder = GateOrder.GATE_FIRST,
    layout: GateLayout = GateLayout.HALVES,
    clamp_limit: float | None = None,
    rounding: Rounding = Rounding.ROUND_ONCE,
    intermediate_dtype: torch.dtype | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """`swigluoai` on halves: gate = first N columns, up = last N columns (layout HALVES by default)."""
    return swigluoai(
        x, alpha=alpha, beta=beta, limit=limit, gate_order=gate_order, layout=layout, clamp_limit=clamp_limit,
        rounding=rounding, intermediate_dtype=intermediate_dtype, out_dtype=out_dtype,
    )


def swiglustep(
    x: torch.Tensor,
    *,
    limit: float = SWIGLUSTEP_LIMIT,
    gate_order: GateOrder = GateOrder.GATE_FIRST,
    layout: GateLayout = GateLayout.HALVES,
    clamp_limit: float | None = None,
    rounding: Rounding = Rounding.ROUND_ONCE,
    intermediate_dtype: torch.dtype | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """min(silu(gate), limit) * clamp(up, -limit, limit): the gate is clamped *after* the activation.

    Default limit = 7.0. With ROUND_ACTIVATION_FIRST the rounded activation is min(silu(gate), limit).
    Other arguments as `silu_and_mul`.
    """
    limit = _check_limit("limit", limit)
    return _gated(
        x, lambda g: _silu(g).clamp(max=limit), gate_order=gate_order, layout=layout,
        up_transform=lambda u: u.clamp(min=-limit, max=limit), pre_clamp=None, clamp_limit=clamp_limit,
        rounding=rounding, intermediate_dtype=intermediate_dtype, out_dtype=out_dtype,
    )


def silu_no_mul(x: torch.Tensor, *, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """silu(x) elementwise. x: `[T, N]` float; returns `[T, N]` in `out_dtype` (default x.dtype)."""
    return _no_mul(x, _silu, out_dtype)


def gelu_no_mul(x: torch.Tensor, *, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """gelu(x) elementwise, erf form. x: `[T, N]` float; returns `[T, N]` in `out_dtype` (default x.dtype)."""
    return _no_mul(x, _gelu_erf, out_dtype)


def relu2_no_mul(x: torch.Tensor, *, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """relu(x)^2 elementwise. x: `[T, N]` float; returns `[T, N]` in `out_dtype` (default x.dtype)."""
    return _no_mul(x, _relu2, out_dtype)


_GATED_FNS: dict[Activation, Callable[..., torch.Tensor]] = {
    Activation.SILU_AND_MUL: silu_and_mul,
    Activation.GELU_AND_MUL: gelu_and_mul,
    Activation.GELU_TANH_AND_MUL: gelu_tanh_and_mul,
    Activation.SWIGLUOAI: swigluoai,
    Activation.SWIGLUOAI_UNINTERLEAVE: swigluoai_uninterleave,
    Activation.SWIGLUSTEP: swiglustep,
}
_NO_MUL_FNS: dict[Activation, Callable[..., torch.Tensor]] = {
    Activation.SILU_NO_MUL: silu_no_mul,
    Activation.GELU_NO_MUL: gelu_no_mul,
    Activation.RELU2_NO_MUL: relu2_no_mul,
}


def apply_activation(
    name: Activation | str,
    x: torch.Tensor,
    *,
    gate_order: GateOrder = GateOrder.GATE_FIRST,
    layout: GateLayout | None = None,
    alpha: float | None = None,
    beta: float | None = None,
    limit: float | None = None,
    clamp_limit: float | None = None,
    rounding: Rounding = Rounding.ROUND_ONCE,
    intermediate_dtype: torch.dtype | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Apply activation `name` (an `Activation` or its string value) to `x` with the given conventions.

    `layout=None` means the activation's own layout (INTERLEAVED for swigluoai, HALVES otherwise).
    `alpha`, `beta`, `limit` are accepted only by the activations that have them (swigluoai*: all three;
    swiglustep: limit); None means the activation's default. The `*_no_mul` activations take no gate
    conventions: passing a non-default gate_order, layout, clamp_limit or rounding raises ValueError.
    """
    act = _as_activation(name)
    params = {"alpha": alpha, "beta": beta, "limit": limit}
    accepted = _PARAMS.get(act, {})
    for key, value in params.items():
        if value is not None and key not in accepted:
            raise ValueError(f"{key} is not a parameter of activation {act.value!r}")
    kwargs = {k: v for k, v in params.items() if v is not None}
    if act in _NO_MUL_FNS:
        check_choice("gate_order", gate_order, list(GateOrder))
        check_choice("rounding", rounding, list(Rounding))
        for key, value, default in (
            ("gate_order", gate_order, GateOrder.GATE_FIRST),
            ("layout", layout, None),
            ("clamp_limit", clamp_limit, None),
            ("rounding", rounding, Rounding.ROUND_ONCE),
            ("intermediate_dtype", intermediate_dtype, None),
        ):
            if value != default:
                raise ValueError(f"{key} is not defined for non-gated activation {act.value!r}")
        return _NO_MUL_FNS[act](x, out_dtype=out_dtype)
    if layout is not None:
        kwargs["layout"] = layout
    return _GATED_FNS[act](
        x, gate_order=gate_order, clamp_limit=clamp_limit, rounding=rounding,
        intermediate_dtype=intermediate_dtype, out_dtype=out_dtype, **kwargs,
    )
