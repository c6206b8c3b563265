"""Fidelity layer for Triton's CPU interpreter (``TRITON_INTERPRET=1``).

CI runs the Triton kernels in Triton's interpreter, which emulates the language with numpy. Several of its
semantics differ from what the same kernel computes on an sm_90 GPU. ``install()`` patches the interpreter at
runtime so that the differences the MoE kernels are exposed to match sm_90 numerics, and returns a
``FidelityReport`` saying, issue by issue, what was fixed, what did not need a fix and what is still unfixed.
``unverifiable_features(report)`` names the kernel features that the harness must report as *not verifiable on
interp* rather than as passing; an exception the interpreter raises itself is told from the kernel's by
``harness.engine.interpreter_faults``.

Every fix is gated on the Triton versions it was verified for (``VERIFIED_VERSIONS``): on any other version
nothing is patched and every issue is reported ``unfixed``. When kernels are compiled (no ``TRITON_INTERPRET``),
nothing is patched and every issue is ``not-needed``.

Importing libdevice in kernels: use ``from triton.language.extra import libdevice`` (module import, then
``libdevice.tanh(x)``). Compiled, Triton >= 3.0 resolves that generic module to the backend's libdevice (CUDA or
HIP); in the interpreter the fix below routes it (and ``triton.language.extra.cuda.libdevice``) to numpy. Single
functions bound by name in a kernel's module (``from ...libdevice import tanh``, as third-party kernels do), and names
bound to triton.language builtins (``fast_expf = tl.math.exp``), are rebound for each launch too, in the module of
the kernel and of each helper it calls.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from harness.engine import interpreter_speed

Status = Literal["fixed", "not-needed", "unfixed"]

#: the feature every Triton kernel depends on in the interpreter: unverifiable when the Triton release is not verified
TRITON_VERSION = "triton_version"

# Triton versions whose interpreter was read and probed (the interpreter, kernel and planted-bug tests pass under
# each); the fixes are only applied to these. They are the Triton releases that torch 2.11 to 2.15 pin.
VERIFIED_VERSIONS: frozenset[str] = frozenset({"3.6.0", "3.7.0", "3.7.1", "3.8.0", "3.9.0"})
#: the same, as the requirement pip understands (pyproject.toml declares it; a test keeps the two equal)
SUPPORTED_SPEC = "triton>=3.6,<3.10"
_VERIFIED = f"verified: {', '.join(sorted(VERIFIED_VERSIONS))}"

#: the module whose numpy arithmetic runs a kernel in Triton's interpreter: its RuntimeWarnings (overflow in exp or a
#: cast, an all-NaN reduction) are what a GPU computes silently on large or non-finite inputs, which cases draw on
#: purpose; shown, they only interleave with pytest's progress
INTERPRETER_MODULE = r"triton\.runtime\.interpreter$"
#: the same filter in pytest's `filterwarnings` form
QUIET_NUMERICS = f"ignore::RuntimeWarning:{INTERPRETER_MODULE}"


def quiet_numerics() -> None:
    """Hide the interpreter's own numerical RuntimeWarnings in this process; every other warning still shows."""
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=INTERPRETER_MODULE)


@dataclass(frozen=True)
class IssueStatus:
    """One known interpreter-vs-sm_90 difference and what this layer did about it."""

    name: str
    status: Status
    description: str
    features: frozenset[str]
    exact: bool = True  # when fixed: bit-exact against sm_90 (False: agrees to a few ulp / in a different order)


@dataclass
class FidelityReport:
    """What ``install()`` found and did, for one process."""

    triton_version: str
    interpreting: bool
    verified: bool
    issues: list[IssueStatus] = field(default_factory=list)

    def status(self, name: str) -> Status:
        for issue in self.issues:
            if issue.name == name:
                return issue.status
        raise KeyError(name)

    def as_table(self) -> str:
        rows = [f"triton {self.triton_version}, interpreting={self.interpreting}, verified={self.verified}"]
        rows += [f"  {i.name:<24} {i.status:<10} {i.description}" for i in self.issues]
        return "\n".join(rows)


@dataclass(frozen=True)
class _Issue:
    name: str
    description: str
    features: frozenset[str]
    fixable: bool = True  # False: a known gap this layer cannot close (stays unfixed on every version)
    exact: bool = True
    present: bool = True  # False: checked and found correct in the verified versions (not-needed there)
    only_in: frozenset[str] | None = None  # the verified versions that have the defect (None: all of them)


# libdevice symbols (without the ``__nv_`` prefix and the fp32 ``f`` suffix) emulated in float64 numpy.
_LIBDEVICE: dict[str, Callable[..., np.ndarray]] = {}


def _vec(fn: Callable[[float], float]) -> Callable[[np.ndarray], np.ndarray]:
    return np.vectorize(fn, otypes=[np.float64])


def _erfinv(y: float) -> float:
    # Newton on erf; libdevice's erfinv is accurate to a few ulp, this converges to the float64 root.
    if math.isnan(y) or abs(y) > 1:
        return math.nan
    if abs(y) == 1:
        return math.copysign(math.inf, y)
    x = 0.0
    for _ in range(100):
        step = (math.erf(x) - y) / (2 / math.sqrt(math.pi) * math.exp(-x * x))
        x -= step
        if abs(step) <= 1e-17 * max(1.0, abs(x)):
            break
    return x


_LIBDEVICE.update(
    {
        "tanh": np.tanh, "erf": _vec(math.erf), "erfc": _vec(math.erfc), "erfinv": _vec(_erfinv),
        "exp": np.exp, "exp2": np.exp2, "exp10": lambda x: np.power(10.0, x), "expm1": np.expm1,
        "fast_exp": np.exp, "log": np.log, "log2": np.log2, "log10": np.log10, "log1p": np.log1p,
        "fast_log": np.log, "fast_log2": np.log2, "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x),
        "cbrt": np.cbrt, "sin": np.sin, "cos": np.cos, "tan": np.tan, "sinh": np.sinh, "cosh": np.cosh,
        "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "atan2": np.arctan2, "pow": np.power,
        "fast_pow": np.power, "fabs": np.abs, "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc,
        "rint": np.rint, "nearbyint": np.rint, "round": lambda x: np.trunc(x + np.copysign(0.5, x) * (x != 0)),
        "fmax": np.fmax, "fmin": np.fmin, "fmod": np.fmod, "copysign": np.copysign, "hypot": np.hypot,
        "fma": lambda a, b, c: a * b + c, "fdiv_rn": np.divide, "div_rn": np.divide, "fast_fdivide": np.divide,
        "saturate": lambda x: np.clip(np.nan_to_num(x, nan=0.0), 0.0, 1.0), "normcdf": _vec(
            lambda v: 0.5 * math.erfc(-v / math.sqrt(2))),
        "isnan": lambda x: np.isnan(x).astype(np.int32), "isinf": lambda x: np.isinf(x).astype(np.int32),
        "signbit": lambda x: np.signbit(x).astype(np.int32), "finite": lambda x: np.isfinite(x).astype(np.int32),
    }
)
# ``round`` above: half away from zero, like CUDA roundf (np.round is half-to-even).


