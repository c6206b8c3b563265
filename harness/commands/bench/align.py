"""Benchmarks of op `align`: the Triton `moe_align_block_size` against the torch oracle.

DeepSeek-V3 routing: E = 256, k = 8; M = 4096 tokens (32768 ids: latency bound, read the microseconds) and
M = 524288 (4M ids: throughput), timed by CUDA-graph replays too (an eager call of these microsecond kernels is
mostly Python's launch of two or three of them: 60 to 160 us on an H200 where the GPU took 9 to 26). Other model
shapes given with --shape add their M*k with their E. Block sizes
16 and 64. bytes_moved = ids read once + sorted_token_ids, expert_ids and the count written once (the kernel's
own workspace is not counted). `verify` compares the kernel's layout with the oracle's bitwise (the kernel claims
the oracle's stable order, which also implies every invariant of the op's contract); the invariants themselves are
checked too where their Python loop over blocks is affordable (32768 ids). The oracle takes about 20 s per call at
4M ids (a CPU loop over experts), so there it is neither timed nor run for more than the first configuration.
Off the GPU: a smoke run at tiny sizes (the interpreter), not a timing.
"""

from __future__ import annotations

import torch

from harness.commands.bench import SHAPES, BenchCase
from kernels.align import moe_align_block_size, sorted_layout_capacity
from reference import permute as ref


def _verify(ids: torch.Tensor, bs: int, e: int, emap: torch.Tensor | None, conv: str) -> str | None:
    got = tuple(t.cpu() for t in moe_align_block_size(ids, bs, e, expert_map=emap, ep_convention=conv))
    cpu_ids, cpu_map = ids.cpu(), None if emap is None else emap.cpu()
    convention = ref.ExpertMapConvention(conv)
    if ids.numel() <= 65536:
        problems = ref.layout_invariant_violations(got, cpu_ids, bs, e, expert_map=cpu_map, ep_convention=convention)
        if problems:
            return "; ".join(problems[:3])
    want = ref.align_block_size(cpu_ids, bs, e, expert_map=cpu_map, ep_convention=convention)
    for name, a, b in zip(("sorted_token_ids", "expert_ids", "num_tokens_post_padded"), got,
                          (want.sorted_token_ids, want.expert_ids, want.num_tokens_post_padded)):
        if not torch.equal(a, b):
            return f"{name}: {int((a != b).sum())} entries differ from the oracle's layout"
    return None


def _ids(m: int, k: int, e: int, device: str) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(0)
    # top-k of random scores: distinct experts per token, roughly balanced load
    return torch.rand((m, e), generator=g, device=device).topk(k, dim=1).indices.to(torch.int32)


def cases(device: str, shapes: list[str]) -> list[BenchCase]:
    sizes = [("deepseek-v3", 4096, 8, 256), ("deepseek-v3 4M ids", 524288, 8, 256)]
    sizes += [(s, SHAPES[s]["M"], SHAPES[s]["k"], SHAPES[s]["E"]) for s in shapes if s in SHAPES and s != "deepseek-v3"]
    if not device.startswith("cuda"):
        sizes = [("smoke", 40, 8, 64)]
    found = []
    for label, m, k, e in sizes:
        ids = _ids(m, k, e, device)
        emap = torch.full((e,), -1, dtype=torch.int32, device=device)
        emap[: e // 8] = torch.arange(e // 8, dtype=torch.int32, device=device)  # rank 0 of 8-way EP
        big = ids.numel() > 65536  # the oracle is too slow there: not timed, and verifies the first config only
        for n, (bs, mapped) in enumerate(((64, False), (16, False), (64, True))):
            em = emap if mapped else None
            conv = "exclude" if mapped else "keep_invalid_blocks"
            cap = sorted_layout_capacity(ids.numel(), e, bs)
            nbytes = ids.numel() * ids.element_size() + 4 * (cap + -(-cap // bs) + 1)

            def kernel(ids=ids, bs=bs, e=e, em=em, conv=conv):  # type: ignore[no-untyped-def]
                return moe_align_block_size(ids, bs, e, expert_map=em, ep_convention=conv)

            def reference(ids=ids, bs=bs, e=e, em=em, conv=conv):  # type: ignore[no-untyped-def]
                return ref.align_block_size(ids, bs, e, expert_map=em, ep_convention=ref.ExpertMapConvention(conv))

            found.append(BenchCase(
                name=f"{label} M={m} k={k} E={e} ids={m * k} bs={bs}" + (" EP 1/8 exclude" if mapped else ""),
                adapter="triton-align", kernel=kernel, reference=None if big else reference, bytes_moved=nbytes,
                graph=True,
                verify=None if big and n else (
                    lambda ids=ids, bs=bs, e=e, em=em, conv=conv: _verify(ids, bs, e, em, conv))))
    return found
