"""Where the judge builds a case and runs its oracle: on the CPU for a small case whose kernel runs in a kernel host
on a GPU (the GPU is left to the kernels), on the case's device otherwise; the verdict must not depend on it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness import ops
from harness.core.case import Case
from harness.core.device import detect
from harness.engine import runner
from harness.engine.hosted import manifest
from harness.engine.remote import from_manifest
from harness.registry import resolve

CASE = Case(op="experts", adapter="triton-experts", seed=3, shapes={"M": 5, "K": 32, "N": 16, "E": 4, "k": 2},
            features={"format": "standard", "quant_type": "none", "quant_format": "-", "activation": "silu",
                      "apply_weight_on_input": "N", "expert_map": "N", "dtype": "bfloat16", "bias": "N"},
            dtypes={"x": "bfloat16"})


def _judging(device: str, remote: bool = True) -> runner._Judging:
    adapter = resolve("triton-experts")
    if remote:  # as a sweep worker sees it: described by its host (the host itself is never asked here)
        adapter = from_manifest(manifest(adapter), "triton-experts", None)  # type: ignore[arg-type]
        adapter = dataclasses.replace(adapter, rule_kind=None)  # its rule would be asked of the host
    gpu = dataclasses.replace(detect("cpu"), device=device, generation="sm90", capability=(9, 0))
    return runner._Judging(CASE, adapter, gpu, None)


class _Recording:
    """The experts op, recording the device the judge asks for the inputs on (none is built)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def estimated_input_elements(self, case: Case) -> int:
        return ops.get("experts").estimated_input_elements(case)

    def make_inputs(self, case: Case, device: str) -> dict[str, torch.Tensor]:
        self.asked.append(device)
        return {}


def test_a_small_case_for_a_kernel_host_on_a_gpu_is_built_and_judged_on_the_cpu() -> None:
    judging, spec = _judging("cuda:0"), _Recording()
    judging.inputs(spec, CASE)  # type: ignore[arg-type]
    assert spec.asked == ["cpu"] and judging.where == "cpu" and not judging.used_device
    judging.inputs(spec, CASE.replace(seed=9))  # type: ignore[arg-type]  # fresh inputs of the same case
    assert spec.asked == ["cpu", "cpu"]


def test_a_large_case_is_built_on_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "CPU_JUDGED_ELEMENTS", 1000)
    judging, spec = _judging("cuda:0"), _Recording()
    judging.inputs(spec, CASE)  # type: ignore[arg-type]
    assert spec.asked == ["cuda:0"] and judging.where == "cuda:0" and judging.used_device


def test_an_in_process_kernel_is_judged_on_the_cases_device() -> None:
    judging, spec = _judging("cuda:0", remote=False), _Recording()
    judging.inputs(spec, CASE)  # type: ignore[arg-type]
    assert spec.asked == ["cuda:0"] and judging.where == "cuda:0" and judging.used_device


@pytest.mark.parametrize("batched", [False, True])
def test_the_experts_estimate_is_the_inputs_size_before_they_are_built(batched: bool) -> None:
    case = CASE if not batched else CASE.replace(features={**CASE.features, "format": "batched"},
                                                 shapes={"E": 4, "K": 32, "N": 16, "max_tokens": 3})
    built = ops.get("experts").make_inputs(case, "cpu")
    total = sum(t.numel() for t in built.values())
    estimate = ops.get("experts").estimated_input_elements(case)
    assert estimate <= total <= 1.05 * estimate, (estimate, total)
