"""Reading a file the user named without hanging or a traceback.

A path named `*.jsonl` or `*.json` may be anything: a FIFO (a read waits for a writer forever), a character device
(`/dev/zero` never ends), a dangling symbolic link, a folder, a truncated `.gz`. `read_bytes` reads regular files
only (checked on the open descriptor, opened without blocking) up to a size limit, and raises `UnreadableFile`, a
ValueError whose message names the path and what it is, for everything else.
"""

from __future__ import annotations

import gzip
import os
import stat
import zlib
from pathlib import Path

#: no results or case file is this large; a device or a runaway file is refused rather than read into memory
MAX_BYTES = 1 << 30


class UnreadableFile(ValueError):
    """A file that cannot be read as data: the message names it and why."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def _missing(path: Path) -> UnreadableFile:
    if path.is_symlink():
        return UnreadableFile(f"{str(path)!r} is a dangling symbolic link (to {os.readlink(path)!r})")
    return UnreadableFile(f"{str(path)!r} does not exist")


def read_bytes(path: str | os.PathLike, limit: int = MAX_BYTES, *, decompress: bool = True) -> bytes:
    """The bytes of regular file `path` (a `.gz` decompressed unless `decompress` is off); `UnreadableFile` for
    anything else."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise _missing(path) from None
    except OSError as e:
        raise UnreadableFile(f"cannot read {str(path)!r}: {e.strerror or e}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnreadableFile(f"{str(path)!r} is {_kind(mode)}, not a file")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(limit + 1)
    except OSError as e:
        raise UnreadableFile(f"cannot read {str(path)!r}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if decompress and path.name.endswith(".gz"):
        data = gunzip(path, data, limit)
    if len(data) > limit:
        raise UnreadableFile(f"{str(path)!r} is larger than {limit} bytes: not a results or case file")
    return data


def gunzip(path: str | os.PathLike, data: bytes, limit: int = MAX_BYTES) -> bytes:
    """The content of gzip data read from `path` (named in the error when it is truncated or corrupt)."""
    out = b""
    try:
        while data and len(out) <= limit:  # a gzip file may hold several members, one after the other
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out += d.decompress(data, limit + 1 - len(out))
            if not d.eof and len(out) <= limit:
                raise EOFError("the compressed data ends before its end-of-stream marker")
            data = d.unused_data
        return out
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise UnreadableFile(f"{str(path)!r} is a truncated or corrupt gzip file ({e})") from None


def read_text(path: str | os.PathLike, limit: int = MAX_BYTES) -> str:
    """`read_bytes` as UTF-8 text (`UnreadableFile` when it is not)."""
    data = read_bytes(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UnreadableFile(f"{str(path)!r} is not UTF-8 text ({e.reason} at byte {e.start})") from None
