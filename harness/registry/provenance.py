"""Where a library's code was loaded from, when it is not the installed distribution's copy.

A verdict records the library's version as provenance (`Library.label`). The distribution's version says which
code ran only when the module comes from that distribution's installed files. A module imported from a source
tree (a directory on PYTHONPATH or sys.path, a git checkout, an editable or development install) may be at any
commit, with any local change: there the label names the tree and its version, the git commit of the tree that
holds the module file (and `dirty` when tracked files differ from it, or files git does not ignore were added
under the module's directory), or, where git does not know the file, a content hash of the module's files.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path, PurePosixPath

from harness.core.paths import public_path

#: git must answer within this many seconds; a tree it cannot describe in time is hashed instead
GIT_TIMEOUT_S = 20.0
#: files that describe no code of the package (bytecode caches)
_SKIPPED_DIRS = {"__pycache__"}
_SKIPPED_SUFFIXES = (".pyc", ".pyo")


@dataclass(frozen=True)
class Source:
    """A source tree a module was imported from: `path` (the git work tree, else the module's directory or file),
    `commit` and `dirty` when git tracks the module file there, else `content` (sha256 of the module's files)."""

    path: str
    commit: str | None = None
    dirty: bool = False
    content: str | None = None

    def label(self) -> str:
        if self.commit is not None:
            return f"source {public_path(self.path)}, git {self.commit}{', dirty' if self.dirty else ''}"
        return f"source {public_path(self.path)}, content sha256 {self.content}"


def module_location(module: str) -> Path | None:
    """The file (a plain module) or the directory (a package) `module` is imported from; None when it cannot be
    found or has no location (a built-in, a namespace package spread over several directories)."""
    mod = sys.modules.get(module)
    try:
        spec = getattr(mod, "__spec__", None) if mod is not None else importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.has_location and spec.origin:
        origin = Path(spec.origin)
        return origin.parent if spec.submodule_search_locations is not None else origin
    places = list(spec.submodule_search_locations or [])
    return Path(places[0]) if len(places) == 1 else None


def installed_copy(distribution: str, location: Path) -> bool:
    """Whether `location` (a module file or package directory) is among the files the distribution installed. Not
    for an editable install (its record lists a path hook, not the module), a development egg-info in the source
    tree (no install record at all: its file list is the tree's own SOURCES.txt), or a copy elsewhere on sys.path
    that shadows the installed one."""
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    if dist.read_text("RECORD") is None and dist.read_text("installed-files.txt") is None:
        return False
    target = (location / "__init__.py" if location.is_dir() else location).resolve()
    for f in dist.files or ():
        if f.name == target.name and Path(str(dist.locate_file(f))).resolve() == target:
            return True
    return False


def _git(where: Path, *args: str) -> subprocess.CompletedProcess[str] | None:
    # GIT_OPTIONAL_LOCKS=0: `git status` must not take the index lock of a tree someone may be working in
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    try:
        return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, env=env,
                              timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None


def git_source(location: Path) -> Source | None:
    """The git commit of the work tree holding `location`, None when git does not track it there (no git, not a
    work tree, the file untracked or ignored)."""
    where = location if location.is_dir() else location.parent
    tracked = location / "__init__.py" if location.is_dir() else location
    top = _git(where, "rev-parse", "--show-toplevel")
    head = _git(where, "rev-parse", "--verify", "HEAD")
    known = _git(where, "ls-files", "--error-unmatch", "--", str(tracked))
    status = _git(where, "status", "--porcelain", "--untracked-files=all")
    if top is None or head is None or known is None or status is None or any(
            r.returncode for r in (top, head, known, status)):
        return None
    root = Path(top.stdout.strip())
    try:  # what an added file must lie under to count: the package's directory (a plain module: itself)
        scope = location.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        scope = "."
    scope = "" if scope == "." else scope
    dirty = any(not line.startswith("??") or (_under(line[3:].strip('"'), scope)
                                               and not _bytecode(line[3:].strip('"')))
                for line in status.stdout.splitlines())
    return Source(path=str(root), commit=head.stdout.strip(), dirty=dirty)


def _bytecode(path: str) -> bool:
    """An untracked bytecode cache (a checkout without a .gitignore for them): Python's, not a change of code."""
    parts = PurePosixPath(path)
    return bool(_SKIPPED_DIRS & set(parts.parts)) or parts.suffix in _SKIPPED_SUFFIXES


def _under(path: str, scope: str) -> bool:
    return not scope or path == scope or path.startswith(scope + "/")


def content_hash(location: Path) -> str:
    """sha256 over the relative paths and bytes of the module's files (a package: every file under its directory
    but bytecode caches), in path order."""
    h = hashlib.sha256()
    if location.is_dir():
        files = sorted(p for p in location.rglob("*") if p.is_file() and not _SKIPPED_DIRS & set(p.parts)
                       and p.suffix not in _SKIPPED_SUFFIXES)
    else:
        files = [location]
    for p in files:
        rel = p.relative_to(location).as_posix() if location.is_dir() else p.name
        h.update(rel.encode() + b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


@functools.cache
def source_of(module: str, distribution: str) -> Source | None:
    """Where `module` comes from when that is not `distribution`'s installed copy (None: it is, or the module cannot
    be found). Looked up once per process, like the version."""
    location = module_location(module)
    if location is None or not location.exists() or installed_copy(distribution, location):
        return None
    found = git_source(location)
    if found is not None:
        return found
    try:
        return Source(path=str(location), content=content_hash(location))
    except OSError as e:  # a file it cannot read: say so rather than name no version
        return Source(path=str(location), content=f"unknown ({type(e).__name__})")
