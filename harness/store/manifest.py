"""Manifests: what the judge wrote into a results file, so that a reader uses that and nothing else.

Next to every results file `<name>.jsonl` (or `.jsonl.gz`) the judge writes `<name>.jsonl.manifest`: the number of
lines and bytes it wrote, the sha256 of those bytes, the first 64 bits of each line's sha256 (to say which lines
changed), the lines it excludes itself (kept in the file, never read: a line that was not the judge's, dropped on
resume), the sha256 of each case file it wrote, whether the run ended (`final`), and an HMAC-SHA256 of all that
with the key of the machine that ran it (`key_path()`, created 0600 on first use, outside every results folder).
It is rewritten at checkpoints while the run goes on, so a run killed midway keeps the part it had vouched for.

A reader (`Gate`) uses a file only when its manifest matches: signed with this machine's key, or, unsigned here
(no key, another machine's), when git holds exactly this content as committed (the repository's results/ on any
clone) or, outside any git work tree, under the repository's results/ (integrity only). Everything else is left
out and named in one line. See docs/RESULTS_TRUST.md for what this stops and what it cannot.
"""

from __future__ import annotations

import difflib
import hashlib
import hmac
import json
import os
import secrets
import subprocess
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core import files
from harness.core.keyfile import KEY_ENV as KEY_ENV  # where the key is: read by the sandbox too
from harness.core.keyfile import key_path

KIND = "moe-harness-manifest"
SCHEMA = 1
SUFFIX = ".manifest"
DIGEST_HEX = 16  # 64 bits of each line's sha256: enough to say which lines changed (the file's sha256 authenticates)
RESULTS_ROOT = Path(__file__).resolve().parents[2] / "results"


def manifest_path(path: str | os.PathLike) -> Path:
    """Where the manifest of results file `path` is (`x.jsonl` and `x.jsonl.gz` share `x.jsonl.manifest`)."""
    p = Path(path)
    name = p.name[:-3] if p.name.endswith(".gz") else p.name
    return p.with_name(name + SUFFIX)


# -- the key --------------------------------------------------------------------------------------------------------

def _create_key(path: Path) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first: use theirs
        return
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_hex(32) + "\n")


def load_key(create: bool = False) -> bytes | None:
    """This machine's manifest key (None when there is none or it cannot be read; made first when `create`)."""
    path = key_path()
    if create and not path.exists():
        try:
            _create_key(path)
        except OSError as e:
            warnings.warn(f"cannot create the manifest key {path}: {e}; manifests are written unsigned", stacklevel=2)
            return None
    try:
        key = bytes.fromhex(files.read_text(path, limit=4096).strip())
    except ValueError:
        return None
    return key if len(key) >= 16 else None


def key_id(key: bytes) -> str:
    """Names a key without revealing it (which machine's key signed a manifest)."""
    return hashlib.sha256(b"moe-harness key id\0" + key).hexdigest()[:16]


def _signature(key: bytes, record: dict[str, Any]) -> str:
    body = json.dumps({k: v for k, v in record.items() if k != "hmac"}, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, body.encode("utf-8"), hashlib.sha256).hexdigest()


def digest(line: bytes) -> str:
    """A line's entry in a manifest (the line without its newline)."""
    return hashlib.sha256(line).hexdigest()[:DIGEST_HEX]


