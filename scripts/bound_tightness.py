"""How tight the experts error bound is: for each convention set and quant scheme, the bound the
harness judges with, against |expected| and against the actual error of a correct kernel.

The "correct kernel" is the oracle itself run in float32 (`compute_dtype=torch.float32`, the kernel's precision)
under the same conventions: its error against the float64 expected value is what an honest fp32 implementation
makes. Ratios are per output element, median and 99th percentile:
- bound / |expected|: how large an error a kernel may make and still pass (the target: median <= 5% for fp8 at
  K = 1024);
- bound / |error| over the elements where the fp32 result differs: how much room the bound leaves above a real error.

Run: `python scripts/bound_tightness.py [--out docs/BOUNDS.md]` (CPU, about a minute).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.core.case import Case
from harness.core.errors import C_DOT, UNIT_ROUNDOFF
from harness.ops import experts as op
from harness.ops import experts_quant as xq
from kernels.adapters import experts as ea
from reference import activations as acts
from reference import experts as ref

SHAPES = {"M": 64, "E": 8, "k": 2, "K": 1024, "N": 512}
SCHEMES = (("none", "-"), ("fp8_w8a8", "G128"), ("fp8_w8a8", "A"), ("int8_w8a8", "A"))
#: convention sets: the built-in Triton adapter's, and the variants adapters declare
SETS = {
    "triton-experts (built-in)": ea.TRITON_QUANT_CONVENTIONS,
    "round_activation_first": {**ea.TRITON_QUANT_CONVENTIONS, "rounding": "round_activation_first"},
    "every_step activation": {**ea.TRITON_QUANT_CONVENTIONS, "rounding": "every_step"},
    "gemm1 and activation rounded": {**ea.TRITON_QUANT_CONVENTIONS,
                                     "intermediate_rounding": "gemm1_and_activation_output"},
    "fp8_mma_promoted": {**ea.TRITON_QUANT_CONVENTIONS, "matmul_precision": "fp8_mma_promoted"},
    "sequential reduce (moe_sum)": {**ea.TRITON_QUANT_CONVENTIONS, "accumulation": "sequential_out_dtype"},
}


def _quantiles(t: torch.Tensor) -> tuple[float, float]:
    if t.numel() == 0:
        return math.nan, math.nan
    q = torch.quantile(t.double()[: 2**24], torch.tensor([0.5, 0.99], dtype=torch.float64))
    return float(q[0]), float(q[1])


def _perturbed_gemm1(gen: torch.Generator):
    """The oracle's GEMM1 + activation with h moved by up to 0.9 of the GEMM1 accumulation bound (uniform, per
    element): a kernel whose GEMM1 error is as large as the bound allows, everything after it done honestly."""
    def run(xs, e, w13, w13_bias, conv, intermediate_rounding, io_dtype, cd, bias_placement=None):
        w = w13[e].to(cd)
        mag = xs.abs().double() @ w.abs().double().T
        noise = (torch.rand(mag.shape, generator=gen, dtype=torch.float64) * 2 - 1) * 0.9
        h = xs @ w.T + (noise * C_DOT * UNIT_ROUNDOFF["float32"] * math.sqrt(xs.shape[1]) * mag).to(cd)
        if w13_bias is not None:
            h = h + w13_bias[e].to(cd)
        if intermediate_rounding == ref.IntermediateRounding.GEMM1_AND_ACTIVATION_OUTPUT:
            h = h.to(io_dtype).to(cd)
        a = acts.apply_activation(conv.activation, h, gate_order=conv.gate_order, layout=conv.layout,
                                  alpha=conv.alpha, beta=conv.beta, limit=conv.limit, clamp_limit=conv.clamp_limit,
                                  rounding=conv.rounding, out_dtype=cd,
                                  intermediate_dtype=io_dtype if conv.rounding != acts.Rounding.ROUND_ONCE else None)
        if intermediate_rounding != ref.IntermediateRounding.NONE:
            a = a.to(io_dtype).to(cd)
        return h, a
    return run


def measure(conventions: dict, qt: str, qf: str, activation: str = "silu", *, shapes: dict | None = None,
            seed: int = 7, bias: str = "N", on_input: str = "N", perturb: bool = False) -> dict[str, float]:
    features = {"format": "standard", "quant_type": qt, "quant_format": qf, "activation": activation,
                "apply_weight_on_input": on_input, "expert_map": "N", "dtype": "bfloat16", "bias": bias}
    params = {} if qt == "none" else {"act_quant": dict(conventions.get("act_quant", {}))}
    case = Case(op="experts", adapter="bounds", features=features, shapes=dict(shapes or SHAPES),
                dtypes={"x": "bfloat16"}, seed=seed, params=params)
    inputs = op.make_inputs(case, "cpu")
    (check,) = op.expected(case, inputs, conventions)
    kw = op._oracle_kwargs(case, conventions)
    sch = xq.scheme(case, conventions)
    quant = None if sch is None else xq.to_experts_quant(inputs, sch)
    w13, w2 = (None, None) if quant is not None else (inputs["w13"], inputs["w2"])
    biases = {b: inputs[b] for b in ("w13_bias", "w2_bias") if b in inputs}
    gemm1 = ref._gemm1_act
    if perturb:  # GEMM1 results anywhere in its bound: what the brackets after it must absorb
        ref._gemm1_act = _perturbed_gemm1(torch.Generator().manual_seed(seed))
    try:
        got = ref.fused_experts(inputs["x"], w13, w2, inputs["topk_weights"], inputs["topk_ids"], **kw, **biases,
                                apply_router_weight_on_input=on_input == "Y", **op._reduce_kwargs(conventions),
                                compute_dtype=torch.float32, quant=quant).double()
    finally:
        ref._gemm1_act = gemm1
    want, bound = check.expected.double(), check.bound.double()
    err = (got - want).abs()
    nz = want.abs() > 0
    rel = bound[nz] / want.abs()[nz]
    differs = err > 0
    room = bound[differs] / err[differs]
    return {"rel_med": _quantiles(rel)[0], "rel_p99": _quantiles(rel)[1], "room_med": _quantiles(room)[0],
            "room_p99": _quantiles(room)[1], "outside": int((err > bound).sum()), "n": want.numel(),
            "worst": float((err / bound).max()) if want.numel() else 0.0}


#: the soundness sweep (--sweep): shapes with K and N over several 128-groups and ragged tails, M = 1, k = 1..8
SWEEP_SHAPES = ({"M": 1, "E": 4, "k": 1, "K": 384, "N": 256}, {"M": 17, "E": 8, "k": 8, "K": 320, "N": 136},
                {"M": 33, "E": 3, "k": 3, "K": 640, "N": 200})
SWEEP_VARIANTS = (("silu", "N", "N"), ("swigluoai", "Y", "N"), ("gelu", "N", "Y"), ("swigluoai", "N", "Y"))


def sweep(seeds: tuple[int, ...] = (1, 2)) -> list[str]:
    """Every convention set x scheme x shape x (activation, bias, weight on input) x seed: elements of the fp32
    implementation outside the bound (must be 0) and its largest error / bound."""
    lines = []
    for name, conventions in SETS.items():
        for qt, qf in SCHEMES:
            outside, worst, runs = 0, 0.0, 0
            for shapes in SWEEP_SHAPES:
                for act, bias, on_input in SWEEP_VARIANTS:
                    sh = {**shapes, "k": 1} if on_input == "Y" else shapes
                    if qf == "G128":  # K and N of a G128 cell are whole groups (experts.draw): ragged only for A/-
                        sh = {**sh, "K": -(-sh["K"] // 128) * 128, "N": -(-sh["N"] // 128) * 128}
                    for seed, perturb in ((s, p) for s in seeds for p in (False, True)):
                        m = measure(conventions, qt, qf, act, shapes=sh, seed=seed, bias=bias, on_input=on_input,
                                    perturb=perturb)
                        outside, worst, runs = outside + m["outside"], max(worst, m["worst"]), runs + 1
            lines.append(f"| {name} | {qt} {qf if qf != '-' else ''} | {runs} | {worst:.3f} | {outside} |")
            print(lines[-1], flush=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write the markdown table here (default: print it)")
    p.add_argument("--no-sweep", action="store_true", help="leave out the soundness sweep (a few minutes)")
    args = p.parse_args(argv)
    t0 = time.time()
    rows = []
    for name, conventions in SETS.items():
        for qt, qf in SCHEMES:
            m = measure(conventions, qt, qf)
            rows.append(f"| {name} | {qt} {qf if qf != '-' else ''} | {100 * m['rel_med']:.2f}% | "
                        f"{100 * m['rel_p99']:.2f}% | {m['room_med']:.1f} | {m['room_p99']:.1f} | {m['outside']} |")
            print(rows[-1], flush=True)
    sweep_rows = [] if args.no_sweep else sweep(seeds=(1,))
    shape = ", ".join(f"{k}={v}" for k, v in SHAPES.items())
    text = "\n".join([
        "# Error-bound tightness: fused experts", "",
        "Generated by `python scripts/bound_tightness.py --out docs/BOUNDS.md`; do not edit by hand.", "",
        f"bf16 inputs, silu, {shape}, one seeded case per row. `bound / |expected|`: the error a kernel may make "
        "and pass, relative to the value (median, 99th percentile over the output elements). `bound / error`: "
        "the bound over the actual error of a correct fp32 implementation (the oracle run in float32 under the "
        "same conventions), where that error is not zero: how much room is left above an honest kernel's error. "
        "`outside`: elements of the fp32 implementation outside the bound (must be 0).", "",
        "| Conventions | Scheme | bound / \\|expected\\| median | p99 | bound / error median | p99 | outside |",
        "|---|---|---|---|---|---|---|", *rows, "",
        "Soundness sweep (`--sweep`): every set and scheme over K, N spanning several groups with ragged tails "
        "(whole groups for G128, as the harness draws them), M = 1, k = 1, 3, 8, silu / swigluoai / gelu, bias, "
        "weight on input, for the fp32 oracle and for an implementation whose GEMM1 results sit anywhere within 0.9 "
        "of GEMM1's bound (the brackets after it must absorb that): `worst` is the largest error / bound.", "",
        "| Conventions | Scheme | runs | worst error / bound | outside |", "|---|---|---|---|---|", *sweep_rows, "",
        "Where the slack is: for the quantized rows the re-quantization of the activation output dominated (fp8 G128 "
        "at K = 1024: 0.14 of the 0.15 median came from the bracket of a', 0.03 from the bf16 rounding before it). "
        "It widened every element by the whole range of its unit's scale twice (a wider quotient, then each end "
        "scale) and paid the scale's movement on every |element|. Now the code range of a'/s' is exact over the box "
        "of a' and s', and the movement s'/s, one factor for the whole unit, is paid once on the unit's signed "
        "partial dot with W2. `every_step` is bracketed step by step (silu/gelu: one rounding, act(gate)'s; "
        "swigluoai: the interval through z, sigmoid, g * sigmoid, up + beta and the product).", "",
        "Targets: median bound <= 5% of |expected| for fp8 at K = 1024 under every convention set. Met "
        "for bf16 under every set but fp8_mma_promoted, every_step included. Not met for the quantized schemes "
        "(about 8-12%): each rounding bracket costs, on average, about twice the error it brackets (the chance of "
        "straddling a boundary times the step), the chain is GEMM1's C_DOT sqrt(K) term -> bf16 bracket -> code "
        "bracket, and each bracket is summed with |W2| over N as a worst case while a real error cancels like a "
        "random walk; going lower soundly needs signed (one-sided) brackets carried through GEMM2 and the reduce "
        "(an element near a boundary can only move one way), not done yet. `fp8_mma_promoted` stays a relative "
        "worst case on |products| (harness/core/errors.py: the tensor core's partial sums between fp32 promotions "
        "are not rounded in a documented way). The p99 ratios are near-zero outputs (cancellation), where any "
        "absolute error is a large relative one.", ""])
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"wrote {args.out} in {time.time() - t0:.0f}s")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
