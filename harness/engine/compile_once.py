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
- a compile that raises lets go when Triton drops its cache manager (one per compile), or at the process's next
  lookup; a wait never lasts longer than `WAIT_S` (a waiter that outlasts it compiles on its own).

`compile_once_env.install()` names this class in the environment (Triton imports it on its first compile), unless
the user named a cache manager of their own or turned it off (`MOE_HARNESS_COMPILE_ONCE=0`).

A kernel host compiles into its family's folder of the cache (`family_cache`). Before it compiles a variant it does
not have, it looks in the folder its environment names as trusted (`family_cache.TRUSTED_ENV`: this repository's
adapters' folder, which only their hosts write): an adapter that runs this repository's kernels under another family
(a test's, a user's `module:object`) loads the variants those hosts compiled instead of compiling them again.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from typing import Any

from triton.runtime.cache import FileCacheManager

from harness.engine.family_cache import TRUSTED_ENV

__all__ = ["CompileOnceCacheManager"]

LOCK_NAME = "compile.lock"
#: the longest a process waits for another's compile of the same variant before compiling it itself
WAIT_S = 120.0
_POLL_S = 0.02

#: the lock each thread holds for the variant it is compiling: thread id -> (its manager's token, lock file descriptor)
_held: dict[int, tuple[object, int]] = {}
_guard = threading.Lock()
#: what this process did on its cache misses: compiled itself, or waited and found another process's compile
STATS = {"compiled": 0, "waited": 0, "wait_s": 0.0, "gave_up": 0}


def _release(ident: int, token: object = None) -> None:
    """Let go of the lock thread `ident` holds (only if it was taken by the manager holding `token`, when given)."""
    with _guard:
        held = _held.get(ident)
        if held is None or (token is not None and held[0] is not token):
            return
        del _held[ident]
    with contextlib.suppress(OSError):
        fcntl.flock(held[1], fcntl.LOCK_UN)
    with contextlib.suppress(OSError):
        os.close(held[1])


class CompileOnceCacheManager(FileCacheManager):
    """Triton's file cache; a miss of a compiled kernel's group takes the variant's lock (see the module)."""

    def get_group(self, filename: str) -> dict[str, str] | None:
        found = super().get_group(filename) or self._trusted_group(filename)
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
        # Triton compiles now and calls put_group when the files are in; a compile that raises drops this manager
        # (one per compile), whose __del__ lets go
        self._token, self._holder = object(), me
        with _guard:
            _held[me] = (self._token, fd)
        return None

    def _trusted_group(self, filename: str) -> dict[str, str] | None:
        """The variant's files in the trusted folder (read there, never written), or None."""
        trusted = os.environ.get(TRUSTED_ENV, "")
        if not trusted or getattr(self, "lock_path", None) is None or not getattr(self, "key", ""):
            return None
        there = FileCacheManager.__new__(FileCacheManager)
        there.key, there.cache_dir = self.key, os.path.join(trusted, self.key)
        return there.get_group(filename) if os.path.isdir(there.cache_dir) else None

    def put_group(self, filename: str, group: dict[str, str]) -> Any:
        try:
            return super().put_group(filename, group)
        finally:
            self._let_go()

    def _let_go(self) -> None:
        if getattr(self, "_token", None) is not None:
            _release(self._holder, self._token)
            self._token = None

    def __del__(self) -> None:
        self._let_go()
