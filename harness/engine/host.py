"""The kernel host: the process that imports an adapter's module and runs its kernel, apart from the judge.

The judge (the sweep's worker, the pytest process, replay's child) never imports an adapter module. It asks a host
for the adapter's declarations (`describe`, `rule`, `conventions`, ...), builds the case's inputs itself, computes
the expected values with the oracle in its own memory, and hands the kernel only copies of the inputs and poisoned
output buffers in a shared-memory arena (`Arena`). After the run it copies what the arena holds into its own memory
and judges that: the host never holds an expected value, a comparison or the verdict store.

Messages from the judge to the host are pickled (the host trusts the judge); replies from the host are JSON, read
with `json.loads` (a pickle would run code in the judge). On a GPU the host copies the arena's tensors to the device,
runs the kernel there and copies the outputs (and the inputs, so that a kernel that writes into them is seen) back;
a case the judge builds on the GPU goes through a device arena both map instead (`device_share`), with no copies.

The host leads a process group of its own (setsid): whatever it starts is ended with it (`kill_session`); it dies with
its judge (PR_SET_PDEATHSIG, and a thread that watches the judge's pid). Where the OS allows it, the host runs in a
PID and a mount namespace of its own (`harness.engine.sandbox`): a process a kernel starts in another session dies
with the host too, and the checkout and the results folders are read-only to it. Its stdout and stderr go to its log
(`Host.log`), never the judge's console. Its own process-state checks
(`harness.core.isolation`) are diagnostics: the reply names what a kernel changed, and the host restores it before the
next case, but no verdict depends on what a host says about itself beyond its output tensors.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import multiprocessing as mp
import multiprocessing.util  # its exit handler registered first, so that it runs after ours
import os
import re
import signal
import sys
import time
import traceback
import weakref
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from harness.core.device import threads_for
from harness.engine import compile_once_env, family_cache, fork_server, host_gpu, namespaces, sandbox

if TYPE_CHECKING:
    from harness.engine.arena import Arena

#: largest reply a judge reads from a host (a reply is JSON: descriptions, never tensors)
MAX_REPLY = 16 * 1024 * 1024
#: seconds a host may take to start (import torch, the adapter's module, its library) before it counts as dead
START_TIMEOUT_S = 300.0
#: resident memory (MiB) past which the judge kills a host mid-run (None: no limit); MOE_HARNESS_HOST_MEMORY_MB
HOST_MEMORY_MB_ENV = "MOE_HARNESS_HOST_MEMORY_MB"
_ALIGN = 64
#: CUDA errors after which a process's context is unusable: its host is replaced before the next case
STICKY_CUDA = re.compile(r"illegal memory access|unspecified launch failure|misaligned address|"
                         r"device-side assert|CUDA error: an illegal|cudaErrorIllegalAddress|CUDA-capable device",
                         re.IGNORECASE)


class HostDied(Exception):
    """The host process ended (a crash, an exit from C code, killed for its memory) or stopped answering."""


class KernelRaised(Exception):
    """The kernel raised in its host; what the host reported of the exception (type, message chain, frame)."""

    def __init__(self, info: Mapping[str, Any]):
        self.info = dict(info)
        super().__init__(" <- caused by ".join(self.info.get("chain") or [self.info.get("type", "exception")]))

    @property
    def type_name(self) -> str:
        return str(self.info.get("type", "Exception"))


# --- the host process ---------------------------------------------------------------------------------------------

def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(Exception):
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def log_warnings_to(log: str) -> None:
    """In a worker or a kernel host: every warning it shows is appended to `log` as one line, not to its stderr."""
    import warnings

    def show(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        text = " ".join(f"{category.__name__}: {message} ({filename}:{lineno})".split())
        with open(log, "a", encoding="utf-8") as fh:  # append: processes share the file, one short write each
            fh.write(f"{text} [pid {os.getpid()}]\n")

    warnings.showwarning = show


def _watch_judge(judge: int) -> None:
    """End this host as soon as its judge is gone, even mid-kernel (its parent is a fork server, so the parent-death
    signal alone does not tell)."""
    import threading

    real_exit = os._exit  # a kernel's run refuses os._exit (isolation.Containment); this thread is not a kernel

    def watch() -> None:
        while True:
            time.sleep(0.25)
            try:
                os.kill(judge, 0)
            except ProcessLookupError:
                real_exit(70)
            except OSError:
                pass

    threading.Thread(target=watch, name="moe-harness-judge-watch", daemon=True).start()


def _host_start(plan: sandbox.Launch, conn: Any, device: str, threads: int, env: dict[str, str], path: list[str],
                cwd: str, judge: int, preload: bool = False, named: str | None = None) -> None:
    """A new host process: its output to its log, its namespaces where it is sandboxed, then the host's loop."""
    inside = sandbox.enter(plan, judge, env)  # sandboxed: returns in the namespace's host process only
    _host_main(conn, device, threads, env, path, cwd, None if inside else judge, preload, named)


