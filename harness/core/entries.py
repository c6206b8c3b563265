"""Small per-machine caches (remembered import probes, remembered plans): where they live and how an entry is kept.

Each lives in a folder of its own under the user's cache folder (`XDG_CACHE_HOME`, else ~/.cache), never in a
checkout, and is turned off by its environment variable set to `off`. An entry is one JSON file written whole
(a reader never sees half of one); only the newest entries stay.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

#: the caches only judges write, read-only to kernel hosts (harness.engine.sandbox): what a judge reads back from them
#: decides what it runs or skips (bytecode, remembered probes and plans)
JUDGE_ONLY = ("pycache", "probes", "plans")


def _root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "moe-harness"


def folder(name: str, switch: str) -> Path | None:
    """The cache folder `name` (None where the environment variable `switch` is `off`)."""
    if os.environ.get(switch, "").lower() == "off":
        return None
    return _root() / name


def judge_only_folders() -> list[str]:
    """The folders of JUDGE_ONLY, made now when missing (a kernel host must not be the first to make one)."""
    made = [_root() / name for name in JUDGE_ONLY]
    for path in made:
        with contextlib.suppress(OSError):
            path.mkdir(parents=True, exist_ok=True)
    return [str(p) for p in made]


def keep(where: Path, name: str, text: str, most: int) -> None:
    """Write entry `name` (`text`) in `where` whole, then leave only the `most` newest entries; nothing when the
    folder cannot be written."""
    with contextlib.suppress(OSError):
        where.mkdir(parents=True, exist_ok=True)
        tmp = where / f"{name}.{os.getpid()}.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(where / f"{name}.json")
        entries = sorted(where.glob("*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for old in entries[most:]:
            with contextlib.suppress(OSError):
                old.unlink()