def _fixable_issues() -> list[_Issue]:
    f = frozenset
    return [
        _Issue("bf16_arith", "bf16 elementwise ops (+ - * / neg, min/max, compares, fma, clamp, exp/erf/...) "
               "ran on the raw uint16 bit patterns; now computed in fp32 and rounded to bf16 (RNE) per op",
               f({"bf16_arith"})),
        _Issue("bf16_cast", "casts to bf16 truncated (fp32/fp64) or reinterpreted (ints) and bf16->int read bit "
               "patterns; now RNE from the exact source value, bf16->int via fp32", f({"bf16_cast"})),
        _Issue("bf16_dot", "tl.dot on bf16 multiplied the uint16 bit patterns; now exact products, fp32 "
               "accumulation (summation order differs from the tensor cores)", f({"bf16_dot"}), exact=False),
        _Issue("bf16_reduce", "tl.sum/max/min/argmax/cumsum on bf16 reduced the bit patterns; now decoded: "
               "max/min/argmax exact, sum/cumsum accumulate in fp32 and round once (GPU rounds per step)",
               f({"bf16_reduce"}), exact=False),
        _Issue("fp8_cast", "casts to fp8e4nv/fp8e5 rounded half-up on the mantissa only (lost the carry), "
               "mishandled subnormals and did not saturate; fp8->wider misread NaN/Inf codes; now RNE with "
               "satfinite (+-448 / +-57344, NaN stays NaN), decoding by value", f({"fp8_cast"})),
        _Issue("fp8_dot_operands", "tl.dot on fp8 operands decoded them with the buggy converter; now exact "
               "decode, exact products, fp32 accumulation", f({"fp8_dot"}), exact=False),
        _Issue("tf32_dot", "tl.dot on fp32 operands with the default input_precision='tf32' multiplied full fp32 "
               "values; sm_90 truncates the operands to tf32: now emulated (fp32 accumulation)",
               f({"tf32_dot"}), exact=False),
        _Issue("fp_to_int", "float->int casts out of range / NaN were undefined numpy casts; now PTX cvt.rzi "
               "semantics: saturate (8-bit: saturate to 16 bits, keep the low byte), NaN -> 0",
               f({"fp_to_int_overflow"})),
        _Issue("bf16_atomic", "tl.atomic_add / atomic_xchg on bf16 raised 'Unsupported data type'; now applied "
               "element by element in order, each add rounded to bf16", f({"bf16_atomic"}), exact=False),
        _Issue("libdevice", "triton.language.extra(.cuda).libdevice raised (extern_elementwise unsupported, "
               "module not patched); now the common fp32/fp64 functions are emulated in float64 and rounded "
               "(libdevice differs by up to its documented ulp bounds)",
               f({f"libdevice_{n}" for n in _LIBDEVICE}), exact=False),
        _Issue("bf16_constant", "a Python scalar meeting a bf16 tensor (x * 2, tl.where(m, x, 0.5)) raised: the "
               "builder had no get_bf16; now rounded to fp32, then to bf16 (RNE), as later Triton releases do",
               f({"bf16_arith"}), only_in=f({"3.6.0", "3.7.0", "3.7.1", "3.8.0"})),
        _Issue("scalar_index", "a one-element tensor used as a Python int (range(0, n) with a loaded n) raised "
               "under numpy >= 2.4 (int() of a 1-d array); now its single element is read", f({"load_store"}),
               only_in=f({"3.6.0"})),
        _Issue("autotune", "@triton.autotune with several configs raised (benchmarking needs a GPU driver); "
               "now no benchmark runs and the first pruned config is used", f({"autotune"})),
        _Issue("float_args", "float kernel arguments stayed Python floats, so scalar methods a compiled kernel "
               "has (x.to(tl.float32), x.dtype) raised; now fp32 scalars, as compiled Triton passes them",
               f({"float_args"})),
        _Issue("bounds_check", "unmasked load/store/atomic lanes outside every tensor argument of the launch read "
               "or wrote arbitrary host memory (garbage, or a crash of the process); now each such access raises "
               "OutOfBoundsAccess naming the kernel, the nearest argument and the element offset (a sanitizer: "
               "the GPU does not check either)", f({"bounds_check"})),
        _Issue("tensor_wrappers", "a kernel argument that wraps a torch tensor without being one (an object with "
               "data_ptr() and a tensor `.data`, such as OpenAI triton_kernels' Tensor, which compiled Triton takes by "
               "its data_ptr and dtype) raised AttributeError (untyped_storage); now its tensor is copied to the host "
               "and back like a tensor argument", f({"tensor_wrappers"})),
        _Issue("closures", "a @triton.jit function defined inside another function, calling names of the enclosing "
               "scope (vLLM's routing patch for triton_kernels), raised NameError: the interpreter re-executes its "
               "source with the module's globals only; now the enclosing scope's values are added to them",
               f({"closures"})),
        _Issue("builtin_aliases", "a module-level alias of a triton.language builtin (fast_expf = tl.math.exp) raised "
               "'Did you forget to add @triton.jit': the interpreter patches the builtins on triton.language's modules "
               "for each launch, and the alias kept the unpatched one; now the names of the kernel's (and each "
               "helper's) module bound to builtins are patched for the launch too", f({"builtin_aliases"})),
        _Issue("fp16_int8_dot", "tl.dot on fp16 (fp32 acc) and int8 (int32 acc) operands: checked, correct",
               f({"fp16_dot", "int8_dot"}), present=False),
        _Issue("load_store_reduce", "masked tl.load with other, int64 offsets, fp32 sum/max/argmax (leftmost "
               "tie), tl.where, cumsum, fp32 atomic_add, tl.sort/topk, tl.erf/exp/sigmoid on fp32: checked, "
               "correct to the ulp (exp/sigmoid differ by GPU approx ulps)", f({"load_store", "reduce_fp32"}),
               present=False),
        _Issue("triton_version", "this Triton release's interpreter was read and probed by moe-harness (on any other "
               "release every fix is left out and its Triton kernels are not verifiable)", f({TRITON_VERSION}),
               present=False),
        # Known gaps that no runtime patch can close: the interpreter is *more* precise than sm_90 here.
        _Issue("fp8_dot_fast_accum", "sm_90 accumulates fp8 wgmma in reduced precision "
               "(max_num_imprecise_acc=2**30 by default); the interpreter accumulates in fp32",
               f({"fp8_dot_fast_accum"}), fixable=False),
        _Issue("inline_asm", "tl.inline_asm_elementwise runs PTX, which the interpreter cannot execute (it "
               "raises)", f({"inline_asm"}), fixable=False),
        _Issue("gpu_target", "kernels whose launch code asks the GPU what it is (triton.runtime.driver.active's "
               "target, torch.cuda device properties: OpenAI triton_kernels' matmul_ogs picks its tiles and weight "
               "layouts so) cannot launch: the interpreter has no GPU driver", f({"gpu_target"}), fixable=False),
        _Issue("approx_math_bitexact", "on GPU tl.exp/exp2/log/sigmoid, fp32 '/' and fused mul+add use "
               "approximate PTX / FMA contraction; interp results agree to a few ulp, never bitwise",
               f({"approx_math_bitexact"}), fixable=False),
    ]


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_STATE: dict[str, Any] = {}


