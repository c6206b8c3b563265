"""Import adapter modules in a child process first, so that one whose import ends the process from C code (a
`_exit` in an extension, a crash, a hang) cannot take the parent with it.

The registry's own watched import refuses exits made from Python (`os._exit`, `SystemExit`); an exit from C code
cannot be refused, only survived by not being in that process. `probe(origins)` imports each origin in turn in one
child, which prints a line before and after each; when the child ends early, the origin it had started is the one
that killed it (recorded in `registry.DEADLY`, never imported by this process) and a fresh child goes on with the
origins after it. A child that ends or hangs before its first import blames nothing: `ProbeNotStarted` says so.
Used by `python -m harness matrix`, whose parent process imports every adapter it sweeps.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.core.exits import exit_cause

#: seconds one import may take in the child, counted from its start (a module whose import hangs is named as such)
PROBE_TIMEOUT_S = 180.0
#: seconds the child may take to start (Python, torch, the harness: slow on a loaded machine) before its first import
START_TIMEOUT_S = 600.0


class ProbeNotStarted(RuntimeError):
    """A probe child ended or hung before it started its first import, so no origin can be blamed. `found` holds
    the deadly origins that earlier children named."""

    def __init__(self, message: str, found: dict[str, str]):
        super().__init__(message)
        self.found = found


@dataclass
class _Child:
    lines: list[str]
    code: int | None  # exit status; None: killed past its deadline
    stderr: str


def _command(origins: Sequence[tuple[str, str]]) -> list[str]:
    return [sys.executable, "-m", "harness.registry", json.dumps(list(origins))]


def _follow(proc: subprocess.Popen, timeout: float, start_timeout: float) -> tuple[list[str], bool]:
    """The child's output lines until it ends or prints `probe-end` (False), or overruns its deadline (True):
    `start_timeout` until its first `probe-start`, then `timeout` from each `probe-start`."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    lines: list[str] = []
    buffered = b""
    deadline = time.monotonic() + start_timeout
    while "probe-end" not in lines:
        left = deadline - time.monotonic()
        if left <= 0:
            return lines, True
        if not select.select([fd], [], [], left)[0]:
            continue
        data = os.read(fd, 65536)
        if not data:
            break
        *new, buffered = (buffered + data).split(b"\n")
        for raw in new:
            lines.append(raw.decode(errors="replace"))
            if lines[-1].startswith("probe-start "):
                deadline = time.monotonic() + timeout
    return lines, False


def _run_child(origins: Sequence[tuple[str, str]], timeout: float, start_timeout: float) -> _Child:
    # the child finds modules where this process does (a caller may have extended sys.path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
    with tempfile.TemporaryFile() as err:
        return collect(subprocess.Popen(_command(origins), stdout=subprocess.PIPE, stderr=err, env=env), err,
                       timeout, start_timeout)


def collect(proc: subprocess.Popen, err: Any, timeout: float, start_timeout: float) -> _Child:
    """A started probe child's run: its lines until it ends, prints `probe-end` or overruns (`_follow`; then it is
    killed), its exit status (None: past its deadline) and the end of its stderr (`err`, a file it writes)."""
    try:
        lines, overran = _follow(proc, timeout, start_timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    err.seek(0)
    return _Child(lines, None if overran else code, err.read()[-4000:].decode(errors="replace"))


def _loaded_files(lines: list[str]) -> list[str]:
    """The module files a child that imported every origin reports (`probe-files`)."""
    found = [json.loads(line.partition(" ")[2]) for line in lines if line.startswith("probe-files ")]
    return [str(f) for f in found[-1]] if found else []


def _why_not_started(child: _Child, start_timeout: float) -> str:
    last = next((line.strip() for line in reversed(child.stderr.splitlines()) if line.strip()), "")
    what = (f"did not start within {start_timeout:g} s" if child.code is None else
            f"ended before its first import ({exit_cause(child.code)})")
    return f"the import probe child process {what}" + (f": {last}" if last else "")


def probe(origins: Sequence[tuple[str, str]], timeout: float = PROBE_TIMEOUT_S,
          start_timeout: float = START_TIMEOUT_S, files: list[str] | None = None,
          first: _Child | None = None) -> dict[str, str]:
    """Import each `(kind, target)` origin in a child process, in order: kind "entry-point" (target: the entry
    point's name) or "module" (target: a module name). Returns `{"kind target": why}` for the origins whose import
    ended the child or ran past `timeout` seconds from its start; the others imported (or raised, which the
    caller's own import reports). A child that does not reach its first import (`start_timeout`) raises
    `ProbeNotStarted`. files: a list that gets the module files the child had loaded, when one child imported every
    origin. first: a child that already ran over all of `origins` (`early_child`), taken as the first one."""
    deadly: dict[str, str] = {}
    rest = list(origins)
    while rest:
        child, first = first or _run_child(rest, timeout, start_timeout), None
        if "probe-end" in child.lines:
            if files is not None and rest == list(origins):
                files += _loaded_files(child.lines)
            break
        started = [int(w.split()[1]) for w in child.lines if w.startswith("probe-start ")]
        finished = {int(w.split()[1]) for w in child.lines if w.startswith("probe-done ")}
        if not started:
            raise ProbeNotStarted(_why_not_started(child, start_timeout), deadly)
        if started[-1] in finished:
            break  # died outside any import (between two, or at exit): nothing to blame
        culprit = started[-1]
        kind, target = rest[culprit]
        deadly[f"{kind} {target}"] = (
            f"importing it hung (no answer within {timeout:g} s of its start)" if child.code is None else
            f"importing it ended the process ({exit_cause(child.code)}), in a probe child process; not imported here")
        rest = rest[culprit + 1:]
    return deadly


def early_child(early: Mapping[str, Any], key: str) -> _Child | None:
    """An early probe child's run (`harness.engine.early_probe`) as `probe`'s first child, when it probed the origins
    of the probe keyed `key` (`probe_cache.key`: the same origins, Python, path, packages and environment) and
    reached its first import; None otherwise (the probe runs its own first child). A child that ended or hung in an
    import is blamed for it as any probe child is, and the probe goes on with the origins after it."""
    lines = [str(line) for line in early.get("lines") or ()]
    if f"probe-key {key}" not in lines or not any(line.startswith("probe-start ") for line in lines):
        return None
    code = early.get("code")
    return _Child(lines, code if isinstance(code, int) or code is None else -1, str(early.get("stderr") or ""))
