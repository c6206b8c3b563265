"""One Triton cache folder per kind of kernel host, under the machine's Triton cache.

Triton keeps the kernels it compiles in a file cache that every process of the user reads. A kernel judged in one
host could rewrite there a compiled kernel of another adapter, which that adapter's host would then load, in this run
and in later ones. So a host compiles into the folder of its family (`remote.host_family`: one installed library,
this repository's own adapters, or else the one adapter it judges), and the sandbox makes the cache's root read-only
to it and only that folder writable: what a kernel writes reaches no other family's kernels. A family's variants are
still compiled once per machine. (Where hosts are not sandboxed, the folders only keep the families apart.)
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path

#: the machine's Triton cache, as the judge found it (a host's own TRITON_CACHE_DIR is its family's folder)
ROOT_ENV = "MOE_HARNESS_TRITON_CACHE_ROOT"
#: the family of the hosts that judge no kernel (the listing, the planning)
UNASSIGNED = "unassigned"
#: the family of this repository's own adapters (`remote.host_family`): the other families' hosts read its folder
#: (read-only) before they compile a variant, so that this repository's kernels run under another adapter (a test's,
#: a user's `module:object`) are not compiled again
OWN = "own"
#: the folder of the cache a host reads variants from before it compiles one (`compile_once` reads it)
TRUSTED_ENV = "MOE_HARNESS_TRITON_TRUSTED"


def root(env: Mapping[str, str]) -> str:
    """The machine's Triton cache folder (Triton's default, or TRITON_CACHE_DIR / TRITON_HOME)."""
    home = env.get("TRITON_HOME") or env.get("HOME") or str(Path.home())
    return env.get(ROOT_ENV) or env.get("TRITON_CACHE_DIR") or os.path.join(home, ".triton", "cache")


def folder(env: Mapping[str, str], family: str) -> str:
    """The folder of `family` under `root(env)`."""
    return os.path.join(root(env), "family-" + hashlib.sha256(family.encode()).hexdigest()[:16])


def assign(env: MutableMapping[str, str], family: str) -> str | None:
    """Point `env` (a host's, before it starts) at `family`'s folder, made now by the judge; returns the folder, or
    None (`env` unchanged) where it cannot be made: Triton then fails or not on its own, as without this."""
    base, path, own = root(env), folder(env, family), folder(env, OWN)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError:
        return None
    env[ROOT_ENV] = base
    env["TRITON_CACHE_DIR"] = path
    if family != OWN:
        env[TRUSTED_ENV] = own
    else:
        env.pop(TRUSTED_ENV, None)
    return path
