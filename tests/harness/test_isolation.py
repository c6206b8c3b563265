"""A kernel cannot fool the judge or change another kernel's verdict through the process they share.

Each hostile adapter computes the right answer (it runs the reference) but also changes process state the oracle or
later cases depend on. Its own case must fail, naming what it changed; the state must be back afterwards; and a
correct adapter judged next in the same process must pass.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import reference.activations
from harness import registry
from harness.core.case import Case
from harness.core.device import detect
from harness.engine import runner

_REFERENCE = registry.resolve("reference-activation")
CASE = Case(op="activation", adapter="hostile", features={"activation": "silu_and_mul", "dtype": "float32"},
            shapes={"T": 4, "N": 24}, dtypes={"x": "float32"}, seed=3)


def _wrong_silu(x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    return x * torch.sigmoid(x) * 1.01  # a "speed-up library" 1% off


def _patch_silu() -> None:
    F.silu = _wrong_silu


def _patch_reference() -> None:
    reference.activations.apply_activation = lambda *a, **k: torch.zeros(1)


def _default_dtype() -> None:
    torch.set_default_dtype(torch.float64)


def _default_device() -> None:
    torch.set_default_device("meta")


def _chdir() -> None:
    os.chdir(os.path.dirname(os.getcwd()) or "/")


def _warnings_as_errors() -> None:
    warnings.simplefilter("error")


def _tensor_method() -> None:
    torch.Tensor.sigmoid = lambda self: self  # shadows the C method for everyone


def _tf32() -> None:
    torch.set_float32_matmul_precision("medium")


def _mutate_case(case: Case) -> None:
    case.features["activation"] = "gelu_and_mul"  # type: ignore[index]


HOSTILE: dict[str, tuple[Callable[..., None], str]] = {
    "patches-silu": (_patch_silu, "torch.nn.functional.silu replaced"),
    "patches-reference": (_patch_reference, "reference.activations.apply_activation replaced"),
    "default-dtype": (_default_dtype, "default dtype torch.float32 -> torch.float64"),
    "default-device": (_default_device, "default device cpu -> meta"),
    "chdir": (_chdir, "working directory"),
    "warnings-as-errors": (_warnings_as_errors, "warning filters"),
    "tensor-method": (_tensor_method, "torch.Tensor.sigmoid added"),
    "tf32": (_tf32, "fp32 matmul precision highest -> medium"),
}


def _hostile(name: str, harm: Callable[[], None]) -> registry.Adapter:
    def run(case, inputs, outputs):  # type: ignore[no-untyped-def]
        harm()  # first, so a fooled oracle would agree with what follows
        _REFERENCE.run(case, inputs, outputs)

    return dataclasses.replace(_REFERENCE, name=name, run=run)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_kernel_that_changes_process_state_fails_and_the_next_one_passes(name: str) -> None:
    harm, words = HOSTILE[name]
    device = detect("cpu")
    cwd, dtype, silu = os.getcwd(), torch.get_default_dtype(), F.silu
    r = runner.judge(CASE.replace(adapter=name), _hostile(name, harm), device)
    assert r.verdict == "fail" and "kernel changed the process state" in r.reason and words in r.reason, r.reason
    assert "process-state" in r.metrics["failed_checks"]
    assert (os.getcwd(), torch.get_default_dtype(), F.silu) == (cwd, dtype, silu)
    assert torch.get_float32_matmul_precision() == "highest" and "sigmoid" not in vars(torch.Tensor)
    following = runner.judge(CASE.replace(adapter="reference-activation"), _REFERENCE, device)
    assert following.verdict == "pass", following.reason


def test_a_kernel_gets_a_copy_of_the_case() -> None:
    def run(case, inputs, outputs):  # type: ignore[no-untyped-def]
        _REFERENCE.run(case, inputs, outputs)
        _mutate_case(case)

    r = runner.judge(CASE, dataclasses.replace(_REFERENCE, name="hostile", run=run), detect("cpu"))
    assert r.verdict == "pass" and r.case.features["activation"] == "silu_and_mul"
    assert CASE.features["activation"] == "silu_and_mul"
