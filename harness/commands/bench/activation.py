"""Benchmarks of op `activation`: the Triton gated activations at DeepSeek-V3 MoE sizes.

T = 4096 tokens x top-8 = 32768 rows (the GEMM1 output of one layer's routed tokens), N = 2048 and N = 512
(DeepSeek-V3's expert intermediate size), bf16. Memory bound: bytes_moved = read x [T, 2N] once + write out [T, N].
Target: >= 70% of the copy bandwidth measured in the same run (column "% of copy").

`reference` times the torch oracle (reference.activations, fp32 then one rounding) on the same device. `verify`
judges the kernel's full-size output on a sample of rows (the first and last 64, where int64 row offsets matter)
with the `activation` op spec's oracle and error bound. Off the GPU the kernels run in the interpreter: a smoke run
with T = 16.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from harness.commands.bench import BenchCase
from harness.core.case import Case
from harness.core.compare import compare_bounded

T = 4096 * 8
WIDTHS = (2048, 512)
#: (activation, widths it is timed at): silu_and_mul is DeepSeek's; the others at N = 2048 for the other formulas
CONFIGS = (("silu_and_mul", WIDTHS), ("gelu_tanh_and_mul", (2048,)), ("swigluoai", (2048,)))
SAMPLE = 64


def _rows(t: int) -> torch.Tensor:
    return torch.tensor(sorted(set(range(min(t, SAMPLE))) | set(range(max(0, t - SAMPLE), t))))


def _verify(x: torch.Tensor, out: torch.Tensor, act: str, run: Callable[[], object]) -> Callable[[], str | None]:
    def check() -> str | None:
        from harness import registry
        from harness.ops import activation as spec

        run()
        rows = _rows(x.shape[0]).to(x.device)
        sub = x[rows].cpu()
        case = Case(op="activation", adapter="triton-activation", features={"activation": act, "dtype": "bfloat16"},
                    shapes={"T": sub.shape[0], "N": out.shape[1]}, dtypes={"x": "bfloat16"})
        (chk,) = spec.expected(case, {"x": sub}, registry.resolve("triton-activation").conventions)
        cmp = compare_bounded("out", out[rows].cpu(), chk.expected, chk.bound)
        return None if cmp.passed else cmp.reason

    return check


def cases(device: str, shapes: list[str]) -> list[BenchCase]:
    from kernels.activation import PARAMS, gated_activation
    from reference.activations import apply_activation

    t = T
    if not device.startswith("cuda"):
        from harness.engine.interpreter import unverifiable_here

        unverifiable_here()  # interpreter fidelity fixes (bf16 casts, libdevice)
        t = 16  # smoke run: the interpreter takes seconds per program
    found = []
    for act, widths in CONFIGS:
        params = dict(PARAMS.get(act, {}))
        for n in widths:
            g = torch.Generator(device=device).manual_seed(n)
            x = (torch.randn((t, 2 * n), generator=g, device=device) * 3).to(torch.bfloat16)
            out = torch.empty((t, n), dtype=torch.bfloat16, device=device)

            def kernel(x: torch.Tensor = x, out: torch.Tensor = out, act: str = act, params: dict = params) -> None:
                gated_activation(x, act, out=out, **params)

            def reference(x: torch.Tensor = x, act: str = act) -> torch.Tensor:
                return apply_activation(act, x)

            found.append(BenchCase(
                name=f"{act} T={t} N={n} bf16", adapter="triton-activation", kernel=kernel, reference=reference,
                bytes_moved=x.numel() * x.element_size() + out.numel() * out.element_size(),
                verify=_verify(x, out, act, kernel)))
    return found
