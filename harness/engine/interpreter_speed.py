"""Work Triton's interpreter does that cannot change what a kernel computes, left out (verified releases only).

Profiled on the fused experts kernel under the interpreter (Triton 3.9, 2 CPU cores), two pieces of the interpreter
took over half of a kernel's time and have no effect on its results:
- ``overflow_checks``: every integer ``+``, ``-`` and ``*`` on int32 values recomputes the operation in int64 and
  compares it with the type's range, only to feed ``device_assert``, which does nothing unless the builder's
  ``debug`` option is on (the interpreter's never is; a compiled kernel drops the check the same way). The check
  now runs only when ``debug`` is on (35% of the kernel's time).
- ``nested_patching``: each call of a ``@triton.jit`` helper from inside a running kernel re-patches the language
  modules (``inspect.getmembers`` over ``triton.language`` and its tensor class) that the launch has already patched
  and that stay patched until the launch ends. A helper whose language modules the running launch patched now skips
  that; any other (a helper reaching ``triton.language.core`` where the kernel only names ``triton.language``) is
  patched as before (20%).

Both are named in ``HARNESS_INTERP_DISABLE`` like the fidelity fixes (``speed_overflow_checks``,
``speed_nested_patching``), so a run can compare results with and without them.
"""

from __future__ import annotations

import types
from typing import Any


def apply(it: Any, tl: Any, disabled: frozenset[str]) -> None:
    """Install the patches not in `disabled` into the interpreter module `it` (once per process)."""
    if "speed_overflow_checks" not in disabled:
        _skip_unreported_overflow_checks(it)
    if "speed_nested_patching" not in disabled:
        _skip_repeated_patching(it, tl)


def _skip_unreported_overflow_checks(it: Any) -> None:
    semantic = getattr(it, "interpreter_semantic", None)
    check = getattr(semantic, "binary_op_sanitize_overflow_impl", None)
    if check is None or getattr(it, "_moe_speed_overflow", False):
        return

    def sanitize_overflow(lhs: Any, rhs: Any, binary_op: Any) -> Any:
        # its only effect is a device_assert, which returns at once when debug is off
        if not semantic.builder.options.debug:
            return None
        return check(lhs, rhs, binary_op)

    semantic.binary_op_sanitize_overflow_impl = sanitize_overflow  # this instance only: compiled code keeps its own
    it._moe_speed_overflow = True


class _AlreadyPatched:
    """The scope of a helper call that patched nothing (nothing to restore)."""

    def restore(self) -> None:
        return None


class _LaunchScope:
    """The running launch's patch scope: restoring it ends the launch's record of what is patched."""

    def __init__(self, scope: Any, state: dict[str, Any]):
        self.scope, self.state = scope, state

    def restore(self) -> None:
        try:
            self.scope.restore()
        finally:
            self.state["patched"] = None


def _skip_repeated_patching(it: Any, tl: Any) -> None:
    original = getattr(it, "_patch_lang", None)
    if original is None or getattr(it, "_moe_speed_nested", False):
        return
    state: dict[str, Any] = {"patched": None}  # ids of the language modules the running launch patched

    def patch_lang(fn: Any) -> Any:
        langs = {id(v) for v in fn.__globals__.values() if isinstance(v, types.ModuleType) and v in (tl, tl.core)}
        if state["patched"] is not None and langs and langs <= state["patched"]:
            return _AlreadyPatched()
        scope = original(fn)
        if state["patched"] is None:  # a launch: GridExecutor restores its scope when the grid is done
            state["patched"] = langs
            return _LaunchScope(scope, state)
        state["patched"] |= langs  # a helper that reached further: its patches stay, as upstream leaves them
        return scope

    it._patch_lang = patch_lang
    it._moe_speed_nested = True
