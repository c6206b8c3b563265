"""Imported by the kernel hosts' fork server, and only there (the preload list of `harness.engine.fork_server`):
the fork server leaves the judge's session and process group. A host is the fork server's child; a kernel that
signals its host's parent's process group (SIGINT to every process of it, as a Ctrl-C does) then reaches the fork
server, which ignores SIGINT, and no judge."""

from __future__ import annotations

import contextlib
import os
import sys


def _in_fork_server() -> bool:
    """Whether this import runs inside multiprocessing's fork server (its `main` is on the stack)."""
    frame = sys._getframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "main" and code.co_filename.endswith(os.path.join("multiprocessing", "forkserver.py")):
            return True
        frame = frame.f_back
    return False


if _in_fork_server():
    with contextlib.suppress(OSError):
        os.setsid()
