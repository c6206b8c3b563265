"""Process-wide backend switches a kernel may flip: charged and restored when it runs in the judging process, and
out of the judge's reach when it runs in a kernel host."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

from harness import registry
from harness.core import isolation
from harness.core.case import Case
from harness.core.device import detect
from harness.engine import runner

_REFERENCE = registry.resolve("reference-activation")
CASE = Case(op="activation", adapter="x", features={"activation": "silu_and_mul", "dtype": "float32"},
            shapes={"T": 4, "N": 24}, dtypes={"x": "float32"}, seed=3)

FLIPS: dict[str, Callable[[], None]] = {
    "flush denormal": lambda: torch.set_flush_denormal(True),
    "mkldnn": lambda: setattr(torch.backends.mkldnn, "enabled", not torch.backends.mkldnn.enabled),
    "cudnn benchmark": lambda: setattr(torch.backends.cudnn, "benchmark", not torch.backends.cudnn.benchmark),
    "cudnn deterministic": lambda: setattr(torch.backends.cudnn, "deterministic",
                                           not torch.backends.cudnn.deterministic),
    "cuda fp16 reduced-precision reduction": lambda: setattr(
        torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction",
        not torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction),
    "cuda bf16 reduced-precision reduction": lambda: setattr(
        torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction",
        not torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction),
}


def _flipping(flip: Callable[[], None]) -> registry.Adapter:
    def run(case, inputs, outputs):  # type: ignore[no-untyped-def]
        _REFERENCE.run(case, inputs, outputs)
        flip()

    return dataclasses.replace(_REFERENCE, name="flips-a-switch", run=run, test_aid=True)


@pytest.mark.parametrize("name", list(FLIPS))
def test_a_flipped_backend_switch_is_charged_and_restored(name: str) -> None:
    if name == "flush denormal" and not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush denormals")
    read = isolation._settings()[name][0]
    before = read()
    r = runner.judge(CASE, _flipping(FLIPS[name]), detect("cpu"))
    assert r.verdict == "fail" and name in r.reason, (r.verdict, r.reason)
    assert read() == before, f"{name} was left changed"
    assert runner.judge(CASE, _REFERENCE, detect("cpu")).verdict == "pass"  # the next kernel sees it as it was


def test_in_a_kernel_host_the_switches_never_reach_the_judge() -> None:
    from harness.engine import remote

    before = {n: isolation._settings()[n][0]() for n in FLIPS}
    flipper = remote.open_adapter("tests.harness.fixtures.flipping_adapter:ADAPTER", "cpu")
    r = runner.judge(CASE, flipper, detect("cpu"))
    assert r.verdict == "pass", r.reason  # it cannot change what the judge computes: named, not charged
    assert any("mkldnn" in note for note in r.metrics.get("kernel_host", [])), r.metrics
    assert {n: isolation._settings()[n][0]() for n in FLIPS} == before
