"""Argument validation shared by the reference ops.

Every public reference function validates its inputs with these helpers so that bad input fails with a
`ValueError` naming the offending argument, instead of an obscure shape error deep inside torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INT_INDEX_DTYPES = (torch.int32, torch.int64)


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor(
    name: str,
    t: object,
    *,
    ndim: int | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    shape: Sequence[int | None] | None = None,
) -> torch.Tensor:
    """Validate a tensor argument; `shape` entries of None match any size. Returns the tensor."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        raise ValueError(f"{name} must have dtype in ({_dtype_names(dtypes)}), got {t.dtype}")
    if shape is not None:
        if t.dim() != len(shape) or any(s is not None and s != a for s, a in zip(shape, t.shape)):
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise ValueError(f"{name} must have shape {want}, got {list(t.shape)}")
    return t


def check_int(name: str, v: object, *, min_value: int | None = None, max_value: int | None = None) -> int:
    """Validate an integer argument (bools are rejected) within optional bounds."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{name} must be an int, got {type(v).__name__}")
    if min_value is not None and v < min_value:
        raise ValueError(f"{name} must be >= {min_value}, got {v}")
    if max_value is not None and v > max_value:
        raise ValueError(f"{name} must be <= {max_value}, got {v}")
    return v


def check_choice(name: str, v: object, choices: Iterable[object]) -> object:
    """Validate that `v` is one of `choices` (enum members or plain values)."""
    choices = list(choices)
    if v not in choices:
        shown = ", ".join(repr(getattr(c, "value", c)) for c in choices)
        raise ValueError(f"{name} must be one of {shown}, got {v!r}")
    return v
