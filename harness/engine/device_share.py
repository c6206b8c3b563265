"""GPU memory that a judge and its kernel host both map: the buffer of a device arena (`arena.DeviceArena`).

A case judged on the GPU (`runner._Judging.inputs`: one past `CPU_JUDGED_ELEMENTS`, the large-offsets class's
gigabytes) would otherwise cross the process boundary through the CPU twice each way. Here the judge allocates
physical GPU memory with the CUDA driver's virtual memory API (`cuMemCreate`), exports it as a file descriptor, and
hands that to the host over its pipe, as it hands the shared-memory arena. The host imports and maps it; both then
view the same device bytes, and nothing is copied between them.

A file descriptor, not a legacy CUDA IPC handle: the host may run in a PID namespace of its own (`sandbox`), where
legacy handles, which name the exporting process, do not open. The physical memory is reference-counted by the
driver: when the judge releases its mapping, memory a host still maps stays that host's until it unmaps it or dies,
and the judge's later allocations never alias it. Only this buffer is shared, never memory of torch's allocator
(whose segments hold the judge's other tensors).

Tensors over the buffer are made through `__cuda_array_interface__`, so each slot is a tensor of its own storage,
like one torch allocated. Anything that fails here (no driver library, a device without the virtual memory API or
file-descriptor export) raises `DeviceShareError`; the judge then uses the shared-memory arena.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from typing import Any

import torch

# the driver API's enums (cuda.h)
_ALLOCATION_PINNED = 1
_HANDLE_POSIX_FD = 1
_LOCATION_DEVICE = 1
_ACCESS_READ_WRITE = 3
_GRANULARITY_MINIMUM = 0


class DeviceShareError(RuntimeError):
    """GPU memory could not be shared with a kernel host here (the judge falls back to the shared-memory arena)."""


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_LIB: Any = None


def _driver() -> Any:
    global _LIB
    if _LIB is None:
        try:
            _LIB = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise DeviceShareError(f"no CUDA driver library to share GPU memory with ({e})") from None
    return _LIB


def _call(name: str, *args: Any) -> None:
    lib = _driver()
    fn = getattr(lib, name, None)
    if fn is None:
        raise DeviceShareError(f"the CUDA driver has no {name}")
    rc = fn(*args)
    if rc != 0:
        text = ctypes.c_char_p()
        with contextlib.suppress(Exception):
            lib.cuGetErrorName(rc, ctypes.byref(text))
        raise DeviceShareError(f"{name} failed: {text.value.decode() if text.value else 'CUresult'} {rc}")


def _index(device: str | torch.device) -> int:
    d = torch.device(device)
    if d.type != "cuda":
        raise DeviceShareError(f"not a CUDA device: {device}")
    return d.index if d.index is not None else torch.cuda.current_device()


def _prop(index: int) -> _Prop:
    return _Prop(type=_ALLOCATION_PINNED, requestedHandleTypes=_HANDLE_POSIX_FD,
                 location=_Location(_LOCATION_DEVICE, index))


class _CudaArray:
    """What `torch.as_tensor` reads to view device memory it did not allocate (keeps nothing alive itself)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 2, "strides": None}


