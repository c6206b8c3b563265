"""Kernel hosts sealed by the operating system: a PID and a mount namespace of their own (Linux).

A process a kernel starts in a new session escapes the kill of its host's session; in the host's PID namespace it
cannot outlive the host: when the host ends, the kernel (the operating system's) kills every process of the
namespace, and after each run the judge kills every one but the host. In the host's mount namespace the checkout
(or, installed, the judge's packages), the results folders and where the judge's processes load code from
(`code_paths`) are read-only, but for the caches and scratch folders kernels write (Triton's cache, the temporary
folder, /dev/shm: the shared arena, the judge's own mount). The folder of the judge's manifest key
(`harness.core.keyfile`) is covered with an empty file system: a kernel that read the key could sign the results it
forges. So is the folder of the socket of the fork server the host was forked from: that server's children run
outside the host's namespaces. The mechanics are in `harness.engine.namespaces`.

Every host's stdout and stderr go to a log of its own (`Host.log`, in the temporary folder), never the judge's
console; a host's death names the log's last lines.

MOE_HARNESS_SANDBOX: `auto` (default: sandboxed where the OS allows it, else said once, in one line, and run as
before), `on` (a host that cannot be sandboxed does not start), `off`. `describe()` is the line the pytest header
and the sweep print; `python -m harness.engine.sandbox_check` proves it on a live host. `protect(path)` adds a
folder (a results folder, a rendered matrix's) to the read-only ones of the hosts started afterwards by this
process and the processes it starts (MOE_HARNESS_READONLY).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.core import keyfile
from harness.engine import family_cache

ENV = "MOE_HARNESS_SANDBOX"
SETTINGS = ("auto", "on", "off")
READONLY_ENV = "MOE_HARNESS_READONLY"
#: the probe's finding, for the processes this one starts ("plain", "user" or "off: <reason>"): probed once
PROBED_ENV = "MOE_HARNESS_SANDBOX_PROBED"
#: a host's log, `<prefix><judge pid>-<8 hex>.log`: a neutral name (a kernel sees it behind its stdout), and the
#: prefix older versions used, whose logs are removed as well
LOG_PREFIX, OLD_LOG_PREFIX = "host-", "moe-harness-host-"
#: in a host's environment: its pid as its judge sees it (inside a sandbox, `os.getpid()` is its namespace's)
HOST_PID_ENV = "MOE_HARNESS_HOST_PID"
#: what a host's death quotes of its log
TAIL_LINES, TAIL_CHARS = 20, 2000


class SandboxUnavailable(RuntimeError):
    """MOE_HARNESS_SANDBOX=on, and this machine refuses the namespaces."""


@dataclass(frozen=True)
class Availability:
    """What this machine allows: how a host is sandboxed ("plain": as root, "user": in a user namespace; "": not),
    and why not."""

    how: str
    reason: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.how)


@dataclass(frozen=True)
class Launch:
    """What a host process is told before it starts: its log, how to sandbox it and which paths."""

    log: str
    how: str = ""
    readonly: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()
    #: folders covered with an empty file system (the key's), and files covered with an empty one
    hidden: tuple[str, ...] = ()
    hidden_files: tuple[str, ...] = ()


_FOUND: Availability | None = None


def setting(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    value = env.get(ENV, "").strip().lower() or "auto"
    if value not in SETTINGS:
        raise ValueError(f"{ENV}={env.get(ENV)!r}: expected one of {', '.join(SETTINGS)}")
    return value


def availability() -> Availability:
    """Whether kernel hosts can be sandboxed here: probed once (in a child process), then known to this process and
    to those it starts. Under `auto`, a refusal is said once, on stderr."""
    global _FOUND
    if _FOUND is None:
        inherited = os.environ.get(PROBED_ENV, "")
        if inherited in ("plain", "user") or inherited.startswith("off:"):
            _FOUND = Availability(*(("", inherited[4:].strip()) if inherited.startswith("off:") else (inherited,)))
        else:
            _FOUND = _probe()
            os.environ[PROBED_ENV] = _FOUND.how or f"off: {_FOUND.reason}"
            if not _FOUND.ok and setting() == "auto":
                print(f"moe-harness: {describe()} ({ENV}=off: run so without this note; =on: refuse to)",
                      file=sys.stderr, flush=True)
    return _FOUND


def describe() -> str:
    """One line: how this process's kernel hosts run."""
    mode = setting()
    if mode == "off":
        return f"kernel hosts: not sandboxed ({ENV}=off)"
    found = availability()
    if found.how == "plain":
        return "kernel hosts: sandboxed (pid+mount namespace)"
    if found.how == "user":
        return "kernel hosts: sandboxed (pid+mount namespace, in a user namespace)"
    return f"kernel hosts: {'cannot be sandboxed here' if mode == 'on' else 'not sandboxed'}: {found.reason}"


