"""The import probe's all-clears, remembered per machine: a listing whose adapter modules and libraries are what an
earlier probe imported without harm skips the probe child (a Python, torch and every adapter module: seconds).

An entry is found by a key of what the probe cannot see change from outside: the Python, its module path, every
installed distribution and its version, the environment variables that choose what an import loads, and the origins
probed. It holds the content hash of every file the probe child had imported that no installed distribution's
version stands for (the repository's modules, an editable install's, an adapter module on the path): an entry whose
files are not all as hashed is stale and ignored. Only an all-clear is kept (an import that ended or hung the child
is probed again each time: a hang may be the machine's load). The entries live in the user's cache folder
(`XDG_CACHE_HOME`, else ~/.cache), never in a checkout; `MOE_HARNESS_PROBE_CACHE=off` turns them off.

Skipping the probe changes nothing of what the planning host does with the modules: it imports them and seals each
adapter's declarations as before (`harness.registry.sealed`).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
from collections.abc import Container, Iterable, Sequence
from importlib import metadata
from pathlib import Path

from harness.core import entries

#: modules that register the built-in adapters on import, loaded by name like entry points (the registry sits below
#: them: it knows where they are, not what they import), and the entry-point group of installed packages' adapters
BUILTIN_PROVIDERS = ("harness.ops.reference", "kernels.adapters")
ENTRY_POINT_GROUP = "moe_harness.adapters"
#: `off` turns the remembered probes off
ENV = "MOE_HARNESS_PROBE_CACHE"
#: the entries kept (the newest)
KEEP = 64
#: environment variables that change what an adapter module's import loads or does
_KEYED_ENV = ("PYTHONPATH", "MOE_THIRD_PARTY", "TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
              "LD_PRELOAD")


def origins(specs: Iterable[str], registered: Container[str] = ()) -> list[tuple[str, str]]:
    """What the import probe imports for `specs`: the built-in providers, the entry points, and the modules of the
    `module:object` specs not among `registered` (nothing here imports torch: a probe child started before its
    command's imports asks whether this machine remembers an all-clear without importing them)."""
    found = [("module", m) for m in BUILTIN_PROVIDERS]
    found += [("entry-point", ep.name) for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)]
    found += [("module", s.partition(":")[0]) for s in specs if ":" in s and s not in registered]
    return found


def folder() -> Path | None:
    """Where the entries are (None: turned off)."""
    return entries.folder("probes", ENV)


def key(origins: Sequence[tuple[str, str]]) -> str:
    """The entry name of a probe of `origins` in this interpreter, with what is installed now."""
    dists = sorted(f"{d.metadata['Name']}=={d.version}@{getattr(d, '_path', '')}" for d in metadata.distributions())
    text = json.dumps({"python": [sys.version, sys.executable], "path": sys.path, "dists": dists,
                       "env": {k: os.environ.get(k, "") for k in _KEYED_ENV}, "origins": [list(o) for o in origins]})
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _versioned_roots() -> tuple[str, ...]:
    """Folders whose files a version stands for: the standard library's, the installed distributions'."""
    paths = sysconfig.get_paths()
    roots = {paths[name] for name in ("stdlib", "platstdlib", "purelib", "platlib") if name in paths}
    return tuple(os.path.realpath(r).rstrip("/") + "/" for r in roots)


def own_files(files: Iterable[str]) -> list[str]:
    """The files among `files` that no version stands for (their contents are hashed)."""
    roots = _versioned_roots()
    found = (os.path.realpath(f) for f in files if os.path.isabs(f))  # a built-in module may name a bare file
    return sorted({f for f in found if not f.startswith(roots) and "/site-packages/" not in f
                   and "/dist-packages/" not in f})


def _digest(path: str) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return "missing"


def is_clear(name: str) -> bool:
    """Whether entry `name` holds an all-clear whose files are all as they were hashed."""
    where = folder()
    try:
        recorded = json.loads((where / f"{name}.json").read_text(encoding="utf-8")) if where else None
    except (OSError, ValueError):
        return False
    files = recorded.get("files") if isinstance(recorded, dict) else None
    return isinstance(files, dict) and bool(files) and all(_digest(f) == h for f, h in files.items())


def record(name: str, files: Iterable[str]) -> None:
    """Keep an all-clear of the probe `name` that imported `files`; nothing when the folder cannot be written."""
    where, mine = folder(), own_files(files)
    if where is None or not mine:
        return
    body = json.dumps({"files": {f: _digest(f) for f in mine}}, indent=0)
    entries.keep(where, name, body, KEEP)  # a test's temporary module path makes a key of its own each run
