"""Triton gated activations of MoE experts (docs/SEMANTICS.md §4).

`gated_activation(x, activation)` computes `act(gate) * up` for `x [T, 2N]` (or `act(x)` for the `*_no_mul`
activations on `x [T, N]`) into `out [T, N]` of x's dtype (fp16, bf16, fp32). Everything is computed in fp32 and
rounded once, at the store (the oracle's `Rounding.ROUND_ONCE`).

One pass over memory: each program owns a `BLOCK_T x BLOCK_N` tile of the output (several rows when N is small),
row offsets are int64 (T * 2N may exceed 2**31 elements). The elementwise formulas (`_act_value`) are shared with
the fused activation + fp8 quant kernel (`kernels.act_quant`).

Transcendentals: sigmoid is 1 / (1 + exp(-z)) with `tl.exp` (the GPU's fast exp2-based approximation: a relative
error of a few ulps growing like |z| ulps, which only matters where sigmoid(z) is tiny and so is the product);
erf is `tl.erf` and tanh is libdevice's `tanh` (both within a few ulps). The activation op's bound (16 fp32 ulps
of the operand magnitude, see harness/ops/activation.py) covers all of them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from kernels._launch import output_or_new

__all__ = ["ACTIVATIONS", "GATED", "PARAMS", "activation_code", "gated_activation", "resolve_params"]

#: activation name -> kernel code (a constexpr of the kernels)
ACTIVATIONS: dict[str, int] = {
    "silu_and_mul": 0,
    "gelu_and_mul": 1,
    "gelu_tanh_and_mul": 2,
    "swigluoai": 3,
    "swigluoai_uninterleave": 4,
    "swiglustep": 5,
    "silu_no_mul": 6,
    "gelu_no_mul": 7,
    "relu2_no_mul": 8,
}
GATED = frozenset(n for n, c in ACTIVATIONS.items() if c < 6)
#: the parameters each activation takes, with their defaults (as reference.activations)
PARAMS: dict[str, dict[str, float]] = {
    "swigluoai": {"alpha": 1.702, "beta": 1.0, "limit": 7.0},
    "swigluoai_uninterleave": {"alpha": 1.702, "beta": 1.0, "limit": 7.0},
    "swiglustep": {"limit": 7.0},
}
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_GATE_ORDERS = ("gate_first", "up_first")
_LAYOUTS = ("halves", "interleaved")


@triton.jit
def _sigmoid(z):
    return 1.0 / (1.0 + tl.exp(-z))


@triton.jit
def _act_value(gate, up, alpha, beta, limit, ACT: tl.constexpr):
    """fp32 value of activation ACT: act(gate) * up for the gated ones, act(gate) for the no-mul ones (up unused)."""
    if ACT == 0:  # silu_and_mul
        y = gate * _sigmoid(gate) * up
    elif ACT == 1:  # gelu_and_mul (erf)
        y = 0.5 * gate * (1.0 + tl.erf(gate * 0.7071067811865476)) * up
    elif ACT == 2:  # gelu_tanh_and_mul
        inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        y = 0.5 * gate * (1.0 + libdevice.tanh(inner)) * up
    elif ACT < 5:  # 3 swigluoai (interleaved), 4 swigluoai_uninterleave (halves)
        g = tl.minimum(gate, limit)
        u = tl.minimum(tl.maximum(up, -limit), limit)
        y = g * _sigmoid(alpha * g) * (u + beta)
    elif ACT == 5:  # swiglustep: the gate is clamped after the activation
        s = tl.minimum(gate * _sigmoid(gate), limit)
        y = s * tl.minimum(tl.maximum(up, -limit), limit)
    elif ACT == 6:  # silu_no_mul
        y = gate * _sigmoid(gate)
    elif ACT == 7:  # gelu_no_mul
        y = 0.5 * gate * (1.0 + tl.erf(gate * 0.7071067811865476))
    else:  # relu2_no_mul
        r = tl.maximum(gate, 0.0)
        y = r * r
    return y


@triton.jit
def _load_gate_up(xrow, cols, mask, N, INTERLEAVED: tl.constexpr, UP_FIRST: tl.constexpr, HAS_CLAMP: tl.constexpr,
                  clamp_limit):
    """Load (gate, up) in fp32 for output columns `cols` of the rows at `xrow`, with the optional input clamp."""
    if INTERLEAVED:
        c0 = cols * 2
        c1 = c0 + 1
    else:
        c0 = cols
        c1 = cols + N
    p0 = tl.load(xrow + c0, mask=mask, other=0.0).to(tl.float32)
    p1 = tl.load(xrow + c1, mask=mask, other=0.0).to(tl.float32)
    if UP_FIRST:
        gate = p1
        up = p0
    else:
        gate = p0
        up = p1
    if HAS_CLAMP:  # fused-kernel clamp_limit: gate clamped above, up on both sides, before the activation
        gate = tl.minimum(gate, clamp_limit)
        up = tl.minimum(tl.maximum(up, -clamp_limit), clamp_limit)
    return gate, up


@triton.jit
def _gated_act_kernel(x_ptr, out_ptr, T, N, stride_xt, stride_ot, alpha, beta, limit, clamp_limit,
                      ACT: tl.constexpr, GATED_ACT: tl.constexpr, INTERLEAVED: tl.constexpr,
                      UP_FIRST: tl.constexpr, HAS_CLAMP: tl.constexpr, BLOCK_T: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < T) & (cols[None, :] < N)
    rows64 = rows.to(tl.int64)[:, None]
    xrow = x_ptr + rows64 * stride_xt
    if GATED_ACT:
        gate, up = _load_gate_up(xrow, cols[None, :], mask, N, INTERLEAVED, UP_FIRST, HAS_CLAMP, clamp_limit)
    else:
        gate = tl.load(xrow + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        up = gate
    y = _act_value(gate, up, alpha, beta, limit, ACT)
    tl.store(out_ptr + rows64 * stride_ot + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


def activation_code(activation: str) -> int:
    """Kernel code of `activation` (ValueError naming it when unknown)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")
    return ACTIVATIONS[activation]


