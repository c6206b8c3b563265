"""Op spec `align`: the sorted-token layout of a tiled MoE GEMM (`moe_align_block_size`, docs/SEMANTICS.md §3).

The order of entries within an expert is free (CUDA kernels use atomics), so `sorted_token_ids` is judged by the
layout's invariants (reference.permute.layout_invariant_violations); `expert_ids` and `num_tokens_post_padded` are
fully determined by the counts and compared exactly.

Which part of each buffer is the kernel's to write (convention `tail`): the used part, the first
num_tokens_post_padded entries of sorted_token_ids and the first num_tokens_post_padded / block_size entries of
expert_ids, always; with `tail=written` (the default) the whole buffers, expert_ids past the used blocks being -1
(sorted_token_ids past the used part must be written, with any value); with `tail=unwritten` nothing past the used
part, which is then neither required written, nor compared, nor part of the determinism check. The used part is the
oracle's num_tokens_post_padded, never the kernel's. The used part's invariants and num_tokens_post_padded are
judged alike under both.

In `keep_invalid_blocks` cells the convention `invalid_blocks` says how the non-local entries are blocked:
`per_expert` (the default, vLLM) or `pooled_first` (SGLang: all of them in leading -1 blocks,
reference.permute.ExpertMapConvention.POOL_INVALID_FIRST).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from hypothesis import strategies as st

from harness.core import inputs as gen
from harness.core.case import Case
from harness.core.sizes import edge_sizes, span
from harness.ops.base import Axis, Check, OpSpec, OutputSpec, ValueClass
from harness.ops.common import (
    centred_counts,
    custom,
    draw_experts,
    draw_map,
    draw_top_k,
    ends_routed,
    experts_fitted,
    lim,
    map_fields,
    near_multiple_counts,
    rows_for_counts,
)
from harness.registry import Adapter
from reference import permute as ref

AXES = (
    Axis("block_size", "Block size", ("16", "32", "64", "128")),
    Axis("expert_map", "Expert map", ("none", "keep_invalid_blocks", "exclude")),
    Axis("ids_dtype", "Ids dtype", ("int32", "int64")),
)


def _conv(case: Case, conventions: Mapping[str, Any]) -> ref.ExpertMapConvention:
    em = case.features["expert_map"]
    if em == "exclude":
        return ref.ExpertMapConvention.EXCLUDE
    if em == "keep_invalid_blocks" and conventions.get("invalid_blocks", "per_expert") == "pooled_first":
        return ref.ExpertMapConvention.POOL_INVALID_FIRST
    return ref.ExpertMapConvention.KEEP_INVALID_BLOCKS  # without a map no entry is non-local: all agree


def make_inputs(case: Case, device: str) -> dict[str, torch.Tensor]:
    m, e, k = case.shape("M"), case.shape("E"), case.shape("k")
    counts = case.params.get("counts")
    ids = gen.topk_ids(case, m, e, k, device) if counts is None else gen.ids_for_counts(case, counts, m, k, device)
    ids = ids.to(case.dtype("topk_ids", "int32"))
    found = {"topk_ids": ids}
    if case.features["expert_map"] != "none":
        found["expert_map"] = gen.expert_map(case, e, device, routed=ids)
    return found


def outputs(case: Case, inputs: Mapping[str, torch.Tensor]) -> dict[str, OutputSpec]:
    m, e, k, bs = case.shape("M"), case.shape("E"), case.shape("k"), int(case.features["block_size"])
    cap = ref.sorted_layout_capacity(m * k, e, bs)
    return {"sorted_token_ids": OutputSpec((cap,), torch.int32),
            "expert_ids": OutputSpec((-(-cap // bs),), torch.int32),
            "num_tokens_post_padded": OutputSpec((1,), torch.int32)}


def expected(case: Case, inputs: Mapping[str, torch.Tensor], conventions: Mapping[str, Any]) -> list[Check]:
    ids = inputs["topk_ids"].detach().cpu()
    emap = inputs.get("expert_map")
    emap = None if emap is None else emap.detach().cpu()
    bs, e = int(case.features["block_size"]), case.shape("E")
    conv = _conv(case, conventions)
    want = ref.align_block_size(ids, bs, e, expert_map=emap, ep_convention=conv)

    def judge(sorted_ids: torch.Tensor, outs: Mapping[str, torch.Tensor]) -> Any:
        got = (sorted_ids.detach().cpu(), outs["expert_ids"].detach().cpu(),
               outs["num_tokens_post_padded"].detach().cpu())
        problems = ref.layout_invariant_violations(got, ids, bs, e, expert_map=emap, ep_convention=conv)
        if problems:
            return custom("sorted_token_ids", False, f"sorted_token_ids: {len(problems)} contract violation(s): "
                          + "; ".join(problems[:3]), violations=len(problems))
        return custom("sorted_token_ids", True)

    sorted_mask = eids_mask = None
    if conventions.get("tail", "written") == "unwritten":  # from the oracle's count: a kernel cannot shrink it
        used = int(want.num_tokens_post_padded[0])
        sorted_mask = torch.arange(want.sorted_token_ids.numel()) < used
        eids_mask = torch.arange(want.expert_ids.numel()) < used // bs
    return [Check("sorted_token_ids", "custom", judge=judge, mask=sorted_mask),
            Check("expert_ids", "exact", expected=want.expert_ids, mask=eids_mask),
            Check("num_tokens_post_padded", "exact", expected=want.num_tokens_post_padded)]


#: expert counts of production models, each with top-8 (Qwen3-MoE, DeepSeek-V3, Kimi K2): ids past 127 and 255
MODEL_EXPERTS = (128, 256, 384)


def draw(draw: st.DrawFn, adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    # the layout costs M * k, hardly E: production expert counts past the small scale's E budget where the limits
    # allow them
    models = [e for e in MODEL_EXPERTS if span(adapter, "E", usual=max(MODEL_EXPERTS)).allows(e)]
    if models and span(adapter, "k").allows(8) and draw(st.booleans()):
        e, k = draw(st.sampled_from(models)), 8
    else:
        e = draw_experts(draw, adapter)
        k = draw_top_k(draw, adapter, e)
    m = draw(edge_sizes(span(adapter, "M"), int(cell["block_size"])))  # 0: a boundary case
    params: dict[str, Any] = {}
    if draw(st.booleans()):  # a few experts' counts at and around multiples of the block, the rest filler
        bs, cap = int(cell["block_size"]), adapter.limits.get("max_M")
        near = [v for v in gen.near_multiples((bs,)) if cap is None or v <= cap]  # a count needs as many rows
        m, counts = rows_for_counts(adapter, "M", [draw(st.sampled_from(near)) for _ in range(min(e, 4))], k)
        e = experts_fitted(adapter, max(e, len(counts)))
        params["counts"] = counts + [0] * (e - len(counts))
    if cell["expert_map"] != "none":
        params.update(draw_map(draw, adapter, e))
    routing = draw(st.sampled_from(["random", "skewed", "one_expert", "some_empty"]))
    return {"shapes": {"M": m, "E": e, "k": k}, "dtypes": {"topk_ids": cell["ids_dtype"]}, "routing": routing,
            "params": params}


def boundary(adapter: Adapter, cell: Mapping[str, str]) -> list[dict[str, Any]]:
    bs = int(cell["block_size"])
    found = []
    for m, e, k, rout in ((0, 8, 2, "random"), (1, 8, 1, "random"), (bs - 1, 16, 4, "some_empty"),
                          (bs + 1, 257, 8, "skewed"), (3 * bs, 33, 33, "random"), (50, 64, 6, "one_expert")):
        if e > lim(adapter, "max_E"):
            continue
        # M = 1: none local
        params = map_fields(adapter, e, e // 3 if m != 1 else 0) if cell["expert_map"] != "none" else {}
        found.append({"shapes": {"M": m, "E": e, "k": k}, "dtypes": {"topk_ids": cell["ids_dtype"]},
                      "routing": rout, "params": params})
    return found


def _counts_fields(adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    """Experts with counts b - 1, b, b + 1, 2b and 0 for the cell's block b; under an expert map a contiguous range
    of four local experts among eight: local 0 at b, local 1 empty, local 3 (the last) at 2b."""
    bs = int(cell["block_size"])
    mapped = cell["expert_map"] != "none"
    counts = [bs + 1, 1, bs, 0, bs - 1, 2 * bs, 3, bs] if mapped else [bs, 0, bs - 1, bs + 1, 2 * bs]
    m, counts = rows_for_counts(adapter, "M", counts, 2)
    e, counts = centred_counts(adapter, counts, 4, 8) if mapped else (experts_fitted(adapter, len(counts)), counts)
    params = map_fields(adapter, e, 4, "contiguous") if mapped else {}
    return {"shapes": {"M": m, "E": e, "k": 2}, "dtypes": {"topk_ids": cell["ids_dtype"]},
            "params": {**params, "counts": counts + [0] * (e - len(counts))}}


def _counts_present(case: Case, inputs: Mapping[str, torch.Tensor]) -> bool:
    return near_multiple_counts(torch.bincount(inputs["topk_ids"].cpu().long().reshape(-1)),
                                int(case.features["block_size"]))


def _many_fields(adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    """Kimi K2's 384 experts, top-8, over 40 tokens: ids past 127 and past 255 (half the experts local under a
    map)."""
    params = map_fields(adapter, 384, 192) if cell["expert_map"] != "none" else {}
    return {"shapes": {"M": 40, "E": 384, "k": 8}, "dtypes": {"topk_ids": cell["ids_dtype"]}, "routing": "random",
            "params": params}


def _many_present(case: Case, inputs: Mapping[str, torch.Tensor]) -> bool:
    """Ids in 128..255 and past 255 (an id narrowed to int8 or uint8 changes)."""
    ids = inputs["topk_ids"].detach().cpu().long()
    return bool(((ids >= 128) & (ids < 256)).any() and (ids >= 256).any())


BLOCK_COUNTS = ValueClass("block_counts", lambda a, c: True, ("block_size",), _counts_fields, _counts_present)
MANY_EXPERTS = ValueClass("many_experts", lambda a, c: True, ("ids_dtype",), _many_fields, _many_present,
                          sized=True)
MAP_ENDS = ValueClass("first_and_last_local_expert", lambda a, c: c["expert_map"] != "none", ("expert_map",),
                      _counts_fields, lambda case, inputs: ends_routed(inputs["topk_ids"], inputs["expert_map"]))


SPECS = {"align": OpSpec(name="align", title="Align (sorted-token layout)", axes=AXES, make_inputs=make_inputs,
                         outputs=outputs, expected=expected, draw=draw, boundary=boundary,
                         value_classes=(BLOCK_COUNTS, MAP_ENDS, MANY_EXPERTS))}
