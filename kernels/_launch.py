"""Small launcher helpers shared by the kernel modules (argument checks, interpreter detection)."""

from __future__ import annotations

import os

import torch


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (tile sizes are chosen differently there)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def output_or_new(name: str, given: object, shape: tuple[int, ...], dtype: torch.dtype,
                  device: torch.device) -> torch.Tensor:
    """`given` checked as a destination [shape] of `dtype` on `device` with a unit last stride, or a new tensor."""
    if given is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if not isinstance(given, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(given).__name__}")
    if tuple(given.shape) != tuple(shape) or given.dtype != dtype or given.device != device:
        dims = ", ".join(str(d) for d in shape)
        raise ValueError(f"{name} must be [{dims}] {str(dtype).removeprefix('torch.')} on {device}, got "
                         f"{list(given.shape)} {given.dtype} on {given.device}")
    if shape[-1] > 1 and given.stride(-1) != 1:
        raise ValueError(f"{name} must have unit stride along its last dimension, got strides {given.stride()}")
    return given
