"""The sweep's worker processes and the parent that feeds and watches them (fault isolation).

Cases run in worker processes (never forked from a process that may hold a CUDA context: a fork server, else spawn; a
pool sized to the CPU count, or 16 per GPU, at most one per CPU and at most MOE_HARNESS_JOBS); each worker judges and
sends every verdict to the parent, which writes them all. A worker never imports an adapter module: the kernel runs in
the worker's kernel host (harness.engine.host). The parent hands out chunks of one adapter's cases, watches every
worker, and when a case hangs past the per-case timeout (the worker is killed) or the worker dies (os._exit, a signal, a
CUDA context lost to an illegal memory access), writes an `error` verdict for that case with the reason, starts a fresh
worker and carries on with the rest. Ctrl-C or SIGTERM (to the parent, or to the workers with it) stops the sweep
instead (`SweepInterrupted`): the cases that were running get no verdict, since the user stopped them, not their
kernels."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from harness.core import stopping
from harness.core.case import Case
from harness.core.device import DeviceInfo, detect, sweep_jobs, threads_for, usable_cpus
from harness.core.exits import INTERRUPT_SIGNALS
from harness.core.result import Result, strict_json
from harness.engine import fork_server, remote, runner
from harness.engine.host import Host, HostDied, log_warnings_to
from harness.sweep.progress import Progress
from harness.sweep.schedule import LIGHTEST, ChunkQueue

#: seconds a worker may take to start (import torch, triton, the kernels) before it counts as dead
START_TIMEOUT_S = 180.0
#: after this many worker deaths on one chunk before its first case starts, the chunk is marked, not retried
MAX_SILENT_DEATHS = 2
#: whether a worker is replaced before it judges another adapter: no longer needed, since kernels run in kernel hosts
#: (one per adapter, closed when the worker moves on), never in the worker; what a kernel leaves behind stays there
FRESH_WORKER_PER_ADAPTER = False


def judge_safely(case: Case, adapter: Any, dev: DeviceInfo, unverifiable: set[str] | None) -> Result:
    """The verdict of one case; a harness exception becomes an `error` verdict (the case is still recorded)."""
    try:
        return runner.judge(case, adapter, dev, unverifiable=unverifiable)
    except Exception as e:  # runner.judge should not raise; if it does, the case is still recorded
        declared = adapter.claims(case.features, dev)
        dev = adapter.device_for(dev)
        return Result(case=case, verdict="error", reason=f"harness error: {type(e).__name__}: {e}",
                      metrics={"trace": traceback.format_exc(limit=4)}, declared=declared,
                      generation=dev.generation, device=dev.to_dict())


def with_host_start(r: Result, seconds: float) -> Result:
    """`r` with the time its worker waited for the kernel host before the case (counted in the sweep's account)."""
    if seconds < 0.001:
        return r
    spent = {**r.metrics.get("time_s", {}), "host_start": round(seconds, 4)}
    return dataclasses.replace(r, metrics={**r.metrics, "time_s": spent})


def _watch_lifeline(lifeline: Connection) -> None:
    """End this worker when the parent is gone (killed: its end of the lifeline closes), even mid-kernel."""
    real_exit = os._exit  # the judge refuses os._exit to kernels while they run; this thread is not a kernel

    def watch() -> None:
        try:
            lifeline.recv()
        except (EOFError, OSError):
            pass
        real_exit(70)

    threading.Thread(target=watch, name="moe-harness-lifeline", daemon=True).start()


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the sweep; the cases that were running have no verdict (`--resume` runs them)."""


def _worker(conn: Connection, device: str, results_dir: str, run_id: str, slot: int, threads: int,
            lifeline: Connection | None = None, warnings_log: str | None = None,
            env: dict[str, str] | None = None) -> None:
    """Worker loop: receive (adapter spec, [(index, case dict)]) chunks, judge each case, report each verdict."""
    if env is not None:  # the sweep's environment now (the fork server's is as old as the server)
        os.environ.clear()
        os.environ.update(env)
    if warnings_log:
        log_warnings_to(warnings_log)  # not on stderr, where they would cut the parent's progress lines
        os.environ["MOE_HARNESS_WARNINGS_LOG"] = warnings_log  # and its kernel hosts' too
    try:
        _serve(conn, device, results_dir, run_id, threads, lifeline)
    except KeyboardInterrupt:  # Ctrl-C reached the whole process group: the parent stops the sweep, no verdict
        try:
            conn.send(("interrupted", "SIGINT"))
        except OSError:
            pass


def _serve(conn: Connection, device: str, results_dir: str, run_id: str, threads: int,
           lifeline: Connection | None) -> None:
    if lifeline is not None:
        _watch_lifeline(lifeline)
    import torch

    torch.set_num_threads(max(1, threads))
    # the first kernel host starts now, while this worker starts and waits for its first case (a host's first
    # start in a process also starts the fork server it comes from: seconds), imports the adapters meanwhile
    # (`Served.preload`), and loads the first chunk's adapter
    spare = Host(device, preload=True, family=remote.OWN_FAMILY)  # most adapters are this repository's
    spare.start()
    dev = detect(device)
    unverifiable: set[str] | None = None
    if dev.generation == "interp":
        from harness.engine.interpreter import unverifiable_here

        unverifiable = unverifiable_here()
    _judge_chunks(conn, dev, unverifiable, spare)


def _judge_chunks(conn: Connection, dev: DeviceInfo, unverifiable: set[str] | None, spare: Host | None) -> None:
    resolved: dict[str, Any] = {}  # the adapters open in this worker: one kernel host, shared by one family
    family: str | None = None
    conn.send(("ready", os.getpid()))
    while True:
        msg = conn.recv()
        if msg is None:  # the sweep is over: its kernel hosts end together, within one deadline
            remote.close_all()
            if spare is not None:
                spare.close()
            break
        spec, items, *rest = msg
        kin = rest[0] if rest else None
        others = rest[1] if len(rest) > 1 else True  # whether a case of another family may still come to it
        if spec not in resolved and (kin is None or kin != family):
            for other in list(resolved):  # one kernel host at a time (the adapters of one family share it)
                remote.close_adapter(other, dev.device)
                del resolved[other]
        t0 = time.perf_counter()
        try:  # the adapter's module is imported in its kernel host, never in this judging process
            adapter = resolved.get(spec)
            if adapter is None:  # into the open host of its family (`remote.open_adapter`), else the spare
                adapter = remote.open_adapter(spec, dev.device, spare=spare, family=kin)
                if adapter.host is spare:
                    spare = None
            resolved[spec], family = adapter, kin
        except Exception as e:
            conn.send(("unloadable", f"{type(e).__name__}: {e}"))
            continue
        if spare is None and dev.is_cuda and others and kin != remote.OWN_FAMILY:
            # on a GPU the next host (its CUDA context) starts while this one's cases are judged; on the CPU the
            # cores are busy judging, and a host started ahead only added work (7% on a 2-core sweep test); a sweep
            # of one family has no next adapter for it (16 workers' spare hosts, each importing the adapters). A
            # spare is one of this repository's adapters' (its Triton cache folder is a family's, `family_cache`):
            # started while the worker judges another family's
            spare = Host(dev.device, preload=True, family=remote.OWN_FAMILY)
            spare.start()
        for index, case_dict in items:
            if adapter.host is not None:  # a host replaced after a death starts before the case's clock does
                with contextlib.suppress(HostDied):
                    adapter.host.ready()
            waited = time.perf_counter() - t0
            conn.send(("start", index))
            r = with_host_start(judge_safely(Case.from_dict(case_dict), adapter, dev, unverifiable), waited)
            # the parent writes every verdict: one writer, whose file a kernel host that writes into the results
            # folder cannot change unnoticed (ResultStore.check_untouched)
            conn.send(("done", index, r.verdict, r.declared, json.dumps(strict_json(r.to_dict()))))
            lost = runner.context_lost()  # the judge's own context (a kernel's lost one is its host's, replaced)
            if lost:  # the CUDA context is gone: the parent starts a fresh worker for the rest of the chunk
                conn.send(("recycle", str(lost)[:200]))
                os._exit(3)
            t0 = time.perf_counter()  # a replaced host's start counts from here
        conn.send(("idle",))


def _context() -> Any:
    """Workers must never inherit a CUDA context, so no plain fork: they fork from the kernel hosts' fork server (a
    fresh process that imported torch once and never touched CUDA), so replacing a dead worker costs a fraction of a
    second instead of a full torch import; where there is none, spawn. One server, one preload: whichever of a
    sweep's processes starts first, nothing it preloads imports Triton (`harness.engine.fork_server`)."""
    return fork_server.context()


