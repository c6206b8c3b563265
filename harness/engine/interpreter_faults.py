"""Whether an exception out of a kernel run is a fault of Triton's CPU interpreter rather than of the kernel.

The interpreter cannot run everything a GPU runs (a load whose mask is not boolean, inline PTX, libdevice functions
the fidelity layer has no numpy for, its own assertions). Such an exception says nothing about the kernel, so on
`interp` the runner records the case not-verifiable with the interpreter's message (`interpreter_fault`).

The rule, by the traceback: Triton wraps every exception raised while a kernel's body runs in `InterpreterError`;
below those wrappers, the exception that started it must have been raised in the interpreter's own code:
`triton/runtime/interpreter.py` (the C++ helpers it calls have no Python frame; numpy frames under it are skipped)
or the harness' fidelity layer that patches it. Everything else stays the kernel's: an exception of the kernel's
Python or Triton's frontend (`triton/language`, which compiled Triton raises too), of its adapter, raised before
the kernel body ran (its launch: grid, arguments), or that the adapter raised itself around the launch. So do the
interpreter functions that raise on the kernel's behalf: a failed tl.device_assert, tl.assume or tl.static_assert,
a tensor descriptor the kernel built misaligned, a reduction over an axis the tensor lacks. Out-of-bounds accesses:
the bare interpreter does not check them (an unmasked lane reads or writes host memory: garbage, or a crash); the
fidelity layer's bounds check raises `OutOfBoundsAccess` for them, a bug of the kernel that stays its error.
Releases differ in what they raise (3.9 rejects a load mask that is not boolean, 3.6 reads it as one); the rule goes
by where the exception was raised, not by its message, so it holds for each.
"""

from __future__ import annotations

import os
import traceback

import numpy as np

from harness.engine.interpreter import OutOfBoundsAccess

_TRITON_INTERPRETER = os.path.join("triton", "runtime", "interpreter.py")
#: the fidelity layer's modules: part of the interpreter as the harness runs it
_LAYER = tuple(os.path.join(os.path.dirname(os.path.abspath(__file__)), f) for f in
               ("interpreter.py", "interpreter_speed.py"))
_NUMPY = os.path.join(os.path.dirname(os.path.abspath(np.__file__)), "")
#: functions of the interpreter that raise because the kernel asked for it or got its own input wrong
_FOR_THE_KERNEL = frozenset({
    "create_assert", "create_assume", "_new_static_assert",  # tl.device_assert / tl.assume / tl.static_assert
    "validate",  # TensorDescHandle: a descriptor's base, strides or offsets misaligned (the GPU's TMA needs them)
    "check_axis", "check_tensor",  # a reduction or scan over an axis the tensor does not have
})


def _origin(e: BaseException) -> BaseException | None:
    """The exception under Triton's `InterpreterError` wrappers (None when `e` is not such a wrapper: the kernel
    body did not raise it)."""
    if type(e).__name__ != "InterpreterError":
        return None
    seen: set[int] = set()
    while type(e).__name__ == "InterpreterError" and e.__cause__ is not None and id(e) not in seen:
        seen.add(id(e))
        e = e.__cause__
    return None if type(e).__name__ == "InterpreterError" else e


def _raised_by_interpreter(e: BaseException) -> tuple[str, str] | None:
    """(module, function) of the interpreter that raised `e` (None when the raising frame is not the interpreter's)."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith(_NUMPY)]
    if not frames:
        return None
    last = frames[-1]
    if last.filename.endswith(_TRITON_INTERPRETER):
        return "triton.runtime.interpreter", last.name
    if last.filename in _LAYER:
        return f"harness.engine.{os.path.basename(last.filename).removesuffix('.py')}", last.name
    return None


def interpreter_fault(e: BaseException) -> str | None:
    """`Type: message (in module.function)` when Triton's interpreter itself raised `e` while running a
    kernel (module docstring: the rule); None when it is the kernel's (or its adapter's) exception."""
    origin = _origin(e)
    if origin is None or isinstance(origin, OutOfBoundsAccess):
        return None
    where = _raised_by_interpreter(origin)
    if where is None or where[1] in _FOR_THE_KERNEL:
        return None
    return f"{type(origin).__name__}: {origin} (in {'.'.join(where)})"