def _host_main(conn: Any, device: str, threads: int, env: dict[str, str], path: list[str], cwd: str,
               judge: int | None, preload: bool = False, named: str | None = None) -> None:
    """The host's loop: answer the judge's requests until it says stop or goes away. judge: the pid to watch (None:
    a sandboxed host cannot see it; the process outside its namespace watches it). preload: import the adapters
    (`Served.preload`) before the first request. named: what the judge calls `device` (`host_gpu.confine`)."""
    with contextlib.suppress(OSError):
        os.setsid()  # a group of its own: what it starts is found and ended with it
    _die_with_parent()
    if judge is not None:
        _watch_judge(judge)
    for sig in (signal.SIGINT, signal.SIGTERM):  # the judge decides when a host ends
        signal.signal(sig, signal.SIG_DFL)
    # the judge's environment, import path and folder as they are now (a fork server started earlier has older ones)
    os.environ.clear()
    os.environ.update(env)
    # no compile pool: a process a kernel leaves running is killed after its run
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    compile_once_env.install()  # hosts that need one new kernel variant at once compile it once
    sys.path[:] = path
    with contextlib.suppress(OSError):
        os.chdir(cwd)
    if env.get("MOE_HARNESS_WARNINGS_LOG"):  # a sweep's: the warnings of its kernels go to its log
        log_warnings_to(env["MOE_HARNESS_WARNINGS_LOG"])
    else:  # on the terminal (pytest, replay): not the interpreter's expected numerical ones between the dots
        from harness.engine.interpreter import quiet_numerics

        quiet_numerics()
    import torch

    torch.set_num_threads(max(1, threads))
    from harness.engine import hosted

    served = hosted.Served(device, named=named)
    served.conn = conn  # an arena's file descriptor comes through it (`do_arena`)
    if preload:
        served.preload()
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        try:
            reply = served.answer(msg)
        except BaseException as e:  # never end the loop on a request: say why it failed
            reply = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc(limit=6)}
        try:
            conn.send_bytes(json.dumps(reply, default=str).encode())
        except OSError:  # the judge is gone (killed for a hang, or finished): nothing left to answer
            return


def _context() -> Any:
    """A fork server where there is one: a host forks from a clean, single-threaded process that has imported torch
    and never touched CUDA (forking the judge itself can deadlock on a lock a thread of its held); else spawn
    (`harness.engine.fork_server`)."""
    return fork_server.context()


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def session_members(sid: int) -> list[int]:
    """Processes of session `sid` (Linux /proc), but for its leader."""
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit() or int(entry) == sid:
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if len(fields) > 3 and int(fields[3]) == sid:  # fields after the name: state ppid pgrp session
            found.append(int(entry))
    return found


def kill_session(sid: int) -> int:
    """SIGKILL every process of session `sid` but its leader; how many there were."""
    members = session_members(sid)
    for pid in members:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return len(members)