def install(triton_version: str | None = None) -> FidelityReport:
    """Apply the interpreter fixes (once per process) and report what is fixed.

    ``triton_version`` overrides the detected version (for tests of the gating); the first call decides what is
    patched, later calls return the same report.
    """
    if "report" in _STATE:
        return _STATE["report"]
    import triton

    version = triton_version if triton_version is not None else triton.__version__
    interpreting = _interpreting()
    verified = version in VERIFIED_VERSIONS
    issues: list[IssueStatus] = []
    # HARNESS_INTERP_DISABLE=name,name leaves those fixes out (to watch their tests fail, or to rule one out).
    disabled = frozenset(n.strip() for n in os.environ.get("HARNESS_INTERP_DISABLE", "").split(",") if n.strip())
    if interpreting and verified:
        _apply_patches(disabled, version)
    for issue in _fixable_issues():
        description = issue.description
        if not interpreting:
            status: Status = "not-needed"
        elif not verified or not issue.fixable:
            status = "unfixed"
        elif issue.name in disabled:
            status, description = "unfixed", description + " [fix disabled by HARNESS_INTERP_DISABLE]"
        else:
            present = issue.present and (issue.only_in is None or version in issue.only_in)
            status = "fixed" if present else "not-needed"
        issues.append(IssueStatus(issue.name, status, description, issue.features, issue.exact))
    report = FidelityReport(version, interpreting, verified, issues)
    _STATE["report"] = report
    return report


def triton_gemm_features(dtype: str | None) -> set[str]:
    """The interpreter fixes a Triton GEMM kernel with `dtype` operands relies on: loads/stores, the checked fp32
    reductions, and the dot and narrowing casts of bf16 / the fp16 dot (an adapter adds what else it uses)."""
    need = {"load_store", "reduce_fp32"}
    if dtype == "bfloat16":
        need |= {"bf16_dot", "bf16_cast"}
    elif dtype == "float16":
        need.add("fp16_dot")
    return need


def unverifiable_features(report: FidelityReport) -> set[str]:
    """Feature names a kernel may depend on that this interpreter cannot verify (report as not verifiable)."""
    out: set[str] = set()
    for issue in report.issues:
        if issue.status == "unfixed":
            out |= set(issue.features)
    return out


def version_notice(report: FidelityReport | None = None) -> str | None:
    """One line for the start of a run when the interpreter in use is a Triton release this layer does not know:
    what is installed, what is supported, and the command that fixes it (None when there is nothing to say)."""
    if report is None:
        if not _interpreting():
            return None
        report = install()
    if not report.interpreting or report.verified:
        return None
    return (f"moe-harness: Triton {report.triton_version}'s interpreter is not verified ({_VERIFIED}), so Triton "
            f"kernels are recorded not-verifiable on the CPU; fix: pip install '{SUPPORTED_SPEC}' (or a torch that "
            "pins one of them)")


def unverified_reason() -> str:
    """The not-verifiable reason of a Triton kernel's case under an unverified interpreter release."""
    report = _STATE.get("report")
    version = report.triton_version if report else "?"
    return (f"Triton {version}'s interpreter is not verified by moe-harness ({_VERIFIED}; "
            f"pip install '{SUPPORTED_SPEC}')")


def unverifiable_here() -> set[str]:
    """What this process cannot verify: empty unless the Triton interpreter is in use (then the fixes are
    installed first). The one entry point for the CLI and the test session."""
    if not _interpreting():
        return set()
    return unverifiable_features(install())


# ---------------------------------------------------------------------------------------------------------------
# Exact float codecs (numpy has no bf16/fp8). Values travel as float64, which holds every bf16/fp16/fp8/fp32
# value exactly, so a cast is a single rounding from the exact source value.


@dataclass(frozen=True)
class _Fmt:
    mbits: int
    ebits: int
    saturate: bool  # GPU casts to fp8 use cvt.rn.satfinite: overflow and +-inf give +-max finite
    has_inf: bool
    nan_bits: int  # canonical positive NaN code

    @property
    def bias(self) -> int:
        return (1 << (self.ebits - 1)) - 1

    @property
    def max_bits(self) -> int:  # largest finite magnitude code
        top = (1 << (self.ebits + self.mbits)) - 1
        return top - (1 << self.mbits) if self.has_inf else top - 1


_BF16 = _Fmt(7, 8, False, True, 0x7FC0)
_FP16 = _Fmt(10, 5, False, True, 0x7E00)
_E4M3 = _Fmt(3, 4, True, False, 0x7F)
_E5M2 = _Fmt(2, 5, True, True, 0x7F)


