"""Dynamic 8-bit quantization of activations: per-token-group, per-token and per-tensor (docs/SEMANTICS.md §2).

`group_quant(x, ...)` quantizes x [M, K] (bf16/fp16/fp32, any strides) to fp8 e4m3fn or int8 codes [M, K] and
float32 scales (or DeepGEMM packed UE8M0 int32 words). Numeric conventions (what the oracle must use to judge it):
- amax in fp32 over the unit; scale = max(amax, eps) / qmax with a correctly rounded division (tl.div_rn; the
  plain fp32 `/` of Triton is approximate on NVIDIA GPUs), eps 1e-10 by default (placed on amax, as vLLM/SGLang);
- `ue8m0`: that scale rounded up to a power of two by its bits (biased exponent + 1 if any mantissa bit is set);
  no exponent clamp (with eps > 0 the exponent stays in [1, 254] anyway);
- elements: x / scale with a correctly rounded division (`float` scales), x * (1 / scale) for power-of-two
  scales (exact, so the same as dividing); then clamped to [-qmax, qmax] and cast (fp8: RNE, int8: the
  `int8_rounding` argument, `half_even` by default, or `truncate` toward zero after clamping);
- a zero scale (eps = 0 and an all-zero unit) gives zero codes.

Scale layouts of the group unit: `row_major` [M, G]; `column_major` [M, G] view of a [G, M] storage;
`column_major_tma` [M, G] view with strides (1, M_pad), M_pad = M rounded up to 4 (padding rows never written);
`packed_ue8m0` int32 [M, ceil(G/4)] with strides (1, M_pad), byte j of word p = exponent of group 4p + j, missing
groups 0. Per-token scales are [M, 1], the per-tensor scale is [1].

One pass over x for group and token units (a program loads a [BLOCK_M, GROUPS, GROUP] tile once, reduces, scales
and stores); per-token rows wider than 8192 elements, and the per-tensor unit, read x twice (amax, then quant).
The per-tensor amax is a deterministic two-level max (per-program partials, then one program), no atomics.
Offsets are int64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["LAYOUTS", "QUANT_DTYPES", "UNITS", "group_quant", "scale_storage"]

QUANT_DTYPES = {"fp8_e4m3fn": (torch.float8_e4m3fn, 448.0), "int8": (torch.int8, 127.0)}
UNITS = ("group", "token", "tensor")
LAYOUTS = ("row_major", "column_major", "column_major_tma", "packed_ue8m0")
SCALE_RULES = ("float", "ue8m0")
INT8_ROUNDINGS = ("half_even", "truncate")
_X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: widest group/row one program holds in registers (elements); wider per-token rows take the two-pass kernel
MAX_TILE = 8192
#: elements per program the launcher aims for (memory bound: enough bytes in flight per SM)
TILE_ELEMS = 4096

# SCALE_MODE values of the kernels
_FLOAT, _UE8M0, _STATIC = 0, 1, 2


@triton.jit
def _row_offsets(rows, stride):
    # int64: M * stride exceeds 2**31 elements for large activations (M=16384 x K=7168 x 2 bytes does not, but
    # padded strides and larger batches do)
    return rows.to(tl.int64) * stride


@triton.jit
def _scale_of(amax, eps, QMAX: tl.constexpr, SCALE_MODE: tl.constexpr, FAST_DIV: tl.constexpr):
    if FAST_DIV:  # fp32 '/': an approximate division on the GPU (div.full.f32, within 2 ulp)
        s = tl.maximum(amax, eps) / tl.full(amax.shape, QMAX, tl.float32)
    else:
        s = tl.div_rn(tl.maximum(amax, eps), tl.full(amax.shape, QMAX, tl.float32))
    if SCALE_MODE == 1:
        bits = s.to(tl.int32, bitcast=True)
        e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
        s = (e << 23).to(tl.float32, bitcast=True)
    return s


@triton.jit
def _codes_of(x, s, QMAX: tl.constexpr, POW2: tl.constexpr, OUT_INT8: tl.constexpr, INT8_RTE: tl.constexpr,
              FAST_DIV: tl.constexpr):
    # x fp32, s broadcastable to x
    safe = tl.where(s == 0.0, 1.0, s)
    if POW2:
        y = x * tl.div_rn(tl.full(safe.shape, 1.0, tl.float32), safe)  # exact: s is a power of two
    elif FAST_DIV:
        y = x / tl.broadcast_to(safe, x.shape)
    else:
        y = tl.div_rn(x, tl.broadcast_to(safe, x.shape))
    y = tl.where(s == 0.0, 0.0, y)
    if OUT_INT8:
        y = tl.minimum(tl.maximum(y, -128.0), 127.0)
        if INT8_RTE:
            # round half to even: adding 1.5 * 2**23 leaves no fraction bits and the fp32 add rounds to nearest
            # even (exact for |y| <= 2**22; no libdevice, so it also runs in an unpatched interpreter)
            y = (y + 12582912.0) - 12582912.0
        q = y.to(tl.int8)  # truncates toward zero (exact after the rounding)
    else:  # an else, not an early return: Triton 3.6 types the dead branch's return too
        y = tl.minimum(tl.maximum(y, -QMAX), QMAX)  # clamp first: the cast must never see |y| > qmax
        q = y.to(tl.float8e4nv)
    return q


# A group that is not a power of two (drawn group sizes; a token's whole row) is a runtime value: each one was a
# compile of its own (101 of the GPU suite's 398 variants of this kernel).
@triton.jit(do_not_specialize=["group"])
def _tile_quant_kernel(
    x_ptr, q_ptr, s_ptr, s_in_ptr, eps,
    M, K, G, group, stride_xm, stride_xk, stride_qm, stride_sm, stride_sg,
    QMAX: tl.constexpr, GROUP_P2: tl.constexpr, EXACT: tl.constexpr, BLOCK_M: tl.constexpr,
    GROUPS: tl.constexpr, SCALE_MODE: tl.constexpr, PACKED: tl.constexpr, STORE_SCALE: tl.constexpr,
    OUT_INT8: tl.constexpr, INT8_RTE: tl.constexpr, FAST_DIV: tl.constexpr,
):
    """One [BLOCK_M, GROUPS, GROUP_P2] tile: rows x groups x elements of a group (`group` valid of GROUP_P2;
    EXACT: group == GROUP_P2)."""
    pid_m = tl.program_id(0)
    pid_g = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    groups = pid_g * GROUPS + tl.arange(0, GROUPS)
    j = tl.arange(0, GROUP_P2)
    if EXACT:
        cols = groups[None, :, None].to(tl.int64) * GROUP_P2 + j[None, None, :]
    else:
        cols = groups[None, :, None].to(tl.int64) * group + j[None, None, :]
    rmask = rows < M
    gmask = groups < G
    mask = rmask[:, None, None] & gmask[None, :, None] & (cols < K)
    if not EXACT:
        mask = mask & (j < group)[None, None, :]
    xo = _row_offsets(rows, stride_xm)[:, None, None] + cols * stride_xk
    x = tl.load(x_ptr + xo, mask=mask, other=0.0).to(tl.float32)

    if SCALE_MODE == 2:
        s = tl.load(s_in_ptr + tl.zeros([BLOCK_M, GROUPS], tl.int32))
    else:
        s = _scale_of(tl.max(tl.abs(x), axis=2), eps, QMAX, SCALE_MODE, FAST_DIV)
    q = _codes_of(x, s[:, :, None], QMAX, SCALE_MODE == 1, OUT_INT8, INT8_RTE, FAST_DIV)
    tl.store(q_ptr + _row_offsets(rows, stride_qm)[:, None, None] + cols, q, mask=mask)

    if STORE_SCALE:
        if PACKED:
            # byte j of word p = biased exponent of group 4p + j; groups past G contribute 0
            e = (s.to(tl.int32, bitcast=True) >> 23) & 0xFF
            e = tl.where(gmask[None, :], e, 0)
            e = tl.reshape(e, [BLOCK_M, GROUPS // 4, 4])
            shift = (tl.arange(0, 4) * 8)[None, None, :]
            words = tl.sum(e << shift, axis=2)  # disjoint bytes: the sum is the bitwise or
            p = pid_g * (GROUPS // 4) + tl.arange(0, GROUPS // 4)
            so = _row_offsets(rows, stride_sm)[:, None] + p[None, :].to(tl.int64) * stride_sg
            tl.store(s_ptr + so, words, mask=rmask[:, None] & (p < (G + 3) // 4)[None, :])
        else:
            so = _row_offsets(rows, stride_sm)[:, None] + groups[None, :].to(tl.int64) * stride_sg
            tl.store(s_ptr + so, s, mask=rmask[:, None] & gmask[None, :])


@triton.jit
def _amax_partial_kernel(x_ptr, part_ptr, M, K, stride_xm, stride_xk, BLOCK_M: tl.constexpr,
                         BLOCK_K: tl.constexpr):
    """part[pid] = max |x| over rows [pid * BLOCK_M, +BLOCK_M) (0 for no rows)."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    base = _row_offsets(rows, stride_xm)[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        mask = (rows < M)[:, None] & (cols < K)[None, :]
        x = tl.load(x_ptr + base + cols[None, :].to(tl.int64) * stride_xk, mask=mask, other=0.0)
        acc = tl.maximum(acc, tl.abs(x.to(tl.float32)))
    tl.store(part_ptr + pid, tl.max(tl.max(acc, axis=1), axis=0))