def _stop_on_signals() -> dict[int, Any]:
    """SIGTERM and SIGHUP stop the sweep like Ctrl-C (a KeyboardInterrupt naming the signal) rather than end this
    process at once; the handlers they replace (main thread only: elsewhere signals cannot be handled)."""
    return stopping.interrupt_on_signals()


@dataclass
class _Chunk:
    spec: str  # how the worker resolves the adapter (name or module:object)
    items: list[tuple[int, Case]]
    silent_deaths: int = 0
    family: str | None = None  # adapters of one family share a worker's kernel host (`remote.host_family`)
    weight: tuple[float, float] = LIGHTEST  # its place in the queue (`ChunkQueue.insert_by_weight`)

    @property
    def host(self) -> str:
        """What a kernel host must serve to judge it: its family, or its adapter alone."""
        return self.family or self.spec


@dataclass
class _Slot:
    index: int
    device: str
    proc: Any = None
    conn: Connection | None = None
    ready: bool = False
    born: float = 0.0
    chunk: _Chunk | None = None
    current: int | None = None  # index of the case in flight
    since: float = 0.0
    recycling: str = ""  # the worker announced it exits (its CUDA context is lost): not a death
    judged: str = ""  # the adapter spec this worker has judged cases of
    host: str = ""  # what its kernel host serves: the family of that adapter, or its spec
    sent: int | None = None  # index of the case sent to it and not yet judged (its "idle" not yet received)