def _decode(bits: np.ndarray, fmt: _Fmt, specials: bool = True) -> np.ndarray:
    """Bit patterns (unsigned ints) -> exact float64 values (specials=False: no Inf/NaN codes)."""
    b = bits.astype(np.int64)
    sign = np.where((b >> (fmt.mbits + fmt.ebits)) & 1, -1.0, 1.0)
    exp = (b >> fmt.mbits) & ((1 << fmt.ebits) - 1)
    mant = (b & ((1 << fmt.mbits) - 1)).astype(np.float64)
    normal = np.ldexp(1.0 + mant / (1 << fmt.mbits), (exp - fmt.bias).astype(np.int32))
    sub = np.ldexp(mant, 1 - fmt.bias - fmt.mbits)
    val = sign * np.where(exp == 0, sub, normal)
    mag = b & ((1 << (fmt.mbits + fmt.ebits)) - 1)
    if not specials:
        return val
    if fmt.has_inf:
        top = exp == (1 << fmt.ebits) - 1
        val = np.where(top, np.where(mant == 0, sign * np.inf, np.nan), val)
    else:
        val = np.where(mag == (1 << (fmt.mbits + fmt.ebits)) - 1, np.nan, val)
    return val


def _encode(x: np.ndarray, fmt: _Fmt, rtz: bool = False) -> np.ndarray:
    """float64 values -> bit patterns, round to nearest even (or toward zero), one rounding."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    finite = np.isfinite(a)
    a_f = np.where(finite, a, 0.0)
    _, e = np.frexp(a_f)
    exp = np.maximum(e.astype(np.int64) - 1, 1 - fmt.bias)  # unbiased exponent, clamped to the subnormal range
    q = np.ldexp(a_f, (fmt.mbits - exp).astype(np.int32))  # significand in units of the last place (exact)
    q = np.trunc(q) if rtz else np.rint(q)  # np.rint rounds half to even
    carry = q >= (1 << (fmt.mbits + 1))  # rounding overflowed the significand: next binade
    exp = np.where(carry, exp + 1, exp)
    q = np.where(carry, q / 2, q).astype(np.int64)
    normal = q >= (1 << fmt.mbits)
    code = np.where(normal, ((exp + fmt.bias) << fmt.mbits) | (q - (1 << fmt.mbits)), q)
    inf_code = ((1 << fmt.ebits) - 1) << fmt.mbits
    over = code > fmt.max_bits
    if fmt.saturate or rtz or not fmt.has_inf:
        code = np.where(over, fmt.max_bits, code)
    else:
        code = np.where(over, inf_code, code)
    if fmt.has_inf and not fmt.saturate:
        code = np.where(np.isinf(a), inf_code, code)
    else:
        code = np.where(np.isinf(a), fmt.max_bits, code)
    code = code | (np.signbit(x).astype(np.int64) << (fmt.mbits + fmt.ebits))
    # NaN: sm_90 cvt.rn.satfinite to fp8 returns 0x7F whatever the sign (checked on an H200)
    code = np.where(np.isnan(a), fmt.nan_bits, code)
    width = 1 + fmt.ebits + fmt.mbits
    return code.astype(np.uint8 if width == 8 else np.uint16)


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) -> float32, exactly."""
    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


def f64_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Values -> bf16 bit patterns, RNE (what cvt.rn.bf16.f32 does on sm_90)."""
    return _encode(np.asarray(x, dtype=np.float64), _BF16)


def f64_to_fp8_bits(x: np.ndarray, e4m3: bool) -> np.ndarray:
    """Values -> fp8 codes with sm_90 semantics (RNE, satfinite, NaN -> NaN)."""
    return _encode(np.asarray(x, dtype=np.float64), _E4M3 if e4m3 else _E5M2)


# ---------------------------------------------------------------------------------------------------------------
# The patches. Each wraps one interpreter entry point and falls through to the original for everything else.


def _apply_patches(disabled: frozenset[str], version: str) -> None:
    """Apply the fixes in a fixed order; a fix named in ``disabled`` is left out (install() reports it unfixed), and
    a fix whose defect this version does not have is not applied."""
    import triton.language as tl
    from triton.runtime import autotuner as at
    from triton.runtime import interpreter as it

    fmts = {tl.bfloat16: _BF16, tl.float8e4nv: _E4M3, tl.float8e5: _E5M2}
    # a fix applies where it is not disabled and this release has the defect (`_Issue.only_in`)
    absent = {i.name for i in _fixable_issues() if i.only_in is not None and version not in i.only_in}
    on = lambda name: name not in disabled and name not in absent
    cast_fmts = {t: f for t, f in fmts.items() if on("bf16_cast" if t == tl.bfloat16 else "fp8_cast")}
    dot_fmts = {t: f for t, f in fmts.items() if on("bf16_dot" if t == tl.bfloat16 else "fp8_dot_operands")}
    _patch_bf16_arith(it, tl, on("bf16_arith"))
    _patch_bf16_constant(it, tl, on("bf16_constant"))
    _patch_scalar_index(it, on("scalar_index"))
    _patch_cast_impl(it, tl, fmts, cast_fmts)
    _patch_fp_to_int(it, fmts, on("fp_to_int"))
    _late_bind_casts(it)
    _patch_fp_to_fp(it, tl, fmts, cast_fmts, on("bf16_cast"))
    _patch_dot(it, fmts, dot_fmts, on("tf32_dot"))
    _patch_bf16_reduce(it, tl, on("bf16_reduce"))
    _patch_bf16_atomic(it, tl, on("bf16_atomic"))
    _patch_libdevice(it, tl, on("libdevice"))
    _patch_builtin_aliases(it, tl, on("builtin_aliases"))  # after libdevice: it leaves libdevice's aliases to it
    _patch_autotune(at, on("autotune"))
    _patch_float_args(it, tl, on("float_args"))
    _patch_tensor_wrappers(it, on("tensor_wrappers"))
    _patch_closures(it, on("closures"))
    _patch_bounds_check(it, on("bounds_check"))  # last: it wraps the loads/stores/atomics patched above
    # no effect on results: work the interpreter does for nothing (a helper whose module has aliases still patches)
    interpreter_speed.apply(it, tl, disabled, lambda fn: _own_patching(fn, tl))


class OutOfBoundsAccess(RuntimeError):
    """An unmasked lane of a kernel's load/store/atomic addressed memory outside every tensor argument."""


#: (kernel name, [(argument, first byte, end byte, data pointer, element size)]) of the launches running now
_LAUNCHES: list[tuple[str, list[tuple[str, int, int, int, int]]]] = []


