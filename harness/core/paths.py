"""Paths as results may name them: never the absolute path of the machine that made the run.

A verdict's reason, a library's provenance and a run's command are committed and read on other machines, where
the absolute path of someone's checkout means nothing and says who ran it. `public_path` names a file by what it is
instead: relative to the repository (`reference/quant.py`), to an unpacked-library folder (`<third_party>/vllm/...`),
to an import root (`vllm/model_executor/...`: a site-packages or sys.path entry), to the home or temporary directory
(`~/...`, `<tmp>/...`), else by its last two parts (`…/folder/name`). `public_text` does it to every absolute path in
a text, `public_record` to every string of a JSON record, `code_location` to a traceback frame.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import tempfile
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
THIRD_PARTY = "<third_party>"
TMP = "<tmp>"
ELIDED = "…"
#: the environment variable naming unpacked-library folders (harness.registry.sourcefiles reads it too)
THIRD_PARTY_ENV = "MOE_THIRD_PARTY"
#: an installed package's files, on any machine: what follows is the module path
_PACKAGES = re.compile(r"^.*/(?:site|dist)-packages/")
_STDLIB = re.compile(r"^.*/lib/python\d+(?:\.\d+)?/")
#: a path in running text (two parts at least), not inside a longer path or after a name it was given (`<tmp>/`,
#: `&gt;/` in a markdown table, `~/`, `…/`, `$OUT/`)
_IN_TEXT = re.compile(r"(?<![\w./\-~<>…$])(?<!&gt;)/?[\w.+\-@%]+(?:/[\w.+\-@%]*)+")
#: a relative path climbing out of the working directory (pytest names files so), after any glued text
_CLIMB = re.compile(r"(.*?)((?:\.\./)+)(.*)")
#: system places that are the same on every machine, left as they are
_SYSTEM = ("/dev/", "/proc/", "/sys/", "/etc/", "/bin/", "/sbin/", "/usr/bin/")


def _norm(path: str) -> str:
    return os.path.normpath(path) if path.startswith("/") else path


#: the name of an import root (a sys.path entry): what lies under it is a module path; itself is no name at all
_IMPORT_ROOT = "<import root>"


def _prefixes(extra: Mapping[str, str]) -> list[tuple[str, str]]:
    """(prefix, name) pairs of the roots that outrank an installed package's path, longest prefix first."""
    pairs = [(os.path.normpath(p), _IMPORT_ROOT) for p in sys.path if p.startswith("/") and len(p) > 1]
    pairs.append((str(REPO), ""))
    third = [p for p in os.environ.get(THIRD_PARTY_ENV, "").split(os.pathsep) if p.startswith("/")]
    pairs += [(os.path.normpath(p), THIRD_PARTY) for p in [*third, str(REPO / "third_party")]]
    pairs += [(os.path.normpath(p), name) for p, name in extra.items()]
    return sorted(pairs, key=lambda pair: -len(pair[0]))


def _join(name: str, rest: str) -> str:
    return "/".join(part for part in (name, rest) if part) or "."


def _under(path: str, prefix: str) -> str | None:
    """`path` relative to `prefix` ("" when equal), None when it is not under it."""
    if path == prefix:
        return ""
    return path[len(prefix) + 1:] if path.startswith(prefix.rstrip("/") + "/") else None


def public_path(path: str, extra: Mapping[str, str] | None = None) -> str:
    """`path` named without the machine: a relative path is returned as it is. `extra` maps more absolute
    prefixes to names (another machine's checkout to "", its output folder to `$OUT`); the longest prefix wins."""
    if not path.startswith("/"):
        return path
    path = _norm(path)
    for prefix, name in _prefixes(extra or {}):
        if (rest := _under(path, prefix)) is None or (name == _IMPORT_ROOT and not rest):
            continue
        return _join("" if name == _IMPORT_ROOT else name, rest)
    for pattern, name in ((_PACKAGES, ""), (_STDLIB, "<stdlib>")):
        if (m := pattern.match(path + "/")) is not None:
            return _join(name, (path + "/")[m.end():].rstrip("/"))
    for prefix, name in ((os.path.expanduser("~"), "~"), (tempfile.gettempdir(), TMP)):
        if len(prefix) > 1 and (rest := _under(path, os.path.normpath(prefix))) is not None:
            return _join(name, rest)
    parts = [p for p in path.split("/") if p]
    return "/".join([ELIDED, *parts[-2:]])


def public_text(text: str, extra: Mapping[str, str] | None = None) -> str:
    """`text` with every absolute path in it (two parts at least, not a system place like `/dev/shm`), and every
    `../../`-relative one into an installed package, named by `public_path`."""
    if "/" not in text:
        return text

    def name(m: re.Match[str]) -> str:
        found = m.group(0)
        if not found.startswith("/"):  # relative: named only when it climbs into an installed package (pytest's)
            climb = _CLIMB.fullmatch(found)
            target = "/" + climb.group(3) if climb else ""
            if not (_PACKAGES.match(target) or _STDLIB.match(target)):
                return found
            return climb.group(1) + public_path(target, extra)
        if (found + "/").startswith(_SYSTEM):
            return found
        tail = len(found) - len(found.rstrip("."))  # a sentence's full stop is not part of the path
        return public_path(found[: len(found) - tail], extra) + found[len(found) - tail:]

    return _IN_TEXT.sub(name, text)


def public_record(value: Any, extra: Mapping[str, str] | None = None) -> Any:
    """`value` (JSON data) with `public_text` applied to every string in it, keys included."""
    if isinstance(value, str):
        return public_text(value, extra)
    if isinstance(value, Mapping):
        return {public_record(k, extra): public_record(v, extra) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [public_record(v, extra) for v in value]
    return value


@functools.cache
def _distributions() -> Mapping[str, list[str]]:
    return metadata.packages_distributions()


def _installed(top: str) -> str | None:
    """`distribution version` of the installed distribution providing top-level module `top`, None if none."""
    for dist in _distributions().get(top, ()):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return None


def code_location(filename: str, line: int) -> str:
    """`file:line` of a traceback frame, `public_path` named; a file of an installed package also names the
    distribution and version its module path belongs to (`vllm/x.py:49 in vllm 0.32.0`)."""
    name = public_path(filename)
    where = f"{name}:{line}"
    if filename.startswith("/") and _PACKAGES.match(_norm(filename)) and "/" in name:
        found = _installed(name.split("/", 1)[0])
        if found is not None:
            return f"{where} in {found}"
    return where