def resolve_params(activation: str, alpha: float | None, beta: float | None,
                   limit: float | None) -> tuple[float, float, float]:
    """(alpha, beta, limit) for `activation`: defaults filled in; a parameter it does not take raises ValueError."""
    accepted = PARAMS.get(activation, {})
    given = {"alpha": alpha, "beta": beta, "limit": limit}
    for key, value in given.items():
        if value is not None and key not in accepted:
            raise ValueError(f"{key} is not a parameter of activation {activation!r}")
    vals = {k: float(v) if v is not None else accepted.get(k, 0.0) for k, v in given.items()}
    if "limit" in accepted and not vals["limit"] > 0:
        raise ValueError(f"limit must be > 0, got {vals['limit']}")
    return vals["alpha"], vals["beta"], vals["limit"]


def check_gate_conventions(activation: str, gate_order: str, layout: str | None,
                           clamp_limit: float | None) -> tuple[bool, bool, float | None]:
    """(interleaved, up_first, clamp_limit) for a gated activation; ValueError naming the bad argument."""
    if gate_order not in _GATE_ORDERS:
        raise ValueError(f"gate_order must be one of {', '.join(_GATE_ORDERS)}, got {gate_order!r}")
    if layout is None:
        layout = "interleaved" if activation == "swigluoai" else "halves"
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(_LAYOUTS)}, got {layout!r}")
    if clamp_limit is not None:
        if isinstance(clamp_limit, bool) or not isinstance(clamp_limit, (int, float)) or not clamp_limit > 0:
            raise ValueError(f"clamp_limit must be a number > 0, got {clamp_limit!r}")
        clamp_limit = float(clamp_limit)
    return layout == "interleaved", gate_order == "up_first", clamp_limit


def check_input(x: object, name: str = "x") -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D [T, width], got shape {list(x.shape)}")
    if x.dtype not in _DTYPES:
        raise ValueError(f"{name} dtype must be float16, bfloat16 or float32, got {x.dtype}")
    if x.shape[1] > 1 and x.stride(1) != 1:
        raise ValueError(f"{name} must have unit stride along its last dimension, got strides {x.stride()}")
    return x


def _blocks(n: int) -> tuple[int, int]:
    # ~4096 elements per program: whole rows (several per program) while N <= 1024, 1024-column tiles beyond.
    block_n = min(triton.next_power_of_2(max(n, 1)), 1024)
    return max(1, min(4096 // block_n, 64)), block_n


def gated_activation(
    x: torch.Tensor,
    activation: str,
    *,
    out: torch.Tensor | None = None,
    gate_order: str = "gate_first",
    layout: str | None = None,
    clamp_limit: float | None = None,
    alpha: float | None = None,
    beta: float | None = None,
    limit: float | None = None,
) -> torch.Tensor:
    """act(gate) * up (or act(x) for `*_no_mul`) in fp32, rounded once to x's dtype; returns `out`.

    x: [T, 2N] (gated) or [T, N] (no-mul), float16/bfloat16/float32, unit stride along the last dim.
    out: optional [T, N] tensor of x's dtype on x's device with unit last stride (allocated when None).
    gate_order ("gate_first" | "up_first"), layout ("halves" | "interleaved"; None: interleaved for swigluoai,
    halves otherwise) and clamp_limit (gate clamped above, up clamped both sides, before the activation) apply to
    the gated activations only. alpha/beta/limit: swigluoai* (defaults 1.702, 1.0, 7.0) and swiglustep (limit 7.0).
    Raises ValueError naming the offending argument.
    """
    code = activation_code(activation)
    x = check_input(x)
    gated = activation in GATED
    if gated:
        interleaved, up_first, clamp = check_gate_conventions(activation, gate_order, layout, clamp_limit)
        if x.shape[1] % 2:
            raise ValueError(f"x must have an even number of columns for {activation!r}, got shape {list(x.shape)}")
    else:
        if gate_order != "gate_first" or layout is not None or clamp_limit is not None:
            raise ValueError(f"gate_order, layout and clamp_limit are not defined for {activation!r}")
        interleaved, up_first, clamp = False, False, None
    a, b, lim = resolve_params(activation, alpha, beta, limit)
    t, n = x.shape[0], x.shape[1] // 2 if gated else x.shape[1]
    out = output_or_new("out", out, (t, n), x.dtype, x.device)
    if t == 0 or n == 0:
        return out
    block_t, block_n = _blocks(n)
    grid = (triton.cdiv(t, block_t), triton.cdiv(n, block_n))
    _gated_act_kernel[grid](
        x, out, t, n, x.stride(0), out.stride(0), a, b, lim, clamp if clamp is not None else 0.0,
        ACT=code, GATED_ACT=gated, INTERLEAVED=interleaved, UP_FIRST=up_first, HAS_CLAMP=clamp is not None,
        BLOCK_T=block_t, BLOCK_N=block_n,
    )
    return out
