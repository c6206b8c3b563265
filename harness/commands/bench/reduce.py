"""Benchmarks of op `reduce`: the Triton unpermute-reduce against the torch oracle.

DeepSeek-V3: M = 4096 tokens, k = 8, K = 7168, bf16 (plus the other --shape models' M, k, K). Memory bound:
bytes_moved = expert_out read once (M*k*K elements) + weights + out written once; the target is >= 70% of the
copy bandwidth measured in the same run. Configurations: fp32 accumulation with weights, with an expert map
(EP 1/8: 7/8 of the rows are never read, so bytes_moved counts only the rows read), and vLLM's sequential
output-dtype accumulation. `verify` judges the kernel's output with the op's own error bound (fp32) or bitwise
against the oracle (sequential).
Off the GPU: a smoke run at tiny sizes (the interpreter), not a timing.
"""

from __future__ import annotations

import torch

from harness.commands.bench import SHAPES, BenchCase
from harness.core.errors import UNIT_ROUNDOFF
from kernels.reduce import unpermute_reduce
from reference import reduce as ref


def _verify(y: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, emap: torch.Tensor | None, acc: str,
            factor: float) -> str | None:
    got = unpermute_reduce(y, w, ids, accumulation=acc, expert_map=emap, routed_scaling_factor=factor)
    kw = {"expert_map": emap, "routed_scaling_factor": factor}
    if acc == "output_dtype_sequential":
        want = ref.unpermute_reduce(y, w, ids, accumulation=ref.ReduceAccumulation(acc), **kw)
        n = int((got.view(torch.int16) != want.view(torch.int16)).sum())
        return f"{n} elements differ bitwise from the oracle's sequence" if n else None
    want = ref.unpermute_reduce(y.double(), w, ids, out_dtype=torch.float64, **kw)
    mag = ref.unpermute_reduce(y.double().abs(), w, ids, out_dtype=torch.float64, **kw)
    k = y.shape[1]
    bound = 4 * UNIT_ROUNDOFF["float32"] * k**0.5 * mag + UNIT_ROUNDOFF[str(y.dtype).removeprefix("torch.")] * (
        want.abs()) + 1e-30
    ratio = float(((got.double() - want).abs() / bound).max()) if got.numel() else 0.0
    return None if ratio <= 1 else f"error/bound {ratio:.3g}"


def cases(device: str, shapes: list[str]) -> list[BenchCase]:
    sizes = [(s, SHAPES[s]["M"], SHAPES[s]["k"], SHAPES[s]["K"], SHAPES[s]["E"]) for s in (shapes or ["deepseek-v3"])
             if s in SHAPES]
    if not device.startswith("cuda"):
        from harness.engine.interpreter import unverifiable_here

        unverifiable_here()  # the interpreter's bf16 cast fixes
        sizes = [("smoke", 16, 8, 256, 64)]
    found = []
    for label, m, k, hidden, e in sizes:
        g = torch.Generator(device=device).manual_seed(0)
        y = torch.randn((m, k, hidden), generator=g, device=device).to(torch.bfloat16)
        w = torch.rand((m, k), generator=g, device=device).softmax(dim=1)
        ids = torch.rand((m, e), generator=g, device=device).topk(k, dim=1).indices.to(torch.int32)
        emap = torch.full((e,), -1, dtype=torch.int32, device=device)
        emap[: e // 8] = torch.arange(e // 8, dtype=torch.int32, device=device)
        rows_read = int((emap[ids.long()] >= 0).sum())
        for acc, mapped, factor in (("fp32", False, 1.0), ("fp32", False, 2.5), ("fp32", True, 1.0),
                                    ("output_dtype_sequential", False, 1.0)):
            em = emap if mapped else None
            rows = rows_read if mapped else m * k
            nbytes = rows * hidden * y.element_size() + w.numel() * 4 + m * hidden * y.element_size()
            if mapped:
                nbytes += ids.numel() * 4

            def kernel(y=y, w=w, ids=ids, em=em, acc=acc, factor=factor):  # type: ignore[no-untyped-def]
                return unpermute_reduce(y, w, ids, accumulation=acc, expert_map=em, routed_scaling_factor=factor)

            def reference(y=y, w=w, ids=ids, em=em, acc=acc, factor=factor):  # type: ignore[no-untyped-def]
                return ref.unpermute_reduce(y, w, ids, accumulation=ref.ReduceAccumulation(acc), expert_map=em,
                                            routed_scaling_factor=factor)

            found.append(BenchCase(
                name=f"{label} M={m} k={k} K={hidden} bf16 {acc}" + (f" x{factor}" if factor != 1 else "")
                + (" EP 1/8" if mapped else ""),
                adapter="triton-reduce", kernel=kernel, reference=reference, bytes_moved=nbytes,
                verify=lambda y=y, w=w, ids=ids, em=em, acc=acc, factor=factor: _verify(y, w, ids, em, acc, factor)))
    return found
