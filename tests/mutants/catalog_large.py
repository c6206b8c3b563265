"""Planted bugs only a case past 2**31 elements catches (`harness.ops.large`): GPU-only, judged by
tests/mutants/test_large_mutants.py under the `gpu` profile's large-offsets case (the CPU cannot hold one; there
the test is skipped with the reason)."""

from __future__ import annotations

from tests.mutants.build import Mutant, Patch

LARGE_MUTANTS: tuple[Mutant, ...] = (
    Mutant("group-quant-int32-row-offsets", "triton-group-quant", "kernels.group_quant", (
        Patch("return rows.to(tl.int64) * stride", "return rows * stride"),),
        "row offsets computed in int32 (rows * stride wraps past 2**31 elements: reads and writes out of bounds)",
        {"unit": ("group",)}),
    Mutant("experts-int32-expert-offsets", "triton-experts", "kernels.fused_experts", (
        Patch("e64 = e.to(tl.int64)", "e64 = e"),),
        "expert offsets computed in int32 (expert * stride_e wraps once an expert's weights start past 2**31 "
        "elements: the tokens of the last experts read another expert's weights or out of bounds)"),
)
