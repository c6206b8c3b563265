"""Planted bugs that hide behind the value ranges real models and production reach rather than a feature cell:
logits past exp's overflow, group widths that are not powers of two, expert ids past 127 and 255, router weights
of exactly 0, the amax in the last block of a row past 8k columns, and inputs at the dtype's largest finite value.
Each passes every case of a draw that stays inside the tame range, and is caught by the value class that leaves it
(`harness/ops/*`: `LARGE_LOGITS`, `ODD_GROUP_WIDTH`, `MANY_EXPERTS`, `ZERO_WEIGHTS`, `LAST_BLOCK_AMAX`,
`DTYPE_EXTREMES` of group_quant (one case per input dtype), activation and act_quant, and the experts op's
`ZERO_WEIGHTS` and `MANY_EXPERTS`); `tests/mutants/catalog.py` adds them.

Not planted here: an int32 flat offset past 2**31 elements, which needs more memory than a CPU CI case allocates
(the planted-bug suite runs under Triton's interpreter on the CPU).
"""

from __future__ import annotations

from tests.mutants.build import Mutant, Patch

P = Patch
_ROUTING = "kernels.routing"
_GQ = "kernels.group_quant"
_ALIGN = "kernels.align"
_RED = "kernels.reduce"
_EXPERTS = "kernels.fused_experts"
_ACT = "kernels.activation"
_AQ = "kernels.act_quant"

