"""How a child process ended, in words (no torch: the pytest supervisor uses it before anything heavy loads)."""

from __future__ import annotations

import signal

#: signals that stop a run from outside (a user, a job's time limit): a process they end blames no kernel
INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def exit_cause(code: int | None) -> str:
    """From a return code (negative: the signal, as subprocess and multiprocessing report it): "exit status 3",
    "killed by SIGSEGV"; "still running" for None."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"
