"""`python -m harness bench --op experts [--shape deepseek-v3 ...] [--quant fp8_w8a8:G128 ...] [--against-vllm PATH]`:
fused experts at model shapes, unquantized and every quantized scheme.

Per (shape, scheme, M in 1..4096): our Triton path (`triton-experts`), torch's grouped GEMM
(`torch-grouped-mm-experts`, bf16 on sm90/sm100 only) and, with `--against-vllm PATH`, vLLM's Triton
`fused_moe_kernel` loaded from that wheel or source tree (`harness/commands/bench/_vllm.py`; its tuned config for this
device, or its default, named in the `config` column; `vs ours` = its time over ours), and for fp8 G128 on sm90 with
DeepGEMM built (`scripts/deepgemm.sh`) its two grouped GEMMs (`harness/commands/bench/_deepgemm.py`: the GEMMs
only, a lower bound on a DeepGEMM pipeline); for fp8 G128 on sm90 also our Gluon pipeline (`gluon-experts-fp8-fast`,
kernels.gluon_experts).

Roofline floor, in the case name: max(FLOPs / measured matmul rate, bytes / measured copy bandwidth), and `floor`
says which one bounds the row. FLOPs = 6 M k N K (both GEMMs); the rate is measured here, once per run, for the
scheme's tensor-core type (bf16 matmul; fp8 `torch._scaled_mm`; int8 `torch._int_mm`; weight-only schemes
multiply in bf16). Bytes = the weights of the experts the routing actually hits in their stored format (codes,
scales, zero points) plus x and out. Targets: kernel time <= floor / 0.8 for M <= 64 (decode, bandwidth),
>= 60% of the fp8 tensor-core floor at M >= 1024 for fp8 block-scaled.
The kernels of a point are timed together, in interleaved rounds, as CUDA-graph replays (`graph_us`, the GPU
time, L2 flushed; `kernel_us` and the `vs` ratios) and as eager calls (`eager_us`, launch overhead included;
`vs ... (eager)`), each with its spread over the rounds; a point whose methods disagree by more than 5% is timed
again (`harness/commands/bench/_timing.py`).

Each case has a `verify` closure: the output rows of a sample of tokens (the first 8 and the last) are judged
against the op spec's oracle and error bound (harness.ops.experts.expected, fp64) on the sub-problem of the
experts those tokens use, so the fp64 oracle stays small at E=256. A timed configuration that fails it is
reported `verified: no` and the command exits 1.
On a CPU the Triton kernels run in the interpreter: real shapes would take hours, so a small smoke shape is used.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from harness.commands.bench import SCHEMES, SHAPES, BenchCase, copy_bandwidth, do_bench
from harness.core.case import Case
from harness.core.compare import compare_bounded

M_VALUES = (1, 16, 64, 256, 1024, 4096)
#: our kernel with fp8 fast accumulation (fused_experts(fp8_fast_accum=True)), timed beside the default for fp8
FAST = "triton-experts-fp8-fast"
#: our Gluon pipeline for fp8 G128 on sm90 (kernels.gluon_experts; fast accumulation); a `vs` column against it
#: appears only where it was timed
GLUON = ("gluon-experts-fp8-fast",)
_FEATURES = {"format": "standard", "quant_type": "none", "quant_format": "-", "activation": "silu",
             "apply_weight_on_input": "N", "expert_map": "N", "dtype": "bfloat16", "bias": "N"}
def _rate(device: str, fn: Callable[[], Any], n: int = 8192) -> float:
    return 2 * n**3 / do_bench(fn, device)


@functools.cache
def matmul_rate(device: str, kind: str = "bf16") -> float:
    """Measured dense matmul rate in FLOP/s (8192^3): bf16 (cuBLAS), fp8 (torch._scaled_mm, e4m3, per-tensor
    scales, bf16 out) or int8 (torch._int_mm)."""
    n = 8192
    if kind == "fp8":
        a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device)
        return _rate(device, lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16))
    if kind == "int8":
        a = torch.randint(-128, 127, (n, n), device=device, dtype=torch.int8)
        b = torch.randint(-128, 127, (n, n), device=device, dtype=torch.int8).t()
        return _rate(device, lambda: torch._int_mm(a, b))
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    return _rate(device, lambda: a @ b)


def rate_kind(quant_type: str) -> str:
    return {"fp8_w8a8": "fp8", "int8_w8a8": "int8"}.get(quant_type, "bf16")


@functools.cache
def _copy_bw(device: str) -> float:
    return copy_bandwidth(device)


def _weights(s: dict, device: str, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """W13, W2 ~ N(0, 1/fan_in), made on the device 16 experts at a time (shared by every M of a shape)."""
    torch.manual_seed(0)
    e, hidden, n = s["E"], s["K"], s["N"]
    w13 = torch.empty(e, 2 * n, hidden, device=device, dtype=dtype)
    w2 = torch.empty(e, hidden, n, device=device, dtype=dtype)
    for i in range(0, e, 16):
        j = min(e, i + 16)
        w13[i:j] = (torch.randn(j - i, 2 * n, hidden, device=device) * hidden**-0.5).to(dtype)
        w2[i:j] = (torch.randn(j - i, hidden, n, device=device) * n**-0.5).to(dtype)
    return w13, w2


def _inputs(s: dict, m: int, weights: tuple[torch.Tensor, torch.Tensor], device: str) -> dict[str, torch.Tensor]:
    """x ~ N(0, 1) and a softmax top-k routing of random logits (renormalized)."""
    g = torch.Generator(device="cpu").manual_seed(m)
    x = torch.randn(m, s["K"], generator=g).to(device=device, dtype=weights[0].dtype)
    w, ids = torch.topk(torch.randn(m, s["E"], generator=g).softmax(dim=-1), s["k"], dim=-1)
    return {"x": x, "w13": weights[0], "w2": weights[1], "topk_weights": (w / w.sum(-1, keepdim=True)).to(device),
            "topk_ids": ids.to(torch.int32).to(device)}


#: the vLLM pipeline of _vllm.py: GEMM1's output stored in x.dtype before our activation kernel (round once), the
#: router weight on GEMM2's fp32 accumulator, weighted slots in x.dtype summed by torch in fp32; vLLM's fp8 dot
#: keeps Triton's default (the tensor core's reduced-precision sum within a K block)
def vllm_conventions(quant_type: str) -> dict[str, Any]:
    from harness import registry

    conv = {**registry.resolve("triton-experts").conventions, "intermediate_rounding": "gemm1_and_activation_output"}
    if quant_type == "fp8_w8a8":
        conv["matmul_precision"] = "fp8_mma_promoted"
    return conv


def quantize_weights(weights: tuple[torch.Tensor, torch.Tensor], quant_type: str, quant_format: str,
                     device: str) -> dict[str, torch.Tensor]:
    """The bf16 bench weights quantized as the harness quantizes experts weights (the oracle's `quantize` with the
    scheme's weight recipe), on the device, 32 experts at a time: {w13, w2, w13_scale, w2_scale[, *_zp]}."""
    from harness.ops import experts_quant as xq
    from reference.quant import quantize

    if quant_type == "none":
        return {"w13": weights[0], "w2": weights[1]}
    case = Case(op="experts", adapter="triton-experts", features={**_FEATURES, "quant_type": quant_type,
                                                                   "quant_format": quant_format},
                seed=0, shapes={}, dtypes={"x": "bfloat16"})
    from harness import registry

    sch = xq.scheme(case, registry.resolve("triton-experts").conventions)
    found: dict[str, torch.Tensor] = {}
    for name, w in zip(("w13", "w2"), weights, strict=True):
        step = 1 if quant_format == "T" else 32  # one scale per tensor: per expert, as the harness does
        parts = [quantize(w[i:i + step].float()[0 if step == 1 else slice(None)], sch.weight)
                 for i in range(0, w.shape[0], step)]
        join = torch.stack if step == 1 else torch.cat
        codes = join([q.codes for q in parts])
        found[name] = codes.view(torch.float8_e4m3fn) if quant_type == "fp8_w8a8" else codes
        found[f"{name}_scale"] = join([q.scales for q in parts])
        if sch.weight.zero_point:
            found[f"{name}_zp"] = join([q.zero_points for q in parts])
        del parts
    return found


def stored_bytes_per_expert(qw: dict[str, torch.Tensor]) -> int:
    """Bytes of one expert's weights as stored (codes, scales, zero points)."""
    return sum(t[0].numel() * t.element_size() for t in qw.values() if t.dim() > 1 or t.numel() > 1)


def verify_rows(inputs: dict[str, torch.Tensor], out: Callable[[], torch.Tensor], adapter: str,
                rows: list[int] | None = None, *, scheme: tuple[str, str] = ("none", "-"),
                conventions: dict[str, Any] | None = None,
                rerun: Callable[[dict[str, torch.Tensor]], torch.Tensor] | None = None) -> Callable[[], str | None]:
    """Judge sample rows of a full-size output (default: the first 8 and the last) against the oracle on the
    sub-problem of their experts: returns a check, None when it passes, else the reason. `conventions`: the
    pipeline's (default: the adapter's). `rerun`: judge the kernel run on the sub-problem instead (with the
    full-size run's tile configuration): per-tensor activation scales are over all rows, so the full run's rows
    are not those of the sub-problem."""

    def check() -> str | None:
        from harness import registry
        from harness.ops import experts as spec

        got = out()
        m = got.shape[0]
        if not bool(got.isfinite().all()):
            return "non-finite output"
        picked = sorted(set(rows)) if rows else sorted(set(range(min(m, 8))) | {m - 1})
        ids = inputs["topk_ids"][picked]
        used, local = torch.unique(ids, return_inverse=True)
        sub = {"x": inputs["x"][picked], "topk_weights": inputs["topk_weights"][picked],
               "topk_ids": local.to(torch.int32)}
        for name in ("w13", "w2", "w13_scale", "w2_scale", "w13_zp", "w2_zp"):  # each per expert along dim 0
            if name in inputs:
                sub[name] = inputs[name][used]
        features = {**_FEATURES, "quant_type": scheme[0], "quant_format": scheme[1]}
        case = Case(op="experts", adapter=adapter, features=features, seed=0,
                    shapes={"M": len(picked), "E": len(used), "k": ids.shape[1], "K": sub["x"].shape[1],
                            "N": inputs["w2"].shape[2] * (2 if scheme[0].startswith("w4a16") else 1)},
                    dtypes={"x": "bfloat16"})
        conv = conventions if conventions is not None else registry.resolve(adapter).conventions
        (chk,) = spec.expected(case, sub, conv)
        cmp = compare_bounded("out", rerun(sub) if rerun else got[picked], chk.expected, chk.bound)
        return None if cmp.passed else cmp.reason

    return check


@dataclass
class _Point:
    """One timed point: a shape, a scheme and M, with its inputs and roofline."""

    s: dict[str, int]
    m: int
    scheme: tuple[str, str]
    inp: dict[str, torch.Tensor]
    quant: Any
    label: str
    nbytes: int
    flops: int
    floor: float
    basis: str

    @property
    def args(self) -> tuple[torch.Tensor, ...]:
        i = self.inp
        return i["x"], i["w13"], i["w2"], i["topk_weights"], i["topk_ids"]

    def case(self, adapter: str, kernel: Callable[[], torch.Tensor], verify: Callable[[], str | None],
             columns: dict[str, Any] | None = None, **fields: Any) -> BenchCase:
        return BenchCase(name=self.label, adapter=adapter, kernel=kernel, bytes_moved=self.nbytes, flops=self.flops,
                         verify=verify, graph=True, floor_s=0.0 if math.isnan(self.floor) else self.floor,
                         extra={"floor": self.basis, **(columns or {})}, **fields)


def _point(name: str, s: dict[str, int], m: int, scheme: tuple[str, str], weights: tuple[torch.Tensor, torch.Tensor],
           qw: dict[str, torch.Tensor], device: str) -> _Point:
    from kernels.quant_gemm import ExpertsQuant

    qt, qf = scheme
    cuda = device.startswith("cuda")
    quant = None if qt == "none" else ExpertsQuant(qt, qf, qw["w13_scale"], qw["w2_scale"], qw.get("w13_zp"),
                                                   qw.get("w2_zp"))
    inp = {**_inputs(s, m, weights, device), **qw}
    active = int(torch.unique(inp["topk_ids"]).numel())
    nbytes = active * stored_bytes_per_expert(qw) + 2 * m * s["K"] * 2
    flops = 6 * m * s["k"] * s["N"] * s["K"]
    t_flops, t_bytes = (flops / matmul_rate(device, rate_kind(qt)), nbytes / _copy_bw(device)) if cuda else (
        math.nan, math.nan)
    basis = "compute" if t_flops >= t_bytes else "bandwidth"
    floor = max(t_flops, t_bytes)
    tag = "bf16" if qt == "none" else f"{qt} {qf}"
    where = f"floor={floor * 1e6:.1f}us ({basis})" if cuda else "interpreter smoke shape"
    return _Point(s, m, scheme, inp, quant, f"{name} {tag} M={m} {where}", nbytes, flops, floor,
                  basis if cuda else "-")


def _ours(p: _Point) -> Iterator[BenchCase]:
    """Our kernel (and, for fp8, the same with fast accumulation). Per-tensor schemes verify a rerun of the same
    tile configuration on the sampled sub-problem (verify_rows)."""
    from kernels.fused_experts import fused_experts, gemm_configs
    from kernels.quant_gemm import ExpertsQuant
    from reference.experts import fused_experts as oracle

    s, (qt, qf), out = p.s, p.scheme, torch.empty_like(p.inp["x"])
    numel = p.m * s["k"]
    variants = [("triton-experts", {})] + ([(FAST, {"fp8_fast_accum": True})] if qt == "fp8_w8a8" else [])
    for adapter, options in variants:
        configs = gemm_configs(None, numel / min(s["E"], numel), s["N"], s["K"], torch.bfloat16, act=1,
                               experts=min(s["E"], numel), quant=p.quant, fp8_fast=bool(options))

        def run(options=options) -> torch.Tensor:
            return fused_experts(*p.args, out=out, quant=p.quant, **options)

        def rerun(sub: dict[str, torch.Tensor], options=options, configs=configs) -> torch.Tensor:
            q = None if qt == "none" else ExpertsQuant(qt, qf, sub["w13_scale"], sub["w2_scale"], sub.get("w13_zp"),
                                                       sub.get("w2_zp"))
            return fused_experts(sub["x"], sub["w13"], sub["w2"], sub["topk_weights"], sub["topk_ids"], quant=q,
                                 configs=configs, **options)

        check = verify_rows(p.inp, run, adapter, scheme=p.scheme, rerun=rerun if qf == "T" and p.m > 1 else None)
        extra: dict[str, Any] = {"compare_to": ("triton-experts",)} if options else {}
        if qt == "none":
            extra["reference"] = lambda: oracle(*p.args)
        yield p.case(adapter, run, check, **extra)


def _gluon(p: _Point) -> Iterator[BenchCase]:
    """Our Gluon pipeline (fp8 G128, sm90, fast accumulation) beside our Triton one."""
    from kernels.gluon_experts import gluon_fused_experts

    out = torch.empty_like(p.inp["x"])

    def run() -> torch.Tensor:
        return gluon_fused_experts(*p.args, p.quant, out=out)

    yield p.case(GLUON[0], run, verify_rows(p.inp, run, GLUON[0], scheme=p.scheme),
                 compare_to=("triton-experts", FAST))


def _vllm_rows(p: _Point, moe: Any) -> Iterator[BenchCase]:
    from harness.commands.bench import _vllm

    (qt, qf), s = p.scheme, p.s
    if not _vllm.supports(qt):
        return
    cfg, source = moe.config(p.m, s["E"], s["N"], s["K"], s["k"], _vllm.SCHEMES[qt],
                             [128, 128] if qf == "G128" else None)

    def run_on(i: dict[str, torch.Tensor]) -> torch.Tensor:
        return _vllm.fused_experts(moe, i["x"], i["w13"], i["w2"], i["topk_weights"], i["topk_ids"], quant_type=qt,
                                   quant_format=qf, w13_scale=i.get("w13_scale"), w2_scale=i.get("w2_scale"),
                                   config=cfg)

    check = verify_rows(p.inp, lambda: run_on(p.inp), "triton-experts", scheme=p.scheme,
                        conventions=vllm_conventions(qt), rerun=run_on if qf == "T" and p.m > 1 else None)
    yield p.case(f"vllm-{moe.version} fused_moe_kernel", lambda: run_on(p.inp), check,
                 columns={"config": source.removesuffix(".json")},
                 compare_to=("triton-experts", FAST, *GLUON) if qt == "fp8_w8a8" else ("triton-experts",))


def cases(device: str, shapes: list[str], schemes: list[tuple[str, str]] | None = None,
          against_vllm: str | None = None, m_values: tuple[int, ...] | None = None) -> Iterator[BenchCase]:
    """The timed configurations, made as they are consumed (one scheme's weights alive at a time)."""
    from harness.engine.interpreter import unverifiable_here
    from kernels import torch_grouped_mm as gk

    unverifiable_here()  # interpreting: install the fidelity fixes first (bf16 tl.dot is garbage without them)
    cuda = device.startswith("cuda")
    grouped_ok = cuda and gk.available() and torch.cuda.get_device_capability(device)[0] in (9, 10)
    from harness.commands.bench import _deepgemm

    deepgemm_ok = cuda and _deepgemm.missing(device) is None
    from kernels.gluon_experts import unavailable

    gluon_ok = cuda and not unavailable(device)
    moe = None
    if against_vllm:
        from harness.commands.bench import _vllm

        moe = _vllm.load(against_vllm)
    for name in shapes or list(SHAPES):
        s = dict(SHAPES[name])
        ms: tuple[int, ...] = m_values or M_VALUES
        if not cuda:  # interpreter smoke run
            s.update(E=min(s["E"], 16), K=256, N=128)
            ms = m_values or (1, 16)
        weights = _weights(s, device)
        for scheme in schemes or list(SCHEMES):
            qw = quantize_weights(weights, *scheme, device)
            for m in ms:
                p = _point(name, s, m, scheme, weights, qw, device)
                yield from _ours(p)
                if gluon_ok and scheme == ("fp8_w8a8", "G128"):
                    yield from _gluon(p)
                if grouped_ok and scheme[0] == "none":
                    def grouped(p=p) -> torch.Tensor:
                        return gk.grouped_mm_experts(*p.args)

                    yield p.case("torch-grouped-mm-experts", grouped,
                                 verify_rows(p.inp, grouped, "torch-grouped-mm-experts"))
                if moe is not None:
                    yield from _vllm_rows(p, moe)
                if deepgemm_ok and scheme == ("fp8_w8a8", "G128"):
                    features = {**_FEATURES, "quant_type": "fp8_w8a8", "quant_format": "G128"}
                    yield from _deepgemm.rows(p, features, verify_rows, ("triton-experts", FAST, *GLUON))
            del qw
        del weights
        if cuda:
            torch.cuda.empty_cache()
