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


def test_a_small_case_for_a_kernel_host_on_a_gpu_is_built_and_judged_on_the_cpu() -> None:
    judging = _judging("cuda:0")
    inputs = judging.inputs(ops.get("experts"), CASE)
    assert judging.where == "cpu" and not judging.used_device
    assert all(t.device.type == "cpu" for t in inputs.values())
    same = ops.get("experts").make_inputs(CASE, "cpu")  # what the case's device would have been given, bit for bit
    assert all(torch.equal(inputs[k], same[k]) for k in same)


def test_a_large_case_goes_to_the_device_with_its_strides(monkeypatch: pytest.MonkeyPatch) -> None:
    moved = []

    def to_device(t: torch.Tensor, device: str) -> torch.Tensor:
        moved.append(device)
        return runner.__dict__["_real_to_device"](t, "cpu")

    monkeypatch.setattr(runner, "CPU_JUDGED_ELEMENTS", 100)
    monkeypatch.setitem(runner.__dict__, "_real_to_device", runner._to_device)
    monkeypatch.setattr(runner, "_to_device", to_device)
    judging = _judging("cuda:0")
    inputs = judging.inputs(ops.get("experts"), CASE)
    assert judging.where == "cuda:0" and judging.used_device
    assert moved == ["cuda:0"] * len(inputs)


def test_moving_keeps_a_padded_row_stride() -> None:
    padded = torch.arange(24.0).reshape(4, 6)[:, :5]
    moved = runner._to_device(padded, "cpu")
    assert moved.stride() == padded.stride() and torch.equal(moved, padded)


def test_an_in_process_kernel_is_judged_on_the_cases_device() -> None:
    asked = []

    class Spec:  # records where the judge asks for the inputs
        def make_inputs(self, case: Case, device: str) -> dict[str, torch.Tensor]:
            asked.append(device)
            return {}

    judging = _judging("cuda:0", remote=False)
    judging.inputs(Spec(), CASE)  # type: ignore[arg-type]
    assert asked == ["cuda:0"] and judging.where == "cuda:0" and judging.used_device
