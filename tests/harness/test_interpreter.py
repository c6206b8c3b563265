"""harness.engine.interpreter: each interpreter fix checked with a tiny Triton kernel against torch.

On CPU the kernels run in Triton's interpreter (the root conftest sets TRITON_INTERPRET=1); on a GPU the same
kernels are compiled and checked against the same expectations, so the expectations are sm_90 hardware numerics.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from harness.engine.interpreter import FidelityReport, install, unverifiable_features
from tests.harness.fixtures import interp_aliases, interp_libdevice_aliases

REPORT = install()  # before any kernel runs

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.language.extra import libdevice  # noqa: E402  (the portable import; see harness/interpreter.py)
from triton.language.extra.cuda import libdevice as cuda_libdevice  # noqa: E402
from triton.language.extra.libdevice import tanh as bound_tanh  # noqa: E402  (bound by name, as Liger does)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
INTERP = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
TL = {
    torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.int8: tl.int8,
    torch.uint8: tl.uint8, torch.int16: tl.int16, torch.int32: tl.int32, torch.float8_e4m3fn: tl.float8e4nv,
    torch.float8_e5m2: tl.float8e5,
}


@triton.jit
def _cast_kernel(x_ptr, y_ptr, n, DST: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask).to(DST), mask=mask)


def _cast(x: torch.Tensor, dst: torch.dtype) -> torch.Tensor:
    y = torch.empty(x.shape, dtype=dst, device=DEV)
    block = 4096
    _cast_kernel[(triton.cdiv(x.numel(), block),)](x.to(DEV), y, x.numel(), DST=TL[dst], BLOCK=block)
    return y.cpu()


def _fp32_sweep() -> torch.Tensor:
    """Dense fp32 values: a stride through all bit patterns plus the fp8 rounding boundaries."""
    bits = np.arange(0, 2**32, 2**14 + 3, dtype=np.uint64).astype(np.uint32)
    parts = [torch.from_numpy(bits.view(np.float32).copy())]
    for fp8 in FP8_MAX:
        # every fp8 value, the midpoints between neighbours (ties), and one fp32 ulp either side of them
        vals = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fp8).float()
        pos = torch.unique(vals[torch.isfinite(vals) & (vals >= 0)])
        mids = (pos[1:] + pos[:-1]) / 2
        top = pos[-1] + (pos[-1] - pos[-2]) / 2  # halfway above the largest finite value
        for v in (pos, mids, top.reshape(1), pos * 1.5):
            parts += [v, -v, torch.nextafter(v, torch.tensor(np.inf)), torch.nextafter(v, torch.tensor(0.0))]
    parts.append(torch.tensor([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 1e30, -1e30, 2.0**-30]))
    return torch.cat(parts).float()


def _fp8_expected(x: torch.Tensor, fp8: torch.dtype) -> np.ndarray:
    """sm_90 cvt.rn.satfinite: RNE, |x| > max and +-inf -> +-max, NaN -> 0x7F."""
    m = FP8_MAX[fp8]
    codes = x.float().clamp(-m, m).to(fp8).view(torch.uint8).numpy().copy()
    codes[torch.isnan(x).numpy()] = 0x7F
    return codes


# --- the report ---------------------------------------------------------------------------------------------


def test_report_matches_environment() -> None:
    assert install() is REPORT  # idempotent
    names = {i.name for i in REPORT.issues}
    assert {"bf16_arith", "bf16_dot", "fp8_cast", "libdevice", "autotune", "tf32_dot"} <= names
    unver = unverifiable_features(REPORT)
    if not INTERP:
        assert all(i.status == "not-needed" for i in REPORT.issues) and not unver
    elif REPORT.verified and not any("fix disabled" in i.description for i in REPORT.issues):
        assert REPORT.status("bf16_dot") == "fixed" and REPORT.status("fp8_cast") == "fixed"
        assert REPORT.status("fp16_int8_dot") == "not-needed"
        assert unver == {"fp8_dot_fast_accum", "approx_math_bitexact", "inline_asm", "gpu_target"}
    else:
        assert {"bf16_dot", "fp8_cast", "libdevice_erf"} <= unver


@pytest.mark.skipif(not INTERP, reason="gating applies to the interpreter")
def test_unknown_version_patches_nothing_and_reports_unfixed() -> None:
    code = textwrap.dedent(
        """
        import torch, triton, triton.language as tl
        from harness.engine.interpreter import install, unverifiable_features
        rep = install(triton_version="0.0.1")
        assert not rep.verified and all(i.status == "unfixed" for i in rep.issues), rep.as_table()
        assert {"bf16_dot", "fp8_cast", "libdevice_erf", "autotune"} <= unverifiable_features(rep)

        @triton.jit
        def k(x, y):
            o = tl.arange(0, 4)
            tl.store(y + o, tl.load(x + o) + tl.load(x + o))

        x = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.bfloat16)
        y = torch.empty_like(x)
        k[(1,)](x, y)
        assert not torch.equal(y, x + x), "patches were applied on an unverified version"
        """
    )
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def test_report_table_and_unverifiable_from_unfixed() -> None:
    rep = FidelityReport("x", True, False, [i for i in REPORT.issues])
    assert "triton x" in rep.as_table()
    from harness.engine.interpreter import IssueStatus

    issue = IssueStatus("a", "unfixed", "d", frozenset({"f1", "f2"}))
    ok = IssueStatus("b", "fixed", "d", frozenset({"f3"}))
    assert unverifiable_features(FidelityReport("x", True, True, [issue, ok])) == {"f1", "f2"}


# --- fp8 casts ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("src", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
def test_fp8_cast_bitwise(src: torch.dtype, fp8: torch.dtype) -> None:
    x = _fp32_sweep().to(src)
    got = _cast(x, fp8).view(torch.uint8).numpy()
    want = _fp8_expected(x, fp8)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(float(x[i]), hex(got[i]), hex(want[i])) for i in bad[:8]]


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("dst", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
def test_fp8_decode_all_codes(fp8: torch.dtype, dst: torch.dtype) -> None:
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fp8)
    got, want = _cast(codes, dst).float(), codes.float().to(dst).float()
    if fp8 == torch.float8_e5m2 and dst == torch.bfloat16:
        # sm_90 (Triton 3.6) widens e5m2 -> bf16 by bit arithmetic that reads exponent 31 as a normal binade:
        # the Inf/NaN codes come out finite (+-2**16 * (1 + m/4)), observed on an H200.
        m = (torch.arange(256) & 3).float()
        special = (torch.arange(256) & 0x7C) == 0x7C
        sign = torch.where(torch.arange(256) >= 128, -1.0, 1.0)
        want = torch.where(special, sign * 2.0**16 * (1 + m / 4), want)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))


# --- bf16 casts and arithmetic ------------------------------------------------------------------------------


def test_bf16_casts() -> None:
    x = _fp32_sweep()
    x = torch.cat([x, (torch.arange(-300, 300) * 1.00390625).float()])  # exact bf16 halfway points
    got = _cast(x, torch.bfloat16)
    want = x.to(torch.bfloat16)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))
    b = torch.randn(4096).mul(1000).to(torch.bfloat16)
    assert torch.equal(_cast(b, torch.float32), b.float())
    assert torch.equal(_cast(b, torch.int32), b.float().trunc().int())
    assert torch.equal(_cast(b, torch.float16), b.to(torch.float16))
    i = torch.randint(-(2**24), 2**24, (4096,), dtype=torch.int32)
    assert torch.equal(_cast(i, torch.bfloat16).view(torch.int16), i.to(torch.bfloat16).view(torch.int16))


@triton.jit
def _bf16_ops_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    # one op per output so that no fused multiply-add can change the rounding on the GPU
    tl.store(out_ptr + 0 * n + offs, a + b, mask=mask)
    tl.store(out_ptr + 1 * n + offs, a - b, mask=mask)
    tl.store(out_ptr + 2 * n + offs, a * b, mask=mask)
    tl.store(out_ptr + 3 * n + offs, -a, mask=mask)
    tl.store(out_ptr + 4 * n + offs, tl.maximum(a, b), mask=mask)
    tl.store(out_ptr + 5 * n + offs, tl.minimum(a, b), mask=mask)
    tl.store(out_ptr + 6 * n + offs, tl.where(a < b, a, b * 2), mask=mask)
    tl.store(out_ptr + 7 * n + offs, tl.abs(a), mask=mask)


def test_bf16_elementwise_exact() -> None:
    g = torch.Generator().manual_seed(1)
    n = 1024
    a = (torch.randn(n, generator=g) * 3).to(torch.bfloat16)
    b = (torch.randn(n, generator=g) * 3).to(torch.bfloat16)
    b[:8] = a[:8]  # ties for the compare
    out = torch.empty(8 * n, dtype=torch.bfloat16, device=DEV)
    _bf16_ops_kernel[(1,)](a.to(DEV), b.to(DEV), out, n, BLOCK=n)
    got = out.cpu().view(8, n)
    want = [a + b, a - b, a * b, -a, torch.maximum(a, b), torch.minimum(a, b), torch.where(a < b, a, b * 2), a.abs()]
    for k, w in enumerate(want):
        assert torch.equal(got[k].view(torch.int16), w.view(torch.int16)), k


@triton.jit
def _bf16_math_kernel(a_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + offs)
    tl.store(out_ptr + offs, a / 3.0)  # tl.exp & co. reject bf16 on every backend: kernels upcast first
    tl.store(out_ptr + BLOCK + offs, a / (a + 7.0))
    tl.store(out_ptr + 2 * BLOCK + offs, tl.sigmoid(a.to(tl.float32)))


def test_bf16_math_close() -> None:
    a = torch.linspace(-6, 6, 256).to(torch.bfloat16)
    out = torch.empty(3 * 256, dtype=torch.float32, device=DEV)
    _bf16_math_kernel[(1,)](a.to(DEV), out, BLOCK=256)
    got = out.cpu().view(3, 256)
    af = a.float()
    for k, w in enumerate([af / 3.0, af / (a + 7.0).float(), torch.sigmoid(af)]):
        torch.testing.assert_close(got[k], w, rtol=2**-7, atol=1e-6)


# --- reductions ---------------------------------------------------------------------------------------------


@triton.jit
def _reduce_kernel(x_ptr, out_ptr, idx_ptr, R: tl.constexpr, C: tl.constexpr):
    r = tl.arange(0, R)
    c = tl.arange(0, C)
    x = tl.load(x_ptr + r[:, None] * C + c[None, :])
    tl.store(out_ptr + r, tl.max(x, axis=1))
    tl.store(out_ptr + R + r, tl.min(x, axis=1))
    tl.store(out_ptr + 2 * R + r, tl.sum(x, axis=1))
    tl.store(idx_ptr + r, tl.argmax(x, axis=1))
    tl.store(idx_ptr + R + r, tl.argmin(x, axis=1))
    tl.store(out_ptr + 3 * R + r[:, None] * C + c[None, :], tl.cumsum(x, axis=1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_reductions(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(2)
    R, C = 16, 32
    x = torch.randn(R, C, generator=g).to(dtype)
    x[0, 3] = x[0, 20] = x[0].max() + 1  # a tie: the leftmost index wins on both
    out = torch.zeros(3 * R + R * C, dtype=dtype, device=DEV)
    idx = torch.empty(2 * R, dtype=torch.int32, device=DEV)
    _reduce_kernel[(1,)](x.to(DEV), out, idx, R=R, C=C)
    out, idx = out.cpu(), idx.cpu()
    assert torch.equal(out[:R], x.max(1).values) and torch.equal(out[R : 2 * R], x.min(1).values)
    assert torch.equal(idx[:R].long(), x.argmax(1)) and torch.equal(idx[R:].long(), x.argmin(1))
    tol = 2**-7 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out[2 * R : 3 * R].float(), x.float().sum(1), rtol=tol, atol=tol * 8)
    torch.testing.assert_close(out[3 * R :].view(R, C).float(), x.float().cumsum(1), rtol=tol * 2, atol=tol * 16)


# --- tl.dot -------------------------------------------------------------------------------------------------


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, ACC: tl.constexpr):
    m = tl.arange(0, M)
    n = tl.arange(0, N)
    k = tl.arange(0, K)
    a = tl.load(a_ptr + m[:, None] * K + k[None, :])
    b = tl.load(b_ptr + k[:, None] * N + n[None, :])
    tl.store(c_ptr + m[:, None] * N + n[None, :], tl.dot(a, b, out_dtype=ACC) + 1)


def _tf32(x: torch.Tensor) -> torch.Tensor:
    return (x.view(torch.int32) & -8192).view(torch.float32)  # drop the low 13 mantissa bits


@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2, torch.int8, torch.float32],
    ids=["bf16", "f16", "e4m3", "e5m2", "int8", "f32_tf32"],
)
def test_dot(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    M = N = K = 32
    if dtype == torch.int8:
        a, b = (torch.randint(-128, 128, (s, t), generator=g, dtype=torch.int8) for s, t in ((M, K), (K, N)))
    else:
        a, b = (torch.randn(s, t, generator=g).mul(4).to(dtype) for s, t in ((M, K), (K, N)))
    if dtype.itemsize == 1 and dtype.is_floating_point:  # a NaN / Inf operand code must propagate
        a[0, 0] = float("nan") if dtype == torch.float8_e4m3fn else float("inf")
    acc_t = torch.int32 if dtype == torch.int8 else torch.float32
    c = torch.empty(M, N, dtype=acc_t, device=DEV)
    _dot_kernel[(1,)](a.to(DEV), b.to(DEV), c, M=M, N=N, K=K, ACC=TL[acc_t])
    c = c.cpu()
    if dtype == torch.int8:
        assert torch.equal(c, a.int() @ b.int() + 1)
        return
    af, bf = (_tf32(t) if dtype == torch.float32 else t.float() for t in (a, b))
    want = (af.double() @ bf.double() + 1).float()  # exact products; fp32 accumulation differs by ulps only
    torch.testing.assert_close(c, want, rtol=1e-5, atol=1e-3 if dtype.itemsize == 1 else 1e-4, equal_nan=True)


# --- float -> int, libdevice, autotune, atomics -------------------------------------------------------------


@pytest.mark.parametrize("dst", [torch.int8, torch.uint8, torch.int16, torch.int32])
def test_float_to_int_saturates_like_ptx(dst: torch.dtype) -> None:
    x = torch.tensor([1e10, -1e10, np.nan, np.inf, -np.inf, 300.5, -200.7, 127.6, -128.9, 255.9, -0.9, 7e4, 3.99])
    got = _cast(x, dst)
    bits = 16 if dst.itemsize == 1 else dst.itemsize * 8
    lo, hi = (0, 2**bits - 1) if dst == torch.uint8 else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    t = x.double().nan_to_num(0.0, posinf=hi, neginf=lo).trunc().clamp(lo, hi).long()
    want = t.to(torch.int16 if dst.itemsize == 1 else dst)  # 8-bit: keep the low byte of the 16-bit value
    want = (want & 0xFF).to(torch.uint8).view(torch.int8) if dst == torch.int8 else want.to(dst) if dst.itemsize > 1 \
        else (want & 0xFF).to(torch.uint8)
    assert torch.equal(got, want), (got, want)


@triton.jit
def _libdevice_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(out_ptr + 0 * BLOCK + offs, libdevice.erf(x))
    tl.store(out_ptr + 1 * BLOCK + offs, libdevice.tanh(x))
    tl.store(out_ptr + 2 * BLOCK + offs, cuda_libdevice.exp2(x))
    tl.store(out_ptr + 3 * BLOCK + offs, libdevice.rsqrt(tl.abs(x) + 1.0))
    tl.store(out_ptr + 4 * BLOCK + offs, libdevice.round(x))
    tl.store(out_ptr + 5 * BLOCK + offs, libdevice.pow(tl.abs(x), 1.5))
    tl.store(out_ptr + 6 * BLOCK + offs, libdevice.div_rn(x, 3.0))
    tl.store(out_ptr + 7 * BLOCK + offs, tl.erf(x))


def test_libdevice_both_imports() -> None:
    x = torch.cat([torch.linspace(-5, 5, 250), torch.tensor([0.5, -0.5, 1.5, -2.5, 0.0, 2.5])])
    out = torch.empty(8 * 256, device=DEV)
    _libdevice_kernel[(1,)](x.to(DEV), out, BLOCK=256)
    got = out.cpu().view(8, 256)
    round_away = torch.sign(x) * torch.floor(x.abs() + 0.5)
    want = [torch.erf(x), torch.tanh(x), torch.exp2(x), torch.rsqrt(x.abs() + 1), round_away, x.abs() ** 1.5,
            x / 3.0, torch.erf(x)]
    for k, w in enumerate(want):
        torch.testing.assert_close(got[k], w, rtol=4e-7, atol=4e-7, msg=f"output {k}")
    assert torch.equal(got[4], round_away) and torch.equal(got[6], x / 3.0)


@triton.jit
def _scalar_arg_kernel(x_ptr, out_ptr, scale, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(out_ptr + offs, bound_tanh(x) * scale.to(tl.float32))  # a float argument's scalar method


def test_float_argument_and_libdevice_bound_by_name() -> None:
    """Third-party kernels call methods on float arguments (compiled: fp32 scalars) and bind libdevice functions
    by name; both raised in the bare interpreter (disable `float_args` or `libdevice` to watch this fail)."""
    x = torch.linspace(-3, 3, 64)
    out = torch.empty(64, device=DEV)
    _scalar_arg_kernel[(1,)](x.to(DEV), out, 0.5, BLOCK=64)
    torch.testing.assert_close(out.cpu(), torch.tanh(x) * 0.5, rtol=4e-7, atol=4e-7)


# Module-level aliases, as libraries write them: bound at import, before the interpreter patches triton.language.
fast_expf = tl.math.exp
fast_max = tl.maximum
ld_tanhf = cuda_libdevice.tanh


@triton.jit
def _alias_helper(x):
    return fast_max(fast_expf(x), 0.0)  # an alias inside a device function


@triton.jit
def _alias_kernel(x_ptr, e_ptr, h_ptr, t_ptr, f_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(e_ptr + offs, fast_expf(x))
    tl.store(h_ptr + offs, _alias_helper(x))
    tl.store(t_ptr + offs, ld_tanhf(x))
    # helpers of other modules, with aliases of their own
    tl.store(f_ptr + offs, interp_aliases.exp_of(x) * interp_libdevice_aliases.tanh_of(x))


def test_module_level_aliases_of_builtins_and_libdevice() -> None:
    """`fast_expf = tl.math.exp` at module level kept the unpatched builtin, which raised in the interpreter ('Did
    you forget to add @triton.jit'); disable `builtin_aliases` to watch this fail."""
    x = torch.linspace(-4, 4, 64)
    e, h, t, f = (torch.empty(64, device=DEV) for _ in range(4))
    _alias_kernel[(1,)](x.to(DEV), e, h, t, f, BLOCK=64)
    torch.testing.assert_close(e.cpu(), torch.exp(x), rtol=1e-6, atol=0)
    torch.testing.assert_close(h.cpu(), torch.exp(x), rtol=1e-6, atol=0)
    torch.testing.assert_close(t.cpu(), torch.tanh(x), rtol=4e-7, atol=4e-7)
    torch.testing.assert_close(f.cpu(), torch.exp(x) * torch.tanh(x), rtol=2e-6, atol=1e-7)
    # the patches end with the launch, the helpers' modules' included
    assert fast_expf is tl.math.exp and interp_aliases.fast_expf is tl.math.exp and tl.core.is_builtin(tl.math.exp)
    assert interp_libdevice_aliases.tanhf is libdevice.tanh


_AUTOTUNE_RUNS: list[int] = []


@triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})], key=["n"])
@triton.jit
def _autotuned_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2 + 1, mask=mask)


