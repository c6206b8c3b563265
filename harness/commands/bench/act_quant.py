"""Benchmarks of op `act_quant`: the fused Triton activation + per-token-group fp8 quant at DeepSeek-V3 sizes.

T = 4096 tokens x top-8 = 32768 rows, N = 2048 and N = 512, bf16 input, silu_and_mul, group 128, in the three
layouts production uses: float scales row-major (vLLM), float scales TMA-aligned column-major (DeepGEMM on
Hopper), ue8m0 packed int32 (DeepGEMM on Blackwell). Memory bound: bytes_moved = read x [T, 2N] once + write
codes [T, N] (1 byte each) + write the scales. Target: >= 70% of the copy bandwidth measured in the same run.

`reference` times the torch oracle path (reference.activations in fp32, then reference.quant.quantize) on the
device when the quant oracle runs there, else on the CPU (said in the case name). `verify` judges the kernel's
full-size outputs on a sample of rows (the first and last 64) with the `act_quant` op spec (scales and codes within
the activation's error-bound window). Off the GPU: a smoke run with T = 16.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from harness.commands.bench import BenchCase
from harness.core.case import Case

T = 4096 * 8
WIDTHS = (2048, 512)
#: (scale rule, scale layout) of the timed configurations, group size 128
CONFIGS = (("float", "row_major"), ("float", "column_major_tma"), ("ue8m0", "packed_ue8m0"))
SAMPLE = 64
ADAPTER = "triton-act-quant"


def _features(rule: str, layout: str) -> dict[str, str]:
    return {"activation": "silu_and_mul", "dtype": "bfloat16", "group_size": "128", "scale_rule": rule,
            "scale_layout": layout, "clamp_limit": "N"}


@functools.cache
def _oracle_device(device: str) -> str:
    """`device` when reference.quant.quantize runs on it, else "cpu"."""
    from reference.quant import QuantRecipe, quantize

    try:
        quantize(torch.ones((2, 128), device=device), QuantRecipe())
        return device
    except Exception:  # the oracle mixes devices somewhere: time it on the CPU instead
        return "cpu"


def _verify(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, features: dict[str, str],
            run: Callable[[], object]) -> Callable[[], str | None]:
    def check() -> str | None:
        from harness import registry
        from harness.ops import act_quant as spec

        run()
        t = x.shape[0]
        rows = torch.tensor(sorted(set(range(min(t, SAMPLE))) | set(range(max(0, t - SAMPLE), t))), device=x.device)
        sub = x[rows].cpu()
        case = Case(op="act_quant", adapter=ADAPTER, features=features,
                    shapes={"T": sub.shape[0], "N": codes.shape[1]}, dtypes={"x": "bfloat16"})
        outs = {"codes": codes[rows].cpu(), "scales": scales[rows].cpu()}
        bad = []
        for chk in spec.expected(case, {"x": sub}, registry.resolve(ADAPTER).conventions):
            verdict = chk.judge(outs[chk.name], outs)
            if not verdict.passed:
                bad.append(verdict.reason)
        return "; ".join(bad) or None

    return check


def cases(device: str, shapes: list[str]) -> list[BenchCase]:
    from harness.ops.act_quant import recipe_of
    from kernels.act_quant import act_quant
    from reference.activations import apply_activation
    from reference.quant import quantize

    t = T
    if not device.startswith("cuda"):
        from harness.engine.interpreter import unverifiable_here

        unverifiable_here()  # interpreter fidelity fixes (bf16 casts, fp8 casts)
        t = 16  # smoke run
    odev = _oracle_device(device)
    found = []
    for n in WIDTHS:
        g = torch.Generator(device=device).manual_seed(n)
        x = (torch.randn((t, 2 * n), generator=g, device=device) * 3).to(torch.bfloat16)
        x_oracle = x if odev == device else x.cpu()
        for rule, layout in CONFIGS:
            f = _features(rule, layout)
            codes, scales = act_quant(x, scale_rule=rule, scale_layout=layout)  # allocates in the layout
            recipe = recipe_of(Case(op="act_quant", adapter=ADAPTER, features=f, shapes={"T": t, "N": n}), {})

            def kernel(x: torch.Tensor = x, c: torch.Tensor = codes, s: torch.Tensor = scales, rule: str = rule,
                       layout: str = layout) -> None:
                act_quant(x, scale_rule=rule, scale_layout=layout, codes=c, scales=s)

            def reference(xo: torch.Tensor = x_oracle, recipe: object = recipe) -> object:
                return quantize(apply_activation("silu_and_mul", xo, out_dtype=torch.float32), recipe)

            nbytes = x.numel() * x.element_size() + codes.numel() + scales.numel() * scales.element_size()
            where = "" if odev == device else " (torch oracle on cpu)"
            found.append(BenchCase(
                name=f"silu_and_mul+fp8 g128 {rule} {layout} T={t} N={n}{where}", adapter=ADAPTER, kernel=kernel,
                reference=reference, bytes_moved=nbytes, verify=_verify(x, codes, scales, f, kernel)))
    return found
