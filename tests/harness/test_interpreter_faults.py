"""An exception that Triton's interpreter raises itself (a mask dtype it does not take, a construct it cannot run)
says nothing about the kernel: on `interp` the case is not-verifiable with the interpreter's message. A kernel bug
the interpreter catches (an out-of-bounds access, a failed tl.device_assert or tl.static_assert), an exception of
the kernel's own Python or its adapter's, and any exception on a GPU stay the kernel's error.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from harness.engine.interpreter import install

install()  # before any kernel runs

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.language.extra import libdevice  # noqa: E402

from harness import registry  # noqa: E402
from harness.core.case import Case  # noqa: E402
from harness.core.device import detect  # noqa: E402
from harness.engine import runner  # noqa: E402
from harness.engine.interpreter_faults import interpreter_fault  # noqa: E402
from harness.registry import Adapter  # noqa: E402

INTERP = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
pytestmark = pytest.mark.skipif(not INTERP, reason="faults of Triton's CPU interpreter")
DEV = detect("cpu")
CELL = {"activation": "silu_and_mul", "dtype": "float32"}
_reference = registry.resolve("reference-activation")


@triton.jit
def _int_mask_kernel(x_ptr, y_ptr, flags_ptr, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    keep = tl.load(flags_ptr + o)  # int8 flags used as the mask: the interpreter's load takes booleans only
    tl.store(y_ptr + o, tl.load(x_ptr + o, mask=keep, other=0.0))


@triton.jit
def _oob_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(y_ptr + o, tl.load(x_ptr + o + BLOCK))  # reads a block past x: the kernel's bug


@triton.jit
def _static_assert_kernel(x_ptr, BLOCK: tl.constexpr):
    tl.static_assert(BLOCK % 32 == 0, "BLOCK must be a multiple of 32")
    tl.store(x_ptr + tl.arange(0, BLOCK), 0.0)


@triton.jit
def _semantic_kernel(x_ptr, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(x_ptr + o, tl.load(x_ptr + o, other=1.0))  # `other` without `mask`: Triton's frontend rejects it


@triton.jit
def _unemulated_libdevice_kernel(x_ptr, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(x_ptr + o, libdevice.j0(tl.load(x_ptr + o)))  # a libdevice function the fidelity layer has no numpy for


@triton.jit
def _asm_kernel(x_ptr, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    y = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [tl.load(x_ptr + o)], dtype=tl.float32, is_pure=True,
                                  pack=1)
    tl.store(x_ptr + o, y)  # inline PTX: no interpreter runs it


def _int_mask() -> None:
    x, y = torch.arange(8, dtype=torch.float32), torch.full((8,), -1.0)
    _int_mask_kernel[(1,)](x, y, torch.tensor([1, 0] * 4, dtype=torch.int8), BLOCK=8)
    # releases whose interpreter takes the mask (3.6 reads it as a boolean) must have computed the masked copy
    assert torch.equal(y, torch.tensor([0.0, 0, 2, 0, 4, 0, 6, 0])), y


def _raised(fn) -> BaseException | None:  # type: ignore[no-untyped-def]
    try:
        fn()
    except BaseException as e:  # what the interpreter raises is the subject
        return e
    return None


#: whether this release's interpreter rejects a load mask that is not boolean (3.9 does; 3.6 casts it)
INT_MASK_RAISES = _raised(_int_mask) is not None


def test_the_interpreters_own_exception_is_named_with_its_message() -> None:
    e = _raised(_int_mask)
    if INT_MASK_RAISES:
        fault = interpreter_fault(e)  # type: ignore[arg-type]
        assert fault is not None and "mask has unsupported dtype" in fault, fault
    fault = interpreter_fault(_raised(lambda: _asm_kernel[(1,)](torch.ones(8), BLOCK=8)))  # type: ignore[arg-type]
    assert fault is not None and "inline_asm" in fault, fault


def test_a_construct_the_fidelity_layer_cannot_emulate_is_the_interpreters() -> None:
    e = _raised(lambda: _unemulated_libdevice_kernel[(1,)](torch.ones(8), BLOCK=8))
    fault = interpreter_fault(e)  # type: ignore[arg-type]
    assert fault is not None and "j0" in fault, fault


@pytest.mark.parametrize("launch", [
    pytest.param(lambda: _oob_kernel[(1,)](torch.ones(8), torch.empty(8), BLOCK=8), id="out-of-bounds"),
    pytest.param(lambda: _static_assert_kernel[(1,)](torch.empty(8), BLOCK=8), id="static-assert"),
    pytest.param(lambda: _semantic_kernel[(1,)](torch.empty(8), BLOCK=8), id="frontend"),
    pytest.param(lambda: _raise(ValueError("this adapter does not take BLOCK=8")), id="adapter"),
])
def test_the_kernels_own_errors_are_not_the_interpreters(launch) -> None:  # type: ignore[no-untyped-def]
    e = _raised(launch)
    assert e is not None and interpreter_fault(e) is None, (type(e).__name__, str(e))


def _raise(e: Exception) -> None:
    raise e


@triton.jit
def _device_assert_kernel(x_ptr, BLOCK: tl.constexpr):
    v = tl.load(x_ptr + tl.arange(0, BLOCK))
    tl.device_assert(v >= 0, "negative input")


def test_a_failed_device_assert_is_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    from triton.runtime import interpreter as it

    # device assertions run only in debug mode (the interpreter's options have it off)
    monkeypatch.setattr(it.interpreter_builder, "options",
                        dataclasses.replace(it.interpreter_builder.options, debug=True))
    e = _raised(lambda: _device_assert_kernel[(1,)](torch.full((8,), -1.0), BLOCK=8))
    assert e is not None and "negative input" in str(e) and interpreter_fault(e) is None, repr(e)


def _adapter(name: str, launch) -> Adapter:  # type: ignore[no-untyped-def]
    """An activation adapter that launches `launch` before computing the right answer."""
    def run(case, inputs, outputs):  # type: ignore[no-untyped-def]
        launch()
        _reference.run(case, inputs, outputs)

    support = {**_reference.support, "activation": ("silu_and_mul",), "dtype": ("float32",)}
    return Adapter(name=name, op="activation", source="tests.harness.test_interpreter_faults", run=run,
                   support=support, conventions=_reference.conventions)


def _judge(adapter: Adapter, device=DEV) -> runner.Result:  # type: ignore[no-untyped-def,name-defined]
    case = Case(op="activation", adapter=adapter.name, features=CELL, shapes={"T": 3, "N": 8},
                dtypes={"x": "float32"}, seed=1)
    return runner.judge(case, adapter, device)


#: resolvable as tests.harness.test_interpreter_faults:INT_MASK (judged in a kernel host below)
INT_MASK = _adapter("interp-int-mask", _int_mask)


def _expect_int_mask(r: runner.Result, gpu: bool = False) -> None:  # type: ignore[name-defined]
    if not INT_MASK_RAISES:  # this release runs the kernel: the adapter's answer is right
        assert r.verdict == "pass", (r.verdict, r.reason)
    elif gpu:
        assert r.verdict == "error" and "mask has unsupported dtype" in r.reason, (r.verdict, r.reason)
    else:
        assert r.verdict == "not-verifiable" and "mask has unsupported dtype" in r.reason, (r.verdict, r.reason)
        assert "create_masked_load" in r.reason, r.reason


def test_the_verdict_is_not_verifiable_on_interp_and_the_kernels_error_elsewhere() -> None:
    _expect_int_mask(_judge(INT_MASK))
    # a GPU generation: the same exception is the kernel's (it still runs in the interpreter here; the rule must
    # go by the generation, not by where it ran)
    _expect_int_mask(_judge(INT_MASK, dataclasses.replace(DEV, generation="sm90")), gpu=True)
    asm = _judge(_adapter("interp-asm", lambda: _asm_kernel[(1,)](torch.ones(8), BLOCK=8)))
    assert asm.verdict == "not-verifiable" and "inline_asm" in asm.reason, (asm.verdict, asm.reason)
    oob = _judge(_adapter("interp-oob", lambda: _oob_kernel[(1,)](torch.ones(8), torch.empty(8), BLOCK=8)))
    assert oob.verdict == "error" and "unmasked lane" in oob.reason, (oob.verdict, oob.reason)
    assert _judge(_adapter("interp-fine", lambda: None)).verdict == "pass"


def test_the_verdict_is_the_same_from_a_kernel_host() -> None:
    from harness.engine import remote

    spec = "tests.harness.test_interpreter_faults:INT_MASK"
    try:
        r = _judge(remote.open_adapter(spec, "cpu"))
    finally:
        remote.close_adapter(spec, "cpu")
    _expect_int_mask(r)
