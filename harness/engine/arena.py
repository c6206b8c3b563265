"""The shared-memory arena through which the judge hands a kernel host its inputs and output buffers.

A file in shared memory that both processes map: the judge allocates tensors in it (`Arena.put`, `Arena.empty`) and
describes each with a `Slot` (offset, dtype, shape, strides); the host views the same bytes (`view`). Nothing but
these descriptions crosses the pipe, and no tensor is pickled.

The file has no name a process could open: a sealed memfd (Linux), handed to the host as a file descriptor over the
pipe (`fd`). Its seals forbid shrinking it, so a kernel that truncates it cannot make the judge's next read of it
fault (SIGBUS). Its memory is allocated when it is made: no shared memory left is an `ArenaSpaceError` then, never a
fault later. The first tensor starts at a random offset, and a random gap lies before each one, so no address in it,
nor any distance between two tensors, is a stable sign of being judged.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import secrets
import tempfile
from dataclasses import dataclass
from typing import Any

import torch

from harness.core.layouts import contiguous_strides

_ALIGN = 64
#: before each tensor, a gap of up to this many alignment steps, drawn: no tensor lies at a fixed distance from another
_GAPS = 16


@dataclass(frozen=True)
class Slot:
    """Where one tensor lies in the arena: byte offset, dtype, shape, strides (in elements)."""

    offset: int
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    nbytes: int


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dt


def _span(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    return 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, stride))


def view(buf: Any, slot: Slot) -> torch.Tensor:
    """The tensor `slot` describes, over the buffer `buf` (an mmap)."""
    dt = _dtype(slot.dtype)
    raw = torch.frombuffer(buf, dtype=torch.uint8, count=max(slot.nbytes, 1), offset=slot.offset)
    flat = raw[:slot.nbytes].view(dt) if dt != torch.bool else raw[:slot.nbytes].view(torch.bool)
    return flat.as_strided(slot.shape, slot.stride, 0)


#: how older versions named their arena files (`remove_stale` removes those their judges left); an arena file is now
#: named by random hex alone, nothing a kernel could recognise in its memory map
PREFIX = "moe-harness-arena-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # someone else's process
        return True
    return True


def remove_stale(folder: str) -> None:
    """Remove the arena files of judges that are gone: a judge killed outright (a hung session's end, SIGKILL) never
    removes its own, and shared memory holds them until the machine restarts."""
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            pid = name[len(PREFIX):].split("-", 1)[0] if name.startswith(PREFIX) else ""
            if pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, name))


class ArenaSpaceError(OSError):
    """No shared memory left for an arena: the machine's, not a kernel's, problem."""


#: seals of an arena's memfd: its size is fixed for good (a host cannot shrink it under the judge's reads)
_SEALS = ("F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_SEAL")


def _sealable() -> bool:
    import fcntl

    return hasattr(os, "memfd_create") and all(hasattr(fcntl, s) for s in ("F_ADD_SEALS", *_SEALS))


def _new_file() -> tuple[int, str]:
    """An open file of shared memory that no path names, and what it lives in (for messages)."""
    if _sealable():
        return os.memfd_create(secrets.token_hex(4), os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING), "shared memory"
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    remove_stale(folder)  # arena files of older versions, which named them
    path = os.path.join(folder, secrets.token_hex(8))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.unlink(path)
    return fd, folder


def _allocate(fd: int, size: int, where: str) -> None:
    """Give the file `size` bytes of memory now (ArenaSpaceError when there is none), sealed where it can be."""
    os.ftruncate(fd, size)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise ArenaSpaceError(e.errno, f"no space in {where} for the arena ({-(-size // 2**20)} MiB needed)"
                                  ) from None
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without fallocate: touched later
            raise
    if _sealable():
        import fcntl

        seals = 0
        for name in _SEALS:
            seals |= getattr(fcntl, name)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)


class Arena:
    """A file in shared memory that the judge and one host map: the tensors of one kernel run. The judge allocates
    (`put`, `empty`), resets it before each run, and grows it into a new file when a run needs more. `fd` is the
    open file a host is handed (`sent_to`: the pid of the host that has the current one)."""

    #: where the tensors lie ("cpu": shared memory) and the alignment of each one's start
    kind = "cpu"
    align = _ALIGN

    def __init__(self, size: int = 1 << 20):
        self.size, self.used, self.start = 0, 0, 0
        self.fd = -1
        self.sent_to: int | None = None
        self.buf: mmap.mmap | None = None
        self._grow(size)

    def _grow(self, size: int) -> None:
        self.close()
        self.start = self.align * secrets.randbelow(64)  # where the first tensor lies: nothing stable to recognise
        size += self.start
        self._allocate(size)
        self.used = self.start

    def _allocate(self, size: int) -> None:
        fd, where = _new_file()
        try:
            _allocate(fd, size, where)
            self.buf = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self.fd, self.size = fd, size

    def view(self, slot: Slot) -> torch.Tensor:
        return view(self.buf, slot)

    def reserve(self, nbytes: int) -> None:
        """Make room for `nbytes` from the start (a new, larger file when needed); forgets what was allocated."""
        self.used = self.start
        if self.start + nbytes > self.size:
            self._grow(max(nbytes, 2 * self.size))

    def empty(self, dtype: torch.dtype, shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[torch.Tensor, Slot]:
        nbytes = _span(shape, stride) * dtype.itemsize
        offset = -(-self.used // self.align) * self.align + self.align * secrets.randbelow(_GAPS)
        if offset + nbytes > self.size:
            raise MemoryError(f"arena of {self.size} bytes is full (reserve more before the run)")
        self.used = offset + nbytes
        slot = Slot(offset, str(dtype).removeprefix("torch."), tuple(shape), tuple(stride), nbytes)
        return self.view(slot), slot

    def put(self, t: torch.Tensor) -> tuple[torch.Tensor, Slot]:
        """A copy of `t` in the arena with its strides, when they are dense or spread without overlap (a padded, a
        column-strided view: the gaps copied too, as its own buffer holds them), else contiguous."""
        spread = not _dense(t) and _spread(t)
        stride = tuple(t.stride()) if _dense(t) or spread else contiguous_strides(tuple(t.shape))
        shared, slot = self.empty(t.dtype, tuple(t.shape), stride)
        if spread:
            n = _span(tuple(t.shape), stride)
            shared.as_strided((n,), (1,), 0).copy_(t.detach().as_strided((n,), (1,), t.storage_offset()))
        else:
            shared.copy_(t.detach())
        return shared, slot

    def close(self) -> None:
        if self.buf is not None:
            with contextlib.suppress(BufferError):  # a tensor still viewing it: the mapping goes with the process
                self.buf.close()
            self.buf = None
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd, self.sent_to = -1, None


def _dense(t: torch.Tensor) -> bool:
    """Whether `t`'s elements fill its span exactly once (a permutation of a contiguous layout)."""
    if t.numel() == 0:
        return True
    dims = sorted((s, n) for s, n in zip(t.stride(), t.shape) if n > 1)
    step = 1
    for s, n in dims:
        if s != step:
            return False
        step *= n
    return True


def _spread(t: torch.Tensor) -> bool:
    """Whether `t`'s elements lie apart in its span, no two on one address (positive strides, each dim's stride
    past the extent of the dims below it)."""
    if t.numel() == 0:
        return False
    reach = 1
    for s, n in sorted((s, n) for s, n in zip(t.stride(), t.shape) if n > 1):
        if s < reach:
            return False
        reach = s * n
    return True


def arena_bytes(tensors: list[torch.Tensor | tuple[torch.dtype, tuple[int, ...], tuple[int, ...]]],
                align: int = _ALIGN) -> int:
    """Bytes an arena needs for these tensors (or (dtype, shape, stride) triples), alignment included."""
    total = 0
    for t in tensors:
        dtype, shape, stride = (t.dtype, tuple(t.shape), tuple(t.stride())) if isinstance(t, torch.Tensor) else t
        total += -(-_span(shape, stride) * dtype.itemsize // align) * align + align * _GAPS
    return total


def device_view(mem: Any, slot: Slot) -> torch.Tensor:
    """The tensor `slot` describes in shared GPU memory `mem` (`device_share.SharedDeviceMemory`), a tensor of its
    own storage as torch would allocate it."""
    dt = _dtype(slot.dtype)
    raw = mem.tensor(slot.offset, slot.nbytes)[:slot.nbytes]
    return raw.view(dt).as_strided(slot.shape, slot.stride, 0)


class DeviceArena(Arena):
    """An arena in GPU memory (`device_share`): a case judged on the GPU hands its host the tensors where they
    already are. `fd` is the exported allocation a host is handed, as an `Arena`'s file."""

    kind = "cuda"
    #: torch's CUDA caching allocator aligns every block to 512 bytes; a kernel may rely on that much
    align = 512

    def __init__(self, size: int, device: str):
        self.device, self.mem = device, None
        super().__init__(size)

    def _allocate(self, size: int) -> None:
        from harness.engine.device_share import SharedDeviceMemory

        self.mem = SharedDeviceMemory.create(size, self.device)
        self.fd, self.size = int(self.mem.fd), self.mem.size  # type: ignore[arg-type]

    def view(self, slot: Slot) -> torch.Tensor:
        return device_view(self.mem, slot)

    def reserve(self, nbytes: int) -> None:
        """As `Arena.reserve`, but a new allocation grows by a quarter, not twice (these are gigabytes of a GPU)."""
        self.used = self.start
        if self.start + nbytes > self.size:
            self._grow(max(nbytes, self.size + self.size // 4))

    def close(self) -> None:
        if self.mem is not None:  # closes the exported descriptor too
            self.mem.close()
            self.mem = None
        self.fd, self.sent_to = -1, None
