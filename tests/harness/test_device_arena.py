"""A case judged on the GPU reaches its kernel host through a device arena: GPU memory both processes map
(`harness.engine.device_share`), so its gigabytes never cross the CPU. What the shared-memory arena catches, it
catches too (a write past an output, into an input); its verdicts are the shared-memory arena's; a large one goes
back to the GPU after its case; where GPU memory cannot be shared, the shared-memory arena takes its place."""

from __future__ import annotations

import pytest
import torch

from harness.core.case import Case
from harness.engine import runner
from harness.engine.arena import Arena
from harness.engine.device_share import DeviceShareError

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="a device arena is GPU memory: needs a GPU")

FAULTS = "tests.harness.fixtures.cuda_faults"
CELL = {"activation": "silu_and_mul", "dtype": "float32"}


def _case(name: str) -> Case:
    return Case(op="activation", adapter=name, features=CELL, shapes={"T": 33, "N": 129}, dtypes={"x": "float32"},
                seed=1)


@pytest.fixture
def on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every case judged on the GPU, as one past CPU_JUDGED_ELEMENTS is."""
    monkeypatch.setattr(runner, "CPU_JUDGED_ELEMENTS", 0)


def _judged(spec: str, **kw):  # type: ignore[no-untyped-def]
    from harness.core.device import detect
    from harness.engine import remote

    device = detect("cuda")
    adapter = remote.open_adapter(spec, device.device)
    try:
        return runner.judge(_case(adapter.name), adapter, device, **kw), adapter
    finally:
        remote.close_adapter(spec, device.device)


@gpu
def test_a_case_judged_on_the_gpu_reaches_its_host_through_a_device_arena(on_the_gpu: None,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    used = []
    real = runner._reserved_arena
    monkeypatch.setattr(runner, "_reserved_arena", lambda *a: used.append(real(*a)) or used[-1])
    r, _ = _judged("reference-activation")
    assert r.verdict == "pass", r.reason
    assert used and {a.kind for a in used} == {"cuda"}, [a.kind for a in used]


@gpu
def test_the_device_arenas_verdict_is_the_shared_memorys(on_the_gpu: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # both with the extra runs (drawn one judging in eight otherwise: the checks then differ by them)
    monkeypatch.setattr(runner, "fresh_selected", lambda: True)
    device = _judged("reference-activation")[0]
    monkeypatch.setattr(runner, "DeviceArena", _Refused)
    shared = _judged("reference-activation")[0]
    assert device.verdict == shared.verdict == "pass"
    # the same checks; the two extra runs go in an order drawn for each judging
    assert sorted(c["name"] for c in device.checks) == sorted(c["name"] for c in shared.checks)


@gpu
@pytest.mark.parametrize("name, check, words", [
    ("OOB", "guard:out", "wrote 64 elements outside the output buffer (first 1 elements past its end)"),
    ("WRITES_INPUT", "unchanged:x", "input 'x' was modified by the kernel")])
def test_what_a_kernel_does_wrong_in_a_device_arena_is_caught(on_the_gpu: None, name: str, check: str,
                                                             words: str) -> None:
    r, _ = _judged(f"{FAULTS}:{name}")
    assert r.verdict == "fail" and check in r.metrics["failed_checks"] and words in r.reason, r.reason


@gpu
def test_a_large_device_arena_goes_back_to_the_gpu_after_its_case(on_the_gpu: None,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.core.device import detect
    from harness.engine import remote

    monkeypatch.setattr(runner, "DEVICE_ARENA_KEPT_BYTES", 0)
    device = detect("cuda")
    adapter = remote.open_adapter("reference-activation", device.device)
    try:
        for seed in (1, 2):  # the second case shares a new one with the same host
            r = runner.judge(_case(adapter.name).replace(seed=seed), adapter, device)
            assert r.verdict == "pass", r.reason
            assert adapter.host.device_arena is None  # type: ignore[attr-defined]
    finally:
        remote.close_adapter("reference-activation", device.device)


class _Refused(Arena):
    """A device arena on a machine whose GPU memory cannot be shared."""

    def __init__(self, *args: object, **kwargs: object):
        raise DeviceShareError("no virtual memory API here")


class _Host:
    device, arena, device_arena, device_share_error = "cuda:0", None, None, None


def test_where_gpu_memory_cannot_be_shared_the_shared_memory_arena_takes_its_place(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "DeviceArena", _Refused)
    host = _Host()
    arena = runner._reserved_arena(host, "cuda:0", [torch.zeros(8)])
    assert arena.kind == "cpu" and host.arena is arena
    assert host.device_share_error == "no virtual memory API here"
    runner._reserved_arena(host, "cuda:0", [torch.zeros(8)])  # not tried again
    arena.close()


def test_a_case_judged_on_the_cpu_never_asks_for_a_device_arena(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "DeviceArena", _Refused)
    host = _Host()
    arena = runner._reserved_arena(host, "cpu", [torch.zeros(8)])
    assert arena.kind == "cpu" and host.device_share_error is None
    arena.close()
