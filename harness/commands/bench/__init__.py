"""`python -m harness bench --op OP`: timings on the GPU (never asserted in tests).

Each op's benchmarks live in `harness/commands/bench/<op>.py`, which defines `cases(device, shapes)`, the
`BenchCase`s: closures over pre-made inputs, our kernel and what it is compared with (the torch reference, vLLM's
kernel, ...). The cases of one point (one name) are timed together in interleaved rounds, by eager calls and, for
cases marked `graph` (the experts), by CUDA-graph replays; each method's median, its spread over the rounds, and a
re-time when the two disagree (`_timing`). Memory-bound stages are reported in GB/s against the copy bandwidth
measured on the same device in the same run, compute-bound ones in TFLOP/s. `first_call_s` is a row's first call
(JIT compiles), `verify_s` its verification, `time_s` its timing.

`--op reference-experts` times the reference experts oracle at model shapes: it must be fast enough to be the oracle
for real shapes (DeepSeek-V3-like M=4096, E=256, k=8, K=7168, N=512 in well under a second on one GPU).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import pkgutil
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from harness.core.device import prepare_interpreter

SHAPES = {
    "deepseek-v3": {"M": 4096, "E": 256, "k": 8, "K": 7168, "N": 512},
    "mixtral-tp2": {"M": 4096, "E": 8, "k": 2, "K": 4096, "N": 7168},
    "qwen3-30b-a3b": {"M": 4096, "E": 128, "k": 8, "K": 2048, "N": 768},
}

#: (quant_type, quant_format) of every experts scheme our kernel ships, unquantized first (here, not in
#: the experts module, which imports torch: the command line checks --quant first)
SCHEMES = (("none", "-"), ("fp8_w8a8", "G128"), ("fp8_w8a8", "A"), ("fp8_w8a8", "T"), ("int8_w8a8", "A"),
           ("int8_w8a8", "T"), ("w8a16", "A"), ("w8a16", "G128"), ("w8a16_zp", "G128"), ("w4a16", "A"),
           ("w4a16", "G128"), ("w4a16_zp", "G128"))


def parse_schemes(values: list[str]) -> list[tuple[str, str]]:
    """`--quant` values (`none`, `fp8_w8a8:G128`, ..., or `all`; default all) -> schemes, in SCHEMES order."""
    if not values or "all" in values:
        return list(SCHEMES)
    known = {(f"{qt}:{qf}" if qt != "none" else "none"): (qt, qf) for qt, qf in SCHEMES}
    bad = [v for v in values if v not in known]
    if bad:
        raise ValueError(f"--quant: unknown scheme(s) {bad}; known: all, {', '.join(known)}")
    return [sch for key, sch in known.items() if key in values]


@dataclass
class BenchCase:
    """One timed configuration: `kernel()` and `reference()` run once each on inputs made beforehand.

    bytes_moved: the minimum HBM traffic of the op (inputs read once + outputs written once), for GB/s.
    flops: for compute-bound ops (0: not reported).
    verified: whether the same process verified this kernel configuration (set by `verify`, if given).
    """

    name: str
    adapter: str
    kernel: Callable[[], Any]
    reference: Callable[[], Any] | None = None
    bytes_moved: int = 0
    flops: int = 0
    verify: Callable[[], str | None] | None = None  # None -> ok, else the reason it failed
    #: time a CUDA graph of `kernel()` too (GPU time without Python launch overhead, as serving engines run
    #: decode); `kernel` must then be capturable: no host synchronization
    graph: bool = False
    #: the roofline floor in seconds (0: not reported); the row gets "% of floor" = floor / time
    floor_s: float = 0.0
    #: more columns for the row (e.g. which floor bounds it, the config a comparison kernel ran)
    extra: dict[str, Any] | None = None
    #: adapters timed earlier on the same case: the row gets "vs <adapter>" = this time / that one's
    compare_to: tuple[str, ...] = ()


def do_bench(fn: Callable[[], Any], device: str) -> float:
    """Median seconds of `fn` (triton's do_bench on CUDA; perf_counter loop elsewhere)."""
    if device.startswith("cuda"):
        from triton.testing import do_bench as _tb

        return float(_tb(fn, warmup=25, rep=100, return_mode="median")) / 1e3
    return _time(fn, device)


def do_bench_graph(fn: Callable[[], Any], reps: int = 50) -> float:
    """Median seconds of one replay of a CUDA graph that holds one call of `fn`, with L2 flushed before each
    replay (as do_bench does): the GPU time of the kernels, without the Python launch overhead."""
    from harness.commands.bench._timing import CudaClock

    fn()  # warm-up: JIT compiles, allocator growth
    fn()
    clock = CudaClock(reps)
    return clock.graph(clock.capture(fn))


def copy_bandwidth(device: str, nbytes: int = 1 << 30) -> float:
    """Measured device-to-device copy bandwidth in bytes/s (read + write counted), on a buffer far beyond L2."""
    import torch

    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    t = do_bench(lambda: dst.copy_(src), device)
    return 2 * nbytes / t


def _time(fn: Callable[[], Any], device: str, reps: int = 3) -> float:
    import torch

    fn()  # warm-up
    times = []
    for _ in range(reps):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def bench_reference_experts(device: str, shapes: list[str], dtype: Any = None) -> list[dict]:
    """Times of the reference experts oracle at model shapes (`dtype`: of x and the weights, default bfloat16)."""
    import torch

    from reference.experts import fused_experts

    dtype = dtype or torch.bfloat16

    rows = []
    for name in shapes:
        s = SHAPES[name]
        g = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(s["M"], s["K"], generator=g, device=device).to(dtype)
        w13 = (torch.randn(s["E"], 2 * s["N"], s["K"], generator=g, device=device) / s["K"] ** 0.5).to(dtype)
        w2 = (torch.randn(s["E"], s["K"], s["N"], generator=g, device=device) / s["N"] ** 0.5).to(dtype)
        logits = torch.randn(s["M"], s["E"], generator=g, device=device)
        w, ids = torch.topk(logits.softmax(-1), s["k"], dim=-1)
        ids = ids.to(torch.int32)
        for compute in (torch.float32,):
            t = _time(lambda: fused_experts(x, w13, w2, w, ids, compute_dtype=compute), device)  # noqa: B023
            flops = 2 * s["M"] * s["k"] * (2 * s["N"] * s["K"] + s["K"] * s["N"])
            rows.append({"shape": name, **s, "compute": str(compute).removeprefix("torch."), "median_s": t,
                         "tflops": flops / t / 1e12})
    return rows


def bench_ops() -> list[str]:
    """Ops that have benchmarks (modules of harness/benchmarks)."""
    import harness.commands.bench as pkg

    return sorted(i.name for i in pkgutil.iter_modules(pkg.__path__) if not i.name.startswith("_"))


def run_cases(cases: Iterable[BenchCase], device: str, out: Any = None) -> list[dict]:
    """Time every case; the consecutive cases of one name (a point: ours and the kernels compared with it) are timed
    together in interleaved rounds by graph replay and by eager calls (`_timing`). A point whose kernel raises gets
    the error in its rows, the other points still run."""
    from harness.commands.bench import _timing

    cuda = device.startswith("cuda")
    bw = copy_bandwidth(device) if cuda else 0.0
    clock: _timing.Clock = _timing.CudaClock() if cuda else _timing.HostClock()
    rows: list[dict] = []
    for _, point in itertools.groupby(cases, key=lambda c: c.name):
        point = list(point)
        found = [_verified_row(c, cuda) for c in point]
        t0 = time.perf_counter()
        live = [(c, row) for c, row in zip(point, found, strict=True) if "error" not in row]
        try:
            timings = _timing.time_point([c.kernel for c, _ in live], [c.graph and cuda for c, _ in live], clock)
        except Exception as e:  # one failing kernel must not hide the other points
            for _, row in live:
                row["error"] = f"{type(e).__name__}: {e}"[:200]
            timings = []
        spent = (time.perf_counter() - t0) / max(len(live), 1)
        for (_, row), timing in zip(live, timings, strict=False):
            row.update(timing.columns())
            row["time_s"] = spent
        for c, row in live:
            if "kernel_us" not in row:
                continue
            _rates(c, row, bw, rows + found)
            if c.reference is not None:
                tr = do_bench(c.reference, device)
                row["torch_ref_us"] = tr * 1e6
                row["speedup"] = tr * 1e6 / row["kernel_us"]
        for row in found:
            rows.append(row)
            if out is not None:
                print(f"  {row['case']}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                     for k, v in row.items() if k != "case"), file=out, flush=True)
    if bw:
        rows.append({"case": "device copy bandwidth (measured)", "adapter": "-", "GB/s": bw / 1e9})
    return rows


def _verified_row(c: BenchCase, cuda: bool) -> dict[str, Any]:
    """The row of a case with its first call (`first_call_s`: JIT compiles) and its verification (`verify_s`);
    `error` when either raised."""
    row: dict[str, Any] = {"case": c.name, "adapter": c.adapter, **(c.extra or {})}

    def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
        t0 = time.perf_counter()
        found = fn()
        if cuda:
            import torch

            torch.cuda.synchronize()
        return found, time.perf_counter() - t0

    try:
        row["first_call_s"] = timed(c.kernel)[1]
        why, spent = timed(c.verify) if c.verify is not None else (None, 0.0)
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"[:200]
        return row
    row["verified"] = "yes" if c.verify is not None and why is None else ("no: " + why if why else "not run")
    if c.verify is not None:
        row["verify_s"] = spent
    return row


def _rates(c: BenchCase, row: dict[str, Any], bw: float, earlier: list[dict]) -> None:
    """Roofline, bandwidth and FLOP rate columns, and `vs <adapter>` (graph times; `(eager)` by eager calls) against
    the named adapters timed on the same point."""
    t = row["kernel_us"] / 1e6
    if c.floor_s:
        row["% of floor"] = 100 * c.floor_s / t
    if c.bytes_moved:
        row["GB/s"] = c.bytes_moved / t / 1e9
        if bw:
            row["% of copy"] = 100 * c.bytes_moved / t / bw
    if c.flops:
        row["TFLOP/s"] = c.flops / t / 1e12
    for other in c.compare_to:
        base = next((r for r in reversed(earlier) if r["case"] == c.name and r["adapter"] == other
                     and "kernel_us" in r), None)
        if base is not None:
            row[f"vs {other}"] = row["kernel_us"] / base["kernel_us"]
            if base.get("timing") == "graph" and row.get("timing") == "graph":
                row[f"vs {other} (eager)"] = row["eager_us"] / base["eager_us"]


def main_bench(op: str, device: str, shapes: list[str], options: dict[str, Any] | None = None) -> int:
    from tabulate import tabulate

    if op == "reference-experts":
        rows = bench_reference_experts(device, shapes)
        print(tabulate(rows, headers="keys", floatfmt=".4g", tablefmt="github"))
        return 0
    known = bench_ops()
    if op not in known:
        print(f"error: unknown bench op {op!r}; available: reference-experts, {', '.join(known)}", file=sys.stderr)
        return 2
    if not device.startswith("cuda"):
        print(f"note: timing on {device}: Triton kernels run in the interpreter here, numbers are not meaningful",
              file=sys.stderr)
    module = importlib.import_module(f"harness.commands.bench.{op}")
    cases = module.cases(device, shapes, **(options or {}))
    rows = run_cases(cases, device, out=sys.stderr)
    print(tabulate(rows, headers="keys", floatfmt=".4g", tablefmt="github"))
    return exit_code(rows)


def exit_code(rows: list[dict]) -> int:
    """1 when a timed kernel raised or failed its verification (unverified variants, e.g. CUDA-graph replays of a
    verified configuration, do not count), else 0."""
    return 1 if any("error" in r or str(r.get("verified", "")).startswith("no:") for r in rows) else 0


# -- command line -------------------------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> int:
    """The arguments were checked before (`harness.commands.usage`: op, shapes, the experts' options)."""
    prepare_interpreter(args.device)

    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    options: dict[str, Any] = {}
    if args.op == "experts":
        options["schemes"] = parse_schemes(args.quant)
        if args.against_vllm:
            options["against_vllm"] = args.against_vllm
        if args.m:
            options["m_values"] = tuple(args.m)
    if args.op not in ("reference-experts",) and args.shape == []:
        return main_bench(args.op, device, [], options)
    return main_bench(args.op, device, args.shape or ["deepseek-v3"], options)


def _names(text: str) -> list[str]:
    """A flag's value: one name or a comma-separated list of them."""
    return [t.strip() for t in text.split(",") if t.strip()]


def _counts(text: str) -> list[int]:
    try:
        return [int(t) for t in _names(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected token counts (integers, comma-separated), got {text!r}") from None


def add_parser(sub: Any) -> None:
    """Add the command to the `python -m harness` subparsers."""
    b = sub.add_parser("bench", help="time kernels (or the oracle) on this device")
    b.add_argument("--op", required=True, help="what to time: an op (routing, group_quant, ...) or reference-experts")
    b.add_argument("--device", default="auto")
    b.add_argument("--shape", action="extend", type=_names, default=[],
                   help="model shape(s): deepseek-v3, mixtral-tp2, ... (comma-separated or repeated)")
    b.add_argument("--quant", action="extend", type=_names, default=[],
                   help="experts: scheme(s) to time (none, fp8_w8a8:G128, ..., all; comma-separated or repeated; "
                        "default: none)")
    b.add_argument("--against-vllm", metavar="PATH", default=None,
                   help="experts: also time vLLM's Triton fused_moe_kernel loaded from this wheel or source tree")
    b.add_argument("--m", action="extend", type=_counts, default=[],
                   help="experts: token counts (comma-separated or repeated; default 1..4096)")
    b.set_defaults(func=run)
