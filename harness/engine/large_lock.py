"""One very large case at a time on a machine.

A case past 2**31 elements (`harness.ops.large`) holds tens of gigabytes on the GPU with its oracle and copies;
16 pytest-xdist workers that each reach theirs at once would run the GPU out of memory. Every judging of a case
whose inputs hold more than `LOCKED_ABOVE` elements takes an exclusive `fcntl` lock on one file in the temp
directory first (`HARNESS_LOCK_DIR` to choose another), which every process of the machine shares; smaller cases
never wait. `free()` asks whether another process holds it now, so that a judge with other work can do that first.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator

#: cases whose inputs hold more elements than this are judged one at a time on the machine
LOCKED_ABOVE = 1 << 28
LOCK_NAME = "moe-large-case.lock"


def lock_path() -> str:
    return os.path.join(os.environ.get("HARNESS_LOCK_DIR") or tempfile.gettempdir(), LOCK_NAME)


@contextlib.contextmanager
def one_at_a_time(elements: int, above: int = LOCKED_ABOVE, path: str | None = None) -> Iterator[bool]:
    """Held while a case of `elements` input elements is judged: the machine-wide lock above `above` (yields True),
    nothing at or below it (yields False)."""
    if elements <= above:
        yield False
        return
    with open(path or lock_path(), "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def free(path: str | None = None) -> bool:
    """Whether no process holds the lock at this moment (another may take it right after: a hint, not a hold)."""
    with open(path or lock_path(), "a+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        return True
