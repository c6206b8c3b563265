"""Compiled bytecode for the Python processes a run starts, where the environment turns writing it off.

Container images often set PYTHONDONTWRITEBYTECODE (NVIDIA's do). Then no `.pyc` is ever written, and every process
a run starts (xdist workers, fork servers, child sessions, the sweep's processes) compiles torch's two thousand
modules, and the harness's, from source again: 2 to 3 CPU-seconds each on a GPU host's cores, hundreds of times in a
GPU suite. A run that owns its process (`python -m harness`, pytest from the command line) keeps that bytecode
instead in a folder of its own under the user's cache folder (Python's PYTHONPYCACHEPREFIX), never beside any
source: it writes there itself from then on, and so do the processes it starts. Python checks each file against its
source's size and time as usual. Kernel hosts cannot write there (`harness.engine.sandbox`: it is code the judge
runs). A PYTHONPYCACHEPREFIX already set is kept as it is; `MOE_HARNESS_PYCACHE=off` turns this off.

Where that folder does not hold the run's packages yet (a fresh machine, a new torch), the run that chose it starts
one background process that compiles them there (`harness.core.bytecode_warm`) on the cores that sit idle while the
run starts: otherwise its first processes (16 xdist workers, a sweep's workers and kernel hosts) each compiled the
same modules at the same moment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import MutableMapping

from harness.core import entries

#: `off`: leave PYTHONDONTWRITEBYTECODE as it is
ENV = "MOE_HARNESS_PYCACHE"
#: `off`: no background compile of the run's packages
WARM_ENV = "MOE_HARNESS_PYCACHE_WARM"
#: the fewest usable CPUs that warm the folder: where a few processes start at once, the first of each module's
#: importers writes it for the others, and compiling all of torch (13 CPU-seconds) would cost more than it saves
WARM_MIN_CPUS = 8


def keep_for_run(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Where bytecode goes from now on, for this process and those it starts (None: nothing changed: bytecode is
    written as usual, a prefix was chosen already, or `MOE_HARNESS_PYCACHE=off`)."""
    if not environ.get("PYTHONDONTWRITEBYTECODE") or environ.get("PYTHONPYCACHEPREFIX"):
        return None
    where = entries.folder("pycache", ENV)
    if where is None:
        return None
    environ["PYTHONPYCACHEPREFIX"] = str(where)
    del environ["PYTHONDONTWRITEBYTECODE"]
    if environ is os.environ:
        sys.pycache_prefix = str(where)
        sys.dont_write_bytecode = False
        warm_in_background(str(where))
    return str(where)


def warm_in_background(where: str) -> subprocess.Popen | None:
    """Start compiling the run's packages into `where` in a background process, unless they were compiled there
    already for this Python and these packages, or another process is at it, or warming is off or the machine
    small (None then)."""
    from harness.core import bytecode_warm
    from harness.core.device import usable_cpus

    if os.environ.get(WARM_ENV, "").lower() == "off" or usable_cpus() < WARM_MIN_CPUS:
        return None
    if not (todo := bytecode_warm.packages()) or bytecode_warm.done(where, todo):
        return None
    try:
        return subprocess.Popen([sys.executable, "-m", "harness.core.bytecode_warm", where, *todo],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError:
        return None


def prefix(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """The folder bytecode is kept in apart from the sources, for this process or the processes it starts (None:
    beside the sources)."""
    return sys.pycache_prefix or environ.get("PYTHONPYCACHEPREFIX") or None
