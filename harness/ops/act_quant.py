"""Op spec `act_quant`: fused gated activation + per-token-group fp8 quantization (docs/SEMANTICS.md §2 and §4).

What vLLM's silu_and_mul + per_token_group_quant_fp8 fusion and DeepGEMM's / SGLang's fused variants compute.

Contract. Input `x [T, 2N]` (fp16, bf16, fp32), N a multiple of the group size, with act(gate') * up' finite in
fp32 (a product past fp32's range has no finite scale: outside the contract, the oracle raises on it).
Outputs `codes [T, N]` float8_e4m3fn and `scales` in the cell's layout. With L = `case.params["clamp_limit"]`
when the cell has clamp_limit=Y:
1. gate, up = the two parts of x (conventions `gate_order`, `layout`; the activation's own layout by default);
2. clamp_limit (as swiglu-limit models): gate' = min(gate, L) (clamped above only), up' = clamp(up, -L, L), in fp32,
   *before* the activation and before the activation's own clamps (swigluoai's limit);
3. v = act(gate', up') in fp32 (`reference.activations.apply_activation(..., out_dtype=float32)`); convention
   `act_rounding`: "fp32" (default: v goes straight to the quantizer) or "input_dtype" (v is rounded to x's dtype
   first, as kernels that store the activation and re-read it do);
4. per row, per group of `group_size` contiguous columns: `reference.quant.quantize` with
   QuantRecipe(fp8_e4m3fn, unit group, group_size, scale_rule, layout) and the adapter's `quant` convention
   (eps, eps_placement, eps_dtype (`input`: x's dtype), scale_formula, application, ue8m0_clamp, ue8m0_form;
   QuantRecipe's defaults otherwise: eps 1e-10 on amax, scale = max(amax, eps) / 448 by true division, x / scale,
   clamp to +-448, round to nearest even).
Scale layouts (reference.scales): row_major fp32 [T, G]; column_major (strides (1, T)); column_major_tma
(strides (1, T rounded up to 4)); packed_ue8m0 int32 [T, ceil(G/4)] with strides (1, T rounded up to 4), byte j of
word p the e8m0 exponent of group 4p+j, missing groups 0 (only with scale_rule ue8m0: not a cell with float).

Judging. The activation is computed with transcendentals (exp, erf, tanh) that a GPU evaluates to a few ulps,
so a correct kernel's v_k differs from the oracle's v by up to the `activation` op's error bound b (16 fp32 ulps
of the operand magnitude (|gate'| + 1) * (|up'| + 1), harness/ops/activation.py; plus one rounding of the
intermediate dtype under `rounding=round_activation_first`). Every rounding step after it (to x's dtype, the
scale rule, x / s, the clamp, the fp8 encode) is monotone, so:
- scales: the kernel's (logical) scale of a group must equal the scale rule applied to *some* amax between the
  smallest and the largest amax the window [v - b, v + b] allows (each end passed through `act_rounding` first).
  Under ue8m0 that is the oracle's exact power of two unless the group's amax is itself within b of a scale
  boundary (448 * 2^k); under float it is the exact quotient of an amax in that window. The stored layout is
  exact: the kernel's logical scales, re-stored in the layout, must be bitwise the kernel's stored tensor (for
  packed_ue8m0: padding bytes 0). Under ue8m0 every scale must be a power of two.
- codes: judged with the kernel's own scales (the scale check above judges those): each code must lie between
  the codes of v - b and v + b quantized with that scale, and at most one step from the code of v itself. So a
  code may differ from the oracle's by one step only where v / s is within b / s of a rounding midpoint; the sign
  of zero counts (-0 only where the window is entirely negative).
Everything else exact. T = 0 gives empty outputs.
What the window cannot see: differences smaller than b, e.g. `application` divide vs multiply_reciprocal (1 ulp of
v / s) or a float-rule scale a few ulps off; they are conventions an adapter declares, judged exactly only by
group_quant, whose input is not computed. The window is wide relative to an fp8 step only for codes far below the
group's amax (fp8 subnormals): in CI runs about 0.3% of silu codes, 3% of swigluoai and 10% of gelu codes (gelu's
bound is loose in the cancelling tail) had a window of two codes; a one-step error elsewhere fails.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
from hypothesis import strategies as st

from harness.core import inputs as gen
from harness.core.case import Case
from harness.core.compare import Comparison, bits
from harness.core.errors import elementwise_bound
from harness.core.sizes import edge_sizes, span
from harness.ops import activation as act_op
from harness.ops.base import Axis, Check, OpSpec, OutputSpec, ValueClass
from harness.ops.common import by_rows, custom, lim, row_subset
from harness.registry import Adapter
from reference import activations as ref
from reference.quant import QuantRecipe, logical_scales, quantize, resolve_eps, scale_from_amax
from reference.scales import ScaleLayout, to_layout, unpack_ue8m0

GATED = tuple(a.value for a in ref.Activation if ref.is_gated(a))
DTYPES = ("bfloat16", "float16", "float32")
LAYOUTS = ("row_major", "column_major", "column_major_tma", "packed_ue8m0")
AXES = (
    Axis("activation", "Activation", GATED),
    Axis("dtype", "Dtype", DTYPES),
    Axis("group_size", "Group size", ("128", "64")),
    Axis("scale_rule", "Scale rule", ("float", "ue8m0")),
    Axis("scale_layout", "Scale layout", LAYOUTS),
    Axis("clamp_limit", "Clamp limit", ("N", "Y")),
)
QMAX = 448.0
#: QuantRecipe fields an adapter may fix through its `quant` convention
QUANT_CONVENTION_KEYS = ("eps", "eps_placement", "eps_dtype", "scale_formula", "application", "ue8m0_clamp",
                         "ue8m0_form")
#: clamp limits drawn for clamp_limit=Y cells (inputs are N(0, 9): each one clamps a real share of them)
CLAMP_LIMITS = (0.5, 2.5, 7.0)


def inapplicable(cell: Mapping[str, str]) -> str | None:
    if cell.get("scale_layout") == "packed_ue8m0" and cell.get("scale_rule") == "float":
        return "packed_ue8m0 holds e8m0 exponents: it needs power-of-two (ue8m0) scales"
    return None


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def num_groups(n: int, group_size: int) -> int:
    return -(-n // group_size)


def recipe_of(case: Case, conventions: Mapping[str, Any]) -> QuantRecipe:
    """The QuantRecipe of a case: the cell's group size, rule and layout plus the adapter's `quant` convention,
    its eps resolved by `eps_dtype` (`input`: x's dtype, also when the activation output stays fp32)."""
    q = dict(conventions.get("quant") or {})
    unknown = sorted(set(q) - set(QUANT_CONVENTION_KEYS))
    if unknown:
        raise ValueError(f"quant convention has unknown keys {unknown}; known: {QUANT_CONVENTION_KEYS}")
    f = case.features
    r = QuantRecipe(dtype="fp8_e4m3fn", unit="group", group_size=int(f["group_size"]),
                    scale_rule=f["scale_rule"], layout=f["scale_layout"], **q)
    return resolve_eps(r, case.dtype("x"))


def clamp_limit_of(case: Case) -> float | None:
    return float(case.params["clamp_limit"]) if case.features.get("clamp_limit") == "Y" else None


def activation_kwargs(case: Case, conventions: Mapping[str, Any]) -> dict[str, Any]:
    """apply_activation keywords: the adapter's activation conventions plus the case's clamp_limit."""
    act = case.features["activation"]
    kw = act_op.oracle_kwargs({k: v for k, v in conventions.items() if k != "clamp_limit"}, act)
    clamp = clamp_limit_of(case)
    if clamp is not None:
        kw["clamp_limit"] = clamp
    return kw


def activation_values(case: Case, x: torch.Tensor, conventions: Mapping[str, Any]) -> torch.Tensor:
    """The oracle's pre-quantization values v [T, N] (float32, after `act_rounding`)."""
    act = case.features["activation"]
    v = ref.apply_activation(act, x, out_dtype=torch.float32, **activation_kwargs(case, conventions))
    return _act_round(v, x.dtype, conventions)


def _act_round(v: torch.Tensor, dtype: torch.dtype, conventions: Mapping[str, Any]) -> torch.Tensor:
    how = conventions.get("act_rounding", "fp32")
    if how not in ("fp32", "input_dtype"):
        raise ValueError(f"act_rounding must be 'fp32' or 'input_dtype', got {how!r}")
    return v.to(dtype).to(torch.float32) if how == "input_dtype" else v


def operand_magnitude(x: torch.Tensor, act: str, kw: Mapping[str, Any]) -> torch.Tensor:
    """(|gate'| + 1) * (|up'| + 1) per output element, with the parts after the clamps the activation applies."""
    layout = kw.get("layout") or (ref.GateLayout.INTERLEAVED if act == "swigluoai" else ref.GateLayout.HALVES)
    x = x.to(torch.float64)  # the product of parts at the dtype's largest finite value overflows fp32
    if ref.GateLayout(layout) == ref.GateLayout.INTERLEAVED:
        p0, p1 = x[:, 0::2], x[:, 1::2]
    else:
        p0, p1 = x.chunk(2, dim=-1)
    gate, up = (p1, p0) if ref.GateOrder(kw.get("gate_order", "gate_first")) == ref.GateOrder.UP_FIRST else (p0, p1)
    clamp = kw.get("clamp_limit")
    if clamp is not None:
        gate, up = gate.clamp(max=clamp), up.clamp(-clamp, clamp)
    if act in ("swigluoai", "swigluoai_uninterleave", "swiglustep"):
        limit = kw.get("limit", ref.SWIGLUOAI_LIMIT if act != "swiglustep" else ref.SWIGLUSTEP_LIMIT)
        up = up.clamp(-limit, limit)
        if act != "swiglustep":  # swiglustep clamps silu(gate), after the activation
            gate = gate.clamp(max=limit)
    return (gate.abs() + 1) * (up.abs() + 1)


def activation_bound(case: Case, x: torch.Tensor, v32: torch.Tensor, conventions: Mapping[str, Any]) -> torch.Tensor:
    """b: how far a correct kernel's fp32 activation may be from the oracle's (the `activation` op's bound)."""
    act = case.features["activation"]
    kw = activation_kwargs(case, conventions)
    b = elementwise_bound(v32, torch.float32, ulps_fp32=16, magnitude=operand_magnitude(x, act, kw))
    return b + act_op.inner_rounding_slack(kw.get("rounding"), x.dtype) * v32.abs()


def _outward(v64: torch.Tensor, down: bool) -> torch.Tensor:
    """float64 -> float32 rounded away from the window's centre (never inward)."""
    f = v64.to(torch.float32)
    if down:
        return torch.where(f.double() > v64, torch.nextafter(f, torch.full_like(f, -float("inf"))), f)
    return torch.where(f.double() < v64, torch.nextafter(f, torch.full_like(f, float("inf"))), f)


def make_inputs(case: Case, device: str) -> dict[str, torch.Tensor]:
    t, n = case.shape("T"), case.shape("N")
    # scale 3: saturating and clamped regions (swigluoai's limit 7, clamp_limit) as well as the middle
    x = gen.randn(case, "x", (t, 2 * n), case.dtype("x"), device, scale=3.0)
    if case.params.get("values") == "edges":
        # an aligned zero run of 2 groups zeroes at least one output group in either layout (act(0) * up = 0)
        x = gen.edge_rows(case, x.float(), 2 * int(case.features["group_size"])).to(x.dtype)
    elif case.params.get("values") == "extremes":
        # the values beside the extremes within 0.5: |act(g)| <= |g| and up clamps, so act(gate) * up stays finite
        # in fp32 (well inside it, for the error window too)
        x = act_op.with_extremes(case, x.float().cpu(), x.dtype, beside=0.5).to(x.dtype).to(x.device)
    return {"x": x}


def scale_spec(t: int, g: int, layout: str) -> OutputSpec:
    """The scales output of T rows and G groups in `layout` (shape, dtype, contractual strides)."""
    if layout == "row_major":
        return OutputSpec((t, g), torch.float32)
    if layout == "column_major":
        return OutputSpec((t, g), torch.float32, (1, t))
    if layout == "column_major_tma":
        return OutputSpec((t, g), torch.float32, (1, _round_up(t, 4)))
    if layout == "packed_ue8m0":
        return OutputSpec((t, (g + 3) // 4), torch.int32, (1, _round_up(t, 4)))
    raise ValueError(f"scale_layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")


def outputs(case: Case, inputs: Mapping[str, torch.Tensor]) -> dict[str, OutputSpec]:
    t, n = case.shape("T"), case.shape("N")
    g = num_groups(n, int(case.features["group_size"]))
    return {"codes": OutputSpec((t, n), torch.float8_e4m3fn), "scales": scale_spec(t, g, case.features["scale_layout"])}


def _logical(stored: torch.Tensor, layout: str, t: int, g: int) -> torch.Tensor:
    """A kernel's stored scales -> logical float32 [T, G] (ValueError on a wrong shape or dtype)."""
    if layout == "packed_ue8m0":
        if stored.dtype != torch.int32 or tuple(stored.shape) != (t, (g + 3) // 4):
            raise ValueError(f"scales must be int32 [{t}, {(g + 3) // 4}], got {stored.dtype} {list(stored.shape)}")
        return unpack_ue8m0(stored.detach().cpu(), g)
    if stored.dtype != torch.float32 or tuple(stored.shape) != (t, g):
        raise ValueError(f"scales must be float32 [{t}, {g}], got {stored.dtype} {list(stored.shape)}")
    return stored.detach().cpu().contiguous()


def _ordinal(codes: torch.Tensor, signed_zero: bool) -> torch.Tensor:
    """fp8 codes (uint8) -> integers in value order; with signed_zero, -0 sits one below +0."""
    c = codes.to(torch.int64)
    mag, neg = c & 0x7F, (c >> 7) == 1
    return torch.where(neg, -mag - (1 if signed_zero else 0), mag)


def expected(case: Case, inputs: Mapping[str, torch.Tensor], conventions: Mapping[str, Any]) -> list[Check]:
    x = inputs["x"].detach().cpu()
    recipe = recipe_of(case, conventions)
    layout, t, n = case.features["scale_layout"], case.shape("T"), case.shape("N")
    g = num_groups(n, recipe.group_size)
    if t == 0:  # nothing to quantize: empty outputs, compared exactly
        empty = {name: torch.empty(s.shape, dtype=s.dtype) for name, s in outputs(case, inputs).items()}
        return [Check(name, "exact", expected=e) for name, e in empty.items()]
    act = case.features["activation"]
    v32 = ref.apply_activation(act, x, out_dtype=torch.float32, **activation_kwargs(case, conventions))
    b = activation_bound(case, x, v32, conventions).double()
    v = _act_round(v32, x.dtype, conventions)
    lo = _act_round(_outward(v32.double() - b, True), x.dtype, conventions)
    hi = _act_round(_outward(v32.double() + b, False), x.dtype, conventions)
    qt = quantize(v, recipe)
    s_oracle = logical_scales(qt) if layout != "packed_ue8m0" else unpack_ue8m0(qt.scales, g)

    # amax window per group: the smallest / largest |value| any element of the window can take
    same_sign = (lo > 0) | (hi < 0)
    a_lo = torch.where(same_sign, torch.minimum(lo.abs(), hi.abs()), torch.zeros_like(lo))
    a_hi = torch.maximum(lo.abs(), hi.abs())
    a_lo, a_hi = (a.view(t, g, recipe.group_size).amax(dim=-1) for a in (a_lo, a_hi))
    s_lo = scale_from_amax(a_lo.float(), recipe)
    s_hi = scale_from_amax(a_hi.float(), recipe)
    pow2_rule = recipe.scale_rule.value == "ue8m0"

    return [Check("codes", "custom", expected=qt.codes.view(torch.float8_e4m3fn),
                  judge=_codes_judge(layout, t, g, lo, v, hi, s_oracle, recipe)),
            Check("scales", "custom", expected=qt.scales,
                  judge=_scales_judge(layout, t, g, s_lo, s_hi, s_oracle, pow2_rule))]


def stages(case: Case, inputs: Mapping[str, torch.Tensor], conventions: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The activation's output before quantization (float32, after `act_rounding`)."""
    return {"activation_out": activation_values(case, inputs["x"].detach().cpu(), conventions)}


Judge = Callable[[torch.Tensor, Mapping[str, torch.Tensor]], Comparison]


def _scales_judge(layout: str, t: int, g: int, s_lo: torch.Tensor, s_hi: torch.Tensor, s_oracle: torch.Tensor,
                  pow2_rule: bool) -> Judge:
    """Judge of the scales: each group's scale within the window [s_lo, s_hi] the activation's error bound allows
    (a power of two under ue8m0), stored exactly as its layout stores those values."""

    def judge_scales(actual: torch.Tensor, _outs: Mapping[str, torch.Tensor]) -> Comparison:
        try:
            s_k = _logical(actual, layout, t, g)
        except ValueError as e:
            return custom("scales", False, f"scales: {e}")
        ok = (s_k >= s_lo) & (s_k <= s_hi)
        if pow2_rule:
            frac, _ = torch.frexp(s_k.double())
            ok &= frac == 0.5
        n_bad = int((~ok).sum())
        metrics = {"mismatches": n_bad, "numel": s_k.numel(), "inexact": int((bits(s_k) != bits(s_oracle)).sum()),
                   "window_groups": int((s_lo != s_hi).sum())}
        if n_bad:
            i, j = (int(k) for k in (~ok).nonzero()[0])
            return custom("scales", False, f"scales: {n_bad} of {s_k.numel()} group scales outside the window the "
                          f"activation's error bound allows; first at [{i}, {j}]: got {s_k[i, j].item()!r}, oracle "
                          f"{s_oracle[i, j].item()!r}, allowed [{s_lo[i, j].item()!r}, {s_hi[i, j].item()!r}]"
                          + (" (ue8m0: powers of two)" if pow2_rule else ""), **metrics)
        restored = to_layout(s_k, ScaleLayout(layout))
        if not torch.equal(bits(restored), bits(actual.detach().cpu())):
            return custom("scales", False, f"scales: the stored {layout} tensor differs from its logical values "
                          "re-stored in that layout (padding bytes or layout)", **metrics)
        return custom("scales", True, **metrics)

    return judge_scales


def _codes_judge(layout: str, t: int, g: int, lo: torch.Tensor, v: torch.Tensor, hi: torch.Tensor,
                 s_oracle: torch.Tensor, recipe: QuantRecipe) -> Judge:
    """Judge of the codes: with the kernel's own scales, each code within the window the activation's bound allows
    around the oracle's, and at most one step from it."""
    row_major = dataclasses.replace(recipe, layout=ScaleLayout.ROW_MAJOR)

    def judge_codes(actual: torch.Tensor, outs: Mapping[str, torch.Tensor]) -> Comparison:
        try:
            s_k = _logical(outs["scales"], layout, t, g)
        except ValueError:
            s_k = s_oracle
        s_use = torch.where(torch.isfinite(s_k) & (s_k > 0), s_k, s_oracle)
        c_lo, c_mid, c_hi = (quantize(w, row_major, scales=s_use).codes for w in (lo, v, hi))
        a = actual.detach().cpu().view(torch.uint8)
        a_ord = _ordinal(a, True)
        outside = (a_ord < _ordinal(c_lo, True)) | (a_ord > _ordinal(c_hi, True))
        far = (_ordinal(a, False) - _ordinal(c_mid, False)).abs() > 1
        bad = outside | far
        n_bad = int(bad.sum())
        metrics = {"mismatches": n_bad, "numel": a.numel(), "off_by_one": int((a != c_mid).sum()),
                   "window_elements": int((c_lo != c_hi).sum())}
        if n_bad:
            i, j = (int(k) for k in bad.nonzero()[0])
            s_ij = s_use[i, j // recipe.group_size].item()
            return custom("codes", False, f"codes: {n_bad} of {a.numel()} codes outside the window of the "
                          f"activation's error bound (or more than one step off); first at [{i}, {j}]: got "
                          f"0x{int(a[i, j]):02x}, oracle 0x{int(c_mid[i, j]):02x} (allowed 0x{int(c_lo[i, j]):02x}.."
                          f"0x{int(c_hi[i, j]):02x}) with the kernel's scale {s_ij!r}",
                          **metrics)
        return custom("codes", True, **metrics)

    return judge_codes


def draw(draw: st.DrawFn, adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    t = draw(edge_sizes(span(adapter, "T"), lim(adapter, "block_T")))  # T = 0: a boundary case
    gs = int(cell["group_size"])
    max_g = lim(adapter, "max_groups")
    n = span(adapter, "N", multiple=gs, usual=max_g * gs)
    g = draw(st.one_of(st.sampled_from([v for v in (1, 3, 4, 5, 9) if v <= max_g]),
                       st.integers(min_value=1, max_value=max_g)).map(lambda v: n.fit(v * gs) // gs))
    params = {"clamp_limit": draw(st.sampled_from(CLAMP_LIMITS))} if cell["clamp_limit"] == "Y" else {}
    params["values"] = draw(st.sampled_from(["random", "edges"]))
    return {"shapes": {"T": t, "N": g * int(cell["group_size"])}, "dtypes": {"x": cell["dtype"]}, "params": params}


def boundary(adapter: Adapter, cell: Mapping[str, str]) -> list[dict[str, Any]]:
    gs = int(cell["group_size"])
    params = {"clamp_limit": 2.5} if cell["clamp_limit"] == "Y" else {}
    return [{"shapes": {"T": t, "N": g * gs}, "dtypes": {"x": cell["dtype"]}, "params": params}
            for t, g in ((0, 1), (1, 1), (7, 5), (33, 4))]


token_subset = row_subset("T")


def _zero_groups_fields(adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    """Zero rows, zero groups and outlier rows (`inputs.edge_rows`) over five rows of three groups."""
    params = {"clamp_limit": 2.5} if cell["clamp_limit"] == "Y" else {}
    return {"shapes": {"T": 5, "N": 3 * int(cell["group_size"])}, "dtypes": {"x": cell["dtype"]},
            "params": {**params, "values": "edges"}}


def _extremes_fields(adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    """Four rows of two groups: the dtype's largest finite value, its negation, its smallest normal (`activation.
    with_extremes`), beside values within 0.5."""
    params = {"clamp_limit": 2.5} if cell["clamp_limit"] == "Y" else {}
    return {"shapes": {"T": 4, "N": 2 * int(cell["group_size"])}, "dtypes": {"x": cell["dtype"]},
            "params": {**params, "values": "extremes"}}


#: per dtype: a group whose amax is act(max) * up (about 1e38 for bf16 and fp32, 3e4 for fp16) or act(-max) = -0
#: beside it, and gates and ups at the smallest normal
DTYPE_EXTREMES = ValueClass("dtype_extremes", lambda a, c: True, ("dtype",), _extremes_fields,
                            lambda case, inputs: gen.has_extremes(inputs["x"], case.dtype("x")))

ZERO_GROUPS = ValueClass("zero_groups", lambda a, c: True, ("scale_rule",), _zero_groups_fields,
                         lambda case, inputs: gen.has_zero_unit(inputs["x"], 2 * int(case.features["group_size"])))


SPECS = {"act_quant": OpSpec(name="act_quant", title="Fused activation + per-token-group fp8 quant", axes=AXES,
                             make_inputs=make_inputs, outputs=outputs, expected=expected, draw=draw,
                             boundary=boundary, token_subset=token_subset, token_outputs=("codes", "scales"),
                             inapplicable=inapplicable, value_classes=(ZERO_GROUPS, DTYPE_EXTREMES),
                             stages=stages)}


# ---------------------------------------------------------------------------------------------------------------
# The oracle as an adapter: the self-test of this spec (declares every cell, passes exactly).


def _run_reference(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
    if case.shape("T") == 0:
        return
    by_rows(_quantize_whole, "act_quant", "T", case, inputs, outputs)


def _quantize_whole(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor], *,
                    on_device: bool) -> None:
    x = inputs["x"].detach()
    qt = quantize(activation_values(case, x if on_device else x.cpu(), {}), recipe_of(case, {}))
    outputs["codes"].view(torch.uint8).copy_(qt.codes)
    outputs["scales"].copy_(qt.scales)


REFERENCE_ADAPTERS = [Adapter(
    name="reference-act-quant", op="act_quant", source="reference", run=_run_reference,
    support={a.name: a.values for a in AXES}, properties=frozenset({"deterministic"}),
    description="reference.activations + reference.quant",
)]
