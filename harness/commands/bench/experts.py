"""`python -m harness bench --op experts [--shape deepseek-v3 ...]`: fused experts at model shapes.

Per (shape, M in 1..4096): our Triton path (`triton-experts`) and torch's grouped GEMM (`torch-grouped-mm-experts`,
sm90/sm100 only), each with the fp32 torch oracle timed beside it (`torch_ref_us`).

Roofline floor, in the case name: max(FLOPs / measured bf16 matmul rate, bytes / measured copy bandwidth), where
FLOPs = 6 M k N K (both GEMMs) and bytes = the weights of the experts the routing actually hits plus x and out.
Both rates are measured here, on the same device, once per run (a large bf16 matmul; a 1 GiB copy, read + write).
The target (bf16): kernel time <= floor / 0.8 for M <= 256, <= floor / 0.55 at M = 4096 ("% of floor" >= 80 / 55).
Both adapters are timed as CUDA-graph replays (`kernel_us`, the GPU time) and as eager Python calls (`eager_us`):
neither synchronizes with the host, so both are capturable.

Each case has a `verify` closure: the output rows of a sample of tokens (the first 8 and the last) are judged
against the op spec's oracle and error bound (harness.ops.experts.expected, fp64) on the sub-problem of the
experts those tokens use, so the fp64 oracle stays small at E=256.
On a CPU the Triton kernels run in the interpreter: real shapes would take hours, so a small smoke shape is used.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from harness.commands.bench import SHAPES, BenchCase, copy_bandwidth, do_bench
from harness.core.case import Case
from harness.core.compare import compare_bounded

M_VALUES = (1, 16, 64, 256, 1024, 4096)
_FEATURES = {"format": "standard", "quant_type": "none", "quant_format": "-", "activation": "silu",
             "apply_weight_on_input": "N", "expert_map": "N", "dtype": "bfloat16", "bias": "N"}


@functools.cache
def matmul_rate(device: str) -> float:
    """Measured bf16 dense matmul rate in FLOP/s (8192^3, cuBLAS)."""
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    return 2 * n**3 / do_bench(lambda: a @ b, device)


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


def verify_rows(inputs: dict[str, torch.Tensor], out: Callable[[], torch.Tensor], adapter: str,
                rows: list[int] | None = None) -> Callable[[], str | None]:
    """Judge sample rows of a full-size output (default: the first 8 and the last) against the oracle on the
    sub-problem of their experts: returns a check, None when it passes, else the reason."""

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
        sub = {"x": inputs["x"][picked], "w13": inputs["w13"][used], "w2": inputs["w2"][used],
               "topk_weights": inputs["topk_weights"][picked], "topk_ids": local.to(torch.int32)}
        case = Case(op="experts", adapter=adapter, features=_FEATURES, seed=0,
                    shapes={"M": len(picked), "E": len(used), "k": ids.shape[1], "K": sub["x"].shape[1],
                            "N": sub["w2"].shape[2]}, dtypes={"x": "bfloat16"})
        (chk,) = spec.expected(case, sub, registry.resolve(adapter).conventions)
        cmp = compare_bounded("out", got[picked], chk.expected, chk.bound)
        return None if cmp.passed else cmp.reason

    return check


def cases(device: str, shapes: list[str]) -> list[BenchCase]:
    from harness.engine.interpreter import unverifiable_here
    from kernels import torch_grouped_mm as gk
    from kernels.fused_experts import fused_experts
    from reference.experts import fused_experts as oracle

    unverifiable_here()  # interpreting: install the fidelity fixes first (bf16 tl.dot is garbage without them)
    cuda = device.startswith("cuda")
    names = shapes or list(SHAPES)
    grouped_ok = cuda and gk.available() and torch.cuda.get_device_capability(device)[0] in (9, 10)
    rate = matmul_rate(device) if cuda else 0.0
    bw = _copy_bw(device) if cuda else 0.0
    found: list[BenchCase] = []
    for name in names:
        s = dict(SHAPES[name])
        m_values: tuple[int, ...] = M_VALUES
        if not cuda:  # interpreter smoke run
            s.update(E=min(s["E"], 16), K=64, N=32)
            m_values = (1, 16)
        weights = _weights(s, device)
        for m in m_values:
            inp = _inputs(s, m, weights, device)
            out = torch.empty_like(inp["x"])
            args = (inp["x"], inp["w13"], inp["w2"], inp["topk_weights"], inp["topk_ids"])
            active = int(torch.unique(inp["topk_ids"]).numel())
            weight_bytes = active * 3 * s["N"] * s["K"] * 2
            nbytes = weight_bytes + 2 * m * s["K"] * 2
            flops = 6 * m * s["k"] * s["N"] * s["K"]
            floor = max(flops / rate, nbytes / bw) if cuda else math.nan
            label = f"{name} M={m} floor={floor * 1e6:.1f}us"

            def ours(args=args, out=out) -> torch.Tensor:
                return fused_experts(*args, out=out)

            def ref(args=args) -> torch.Tensor:
                return oracle(*args)

            found.append(BenchCase(name=label, adapter="triton-experts", kernel=ours, reference=ref,
                                   bytes_moved=nbytes, flops=flops, verify=verify_rows(inp, ours, "triton-experts"),
                                   graph=True, floor_s=floor if cuda else 0.0))
            if grouped_ok:
                def theirs(args=args) -> torch.Tensor:
                    return gk.grouped_mm_experts(*args)

                found.append(BenchCase(name=label, adapter="torch-grouped-mm-experts", kernel=theirs,
                                       bytes_moved=nbytes, flops=flops,
                                       verify=verify_rows(inp, theirs, "torch-grouped-mm-experts"),
                                       graph=True, floor_s=floor))
    return found
