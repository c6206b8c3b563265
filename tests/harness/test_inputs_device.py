"""A case's inputs are the same tensors whichever device builds them: a judge builds small cases on the CPU and large
ones on the GPU, and a failure found on one machine is replayed on another. Quantized experts' weights are
quantized by the oracle where they are, so its quantizer must give the same codes and scales on a GPU."""

from __future__ import annotations

import pytest
import torch

from harness import registry
from harness.core.case import Case
from harness.core.compare import bits  # bitwise: NaN poison in padding rows equals itself
from harness.engine import strategies as hs
from harness.ops import get as get_op

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="compares the CPU with a CUDA device")


def _one_case_per_scheme() -> list[Case]:
    adapter = registry.resolve("reference-experts")
    spec = get_op("experts")
    seen, found = set(), []
    for cell in hs.declared_cells(adapter):
        key = (cell["quant_type"], cell["quant_format"], cell["format"])
        if cell["quant_type"] == "none" or key in seen:
            continue
        seen.add(key)
        # the boundary case with several scale groups along K and N and an empty expert
        fields = max(spec.boundary(adapter, cell), key=lambda b: b["shapes"]["K"] * b["shapes"]["N"])
        found.append(Case(op="experts", adapter=adapter.name, features=dict(cell), seed=11, **fields))
    return found


def test_quantized_experts_inputs_are_the_same_on_the_cpu_and_the_gpu() -> None:
    cases = _one_case_per_scheme()
    assert len(cases) >= 10  # every scheme the oracle has, in both formats
    spec = get_op("experts")
    differ = []
    for case in cases:
        cpu, gpu = spec.make_inputs(case, "cpu"), spec.make_inputs(case, "cuda")
        assert cpu.keys() == gpu.keys(), case.features
        for name, t in cpu.items():
            g = gpu[name].cpu()
            if t.dtype != g.dtype or t.shape != g.shape or not torch.equal(bits(t), bits(g)):
                differ.append(f"{case.features['quant_type']}:{case.features['quant_format']} "
                              f"{case.features['format']} {name}")
    assert not differ, differ
