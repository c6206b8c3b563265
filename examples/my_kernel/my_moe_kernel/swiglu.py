"""A row-streaming Triton SiLU-and-mul: `out[t, :] = silu(x[t, :N]) * x[t, N:]` for `x [T, 2N]`.

Written the way a kernel author outside this project might: one program per token row, a loop over the row in
fixed-width chunks, silu through exp2, strides passed explicitly, the output allocated unless given. It knows
nothing about moe-harness; `my_moe_kernel.harness_adapter` is the only file that does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# a constexpr: a Triton kernel on the GPU may read no other global (the interpreter does not check this)
_LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _silu_mul_rows(x_ptr, out_ptr, n_cols, stride_x, stride_out, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    out_row = out_ptr + row * stride_out
    for start in range(0, n_cols, CHUNK):
        cols = start + tl.arange(0, CHUNK)
        keep = cols < n_cols
        gate = tl.load(x_row + cols, mask=keep, other=0.0).to(tl.float32)
        up = tl.load(x_row + n_cols + cols, mask=keep, other=0.0).to(tl.float32)
        act = gate / (1.0 + tl.exp2(-gate * _LOG2E))
        tl.store(out_row + cols, (act * up).to(out_ptr.dtype.element_ty), mask=keep)


def silu_mul(x: torch.Tensor, out: torch.Tensor | None = None, chunk: int = 64) -> torch.Tensor:
    """SiLU(gate) * up with the gate in the first half of the last dim; fp32 math, one rounding at the store."""
    if x.dim() != 2 or x.shape[1] % 2:
        raise ValueError(f"silu_mul: x must be [T, 2N], got {list(x.shape)}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"silu_mul: dtype {x.dtype} is not supported (supported: {SUPPORTED_DTYPES})")
    t, n = x.shape[0], x.shape[1] // 2
    if out is None:
        out = torch.empty((t, n), dtype=x.dtype, device=x.device)
    if tuple(out.shape) != (t, n) or out.dtype != x.dtype:
        raise ValueError(f"silu_mul: out must be {[t, n]} of {x.dtype}, got {list(out.shape)} of {out.dtype}")
    if x.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError("silu_mul: the last dim of x and out must be contiguous")
    if t and n:
        _silu_mul_rows[(t,)](x, out, n, x.stride(0), out.stride(0), CHUNK=chunk)
    return out