class SharedDeviceMemory:
    """One mapping of a shareable GPU allocation of `size` bytes: the judge's (`create`) or a host's (`open_fd`).
    `fd`: the exported file descriptor the judge hands to hosts (None in a host, which closes what it imported)."""

    def __init__(self, index: int, size: int, handle: int, ptr: int, fd: int | None):
        self.index, self.size, self.handle, self.ptr, self.fd = index, size, handle, ptr, fd

    @classmethod
    def create(cls, nbytes: int, device: str | torch.device) -> SharedDeviceMemory:
        """At least `nbytes` of new GPU memory on `device`, mapped here and exported as a file descriptor."""
        index = _index(device)
        torch.cuda.synchronize(index)  # the device's primary context is current on this thread
        prop = _prop(index)
        granularity = ctypes.c_size_t()
        _call("cuMemGetAllocationGranularity", ctypes.byref(granularity), ctypes.byref(prop), _GRANULARITY_MINIMUM)
        step = max(1, granularity.value)
        size = -(-max(nbytes, 1) // step) * step
        handle = ctypes.c_ulonglong()
        _call("cuMemCreate", ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(prop), ctypes.c_ulonglong(0))
        try:
            ptr = _map(handle.value, size, index)
        except BaseException:
            _driver().cuMemRelease(ctypes.c_ulonglong(handle.value))
            raise
        mem = cls(index, size, handle.value, ptr, None)
        fd = ctypes.c_int(-1)
        try:
            _call("cuMemExportToShareableHandle", ctypes.byref(fd), ctypes.c_ulonglong(handle.value),
                  _HANDLE_POSIX_FD, ctypes.c_ulonglong(0))
        except BaseException:
            mem.close()
            raise
        mem.fd = fd.value
        return mem

    @classmethod
    def open_fd(cls, fd: int, size: int, device: str | torch.device) -> SharedDeviceMemory:
        """Map, on `device`, the allocation of `size` bytes the judge exported as `fd` (a kernel host's side)."""
        index = _index(device)
        torch.cuda.synchronize(index)
        handle = ctypes.c_ulonglong()
        _call("cuMemImportFromShareableHandle", ctypes.byref(handle), ctypes.c_void_p(fd), _HANDLE_POSIX_FD)
        try:
            ptr = _map(handle.value, size, index)
        except BaseException:
            _driver().cuMemRelease(ctypes.c_ulonglong(handle.value))
            raise
        return cls(index, size, handle.value, ptr, None)

    def tensor(self, offset: int, nbytes: int) -> torch.Tensor:
        """The bytes [offset, offset + nbytes) as a uint8 tensor of its own storage (at least one byte)."""
        if self.ptr == 0:
            raise DeviceShareError("the shared GPU memory was released")
        if offset < 0 or offset + nbytes > self.size:
            raise DeviceShareError(f"bytes {offset}..{offset + nbytes} lie outside the {self.size} shared")
        return torch.as_tensor(_CudaArray(self.ptr + offset, max(nbytes, 1)), device=torch.device("cuda", self.index))

    def close(self) -> None:
        """Unmap and release this process's hold on the memory (tensors over it must be gone: they would dangle)."""
        if self.ptr:
            lib = _driver()
            lib.cuMemUnmap(ctypes.c_ulonglong(self.ptr), ctypes.c_size_t(self.size))
            lib.cuMemAddressFree(ctypes.c_ulonglong(self.ptr), ctypes.c_size_t(self.size))
            lib.cuMemRelease(ctypes.c_ulonglong(self.handle))
            self.ptr = 0
        if self.fd is not None and self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


def _map(handle: int, size: int, index: int) -> int:
    """Reserve an address range for allocation `handle`, map it there readable and writable on device `index`."""
    ptr = ctypes.c_ulonglong()
    _call("cuMemAddressReserve", ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0),
          ctypes.c_ulonglong(0), ctypes.c_ulonglong(0))
    lib = _driver()
    try:
        _call("cuMemMap", ctypes.c_ulonglong(ptr.value), ctypes.c_size_t(size), ctypes.c_size_t(0),
              ctypes.c_ulonglong(handle), ctypes.c_ulonglong(0))
        try:
            access = _AccessDesc(_Location(_LOCATION_DEVICE, index), _ACCESS_READ_WRITE)
            _call("cuMemSetAccess", ctypes.c_ulonglong(ptr.value), ctypes.c_size_t(size), ctypes.byref(access),
                  ctypes.c_size_t(1))
        except BaseException:
            lib.cuMemUnmap(ctypes.c_ulonglong(ptr.value), ctypes.c_size_t(size))
            raise
    except BaseException:
        lib.cuMemAddressFree(ctypes.c_ulonglong(ptr.value), ctypes.c_size_t(size))
        raise
    return ptr.value
