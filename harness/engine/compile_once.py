"""One compile per Triton kernel variant per machine: a process that needs a variant another process is compiling
waits for that compile's result instead of compiling it again.

A sweep's workers, and pytest-xdist's, judge cases of one kernel at the same time; with a cold Triton cache each of
them missed the shared on-disk cache for the same variants and compiled them side by side (on the H200's cold quick
matrix, the align kernel compiled 40 times for about 14 variants), each compile slowing the others down on a busy
CPU. Triton names a cache-manager class in `TRITON_CACHE_MANAGER` (`module:Class`); this one is Triton's own file
cache with a per-variant lock (an exclusive `flock` on a file in the variant's cache folder) taken on a miss and let
go once the compiled files are in:
- the first process to miss compiles, as it would have;
- the others wait for the lock, then find the variant in the cache (or, if the compile failed or its process died,
  compile it themselves);
- a wait never lasts longer than `WAIT_S`: a process whose compile raised keeps the lock until its next lookup, and
  a waiter that outlasts it compiles on its own.

`compile_once_env.install()` names this class in the environment (Triton imports it on its first compile), unless
the user named a cache manager of their own or turned it off (`MOE_HARNESS_COMPILE_ONCE=0`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from typing import Any

from triton.runtime.cache import FileCacheManager

from harness.engine.compile_once_env import SPEC, install

__all__ = ["SPEC", "CompileOnceCacheManager", "install"]

LOCK_NAME = "compile.lock"
#: the longest a process waits for another's compile of the same variant before compiling it itself
WAIT_S = 120.0
_POLL_S = 0.02

#: the lock each thread holds for the variant it is compiling: thread id -> (cache folder, lock file descriptor)
_held: dict[int, tuple[str, int]] = {}
#: what this process did on its cache misses: compiled itself, or waited and found another process's compile
STATS = {"compiled": 0, "waited": 0, "wait_s": 0.0, "gave_up": 0}


def _release(ident: int) -> None:
    held = _held.pop(ident, None)
    if held is not None:
        with contextlib.suppress(OSError):
            fcntl.flock(held[1], fcntl.LOCK_UN)
        with contextlib.suppress(OSError):
            os.close(held[1])


class CompileOnceCacheManager(FileCacheManager):
    """Triton's file cache; a miss of a compiled kernel's group takes the variant's lock (see the module)."""

    def get_group(self, filename: str) -> dict[str, str] | None:
        found = super().get_group(filename)
        # override and dump managers have no lock path; they never gate a compile
        if found is not None or getattr(self, "lock_path", None) is None:
            return found
        me = threading.get_ident()
        _release(me)  # a lock still held here is from a compile that raised: let its waiters go
        fd = os.open(os.path.join(self.cache_dir, LOCK_NAME), os.O_CREAT | os.O_RDWR, 0o666)
        t0 = time.monotonic()
        waited = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = True
                if time.monotonic() - t0 > WAIT_S:
                    os.close(fd)
                    STATS["gave_up"] += 1
                    return None
                time.sleep(_POLL_S)
        if waited:
            STATS["wait_s"] += time.monotonic() - t0
        found = super().get_group(filename)
        if found is not None:  # another process's compile, finished while this one waited or looked: use it
            STATS["waited"] += 1
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            return found
        STATS["compiled"] += 1
        _held[me] = (self.cache_dir, fd)  # Triton compiles now and calls put_group when the files are in
        return None

    def put_group(self, filename: str, group: dict[str, str]) -> Any:
        try:
            return super().put_group(filename, group)
        finally:
            held = _held.get(threading.get_ident())
            if held is not None and held[0] == self.cache_dir:
                _release(threading.get_ident())
