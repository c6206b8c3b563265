"""Planted bugs that live at value boundaries rather than in a feature cell: all-zero rows and groups, per-expert
counts at exact multiples of a block, the first and last local expert, rows past a batched count, summation order,
non-finite rows of every scoring, and the code past each kernel's internal thresholds. Each bug was written from
the kernel's source alone; `tests/mutants/catalog.py` adds them to the suite.
"""

from __future__ import annotations

from tests.mutants.build import Mutant, Patch

P = Patch
_ROUTING = "kernels.routing"
_ACT = "kernels.activation"
_AQ = "kernels.act_quant"
_GQ = "kernels.group_quant"
_ALIGN = "kernels.align"
_RED = "kernels.reduce"
_FE = "kernels.fused_experts"
_BE = "kernels.batched_experts"

BOUNDARY_MUTANTS: tuple[Mutant, ...] = (
    # ------------------------------------------------------------------ all-zero rows and groups (padding rows)
    Mutant("aq-zero-group-nan-codes", "triton-act-quant", _AQ, (
        P("amax = tl.maximum(tl.max(tl.abs(v), axis=2), eps)", "amax = tl.max(tl.abs(v), axis=2)"),
        P("    y = tl.where(s[:, :, None] == 0.0, 0.0, y)", "    y = y  ")),
        "eps and zero-scale guard dropped: an all-zero group quantizes to 0 / 0 (NaN codes)"),
    # ------------------------------------------------------------------ counts at exact multiples of a block
    Mutant("align-extra-block-at-multiple", "triton-align", _ALIGN, (
        P("padded = (totals + block_size - 1) // block_size * block_size",
          "padded = tl.where(totals > 0, (totals // block_size + 1) * block_size, 0)"),),
        "padded count one block too many for an expert whose count is an exact multiple of the block"),
    Mutant("experts-batched-half-tile-one-row-over", "triton-batched-experts", _FE, (
        P("tail = count - row_start <= BLOCK_M // 2", "tail = count - row_start <= BLOCK_M // 2 + 1"),),
        "a last block holding half a block plus one row runs the half-height tile (its last row never computed)",
        via=(_BE,)),
    # ------------------------------------------------------------------ first and last local expert
    Mutant("align-exclude-drops-local-zero", "triton-align", _ALIGN, (
        P("valid = valid & (local >= 0)", "valid = valid & (local > 0)"),),
        "entries of local expert 0 excluded with the non-local ones", {"expert_map": ("exclude",)}),
    Mutant("reduce-map-drops-local-zero", "triton-reduce", _RED, (
        P("local = tl.load(emap_ptr + e) >= 0", "local = tl.load(emap_ptr + e) > 0"),),
        "slots of local expert 0 treated as non-local in the reduce", {"expert_map": ("Y",)}),
    Mutant("experts-reduce-drops-local-zero", "triton-experts", _FE, (
        P("use = ok & (lid >= 0)[:, None]", "use = ok & (lid > 0)[:, None]"),),
        "the final reduce skips slots of local expert 0", {"expert_map": ("Y",)}),
    Mutant("experts-batched-last-expert-skipped", "triton-batched-experts", _BE, (
        P("num_pid_m = e * triton.cdiv(t, c1.block_m)", "num_pid_m = (e - 1) * triton.cdiv(t, c1.block_m)"),),
        "the grid misses the last expert's blocks"),
    # ------------------------------------------------------------------ rows past a batched count
    Mutant("experts-batched-rows-past-count", "triton-batched-experts", _FE, (
        P("        row_ok = r < count\n", "        row_ok = r < rows_per_expert\n"),),
        "GEMMs compute and store every row up to max_tokens, past the expert's count", via=(_BE,)),
    Mutant("experts-batched-tensor-scale-over-padding", "triton-batched-experts", _BE, (
        P("rows = torch.where(valid.reshape(-1, 1), rows, torch.zeros((), dtype=x.dtype, device=x.device))",
          "rows = rows"),),
        "the per-tensor activation scale taken over the padding rows too", {"quant_format": ("T",)}),
    # ------------------------------------------------------------------ accumulation order
    Mutant("reduce-start-slot-per-launch", "triton-reduce", _RED, (
        P("K, factor,\n", "K, factor, rot,\n"),
        P("    for j in tl.static_range(TOPK):  # slot order is the accumulation order\n",
          "    for jj in tl.static_range(TOPK):\n        j = (jj + rot) % TOPK\n"),
        P("expert_out, w, ids, emap, out, hidden, factor,",
          "expert_out, w, ids, emap, out, hidden, factor, next(_LAUNCHES) % k,"),
        P("import torch\n", "import itertools\n\nimport torch\n\n_LAUNCHES = itertools.count()\n")),
        "the reduce starts at a different slot on each launch"),
    Mutant("experts-reduce-start-slot-per-launch", "triton-experts", _FE, (
        P("def _reduce_kernel(y_ptr, out_ptr, topk_ids_ptr, map_ptr, M, K, top_k, stride_om, stride_ok,",
          "def _reduce_kernel(y_ptr, out_ptr, topk_ids_ptr, map_ptr, M, K, top_k, rot, stride_om, stride_ok,"),
        P("    for j in range(0, top_k):  # slot order: deterministic\n",
          "    for jj in range(0, top_k):\n        j = (jj + rot) % top_k\n"),
        P("m, k_dim, top_k, *out.stride(),",
          "m, k_dim, top_k, next(_LAUNCHES) % top_k, *out.stride(),"),
        P("import torch\n", "import itertools\n\nimport torch\n\n_LAUNCHES = itertools.count()\n")),
        "the experts' final reduce starts at a different slot on each launch"),
    Mutant("reduce-three-slots-start-at-slot-1", "triton-reduce", _RED, (
        P("    for j in tl.static_range(TOPK):  # slot order is the accumulation order\n",
          "    for jj in tl.static_range(TOPK):\n        j = (jj + (1 if TOPK == 3 else 0)) % TOPK\n"),),
        "a reduce specialized for k = 3 (as vLLM's moe_sum is for 2, 3 and 4) that starts at slot 1: with k = 2 "
        "a + b = b + a, so k = 3 is where a rotation shows, under per-step rounding",
        {"accumulation": ("output_dtype_sequential",)}),
    Mutant("reduce-three-slots-start-slot-per-launch", "triton-reduce", _RED, (
        P("K, factor,\n", "K, factor, rot,\n"),
        P("    for j in tl.static_range(TOPK):  # slot order is the accumulation order\n",
          "    for jj in tl.static_range(TOPK):\n        j = (jj + rot) % TOPK\n"),
        P("expert_out, w, ids, emap, out, hidden, factor,",
          "expert_out, w, ids, emap, out, hidden, factor, next(_LAUNCHES) % k if k <= 3 else 0,"),
        P("import torch\n", "import itertools\n\nimport torch\n\n_LAUNCHES = itertools.count()\n")),
        "a reduce for k <= 3 that starts at a different slot on each launch (a rotation that shows from k = 3 on)"),
    Mutant("reduce-sequential-declared-fp32-done", "triton-reduce", "kernels.adapters.reduce", (
        P('accumulation=f["accumulation"],', 'accumulation="fp32",'),),
        "a declared output-dtype sequential accumulation computed as one fp32 sum",
        {"accumulation": ("output_dtype_sequential",)}),
    # ------------------------------------------------------------------ non-finite rows of every scoring
    Mutant("routing-llama4-nan-ranked-as-value", "triton-routing", _ROUTING, (
        P("sel = tl.where(x == x, x, NEG_INF)", "sel = x"),),
        "Llama-4 top-1 ranks a NaN logit as a value instead of -inf", {"scoring": ("llama4_top1",)}),
    Mutant("routing-sigmoid-nan-weight-kept", "triton-routing", _ROUTING, (
        P("        s = tl.where(s == s, s, 0.0)  # only a NaN logit gives a non-finite sigmoid\n", ""),),
        "a NaN logit's sigmoid weight kept NaN where the zero rule is declared"),
    Mutant("grouped-all-neginf-row-unmasked", "triton-grouped-routing", _ROUTING, (
        P("row_bad = (nbad > 0) | (mx == NEG_INF)", "row_bad = nbad > 0"),),
        "a softmax row of only -inf logits not mapped to zero scores (NaN weights)"),
    # ------------------------------------------------------------------ past each kernel's internal threshold
    Mutant("act-second-tile-dropped", "triton-activation", _ACT, (
        P("grid = (triton.cdiv(t, block_t), triton.cdiv(n, block_n))",
          "grid = (triton.cdiv(t, block_t), max(1, n // block_n))"),),
        "columns past the first 1024-column tile never computed"),
    Mutant("gq-wide-row-amax-first-chunk", "triton-group-quant", _GQ, (
        P("    acc = tl.zeros([BLOCK_K], tl.float32)\n    for k0 in range(0, K, BLOCK_K):\n",
          "    acc = tl.zeros([BLOCK_K], tl.float32)\n    for k0 in range(0, BLOCK_K, BLOCK_K):\n"),),
        "a per-token row wider than the register tile: amax over its first chunk only", {"unit": ("token",)}),
    Mutant("gq-wide-row-eps-dropped", "triton-group-quant", _GQ, (
        P("tl.max(acc, axis=0), eps, QMAX", "tl.max(acc, axis=0), 0.0, QMAX"),),
        "a per-token row wider than the register tile: eps dropped (an all-zero row gets scale 0)",
        {"unit": ("token",)}),
    Mutant("align-scan-inclusive-prefix", "triton-align", _ALIGN, (
        P("incl - tile + carry[None, :]", "incl + carry[None, :]"),),
        "the scan over chunks (used past 32 chunks of ids) writes an inclusive prefix"),
)

#: written with the others, then found output-equivalent, so not in the suite: a zero row quantized with scale 0
#: gets 0 / 0 = NaN, which the clamp's min/max turn into -qmax (they drop a NaN, in the interpreter and in PTX alike),
#: and the GEMM multiplies those codes by the zero scale: the experts' output is exactly right
EQUIVALENT: tuple[Mutant, ...] = (
    Mutant("experts-input-quant-zero-row-nan", "triton-experts", _GQ, (
        P("s = tl.div_rn(tl.maximum(amax, eps), tl.full(amax.shape, QMAX, tl.float32))",
          "s = tl.div_rn(amax, tl.full(amax.shape, QMAX, tl.float32))"),
        P("safe = tl.where(s == 0.0, 1.0, s)", "safe = s"),
        P("    y = tl.where(s == 0.0, 0.0, y)\n", "")),
        "the experts' activation quantizer without eps or zero-scale guard: an all-zero token row gives NaN codes",
        {"quant_type": ("fp8_w8a8", "int8_w8a8")}, via=("kernels.quant_gemm",)),
)
