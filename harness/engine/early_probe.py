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

#: the child: this process's module path, then this module as `__main__` with DEVICE SPECS (`_child`)
_BOOT = ("import json, runpy, sys; sys.path[:] = json.loads(sys.argv.pop(1)); "
         "runpy.run_module('harness.engine.early_probe', run_name='__main__', alter_sys=True)")


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


def start(specs: Sequence[str]) -> EarlyProbe | None:
    """Start the probe child for `specs` (as the matrix lists them); None where it cannot start (the listing then
    probes as before). It probes as the listing host will, a host on `LISTING_DEVICE` whatever the run's device: on
    a GPU machine a child that chose the interpreter as the command does (off) made a probe of another key, which
    the listing could never use (a cold H200 listing took 7.3 s with it)."""
    from harness.core.device import LISTING_DEVICE

    # this process's module path exactly (the probe's cache key holds it, and PYTHONPATH as the environment has it)
    err = tempfile.TemporaryFile()
    try:
        proc = subprocess.Popen([sys.executable, "-c", _BOOT, json.dumps(sys.path), LISTING_DEVICE,
                                 json.dumps(list(specs))],
                                stdout=subprocess.PIPE, stderr=err)
    except OSError:
        err.close()
        return None
    return EarlyProbe(proc, err)


def _child(device: str, specs: list[str]) -> int:
    """The probe child: it chooses the interpreter as a host on `device` does and names the probe it makes by its cache
    key, so that the process that imports the adapters uses its result only for the same probe; "probe-clear" when
    this machine's last probe of it found nothing and nothing changed since. Up to there it imports no torch (where
    the interpreter's choice needs none: `prepare_interpreter`), so a remembered all-clear costs a fraction of a
    second instead of a torch import beside the command's own."""
    from harness.core import probe_cache
    from harness.core.device import prepare_interpreter

    prepare_interpreter(device)
    origins = probe_cache.origins(specs)  # a fresh process: no adapter registered yet
    key = probe_cache.key(origins)
    print(f"probe-key {key}", flush=True)
    if probe_cache.is_clear(key):
        print("probe-clear", flush=True)
        return 0
    from harness.registry.__main__ import probe_origins_here

    return probe_origins_here(origins)


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], json.loads(sys.argv[2])))
