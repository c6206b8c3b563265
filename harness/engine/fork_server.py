"""The kernel hosts' fork server: what it preloads, and starting it before the caller imports torch.

A kernel host forks from a fork server, a fresh process that has imported torch and never touched CUDA
(`harness.engine.host`). Most of that server's start is its own torch import. `start_early()` starts it without
waiting for it: a command that calls it before importing torch itself has both imports run side by side instead of
one after the other. What the caller sets afterwards (TRITON_INTERPRET, the cache manager, the import path) still
reaches every host: a host takes its judge's environment, path and folder when it starts, not the server's. Nothing
it preloads imports Triton or a kernel module, so the interpreter can still be chosen after the server started.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

__all__ = ["PRELOAD", "context", "start_early"]

#: what the server imports once for every host it forks
PRELOAD = ("torch", "harness.engine.forkserver_detach", "harness.engine.hosted")


def context() -> Any:
    """The fork server's multiprocessing context where there is one (its preload set), else spawn's."""
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(list(PRELOAD))
        return ctx
    return mp.get_context("spawn")


def start_early() -> bool:
    """Start the fork server now, without waiting for its preload; False where there is no fork server (spawn)."""
    if context().get_start_method() != "forkserver":
        return False
    from multiprocessing import forkserver

    forkserver.ensure_running()
    return True
