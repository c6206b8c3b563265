"""Signal state for the tests that stop a session with a signal: the process they start takes Ctrl-C as a user's
shell gives it (SIGINT at its default, nothing blocked), whatever the pytest worker starting it inherited."""

from __future__ import annotations

import signal


def as_from_a_shell() -> None:
    """A Popen preexec_fn: SIGINT and SIGTERM at their defaults and no signal blocked (both survive exec)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def state() -> str:
    """This process's ignored and blocked signal masks (/proc), for a failure message."""
    try:
        with open("/proc/self/status") as f:
            return " ".join(line.strip() for line in f if line.startswith(("SigIgn", "SigBlk")))
    except OSError:
        return "(no /proc)"
