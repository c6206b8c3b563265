"""Tests of kernels.align beyond the generic adapter test.

The generic test draws small routings (M*k up to ~1300 ids, E <= 64 in CI) and judges the layout by its
invariants. Here: the kernel's own, stronger claim (entries in ascending flattened index within an expert, so the
layout equals the oracle's bitwise), at a medium size (20k ids, E = 512) spread over many programs; both scan
paths (fused into the scatter kernel, or the separate scan kernel) with small chunks so that one expert spans
several chunks; every expert-map convention; the launcher's errors naming the bad argument; and, on a GPU only,
DeepSeek-V3 sizes (numel 32768 and 4M), far too slow for the interpreter.
"""

from __future__ import annotations

import pytest
import torch

from kernels import align as kalign
from reference import permute as ref


def _routing(m: int, k: int, e: int, pattern: str, seed: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if pattern == "one_expert":
        ids = torch.randperm(e, generator=g)[:k].expand(m, k)
    elif pattern == "skewed":  # a few experts take most entries: one expert spans many chunks
        w = 1.0 / torch.arange(1, e + 1, dtype=torch.float64) ** 1.5
        ids = torch.multinomial(w.expand(m, e), k, replacement=False, generator=g)
    else:
        ids = torch.rand((m, e), generator=g).argsort(dim=1)[:, :k]
    return ids.to(dtype).contiguous()


def _emap(e: int, n_local: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    local = torch.randperm(e, generator=g)[:n_local].sort().values
    m = torch.full((e,), -1, dtype=torch.int32)
    m[local] = torch.arange(n_local, dtype=torch.int32)
    return m


def _check(ids: torch.Tensor, bs: int, e: int, dev: str, *, emap: torch.Tensor | None = None,
           conv: str = "keep_invalid_blocks", invariants: bool = True, **launch) -> None:  # type: ignore[no-untyped-def]
    cap = kalign.sorted_layout_capacity(ids.numel(), e, bs)
    # outputs filled with poison: an element the kernel never writes cannot pass for a valid one
    outs = {name: torch.full((n,), 0x5A5A5A5A, dtype=torch.int32, device=dev) for name, n in (
        ("sorted_token_ids", cap), ("expert_ids", -(-cap // bs)), ("num_tokens_post_padded", 1))}
    got = kalign.moe_align_block_size(ids.to(dev), bs, e, expert_map=None if emap is None else emap.to(dev),
                                      ep_convention=conv, **outs, **launch)
    got = tuple(t.cpu() for t in got)
    convention = ref.ExpertMapConvention(conv)
    if invariants:  # (a Python loop over blocks: too slow at millions of ids, where equality below implies them)
        problems = ref.layout_invariant_violations(got, ids, bs, e, expert_map=emap, ep_convention=convention)
        assert not problems, problems[:5]
    want = ref.align_block_size(ids, bs, e, expert_map=emap, ep_convention=convention)
    for name, a, b in zip(("sorted_token_ids", "expert_ids", "num_tokens_post_padded"), got,
                          (want.sorted_token_ids, want.expert_ids, want.num_tokens_post_padded)):
        bad = torch.nonzero(a != b).reshape(-1)
        assert bad.numel() == 0, f"{name}: {bad.numel()} entries differ from the stable layout, first at {bad[:5]}"


def test_medium_size_e512(device_info) -> None:  # type: ignore[no-untyped-def]
    """20000 ids over 512 experts (20 programs with the default chunk), int64 ids."""
    ids = _routing(2500, 8, 512, "random", seed=0, dtype=torch.int64)
    _check(ids, 16, 512, device_info.device)


@pytest.mark.parametrize("conv", ["keep_invalid_blocks", "exclude"])
def test_medium_size_expert_map(conv, device_info) -> None:  # type: ignore[no-untyped-def]
    ids = _routing(1000, 8, 512, "skewed", seed=1)
    _check(ids, 64, 512, device_info.device, emap=_emap(512, 170, seed=2), conv=conv)


@pytest.mark.parametrize("fuse_scan, chunk", [(True, 64), (False, 16), (True, 256), (False, 128)])
@pytest.mark.parametrize("pattern", ["skewed", "one_expert"])
def test_many_chunks_both_scan_paths(fuse_scan, chunk, pattern, device_info) -> None:  # type: ignore[no-untyped-def]
    """Small chunks: an expert's entries spread over many programs. 1080 ids / 16 = 68 chunks, more than the
    scan kernel's tile of 64 chunks, so its carry between tiles counts too. Chunks of 16 and 64 rank their entries
    by counting, of 128 and 256 by the sorting network."""
    ids = _routing(180, 6, 37, pattern, seed=3)
    _check(ids, 32, 37, device_info.device, chunk=chunk, fuse_scan=fuse_scan)
    _check(ids, 128, 37, device_info.device, emap=_emap(37, 12, seed=4), conv="exclude", chunk=chunk,
           fuse_scan=fuse_scan)


@pytest.mark.parametrize("bs", [1, 3, 16, 100, 128])
def test_block_sizes_and_tiny_shapes(bs, device_info) -> None:  # type: ignore[no-untyped-def]
    for m, k, e in ((0, 2, 8), (1, 1, 1), (7, 3, 5), (64, 4, 1)):
        ids = _routing(m, k, e, "random", seed=m + bs) if m else torch.empty((0, k), dtype=torch.int32)
        _check(ids, bs, e, device_info.device)


def test_all_entries_excluded(device_info) -> None:  # type: ignore[no-untyped-def]
    """No local expert: nothing is kept, everything is the sentinel / -1, num_tokens_post_padded = 0."""
    ids = _routing(40, 4, 16, "random", seed=5)
    _check(ids, 16, 16, device_info.device, emap=torch.full((16,), -1, dtype=torch.int32), conv="exclude")


def test_noncontiguous_ids_use_logical_order(device_info) -> None:  # type: ignore[no-untyped-def]
    ids = _routing(30, 8, 32, "random", seed=6).t().contiguous().t()  # same values, column-major storage
    assert not ids.is_contiguous()
    _check(ids, 16, 32, device_info.device)


@pytest.mark.parametrize("kwargs, word", [
    ({"topk_ids": torch.zeros(4, 2)}, "topk_ids"),
    ({"topk_ids": torch.zeros(8, dtype=torch.int32)}, "topk_ids"),
    ({"block_size": 0}, "block_size"),
    ({"block_size": 2048}, "block_size"),
    ({"num_experts": 0}, "num_experts"),
    ({"num_experts": 4096}, "num_experts"),
    ({"ep_convention": "drop"}, "ep_convention"),
    ({"expert_map": torch.zeros(7, dtype=torch.int32)}, "expert_map"),
    ({"expert_map": torch.zeros(8)}, "expert_map"),
    ({"sorted_token_ids": torch.empty(3, dtype=torch.int32)}, "sorted_token_ids"),
    ({"expert_ids": torch.empty(8, dtype=torch.int64)}, "expert_ids"),
    ({"num_tokens_post_padded": torch.empty(2, dtype=torch.int32)}, "num_tokens_post_padded"),
    ({"chunk": 100}, "chunk"),
])
def test_launcher_errors_name_the_argument(kwargs, word) -> None:  # type: ignore[no-untyped-def]
    args = {"topk_ids": torch.zeros(4, 2, dtype=torch.int32), "block_size": 16, "num_experts": 8, **kwargs}
    with pytest.raises(ValueError, match=word):
        kalign.moe_align_block_size(args.pop("topk_ids"), args.pop("block_size"), args.pop("num_experts"), **args)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="DeepSeek-V3 sizes need a GPU (interpreter too slow)")
@pytest.mark.parametrize("m", [4096, 524288])  # numel 32768 (fused scan) and 4M (scan kernel)
def test_deepseek_sizes_gpu(m) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(7)
    ids = (torch.rand((m, 8), generator=g) ** 2 * 256).to(torch.int32)  # skewed; repeats within a row are fine
    _check(ids, 64, 256, "cuda", invariants=m <= 4096)
    _check(ids, 16, 256, "cuda", emap=_emap(256, 32, seed=8), conv="exclude", invariants=False)
