"""A one-process pytest session that runs generic tests is watched from a parent process.

A kernel can end its process from C code (`_exit(0)` in an extension, a crash); nothing inside the process can
refuse that, and under plain `pytest` it would end the session with the kernel's exit status, 0 included: a green
run with no tests after it. So, at the earliest plugin hook (before torch or CUDA is touched), the plugin starts
the same command line again as a child process and only waits: the child runs the session and tells the parent,
through an inherited pipe, which test it is in and, at the very end, that the session closed. A session that ends
without closing exits 1 (or the signal's 128+N) with a line naming the test it was in, and the case it was judging
is recorded as an error; unless the session was stopped from outside (SIGTERM or SIGHUP relayed by the parent, or the
child ended by SIGINT, SIGTERM or SIGHUP): then nothing is blamed and that case has no verdict. A child process, not a
fork: a fork after CUDA initialisation breaks CUDA in the child (seen on an H100). pytest-xdist sessions need none
of this (xdist reports a worker that dies), nor do in-process `pytest.main()` calls; `--moe-no-supervise` or
MOE_HARNESS_SUPERVISE=0 turns it off.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.core.exits import INTERRUPT_SIGNALS, exit_cause

_ENV = "MOE_HARNESS_SUPERVISE"
_FD_ENV = "MOE_HARNESS_SUPERVISOR_FD"
#: the results run id the parent chooses for its child, so that it can find the child's pending case
RUN_ID_ENV = "MOE_HARNESS_RUN_ID"


#: in the supervised child: the results run id its parent chose (taken once, hidden from subprocesses)
_run_id: str | None = os.environ.pop(RUN_ID_ENV, None)


def run_id() -> str:
    """The results run id the supervising parent chose for this session, or ""."""
    return _run_id or ""


def _take_channel() -> int | None:
    """In the supervised child: the write end of the pipe to the parent (taken once, hidden from subprocesses)."""
    fd = os.environ.pop(_FD_ENV, None)
    if fd is None:
        return None
    _die_with_parent()
    return int(fd)


def _die_with_parent() -> None:
    """Linux: the session ends when the watching parent is killed (a CI timeout that kills only it)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


#: the write end of the pipe to the watching parent, in the child (None: not supervised)
_channel: int | None = _take_channel()


def supervised() -> bool:
    """Whether this process is the session a watching parent started (which relays SIGTERM to it)."""
    return _channel is not None


def wanted(config: pytest.Config) -> bool:
    """A one-process session started from the command line, not turned off (read from the early options)."""
    early = config.known_args_namespace
    if os.environ.get(_ENV, "1") == "0" or getattr(early, "moe_no_supervise", False) or _channel is not None:
        return False
    if getattr(early, "numprocesses", None) not in (None, 0) or getattr(early, "dist", "no") != "no":
        return False  # the xdist controller: xdist reports its workers' deaths
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    from_command_line = argv0.name in ("pytest", "py.test") or argv0.parts[-2:] == ("pytest", "__main__.py")
    return from_command_line and tuple(sys.argv[1:]) == tuple(config.invocation_params.args)


def start(config: pytest.Config) -> None:
    """Run this command line again as a watched child; never returns (exits with the session's status)."""
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:  # pytest already redirects fds 0-2 to its capture files: give the child the real ones
        capture.suspend_global_capture(in_=True)
    read_end, write_end = os.pipe()
    # the results store's run-id form, made here without importing the store (it imports torch)
    chosen = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
    env = dict(os.environ, **{_FD_ENV: str(write_end), RUN_ID_ENV: chosen})
    folder = getattr(config.known_args_namespace, "moe_results_dir", None) or config.getini("moe_results_dir")
    sys.stdout.flush()
    sys.stderr.flush()
    from harness.core import stopping

    stopping.own_tree()  # the child and all it starts carry this process's mark
    env[stopping.TREE_ENV] = os.environ[stopping.TREE_ENV]
    child = subprocess.Popen([sys.executable, *sys.orig_argv[1:]], env=env, pass_fds=(write_end,))
    os.close(write_end)
    code = _watch(child, read_end, lambda code: _record_the_dead_case(folder, chosen, code))
    stopping.end_tree()  # what a child ended by a signal left running (its kernel hosts, fork servers)
    os._exit(code)


def _record_the_dead_case(folder: str, run_id: str, code: int) -> None:
    """The case the child was judging when it died gets its error verdict and case file (harness.store.results)."""
    from harness.store.results import resolve_pending

    try:
        dead = resolve_pending(folder, f"pytest-{run_id}", exit_cause(code))
    except OSError as e:
        sys.stderr.write(f"moe-harness: could not record the case that was running ({e})\n")
        return
    for r in dead:
        sys.stderr.write(f"moe-harness: recorded {r.case.case_id} ({r.adapter}) as error: {r.reason}; its case file "
                         f"is in {os.path.join(folder, 'cases')}\n")


def tell(line: str) -> None:
    """Send one line to the watching parent (no-op when not supervised)."""
    if _channel is not None:
        try:
            os.write(_channel, (line.replace("\n", " ") + "\n").encode()[:4000])
        except OSError:
            pass


def _watch(proc: subprocess.Popen, channel: int, on_unclosed: Callable[[int], None] | None = None) -> int:
    """The parent: relay signals, follow the child's messages, and return the exit status this process ends with.
    `on_unclosed(status)` runs when the child died without closing."""
    child = proc.pid
    relayed: list[int] = []

    def relay(signum: int, frame: Any) -> None:
        relayed.append(signum)
        os.kill(child, signum)

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the child from the terminal; it reports it
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, relay)
    buffered, current, closed, eof = b"", "", False, False
    status = None
    while status is None:
        if not eof and select.select([channel], [], [], 0.5)[0]:
            data = os.read(channel, 65536)
            eof = not data
            buffered += data
        pid, raw = os.waitpid(child, 0 if eof else os.WNOHANG)
        if pid == child:
            status = raw
            while not eof and select.select([channel], [], [], 0)[0]:  # written just before the child ended
                data = os.read(channel, 65536)
                eof = not data
                buffered += data
        *lines, buffered = buffered.split(b"\n")
        for line in lines:
            text = line.decode(errors="replace")
            if text.startswith("test "):
                current = text[5:]
            elif text == "closed":
                closed = True
    code = os.waitstatus_to_exitcode(status)
    shell_code = 128 - code if code < 0 else code  # a signal as a shell reports it
    if closed:
        return shell_code
    where = f" during {current}" if current else ""
    stopped_by = relayed[0] if relayed else -code if -code in INTERRUPT_SIGNALS else 0
    if stopped_by:  # the session was stopped from outside: nothing is blamed on the test it was in
        sys.stderr.write(f"\nmoe-harness: the pytest session was interrupted ({signal.Signals(stopped_by).name})"
                         f"{where}; the case that was running has no verdict (not run).\n")
        sys.stderr.flush()
        return shell_code or 128 + stopped_by
    sys.stderr.write(f"\nmoe-harness: the pytest session ended without closing ({exit_cause(code)}){where}. A test "
                     "ended the process (a kernel's exit or crash in C code); its verdict and those of every later "
                     "test are missing. Run with -n 1 (pytest-xdist) to have the crash reported and the rest run.\n")
    if on_unclosed is not None:
        on_unclosed(code)
    sys.stderr.flush()
    return shell_code or 1
