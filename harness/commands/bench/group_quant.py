"""Benchmarks of op `group_quant`: the Triton kernel against the torch oracle at DeepSeek-V3 activation sizes.

K = 7168 (hidden size), M = 4096 and 16384 tokens (16 off the GPU: a smoke run), bf16 input. Memory bound:
bytes_moved = read x once + write codes + write scales (the per-tensor unit reads x twice by construction - amax,
then quant - so its % of copy bandwidth is at most about 3/5 of what a one-pass stage reaches).
"""

from __future__ import annotations

import torch

from harness.commands.bench import SHAPES, BenchCase
from harness.ops import group_quant as spec
from kernels.group_quant import group_quant
from reference.quant import quantize

#: (name, cell features) of the timed configurations
CONFIGS: tuple[tuple[str, dict[str, str]], ...] = tuple(
    (name, {"quant_dtype": qd, "unit": unit, "group_size": gs, "scale_rule": rule, "scale_layout": layout,
            "input_dtype": "bfloat16"})
    for name, qd, unit, gs, rule, layout in (
        ("fp8 g128 float row_major", "fp8_e4m3fn", "group", "128", "float", "row_major"),
        ("fp8 g128 float column_major_tma", "fp8_e4m3fn", "group", "128", "float", "column_major_tma"),
        ("fp8 g128 ue8m0 packed_ue8m0", "fp8_e4m3fn", "group", "128", "ue8m0", "packed_ue8m0"),
        ("int8 g128 float row_major", "int8", "group", "128", "float", "row_major"),
        ("fp8 per-token", "fp8_e4m3fn", "token", "-", "float", "row_major"),
        ("fp8 per-tensor", "fp8_e4m3fn", "tensor", "-", "float", "row_major"),
    )
)


def _kwargs(f: dict[str, str]) -> dict[str, object]:
    return {"dtype": f["quant_dtype"], "unit": f["unit"],
            "group_size": int(f["group_size"]) if f["unit"] == "group" else 128,
            "scale_rule": f["scale_rule"], "layout": f["scale_layout"]}


def _verify(x: torch.Tensor, f: dict[str, str]) -> str | None:
    """None when the kernel's codes and scales equal the oracle's bitwise on x, else the reason."""
    from harness.core.compare import compare_exact

    codes, scales = group_quant(x, **_kwargs(f))  # type: ignore[arg-type]
    want_codes, want_scales = spec.oracle(x, f, on_device=True)
    bad = [c.reason for c in (compare_exact("codes", codes, want_codes), compare_exact("scales", scales, want_scales))
           if not c.passed]
    return "; ".join(bad) or None


def cases(device: str, shapes: list[str]) -> list[BenchCase]:
    k = SHAPES["deepseek-v3"]["K"]
    ms = sorted({SHAPES[s]["M"] for s in shapes if s in SHAPES} | {4096, 16384})
    if not device.startswith("cuda"):
        from harness.engine.interpreter import unverifiable_here

        unverifiable_here()  # the interpreter's fidelity fixes (its own fp8 cast loses the rounding carry)
        ms = [16]  # a smoke run of every configuration, not a timing
    found = []
    for m in ms:
        g = torch.Generator(device=device).manual_seed(0)
        x = torch.randn((m, k), generator=g, device=device).to(torch.bfloat16)
        for name, f in CONFIGS:
            kw = _kwargs(f)
            codes, scales = group_quant(x, **kw)  # type: ignore[arg-type]
            recipe = spec.recipe(f)
            scale_bytes = scales.numel() * scales.element_size()
            found.append(BenchCase(
                name=f"{name} M={m} K={k}", adapter="triton-group-quant",
                kernel=lambda x=x, kw=kw, codes=codes, scales=scales: group_quant(x, out=codes, scales=scales, **kw),
                reference=lambda x=x, recipe=recipe: quantize(x, recipe),
                bytes_moved=x.numel() * x.element_size() + codes.numel() + scale_bytes,
                verify=lambda x=x, f=f: _verify(x, f),
            ))
    return found