@triton.jit
def _amax_final_kernel(part_ptr, s_ptr, n, eps, QMAX: tl.constexpr, SCALE_MODE: tl.constexpr,
                       BLOCK: tl.constexpr, FAST_DIV: tl.constexpr):
    acc = tl.zeros([BLOCK], tl.float32)
    for i0 in range(0, n, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        acc = tl.maximum(acc, tl.load(part_ptr + i, mask=i < n, other=0.0))
    amax = tl.max(acc, axis=0)
    s = _scale_of(tl.full([1], 0.0, tl.float32) + amax, eps, QMAX, SCALE_MODE, FAST_DIV)
    tl.store(s_ptr + tl.arange(0, 1), s)


@triton.jit
def _wide_row_kernel(x_ptr, q_ptr, s_ptr, eps, M, K, stride_xm, stride_xk, stride_qm, stride_sm,
                     QMAX: tl.constexpr, BLOCK_K: tl.constexpr, SCALE_MODE: tl.constexpr,
                     OUT_INT8: tl.constexpr, INT8_RTE: tl.constexpr, FAST_DIV: tl.constexpr):
    """Per-token quant of one row wider than a register tile: amax pass, then quant pass."""
    row = tl.program_id(0)
    xb = x_ptr + row.to(tl.int64) * stride_xm
    acc = tl.zeros([BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(xb + cols.to(tl.int64) * stride_xk, mask=cols < K, other=0.0)
        acc = tl.maximum(acc, tl.abs(x.to(tl.float32)))
    s = _scale_of(tl.full([1], 0.0, tl.float32) + tl.max(acc, axis=0), eps, QMAX, SCALE_MODE, FAST_DIV)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(xb + cols.to(tl.int64) * stride_xk, mask=cols < K, other=0.0).to(tl.float32)
        q = _codes_of(x, s, QMAX, SCALE_MODE == 1, OUT_INT8, INT8_RTE, FAST_DIV)
        tl.store(q_ptr + row.to(tl.int64) * stride_qm + cols, q, mask=cols < K)
    tl.store(s_ptr + row.to(tl.int64) * stride_sm + tl.arange(0, 1), s)


# ------------------------------------------------------------------------------------------------- launcher


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def scale_storage(m: int, num_groups: int, layout: str, device: torch.device | str) -> torch.Tensor:
    """An uninitialized scale tensor of `layout` for [m, num_groups] group scales (module docstring)."""
    if layout == "row_major":
        return torch.empty((m, num_groups), dtype=torch.float32, device=device)
    if layout == "column_major":
        return torch.empty_strided((m, num_groups), (1, m), dtype=torch.float32, device=device)
    if layout == "column_major_tma":
        return torch.empty_strided((m, num_groups), (1, _round_up(m, 4)), dtype=torch.float32, device=device)
    if layout == "packed_ue8m0":
        return torch.empty_strided((m, (num_groups + 3) // 4), (1, _round_up(m, 4)), dtype=torch.int32,
                                   device=device)
    raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return value  # type: ignore[return-value]


def _check_out(name: str, t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype,
               stride: tuple[int, ...] | None, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
    if tuple(t.shape) != shape or t.dtype != dtype or t.device != device:
        raise ValueError(f"{name} must be {dtype} {list(shape)} on {device}, got {t.dtype} {list(t.shape)} "
                         f"on {t.device}")
    if stride is not None and t.numel() and tuple(t.stride()) != stride:
        raise ValueError(f"{name} must have strides {stride}, got {tuple(t.stride())}")


def _check_args(x: torch.Tensor, dtype: str, unit: str, group_size: int, scale_rule: str, layout: str, eps: float,
                int8_rounding: str, block_m: int | None, groups_per_program: int | None,
                num_warps: int | None) -> tuple[torch.dtype, float]:
    """Validate `group_quant`'s arguments (ValueError naming the argument); returns the codes' dtype and qmax."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype not in _X_DTYPES:
        what = f"{x.dtype} {x.dim()}-D tensor" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a 2-D bfloat16/float16/float32 tensor, got {what}")
    qdtype, qmax = QUANT_DTYPES[_choice("dtype", dtype, tuple(QUANT_DTYPES))]
    _choice("unit", unit, UNITS)
    _choice("scale_rule", scale_rule, SCALE_RULES)
    _choice("layout", layout, LAYOUTS)
    _choice("int8_rounding", int8_rounding, INT8_ROUNDINGS)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0 or eps == float("inf"):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    k = x.shape[1]
    if k == 0:
        raise ValueError("x must have K >= 1 columns")
    if unit != "group" and layout != "row_major":
        raise ValueError(f"layout must be row_major for unit {unit} (one scale per {unit}), got {layout}")
    if layout == "packed_ue8m0" and (scale_rule != "ue8m0" or dtype != "fp8_e4m3fn"):
        raise ValueError("layout packed_ue8m0 needs dtype fp8_e4m3fn and scale_rule ue8m0 (power-of-two scales), "
                         f"got dtype {dtype}, scale_rule {scale_rule}")
    if unit == "group":
        if isinstance(group_size, bool) or not isinstance(group_size, int) or not 1 <= group_size <= MAX_TILE:
            raise ValueError(f"group_size must be an int in [1, {MAX_TILE}], got {group_size!r}")
        if k % group_size:
            raise ValueError(f"group_size {group_size} does not divide K={k}")
    for name, v in (("block_m", block_m), ("groups_per_program", groups_per_program), ("num_warps", num_warps)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1 or v & (v - 1)):
            raise ValueError(f"{name} must be a power of two >= 1, got {v!r}")
    if layout == "packed_ue8m0" and groups_per_program is not None and groups_per_program % 4:
        raise ValueError(f"groups_per_program must be a multiple of 4 for packed_ue8m0, got {groups_per_program}")
    return qdtype, qmax


def _destinations(out: torch.Tensor | None, scales: torch.Tensor | None, m: int, k: int, g: int,
                  qdtype: torch.dtype, unit: str, layout: str, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The codes and scales tensors: the caller's (checked against what this function would allocate) or new."""
    if out is None:
        out = torch.empty((m, k), dtype=qdtype, device=dev)
    _check_out("out", out, (m, k), qdtype, None, dev)
    if out.numel() and out.stride(1) != 1:
        raise ValueError(f"out must have unit stride along K, got strides {tuple(out.stride())}")
    if unit == "group":
        want = scale_storage(m, g, layout, "meta")
        want_shape, want_stride, want_dtype = tuple(want.shape), tuple(want.stride()), want.dtype
    elif unit == "token":
        want_shape, want_stride, want_dtype = (m, 1), None, torch.float32
    else:
        want_shape, want_stride, want_dtype = (1,), None, torch.float32
    if scales is None:
        scales = (scale_storage(m, g, layout, dev) if unit == "group"
                  else torch.empty(want_shape, dtype=torch.float32, device=dev))
    _check_out("scales", scales, want_shape, want_dtype, want_stride, dev)
    return out, scales


def group_quant(
    x: torch.Tensor,
    *,
    dtype: str = "fp8_e4m3fn",
    unit: str = "group",
    group_size: int = 128,
    scale_rule: str = "float",
    layout: str = "row_major",
    eps: float = 1e-10,
    int8_rounding: str = "half_even",
    fast_division: bool = False,
    out: torch.Tensor | None = None,
    scales: torch.Tensor | None = None,
    block_m: int | None = None,
    groups_per_program: int | None = None,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize x [M, K] dynamically; returns (codes [M, K], scales) (module docstring for the conventions).

    dtype: fp8_e4m3fn (codes torch.float8_e4m3fn) or int8. unit: group (group_size contiguous elements along K;
    any group_size in [1, 8192] dividing K), token (one scale per row) or tensor (one scale). scale_rule: float or
    ue8m0. layout: the group scales' layout (token/tensor take row_major only; packed_ue8m0 needs fp8 and ue8m0).
    eps >= 0. int8_rounding: half_even or truncate. fast_division: divide with fp32 `/` (approximate on the GPU,
    within 2 ulp) instead of the correctly rounded tl.div_rn (a variant for the harness's approximate-division
    convention; power-of-two scales are exact either way). out / scales: optional destinations (shape, dtype and
    layout strides as this function would allocate them). block_m, groups_per_program (a power of two, a
    multiple of 4 for packed_ue8m0), num_warps: tiling overrides (powers of two).
    Raises ValueError naming the offending argument.
    """
    qdtype, qmax = _check_args(x, dtype, unit, group_size, scale_rule, layout, eps, int8_rounding, block_m,
                               groups_per_program, num_warps)
    m, k = x.shape
    dev = x.device
    g = k // group_size if unit == "group" else 1
    out, scales = _destinations(out, scales, m, k, g, qdtype, unit, layout, dev)

    mode = _UE8M0 if scale_rule == "ue8m0" else _FLOAT
    common = dict(QMAX=qmax, OUT_INT8=dtype == "int8", INT8_RTE=int8_rounding == "half_even",
                  FAST_DIV=bool(fast_division))
    eps = float(eps)

    if unit == "tensor":
        bm = block_m or 4
        bk = min(triton.next_power_of_2(k), 1024)
        nparts = max(1, triton.cdiv(m, bm))
        parts = torch.empty(nparts, dtype=torch.float32, device=dev)
        _amax_partial_kernel[(nparts,)](x, parts, m, k, x.stride(0), x.stride(1), BLOCK_M=bm, BLOCK_K=bk,
                                        num_warps=num_warps or 4)
        _amax_final_kernel[(1,)](parts, scales, nparts, eps, QMAX=qmax, SCALE_MODE=mode, BLOCK=1024, num_warps=4,
                                 FAST_DIV=bool(fast_division))
        if m:
            _launch_tiles(x, out, scales, scales, eps, min(k, 1024), triton.cdiv(k, min(k, 1024)), 0, 0, _STATIC,
                          False, False, block_m, groups_per_program, num_warps, common)
        return out, scales

    if unit == "token" and triton.next_power_of_2(k) > MAX_TILE:
        if m:
            _wide_row_kernel[(m,)](x, out, scales, eps, m, k, x.stride(0), x.stride(1), out.stride(0),
                                   scales.stride(0), BLOCK_K=4096, SCALE_MODE=mode, num_warps=num_warps or 8,
                                   **common)
        return out, scales

    if m == 0:
        return out, scales
    group = group_size if unit == "group" else k
    stride_sm, stride_sg = (scales.stride(0), scales.stride(1))
    _launch_tiles(x, out, scales, scales, eps, group, g, stride_sm, stride_sg, mode, layout == "packed_ue8m0",
                  True, block_m, groups_per_program, num_warps, common)
    return out, scales


def _launch_tiles(x: torch.Tensor, out: torch.Tensor, s_out: torch.Tensor, s_in: torch.Tensor, eps: float,
                  group: int, g: int, stride_sm: int, stride_sg: int, mode: int, packed: bool, store: bool,
                  block_m: int | None, groups: int | None, num_warps: int | None, common: dict) -> None:
    m, k = x.shape
    gp2 = triton.next_power_of_2(group)
    if groups is None:
        # the most groups per program that divide G (no masked-off lanes: G = 56 at K = 7168 gives 8 groups and
        # 4 rows), unless G has too few factors of two: then a masked tile
        cap = max(1, min(triton.next_power_of_2(g), TILE_ELEMS // gp2))
        groups = 1
        while groups * 2 <= cap and g % (groups * 2) == 0:
            groups *= 2
        if groups < min(cap, 4):
            groups = cap
        if packed:
            groups = max(groups, 4)
    if block_m is None:
        block_m = max(1, min(triton.next_power_of_2(m), TILE_ELEMS // (groups * gp2)))
    if num_warps is None:
        num_warps = 8 if block_m * groups * gp2 >= 4096 else 4
    grid = (triton.cdiv(m, block_m), triton.cdiv(g, groups))
    _tile_quant_kernel[grid](
        x, out, s_out, s_in, eps, m, k, g, group, x.stride(0), x.stride(1), out.stride(0), stride_sm, stride_sg,
        GROUP_P2=gp2, EXACT=group == gp2, BLOCK_M=block_m, GROUPS=groups, SCALE_MODE=mode, PACKED=packed,
        STORE_SCALE=store, num_warps=num_warps, **common)
