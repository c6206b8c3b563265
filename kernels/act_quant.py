"""Triton fused gated activation + per-token-group fp8 (e4m3fn) quantization (docs/SEMANTICS.md §2 and §4).

`act_quant(x, activation)` reads `x [T, 2N]` once and writes `codes [T, N]` (float8_e4m3fn) and one scale per
group of `group_size` columns of each row, in one of the scale layouts of reference.scales: row_major fp32
[T, G], column_major (strides (1, T)), column_major_tma (strides (1, T rounded up to 4)) or DeepGEMM's
packed_ue8m0 (int32 [T, ceil(G/4)], strides (1, T rounded up to 4), byte j of word p = exponent of group 4p+j,
missing groups 0). The activation value goes to the quantizer in fp32 (never rounded to x's dtype first).

Per group: amax = max |v| (fp32), scale = max(amax, eps) / 448 by IEEE division (`tl.div_rn`: Triton's `/` is an
approximate division on the GPU), rounded up to a power of two by its bits under `ue8m0` (exponent + 1 when any
mantissa bit is set, no exponent clamp), codes = fp8(clamp(v / scale, -448, 448)) with IEEE division and
round-to-nearest-even (under ue8m0 as v * (1 / scale), the same number since the scale is a power of two).
The clamp comes before the cast so the result never depends on the cast saturating.

Each program owns BLOCK_T rows x GPP whole groups (GPP a multiple of 4, so a packed int32 word is written by
one program), loads the tile as [BLOCK_T, GPP, GS], reduces amax over the last axis and stores everything in
one pass; row offsets are int64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import output_or_new
from kernels.activation import (
    GATED,
    _act_value,
    _load_gate_up,
    activation_code,
    check_gate_conventions,
    check_input,
    resolve_params,
)

__all__ = ["GROUP_SIZES", "SCALE_LAYOUTS", "SCALE_RULES", "act_quant", "empty_scales"]

GROUP_SIZES = (64, 128)
SCALE_RULES = ("float", "ue8m0")
SCALE_LAYOUTS = ("row_major", "column_major", "column_major_tma", "packed_ue8m0")
FP8_MAX = 448.0


@triton.jit
def _act_quant_kernel(x_ptr, q_ptr, s_ptr, T, N, G, stride_xt, stride_qt, stride_st, stride_sg,
                      alpha, beta, limit, clamp_limit, eps,
                      ACT: tl.constexpr, INTERLEAVED: tl.constexpr, UP_FIRST: tl.constexpr,
                      HAS_CLAMP: tl.constexpr, UE8M0: tl.constexpr, PACKED: tl.constexpr,
                      GS: tl.constexpr, GPP: tl.constexpr, BLOCK_T: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    groups = tl.program_id(1) * GPP + tl.arange(0, GPP)
    cols = groups[None, :, None] * GS + tl.arange(0, GS)[None, None, :]  # [1, GPP, GS]
    row_ok = rows < T
    mask = row_ok[:, None, None] & (groups < G)[None, :, None]
    rows64 = rows.to(tl.int64)
    xrow = x_ptr + rows64[:, None, None] * stride_xt
    gate, up = _load_gate_up(xrow, cols, mask, N, INTERLEAVED, UP_FIRST, HAS_CLAMP, clamp_limit)
    v = tl.where(mask, _act_value(gate, up, alpha, beta, limit, ACT), 0.0)

    amax = tl.maximum(tl.max(tl.abs(v), axis=2), eps)  # [BLOCK_T, GPP]
    s = tl.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))
    sbits = s.to(tl.int32, bitcast=True)
    if UE8M0:  # round up to a power of two by the bits: exponent + 1 when any mantissa bit is set
        expo = ((sbits >> 23) & 0xFF) + ((sbits & 0x7FFFFF) != 0).to(tl.int32)
        s = (expo << 23).to(tl.float32, bitcast=True)
    else:
        expo = (sbits >> 23) & 0xFF

    if UE8M0:  # v * (1 / s) is exactly v / s for a power of two s: one division per group, not per element
        y = v * tl.div_rn(tl.full(s.shape, 1.0, tl.float32), s)[:, :, None]
    else:
        y = tl.div_rn(v, tl.broadcast_to(s[:, :, None], v.shape))
    y = tl.where(s[:, :, None] == 0.0, 0.0, y)  # eps = 0 and an all-zero group: zero codes, as the oracle
    y = tl.minimum(tl.maximum(y, -448.0), 448.0)
    tl.store(q_ptr + rows64[:, None, None] * stride_qt + cols, y.to(tl.float8e4nv), mask=mask)

    if PACKED:  # 4 exponent bytes per int32 word, little-endian; groups past G are 0
        expo = tl.where((groups < G)[None, :], expo, 0)
        words = tl.reshape(expo.to(tl.int64), (BLOCK_T, GPP // 4, 4))
        shift = (tl.arange(0, 4) * 8).to(tl.int64)
        w = tl.sum(words << shift[None, None, :], axis=2).to(tl.int32)  # disjoint bytes: the sum is an OR
        widx = tl.program_id(1) * (GPP // 4) + tl.arange(0, GPP // 4)
        wmask = row_ok[:, None] & (widx < (G + 3) // 4)[None, :]
        tl.store(s_ptr + rows64[:, None] * stride_st + widx.to(tl.int64)[None, :] * stride_sg, w, mask=wmask)
    else:
        smask = row_ok[:, None] & (groups < G)[None, :]
        tl.store(s_ptr + rows64[:, None] * stride_st + groups.to(tl.int64)[None, :] * stride_sg, s, mask=smask)


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def _scale_geometry(t: int, g: int, layout: str) -> tuple[tuple[int, int], torch.dtype, tuple[int, int]]:
    """(shape, dtype, strides) of the scales of T rows and G groups in `layout`."""
    if layout == "row_major":
        return (t, g), torch.float32, (g, 1)
    if layout == "column_major":
        return (t, g), torch.float32, (1, t)
    if layout == "column_major_tma":
        return (t, g), torch.float32, (1, _round_up(t, 4))
    if layout == "packed_ue8m0":
        return (t, (g + 3) // 4), torch.int32, (1, _round_up(t, 4))
    raise ValueError(f"scale_layout must be one of {', '.join(SCALE_LAYOUTS)}, got {layout!r}")


def empty_scales(t: int, g: int, layout: str, device: torch.device | str) -> torch.Tensor:
    """Uninitialized scales of T rows and G groups in `layout` (padding of the column-major storages included)."""
    shape, dtype, stride = _scale_geometry(t, g, layout)
    return torch.empty_strided(shape, stride, dtype=dtype, device=device)


def act_quant(
    x: torch.Tensor,
    activation: str = "silu_and_mul",
    *,
    group_size: int = 128,
    scale_rule: str = "float",
    scale_layout: str = "row_major",
    clamp_limit: float | None = None,
    eps: float = 1e-10,
    gate_order: str = "gate_first",
    layout: str | None = None,
    alpha: float | None = None,
    beta: float | None = None,
    limit: float | None = None,
    codes: torch.Tensor | None = None,
    scales: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused act(gate, up) and per-token-group fp8 e4m3fn quantization; returns (codes, scales).

    x: [T, 2N] float16/bfloat16/float32 with unit last stride; N a multiple of group_size (64 or 128).
    activation: a gated activation of kernels.activation (gate_order, layout, alpha/beta/limit as there).
    clamp_limit: gate clamped above and up clamped to [-L, L] before the activation (None: no clamp).
    scale_rule: "float" (max(amax, eps) / 448) or "ue8m0" (that, rounded up to a power of two).
    scale_layout: row_major | column_major | column_major_tma | packed_ue8m0 (needs ue8m0).
    codes / scales: optional destinations: codes [T, N] float8_e4m3fn with unit last stride; scales of the
    layout's shape and dtype (fp32 [T, G], or int32 [T, ceil(G/4)] packed), any strides.
    Raises ValueError naming the offending argument.
    """
    code = activation_code(activation)
    if activation not in GATED:
        raise ValueError(f"activation must be a gated activation ({', '.join(sorted(GATED))}), got {activation!r}")
    x = check_input(x)
    interleaved, up_first, clamp = check_gate_conventions(activation, gate_order, layout, clamp_limit)
    a, b, lim = resolve_params(activation, alpha, beta, limit)
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {group_size!r}")
    if scale_rule not in SCALE_RULES:
        raise ValueError(f"scale_rule must be one of {', '.join(SCALE_RULES)}, got {scale_rule!r}")
    if scale_layout not in SCALE_LAYOUTS:
        raise ValueError(f"scale_layout must be one of {', '.join(SCALE_LAYOUTS)}, got {scale_layout!r}")
    if scale_layout == "packed_ue8m0" and scale_rule != "ue8m0":
        raise ValueError("scale_layout packed_ue8m0 needs scale_rule 'ue8m0' (it stores power-of-two exponents)")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"eps must be a number >= 0, got {eps!r}")
    if x.shape[1] % 2:
        raise ValueError(f"x must have an even number of columns (gate and up), got shape {list(x.shape)}")
    t, n = x.shape[0], x.shape[1] // 2
    if n % group_size:
        raise ValueError(f"N = x.shape[1] // 2 = {n} must be a multiple of group_size {group_size}")
    g = n // group_size

    codes = output_or_new("codes", codes, (t, n), torch.float8_e4m3fn, x.device)
    shape, dtype, _ = _scale_geometry(t, g, scale_layout)
    if scales is None:
        scales = empty_scales(t, g, scale_layout, x.device)
    elif not isinstance(scales, torch.Tensor):
        raise ValueError(f"scales must be a torch.Tensor, got {type(scales).__name__}")
    elif tuple(scales.shape) != shape or scales.dtype != dtype or scales.device != x.device:
        raise ValueError(f"scales must be {list(shape)} {dtype} on {x.device} for scale_layout {scale_layout}, got "
                         f"{list(scales.shape)} {scales.dtype} on {scales.device}")
    if t == 0 or n == 0:
        return codes, scales

    gpp = 512 // group_size  # 512 columns per program: a multiple of 4 groups for the packed words
    block_t = 8
    grid = (triton.cdiv(t, block_t), triton.cdiv(g, gpp))
    _act_quant_kernel[grid](
        x, codes, scales, t, n, g, x.stride(0), codes.stride(0), scales.stride(0), scales.stride(1),
        a, b, lim, clamp if clamp is not None else 0.0, float(eps),
        ACT=code, INTERLEAVED=interleaved, UP_FIRST=up_first, HAS_CLAMP=clamp is not None,
        UE8M0=scale_rule == "ue8m0", PACKED=scale_layout == "packed_ue8m0", GS=group_size, GPP=gpp,
        BLOCK_T=block_t,
    )
    return codes, scales
