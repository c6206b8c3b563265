"""Naming the compile-once Triton cache manager (`compile_once`) in the environment, without importing Triton."""

from __future__ import annotations

import os
from collections.abc import MutableMapping

ENV = "TRITON_CACHE_MANAGER"
SWITCH_ENV = "MOE_HARNESS_COMPILE_ONCE"
SPEC = "harness.engine.compile_once:CompileOnceCacheManager"


def install(environ: MutableMapping[str, str] | None = None) -> bool:
    """Name the compile-once cache manager for Triton in `environ` (default: this process's) unless a cache manager
    is named there already or `MOE_HARNESS_COMPILE_ONCE` is 0; True when it is the one named."""
    env = os.environ if environ is None else environ
    if env.get(SWITCH_ENV, "1").strip().lower() not in ("0", "false", "no", "off") and _has_flock():
        env.setdefault(ENV, SPEC)
    return env.get(ENV) == SPEC


def _has_flock() -> bool:
    """The lock is an `fcntl.flock` (POSIX); elsewhere Triton keeps its own cache manager."""
    try:
        import fcntl  # noqa: F401
    except ImportError:
        return False
    return True