def default_jobs(device: DeviceInfo) -> int:
    if device.is_cuda:
        import torch

        # the judging (inputs, oracle, comparisons) is CPU-heavy and kernels are short: a worker per CPU, up to 16
        # per GPU (each holds two CUDA contexts, its own and its kernel host's)
        return sweep_jobs(min(usable_cpus(), 16 * max(1, torch.cuda.device_count())))
    return sweep_jobs(usable_cpus())


class WorkerPool:
    """Feeds chunks of cases to worker processes and watches them; every case ends with exactly one verdict.

    Workers may be started (`start_workers`) before the cases are planned: a worker's start (torch, its CUDA
    context, its first kernel host) then overlaps the planning. `run` judges the chunks: `account(index, verdict,
    declared)` is called for every verdict, `mark(index, reason, kind, **metrics)` for a case whose worker hung or
    died (the caller records an `error` verdict for it).
    """

    def __init__(self, device: DeviceInfo, results_dir: str, run_id: str, jobs: int, case_timeout: float,
                 warnings_log: str | None = None):
        self.warnings_log = warnings_log
        self.results_dir, self.run_id, self.jobs, self.case_timeout = str(results_dir), run_id, jobs, case_timeout
        self.chunks = ChunkQueue()
        self.cases: dict[int, Case] = {}
        self.ctx = _context()
        self.devices = [device.device]
        if device.is_cuda and device.device in ("cuda", "cuda:0"):
            import torch

            self.devices = [f"cuda:{i}" for i in range(max(1, torch.cuda.device_count()))]
        self.cpu_threads = 0
        self.slots: list[_Slot] = []
        self.start_failures = 0  # workers that died before reporting ready, in a row
        self.feeding = self.more_chunks = False  # run's feed may still be called; may still add chunks
        #: whether the sweep's adapters may need more than one kernel host (set by the sweep: more than one adapter)
        self.several_families = True
        # every worker holds the read end; when this process dies the write end closes and the workers exit
        self.lifeline, self._lifeline_w = self.ctx.Pipe(duplex=False)

    def start_workers(self, n: int) -> None:
        """Have `n` workers (at most `jobs`) started; the first call sets each one's share of the CPU threads."""
        n = min(n, self.jobs)
        if not self.cpu_threads:
            self.cpu_threads = threads_for(max(1, n))
        while len(self.slots) < n:
            slot = _Slot(len(self.slots), self.devices[len(self.slots) % len(self.devices)])
            self.slots.append(slot)
            self.start(slot)

    def run(self, chunks: ChunkQueue, progress: Progress, cases: dict[int, Case],
            account: Callable[[int, str, bool], None], mark: Callable[..., None],
            feed: Callable[[], tuple[bool, bool]] | None = None) -> None:
        """Judge every chunk; Ctrl-C or SIGTERM raises `SweepInterrupted` (the workers are killed at once).
        feed: called between the workers' messages, to add chunks (and `cases`) planned while the first are judged,
        until it returns (False, _); its second value: whether more chunks may come (until then no worker takes
        half of another's chunk)."""
        self.chunks, self.progress, self.cases, self.account, self.mark = chunks, progress, cases, account, mark
        finished = False
        previous = _stop_on_signals()
        self.feeding = feed is not None
        try:
            if feed is not None and not self.cpu_threads:
                self.cpu_threads = threads_for(self.jobs)  # the cases to come are not known yet
            while True:
                if self.feeding:
                    assert feed is not None
                    self.feeding, self.more_chunks = feed()
                # idle workers take halves of chunks; no case for a worker (all judged in planning): none started
                if len(self.slots) < self.jobs:
                    self.start_workers(min(self.jobs, self._queued()))
                if not (self.feeding or self.chunks or any(s.chunk is not None for s in self.slots)):
                    break
                self.dispatch()
                live = [s for s in self.slots if s.conn is not None]
                wait([s.conn for s in live] + [s.proc.sentinel for s in live], timeout=0.05 if self.feeding else 0.5)
                for slot in live:
                    self.watch(slot, time.monotonic())
                self.progress.show()
            finished = True
        except KeyboardInterrupt as e:
            how = str(e) or "SIGINT"
            judged = f"{self.progress.done} case(s) judged so far" if self.progress.done else "nothing was judged"
            planning = ", during its planning" if self.feeding else ""
            raise SweepInterrupted(f"the sweep was stopped ({how}{planning}); {judged}; the cases that were running "
                                   f"have no verdict; the same command with --resume {self.run_id} judges the rest"
                                   ) from None
        finally:
            self.stop(kill=not finished)
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def start(self, slot: _Slot) -> None:
        parent, child = self.ctx.Pipe()
        slot.proc = self.ctx.Process(target=_worker, args=(child, slot.device, self.results_dir, self.run_id,
                                                           slot.index, self.cpu_threads, self.lifeline,
                                                           self.warnings_log, dict(os.environ)),
                                     daemon=True)
        slot.proc.start()
        child.close()
        slot.conn, slot.ready, slot.born, slot.chunk, slot.current = parent, False, time.monotonic(), None, None
        slot.sent = None
        slot.recycling, slot.judged, slot.host = "", "", ""

    def _next_chunk(self, slot: _Slot) -> _Chunk | None:
        """This worker's next chunk: the next in line (one of the adapter it judged first), else once none is left
        the back half of the unsent cases of the chunk with the most measured work left (harness.sweep.schedule)."""
        if self.chunks:
            return self.chunks.take(slot.judged)
        if self.feeding and self.more_chunks:  # more are coming
            return None
        unsent = [(s.index, s.chunk.spec, len(self._unsent(s)), s.chunk.host)
                  for s in self.slots if s.chunk is not None]
        taken = self.chunks.to_take(unsent, slot.host)
        if taken is None:
            return None
        owner = self.slots[taken[0]]
        assert owner.chunk is not None
        moved = self._unsent(owner)[-taken[1]:]
        gone = {i for i, _ in moved}
        owner.chunk.items = [it for it in owner.chunk.items if it[0] not in gone]
        return _Chunk(owner.chunk.spec, moved, family=owner.chunk.family)

    def _other_family_may_come(self, chunk: _Chunk) -> bool:
        """Whether a case that needs another kernel host than `chunk`'s (another family's, or another adapter's
        outside any family) may still be handed out: queued, in a worker's chunk (halves are taken), or unplanned."""
        if self.feeding and self.several_families:
            return True
        own = chunk.host
        waiting = [*self.chunks, *(s.chunk for s in self.slots if s.chunk is not None)]
        return any(c.host != own for c in waiting if c.items)

    def _queued(self) -> int:
        """Cases in the queue or in the workers' chunks."""
        return sum(len(c.items) for c in self.chunks) + sum(len(s.chunk.items) for s in self.slots if s.chunk)

    @staticmethod
    def _unsent(slot: _Slot) -> list[tuple[int, Case]]:
        assert slot.chunk is not None
        return [it for it in slot.chunk.items if it[0] != slot.sent]

    def _renew(self, slot: _Slot) -> None:
        """End an idle worker normally (its results file closes) and start a fresh one in its slot."""
        assert slot.conn is not None and slot.proc is not None
        try:
            slot.conn.send(None)
        except OSError:
            pass
        slot.proc.join(10)
        if slot.proc.is_alive():
            slot.proc.kill()
            slot.proc.join(5)
        slot.conn.close()
        self.start(slot)

    def dispatch(self) -> None:
        """Restart dead slots that still have work, and send every idle ready worker its next case (one at a time:
        the rest of its chunk stays here, for another worker to take once no chunk is left)."""
        for slot in self.slots:
            if slot.proc is None and (self.chunks or slot.chunk is not None):
                self.start(slot)
            if not slot.ready or slot.sent is not None or slot.conn is None:
                continue
            if slot.chunk is None or not slot.chunk.items:
                chunk = self._next_chunk(slot)
                if chunk is None:
                    slot.chunk = None
                    continue
                if FRESH_WORKER_PER_ADAPTER and slot.judged and chunk.spec != slot.judged:
                    self.chunks.appendleft(chunk)
                    self._renew(slot)  # it takes the chunk once it is ready
                    continue
                slot.chunk, slot.judged, slot.host = chunk, chunk.spec, chunk.host
            index, case = slot.chunk.items[0]
            slot.sent = index
            slot.conn.send((slot.chunk.spec, [(index, case.to_dict())], slot.chunk.family,
                            self._other_family_may_come(slot.chunk)))

    def drain(self, slot: _Slot) -> None:
        try:
            while slot.conn is not None and slot.conn.poll():
                self.handle(slot, slot.conn.recv())
        except (EOFError, OSError):
            pass  # the pipe broke: the process is dead (the caller sees it)

    def watch(self, slot: _Slot, now: float) -> None:
        """Read the worker's messages; retire it when it died, hung past the case timeout or never started."""
        self.drain(slot)
        if not slot.proc.is_alive():
            slot.proc.join(1)
            self.drain(slot)  # a verdict sent just before dying is still in the pipe
            self.died(slot)
        elif slot.current is not None and now - slot.since > self.case_timeout:
            case = self.cases[slot.current]
            self.progress.note(f"case {case.case_id} of {case.adapter} hung past {self.case_timeout:g}s; worker "
                               "killed, continuing")
            self.retire(slot, f"hang: no verdict within {self.case_timeout:g}s (worker killed)", "timeout")
        elif not slot.ready and now - slot.born > START_TIMEOUT_S:
            self.retire(slot, f"worker did not start within {START_TIMEOUT_S:g}s", "died")

    def died(self, slot: _Slot) -> None:
        code = slot.proc.exitcode
        if code is not None and -code in INTERRUPT_SIGNALS:  # stopped from outside, with the sweep: not the kernel
            raise KeyboardInterrupt(f"a worker was ended by {signal.Signals(-code).name}")
        if slot.recycling:
            self.progress.note(f"worker {slot.index} recycled after a lost CUDA context ({slot.recycling}); the rest "
                               "of its chunk goes to a fresh worker")
            self.retire(slot, f"worker recycled: {slot.recycling}", "recycled")
            return
        why = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        if slot.current is not None:
            case = self.cases[slot.current]
            self.progress.note(f"worker {slot.index} died ({why}) on case {case.case_id} of {case.adapter}; "
                               "continuing")
        if not slot.ready:
            self.start_failures += 1
        self.retire(slot, f"worker process died ({why}) while running this case", "died")
        if self.start_failures >= MAX_SILENT_DEATHS * len(self.slots):
            # workers cannot even start (a broken install, an unimportable __main__): stop respawning
            self.progress.note(f"worker processes fail to start ({why}); the remaining cases are marked")
            while self.chunks:
                for i, _ in self.chunks.popleft().items:
                    self.mark(i, f"not run: worker processes fail to start ({why})", "died")

    def handle(self, slot: _Slot, msg: tuple) -> None:
        kind = msg[0]
        if kind == "ready":
            slot.ready = True
            self.start_failures = 0
        elif kind == "start":
            slot.current, slot.since = msg[1], time.monotonic()
        elif kind == "done":
            index = msg[1]
            if slot.current == index and slot.chunk is not None:
                self.chunks.observe(slot.chunk.spec, time.monotonic() - slot.since)
            self.account(index, msg[2], msg[3], msg[4] if len(msg) > 4 else None)
            if slot.chunk is not None:
                slot.chunk.items = [(i, c) for i, c in slot.chunk.items if i != index]
            slot.current = None
        elif kind == "unloadable":
            assert slot.chunk is not None
            for i, _ in slot.chunk.items:
                self.mark(i, f"adapter could not be loaded in the worker: {msg[1]}", "unloadable")
            slot.chunk, slot.current, slot.sent = None, None, None
        elif kind == "recycle":
            slot.recycling = msg[1]
        elif kind == "interrupted":
            raise KeyboardInterrupt(f"a worker got {msg[1]}")
        elif kind == "idle":  # the case sent is judged; the rest of the chunk, if any, goes out one by one
            slot.sent, slot.current = None, None
            if slot.chunk is not None and not slot.chunk.items:
                slot.chunk = None

    def retire(self, slot: _Slot, why: str, kind: str) -> None:
        """The worker is dead or being killed: mark its case in flight, requeue the rest of its chunk."""
        if slot.proc is not None and slot.proc.is_alive():
            slot.proc.kill()
        if slot.proc is not None:
            slot.proc.join(5)
        code = slot.proc.exitcode if slot.proc is not None else None
        chunk, current = slot.chunk, slot.current
        if chunk is not None:
            rest = chunk.items
            if current is not None:
                self.mark(current, why, kind, exitcode=code)
                rest = [(i, c) for i, c in rest if i != current]
                chunk.silent_deaths = 0
            elif kind == "died":
                chunk.silent_deaths += 1
            if rest:
                if chunk.silent_deaths >= MAX_SILENT_DEATHS:
                    for i, _ in rest:
                        self.mark(i, f"not run: the worker died {chunk.silent_deaths} times before starting a case "
                                     f"of this chunk (last: {why})", "died")
                else:
                    self.chunks.appendleft(_Chunk(chunk.spec, rest, chunk.silent_deaths, chunk.family))
        if slot.conn is not None:
            slot.conn.close()
        slot.proc, slot.conn, slot.chunk, slot.current, slot.sent = None, None, None, None, None

    def stop(self, kill: bool = False) -> None:
        """End the workers: asked to finish (their results files close), or killed at once (`kill`); once."""
        if self._lifeline_w.closed:
            return
        for slot in self.slots:
            if slot.conn is not None and not kill:
                try:
                    slot.conn.send(None)
                except OSError:
                    pass
        procs = [slot.proc for slot in self.slots if slot.proc is not None]
        if kill:
            for proc in procs:
                with contextlib.suppress(Exception):
                    proc.kill()
        # all at once, within one deadline: a worker that has not ended by then is killed (never one after another)
        _join_all(procs, STOP_GRACE_S if not kill else 0.0)
        self._lifeline_w.close()


#: seconds the workers asked to finish (their results files close, their kernel hosts end) have, all together
STOP_GRACE_S = 3.0


def _join_all(procs: list[Any], grace: float) -> None:
    """Wait until `procs` have ended, `grace` seconds at most all together; kill the rest and wait a little more for
    them (a process the kernel cannot end at once is left to end by itself)."""
    end = time.monotonic() + grace
    pending = [p for p in procs if p.is_alive()]
    while pending and time.monotonic() < end:
        wait([p.sentinel for p in pending], timeout=max(0.0, end - time.monotonic()))
        pending = [p for p in pending if p.is_alive()]
    for p in pending:
        with contextlib.suppress(Exception):
            p.kill()
    end = time.monotonic() + 2.0
    while pending and time.monotonic() < end:
        wait([p.sentinel for p in pending], timeout=max(0.0, end - time.monotonic()))
        pending = [p for p in pending if p.is_alive()]
    for p in procs:
        if p not in pending:
            with contextlib.suppress(Exception):
                p.join(0)