def memory_limit_mb() -> float | None:
    raw = os.environ.get(HOST_MEMORY_MB_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{HOST_MEMORY_MB_ENV}={raw!r}: expected a number of MiB") from None
    return value if value > 0 else None


def _judge_threads() -> int:
    """The CPU threads of this process's torch, without importing torch where it is not imported yet (a pytest
    controller that lists the adapters: an import of seconds for one number): then what torch would choose."""
    torch = sys.modules.get("torch")
    return max(1, torch.get_num_threads()) if torch is not None else threads_for(1)


class Host:
    """The judge's handle on one host process: start it, ask it, kill it. `ask` returns the decoded JSON reply;
    a host that dies, or runs past `deadline` or its memory limit, raises `HostDied` (and is killed)."""

    def __init__(self, device: str, *, threads: int | None = None, preload: bool = False,
                 family: str = family_cache.UNASSIGNED):
        self.device = device
        #: whose Triton cache folder it compiles into (`family_cache`): the adapters it may judge
        self.family = family
        #: import the adapters as soon as it starts, before it is asked for one (a sweep worker's host started ahead)
        self.preload = preload
        self.threads = threads if threads is not None else _judge_threads()
        self.proc: Any = None
        self.conn: Any = None
        self.arena: Arena | None = None
        self.device_arena: Arena | None = None  # GPU memory shared with it (`runner._reserved_arena`)
        self.device_share_error: str | None = None  # why it cannot have one
        self.left_behind = 0  # processes the host's kernels started and left running, killed with it
        self.log: str | None = None  # the host's stdout and stderr (one file across its restarts)
        self.plan: sandbox.Launch | None = None
        self._inner: int | None = None  # a sandboxed host: the pid of the process that runs its loop

    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def start(self) -> None:
        if self.log is None:
            self.log = sandbox.new_log()
            weakref.finalize(self, sandbox.remove_log, self.log)
        env = dict(os.environ)
        family_cache.assign(env, self.family)
        local = host_gpu.confine(env, self.device)  # the host sees its own GPU only
        try:
            self.plan = sandbox.launch(env, self.log)
        except sandbox.SandboxUnavailable as e:
            raise HostDied(str(e)) from None
        ctx = _context()
        mine, theirs = ctx.Pipe(duplex=True)
        self._inner = None
        self.proc = ctx.Process(target=_host_start, name="moe-harness-kernel-host",
                                args=(self.plan, theirs, local, self.threads, env, list(sys.path), os.getcwd(),
                                      os.getpid(), self.preload, self.device))
        config = mp.current_process()._config  # type: ignore[attr-defined]
        daemon = config.get("daemon")
        config["daemon"] = False  # a sweep worker is daemonic; its host dies with it anyway (PR_SET_PDEATHSIG)
        try:
            self.proc.start()
        finally:
            if daemon is not None:
                config["daemon"] = daemon
        theirs.close()
        self.conn = mine
        _STARTED[self] = os.getpid()

    @property
    def sandboxed(self) -> bool:
        return self.plan is not None and bool(self.plan.how)

    def worker_pid(self) -> int | None:
        """The pid of the process that runs the host's loop (a sandboxed host's is inside its namespace, below the
        process the judge started); None when not running."""
        if self.proc is None or self.proc.pid is None:
            return None
        if not self.sandboxed:
            return self.proc.pid
        if self._inner is None:
            self._inner = namespaces.real_host(self.proc.pid)
        return self._inner if self._inner is not None else self.proc.pid

    def _died(self, what: str) -> HostDied:
        tail = sandbox.log_tail(self.log)
        return HostDied(f"{what}; the last lines of its output:\n{tail}" if tail else what)

    def ask(self, msg: Any, *, deadline: float | None = None, fd: int | None = None) -> dict[str, Any]:
        """`msg`'s answer; fd: an open file handed to the host right after the message (an arena's)."""
        if not self.alive():
            self.start()
        try:
            self.conn.send(msg)
            if fd is not None:
                from multiprocessing.reduction import send_handle

                send_handle(self.conn, fd, self.proc.pid)
        except (OSError, BrokenPipeError) as e:
            self.kill()
            raise HostDied(f"the kernel host is gone ({e})") from None
        try:
            return self._reply(deadline)
        except BaseException:  # a timeout or Ctrl-C in the judge while the host works: it must not go on alone
            if self.alive():
                self.kill()
            raise

    def _reply(self, deadline: float | None) -> dict[str, Any]:
        limit = memory_limit_mb()
        started = time.monotonic()
        while not self.conn.poll(0.02):
            if not self.proc.is_alive():
                code = self.proc.exitcode
                self.kill()
                raise self._died(_ended(code))
            if limit is not None and (rss := _rss_mb(self.worker_pid() or self.proc.pid)) > limit:
                self.kill()
                raise HostDied(f"the kernel host used {rss:.0f} MiB, past the limit of {limit:g} MiB "
                               f"({HOST_MEMORY_MB_ENV}); killed")
            if deadline is not None and time.monotonic() - started > deadline:
                self.kill()
                raise HostDied(f"no answer within {deadline:g}s; the kernel host was killed")
        try:
            raw = self.conn.recv_bytes(MAX_REPLY)
        except (EOFError, OSError) as e:  # it died as it answered: how, once it is reaped
            self.proc.join(5)
            code = self.proc.exitcode
            self.kill()
            raise self._died(_ended(code) if code is not None else f"the kernel host is gone ({e!r})") from None
        try:
            reply = json.loads(raw)
        except ValueError:
            self.kill()
            raise HostDied("the kernel host answered something that is not JSON; killed") from None
        if not isinstance(reply, dict):
            self.kill()
            raise HostDied("the kernel host answered something that is not a JSON object; killed")
        return reply

    def ready(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start the host if it is not running and wait until it answers (HostDied when it cannot start): a case's
        time then never includes a host's start."""
        if not self.alive():
            self.ask(("ping",), deadline=timeout)

    def sweep_children(self) -> int:
        """Kill what the host started and left running; how many there were."""
        if self.proc is None or self.proc.pid is None:
            return 0
        n = namespaces.kill_left_behind(self.proc.pid) if self.sandboxed else kill_session(self.proc.pid)
        self.left_behind += n
        return n

    def kill(self) -> None:
        _kill_all([self])

    def close(self) -> None:
        close_hosts([self])


#: seconds the hosts asked to stop have to end, all of them together, before they are killed
CLOSE_GRACE_S = 2.0
#: seconds killed hosts are waited for, all together (one the kernel cannot end at once is left to end by itself)
KILL_WAIT_S = 1.0


#: every host started by this process (a forked child inherits the table, not the hosts): those still running when
#: it exits are stopped. Else multiprocessing's own exit handler waits for them forever: a process that ends with
#: an uncaught exception keeps its frames, and the hosts they hold, alive until then.
_STARTED: weakref.WeakKeyDictionary[Host, int] = weakref.WeakKeyDictionary()


@atexit.register
def _close_started() -> None:
    mine = [h for h, pid in list(_STARTED.items()) if pid == os.getpid()]
    with contextlib.suppress(Exception):
        close_hosts([h for h in mine if h.alive()])


def close_hosts(hosts: list[Host], grace: float = CLOSE_GRACE_S) -> None:
    """Stop `hosts` together: ask every one to stop, wait once (`grace` seconds at most in all), then kill the rest
    and what each started (its session). Never one after another: a judging process that holds several hosts (a
    pytest worker at its exit) would otherwise wait for each in turn."""
    live = [h for h in hosts if h.alive()]
    for h in live:
        with contextlib.suppress(Exception):
            h.conn.send(None)
    _wait_ended(live, grace)
    _kill_all(hosts)
    for h in hosts:
        for arena in (h.arena, h.device_arena):
            if arena is not None:
                arena.close()
        h.arena = h.device_arena = None


def _wait_ended(hosts: list[Host], seconds: float) -> list[Host]:
    """Wait until `hosts` have ended, `seconds` at most all together; the ones still running."""
    from multiprocessing.connection import wait

    end = time.monotonic() + seconds
    pending = [h for h in hosts if h.alive()]
    while pending and time.monotonic() < end:
        sentinels = [getattr(h.proc, "sentinel", None) for h in pending]
        if None in sentinels:  # a stand-in process (tests): polled
            time.sleep(0.02)
        else:
            wait(sentinels, timeout=max(0.0, end - time.monotonic()))
        pending = [h for h in pending if h.alive()]
    return pending


def _kill_all(hosts: list[Host]) -> None:
    """SIGKILL the hosts and their sessions, wait for them together (`KILL_WAIT_S` at most), drop their handles."""
    for h in hosts:
        if h.proc is not None:
            with contextlib.suppress(Exception):
                h.proc.kill()
    _wait_ended([h for h in hosts if h.proc is not None], KILL_WAIT_S)
    for h in hosts:
        if h.proc is not None:
            with contextlib.suppress(Exception):
                h.proc.join(0)  # reaped when it has ended
            if h.proc.pid is not None:
                kill_session(h.proc.pid)
        if h.conn is not None:
            with contextlib.suppress(Exception):
                h.conn.close()
        h.proc = h.conn = None


def _ended(code: int | None) -> str:
    from harness.core.exits import exit_cause

    return f"the kernel host died ({exit_cause(code)})" if code is not None else "the kernel host died"


@contextlib.contextmanager
def closing(host: Host) -> Iterator[Host]:
    try:
        yield host
    finally:
        host.close()
