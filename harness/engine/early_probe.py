"""The import probe's child, started by a command before it imports torch itself.

Listing the adapters in a fresh planning host first runs the import probe (`harness.registry.probe`): a child
Python that imports torch and every adapter module, so that an import that ends the process from C code is named
instead of fatal. On a machine whose caches are cold (the probe's remembered all-clears too) that child is most of
the listing, and it ran only once the command had imported torch and started the host. `start` runs it from the
command's first moment instead, beside the command's own imports; `output` is handed to the listing
(`remote.expand(early=...)`), whose probe takes it as its first child when it probed the very origins, Python,
packages and environment the host would (`harness.registry.probe.early_child`): an import that ended or hung it is
blamed as in any probe, and the probe goes on after it. Nothing here imports torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

__all__ = ["EarlyProbe", "start"]

#: the child: this process's module path, then `python -m harness.registry --early DEVICE SPECS`
_BOOT = ("import json, runpy, sys; sys.path[:] = json.loads(sys.argv.pop(1)); "
         "runpy.run_module('harness.registry', run_name='__main__', alter_sys=True)")


class EarlyProbe:
    """A running probe child; `output()` waits for it (the probe's own time limits) and returns what it printed."""

    def __init__(self, proc: subprocess.Popen, err: Any) -> None:
        self.proc, self.err = proc, err

    def output(self) -> dict[str, Any]:
        """Its lines, exit status (None: past the probe's time limits) and the end of its stderr."""
        from harness.registry.probe import PROBE_TIMEOUT_S, START_TIMEOUT_S, collect

        with self.err:
            child = collect(self.proc, self.err, PROBE_TIMEOUT_S, START_TIMEOUT_S)
        return {"lines": child.lines, "code": child.code, "stderr": child.stderr}

    def cancel(self) -> None:
        """End it unread (the command stopped before its listing); a no-op after `output`."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.err.close()


def start(device: str, specs: Sequence[str]) -> EarlyProbe | None:
    """Start the probe child for `specs` (as the matrix lists them) on `device` (it chooses the interpreter as the
    command will); None where it cannot start (the listing then probes as before)."""
    # this process's module path exactly (the probe's cache key holds it, and PYTHONPATH as the environment has it)
    err = tempfile.TemporaryFile()
    try:
        proc = subprocess.Popen([sys.executable, "-c", _BOOT, json.dumps(sys.path), "--early", device,
                                 json.dumps(list(specs))], stdout=subprocess.PIPE, stderr=err)
    except OSError:
        err.close()
        return None
    return EarlyProbe(proc, err)
