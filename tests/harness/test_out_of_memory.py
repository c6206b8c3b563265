"""A judging that runs out of GPU memory is done once more under the machine-wide lock, with no large case running:
in a suite of many processes sharing one GPU, another process's case past 2**31 elements, not this kernel, most
likely held the memory. A large case that still does not fit is not-verifiable (a machine too small for it, said
so), never charged to the kernel; a small one that still does not fit keeps its error."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

from harness import registry
from harness.core.case import Case
from harness.core.device import detect
from harness.engine import large_lock, runner

CELL = {"activation": "silu_and_mul", "dtype": "float32"}
CASE = Case(op="activation", adapter="oom", features=CELL, shapes={"T": 8, "N": 64}, dtypes={"x": "float32"}, seed=1)
MESSAGE = "CUDA out of memory. Tried to allocate 18.29 GiB. GPU 0 has a total capacity of 139.80 GiB"


def _adapter(failures: int) -> tuple[registry.Adapter, list[int]]:
    """The reference activation, raising torch's OutOfMemoryError on its first `failures` calls."""
    reference, calls = registry.resolve("reference-activation"), []

    def run(case, inputs, outputs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) <= failures:
            raise torch.cuda.OutOfMemoryError(MESSAGE)
        return reference.run(case, inputs, outputs)

    return dataclasses.replace(reference, name="oom", run=run, test_aid=True), calls


@pytest.fixture
def locks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The `above` of every machine-wide lock asked for, in order."""
    asked: list[int] = []
    real = large_lock.one_at_a_time

    @contextlib.contextmanager
    def recorded(elements: int, above: int = large_lock.LOCKED_ABOVE, path: str | None = None):  # type: ignore[no-untyped-def]
        asked.append(above)
        with real(elements, above, path) as held:
            yield held

    monkeypatch.setattr(large_lock, "one_at_a_time", recorded)
    return asked


def test_a_case_that_ran_out_of_memory_is_judged_again_under_the_lock(locks: list[int]) -> None:
    adapter, calls = _adapter(failures=1)
    r = runner.judge(CASE, adapter, detect("cpu"))
    assert r.verdict == "pass", r.reason
    assert len(locks) == 2 and locks[1] < 0  # the second judging always holds the lock
    assert len(calls) >= 2


def test_a_small_case_that_never_fits_keeps_its_error(locks: list[int]) -> None:
    adapter, _ = _adapter(failures=1 << 30)
    r = runner.judge(CASE, adapter, detect("cpu"))
    assert r.verdict == "error" and "CUDA out of memory" in r.reason, r.reason
    assert len(locks) == 2


def test_a_large_case_that_never_fits_is_not_verifiable_with_the_reason(locks: list[int],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(large_lock, "LOCKED_ABOVE", 0)  # every case counts as large
    monkeypatch.setattr(runner.large_lock, "LOCKED_ABOVE", 0)
    adapter, _ = _adapter(failures=1 << 30)
    r = runner.judge(CASE, adapter, detect("cpu"))
    assert r.verdict == "not-verifiable", r.reason
    assert "not enough GPU memory" in r.reason and "CUDA out of memory" in r.reason


def test_a_case_that_fails_otherwise_is_judged_once(locks: list[int]) -> None:
    reference = registry.resolve("reference-activation")
    calls: list[int] = []

    def run(case, inputs, outputs):  # type: ignore[no-untyped-def]
        calls.append(1)
        raise RuntimeError("a kernel's own error")

    r = runner.judge(CASE, dataclasses.replace(reference, name="raises", run=run, test_aid=True), detect("cpu"))
    assert r.verdict == "error" and len(locks) == 1, r.reason