def test_autotune_several_configs() -> None:
    x = torch.randn(1000, device=DEV)
    y = torch.empty_like(x)
    _autotuned_kernel[lambda meta: (triton.cdiv(1000, meta["BLOCK"]),)](x, y, 1000)
    assert torch.equal(y, x * 2 + 1)
    assert _autotuned_kernel.best_config.kwargs["BLOCK"] in (64, 128)


@triton.jit
def _atomic_kernel(x_ptr, acc_ptr, BLOCK: tl.constexpr, BINS: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.atomic_add(acc_ptr + offs % BINS, tl.load(x_ptr + offs), mask=offs < BLOCK - 3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "f16", "f32"])
def test_atomic_add_duplicates(dtype: torch.dtype) -> None:
    x = torch.arange(64).remainder(5).to(dtype) * 0.25  # exact sums in every dtype
    acc = torch.zeros(4, dtype=dtype, device=DEV)
    _atomic_kernel[(1,)](x.to(DEV), acc, BLOCK=64, BINS=4)
    want = torch.zeros(4, dtype=torch.float64).index_add_(0, torch.arange(61) % 4, x[:61].double())
    assert torch.equal(acc.cpu().double(), want)


# --- what MoE kernels use, checked correct without a fix ----------------------------------------------------


@triton.jit
def _moe_ops_kernel(x_ptr, idx_ptr, out_ptr, sorted_ptr, n, stride, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    rows = tl.load(idx_ptr + offs, mask=mask, other=0).to(tl.int64)  # int64 row offsets
    x = tl.load(x_ptr + rows * stride + 1, mask=mask, other=-float("inf"))
    w = tl.sigmoid(x)
    tl.store(out_ptr + offs, tl.where(mask, w, -1.0), mask=offs < BLOCK)
    tl.store(out_ptr + BLOCK + offs, tl.cumsum(mask.to(tl.int32), 0).to(tl.float32))
    tl.store(out_ptr + 2 * BLOCK, tl.max(x, 0))
    tl.store(out_ptr + 2 * BLOCK + 1, tl.argmax(x, 0).to(tl.float32))
    ints = (tl.load(idx_ptr + offs, mask=mask, other=0) << 3) >> 1
    tl.store(out_ptr + 2 * BLOCK + 2, tl.sum(ints, 0).to(tl.float32))
    tl.store(sorted_ptr + offs, tl.sort(x, descending=True))


def test_moe_style_ops() -> None:
    g = torch.Generator().manual_seed(5)
    n, B = 50, 64
    table = torch.randn(100, 3, generator=g)
    idx = torch.randperm(100, generator=g)[:n].int()
    out = torch.empty(2 * B + 3, device=DEV)
    top = torch.empty(B, device=DEV)
    _moe_ops_kernel[(1,)](table.to(DEV), idx.to(DEV), out, top, n, 3, BLOCK=B)
    out, top = out.cpu(), top.cpu()
    x = table[idx.long(), 1]
    torch.testing.assert_close(out[:n], torch.sigmoid(x), rtol=1e-6, atol=1e-7)
    assert torch.equal(out[n:B], torch.full((B - n,), -1.0))
    assert torch.equal(out[B : 2 * B], torch.arange(1, B + 1).clamp(max=n).float())
    assert out[2 * B] == x.max() and out[2 * B + 1] == x.argmax()
    assert out[2 * B + 2] == ((idx.long() << 3) >> 1).sum()
    assert torch.equal(top[:n], torch.sort(x, descending=True).values) and bool((top[n:] == -np.inf).all())


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, shift, MASKED: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    if MASKED:
        v = tl.load(x_ptr + offs + shift, mask=offs + shift < n, other=0.0)
    else:
        v = tl.load(x_ptr + offs + shift)
    tl.store(y_ptr + offs, v, mask=offs < n)


@pytest.mark.skipif(not INTERP or REPORT.status("bounds_check") != "fixed", reason="the interpreter's sanitizer")
def test_bounds_check_names_the_argument_and_lets_masked_lanes_pass() -> None:
    """An unmasked lane past a tensor argument raises, naming the kernel, the argument and the element offset; the
    same access with the lanes masked off (or a view's neighbouring storage untouched) runs."""
    from harness.engine.interpreter import OutOfBoundsAccess

    big = torch.arange(64, dtype=torch.float32)
    x, y = big[8:24], torch.zeros(16)  # x: a view; elements 24.. of its storage belong to no argument
    _copy_kernel[(1,)](x, y, 16, 0, MASKED=False, BLOCK=16)
    assert torch.equal(y, x)
    _copy_kernel[(1,)](x, y, 16, 4, MASKED=True, BLOCK=16)
    assert torch.equal(y[:12], x[4:]) and not y[12:].any()
    with pytest.raises(Exception) as err:
        _copy_kernel[(1,)](x, y, 16, 4, MASKED=False, BLOCK=16)
    chain = [err.value, *(e for e in (err.value.__cause__, getattr(err.value.__cause__, "__cause__", None)) if e)]
    assert any(isinstance(e, OutOfBoundsAccess) for e in chain), chain
    assert "_copy_kernel: load of 4 unmasked lane(s)" in str(err.value) and "x_ptr" in str(err.value)


def test_bounds_check_lets_a_kernel_fill_its_allocation_padding() -> None:
    """A view that starts its storage owns the storage's tail (an aligned allocation sliced to its shape, as OpenAI
    triton_kernels' empty_aligned makes and its kernels memset); past the storage it is still out of bounds."""
    padded = torch.arange(32, dtype=torch.float32, device=DEV)
    x, y = padded[:16], torch.zeros(32, device=DEV)
    _copy_kernel[(1,)](x, y, 32, 16, MASKED=False, BLOCK=16)  # reads elements 16..31 of x's storage
    assert torch.equal(y[:16].cpu(), torch.arange(16, 32, dtype=torch.float32))
    if INTERP:
        with pytest.raises(Exception, match="unmasked lane"):
            _copy_kernel[(1,)](x, y, 32, 20, MASKED=False, BLOCK=16)


class _Wrapped:
    """A tensor-like wrapper as OpenAI triton_kernels passes its Tensor: data_ptr(), dtype and the tensor in `.data`."""

    def __init__(self, data: torch.Tensor) -> None:
        self.data, self.dtype = data, data.dtype

    def data_ptr(self) -> int:
        return self.data.data_ptr()


def test_tensor_wrapper_arguments() -> None:
    """A wrapper argument is launched as the tensor it holds (read and written through)."""
    x, y = torch.arange(16, dtype=torch.float32, device=DEV), torch.zeros(16, device=DEV)
    _copy_kernel[(1,)](_Wrapped(x), _Wrapped(y), 16, 0, MASKED=True, BLOCK=16)
    assert torch.equal(y, x)


def _nested_kernels() -> triton.JITFunction:
    @triton.jit
    def twice(v):
        return v * 2

    @triton.jit
    def outer(x_ptr, y_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, twice(tl.load(x_ptr + offs)))

    return outer


def test_nested_kernel_calls_its_enclosing_scope() -> None:
    """A kernel defined in a function calls a kernel of the enclosing scope (vLLM's triton_kernels routing patch)."""
    x, y = torch.arange(16, dtype=torch.float32, device=DEV), torch.zeros(16, device=DEV)
    _nested_kernels()[(1,)](x, y, BLOCK=16)
    assert torch.equal(y, 2 * x)
