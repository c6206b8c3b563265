"""Ending a run and everything it started: signals as interrupts, and the process tree ended at exit.

A run (`python -m harness ...`, a pytest session) starts processes that outlive their parent unless ended: fork
servers and resource trackers of `multiprocessing`, sweep workers, kernel hosts (each leading its own process session)
and whatever a kernel started. Each of them exits by itself once its parent is gone, but only when it next looks
(a fork server still importing torch, a resource tracker waiting for every holder of its pipe): tens of seconds on a
busy machine, with the terminal's pipe held open all that time. So the process that owns a run marks its
environment (`own_tree`), which every process it starts inherits, and at its end (`end_tree`) kills every process
that descends from it or carries its mark (a descendant re-parented to init still carries it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

#: the environment variable that carries the marks of the runs a process belongs to (space-separated tokens)
TREE_ENV = "MOE_HARNESS_TREE"
#: signals that stop a run like Ctrl-C does
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

_token: str | None = None
#: the signal that last asked this process to stop (its name), None before any
_stop_signal: str | None = None


def own_tree() -> str:
    """Mark this process as the owner of a run (once): its token joins the marks in the environment, so that every
    process started from now on carries it."""
    global _token
    if _token is None:
        _token = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.environ[TREE_ENV] = f"{os.environ.get(TREE_ENV, '')} {_token}".strip()
    return _token


def owns_tree() -> bool:
    return _token is not None


def interrupt_on_signals() -> dict[int, Any]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt (naming the signal) in the main thread, as Ctrl-C does, so that the
    run stops through its cleanup instead of dying on the spot; Ctrl-C still raises it, and each is remembered
    (`stop_requested`); the handlers they replace ({} off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def stop(signum: int, frame: Any) -> None:
        global _stop_signal
        _stop_signal = signal.Signals(signum).name
        raise KeyboardInterrupt(_stop_signal)

    replaced = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        replaced[signal.SIGINT] = signal.signal(signal.SIGINT, stop)
    return replaced


def stop_requested() -> str | None:
    """The signal that asked this process to stop (SIGINT, SIGTERM, SIGHUP), None if none did. A KeyboardInterrupt
    raised inside a lock's wait can surface as another error (pytest then reports an internal error, not an
    interruption): whoever decides whether a run was cut short by the user asks this too."""
    return _stop_signal


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Ctrl-C and the stop signals are ignored inside (the final cleanup must not be cut, nor print a traceback)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, *STOP_SIGNALS)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _stat(pid: str) -> tuple[int, int, str] | None:
    """(ppid, session, state) of process `pid`, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[3]), fields[0]


def _marks(pid: str) -> list[str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return []
    key = TREE_ENV.encode() + b"="
    for entry in env.split(b"\0"):
        if entry.startswith(key):
            return entry[len(key):].decode(errors="replace").split()
    return []


def descendants(root: int | None = None, token: str | None = None) -> list[int]:
    """Live processes (zombies left out) that descend from `root` (default: this process) through their parents,
    carry the mark `token` (default: this process's, when it owns a run), or belong to a session led by one of them."""
    root = os.getpid() if root is None else root
    token = _token if token is None else token
    table = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit() and int(entry) != root and (info := _stat(entry)) is not None:
            table[int(entry)] = info
    found = {pid for pid in table if token and token in _marks(str(pid))}
    grew = True
    while grew:  # children of what was found, and members of the sessions they lead
        more = {pid for pid, (ppid, sid, _) in table.items()
                if pid not in found and (ppid == root or ppid in found or sid in found)}
        found |= more
        grew = bool(more)
    return sorted(pid for pid in found if table[pid][2] != "Z")


def end_tree(deadline_s: float = 3.0) -> list[int]:
    """SIGKILL every descendant of this process (see `descendants`) until none is left or `deadline_s` has passed;
    the ones still alive then (a process stuck in the kernel, e.g. a GPU driver's teardown) are no longer waited for
    by `multiprocessing` at exit. Returns what was killed."""
    killed: set[int] = set()
    end = time.monotonic() + deadline_s
    while True:
        alive = descendants()
        for pid in alive:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        killed.update(alive)
        if not alive or time.monotonic() > end:
            break
        time.sleep(0.02)
    _reap_and_forget(set(alive))
    return sorted(killed)


def _reap_and_forget(stuck: set[int]) -> None:
    """Reap the killed children that `multiprocessing` started; forget those that would not die, so that its exit
    handler does not wait for them without a limit."""
    import sys

    process = sys.modules.get("multiprocessing.process")
    if process is None:
        return
    for proc in list(getattr(process, "_children", ())):
        popen = getattr(proc, "_popen", None)
        if popen is None:
            continue
        if popen.pid in stuck:
            process._children.discard(proc)  # type: ignore[attr-defined]
        else:
            with contextlib.suppress(Exception):
                popen.wait(0.5)


def exit_now(code: int) -> None:
    """End this process with `code` once its exit handlers have run and its output is flushed, without the
    interpreter's teardown of every module (seconds with torch loaded on a busy machine); for a program's last line,
    after its files are closed."""
    import atexit
    import sys

    with uninterrupted():
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
