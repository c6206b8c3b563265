"""Helpers shared by the op specs: size limits per scale, and small judging utilities."""

from __future__ import annotations

from typing import Any

import torch

from harness.core.compare import Comparison
from harness.core.sizes import limit, scale
from harness.registry import Adapter

#: Default size limits per scale (an adapter's `limits` override them).
DEFAULT_LIMITS: dict[str, dict[str, int]] = {
    "small": {"max_M": 40, "max_E": 64, "max_K": 160, "max_N": 96, "max_k": 8, "block_M": 16},
    "large": {"max_M": 600, "max_E": 300, "max_K": 2304, "max_N": 1024, "max_k": 10, "block_M": 64},
}


def lim(adapter: Adapter, name: str) -> Any:
    return limit(adapter, name, DEFAULT_LIMITS[scale()][name])


def yes(value: str) -> bool:
    return value == "Y"


def custom(name: str, passed: bool, reason: str = "", **metrics: Any) -> Comparison:
    return Comparison(name, "custom", passed, reason, metrics)


def rows_where(mask: torch.Tensor) -> list[int]:
    return mask.nonzero().flatten()[:5].tolist()


def row_subset(dim: str, tensor: str = "x") -> Any:
    """A token_subset for ops whose only input is `tensor` with one row per token along shape `dim`."""

    def subset(case: Any, inputs: Any, rows: slice) -> tuple[Any, dict[str, torch.Tensor]]:
        x = inputs[tensor][rows]
        return case.replace(shapes={**case.shapes, dim: x.shape[0]}), {tensor: x}

    return subset


def ends_routed(ids: torch.Tensor, emap: torch.Tensor) -> bool:
    """Whether the global ids `ids` reach the first and the last local expert of `emap` and miss some local one."""
    local = emap.detach().cpu().long()[ids.detach().cpu().long().reshape(-1)]
    n = int(emap.max()) + 1
    hit = set(local[local >= 0].unique().tolist())
    return n > 0 and {0, n - 1} <= hit and len(hit) < n


def near_multiple_counts(counts: torch.Tensor, block: int) -> bool:
    """Whether some count is an exact multiple of `block` and others lie one below and one above a multiple."""
    c = counts.detach().cpu().long()
    c = c[c > 0] % block
    return bool((c == 0).any() and (c == block - 1).any() and (c == 1 % block).any())