def _extents(it: Any, named: list[tuple[str, Any]]) -> list[tuple[str, int, int, int, int]]:
    """The bytes each tensor argument's view spans (not its whole storage: a neighbour's data is out of bounds). A view
    that starts its storage spans the storage's tail too: an allocation sliced to its shape (OpenAI triton_kernels'
    `empty_aligned`, whose kernels memset the padding) owns that memory, and the harness' own buffers never start
    their storage with a tail (inputs fill theirs, outputs sit between guard bands)."""
    out: list[tuple[str, int, int, int, int]] = []
    for name, arg in named:
        if isinstance(arg, tuple):
            out += _extents(it, [(f"{name}[{i}]", a) for i, a in enumerate(arg)])
        elif isinstance(arg, it.TensorDescriptor):
            out += _extents(it, [(f"{name}.base", arg.base)])
        elif hasattr(arg, "data_ptr"):
            t = it._unwrap_tensor(arg)
            if t.numel() == 0:
                continue
            es, ptr = t.element_size(), t.data_ptr()
            neg = sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True) if st < 0)
            pos = sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True) if st > 0)
            end = ptr + (pos + 1) * es
            if t.storage_offset() == 0 and neg == 0:
                end = max(end, ptr + t.untyped_storage().nbytes())
            out.append((name, ptr + neg * es, end, ptr, es))
    return out


def _check_access(it: Any, what: str, ptrs: Any, mask: Any) -> None:
    """Raise OutOfBoundsAccess if an active lane of `ptrs` (a pointer TensorHandle) leaves every argument."""
    if not _LAUNCHES or not _LAUNCHES[-1][1]:
        return
    kernel, ext = _LAUNCHES[-1]
    p = np.asarray(ptrs.data)
    if mask is not None:
        p = p[np.broadcast_to(np.asarray(mask.data, dtype=bool), p.shape)]
    if p.size == 0:
        return
    size = np.dtype(it._get_np_dtype(ptrs.get_element_ty())).itemsize
    lo, hi = int(p.min()), int(p.max()) + size
    if any(a <= lo and hi <= b for _, a, b, _, _ in ext):  # the common case: one argument holds every lane
        return
    p = p.astype(np.uint64).ravel()
    ok = np.zeros(p.shape, dtype=bool)
    for _, a, b, _, _ in ext:
        ok |= (p >= np.uint64(a)) & (p + np.uint64(size) <= np.uint64(b))
    if ok.all():
        return
    bad = int(p[~ok][0])
    name, a, b, ptr, es = min(ext, key=lambda e: min(abs(bad - e[1]), abs(bad - e[2])))
    raise OutOfBoundsAccess(
        f"{kernel}: {what} of {int((~ok).sum())} unmasked lane(s) outside every tensor argument; the first at "
        f"element {(bad - ptr) / es:+g} of the nearest, {name} (it spans elements {(a - ptr) // es} to "
        f"{(b - ptr) // es - 1})")


def _patch_bounds_check(it: Any, enabled: bool) -> None:
    """Unmasked lanes outside the launch's tensor arguments touched arbitrary host memory: raise instead."""
    if not enabled or getattr(it, "_moe_bounds_check", False):
        return
    B, GE = it.InterpreterBuilder, it.GridExecutor
    orig_init, orig_call = GE._init_args_hst, GE.__call__
    orig_load, orig_store, orig_rmw, orig_cas = (B.create_masked_load, B.create_masked_store, B.create_atomic_rmw,
                                                 B.create_atomic_cas)

    def init_args_hst(self: Any, args_dev: Any, kwargs: Any) -> Any:
        args_hst, kwargs_hst = orig_init(self, args_dev, kwargs)
        named = [*zip(self.arg_names, args_hst), *kwargs_hst.items()]
        _LAUNCHES.append((getattr(self.fn, "__name__", "kernel"), _extents(it, named)))
        return args_hst, kwargs_hst

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        depth = len(_LAUNCHES)
        try:
            return orig_call(self, *args, **kwargs)
        finally:
            del _LAUNCHES[depth:]

    def load(self: Any, ptrs: Any, mask: Any, *rest: Any) -> Any:
        _check_access(it, "load", ptrs, mask)
        return orig_load(self, ptrs, mask, *rest)

    def store(self: Any, ptrs: Any, value: Any, mask: Any, *rest: Any) -> Any:
        _check_access(it, "store", ptrs, mask)
        return orig_store(self, ptrs, value, mask, *rest)

    def rmw(self: Any, op: Any, ptr: Any, val: Any, mask: Any, *rest: Any) -> Any:
        _check_access(it, "atomic", ptr, mask)
        return orig_rmw(self, op, ptr, val, mask, *rest)

    def cas(self: Any, ptr: Any, *rest: Any) -> Any:
        _check_access(it, "atomic_cas", ptr, None)
        return orig_cas(self, ptr, *rest)

    GE._init_args_hst, GE.__call__ = init_args_hst, call
    B.create_masked_load, B.create_masked_store, B.create_atomic_rmw, B.create_atomic_cas = load, store, rmw, cas
    it._moe_bounds_check = True


def _patch_float_args(it: Any, tl: Any, enabled: bool) -> None:
    """Python float arguments -> fp32 scalar tensors (compiled Triton mangles a float argument as fp32)."""
    if not enabled or getattr(it, "_moe_float_args", False):
        return
    orig = it._implicit_cvt

    def implicit_cvt(arg: Any) -> Any:
        if isinstance(arg, float):
            return tl.tensor(it.TensorHandle(np.array([arg], dtype=np.float32), tl.float32), tl.float32)
        return orig(arg)

    it._implicit_cvt = implicit_cvt
    it._moe_float_args = True


def _wrapped(arg: Any) -> Any:
    """The torch tensor a tensor-like wrapper holds (an object with data_ptr() whose `.data` is a tensor), else None."""
    import torch

    if isinstance(arg, torch.Tensor) or not hasattr(arg, "data_ptr"):
        return None
    data = getattr(arg, "data", None)
    return data if isinstance(data, torch.Tensor) else None


def _patch_tensor_wrappers(it: Any, enabled: bool) -> None:
    """Tensor-like wrappers (an object with data_ptr() and a tensor `.data`) are launched as the tensor they hold."""
    if not enabled or getattr(it, "_moe_tensor_wrappers", False) or not hasattr(it, "_unwrap_tensor"):
        return
    orig_unwrap, orig_rewrap = it._unwrap_tensor, it._rewrap_tensor

    def unwrap(t: Any) -> Any:
        data = _wrapped(t)
        return orig_unwrap(t) if data is None else data

    def rewrap(t: Any, original_tensor: Any) -> Any:
        return t if _wrapped(original_tensor) is not None else orig_rewrap(t, original_tensor)

    it._unwrap_tensor, it._rewrap_tensor = unwrap, rewrap
    it._moe_tensor_wrappers = True


