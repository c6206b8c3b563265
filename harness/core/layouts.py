"""Memory layouts of the tensors an op contract says may have any strides (`Tensor.any_strides` in
`harness.ops.contracts`): the layout classes a case draws for each such tensor (`Case.layout[name]`), their strides,
and the copy of a tensor in one of them.

Each class is a view over a buffer of its own; the elements of the buffer outside the view (the gaps) hold
`GAP_FILL` (NaN for floats), so a kernel that reads past the view's strides reads values no correct result holds.
The classes act on the last two dims (rows and columns; a 1-D tensor is one row), leading dims stacked over them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch on first use: a case names its layouts without it
    import torch

#: layout class -> what it is
LAYOUTS: dict[str, str] = {
    "contiguous": "row-major, dense",
    "row_padded": "a row stride 8 elements above the row's length",
    "transposed": "column-major storage, the transposed view of a dense tensor: column stride = rows, row stride 1",
    "column_step": "every other column of a buffer twice as wide: column stride 2",
}

#: padding of a `row_padded` row, in elements
ROW_PAD = 8

#: what the gaps of a strided buffer hold, by dtype kind (floats: NaN; integers: a value far out of any id range)
GAP_FILL = {"float": float("nan"), "int": -0x5A5A5A5B}


def check(where: str, layout: Any) -> str:
    """`layout` if it names a class (ValueError naming `where` and the classes otherwise)."""
    if layout not in LAYOUTS:
        raise ValueError(f"{where} must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    return layout


def contiguous_strides(dims: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a contiguous tensor of shape `dims` (a size-0 dim counted as 1, as torch does)."""
    strides, step = [], 1
    for n in reversed(dims):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def strides(shape: tuple[int, ...], layout: str) -> tuple[int, ...]:
    """The strides of a tensor of `shape` in layout class `layout`."""
    check("a layout", layout)
    shape = tuple(int(n) for n in shape)
    if layout == "contiguous" or not shape:
        return contiguous_strides(shape)
    rows, cols = (shape[-2], shape[-1]) if len(shape) >= 2 else (1, shape[-1])
    r, c = max(rows, 1), max(cols, 1)
    if layout == "row_padded":
        inner, block = (c + ROW_PAD, 1), r * (c + ROW_PAD)
    elif layout == "column_step":
        inner, block = (2 * c, 2), r * 2 * c
    else:  # transposed
        inner, block = (1, r), r * c
    lead = tuple(s * block for s in contiguous_strides(shape[:-2]))
    return (*lead, *inner) if len(shape) >= 2 else (inner[1],)


def span(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Elements from a view's first to its last element (0 for an empty one)."""
    return 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, stride))


def laid_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A copy of `t` (same values) in layout class `layout`, over a buffer whose gaps hold `GAP_FILL`."""
    import torch

    if layout == "contiguous":
        return t.contiguous()
    stride = strides(tuple(t.shape), layout)
    fill = GAP_FILL["float"] if t.dtype.is_floating_point else GAP_FILL["int"]
    if not t.dtype.is_floating_point and t.dtype != torch.bool:
        fill = max(min(fill, torch.iinfo(t.dtype).max), torch.iinfo(t.dtype).min)
    buf = torch.full((span(tuple(t.shape), stride),), fill, dtype=t.dtype, device=t.device)
    out = buf.as_strided(tuple(t.shape), stride)
    out.copy_(t)
    return out


def of(case_layout: Mapping[str, Any], name: str) -> str:
    """The layout class a case's `layout` field gives tensor `name` (`contiguous` where it names none)."""
    return check(f"the layout of {name!r}", case_layout.get(name, "contiguous"))


def output_stride(case_layout: Mapping[str, Any], name: str, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The strides of output `name` of `shape` in the case's layout for it (None: contiguous, the default)."""
    layout = of(case_layout, name)
    return None if layout == "contiguous" else strides(shape, layout)


#: keys of a case's `layout` field that are flags, not tensor names (`non_contiguous`: pad the rows of every input
#: built with `inputs.randn`, as case files written before per-tensor layouts say)
FLAGS = ("non_contiguous",)


def validate(case_layout: Mapping[str, Any], where: str) -> None:
    """Every tensor entry of a case's `layout` field names a layout class (ValueError naming it otherwise)."""
    for name, value in case_layout.items():
        if name not in FLAGS:
            check(f"{where}[{name!r}]", value)