def _probe() -> Availability:
    if not sys.platform.startswith("linux"):
        return Availability("", f"namespaces are Linux's ({sys.platform})")
    root = str(Path(__file__).resolve().parents[2])
    code = f"import sys; sys.path.insert(0, {root!r}); from harness.engine import probe; sys.exit(probe.main())"
    try:
        done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return Availability("", f"the probe did not run ({e})")
    answer = (done.stdout.strip().splitlines() or [""])[-1]
    if answer in ("plain", "user"):
        return Availability(answer)
    why = answer.removeprefix("off:").strip() or (done.stderr.strip().splitlines() or ["the probe failed"])[-1]
    return Availability("", why)


# --- what a host is told -------------------------------------------------------------------------------------------

def protect(*paths: str | os.PathLike) -> None:
    """Make `paths` (folders, created when missing) read-only to the kernel hosts started from now on."""
    listed = [p for p in os.environ.get(READONLY_ENV, "").split(os.pathsep) if p]
    for p in paths:
        real = os.path.realpath(p)
        with contextlib.suppress(OSError):
            os.makedirs(real, exist_ok=True)
        if real not in listed:
            listed.append(real)
    os.environ[READONLY_ENV] = os.pathsep.join(listed)


def judge_paths() -> list[str]:
    """The judge's own files: its checkout, or (installed) its packages."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "reference").is_dir() and (root / "harness").is_dir():
        return [str(root)]
    return [str(root / name) for name in ("harness", "reference", "kernels") if (root / name).is_dir()]


def code_paths(env: Mapping[str, str]) -> list[str]:
    """Where the judge's processes load code from besides the judge's own files: the Python environment (its
    prefixes and site-packages), every folder on the module path, the bytecode kept apart from the sources
    (`harness.core.bytecode`), and the caches only judges write (`harness.core.entries.JUDGE_ONLY`). A kernel
    that wrote there would have what it wrote run or believed by a judge process started later in the run (a fork
    server, a child session, a module imported late), outside its host. Skipped: the root folder, the home folder
    and the folders that hold it (a module path entry that is one keeps the home folder writable, as kernels' caches
    need)."""
    import site
    import sysconfig

    from harness.core import bytecode, entries

    home = os.path.realpath(env.get("HOME") or str(Path.home()))
    if kept := bytecode.prefix(env):
        with contextlib.suppress(OSError):
            os.makedirs(kept, exist_ok=True)  # by the judge: a kernel must not be the first to make it
    found = [sys.prefix, sys.base_prefix, sys.exec_prefix, site.getusersitepackages(), kept,
             *entries.judge_only_folders(),
             *(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")), *sys.path]
    real = (os.path.realpath(p) for p in found if isinstance(p, str))
    return [p for p in dict.fromkeys(real) if p != "/" and not _inside(home, p) and os.path.isdir(p)]


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def writable_paths(env: Mapping[str, str]) -> list[str]:
    """What kernels and their host write: Triton's and torch's caches, the temporary folder, shared memory, the
    sweep's warnings log, the compile log (`log_files`)."""
    home = env.get("HOME") or str(Path.home())
    triton = env.get("TRITON_CACHE_DIR") or os.path.join(env.get("TRITON_HOME") or home, ".triton")
    found = [tempfile.gettempdir(), "/dev/shm", triton, env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"),
             env.get("TORCHINDUCTOR_CACHE_DIR", ""), *log_files(env)]
    return list(dict.fromkeys(os.path.realpath(p) for p in found if p))


def log_files(env: Mapping[str, str]) -> list[str]:
    """The log files hosts append to: the sweep's warnings log, the compile log (harness.engine.compile_log)."""
    return [p for p in (env.get("MOE_HARNESS_WARNINGS_LOG", ""), env.get("MOE_HARNESS_COMPILE_LOG", "")) if p]


def launch(env: Mapping[str, str], log: str) -> Launch:
    """How to start a host with environment `env` (the judge's): SandboxUnavailable under `on` where the OS
    refuses."""
    if setting(env) == "off":
        return Launch(log)
    found = availability()
    if not found.ok:
        if setting(env) == "on":
            raise SandboxUnavailable(f"{ENV}=on: kernel hosts cannot be sandboxed here: {found.reason}")
        return Launch(log)
    listed = [p for p in env.get(READONLY_ENV, "").split(os.pathsep) if p]
    # the Triton cache's root, all families' folders in it (the host's own is in writable_paths: bound writable)
    shared_cache = [env[family_cache.ROOT_ENV]] if env.get(family_cache.ROOT_ENV) else []
    readonly = [os.path.realpath(p) for p in [*judge_paths(), *listed, *code_paths(env), *shared_cache]]
    writable = [w for w in writable_paths(env) if any(_inside(w, r) and w != r for r in readonly)]
    readonly = [r for r in dict.fromkeys(readonly) if os.path.isdir(r) and r not in writable_paths(env)]
    hidden, hidden_files = key_hiding(env, [*readonly, *writable_paths(env)])
    return Launch(log, found.how, tuple(sorted(readonly, key=len)), tuple(sorted(writable, key=len)), hidden,
                  hidden_files)


