"""Import adapter modules in a child process first, so that one whose import ends the process from C code (a
`_exit` in an extension, a crash, a hang) cannot take the parent with it.

The registry's own watched import refuses exits made from Python (`os._exit`, `SystemExit`); an exit from C code
cannot be refused, only survived by not being in that process. `probe(origins)` imports each origin in turn in one
child, which prints a line before and after each; when the child ends early, the origin it had started is the one
that killed it (recorded in `registry.DEADLY`, never imported by this process) and a fresh child goes on with the
origins after it. Used by `python -m harness matrix`, whose parent process imports every adapter it sweeps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence

from harness.core.exits import exit_cause

#: seconds the child may take for all its imports (a module whose import hangs is named as such)
PROBE_TIMEOUT_S = 180.0


def probe(origins: Sequence[tuple[str, str]], timeout: float = PROBE_TIMEOUT_S) -> dict[str, str]:
    """Import each `(kind, target)` origin in a child process, in order: kind "entry-point" (target: the entry
    point's name) or "module" (target: a module name). Returns `{"kind target": why}` for the origins whose import
    ended or hung the child; the others imported (or raised, which the caller's own import reports)."""
    deadly: dict[str, str] = {}
    rest = list(origins)
    # the child finds modules where this process does (a caller may have extended sys.path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
    while rest:
        try:
            proc = subprocess.run([sys.executable, "-m", "harness.registry", json.dumps(rest)],
                                  capture_output=True, text=True, timeout=timeout, env=env)
            out, code = proc.stdout, proc.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            code = None
        lines = out.splitlines()
        if "probe-end" in lines:
            break
        started = [int(w.split()[1]) for w in lines if w.startswith("probe-start ")]
        finished = {int(w.split()[1]) for w in lines if w.startswith("probe-done ")}
        if not started or started[-1] in finished:
            # died outside any import (the child's own startup): nothing to blame, let the real import report it
            break
        culprit = started[-1]
        kind, target = rest[culprit]
        deadly[f"{kind} {target}"] = (f"importing it hung (no answer within {timeout:g} s)" if code is None else
                                      f"importing it ended the process ({exit_cause(code)}), in a probe child "
                                      "process; not imported here")
        rest = rest[culprit + 1:]
    return deadly
