"""Where this machine's manifest key is kept (`harness.store.manifest` signs with it; a sandboxed kernel host hides
its folder, `harness.engine.sandbox`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

#: overrides where the key is kept (a file); default `$XDG_CONFIG_HOME/moe-harness/key` or ~/.config/moe-harness/key
KEY_ENV = "MOE_HARNESS_KEY_FILE"


def key_path(env: Mapping[str, str] | None = None) -> Path:
    """The key file under environment `env` (this process's by default)."""
    env = os.environ if env is None else env
    if env.get(KEY_ENV):
        return Path(env[KEY_ENV]).expanduser()
    home = env.get("HOME") or os.path.expanduser("~")
    base = env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    return Path(base) / "moe-harness" / "key"
