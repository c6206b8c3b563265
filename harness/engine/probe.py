"""Whether this machine lets a kernel host be sandboxed: the whole setup tried once, in a throwaway process.

Run by `harness.engine.sandbox` as `python -I -S` (stdlib only). It prints one line: `plain` (namespaces made as
root, no user namespace), `user` (in a user namespace), or `off: <why>`.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
import tempfile

from harness.engine import namespaces

#: sysctls that refuse user namespaces to unprivileged users: (file, value that refuses, the words for it)
_REFUSERS = (("/proc/sys/kernel/unprivileged_userns_clone", "0", "kernel.unprivileged_userns_clone=0"),
             ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1",
              "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1)"),
             ("/proc/sys/user/max_user_namespaces", "0", "user.max_user_namespaces=0"))


def _hint() -> str:
    found = []
    for path, refuses, words in _REFUSERS:
        try:
            with open(path) as f:
                if f.read().strip() == refuses:
                    found.append(words)
        except OSError:
            pass
    return f" ({'; '.join(found)})" if found else ""


def _in_child(how: str, folder: str) -> None:
    """The child's part: the host's setup, then a write into the read-only folder, which must be refused."""
    try:
        namespaces.unshare(user=how == "user")
        namespaces.bind([folder], [])
        namespaces.split(os.getppid())
    except BaseException as e:  # the reason, on the pipe
        print(f"{e}", flush=True)
        os._exit(2)
    try:  # in the namespace's host process
        with open(os.path.join(folder, "written"), "w") as f:
            f.write("x")
    except OSError as e:
        os._exit(0 if e.errno in (errno.EROFS, errno.EACCES) else 4)
    print("a write into a read-only bind went through", flush=True)
    os._exit(3)


def attempt(how: str, folder: str) -> str:
    """"" when the sandbox works `how`, else why not."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.dup2(write, 1)
        os.dup2(write, 2)
        _in_child(how, folder)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read) as f:
        said = f.read().strip()
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return ""
    return said.splitlines()[-1] if said else f"the probe ended with status {status}"


def main() -> int:
    folder = tempfile.mkdtemp(prefix="moe-harness-probe-")
    try:
        why = ""
        for how in (("plain", "user") if os.geteuid() == 0 else ("user",)):
            why = attempt(how, folder)
            if not why:
                print(how)
                return 0
        print(f"off: {why}{_hint() if 'NEWUSER' in why else ''}")
        return 0
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
