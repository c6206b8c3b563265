"""The planted bugs: each a small named variant of one of our kernels (or adapters), standing for a bug class seen
in production MoE kernels. `tests/mutants/test_mutants.py` requires the generic property search to catch each.

Not here: int32 offset overflow at large M. It needs more than 2**31 elements, which no CI case allocates: those
mutants are GPU-only (tests/mutants/catalog_large.py, caught by the `gpu` profile's large-offsets case).
"""

from __future__ import annotations

from tests.mutants.build import Mutant, Patch
from tests.mutants.catalog_boundaries import BOUNDARY_MUTANTS
from tests.mutants.catalog_values import VALUE_MUTANTS

P = Patch
_ROUTING = "kernels.routing"
_ACT = "kernels.activation"
_AQ = "kernels.act_quant"
_GQ = "kernels.group_quant"
_ALIGN = "kernels.align"
_RED = "kernels.reduce"
_FE = "kernels.fused_experts"
_GATED = ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul", "swigluoai", "swigluoai_uninterleave", "swiglustep")

MUTANTS: tuple[Mutant, ...] = (
    # ------------------------------------------------------------------------------------------ routing
    Mutant("routing-nan-rows-unmasked", "triton-routing", _ROUTING, (
        P("s = tl.where(row_bad[:, None, None], 0.0, tl.div_rn(ex, den[:, None, None]))",
          "s = tl.div_rn(ex, den[:, None, None])"),),
        "duplicate / out-of-range ids on NaN rows (non-finite scores not mapped to 0)",
        {"nonfinite_rows": ("Y",), "scoring": ("softmax",)}),
    Mutant("routing-ties-drop-all-tied", "triton-routing", _ROUTING, (
        P("avail = avail & ~chosen", "avail = avail & ~hit"),),
        "top-k ties broken inconsistently (every tied expert leaves the running when one is picked)",
        {"nonfinite_rows": ("N",), "scoring": ("softmax", "sigmoid"), "correction_bias": ("N",)}),
    Mutant("routing-renormalize-skipped", "triton-routing", _ROUTING, (
        P("    if RENORM:\n", "    if RENORM and False:\n"),),
        "renormalize skipped", {"renormalize": ("Y",), "scoring": ("softmax", "sigmoid")}),
    Mutant("routing-bias-in-weights", "triton-routing", _ROUTING, (
        P("w = tl.sum(tl.sum(tl.where(chosen, s, 0.0), axis=2), axis=1)",
          "w = tl.sum(tl.sum(tl.where(chosen, sel, 0.0), axis=2), axis=1)"),),
        "correction bias used in the weights (it must only select)",
        {"correction_bias": ("Y",), "scoring": ("softmax", "sigmoid")}),
    Mutant("grouped-score-by-max", "triton-grouped-routing", _ROUTING, (
        P("gscore = m1 + m2", "gscore = m1 + 0.0 * m1"),),
        "group score by max instead of the top-2 sum (bias path)", {"correction_bias": ("Y",)}),
    Mutant("grouped-scale-twice", "triton-grouped-routing", _ROUTING, (
        P("out_w = out_w * scale", "out_w = out_w * scale * scale"),),
        "routed scaling factor applied twice", {"scaling_placement": ("weights",)}),
    Mutant("routing-logits-rows-assumed-contiguous", "triton-routing", _ROUTING, (
        P("logits.stride(0), logits.stride(1), w.stride(0)", "e, 1, w.stride(0)"),),
        "router logits addressed as contiguous rows (their strides ignored)", {"nonfinite_rows": ("N",)}),
    # ------------------------------------------------------------------------------------------ activation
    Mutant("act-gate-up-swapped", "triton-activation", _ACT, (
        P("        gate = p0\n        up = p1\n", "        gate = p1\n        up = p0\n"),),
        "gate and up swapped", {"activation": _GATED}),
    Mutant("act-swigluoai-not-interleaved", "triton-activation", _ACT, (
        P('layout = "interleaved" if activation == "swigluoai" else "halves"', 'layout = "halves"'),),
        "swigluoai read as halves instead of interleaved", {"activation": ("swigluoai",)}),
    Mutant("act-swigluoai-missing-plus-one", "triton-activation", _ACT, (
        P("y = g * _sigmoid(alpha * g) * (u + beta)", "y = g * _sigmoid(alpha * g) * u"),),
        "swigluoai without the +1 on up", {"activation": ("swigluoai", "swigluoai_uninterleave")}),
    Mutant("act-swiglustep-clamp-before", "triton-activation", _ACT, (
        P("s = tl.minimum(gate * _sigmoid(gate), limit)",
          "s = tl.minimum(gate, limit) * _sigmoid(tl.minimum(gate, limit))"),),
        "clamp on the wrong side (swiglustep clamps after the activation)", {"activation": ("swiglustep",)}),
    Mutant("act-tile-edge-off-by-one", "triton-activation", _ACT, (
        P("mask = (rows[:, None] < T) & (cols[None, :] < N)", "mask = (rows[:, None] < T) & (cols[None, :] < N - 1)"),),
        "off-by-one mask at a tile edge (last column never stored)"),
    Mutant("act-silu-rounded-early", "triton-activation", _ACT, (
        P("y = gate * _sigmoid(gate) * up\n", "y = (gate * _sigmoid(gate)).to(tl.bfloat16).to(tl.float32) * up\n"),),
        "intermediate rounded to bf16 where one rounding is declared", {"activation": ("silu_and_mul",),
                                                                        "dtype": ("float32", "float16")}),
    # ------------------------------------------------------------------------------------------ act_quant
    Mutant("aq-ue8m0-round-nearest", "triton-act-quant", _AQ, (
        P("expo = ((sbits >> 23) & 0xFF) + ((sbits & 0x7FFFFF) != 0).to(tl.int32)",
          "expo = ((sbits >> 23) & 0xFF) + ((sbits & 0x400000) != 0).to(tl.int32)"),),
        "UE8M0 scale rounded to nearest instead of up", {"scale_rule": ("ue8m0",)}),
    Mutant("aq-amax-signed", "triton-act-quant", _AQ, (
        P("amax = tl.maximum(tl.max(tl.abs(v), axis=2), eps)", "amax = tl.maximum(tl.max(v, axis=2), eps)"),),
        "amax of signed values (abs forgotten)"),
    Mutant("aq-packed-bytes-reversed", "triton-act-quant", _AQ, (
        P("shift = (tl.arange(0, 4) * 8).to(tl.int64)", "shift = ((3 - tl.arange(0, 4)) * 8).to(tl.int64)"),),
        "packed scale bytes in the wrong order", {"scale_layout": ("packed_ue8m0",)}),
    Mutant("aq-packed-padding-uninit", "triton-act-quant", _AQ, (
        P("expo = tl.where((groups < G)[None, :], expo, 0)\n", "\n"),),
        "packed scale padding bytes left holding garbage", {"scale_layout": ("packed_ue8m0",)}),
    Mutant("aq-column-major-stride-ignored", "triton-act-quant", _AQ, (
        P("x.stride(0), codes.stride(0), scales.stride(0), scales.stride(1),",
          "x.stride(0), codes.stride(0), scales.shape[1], 1,"),),
        "column-major scale stride ignored (row-major assumed)",
        {"scale_layout": ("column_major", "column_major_tma")}),
    Mutant("aq-clamp-wrong-side", "triton-act-quant", _AQ, (
        P("gate, up = _load_gate_up(xrow, cols, mask, N, INTERLEAVED, UP_FIRST, HAS_CLAMP, clamp_limit)\n",
          "gate, up = _load_gate_up(xrow, cols, mask, N, INTERLEAVED, UP_FIRST, False, clamp_limit)\n"
          "    if HAS_CLAMP:\n"
          "        gate = tl.minimum(tl.maximum(gate, -clamp_limit), clamp_limit)\n"
          "        up = tl.minimum(up, clamp_limit)\n"),),
        "clamp on the wrong side (gate clamped on both sides, up only above)", {"clamp_limit": ("Y",)}),
    # ------------------------------------------------------------------------------------------ group_quant
    Mutant("gq-ue8m0-round-nearest", "triton-group-quant", _GQ, (
        P("e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)",
          "e = ((bits >> 23) & 0xFF) + ((bits & 0x400000) != 0).to(tl.int32)"),),
        "UE8M0 scale rounded to nearest instead of up", {"scale_rule": ("ue8m0",)}),
    Mutant("gq-multiply-reciprocal", "triton-group-quant", _GQ, (
        P("y = tl.div_rn(x, tl.broadcast_to(safe, x.shape))",
          "y = x * tl.div_rn(tl.full(safe.shape, 1.0, tl.float32), safe)"),),
        "scale applied as multiply-by-reciprocal where divide is declared", {"scale_rule": ("float",)}),
    Mutant("gq-int8-half-away", "triton-group-quant", _GQ, (
        P("y = (y + 12582912.0) - 12582912.0", "y = tl.where(y >= 0, tl.floor(y + 0.5), tl.ceil(y - 0.5))"),),
        "int8 rounding rule swapped (half away from zero where half-even is declared)",
        {"quant_dtype": ("int8",)}),
    Mutant("gq-eps-dropped", "triton-group-quant", _GQ, (
        P("s = tl.div_rn(tl.maximum(amax, eps), tl.full(amax.shape, QMAX, tl.float32))",
          "s = tl.div_rn(amax, tl.full(amax.shape, QMAX, tl.float32))"),),
        "eps dropped (all-zero units get a zero scale)"),
    Mutant("gq-column-major-stride-ignored", "triton-group-quant", _GQ, (
        P("stride_sm, stride_sg = (scales.stride(0), scales.stride(1))", "stride_sm, stride_sg = (g, 1)"),),
        "column-major scale stride ignored (row-major assumed)",
        {"scale_layout": ("column_major", "column_major_tma"), "unit": ("group",)}),
    Mutant("gq-packed-bytes-reversed", "triton-group-quant", _GQ, (
        P("shift = (tl.arange(0, 4) * 8)[None, None, :]", "shift = ((3 - tl.arange(0, 4)) * 8)[None, None, :]"),),
        "packed scale bytes in the wrong order", {"scale_layout": ("packed_ue8m0",)}),
    Mutant("gq-packed-padding-uninit", "triton-group-quant", _GQ, (
        P("e = tl.where(gmask[None, :], e, 0)\n", "\n"),),
        "packed scale padding bytes left holding garbage", {"scale_layout": ("packed_ue8m0",)}),
    Mutant("gq-tensor-amax-first-partial", "triton-group-quant", _GQ, (
        P("acc = tl.maximum(acc, tl.load(part_ptr + i, mask=i < n, other=0.0))",
          "acc = tl.maximum(acc, tl.load(part_ptr + i, mask=i < 1, other=0.0))"),),
        "per-tensor amax reduced over the first program's rows only", {"unit": ("tensor",)}),
    Mutant("gq-last-row-unmasked", "triton-group-quant", _GQ, (
        P("    rmask = rows < M\n", "    rmask = rows < M - 1\n"),),
        "off-by-one row mask (last row never stored)"),
    Mutant("gq-column-stride-assumed-one", "triton-group-quant", _GQ, (
        P("x, out, s_out, s_in, eps, m, k, g, group, x.stride(0), x.stride(1), out.stride(0),",
          "x, out, s_out, s_in, eps, m, k, g, group, x.stride(0), 1, out.stride(0),"),),
        "input columns addressed with unit stride (a column-strided view read wrong)", {"unit": ("group",)}),
    # approximate division declared (division="approximate"): the declaration must not let real bugs through
    Mutant("gq-group-scale-2pct", "triton-group-quant", _GQ, (
        P("s = _scale_of(tl.max(tl.abs(x), axis=2), eps, QMAX, SCALE_MODE, FAST_DIV)",
          "s = _scale_of(tl.max(tl.abs(x), axis=2), eps, QMAX, SCALE_MODE, FAST_DIV) * 1.02"),),
        "group scales 2% too large (codes consistent with them)", {"scale_rule": ("float",), "unit": ("group",)}),
    Mutant("gq-fastdiv-wrong-scale", "triton-group-quant-fastdiv", _GQ, (
        P("s = tl.maximum(amax, eps) / tl.full(amax.shape, QMAX, tl.float32)",
          "s = tl.maximum(amax, eps) / tl.full(amax.shape, QMAX * 0.99, tl.float32)"),),
        "scale 1% off under a declared approximate division", {"scale_rule": ("float",)}),
    Mutant("gq-fastdiv-divisor-off", "triton-group-quant-fastdiv", _GQ, (
        P("y = x / tl.broadcast_to(safe, x.shape)", "y = x / tl.broadcast_to(safe * 1.0002, x.shape)"),),
        "elements divided by a divisor 2^-12 off (far beyond the declared division error)",
        {"scale_rule": ("float",), "unit": ("group", "token")}),
    # ------------------------------------------------------------------------------------------ align
    Mutant("align-sentinel-zero", "triton-align", _ALIGN, (
        P("tl.store(sorted_ptr + base + totals + jj, tl.zeros([NB], dtype=tl.int32) + numel,",
          "tl.store(sorted_ptr + base + totals + jj, tl.zeros([NB], dtype=tl.int32),"),),
        "padding sentinel 0 instead of numel"),
    Mutant("align-tail-expert-id-zero", "triton-align", _ALIGN, (
        P("tl.store(eids_ptr + p, tl.full([FILL], -1, dtype=tl.int32), mask=p < bhi)",
          "tl.store(eids_ptr + p, tl.full([FILL], 0, dtype=tl.int32), mask=p < bhi)"),),
        "expert id 0 instead of -1 for padding blocks"),
    Mutant("align-expert-map-ignored", "triton-align", _ALIGN, (
        P("wid = tl.load(emap_ptr + e, mask=keep, other=-1).to(tl.int32)", "wid = e"),),
        "expert map ignored (global ids written where local ids are due)",
        {"expert_map": ("keep_invalid_blocks", "exclude")}),
    Mutant("align-count-unpadded", "triton-align", _ALIGN, (
        P("tl.store(ntpp_ptr, used)", "tl.store(ntpp_ptr, tl.sum(totals, axis=0))"),),
        "num_tokens_post_padded without the padding"),
    # ------------------------------------------------------------------------------------------ reduce
    Mutant("reduce-bf16-accumulation", "triton-reduce", _RED, (
        P("            summed = acc + term\n",
          "            summed = (acc + term).to(out_ty).to(tl.float32)\n"),),
        "reduce accumulating in the output dtype where fp32 is declared",
        {"accumulation": ("fp32",), "dtype": ("bfloat16", "float16")}),
    Mutant("reduce-weight-ignored", "triton-reduce", _RED, (
        P("        if APPLY_WEIGHT:\n", "        if APPLY_WEIGHT and False:\n"),),
        "router weight not applied in the reduce", {"weights_applied": ("N",), "apply_weight_on_input": ("N",)}),
    Mutant("reduce-weight-in-bf16", "triton-reduce", _RED, (
        P("term = tl.load(w_ptr + t * stride_wm + j * stride_wj) * term",
          "term = tl.load(w_ptr + t * stride_wm + j * stride_wj).to(tl.bfloat16).to(tl.float32) * term"),),
        "router weight applied in bf16", {"weights_applied": ("N",), "apply_weight_on_input": ("N",),
                                          "dtype": ("float32", "float16")}),
    Mutant("reduce-expert-map-ignored", "triton-reduce", _RED, (
        P("mask=cols < tl.where(local, K, 0),", "mask=cmask,"),
        P("acc = tl.where(local, summed, acc)", "acc = summed")),
        "output rows of non-local experts added (expert map ignored)", {"expert_map": ("Y",)}),
    Mutant("reduce-scale-twice", "triton-reduce", _RED, (
        P("acc = acc * factor", "acc = acc * factor * factor"),),
        "routed scaling factor applied twice"),
    Mutant("reduce-nondeterministic-order", "triton-reduce", _RED, (
        P("K, factor,\n", "K, factor, rot,\n"),
        P("    for j in tl.static_range(TOPK):  # slot order is the accumulation order\n",
          "    for jj in tl.static_range(TOPK):\n        j = (jj + rot) % TOPK\n"),
        P("expert_out, w, ids, emap, out, hidden, factor,",
          "expert_out, w, ids, emap, out, hidden, factor, int(torch.randint(0, k, ()).item()),")),
        "nondeterministic output (slot order varies from run to run, like an atomic accumulation)",
        {"accumulation": ("fp32",), "dtype": ("float32",), "apply_weight_on_input": ("N",), "expert_map": ("N",)}),
    Mutant("reduce-out-written-contiguous", "triton-reduce", _RED, (
        P("*(ids.stride()[:2] if has_map else (0, 0)), *out.stride(),",
          "*(ids.stride()[:2] if has_map else (0, 0)), hidden, 1,"),),
        "output written as if contiguous (a strided out view ignored)"),
    Mutant("reduce-scales-input-in-place", "triton-reduce", "kernels.adapters.reduce", (
        P('inputs["expert_out"], inputs["topk_weights"], inputs["topk_ids"], out=outputs["out"],',
          'inputs["expert_out"], inputs["topk_weights"].mul_(case.params.get("routed_scaling_factor", 1.0)),\n'
          '        inputs["topk_ids"], out=outputs["out"],'),
        P('routed_scaling_factor=case.params.get("routed_scaling_factor", 1.0))', "routed_scaling_factor=1.0)")),
        "input modified in place (scaling factor folded into the caller's weights)",
        {"weights_applied": ("N",), "apply_weight_on_input": ("N",)}),
    # ------------------------------------------------------------------------------------------ experts
    Mutant("experts-gate-up-swapped", "triton-experts", _FE, (
        P("                g_rows = offs_nw\n                u_rows = offs_nw + N\n",
          "                g_rows = offs_nw + N\n                u_rows = offs_nw\n"),
        P("            g_rows = col + (offs_t % 2) * N\n", "            g_rows = col + (1 - offs_t % 2) * N\n")),
        "gate and up swapped (both tile layouts)", {"activation": ("silu", "gelu")}),
    Mutant("experts-swigluoai-not-interleaved", "triton-experts", _FE, (
        P('launch_gemm(x, w13, w13_bias, inter, rw, c1, act=act, interleaved=activation == "swigluoai",',
          "launch_gemm(x, w13, w13_bias, inter, rw, c1, act=act, interleaved=False,"),),
        "swigluoai weights read as halves instead of interleaved", {"activation": ("swigluoai",)}),
    Mutant("experts-router-weight-twice", "triton-experts", _FE, (
        P("weight_mode=0 if apply_router_weight_on_input else 2", "weight_mode=2"),),
        "router weight applied twice (on the input and on the output)", {"apply_weight_on_input": ("Y",)}),
    Mutant("experts-grid-full-blocks-only", "triton-experts", _FE, (
        P("max_blocks = triton.cdiv(numel, block_m) + min(num_local, numel)",
          "max_blocks = triton.cdiv(numel, block_m)"),),
        "GEMM grid sized for full blocks only: the last partial blocks are never computed"),
    Mutant("experts-per-slot-wrong-expert", "triton-experts", _FE, (
        P("e = tl.load(sorted_ids_ptr + pid_m).to(tl.int32)",
          "e = (tl.load(sorted_ids_ptr + pid_m) * 0).to(tl.int32)"),),
        "decode path (one block per slot): every slot computed with expert 0"),
    Mutant("experts-split-tail-always", "triton-experts", _FE, (
        P("tail = tl.load(sorted_ids_ptr + row_start + BLOCK_M // 2) >= num_valid",
          "tail = tl.load(sorted_ids_ptr + row_start + BLOCK_M // 2) >= 0"),),
        "every block run as a half-height tile: the second half of full blocks never computed"),
    Mutant("experts-k-tail-off-by-one", "triton-experts", _FE, (
        P("k_ok = offs_k < K - kk * BLOCK_K", "k_ok = offs_k < K - kk * BLOCK_K - 1"),),
        "off-by-one mask at the K tile edge"),
    Mutant("experts-expert-map-ignored", "triton-experts", _FE, (
        P("ids, block_m, num_experts, expert_map=expert_map,", "ids, block_m, num_local, expert_map=None,"),
        P("    if numel <= PER_SLOT_MAX:\n", "    if False:\n")),
        "expert map ignored (global ids used as local ids)", {"expert_map": ("Y",), "quant_type": ("none",)}),
    Mutant("experts-reduce-bf16-accumulation", "triton-experts", _FE, (
        P("acc += tl.load(y_ptr + slot[:, None] * K + offs[None, :], mask=use, other=0.0).to(tl.float32)",
          "acc = (acc + tl.load(y_ptr + slot[:, None] * K + offs[None, :], mask=use, other=0.0).to(tl.float32))"
          ".to(out_ptr.dtype.element_ty).to(tl.float32)"),),
        "reduce accumulating in bf16 where fp32 is declared",
        {"dtype": ("bfloat16",), "apply_weight_on_input": ("N",)}),
    Mutant("experts-no-local-unwritten", "triton-experts", _FE, (
        P("return out.zero_()", "return out"),),
        "empty (all non-local) experts leave the output rows unwritten", {"expert_map": ("Y",)}),
    Mutant("experts-swigluoai-wrong-alpha", "triton-experts", _FE, (
        P('SWIGLUOAI_PARAMS = {"alpha": 1.702,', 'SWIGLUOAI_PARAMS = {"alpha": 1.5,'),),
        "swigluoai's alpha constant wrong in the kernel", {"activation": ("swigluoai",)}),
    *(Mutant(f"experts-g128-weight-scale-{pct}pct", "triton-experts", _FE, (
        P("sw = tl.load(ws_ptrs + grp * stride_wsg)\n            if INT_DOT:",
          f"sw = tl.load(ws_ptrs + grp * stride_wsg) * {1 + pct / 100}\n            if INT_DOT:"),),
        f"G128 weight block scales {pct}% too large", {"quant_format": ("G128",), "quant_type": ("fp8_w8a8",)})
      for pct in (2, 5, 10)),
    Mutant("experts-channel-weight-scale-2pct", "triton-experts", _FE, (
        P("acc_g = acc_g * (sa[:, None] * tl.load(wsg_ptrs)[None, :])",
          "acc_g = acc_g * (sa[:, None] * tl.load(wsg_ptrs)[None, :] * 1.02)"),),
        "per-channel weight scales 2% too large (gate half)", {"quant_format": ("A",), "quant_type": ("fp8_w8a8",)}),
    Mutant("experts-w4-nibbles-swapped", "triton-experts", _FE, (
        P("a_even, a_odd = tl.split(", "a_odd, a_even = tl.split("),),
        "w4 codes: the low nibble taken as the odd K element", {"quant_type": ("w4a16", "w4a16_zp")}),
    Mutant("experts-w4-zero-point-wrong-nibble", "triton-experts", _FE, (
        P("z = (z >> ((rows % 2) * 4)) & 0xF", "z = (z >> (((rows + 1) % 2) * 4)) & 0xF"),),
        "w4 zero points: the neighbouring row's nibble", {"quant_type": ("w4a16_zp",)}),
    Mutant("experts-bias-times-router-weight", "triton-experts", _FE, (
        P("    if HAS_BIAS:\n        b_base = bias_ptr + e64 * stride_be\n",
          "    if HAS_BIAS:\n        b_base = bias_ptr + e64 * stride_be\n        if WEIGHT_MODE == 1:\n"
          "            acc_g = acc_g / rw[:, None]\n            if GATED:\n"
          "                acc_u = acc_u / rw[:, None]\n"),
        P("            acc_u += tl.load(b_base + u_rows * stride_bn).to(tl.float32)[None, :]\n",
          "            acc_u += tl.load(b_base + u_rows * stride_bn).to(tl.float32)[None, :]\n"
          "        if WEIGHT_MODE == 1:\n            acc_g = acc_g * rw[:, None]\n            if GATED:\n"
          "                acc_u = acc_u * rw[:, None]\n")),
        "GEMM1 bias multiplied by the router weight when it is applied on the input (vLLM's divergence)",
        {"bias": ("Y",), "apply_weight_on_input": ("Y",)}),
    Mutant("experts-scale-group-k-late", "triton-experts", _FE, (
        P("grp = (kk * BLOCK_K) // GROUP_K",
          "grp = ((kk * BLOCK_K) // GROUP_K + 1) % ((K + GROUP_K - 1) // GROUP_K)"),),
        "block scales read one K group late (wrapping: in bounds, wrong group)", {"quant_format": ("G128",)}),
    # blocks past num_tokens_post_padded: expert id -1 / sentinel rows, so their weight reads land before w[0]
    Mutant("experts-num-post-guard-dropped", "triton-experts", _FE, (
        P("        if row_start >= tl.load(num_post_ptr):\n            return\n", ""),),
        "no early return past num_tokens_post_padded: blocks the align stage left unused read weights at expert -1"),
    Mutant("experts-num-post-guard-off-by-one", "triton-experts", _FE, (
        P("if row_start >= tl.load(num_post_ptr):", "if row_start > tl.load(num_post_ptr):"),),
        "off-by-one guard: the first block past num_tokens_post_padded is computed (out-of-bounds weight reads)"),
    # the experts path's own activation quantizer (kernels.quant_gemm -> kernels.group_quant), not the group_quant op
    Mutant("experts-input-quant-reciprocal", "triton-experts", _GQ, (
        P("y = tl.div_rn(x, tl.broadcast_to(safe, x.shape))",
          "y = x * tl.div_rn(tl.full(safe.shape, 1.0, tl.float32), safe)"),),
        "activation quantized as x * (1 / scale) (an approximate divide) where x / scale is declared",
        {"quant_type": ("fp8_w8a8", "int8_w8a8")}, via=("kernels.quant_gemm",)),
    Mutant("experts-scale-group-n-halved", "triton-experts", _FE, (
        P("wsg_ptrs = ws_base + (g_rows // WS_ROW_DIV) * stride_wsn",
          "wsg_ptrs = ws_base + (g_rows // (2 * WS_ROW_DIV)) * stride_wsn"),),
        "weight scale row index along N off (two 128-row groups share one scale row)",
        {"quant_format": ("G128",), "quant_type": ("fp8_w8a8",)}),
    *BOUNDARY_MUTANTS,
    *VALUE_MUTANTS,
)
