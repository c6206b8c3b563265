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
  that; any other (a helper reaching ``triton.language.core`` where the kernel only names ``triton.language``, or one
  whose module binds builtins to names of its own, ``fast_expf = tl.math.exp``) is patched as before, and its patches
  are undone with the launch's (upstream leaves them in place) (20%).

Both are named in ``HARNESS_INTERP_DISABLE`` like the fidelity fixes (``speed_overflow_checks``,
``speed_nested_patching``), so a run can compare results with and without them.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any


def apply(it: Any, tl: Any, disabled: frozenset[str], own_patching: Callable[[Any], bool] = lambda fn: False) -> None:
    """Install the patches not in `disabled` into the interpreter module `it` (once per process). `own_patching(fn)`:
    whether a helper's module has names of its own to patch (it is never skipped then)."""
    if "speed_overflow_checks" not in disabled:
        _skip_unreported_overflow_checks(it)
    if "speed_nested_patching" not in disabled:
        _skip_repeated_patching(it, tl, own_patching)


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
    """The running launch's patch scope: restoring it undoes the patches of the helpers it ran, then its own, and
    ends the launch's record of what is patched."""

    def __init__(self, scope: Any, state: dict[str, Any]):
        self.scope, self.state = scope, state

    def restore(self) -> None:
        try:
            while self.state["helpers"]:
                self.state["helpers"].pop().restore()
            self.scope.restore()
        finally:
            self.state["patched"], self.state["helpers"], self.state["modules"] = None, [], set()


def _skip_repeated_patching(it: Any, tl: Any, own_patching: Callable[[Any], bool]) -> None:
    original = getattr(it, "_patch_lang", None)
    if original is None or getattr(it, "_moe_speed_nested", False):
        return
    # ids of the language modules the running launch patched; the scopes of helpers that patched more; the
    # globals of the modules whose own names the launch has patched
    state: dict[str, Any] = {"patched": None, "helpers": [], "modules": set()}

    def patch_lang(fn: Any) -> Any:
        g = fn.__globals__
        langs = {id(v) for v in g.values() if isinstance(v, types.ModuleType) and v in (tl, tl.core)}
        if state["patched"] is not None and langs and langs <= state["patched"]:
            if id(g) in state["modules"] or not own_patching(fn):
                state["modules"].add(id(g))  # nothing (more) to patch in this module during the launch
                return _AlreadyPatched()
        scope = original(fn)
        state["modules"].add(id(g))
        if state["patched"] is None:  # a launch: GridExecutor restores its scope when the grid is done
            state["patched"] = langs
            return _LaunchScope(scope, state)
        state["patched"] |= langs  # a helper that reached further: its patches end with the launch's
        state["helpers"].append(scope)
        return scope

    it._patch_lang = patch_lang
    it._moe_speed_nested = True
