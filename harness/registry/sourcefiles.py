"""A library's kernels read from its files (an installed package's, or an unpacked wheel's in a git-ignored folder)
when the library itself cannot be imported here: its package needs a GPU build, a newer torch or a long list of
dependencies, while its Triton kernels and the plain functions around them are pure Python.

`locate` finds the package's directory: the installed package (found without importing it), else the first of the
folders named by `MOE_THIRD_PARTY` (colon-separated) or `third_party/` at the repository root that holds
`<folder>/<package>/` (an unpacked wheel, or the part of one that `scripts/third_party.sh` extracts). `take` copies,
by name and unchanged, top-level functions out of the package's files (with `ast`); `build` writes them after a
prelude of stand-ins for what they import (the package's own modules are not imported) into a module in the user's
cache directory (Triton's JIT needs the source in a file) and imports it. Nothing of the library is kept in this
repository. The version comes from the package's `*.dist-info/METADATA` (or the installed distribution), and a
content hash of the files read is part of the provenance label (`FilesLibrary` in `harness.registry`).
"""

from __future__ import annotations

import ast
import builtins
import functools
import hashlib
import importlib.util
import linecache
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from harness.core.paths import THIRD_PARTY_ENV

#: the environment variable naming the folders to search (colon-separated), before `third_party/`
FOLDERS_ENV = THIRD_PARTY_ENV
_REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Found:
    """A library package's files: `package` (its directory), `version`, `origin` ("installed" or the folder)."""

    package: Path
    version: str
    origin: str


def folders() -> list[Path]:
    """The folders searched for an unpacked package, in order."""
    named = [Path(p).expanduser() for p in os.environ.get(FOLDERS_ENV, "").split(os.pathsep) if p]
    return [*named, _REPO / "third_party"]


def _metadata_version(site: Path, distribution: str) -> str | None:
    """The version in a `<distribution>-<version>.dist-info/METADATA` under `site`, None when there is none."""
    norm = re.sub(r"[-_.]+", "_", distribution).lower()
    for meta in sorted(site.glob("*.dist-info/METADATA")):
        if re.sub(r"[-_.]+", "_", meta.parent.name.split("-")[0]).lower() != norm:
            continue
        found = re.search(r"^Version:\s*(\S+)", meta.read_text(errors="replace"), re.M)
        if found:
            return found.group(1)
    return None


def _installed(package: str, distribution: str) -> Found | None:
    try:
        spec = importlib.util.find_spec(package)  # a top-level name: found without running the package
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    where = Path(next(iter(spec.submodule_search_locations)))
    try:
        version = metadata.version(distribution)
    except metadata.PackageNotFoundError:
        version = _metadata_version(where.parent, distribution) or "unknown"
    return Found(where, version, "installed")


@functools.cache
def locate(package: str, distribution: str, needs: tuple[str, ...] = ()) -> Found | None:
    """Where `package`'s files are (module docstring); `needs` (paths relative to the package directory) must all
    exist there. Looked up once per process."""
    candidates: list[Found] = []
    inst = _installed(package, distribution)
    if inst is not None:
        candidates.append(inst)
    for folder in folders():
        if (folder / package).is_dir():
            candidates.append(Found(folder / package, _metadata_version(folder, distribution) or "unknown",
                                    str(folder)))
    for c in candidates:
        if all((c.package / n).exists() for n in needs):
            return c
    return None


@functools.cache
def content_hash(package: Path, files: tuple[str, ...]) -> str:
    """sha256 over the relative paths and bytes of `files` (relative to `package`), in the order given; a directory
    counts every file under it (but bytecode caches, which importing it writes), in path order. Computed once per
    process, like the version."""
    h = hashlib.sha256()
    for rel in files:
        p = package / rel
        for f in sorted(x for x in p.rglob("*") if x.is_file() and "__pycache__" not in x.parts
                        and x.suffix not in (".pyc", ".pyo")) if p.is_dir() else [p]:
            h.update(f.relative_to(package).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def take(source: str, names: tuple[str, ...], file: str) -> str:
    """The source text of the top-level functions or classes `names` (with their decorators), in file order.
    ValueError naming the missing ones: the library's version moved them."""
    tree = ast.parse(source)
    lines = source.splitlines()
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
            start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
            found[node.name] = "\n".join(lines[start:node.end_lineno])
    missing = [n for n in names if n not in found]
    if missing:
        raise ValueError(f"{file} has no top-level {missing}: not the version this adapter was written for")
    return "\n\n\n".join(found[n] for n in names)


def _importer(stand_ins: Mapping[str, Any]) -> Callable[..., Any]:
    """An `__import__` that answers `from NAME import ...` for the modules `stand_ins` names (the library's own,
    imported inside a taken function) with their stand-ins, and every other import as Python does."""
    real = builtins.__import__

    def importer(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if level == 0 and fromlist and name in stand_ins:
            return stand_ins[name]
        return real(name, globals, locals, fromlist, level)

    return importer


def build(found: Found, name: str, prelude: str, parts: dict[str, tuple[str, ...]],
          stand_ins: Mapping[str, Any] | None = None) -> ModuleType:
    """A module of the functions `parts` (file relative to the package -> names) taken from `found`'s files, after
    `prelude` (its stand-ins; `stand_ins` answers the imports of the library's own modules inside the taken
    functions). Written once per content into the cache directory and imported under a name that carries its hash,
    so two versions never share a module."""
    body = "\n\n\n".join(take((found.package / f).read_text(), names, f) for f, names in parts.items())
    header = f'"""Generated by moe-harness from {found.package} ({found.version}); that library\'s code."""\n'
    code = header + prelude + "\n\n" + body + "\n"
    digest = hashlib.sha1(code.encode()).hexdigest()[:12]
    module_name = f"moe_harness_taken_{name}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "moe-harness" / "taken"
    cache.mkdir(parents=True, exist_ok=True)
    file = cache / f"{module_name}.py"
    if not file.is_file() or file.read_text() != code:  # for tracebacks and readers; what runs is `code` itself
        tmp = file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(code)
        tmp.replace(file)
    spec = importlib.util.spec_from_file_location(module_name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    if stand_ins:
        module.__dict__["__builtins__"] = {**vars(builtins), "__import__": _importer(stand_ins)}
    sys.modules[module_name] = module
    # The cache folder is writable to kernels: the module runs from `code`, never from the file or bytecode cached
    # beside it, and the source Triton's jit reads (inspect, through linecache) is `code` too.
    linecache.cache[str(file)] = (len(code), None, code.splitlines(True), str(file))
    try:
        exec(compile(code, str(file), "exec"), module.__dict__)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module
