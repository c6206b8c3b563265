"""A kernel cannot fool the judge or change another kernel's verdict through the process they share.

Each hostile adapter computes the right answer (it runs the reference) but also changes process state the oracle or
later cases depend on. Its own case must fail, naming what it changed; the state must be back afterwards; and a
correct adapter judged next in the same process must pass.
"""

from __future__ import annotations

import dataclasses
import os
import signal
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


_EXP = torch.exp


def _patch_exp() -> None:
    torch.exp = lambda x, *a, **k: _EXP(x, *a, **k) * 1.01  # what the oracle's silu is computed from


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


def _blocks_alarm() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})


def _patch_manual_seed() -> None:
    torch.manual_seed = lambda seed: torch.random.manual_seed(seed)  # not torch._dynamo's wrapping of it


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
    "blocks-alarm": (_blocks_alarm, "blocked signals"),
    "patches-manual-seed": (_patch_manual_seed, "torch.manual_seed replaced"),
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


def test_the_oracle_is_computed_before_the_kernel_with_the_original_functions() -> None:
    # the kernel patches exp (the oracle's silu is evaluated from it) and then computes with it: the oracle,
    # computed before with the original exp, disagrees with it (before this fix the oracle ran after the kernel and
    # agreed with the patched function)
    r = runner.judge(CASE.replace(adapter="patches-exp"), _hostile("patches-exp", _patch_exp), detect("cpu"))
    assert r.verdict == "fail" and "out" in r.metrics["failed_checks"], r.reason
    assert "outside the error bound" in r.reason


def _silu_by_hand(case, inputs, outputs):  # type: ignore[no-untyped-def]
    x = inputs["x"].float()
    gate, up = x.chunk(2, dim=-1)
    outputs["out"].copy_(gate / (1 + torch.exp(-gate)) * up)  # uses no torch function anyone patched


def test_a_function_patched_between_cases_does_not_change_the_oracle() -> None:
    correct = dataclasses.replace(_REFERENCE, name="by-hand", run=_silu_by_hand)
    original = F.silu
    F.silu = _wrong_silu  # e.g. a library imported by the test session, outside any case
    try:
        r = runner.judge(CASE.replace(adapter="by-hand"), correct, detect("cpu"))
    finally:
        F.silu = original
    assert r.verdict == "pass", r.reason


def test_a_library_that_patches_torch_on_import_fails_and_others_do_not() -> None:
    silu = F.silu
    adapter = registry.resolve("tests.harness.fixtures.patching_adapter:ADAPTER")
    assert F.silu is silu  # undone at once
    r = runner.judge(CASE.replace(adapter=adapter.name), adapter, detect("cpu"))
    assert r.verdict == "fail" and "torch.nn.functional.silu replaced (on import of module" in r.reason, r.reason
    following = runner.judge(CASE.replace(adapter="reference-activation"), _REFERENCE, detect("cpu"))
    assert following.verdict == "pass", following.reason


def test_an_adapter_module_that_exits_on_import_is_refused_and_the_process_survives() -> None:
    with pytest.raises(ValueError, match="tried to end the process on import"):
        registry.resolve("tests.harness.fixtures.exiting_adapter:ADAPTER")
    assert os._exit.__module__ in ("posix", "nt", "os")  # the guard is gone again


def _exits(how: str) -> Callable[..., None]:
    def run(case, inputs, outputs):  # type: ignore[no-untyped-def]
        _REFERENCE.run(case, inputs, outputs)
        if how == "os._exit":
            os._exit(0)
        if how == "SystemExit":
            raise SystemExit(0)
        raise KeyboardInterrupt

    return run


@pytest.mark.parametrize("how", ["os._exit", "SystemExit", "KeyboardInterrupt"])
def test_a_kernel_that_tries_to_end_the_process_is_an_error_of_that_kernel(how: str) -> None:
    bad = dataclasses.replace(_REFERENCE, name="exits", run=_exits(how))
    r = runner.judge(CASE.replace(adapter="exits"), bad, detect("cpu"))
    assert r.verdict == "error" and "KernelExitAttempt" in r.reason and how.split(".")[-1] in r.reason, r.reason
    assert "test_isolation.py" in r.reason  # where the kernel did it, not where the judge caught it
    following = runner.judge(CASE.replace(adapter="reference-activation"), _REFERENCE, detect("cpu"))
    assert following.verdict == "pass", following.reason


def test_a_real_ctrl_c_during_a_kernel_still_stops_the_run() -> None:
    def run(case, inputs, outputs):  # type: ignore[no-untyped-def]
        signal.raise_signal(signal.SIGINT)  # as the terminal would deliver it
        _REFERENCE.run(case, inputs, outputs)

    with pytest.raises(KeyboardInterrupt):
        runner.judge(CASE.replace(adapter="interrupted"), dataclasses.replace(_REFERENCE, run=run), detect("cpu"))


_FRESH_PROCESS_WRONG_KERNEL = """
import dataclasses
from harness import registry
from harness.core.case import Case
from harness.core.device import detect
from harness.engine import runner
ref = registry.resolve("reference-activation")
def run(case, inputs, outputs):
    ref.run(case, inputs, outputs)
    outputs["out"].mul_(2)
case = Case(op="activation", adapter="wrong", features={"activation": "silu_and_mul", "dtype": "float32"},
            shapes={"T": 3, "N": 8}, dtypes={"x": "float32"}, seed=2)
print(runner.judge(case, dataclasses.replace(ref, name="wrong", run=run), detect("cpu")).reason)
"""


def test_the_judges_own_lazy_imports_are_not_charged_to_the_kernel() -> None:
    # the first failing case of a fresh process: the comparison's failure path imports modules that add a warning
    # filter; that once failed a plainly wrong kernel for "changing the process state" too
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _FRESH_PROCESS_WRONG_KERNEL], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert "outside the error bound" in p.stdout and "process state" not in p.stdout, p.stdout
