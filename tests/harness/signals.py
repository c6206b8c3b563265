"""The state of the processes the tests start: signals (a session stopped with a signal takes Ctrl-C as a user's
shell gives it: SIGINT at its default, nothing blocked, whatever the pytest worker starting it inherited) and the
GPUs they see."""

from __future__ import annotations

import signal

#: the environment of a child session that tests the plugin's own mechanics (ordering, threads, progress, its exit):
#: it never needs a GPU, and on a GPU machine under the suite's load every CUDA start in it cost seconds
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


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


#: the environment variable that marks every process of a run a test starts (their environment keeps it even when
#: they are re-parented to init)
MARK_ENV = "MOE_TEST_STOPS"


def leftovers(mark: str, session: int) -> list[str]:
    """Live processes (zombies left out) of session `session` or carrying `MOE_TEST_STOPS=mark` in their environment:
    "pid command" each."""
    import os

    found = []
    wanted = f"{MARK_ENV}={mark}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")[:160]
        except OSError:
            continue
        if fields[0] != "Z" and (int(fields[3]) == session or wanted in env):
            found.append(f"{entry} {command}")
    return found


def kill_leftovers(mark: str, session: int) -> None:
    """SIGKILL whatever `leftovers` finds (a test's cleanup: nothing it started outlives it)."""
    import os

    for line in leftovers(mark, session):
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except OSError:
            pass
