"""Plans remembered per machine: a repeated sweep reuses an adapter's plan instead of fitting its cases again.

An entry is found by a key of everything that decides a plan: the adapter's declaration record (as its host
described it), the content of the files its declarations and rules can come from (the repository's `harness/`,
`reference/` and `kernels/` sources, and the top package of a `module:object` spec, found on the path without
importing it, or those of the packages registering adapters by entry point), the adapter's library as its host
found it (version, or why it is missing), the profile, the generation, the size scale and the torch and Triton
versions. An entry holds the unsharded plan (a shard is cut from it as from a fresh one) and an HMAC of its key and body
under this machine's manifest key (`harness.core.keyfile`), which kernel hosts cannot read: an entry that is not signed
by it, or does not match its key, is ignored and the plan made again. Entries are written by the judge's process only,
in the user's cache folder next to the import probe's (`harness.core.probe_cache`); `MOE_HARNESS_PLAN_CACHE=off`
turns them off.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import importlib.machinery
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from harness.core import entries
from harness.core.case import Case
from harness.sweep.selection import Plan

#: `off` turns the remembered plans off
ENV = "MOE_HARNESS_PLAN_CACHE"
#: the entries kept (the newest)
KEEP = 256
#: bumped when an entry's form changes
SCHEMA = 1
_ROOT = Path(__file__).resolve().parents[2]
#: the repository's folders whose sources decide plans (the op specs, fitting, the oracle, our adapters)
PLAN_SOURCES = ("harness", "reference", "kernels")


def folder() -> Path | None:
    """Where the entries are (None: turned off)."""
    return entries.folder("plans", ENV)


def _tree_hash(roots: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for root in roots:
        found = sorted(root.rglob("*.py")) if root.is_dir() else [root] if root.is_file() else []
        for f in found:
            if "__pycache__" in f.parts:
                continue
            h.update(str(f.relative_to(root.parent)).encode() + b"\0")
            with contextlib.suppress(OSError):
                h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def _own_sources() -> str:
    """The repository's sources that decide plans, hashed once per process."""
    return _tree_hash(_ROOT / d for d in PLAN_SOURCES)


def _package_of(spec: str) -> Path | None:
    """The top package (or module file) of a `module:object` spec, found on sys.path without importing it."""
    if ":" not in spec:
        return None
    top = spec.split(":", 1)[0].split(".")[0]
    found = importlib.machinery.PathFinder.find_spec(top)
    if found is None:
        return None
    if found.submodule_search_locations:
        return Path(next(iter(found.submodule_search_locations)))
    return Path(found.origin) if found.origin else None


def declaration(adapter: Any) -> dict[str, Any]:
    """The fields of an adapter that planning reads, as JSON (rules by kind: their code is in the hashed sources)."""
    return {"name": adapter.name, "op": adapter.op, "source": adapter.source,
            "support": {k: list(v) for k, v in adapter.support.items()}, "generations": list(adapter.generations),
            "conventions": adapter.conventions, "properties": sorted(adapter.properties), "limits": adapter.limits,
            "rule": (getattr(adapter, "rule_kind", None) or "local") if adapter.requires is not None else None,
            "interp_features": adapter.interp_features is not None, "known": [k.to_dict() for k in adapter.known],
            "tampered": getattr(adapter, "tampered", "")}


def key(adapter: Any, spec: str, profile: str, generation: str) -> str:
    """The entry name of `adapter`'s plan in `profile` on `generation`, with the sources as they are now."""
    import torch

    from harness.core.sizes import scale

    package = _package_of(spec)
    library = getattr(adapter, "library", None)
    text = json.dumps({"schema": SCHEMA, "declaration": declaration(adapter), "spec": spec, "profile": profile,
                       "generation": generation, "scale": scale(), "torch": torch.__version__,
                       "triton": _version("triton"), "harness": _own_sources(),
                       "package": _tree_hash([package]) if package is not None else "",
                       "entry_points": "" if package is not None else _entry_point_sources(),
                       "library": "" if library is None else [library.label(), library.missing()]},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


@functools.lru_cache(maxsize=1)
def _entry_point_sources() -> str:
    """The sources of the packages that register adapters by entry point (a registered name may be theirs), found
    without importing them."""
    from importlib import metadata

    from harness.registry import ENTRY_POINT_GROUP

    tops = sorted({ep.value.split(":", 1)[0].split(".")[0] for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)})
    return _tree_hash(p for p in (_package_of(f"{top}:_") for top in tops) if p is not None)


def _version(distribution: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return ""


def _sign(secret: bytes, name: str, body: str) -> str:
    return hmac.new(secret, f"moe-harness plan\0{name}\0{body}".encode(), hashlib.sha256).hexdigest()


def _secret() -> bytes | None:
    from harness.store import manifest

    return manifest.load_key(create=True)


def _to_json(p: Plan) -> str:
    return json.dumps({"adapter": p.adapter, "op": p.op, "selection": p.selection, "cells": p.cells,
                       "cells_total": p.cells_total, "cases": [c.to_dict() for c in p.cases]}, sort_keys=True)


def _from_json(body: str) -> Plan:
    d = json.loads(body)
    return Plan(d["adapter"], d["op"], d["selection"], d["cells"], d["cells_total"],
                [Case.from_dict(c) for c in d["cases"]])


def load(name: str) -> Plan | None:
    """The plan of entry `name` when it is there and signed with this machine's key; else None (never trusted)."""
    where, secret = folder(), _secret()
    if where is None or secret is None:
        return None
    try:
        entry = json.loads((where / f"{name}.json").read_text(encoding="utf-8"))
        body, mac = entry["plan"], entry["hmac"]
        if not (isinstance(body, str) and isinstance(mac, str) and hmac.compare_digest(_sign(secret, name, body), mac)):
            return None
        return _from_json(body)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(name: str, p: Plan) -> None:
    """Keep plan `p` (unsharded) as entry `name`, signed; nothing when the folder or the key cannot be had."""
    where, secret = folder(), _secret()
    if where is None or secret is None or p.whole is not None:
        return
    body = _to_json(p)
    entries.keep(where, name, json.dumps({"plan": body, "hmac": _sign(secret, name, body)}), KEEP)
