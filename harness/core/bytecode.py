"""Compiled bytecode for the Python processes a run starts, where the environment turns writing it off.

Container images often set PYTHONDONTWRITEBYTECODE (NVIDIA's do). Then no `.pyc` is ever written, and every process
a run starts (xdist workers, fork servers, child sessions, the sweep's processes) compiles torch's two thousand
modules, and the harness's, from source again: 2 to 3 CPU-seconds each on a GPU host's cores, hundreds of times in a
GPU suite. A run that owns its process (`python -m harness`, pytest from the command line) keeps that bytecode
instead in a folder of its own under the user's cache folder (Python's PYTHONPYCACHEPREFIX), never beside any
source: it writes there itself from then on, and so do the processes it starts. Python checks each file against its
source's size and time as usual. Kernel hosts cannot write there (`harness.engine.sandbox`: it is code the judge
runs). A PYTHONPYCACHEPREFIX already set is kept as it is; `MOE_HARNESS_PYCACHE=off` turns this off.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

from harness.core import entries

#: `off`: leave PYTHONDONTWRITEBYTECODE as it is
ENV = "MOE_HARNESS_PYCACHE"


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
    return str(where)


def prefix(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """The folder bytecode is kept in apart from the sources, for this process or the processes it starts (None:
    beside the sources)."""
    return sys.pycache_prefix or environ.get("PYTHONPYCACHEPREFIX") or None