def _patch_closures(it: Any, enabled: bool) -> None:
    """A rewritten nested kernel sees its enclosing scope's values (as compiled Triton resolves them) beside the
    module's globals (a copy: such a kernel sees later changes of the module's globals only through them)."""
    import types

    rewriter = getattr(it, "FunctionRewriter", None)
    if not enabled or rewriter is None or getattr(it, "_moe_closures", False):
        return
    orig = rewriter._compile_and_exec

    def compile_and_exec(self: Any, transformed_ast: Any) -> Any:
        new = orig(self, transformed_ast)
        code = getattr(self.fn, "__code__", None)
        if code is None or not code.co_freevars or not self.fn.__closure__:
            return new
        cells = {n: c.cell_contents for n, c in zip(code.co_freevars, self.fn.__closure__, strict=True)}
        found = types.FunctionType(new.__code__, {**new.__globals__, **cells}, new.__name__, new.__defaults__)
        found.__kwdefaults__, found.__annotations__ = new.__kwdefaults__, new.__annotations__
        return found

    rewriter._compile_and_exec = compile_and_exec
    it._moe_closures = True


def _decode_any(h: Any, fmts: dict[Any, _Fmt]) -> np.ndarray:
    """Exact float64 values of a tensor handle: bf16/fp8 codes decoded by value, other dtypes widened."""
    fmt = fmts.get(h.dtype.scalar)
    with np.errstate(invalid="ignore"):  # signalling NaNs widen quietly
        return _decode(h.data, fmt) if fmt is not None else h.data.astype(np.float64)