def key_hiding(env: Mapping[str, str], bound: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What hides the manifest key from a host: its folder, unless something the host needs lies in it (a folder
    bound for it, Python's own files; a key named in the home folder, say), else the key file itself (when it
    exists: a key made later in such a folder is readable)."""
    key = os.path.realpath(keyfile.key_path(env))
    folder = os.path.dirname(key)
    needed = [*bound, sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
              *(p for p in sys.path if p.startswith("/"))]
    if folder != "/" and not any(_inside(os.path.realpath(p), folder) for p in needed):
        return (folder,), ()
    return (), ((key,) if os.path.isfile(key) else ())


# --- the host's log ------------------------------------------------------------------------------------------------

def new_log() -> str:
    """A log file for one host of this process (the logs of judges that are gone are removed first)."""
    folder = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            pid = _log_owner(name)
            if pid and not _alive(pid):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, name))
    path = os.path.join(folder, f"{LOG_PREFIX}{os.getpid()}-{secrets.token_hex(4)}.log")
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    return path


def _log_owner(name: str) -> int:
    """The judge pid in a host log's file name; 0 when `name` is not one (nothing else is removed)."""
    prefix = next((p for p in (OLD_LOG_PREFIX, LOG_PREFIX) if name.startswith(p)), None)
    parts = name[len(prefix):].removesuffix(".log").split("-") if prefix and name.endswith(".log") else []
    ok = len(parts) == 2 and parts[0].isdigit() and len(parts[1]) == 8 and set(parts[1]) <= set("0123456789abcdef")
    return int(parts[0]) if ok else 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def log_tail(path: str | None) -> str:
    """The last lines a host wrote ("" when none)."""
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4 * TAIL_CHARS))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()][-TAIL_LINES:]
    return "\n".join(lines)[-TAIL_CHARS:]


def remove_log(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


# --- in the host process -------------------------------------------------------------------------------------------

def _to_log(path: str) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _make_writable(paths: tuple[str, ...], logs: set[str]) -> None:
    """The writable paths must exist to be bound (a cache not made yet, a log file)."""
    for path in paths:
        with contextlib.suppress(OSError):
            if path in logs:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
            else:
                os.makedirs(path, exist_ok=True)


def enter(plan: Launch, judge: int, env: dict[str, str]) -> bool:
    """First steps of a new host process: its output to its log, then (sandboxed) namespaces of its own. Returns in
    the process that is to run the host's loop: True when that one is sandboxed (it cannot see its judge: the process
    that called this watches the judge and never returns), False when not. `env` (the host's) gets HOST_PID_ENV."""
    _to_log(plan.log)
    env[HOST_PID_ENV] = str(os.getpid())
    if not plan.how:
        return False
    from harness.engine import namespaces

    with contextlib.suppress(OSError):
        os.setsid()
    namespaces.die_with_parent()
    _make_writable(plan.writable, {os.path.realpath(p) for p in log_files(env)})
    for folder in plan.hidden:  # made now (as the judge makes it), so that a key made later is hidden too
        with contextlib.suppress(OSError):
            os.makedirs(folder, mode=0o700, exist_ok=True)
    hidden = [*plan.hidden, *fork_server_folders()]
    namespaces.unshare(user=plan.how == "user")
    namespaces.bind(plan.readonly, [w for w in plan.writable if os.path.exists(w)])
    namespaces.hide([f for f in hidden if os.path.isdir(f)], plan.hidden_files)
    namespaces.split(judge)
    return True


def fork_server_folders() -> list[str]:
    """The folder of the socket of the fork server this host was forked from. A host inherits the server's address;
    a kernel that connected to it could have the server fork a process outside every namespace of the host (the
    judge's PID and mount namespaces, the results folders writable): covered, the socket cannot be reached here."""
    forkserver = sys.modules.get("multiprocessing.forkserver")
    address = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_address", None)
    if not isinstance(address, str) or not address.startswith("/"):
        return []  # none, or in the abstract namespace (not a path)
    return [os.path.dirname(os.path.realpath(address))]