def _ranges(numbers: Iterable[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for n in sorted(set(numbers)):
        if out and out[-1][1] == n - 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return out


def _numbers(ranges: Any) -> set[int]:
    return {n for a, b in ranges for n in range(int(a), int(b) + 1)}


# -- writing --------------------------------------------------------------------------------------------------------

@dataclass
class ManifestWriter:
    """The manifest of one results file as its one writer builds it, line by line."""

    path: Path  # the results file
    run_id: str
    key: bytes | None
    digests: list[str] = field(default_factory=list)
    excluded: set[int] = field(default_factory=set)  # 1-based lines the judge does not vouch for
    case_files: dict[str, str] = field(default_factory=dict)
    size: int = 0

    def __post_init__(self) -> None:
        self._hash = hashlib.sha256()

    def add(self, line: bytes, vouched: bool = True) -> None:
        """One complete line as written (with its newline)."""
        self._hash.update(line)
        self.size += len(line)
        self.digests.append(digest(line.rstrip(b"\n")))
        if not vouched:
            self.excluded.add(len(self.digests))

    def add_case_file(self, path: Path) -> None:
        try:
            data = files.read_bytes(path)
        except ValueError:
            return
        rel = os.path.relpath(path, self.path.parent).replace(os.sep, "/")
        self.case_files[rel] = hashlib.sha256(data).hexdigest()

    def record(self, final: bool) -> dict[str, Any]:
        rec: dict[str, Any] = {"kind": KIND, "schema": SCHEMA, "file": manifest_path(self.path).name[:-len(SUFFIX)],
                               "run_id": self.run_id, "lines": len(self.digests), "bytes": self.size,
                               "sha256": self._hash.copy().hexdigest(), "line_digests": "".join(self.digests),
                               "excluded": _ranges(self.excluded), "case_files": dict(sorted(self.case_files.items())),
                               "final": final}
        if self.key is not None:
            rec["key_id"] = key_id(self.key)
            rec["hmac"] = _signature(self.key, rec)
        return rec

    def write(self, final: bool = False) -> None:
        """Write the manifest atomically (a reader sees the old one or the new one, never half of one)."""
        target = manifest_path(self.path)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.record(final), sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, target)


def seal(path: str | os.PathLike, key: bytes | None, run_id: str = "") -> Path:
    """Write a final manifest vouching for every complete line of `path` as it is now but those its manifest, if any,
    excludes (committed results that predate manifests; `key` None: unsigned, checked by its hashes and git).
    Returns the manifest's path."""
    path = Path(path)
    writer = ManifestWriter(path, run_id or path.name.split(".")[0], key)
    skip = excluded_lines(path)
    for i, line in enumerate(_complete_lines(files.read_bytes(path))):
        writer.add(line + b"\n", vouched=i not in skip)
    writer.write(final=True)
    return manifest_path(path)


def _complete_lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")[:-1]


# -- reading --------------------------------------------------------------------------------------------------------

@dataclass
class Inspection:
    """How a results file compares with its manifest."""

    path: Path
    status: str  # none | unreadable | forged | mismatch | signed | unsigned
    detail: str = ""
    usable: list[int] = field(default_factory=list)  # 0-based indices of the lines a reader may use
    changed: list[int] = field(default_factory=list)  # 1-based lines of the file that do not match (or are extra)
    missing: int = 0  # lines the manifest lists that the file no longer has
    tail: list[int] = field(default_factory=list)  # 1-based lines after the last checkpoint of an unfinished run
    excluded: list[int] = field(default_factory=list)  # 1-based lines the manifest itself excludes
    signed: bool = False  # its signature was checked with this machine's key

    @property
    def matches(self) -> bool:
        return self.status in ("signed", "unsigned")

    def why(self) -> str:
        """Why the file is left out, in the words of the one line that names it."""
        if self.status == "none":
            return "no manifest"
        if self.status == "mismatch":
            n = len(self.changed) + self.missing
            return f"does not match its manifest: {n} line{'s' if n != 1 else ''} changed" + \
                (f" ({self.detail})" if self.detail else "")
        return self.detail


def excluded_lines(path: str | os.PathLike) -> set[int]:
    """The 0-based lines the manifest of `path` excludes (none when it has no readable manifest)."""
    try:
        return {n - 1 for n in _numbers(read_manifest(Path(path)).get("excluded", []))}
    except (ValueError, TypeError):
        return set()


def read_manifest(path: Path) -> dict[str, Any]:
    rec = json.loads(files.read_text(manifest_path(path), limit=files.MAX_BYTES))
    if not isinstance(rec, dict) or rec.get("kind") != KIND or rec.get("schema") != SCHEMA:
        raise ValueError("not a manifest of this schema")
    digests = rec.get("line_digests")
    if not isinstance(digests, str) or len(digests) != DIGEST_HEX * int(rec.get("lines", -1)):
        raise ValueError("its line digests do not match its line count")
    return rec


def inspect(path: str | os.PathLike, data: bytes, key: bytes | None) -> Inspection:
    """Compare `data` (the file's content, decompressed) with the manifest next to `path`."""
    path = Path(path)
    if not manifest_path(path).exists() and not manifest_path(path).is_symlink():
        return Inspection(path, "none")
    try:
        rec = read_manifest(path)
    except (ValueError, TypeError) as e:
        return Inspection(path, "unreadable", f"its manifest cannot be read: {e}")
    if rec.get("file") != manifest_path(path).name[:-len(SUFFIX)]:
        return Inspection(path, "forged", f"its manifest is another file's ({rec.get('file')!r})")
    status = "unsigned"
    if key is not None and rec.get("key_id") == key_id(key):
        if not hmac.compare_digest(str(rec.get("hmac", "")), _signature(key, rec)):
            return Inspection(path, "forged", "its manifest's signature does not match (it was not written by the "
                                              "judge on this machine)")
        status = "signed"
    found = _compare(path, data, rec, status)
    found.signed = status == "signed"
    return found


def _compare(path: Path, data: bytes, rec: dict[str, Any], status: str) -> Inspection:
    want = [rec["line_digests"][i:i + DIGEST_HEX] for i in range(0, len(rec["line_digests"]), DIGEST_HEX)]
    parts = data.split(b"\n")
    got = [digest(line) for line in parts[:-1]] + ([digest(parts[-1])] if parts[-1] else [])
    final = bool(rec.get("final"))
    out = Inspection(path, status, excluded=sorted(_numbers(rec.get("excluded", []))))
    if got[:len(want)] != want:
        _align(out, want, got, final)
    elif final and len(got) > len(want):
        out.changed = list(range(len(want) + 1, len(got) + 1))
    else:
        out.tail = list(range(len(want) + 1, len(got) + 1))
        covered = b"".join(line + b"\n" for line in parts[:len(want)])
        if hashlib.sha256(covered).hexdigest() != rec.get("sha256") or len(covered) != rec.get("bytes"):
            out.status, out.detail = "mismatch", "the sha256 of its lines differs"
    if out.changed or out.missing:
        out.status = "mismatch"
    if out.status != "mismatch":
        skip = set(out.excluded)
        out.usable = [i for i in range(len(want)) if i + 1 not in skip]
    return out


def _align(out: Inspection, want: list[str], got: list[str], final: bool) -> None:
    """Which lines of the file differ from the manifest's (inserted, replaced or removed lines)."""
    ops = difflib.SequenceMatcher(None, want, got, autojunk=False).get_opcodes()
    if not final and ops and ops[-1][0] == "insert" and ops[-1][2] == len(want):
        out.tail = list(range(ops[-1][3] + 1, ops[-1][4] + 1))  # after the last checkpoint: not a change
        ops = ops[:-1]
    for tag, i1, i2, j1, j2 in ops:
        if tag in ("replace", "insert"):
            out.changed += range(j1 + 1, j2 + 1)
        if tag in ("replace", "delete"):
            out.missing += max(0, (i2 - i1) - (j2 - j1 if tag == "replace" else 0))


def vouched_lines(path: str | os.PathLike, data: bytes, key: bytes | None) -> set[int]:
    """The 0-based lines of `path` that its manifest, signed with this machine's key, vouches for at their place (a
    writer continuing the file keeps those and excludes the rest; a manifest it cannot authenticate vouches for
    nothing: continuing it would sign what someone else wrote)."""
    if key is None or not inspect(path, data, key).signed:
        return set()
    rec = read_manifest(Path(path))
    want = [rec["line_digests"][i:i + DIGEST_HEX] for i in range(0, len(rec["line_digests"]), DIGEST_HEX)]
    got = [digest(line) for line in _complete_lines(data)]
    skip = _numbers(rec.get("excluded", []))
    ops = difflib.SequenceMatcher(None, want, got, autojunk=False).get_opcodes()
    return {j1 + k for tag, i1, _i2, j1, j2 in ops if tag == "equal" for k in range(j2 - j1)
            if i1 + k + 1 not in skip}


# -- the gate: which files a render, a --from or a --resume may use -------------------------------------------------

class Gate:
    """Decides, file by file, which lines of results files a reader uses; `notes` collects the one-line reports of
    what was left out ("left out: PATH (why)")."""

    def __init__(self, key: bytes | None = None, *, use_key: bool = True) -> None:
        self.key = key if key is not None or not use_key else load_key()
        self.notes: list[str] = []
        self._tops: dict[Path, Path | None] = {}
        self._blobs: dict[Path, dict[str, str]] = {}

    def admit(self, path: Path, data: bytes) -> list[int] | None:
        """The 0-based lines of `path` (content `data`) to read, or None when the file is left out."""
        found = inspect(path, data, self.key)
        shown = _shown(path)
        if found.matches and found.status == "unsigned" and not self.committed(path):
            found.status = "unsigned-uncommitted"
            found.detail = ("its manifest is not signed with this machine's key and git does not hold this file as "
                            "committed")
        if not found.matches:
            self.notes.append(f"left out: {shown} ({found.why()})")
            return None
        if found.tail:
            self.notes.append(f"left out: {shown}: {_span(found.tail)} (written after its manifest's last "
                              "checkpoint: the run did not end)")
        if found.excluded:
            self.notes.append(f"left out: {shown}: {_span(found.excluded)} (excluded by its manifest)")
        return found.usable

    def committed(self, path: Path) -> bool:
        """Whether git's HEAD holds exactly this file (its raw bytes); outside any work tree, whether it is under the
        repository's results/ (a copy without git: integrity only)."""
        path = path.resolve()
        top = self._top(path.parent)
        if top is None:
            return path.is_relative_to(RESULTS_ROOT.resolve()) and "local" not in path.relative_to(
                RESULTS_ROOT.resolve()).parts
        blobs = self._blobs.get(top)
        if blobs is None:
            blobs = self._blobs[top] = _head_blobs(top)
        try:
            raw = files.read_bytes(path, decompress=False)
        except ValueError:
            return False
        sha = hashlib.sha1(b"blob %d\0" % len(raw) + raw).hexdigest()
        return blobs.get(path.relative_to(top).as_posix()) == sha

    def _top(self, folder: Path) -> Path | None:
        if folder not in self._tops:
            self._tops[folder] = _git_top(folder)
        return self._tops[folder]


def _span(lines: list[int]) -> str:
    rs = _ranges(lines)
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in rs[:5]) + (", ..." if len(rs) > 5 else "")
    return f"line{'s' if len(lines) > 1 else ''} {text}"


def _shown(path: Path) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if rel.startswith("..") else rel


def _git(folder: Path, *args: str) -> bytes | None:
    try:
        done = subprocess.run(["git", *args], cwd=folder, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _git_top(folder: Path) -> Path | None:
    out = _git(folder, "rev-parse", "--show-toplevel")
    return Path(out.decode().strip()).resolve() if out else None


def _head_blobs(top: Path) -> dict[str, str]:
    """path -> blob id of every file of HEAD."""
    out = _git(top, "ls-tree", "-r", "-z", "--full-tree", "HEAD") or b""
    found = {}
    for entry in out.decode("utf-8", "replace").split("\0"):
        meta, _, name = entry.partition("\t")
        words = meta.split()
        if len(words) == 3 and words[1] == "blob":
            found[name] = words[2]
    return found