def _patch_bf16_arith(it: Any, tl: Any, enabled: bool) -> None:
    """bf16 elementwise ops ran numpy integer arithmetic on the uint16 bit patterns: compute in fp32, round per op."""
    B, TH = it.InterpreterBuilder, it.TensorHandle

    def is_bf16(h: Any) -> bool:
        return h.dtype.scalar == tl.bfloat16

    def to_f32(h: Any) -> Any:
        return TH(bf16_bits_to_f32(h.data), tl.float32) if is_bf16(h) else h

    def from_f32(h: Any) -> Any:  # fp32 result of a bf16 op -> bf16 (RNE); bool results (compares) unchanged
        if h.data.dtype == np.float32:
            return TH(_encode(h.data, _BF16), tl.bfloat16)
        return h

    def bf16_via_f32(orig: Callable[..., Any]) -> Callable[..., Any]:
        # bf16 is stored as uint16 and numpy would do integer arithmetic on it: compute in fp32, round per op.
        def wrapped(self: Any, *hs: Any) -> Any:
            if any(isinstance(h, TH) and is_bf16(h) for h in hs):
                return from_f32(orig(self, *(to_f32(h) if isinstance(h, TH) else h for h in hs)))
            return orig(self, *hs)

        return wrapped

    def binary_op(orig: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(self: Any, lhs: Any, rhs: Any, op: Any) -> Any:
            if is_bf16(lhs) or is_bf16(rhs):
                return from_f32(orig(self, to_f32(lhs), to_f32(rhs), op))
            return orig(self, lhs, rhs, op)

        return wrapped

    def unary_op(orig: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(self: Any, arg: Any, op: Any) -> Any:
            if is_bf16(arg):
                return from_f32(orig(self, to_f32(arg), op))
            return orig(self, arg, op)

        return wrapped

    if enabled:
        B.binary_op = binary_op(B.binary_op)
        B.unary_op = unary_op(B.unary_op)
        for name in ("create_fma", "create_clampf", "create_erf", "create_rsqrt"):
            setattr(B, name, bf16_via_f32(getattr(B, name)))


def _patch_bf16_constant(it: Any, tl: Any, enabled: bool) -> None:
    """Releases before 3.9 have no InterpreterBuilder.get_bf16, so a scalar operand of a bf16 op raised: add it."""
    if not enabled:
        return

    def get_bf16(self: Any, value: float) -> Any:
        return self.create_fp_trunc(self.get_fp32(value), tl.bfloat16)

    it.InterpreterBuilder.get_bf16 = get_bf16


def _patch_scalar_index(it: Any, enabled: bool) -> None:
    """Triton 3.6 converted a scalar tensor with int(<1-d array>), an error in numpy >= 2.4: read the element."""
    if not enabled:
        return
    orig = it._patch_lang_tensor

    def patch_lang_tensor(tensor: Any, scope: Any) -> None:
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    it._patch_lang_tensor = patch_lang_tensor


def _patch_cast_impl(it: Any, tl: Any, fmts: dict[Any, _Fmt], cast_fmts: dict[Any, _Fmt]) -> None:
    """Casts to bf16 truncated or reinterpreted ints, and bf16/fp8 sources were read as bits: decode, one RNE."""
    B, TH = it.InterpreterBuilder, it.TensorHandle
    # Casts: bf16 and fp8 values are decoded exactly and re-encoded with one RNE (satfinite for fp8) rounding.
    orig_cast = B.cast_impl

    def cast_impl(self: Any, src: Any, dst_type: Any) -> Any:
        s, d = src.dtype.scalar, dst_type.scalar
        if d in cast_fmts and (s.is_floating() or s.is_int()):
            return TH(_encode(_decode_any(src, fmts), fmts[d]), d)
        if s in cast_fmts:
            vals = _decode_any(src, fmts)
            if d.is_int() and not d.is_bool():  # float -> int goes through fp32 like the GPU
                return orig_cast(self, TH(vals.astype(np.float32), tl.float32), dst_type)
            return TH(vals.astype(it._get_np_dtype(d)), d)
        return orig_cast(self, src, dst_type)

    if cast_fmts:
        B.cast_impl = cast_impl


def _patch_fp_to_int(it: Any, fmts: dict[Any, _Fmt], enabled: bool) -> None:
    """Out-of-range / NaN float->int casts were undefined numpy casts: apply PTX cvt.rzi saturation instead."""
    B, TH = it.InterpreterBuilder, it.TensorHandle

    # float -> int: numpy's astype is undefined out of range; PTX cvt.rzi saturates (NaN -> 0), and for 8-bit
    # destinations converts to 16 bits with saturation and keeps the low byte (checked on an H200).
    def fp_to_int(self: Any, src: Any, dst_type: Any) -> Any:
        d = dst_type.scalar
        vals = _decode_any(src, fmts) if src.dtype.scalar in fmts else src.data.astype(np.float64)
        width = max(d.int_bitwidth, 16)
        signed = d.is_int_signed()
        lo, hi = (-(2 ** (width - 1)), 2 ** (width - 1) - 1) if signed else (0, 2**width - 1)
        with np.errstate(invalid="ignore"):
            t = np.clip(np.trunc(np.nan_to_num(vals, nan=0.0)), lo, hi)
        wide = t.astype(np.int64) if width < 64 or signed else t.astype(np.uint64)
        return TH(wide.astype(it._get_np_dtype(d)), d)

    if enabled:
        B.create_fp_to_si = fp_to_int
        B.create_fp_to_ui = fp_to_int


def _late_bind_casts(it: Any) -> None:
    """int->float and fp ext/trunc creators must reach the patched cast: make them call ``self.cast_impl`` late."""
    B = it.InterpreterBuilder
    for name in ("create_si_to_fp", "create_ui_to_fp", "create_fp_ext", "create_fp_trunc"):  # late-bind cast_impl
        setattr(B, name, lambda self, src, dst_type: self.cast_impl(src, dst_type))


def _patch_fp_to_fp(it: Any, tl: Any, fmts: dict[Any, _Fmt], cast_fmts: dict[Any, _Fmt], bf16_cast: bool) -> None:
    """fp<->fp8 and bf16->fp16 conversions rounded the mantissa alone and misread specials: decode, round once."""
    B, TH = it.InterpreterBuilder, it.TensorHandle
    orig_fp_to_fp = B.create_fp_to_fp

    def create_fp_to_fp(self: Any, src: Any, dst_type: Any, rounding_mode: Any) -> Any:
        s, d = src.dtype.scalar, dst_type.scalar
        fp8_off = any(t in fmts and t not in cast_fmts and t != tl.bfloat16 for t in (s, d))
        if not fp8_off and (s in cast_fmts or d in cast_fmts or (d == tl.float16 and bf16_cast)):
            rtz = rounding_mode == it._ir.ROUNDING_MODE.RTZ
            vals = _decode_any(src, fmts)
            if s == tl.float8e5 and d == tl.bfloat16:
                # sm_90 (Triton 3.6) widens e5m2 -> bf16 with bit arithmetic that treats exponent 31 as normal:
                # Inf/NaN codes become finite +-2**16*(1+m/4) (observed on an H200); reproduce it.
                vals = _decode(src.data, _E5M2, specials=False)
            if d in fmts:
                return TH(_encode(vals, fmts[d], rtz=rtz), d)
            if d == tl.float16:
                return TH(_encode(vals, _FP16, rtz=rtz).view(np.float16), d)
            return TH(vals.astype(it._get_np_dtype(d)), d)
        return orig_fp_to_fp(self, src, dst_type, rounding_mode)

    if cast_fmts:
        B.create_fp_to_fp = create_fp_to_fp


def _patch_dot(it: Any, fmts: dict[Any, _Fmt], dot_fmts: dict[Any, _Fmt], tf32: bool) -> None:
    """tl.dot multiplied bf16/fp8 bit patterns and kept full fp32 for tf32: decode exactly / truncate to tf32."""
    B, TH = it.InterpreterBuilder, it.TensorHandle
    # tl.dot: decode bf16/fp8 operands exactly; fp32 products of <=11-bit significands are exact.
    orig_dot = B.create_dot

    def create_dot(self: Any, a: Any, b: Any, d: Any, input_precision: Any, max_num_imprecise_acc: Any) -> Any:
        if a.dtype.scalar in dot_fmts or b.dtype.scalar in dot_fmts:
            av = _decode_any(a, fmts).astype(np.float32)
            bv = _decode_any(b, fmts).astype(np.float32)
            acc = _decode_any(d, fmts).astype(np.float32) if d.dtype.scalar in fmts else d.data.astype(np.float32)
            out = np.matmul(av, bv) + acc
            if d.dtype.scalar in fmts:
                return TH(_encode(out, fmts[d.dtype.scalar]), d.dtype.scalar)
            return TH(out.astype(d.data.dtype), d.dtype.scalar)
        if tf32 and a.data.dtype == np.float32 and input_precision == it._ir.INPUT_PRECISION.TF32:
            # sm_90 tensor cores read fp32 operands as tf32 by dropping the low 13 mantissa bits (truncation,
            # checked on an H200); tf32 x tf32 products are exact in fp32.
            av = (a.data.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
            bv = (b.data.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
            return TH(np.matmul(av, bv) + d.data, d.dtype.scalar)
        return orig_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    B.create_dot = create_dot


def _patch_bf16_reduce(it: Any, tl: Any, enabled: bool) -> None:
    """bf16 reductions/scans ran numpy's fast paths on the uint16 bit patterns: decode, reduce in fp32, re-encode."""
    TH = it.TensorHandle
    # Reductions/scans: the fast numpy paths see uint16 bits for bf16; decode, reduce, re-encode.
    R, S = it.ReduceOps, it.ScanOps

    def bf16_tensor(t: Any) -> Any:
        return tl.core.tensor(TH(bf16_bits_to_f32(t.handle.data), tl.float32), t.type.with_element_ty(tl.float32)
                              if t.type.is_block() else tl.float32)

    def back_to_bf16(t: Any) -> Any:
        if t.dtype != tl.float32:  # argmax indices
            return t
        ty = t.type.with_element_ty(tl.bfloat16) if t.type.is_block() else tl.bfloat16
        return tl.core.tensor(TH(_encode(t.handle.data, _BF16), tl.bfloat16), ty)

    def reduce_wrap(orig: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(self: Any, input: Any, *args: Any, **kw: Any) -> Any:
            input = input[0] if isinstance(input, tuple) else input  # min_max may get (values, indices)
            if isinstance(input, tl.core.tensor) and input.dtype == tl.bfloat16:
                out = orig(self, bf16_tensor(input), *args, **kw)
                if isinstance(out, (list, tuple)):
                    return type(out)(back_to_bf16(o) for o in out)
                return back_to_bf16(out)
            return orig(self, input, *args, **kw)

        return wrapped

    if enabled:
        R.sum = reduce_wrap(R.sum)
        R.min_max = reduce_wrap(R.min_max)
        S.cumsum = reduce_wrap(S.cumsum)
        S.cumprod = reduce_wrap(S.cumprod)


def _patch_bf16_atomic(it: Any, tl: Any, enabled: bool) -> None:
    """bf16 atomic_add/xchg raised 'Unsupported data type': apply them element by element, rounding each to bf16."""
    B, TH = it.InterpreterBuilder, it.TensorHandle
    # bf16 atomics: the C++ atomic_rmw rejects uint16; apply them one element at a time, in order, rounding each
    # add to bf16 like red.add.bf16 does (duplicate addresses accumulate).
    orig_rmw = B.create_atomic_rmw
    fadd, xchg = it._ir.ATOMIC_OP.FADD, it._ir.ATOMIC_OP.XCHG

    def create_atomic_rmw(self: Any, rmwOp: Any, ptr: Any, val: Any, mask: Any, sem: Any, scope: Any) -> Any:
        if not (val.dtype.scalar == tl.bfloat16 and rmwOp in (fadd, xchg)):
            return orig_rmw(self, rmwOp, ptr, val, mask, sem, scope)
        ptrs, vals, masks = (np.ravel(x) for x in np.broadcast_arrays(ptr.data, val.data, mask.data))
        old = np.zeros(vals.shape, dtype=np.uint16)
        one, zero = np.ones(1, dtype=bool), np.zeros(1, dtype=np.uint16)
        for i in np.flatnonzero(masks):
            p = ptrs[i : i + 1]
            old[i] = it._interpreter.load(p, one, zero, np.dtype(np.uint16))[0]
            new = vals[i : i + 1] if rmwOp == xchg else _encode(
                bf16_bits_to_f32(old[i : i + 1]).astype(np.float64) + bf16_bits_to_f32(vals[i : i + 1]), _BF16)
            it._interpreter.store(p, new, one)
        return TH(old.reshape(np.shape(val.data)), tl.bfloat16)

    if enabled:
        B.create_atomic_rmw = create_atomic_rmw


def _patch_libdevice(it: Any, tl: Any, enabled: bool) -> None:
    """libdevice calls raised (extern_elementwise unsupported, modules unpatched): emulate them in float64 numpy."""
    B, TH = it.InterpreterBuilder, it.TensorHandle

    # libdevice: emulate extern_elementwise symbols, and patch the libdevice modules like tl itself.
    def create_extern_elementwise(self: Any, libName: str, libPath: str, symbol: str, argList: list[Any],
                                  retType: Any, isPure: bool) -> Any:
        ret = retType.scalar
        name = symbol.removeprefix("__nv_")
        if argList and argList[0].data.dtype == np.float32 and name.endswith("f"):
            name = name[:-1]
        fn = _LIBDEVICE.get(name)
        if fn is None:
            raise NotImplementedError(f"libdevice symbol {symbol} is not emulated by harness.engine.interpreter")
        with np.errstate(all="ignore"):
            out = fn(*(np.asarray(h.data, dtype=np.float64) for h in argList))
        return TH(np.asarray(out).astype(it._get_np_dtype(ret)), ret)

    import triton.language.extra.cuda.libdevice as cuda_ld
    import triton.language.extra.libdevice as generic_ld

    orig_patch_lang = it._patch_lang
    ld_names = [n for n in dir(generic_ld) if not n.startswith("_") and tl.core.is_builtin(getattr(cuda_ld, n, None))]

    # stubs a kernel module bound by name (`from ...libdevice import tanh`): rebound for the launch as well
    stubs = {id(getattr(m, n)): n for m in (generic_ld, cuda_ld) for n in ld_names if hasattr(m, n)}
    if enabled:
        _LIBDEVICE_STUBS.update(stubs)

    def _patch_lang(fn: Any) -> Any:
        scope = orig_patch_lang(fn)
        it._patch_builtin(cuda_ld, it.interpreter_builder, scope)
        for name in ld_names:  # compiled, the generic stubs resolve to the backend module; do the same here
            scope.set_attr(generic_ld, name, getattr(cuda_ld, name))
        module = sys.modules.get(getattr(fn, "__module__", None) or "")
        for gname, value in list(vars(module).items()) if module is not None else []:
            if id(value) in stubs:
                scope.set_attr(module, gname, getattr(cuda_ld, stubs[id(value)]))
        return scope

    if enabled:
        B.create_extern_elementwise = create_extern_elementwise
        it._patch_lang = _patch_lang


#: ids of the libdevice functions the libdevice fix rebinds in a kernel's module -> their names
_LIBDEVICE_STUBS: dict[int, str] = {}


def _aliases(fn: Any, tl: Any) -> tuple[Any, list[str]]:
    """The module `fn` was defined in and its names bound to triton.language builtins at import (`fast_expf =
    tl.math.exp`, `from triton.language.math import exp`); none in Triton's own modules (the interpreter's part)."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    if module is None or module.__name__.partition(".")[0] == "triton":
        return None, []
    return module, [name for name, value in list(vars(module).items()) if tl.core.is_builtin(value)]


def _own_patching(fn: Any, tl: Any) -> bool:
    """Whether the module of `fn` has names of its own that a launch patches: builtin or libdevice aliases."""
    module, names = _aliases(fn, tl)
    return bool(names) or (module is not None and any(id(v) in _LIBDEVICE_STUBS for v in vars(module).values()))


def _patch_builtin_aliases(it: Any, tl: Any, enabled: bool) -> None:
    """The interpreter patches the builtins on triton.language's modules for each launch, so a name a kernel's module
    bound to one at import kept the unpatched builtin, which raises when called: patch those names the same way,
    in the module of each kernel and helper the launch runs, undone with the launch's other patches."""
    patch_attr = getattr(it, "_patch_attr", None)  # what the interpreter applies to each builtin of triton.language
    if not enabled or patch_attr is None:
        return
    orig_patch_lang = it._patch_lang

    def _patch_lang(fn: Any) -> Any:
        scope = orig_patch_lang(fn)
        module, names = _aliases(fn, tl)
        for name in names:  # after the libdevice fix above: its aliases are bound to the emulation already
            patch_attr(module, name, getattr(module, name), it.interpreter_builder, scope)
        return scope

    it._patch_lang = _patch_lang


def _patch_autotune(at: Any, enabled: bool) -> None:
    """@triton.autotune with several configs benchmarked through a GPU driver: time every config equal instead."""
    # Autotune: with several configs the autotuner benchmarks through a GPU driver; no timing is meaningful in
    # the interpreter, so report equal times and let min() keep the first pruned config.
    orig_do_bench = at.Autotuner.do_bench

    def do_bench(self: Any) -> Any:
        if self._do_bench is None:
            return lambda kernel_call, quantiles=None: [0.0, 0.0, 0.0]
        return orig_do_bench.fget(self)

    if enabled:
        at.Autotuner.do_bench = property(do_bench)