VALUE_MUTANTS: tuple[Mutant, ...] = (
    Mutant("routing-softmax-no-max-subtraction", "triton-routing", _ROUTING, (
        P("ex = tl.where(col_ok, libdevice.exp(xm - mx[:, None, None]), 0.0)",
          "ex = tl.where(col_ok, libdevice.exp(xm), 0.0)"),),
        "softmax as exp(x) / sum exp(x): exact while |x| < 88, inf / inf = NaN past exp's overflow",
        {"scoring": ("softmax",), "nonfinite_rows": ("N",)}),
    Mutant("routing-renormalize-eps-in-denominator", "triton-routing", _ROUTING, (
        P("tl.div_rn(out_w, tl.where(tot > 0, tot, 1.0))", "tl.div_rn(out_w, tot + 1e-20)"),),
        "renormalized weights w / (sum + 1e-20): exact while the chosen sigmoids sum past ~1e-13, far off where "
        "tiny sigmoids (logits below -30) are all a row offers or the correction bias picks",
        {"scoring": ("sigmoid",), "renormalize": ("Y",)}),
    Mutant("grouped-group-stride-pow2", "triton-grouped-routing", _ROUTING, (
        P("eid = g3 * PER_GROUP + p3", "eid = g3 * BLOCK_P + p3"),),
        "the padded group width (next power of two) used as the group stride: right only for power-of-two groups"),
    Mutant("align-ids-int8", "triton-align", _ALIGN, (
        P("e = tl.load(ids_ptr + offs, mask=valid, other=0).to(tl.int32)",
          "e = tl.load(ids_ptr + offs, mask=valid, other=0).to(tl.int8).to(tl.int32)"),),
        "expert ids narrowed to int8: right while E <= 128"),
    Mutant("reduce-zero-weight-rows-unwritten", "triton-reduce", _RED, (
        P("    acc = tl.zeros([BLOCK], dtype=tl.float32)\n",
          "    acc = tl.zeros([BLOCK], dtype=tl.float32)\n    live = tl.zeros([BLOCK], dtype=tl.float32)\n"),
        P("            term = tl.load(w_ptr + t * stride_wm + j * stride_wj) * term",
          "            wj = tl.load(w_ptr + t * stride_wm + j * stride_wj)\n"
          "            live = live + tl.abs(wj)\n            term = wj * term"),
        P("tl.store(out_ptr + t * stride_om + cols * stride_ok, acc.to(out_ty), mask=cmask)",
          "tl.store(out_ptr + t * stride_om + cols * stride_ok, acc.to(out_ty), mask=cmask & (live != 0.0))")),
        "a token whose router weights are all 0 (masked or padded slots) skipped: its output row never written",
        {"weights_applied": ("N",), "apply_weight_on_input": ("N",)}),
    Mutant("reduce-terms-prescaled-for-headroom", "triton-reduce", _RED, (
        P("            summed = acc + term\n", "            summed = acc + term * 16.0\n"),
        P("    if SCALE:\n        acc = acc * factor\n",
          "    if not SEQUENTIAL:\n        acc = acc * 0.0625\n    if SCALE:\n        acc = acc * factor\n")),
        "fp32 accumulation of every term times 16, the sum times 1/16 after (a fixed-point style headroom): exact "
        "while 16 |w y| stays finite in fp32, inf for an expert output at bf16's (or fp32's) largest finite value",
        {"accumulation": ("fp32",), "weights_applied": ("N",), "apply_weight_on_input": ("N",)}),
    Mutant("experts-zero-weight-read-as-unset", "triton-experts", _EXPERTS, (
        P("        out = out * rw[:, None]\n", "        out = out * tl.where(rw == 0.0, 1.0, rw)[:, None]\n"),),
        "a router weight of 0 taken for 'no weight given' (1.0): right while every weight is positive",
        {"apply_weight_on_input": ("N",), "quant_type": ("none",), "format": ("standard",)}),
    Mutant("experts-per-slot-ids-int8", "triton-experts", _EXPERTS, (
        P("e = tl.load(sorted_ids_ptr + pid_m).to(tl.int32)",
          "e = tl.load(sorted_ids_ptr + pid_m).to(tl.int8).to(tl.int32)"),),
        "a decode batch's expert ids narrowed to int8: right while E <= 128",
        {"quant_type": ("none",), "format": ("standard",)}),
    Mutant("experts-decode-nonlocal-slot-as-last-expert", "triton-experts", _EXPERTS, (
        P("st = slot_blocks(ids, c1.block_m, expert_map)",
          "st = slot_blocks(ids, c1.block_m, None if expert_map is None else expert_map % num_local)"),
        P("HAS_MAP=expert_map is not None,", "HAS_MAP=expert_map is not None and numel > PER_SLOT_MAX,")),
        "a decode batch's slot of a non-local expert (-1 after the map) computed with w13[-1] (the last local "
        "expert) and its router weight, and summed: the decode reduce trusts the GEMM to leave such rows zero",
        {"quant_type": ("none",), "format": ("standard",)}),
    Mutant("gq-wide-row-amax-full-blocks-only", "triton-group-quant", _GQ, (
        P("    acc = tl.zeros([BLOCK_K], tl.float32)\n    for k0 in range(0, K, BLOCK_K):\n",
          "    acc = tl.zeros([BLOCK_K], tl.float32)\n    for k0 in range(0, K // BLOCK_K * BLOCK_K, BLOCK_K):\n"),),
        "a per-token row wider than the register tile: amax over its full blocks only (the last partial block "
        "left out)", {"unit": ("token",)}),
    Mutant("gq-amax-of-prescaled-x", "triton-group-quant", _GQ, (
        P("s = _scale_of(tl.max(tl.abs(x), axis=2), eps, QMAX, SCALE_MODE, FAST_DIV)",
          "s = _scale_of(tl.max(tl.abs(x) * 256.0, axis=2) * 0.00390625, eps, QMAX, SCALE_MODE, FAST_DIV)"),),
        "the amax taken over x scaled by a power of two (headroom for a fixed-point step): exact while |x| * 256 "
        "stays finite in fp32, an inf scale at the input dtype's largest finite value"),
    Mutant("gq-half-amax-doubled-in-fp16", "triton-group-quant", _GQ, (
        P("    x = tl.load(x_ptr + xo, mask=mask, other=0.0).to(tl.float32)\n",
          "    xin = tl.load(x_ptr + xo, mask=mask, other=0.0)\n    x = xin.to(tl.float32)\n"),
        P("        s = _scale_of(tl.max(tl.abs(x), axis=2), eps, QMAX, SCALE_MODE, FAST_DIV)",
          "        ax = tl.abs(x)\n"
          "        if x_ptr.dtype.element_ty == tl.float16:\n"
          "            ax = tl.abs((xin + xin).to(tl.float32)) * 0.5\n"
          "        s = _scale_of(tl.max(ax, axis=2), eps, QMAX, SCALE_MODE, FAST_DIV)")),
        "fp16 inputs only: the amax taken over x + x formed in half precision (halved after): exact while "
        "|x| < 32752, inf at fp16's largest finite value (bf16 and fp32 inputs take the fp32 path)"),
    Mutant("act-sigmoid-as-exp-ratio", "triton-activation", _ACT, (
        P("    return 1.0 / (1.0 + tl.exp(-z))", "    return tl.exp(z) / (1.0 + tl.exp(z))"),),
        "sigmoid as exp(z) / (1 + exp(z)): exact while z < 88, inf / inf = NaN past exp's overflow (a gate at "
        "the dtype's largest finite value)"),
    Mutant("aq-amax-as-root-of-max-square", "triton-act-quant", _AQ, (
        P("amax = tl.maximum(tl.max(tl.abs(v), axis=2), eps)",
          "amax = tl.maximum(tl.sqrt(tl.max(v * v, axis=2)), eps)"),),
        "the group amax as sqrt(max v^2) (a norm-style reduction): exact while v^2 stays finite in fp32, an inf "
        "scale past |v| = 1.8e19 (a product at the input dtype's largest finite value)"),
)
