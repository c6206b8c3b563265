"""The Linux mechanics of a sandboxed kernel host: namespaces, read-only binds, dropped capabilities (stdlib only).

A host process (H, the one multiprocessing started and the judge watches) unshares a PID and a mount namespace
(inside a user namespace where it is not root, or where root may not do it alone), binds the judge's folders
read-only, and forks the namespace's init (C, pid 1). C mounts a /proc of the namespace, drops every capability and
forks the real host (G, pid 2), which runs the host's loop as an ordinary process (an init ignores the signals it
sends itself: a kernel that kills its own process must die as it would anywhere). When G ends, C hands H its wait
status and exits; the kernel then kills every process left in the namespace, whatever session it made. When H dies
(killed by its judge), C gets SIGKILL (parent-death signal), with the same effect.

Capabilities go before any kernel runs: without CAP_SYS_ADMIN nothing inside can unmount or remount the read-only
binds, and in a nested user namespace they are locked (the kernel's rule for mounts copied into a less privileged
namespace).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import select
import signal
import time
from collections.abc import Sequence

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
#: statvfs flag -> mount flag, for the flags a bind remount must keep (a user namespace may not clear them)
_KEPT = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
         (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME))
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CAP_VERSION_3 = 0x20080522
#: the exit status of a host whose judge is gone (as the unsandboxed host's watch thread)
JUDGE_GONE = 70


class SetupError(OSError):
    """A step of the sandbox's setup was refused; the message names the step."""


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    libc.unshare.argtypes = [ctypes.c_int]
    return libc


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise SetupError(err, f"{what}: {os.strerror(err)}")


