"""Adapter of the Triton sorted-token alignment (`kernels.align.moe_align_block_size`), op `align`."""

from __future__ import annotations

import torch

from harness.core.case import Case
from harness.registry import Adapter, Unsupported, register
from kernels import align as kernel

BLOCK_SIZES = ("16", "32", "64", "128")
EXPERT_MAPS = ("none", "keep_invalid_blocks", "exclude")
IDS_DTYPES = ("int32", "int64")


def _run(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
    f = case.features
    for axis, values in (("block_size", BLOCK_SIZES), ("expert_map", EXPERT_MAPS), ("ids_dtype", IDS_DTYPES)):
        if f[axis] not in values:
            raise Unsupported(f"triton-align does not support {axis}={f[axis]}")
    em = f["expert_map"]
    kernel.moe_align_block_size(
        inputs["topk_ids"], int(f["block_size"]), case.shape("E"), expert_map=inputs.get("expert_map"),
        ep_convention=em if em != "none" else "keep_invalid_blocks",
        sorted_token_ids=outputs["sorted_token_ids"], expert_ids=outputs["expert_ids"],
        num_tokens_post_padded=outputs["num_tokens_post_padded"])


register(Adapter(
    name="triton-align", op="align", source="kernels.align", run=_run,
    support={"block_size": BLOCK_SIZES, "expert_map": EXPERT_MAPS, "ids_dtype": IDS_DTYPES},
    # Entries of one expert come in ascending flattened index (a stable order, no atomics): the layout is the
    # oracle's, bitwise, on every run (the op has no convention to state).
    properties=frozenset({"deterministic"}),
    # more than 32 chunks of 1024 ids: the separate scan kernel; past 65536 ids: chunks of 4096 (with k = 1)
    limits={"cross_M": (32769, 65537)},
    interp_features=lambda f: {"load_store", "reduce_fp32"},
    description="histogram per chunk, scan of padded counts, stable in-chunk sort and scatter (2-3 launches)",
))
