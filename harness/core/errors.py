"""The error model (docs/SEMANTICS.md §7): per-element bounds derived from formats and magnitudes.

A fixed atol/rtol lets a kernel that writes zeros pass when outputs are small and fails correct kernels at large K.
Instead each element gets a bound built from the unit roundoff of the formats involved, the reduction length, and
the magnitudes the oracle computes (the dot product of absolute values):

    |actual - expected| <= C_DOT * u_acc * sqrt(K) * (|a| . |b|)  +  u_out * |expected|

`sqrt(K)` rather than `K`: rounding errors of a long accumulation behave like a random walk; the constant C_DOT
absorbs the tail (a correct kernel sits well below margin 1, a wrong one far above). The margin reported with a
verdict is max(|err| / bound).
"""

from __future__ import annotations

import math

import torch

#: Unit roundoff (half an ulp at 1.0) per storage/arithmetic format.
UNIT_ROUNDOFF: dict[str, float] = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "tf32": 2.0**-11,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
    "float8_e4m3fn": 2.0**-4,
    "float8_e5m2": 2.0**-3,
}

#: Relative accumulation error of Hopper fp8 tensor-core MMAs whose partial sums are promoted to fp32 only every
#: few instructions (CUTLASS's default, torch._scaled_grouped_mm with use_fast_accum=False): between promotions
#: the tensor core keeps about 14 bits (DeepSeek-V3 report), so up to 4 adds at 2**-13 of the partial magnitude.
#: A kernel declares it with conventions["matmul_precision"] = "fp8_mma_promoted"; the term is this times the
#: sum of |products|, on top of the fp32 term. It stays a worst case (about 100% of |expected| for bf16 at K = 1024,
#: docs/BOUNDS.md): how the tensor core aligns and truncates its partial sums between promotions is not documented,
#: so neither a bracket (no rounding rule to bracket) nor a random-walk sqrt(K) (no evidence the truncations are
#: unbiased) can be justified; it only applies to kernels that declare the convention.
FP8_MMA_REL = 2.0**-11

#: Safety factor on the accumulation term. Random-walk growth is ~1 sigma at sqrt(K); 8 leaves room for the tail
#: and for different summation orders (split-K, tiles) while staying far below the error of a real bug.
C_DOT = 8.0
#: Safety factor on output rounding: a correctly rounded result is within 1 u; 2 allows double rounding
#: (fp32 accumulator -> output dtype after an epilogue op).
C_OUT = 2.0


def unit_roundoff(dtype: torch.dtype | str) -> float:
    name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    if name in ("int8", "int32", "int64", "uint8"):
        return 0.0
    try:
        return UNIT_ROUNDOFF[name]
    except KeyError:
        raise ValueError(f"no unit roundoff known for dtype {name!r}") from None


def dot_bound(abs_dot: torch.Tensor, k: int, u_acc: float, *, c: float = C_DOT) -> torch.Tensor:
    """Bound on the accumulation error of dot products of length `k` with |a|.|b| = `abs_dot`."""
    return c * u_acc * math.sqrt(max(k, 1)) * abs_dot.abs()


def rounding_bound(expected: torch.Tensor, u_out: float, *, c: float = C_OUT) -> torch.Tensor:
    """Bound on rounding the exact result to a format with unit roundoff `u_out`."""
    return c * u_out * expected.abs()


def elementwise_bound(expected: torch.Tensor, out_dtype: torch.dtype, *, ulps_fp32: float = 64.0,
                      magnitude: torch.Tensor | None = None) -> torch.Tensor:
    """Bound for an elementwise op computed in fp32 and rounded to `out_dtype` (transcendentals: a few fp32 ulps;
    the hardware's fast exp/erf approximations: a few dozen).

    `magnitude`: the size of the operands the fp32 evaluation works with, when it exceeds the result's (gelu's
    0.5 * x * (1 + erf(x / sqrt 2)) cancels in the negative tail: its fp32 error is relative to |x|, not to the
    tiny result)."""
    # c = 1: one correct rounding is within u * |value|; a kernel that truncates or rounds twice is not.
    u_out = unit_roundoff(out_dtype)
    scale = expected.abs() if magnitude is None else torch.maximum(expected.abs(), magnitude.abs())
    slack = ulps_fp32 * UNIT_ROUNDOFF["float32"] * scale
    return rounding_bound(expected, u_out, c=1.0) + slack + _tiny(out_dtype)


def _tiny(dtype: torch.dtype) -> float:
    """Absolute floor: the smallest subnormal step of the output format (results near zero round absolutely)."""
    if dtype.is_floating_point:
        return float(torch.finfo(dtype).smallest_normal) * unit_roundoff(dtype) * 2
    return 0.0


def rounding_bracket(v: torch.Tensor, e: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bound on |round(v') - round(v)| over every v' with |v' - v| <= e, rounding to `dtype` (float64 result).

    Rounding is monotone, so round(v') lies between round(v - e) and round(v + e): an element far from a rounding
    boundary of `dtype` contributes nothing, one near a boundary at most one ulp. Much tighter than u * |v| when
    the kernel and the oracle agree before rounding to within a small e (they then round to the same value).
    """
    v, e = v.double(), e.double()
    r = v.to(dtype).double()
    lo, hi = (v - e).to(dtype).double(), (v + e).to(dtype).double()
    return torch.maximum((lo - r).abs(), (hi - r).abs())
