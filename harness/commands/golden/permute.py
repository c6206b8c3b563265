"""Golden cases of the permute layouts (reference.permute): routings, layouts, permuted and unpermuted rows."""

from __future__ import annotations

import torch

from harness.commands.golden import golden
from reference.permute import (
    ExpertMapConvention,
    align_block_size,
    batched_layout,
    contiguous_layout,
    permute_batched,
    permute_contiguous,
    permute_sorted,
    unpermute_batched,
    unpermute_contiguous,
    unpermute_sorted,
)

NUM_TOKENS, TOP_K, NUM_EXPERTS, HIDDEN = 7, 3, 6, 8


def _inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A routing with k distinct experts per token (expert 5 left unused) and bf16 activations."""
    g = torch.Generator().manual_seed(seed)
    topk_ids = torch.stack([torch.randperm(NUM_EXPERTS - 1, generator=g)[:TOP_K] for _ in range(NUM_TOKENS)])
    x = torch.randn(NUM_TOKENS, HIDDEN, generator=g).to(torch.bfloat16)
    return topk_ids.to(torch.int32), x


def _expert_map() -> torch.Tensor:
    """Experts 1, 2 and 4 local (local ids 0, 1, 2)."""
    return torch.tensor([-1, 0, 1, -1, 2, -1], dtype=torch.int32)


def _sorted(seed: int, expert_map: torch.Tensor | None, conv: ExpertMapConvention) -> dict[str, torch.Tensor]:
    topk_ids, x = _inputs(seed)
    layout = align_block_size(topk_ids, 4, NUM_EXPERTS, expert_map=expert_map, ep_convention=conv)
    rows = permute_sorted(x, layout)
    out = {
        "topk_ids": topk_ids,
        "x": x,
        "sorted_token_ids": layout.sorted_token_ids,
        "expert_ids": layout.expert_ids,
        "num_tokens_post_padded": layout.num_tokens_post_padded,
        "permuted": rows,
        "unpermuted": unpermute_sorted(rows, layout),
    }
    if expert_map is not None:
        out["expert_map"] = expert_map
    return out


@golden("permute_sorted")
def sorted_plain() -> dict[str, torch.Tensor]:
    return _sorted(0, None, ExpertMapConvention.KEEP_INVALID_BLOCKS)


@golden("permute_sorted_ep_keep")
def sorted_ep_keep() -> dict[str, torch.Tensor]:
    return _sorted(1, _expert_map(), ExpertMapConvention.KEEP_INVALID_BLOCKS)


@golden("permute_sorted_ep_exclude")
def sorted_ep_exclude() -> dict[str, torch.Tensor]:
    return _sorted(1, _expert_map(), ExpertMapConvention.EXCLUDE)


def _contiguous(seed: int, expert_map: torch.Tensor | None) -> dict[str, torch.Tensor]:
    topk_ids, x = _inputs(seed)
    layout = contiguous_layout(topk_ids, NUM_EXPERTS, alignment=4, expert_map=expert_map)
    rows = permute_contiguous(x, layout)
    out = {
        "topk_ids": topk_ids,
        "x": x,
        "m_indices": layout.m_indices,
        "row_of": layout.row_of,
        "permuted": rows,
        "unpermuted": unpermute_contiguous(rows, layout),
    }
    if expert_map is not None:
        out["expert_map"] = expert_map
    return out


@golden("permute_contiguous")
def contiguous_plain() -> dict[str, torch.Tensor]:
    return _contiguous(2, None)


@golden("permute_contiguous_ep")
def contiguous_ep() -> dict[str, torch.Tensor]:
    return _contiguous(3, _expert_map())


def _batched(seed: int, expert_map: torch.Tensor | None, max_tokens: int | None) -> dict[str, torch.Tensor]:
    topk_ids, x = _inputs(seed)
    layout = batched_layout(topk_ids, NUM_EXPERTS, max_tokens=max_tokens, expert_map=expert_map)
    batched = permute_batched(x, layout)
    out = {
        "topk_ids": topk_ids,
        "x": x,
        "expert_num_tokens": layout.expert_num_tokens,
        "expert_of": layout.expert_of,
        "row_of": layout.row_of,
        "permuted": batched,
        "unpermuted": unpermute_batched(batched, layout),
    }
    if expert_map is not None:
        out["expert_map"] = expert_map
    return out


@golden("permute_batched")
def batched_plain() -> dict[str, torch.Tensor]:
    return _batched(4, None, 8)


@golden("permute_batched_ep")
def batched_ep() -> dict[str, torch.Tensor]:
    return _batched(5, _expert_map(), None)