def _prctl(option: int, arg: int = 0) -> int:
    return int(_libc().prctl(option, arg, 0, 0, 0))


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = (lambda s: None if s is None else s.encode())
    _check(_libc().mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


# --- H: the namespaces and the read-only binds -------------------------------------------------------------------

def die_with_parent() -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def unshare(user: bool) -> None:
    """A PID and a mount namespace for this process's next child (and, `user`, a user namespace mapping this
    process's ids to themselves). Must run before this process starts a thread."""
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWPID | CLONE_NEWNS | (CLONE_NEWUSER if user else 0)
    names = "CLONE_NEWPID|CLONE_NEWNS" + ("|CLONE_NEWUSER" if user else "")
    _check(_libc().unshare(flags), f"unshare({names})")
    if user:
        _map_ids(uid, gid)


def _map_ids(uid: int, gid: int) -> None:
    def write(name: str, text: str) -> None:
        try:
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        except OSError as e:
            raise SetupError(e.errno, f"writing /proc/self/{name}: {e.strerror}") from None

    if uid == 0:  # root outside keeps every id (it may map them all): file owners stay what they are
        with contextlib.suppress(SetupError):
            write("uid_map", "0 0 4294967295\n")
            write("gid_map", "0 0 4294967295\n")
            return
    write("setgroups", "deny")
    write("uid_map", f"{uid} {uid} 1\n")
    write("gid_map", f"{gid} {gid} 1\n")


def _kept_flags(path: str) -> int:
    have = os.statvfs(path).f_flag
    return sum(ms for st, ms in _KEPT if have & st)


def bind(readonly: Sequence[str], writable: Sequence[str]) -> None:
    """Make every folder of `readonly` read-only in this mount namespace, but the `writable` paths that lie inside
    one of them (bound first, so that the read-only binds carry them along, writable)."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the judge's namespace
    for path in writable:
        _mount(path, path, None, MS_BIND | MS_REC)
    for path in readonly:
        _mount(path, path, None, MS_BIND | MS_REC)
        _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _kept_flags(path))


def hide(folders: Sequence[str], files: Sequence[str]) -> None:
    """Cover each of `folders` with an empty read-only file system of this namespace, and each of `files` with an
    empty file (/dev/null): nothing under them can be read here, and without CAP_SYS_ADMIN nothing can uncover them."""
    for path in folders:
        _mount("none", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k,mode=0500")
    for path in files:
        _mount("/dev/null", path, None, MS_BIND)
        _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _kept_flags(path))


# --- C: the namespace's init, and G --------------------------------------------------------------------------------

def drop_privileges() -> None:
    """No capability left, none to gain by exec: nothing this process starts can remount the read-only binds."""
    _check(_prctl(PR_SET_NO_NEW_PRIVS, 1), "prctl(PR_SET_NO_NEW_PRIVS)")
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        _prctl(PR_CAPBSET_DROP, cap)  # EINVAL past the kernel's last one: ignored
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(_libc().capset(header, data), "capset")


def split(judge: int) -> None:
    """In H, after `unshare` and `bind`: fork the namespace's init and, from it, the real host. Returns only in the
    real host (G); H ends as G ended (its exit status or its signal), or when its judge is gone."""
    status_r, status_w = os.pipe()
    life_r, life_w = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(status_r)
        os.close(life_w)
        _be_init(status_w, life_r)  # returns in G only
        return
    os.close(status_w)
    os.close(life_r)
    _wait_either(init, judge)
    _, status = os.waitpid(init, 0)
    raw = os.read(status_r, 4)
    _end_as(int.from_bytes(raw, "little") if len(raw) == 4 else status)


def _be_init(status_w: int, life_r: int) -> None:
    _check(_prctl(PR_SET_PDEATHSIG, signal.SIGKILL), "prctl(PR_SET_PDEATHSIG)")
    if select.select([life_r], [], [], 0)[0]:  # H died before the parent-death signal was set
        os._exit(1)
    try:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        drop_privileges()
    except SetupError as e:
        print(f"moe-harness: kernel host sandbox: {e}", flush=True)
        os._exit(1)
    host = os.fork()
    if host == 0:
        os.close(status_w)
        os.close(life_r)
        return
    _prctl(PR_SET_DUMPABLE, 0)  # nothing inside may trace the init
    while True:
        pid, status = os.wait()  # the host, and whatever the kernel of it left behind
        if pid == host:
            os.write(status_w, status.to_bytes(4, "little"))
            os._exit(0)  # the namespace ends with its init: everything left in it is killed


def _wait_either(init: int, judge: int) -> None:
    """Return when the init ends; end this process (and with it the namespace) when the judge is gone first. No
    thread: a process that unshared a PID namespace cannot start one."""
    fds = []
    with contextlib.suppress(AttributeError, OSError):
        fds = [os.pidfd_open(init), os.pidfd_open(judge)]
    while True:
        if fds:
            ready = select.select(fds, [], [])[0]
        else:
            time.sleep(0.1)
            ready = []
        if (fds and fds[0] in ready) or os.waitid(os.P_PID, init, os.WEXITED | os.WNOHANG | os.WNOWAIT):
            return
        if (fds and fds[1] in ready) or not _exists(judge):
            os._exit(JUDGE_GONE)  # the init gets SIGKILL: the whole namespace ends


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    return True


def _end_as(status: int) -> None:
    """End this process as the real host ended: the judge reads the same exit status or signal."""
    if os.WIFEXITED(status):
        os._exit(os.WEXITSTATUS(status))
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else signal.SIGKILL
    import resource

    with contextlib.suppress(Exception):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the host dumped its core already, if it did
    with contextlib.suppress(Exception):
        signal.signal(sig, signal.SIG_DFL)
    with contextlib.suppress(Exception):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)


# --- the judge's view of a sandboxed host --------------------------------------------------------------------------

def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, start time) of `pid`, None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[19])


def descendants(root: int) -> list[int]:
    """Every process below `root` (Linux /proc), nearest first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            children.setdefault(st[0], []).append(int(entry))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _inner_pid(pid: int) -> str:
    """`pid`'s number in the pid namespace one below the judge's (a sandbox's); "" when gone or not in one."""
    try:
        with open(f"/proc/{pid}/status") as f:
            ns = next((line.split()[1:] for line in f if line.startswith("NSpid:")), [])
    except OSError:
        return ""
    return ns[1] if len(ns) >= 2 else ""


def real_host(outer: int) -> int | None:
    """The pid (as the judge sees it) of the process that runs the host's loop under host process `outer`: the
    namespace's pid 2. None while it is not started."""
    return next((pid for pid in descendants(outer)[:8] if _inner_pid(pid) == "2"), None)


def kill_left_behind(outer: int) -> int:
    """SIGKILL what the kernels of sandboxed host `outer` left running: every process of its namespace but its
    init (1) and the host (2), one that started a new session included; how many there were."""
    found = [p for p in descendants(outer) if _inner_pid(p) not in ("", "1", "2")]
    for pid in found:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return len(found)
