"""Op specs `routing` (plain top-k, Llama-4 top-1) and `grouped_routing` (DeepSeek grouped top-k).

Contract (docs/SEMANTICS.md §1): ids are judged as a set - any id set that is a top-k of the selection scores under
some tie-break is valid, at group level too for grouped routing (any admissible choice of tied groups), and every
row, NaN rows included, must hold k distinct ids in [0, E). Weights are judged against the oracle's unbiased scores
gathered at the *kernel's* ids, in the kernel's order, renormalized and scaled as the contract says, within a few
fp32 ulps (softmax sums over E terms). An adapter declaring `score_dtype="input"` (torch code on bf16/fp16 logits)
gets (4 + k) roundings u of that dtype more on each weight (`input_every_step`: plus u * (|logit| + 2 |logsumexp|),
an exponent logit - logsumexp rounded there), and selections may swap experts (and groups) whose selection scores
are within 4 u of the row's largest one. Rows with masked experts (-Inf logits beside finite ones) are judged like
finite rows; non-finite rows (NaN, +Inf, only -Inf) follow the adapter's `nonfinite` rule, or only their ids'
form is judged when it declares none. The declared `renormalize_eps` (sum + eps), and for grouped routing
`group_scoring` and `unkept_groups`, enter both the id check and the expected weights. A declared
`tie_break=lower_index` adds one check: a choice that differs from the oracle's only by exactly tied scores
(valid with no tolerance) must be the oracle's, which breaks ties toward the lower expert and group index. It
judges the rows whose exact ties hold in any arithmetic: experts of bit-identical logits and biases, groups of
bit-identical members (scores of different inputs that the oracle's rounding ties may not tie in the kernel's).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from hypothesis import strategies as st

from harness.core import inputs as gen
from harness.core.case import Case
from harness.core.compare import compare_bounded
from harness.core.errors import UNIT_ROUNDOFF
from harness.core.sizes import edge_sizes, span
from harness.ops.base import Axis, Check, OpSpec, OutputSpec, ValueClass
from harness.ops.common import custom, draw_experts, draw_top_k, lim, rows_where, yes
from harness.registry import Adapter
from reference import routing as ref

FLOAT_DTYPES = ("float32", "bfloat16", "float16")
# Near-tie tolerance of the selection check: kernels compute exp/sigmoid with other instructions than torch.
SELECTION_ATOL = 1e-6
# The `nonfinite` rules under which the oracle judges non-finite rows (RAISE: the oracle refuses them).
JUDGED_NONFINITE = ("zero", "propagate")

ROUTING_AXES = (
    Axis("scoring", "Scoring", ("softmax", "sigmoid", "llama4_top1")),
    Axis("renormalize", "Renormalize", ("Y", "N")),
    Axis("correction_bias", "Correction bias", ("N", "Y")),
    Axis("logits_dtype", "Logits dtype", FLOAT_DTYPES),
    Axis("nonfinite_rows", "NaN/Inf rows", ("N", "Y")),
)
GROUPED_AXES = (
    Axis("scoring", "Scoring", ("softmax", "sigmoid")),
    Axis("correction_bias", "Correction bias", ("N", "Y")),
    Axis("renormalize", "Renormalize", ("Y", "N")),
    Axis("scaling_placement", "Scaling factor in", ("weights", "reduce")),
    Axis("logits_dtype", "Logits dtype", FLOAT_DTYPES),
    Axis("nonfinite_rows", "NaN/Inf rows", ("N", "Y")),
)


def make_inputs(case: Case, device: str) -> dict[str, torch.Tensor]:
    m, e, k = case.shape("M"), case.shape("E"), case.shape("k")
    logits = gen.router_logits(case, m, e, case.dtype("router_logits"), device, k=k)
    out = {"router_logits": gen.in_layout(case, "router_logits", logits)}
    if yes(case.features.get("correction_bias", "N")):
        groups = case.params.get("num_groups", 1)
        if case.routing == "ties" and groups > 1:
            # the same coarse bias in every group: groups whose logits tie (the ties pattern copies groups) then
            # tie in their biased scores too
            b = gen.randn(case, "bias", (e // groups,), torch.float32, "cpu", scale=0.5)
            out["correction_bias"] = (torch.round(b * 8) / 8).repeat(groups).to(device)
        else:
            out["correction_bias"] = gen.randn(case, "bias", (e,), torch.float32, device, scale=0.5)
    return out


def outputs(case: Case, inputs: Mapping[str, torch.Tensor]) -> dict[str, OutputSpec]:
    m, k = case.shape("M"), case.shape("k")
    return {"topk_weights": OutputSpec((m, k), torch.float32), "topk_ids": OutputSpec((m, k), torch.int32)}


def _route_kwargs(case: Case, inputs: Mapping[str, torch.Tensor],
                  conventions: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The oracle's arguments for the case, with the adapter's routing rules (`conventions`) where declared."""
    f, p, c = case.features, case.params, conventions or {}
    kw: dict[str, Any] = {"correction_bias": inputs.get("correction_bias"),
                          "renormalize_eps": c.get("renormalize_eps") or 0.0}
    if case.op == "grouped_routing":
        kw.update(num_groups=p["num_groups"], topk_group=p["topk_group"], scoring=ref.Scoring(f["scoring"]),
                  renormalize=yes(f["renormalize"]), routed_scaling_factor=p.get("routed_scaling_factor", 1.0),
                  scaling_placement=ref.ScalingPlacement(f["scaling_placement"]),
                  group_scoring=c.get("group_scoring"), unkept_groups=c.get("unkept_groups", "excluded"))
    else:
        kw.update(scoring=ref.Scoring(f["scoring"]), renormalize=yes(f["renormalize"]))
    return kw


def selection_scores(case: Case, inputs: Mapping[str, torch.Tensor], nonfinite: str = "zero",
                     conventions: Mapping[str, Any] | None = None) -> torch.Tensor:
    logits, k = inputs["router_logits"], case.shape("k")
    if case.features["scoring"] == "llama4_top1":
        return ref.llama4_top1_selection_scores(logits, nonfinite=ref.NonFinitePolicy(nonfinite))
    kw = _route_kwargs(case, inputs, conventions)
    kw["nonfinite"] = ref.NonFinitePolicy(nonfinite)
    if case.op == "grouped_routing":
        return ref.grouped_topk_selection_scores(logits, k, **kw)
    return ref.topk_selection_scores(logits, k, **kw)


def unbiased_scores(case: Case, inputs: Mapping[str, torch.Tensor], nonfinite: str = "zero") -> torch.Tensor:
    """[M, E] unbiased scores (softmax over all E, or sigmoid), non-finite ones treated as `nonfinite` says."""
    scoring = "sigmoid" if case.features["scoring"] == "llama4_top1" else case.features["scoring"]
    return ref.topk_selection_scores(inputs["router_logits"], 1, scoring=ref.Scoring(scoring),
                                     nonfinite=ref.NonFinitePolicy(nonfinite))


def expected(case: Case, inputs: Mapping[str, torch.Tensor], conventions: Mapping[str, Any]) -> list[Check]:
    logits = inputs["router_logits"].detach().cpu()
    cpu_inputs = {n: t.detach().cpu() for n, t in inputs.items()}
    m, e, k = case.shape("M"), case.shape("E"), case.shape("k")
    # Rows with masked experts (-Inf) compute alike under every rule and are judged always; non-finite rows follow
    # the oracle's rule only where the adapter declares one (docs/SEMANTICS.md §1).
    declared = conventions.get("nonfinite")
    policy = declared if declared in JUDGED_NONFINITE else "zero"
    judged_rows = ref.finite_or_masked_rows(logits) | torch.tensor(declared in JUDGED_NONFINITE)
    sel = selection_scores(case, cpu_inputs, policy, conventions)  # also checks the declared rules' values
    scores = unbiased_scores(case, cpu_inputs, policy).to(torch.float64)
    # score_dtype="input": scores, sums and quotients rounded to the logits' dtype (u each); selections may swap
    # experts whose scores are within that rounding, weights carry a few such roundings
    in_dtype = conventions.get("score_dtype", "float32") != "float32"
    u_in = UNIT_ROUNDOFF[str(logits.dtype).removeprefix("torch.")] if in_dtype else 0.0
    finite_sel = sel[sel.isfinite()]
    sel_atol = SELECTION_ATOL + 4 * u_in * (float(finite_sel.abs().max()) if finite_sel.numel() else 0.0)
    renorm = case.features.get("renormalize") == "Y" and case.features["scoring"] != "llama4_top1"
    placed = case.features.get("scaling_placement") == "weights"
    scale = case.params.get("routed_scaling_factor", 1.0) if placed else 1.0

    def judge_ids(ids: torch.Tensor, _: Mapping[str, torch.Tensor]) -> Any:
        ids = ids.detach().cpu()
        ok = ref.routing_ids_well_formed(ids, e)
        if not ok.all():
            bad = rows_where(~ok)
            return custom("topk_ids", False, f"topk_ids: {int((~ok).sum())} rows hold duplicate or out-of-range ids "
                          f"(E={e}); first row {bad[0]}: {ids[bad[0]].tolist()}", bad_rows=int((~ok).sum()))
        if case.op == "grouped_routing":
            valid = ref.valid_grouped_topk_selection(logits, ids, **_route_kwargs(case, cpu_inputs, conventions),
                                                     nonfinite=ref.NonFinitePolicy(policy), atol=sel_atol)
        else:
            valid = ref.valid_topk_selection(sel, ids, atol=sel_atol)
        valid = valid | ~judged_rows
        if not valid.all():
            r = rows_where(~valid)[0]
            best = sel[r].topk(k).indices.tolist()
            return custom("topk_ids", False, f"topk_ids: {int((~valid).sum())} of {m} rows select experts that are "
                          f"not the top-{k}; first row {r}: got {sorted(ids[r].tolist())}, a valid choice is "
                          f"{sorted(best)}", bad_rows=int((~valid).sum()))
        if conventions.get("tie_break", "any") == "lower_index":
            return _judge_tie_break(case, cpu_inputs, conventions, sel, ids, judged_rows, policy)
        return custom("topk_ids", True)

    def judge_weights(w: torch.Tensor, outs: Mapping[str, torch.Tensor]) -> Any:
        ids = outs["topk_ids"].detach().cpu().to(torch.int64).clamp(0, max(e - 1, 0))
        want = scores.gather(1, ids) if m else torch.zeros((0, k), dtype=torch.float64)
        if renorm:
            want = _renormalized(want, policy, conventions.get("renormalize_eps") or 0.0)
        want = want * scale
        # exp/sigmoid in a few fp32 ulps, softmax sums E terms, renormalize sums k: a random-walk bound.
        ulps = 16 + 4 * math.sqrt(e) + 4 * math.sqrt(k)
        # in the logits' dtype: the score, the k-term sum, the quotient and the scaling each rounded once more, and
        # an exponent such as logit - logsumexp rounded there moves exp() by u * (|logit| + 2 |lse|) relative
        rel = ulps * UNIT_ROUNDOFF["float32"] + (4 + k) * u_in
        if u_in and m and conventions.get("score_dtype") == "input_every_step":
            x = torch.nan_to_num(logits.double(), nan=0.0, posinf=0.0, neginf=0.0)
            lse = torch.logsumexp(x, dim=1, keepdim=True).abs()
            rel = rel + u_in * (x.gather(1, ids).abs() + 2 * lse)
        # a NaN expected weight must be matched by a NaN: bound 0 there (a NaN bound would accept anything)
        bound = torch.where(want.isfinite(), rel * want.abs() + 1e-30, torch.zeros_like(want))
        return compare_bounded("topk_weights", w, want, bound, mask=judged_rows[:, None].expand(m, k))

    return [Check("topk_ids", "custom", judge=judge_ids), Check("topk_weights", "custom", judge=judge_weights)]


def _judge_tie_break(case: Case, inputs: Mapping[str, torch.Tensor], conventions: Mapping[str, Any],
                     sel: torch.Tensor, ids: torch.Tensor, judged_rows: torch.Tensor, policy: str) -> Any:
    """The declared lower-index tie rule: rows whose choice is valid with no tolerance (a swap of exactly tied
    scores at most) must choose what the lower-index rule chooses. Only rows whose exact ties all come from
    identical inputs are judged: those tie in any arithmetic, while scores that round to the same value from
    different logits (saturated sigmoids, one-ulp nudges) may differ in the kernel's."""
    judged_rows = judged_rows & _ties_from_identical_inputs(case, inputs, policy)
    if case.op == "grouped_routing":
        judged_rows = judged_rows & _group_ties_from_identical_groups(case, inputs, conventions, policy)
        exact = ref.valid_grouped_topk_selection(inputs["router_logits"], ids,
                                                 **_route_kwargs(case, inputs, conventions),
                                                 nonfinite=ref.NonFinitePolicy(policy))
    else:
        exact = ref.valid_topk_selection(sel, ids)
    ok = ref.breaks_ties_toward_lower_index(sel, ids, valid_exactly=exact) | ~judged_rows
    if ok.all():
        return custom("topk_ids", True)
    r = rows_where(~ok)[0]
    lower = torch.sort(sel[r], descending=True, stable=True).indices[: ids.shape[1]]
    return custom("topk_ids", False, f"topk_ids: {int((~ok).sum())} rows break exact ties away from the lower "
                  f"expert index (declared tie_break=lower_index); first row {r}: got {sorted(ids[r].tolist())}, the "
                  f"lower-index choice is {sorted(lower.tolist())}", bad_rows=int((~ok).sum()))


def _input_keys(logits: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """[M, E, 2] float64: each expert's logit and correction bias (0 without one), what an exact tie must share to
    hold in any arithmetic."""
    key = logits.detach().cpu().to(torch.float64)
    b = torch.zeros_like(key) if bias is None else bias.detach().cpu().to(torch.float64)[None, :].expand_as(key)
    return torch.stack([key, b], dim=-1)


def _ties_from_identical_inputs(case: Case, inputs: Mapping[str, torch.Tensor], policy: str) -> torch.Tensor:
    """Per row: every run of exactly equal (biased, ungrouped) scores holds experts of bit-identical logits and
    correction biases. The scores are the oracle's, biased in its compute dtype as it adds them: a tie its rounding
    makes from different inputs (an fp32 sum) is one another arithmetic need not make."""
    logits = inputs["router_logits"].detach().cpu()
    m, e = logits.shape
    if m == 0 or e < 2:
        return torch.ones(m, dtype=torch.bool)
    llama4 = case.features.get("scoring") == "llama4_top1"
    bias = None if llama4 else inputs.get("correction_bias")
    key = _input_keys(logits, bias)
    pre = logits if llama4 else unbiased_scores(case, inputs, policy)
    if bias is not None:
        pre = pre + bias.detach().cpu().to(pre.dtype)[None, :]
    pre = pre.to(torch.float64)
    order = torch.sort(pre, dim=1, stable=True).indices
    s = pre.gather(1, order)
    k = key.gather(1, order[..., None].expand(m, e, 2))
    tied = (s[:, 1:] == s[:, :-1]) & s[:, 1:].isfinite()
    same = (k[:, 1:] == k[:, :-1]).all(dim=-1)
    return ~(tied & ~same).any(dim=1)


def _group_ties_from_identical_groups(case: Case, inputs: Mapping[str, torch.Tensor],
                                      conventions: Mapping[str, Any], policy: str) -> torch.Tensor:
    """Per row: every exact tie of the oracle's group scores is between groups of bit-identical logits and biases
    (as multisets). Groups of different inputs may tie after the oracle's rounding and not after the kernel's
    (sums of sigmoids an ulp apart), and then the kernel keeps another group with no tie to break."""
    logits = inputs["router_logits"].detach().cpu()
    groups = case.params["num_groups"]
    m, e = logits.shape
    if m == 0 or groups < 2:
        return torch.ones(m, dtype=torch.bool)
    kw = {**_route_kwargs(case, inputs, conventions), "nonfinite": ref.NonFinitePolicy(policy)}
    scores = ref.grouped_topk_group_scores(logits, case.shape("k"), **kw).to(torch.float64)
    keys = _input_keys(logits, inputs.get("correction_bias")).reshape(m, groups, e // groups, 2)
    for column in (1, 0):  # stable sorts by bias, then by logit: each group's pairs in (logit, bias) order
        order = torch.sort(keys[..., column], dim=-1, stable=True).indices
        keys = keys.gather(2, order[..., None].expand_as(keys))
    tied = (scores[:, :, None] == scores[:, None, :]) & scores[:, :, None].isfinite()
    # NaN logits (PROPAGATE) compare unequal to themselves: such groups count as different
    same = (keys[:, :, None] == keys[:, None, :]).flatten(3).all(dim=-1)
    return ~(tied & ~same).any(dim=(1, 2))


def _renormalized(want: torch.Tensor, policy: str, eps: float) -> torch.Tensor:
    """The k weights of each row divided by their sum as the declared rules say (docs/SEMANTICS.md §1)."""
    total = want.sum(dim=1, keepdim=True)
    if eps > 0:  # sum + eps: a zero sum gives zeros, NaN propagates
        return want / (total + eps)
    if policy == "propagate":
        return want / total  # NaN and 0/0 propagate, as the declared rule says
    return torch.where(total > 0, want / torch.where(total > 0, total, 1.0), torch.zeros_like(want))


def stages(case: Case, inputs: Mapping[str, torch.Tensor], conventions: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The scores the oracle selects by (bias and grouping applied) and the unbiased scores the weights come from."""
    cpu = {n: t.detach().cpu() for n, t in inputs.items()}
    policy = conventions.get("nonfinite") if conventions.get("nonfinite") in JUDGED_NONFINITE else "zero"
    return {"selection_scores": selection_scores(case, cpu, policy, conventions),
            "scores": unbiased_scores(case, cpu, policy)}


def _grouping(draw: st.DrawFn, e: int, biased: bool, most: int | None) -> tuple[int, int]:
    divisors = [g for g in range(1, e + 1) if e % g == 0 and (not biased or e // g >= 2) and g <= (most or e)]
    g = draw(st.sampled_from(divisors))
    return g, draw(st.integers(min_value=1, max_value=g))


#: (E, groups, kept groups, k) of production routers: DeepSeek-V3, DeepSeek-V2 (groups of 20), Kimi K2, Qwen3-MoE
MODEL_SHAPES = ((256, 8, 4, 8), (160, 8, 3, 6), (384, 1, 1, 8), (128, 1, 1, 8))


def _model_shapes(adapter: Adapter, grouped: bool) -> list[tuple[int, int, int, int]]:
    """The production shapes the adapter's limits allow (their E past the small scale's default budget: routing
    costs little per expert); plain routing takes them ungrouped."""
    most = max(s[0] for s in MODEL_SHAPES)
    return [s if grouped else (s[0], 1, 1, s[3]) for s in MODEL_SHAPES
            if span(adapter, "E", usual=most).allows(s[0]) and span(adapter, "k", hi=32).allows(s[3])]


def draw(draw: st.DrawFn, adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    grouped = "scaling_placement" in cell
    biased = yes(cell.get("correction_bias", "N"))
    llama4 = cell["scoring"] == "llama4_top1"
    shapes = _model_shapes(adapter, grouped)
    params: dict[str, Any] = {}
    # one draw in four: the shapes the kernels are built for, where the limits allow them
    if shapes and draw(st.integers(0, 3)) == 0:
        e, g, tg, k = draw(st.sampled_from(shapes))
        k = 1 if llama4 else k
    else:
        e = draw_experts(draw, adapter, multiple=2 if biased and grouped else 1)
        g, tg = _grouping(draw, e, biased, lim(adapter, "max_num_groups")) if grouped else (1, 1)
        k = 1 if llama4 else draw_top_k(draw, adapter, tg * (e // g))
    if grouped:
        params.update(num_groups=g, topk_group=tg,
                      routed_scaling_factor=draw(st.sampled_from([1.0, 2.5])))
    m = draw(edge_sizes(span(adapter, "M"), lim(adapter, "block_M")))  # M = 0: a boundary case
    patterns = ["random", "skewed", "one_expert", "some_empty", "ties", "extreme"]
    routing = "nonfinite" if yes(cell["nonfinite_rows"]) else draw(st.sampled_from(patterns))
    if routing == "nonfinite":
        params["values"] = draw(st.sampled_from(["random", "every_kind"]))
    return {"shapes": {"M": m, "E": e, "k": k}, "dtypes": {"router_logits": cell["logits_dtype"]},
            "routing": routing, "params": params}


def boundary(adapter: Adapter, cell: Mapping[str, str]) -> list[dict[str, Any]]:
    grouped = "scaling_placement" in cell
    llama4 = cell["scoring"] == "llama4_top1"
    rout = "nonfinite" if yes(cell["nonfinite_rows"]) else "random"
    dt = {"router_logits": cell["logits_dtype"]}
    found = []
    block = lim(adapter, "block_M")
    for m, e, k, g, tg in ((1, 8, 2, 4, 2), (block + 1, 16, 4, 4, 2), (0, 8, 1, 2, 1), (block - 1, 64, 8, 8, 4),
                           (33, 256, 8, 8, 4)):
        if e > lim(adapter, "max_E"):
            continue
        k = 1 if llama4 else k
        params = {"num_groups": g, "topk_group": tg, "routed_scaling_factor": 2.5} if grouped else {}
        found.append({"shapes": {"M": m, "E": e, "k": k}, "dtypes": dt, "routing": rout, "params": params})
    if not grouped and not yes(cell["nonfinite_rows"]):
        found.append({"shapes": {"M": 9, "E": 12, "k": 1 if llama4 else 3}, "dtypes": dt, "routing": "ties"})
    elif grouped and not yes(cell["nonfinite_rows"]):
        # tied and near-tied groups (copies, one-ulp nudges, saturated sigmoids), at two group sizes
        for m, e, k, g, tg in ((block + 1, 16, 4, 4, 2), (17, 64, 8, 8, 4)):
            if e <= lim(adapter, "max_E"):
                params = {"num_groups": g, "topk_group": tg, "routed_scaling_factor": 2.5}
                found.append({"shapes": {"M": m, "E": e, "k": k}, "dtypes": dt, "routing": "ties", "params": params})
    return found


def _nonfinite_fields(adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    """Eight rows cycling through a masked row, a NaN row, a +inf row and an all -inf row."""
    grouped = "scaling_placement" in cell
    params: dict[str, Any] = {"values": "every_kind"}
    if grouped:
        params.update(num_groups=4, topk_group=2, routed_scaling_factor=2.5)
    k = 1 if cell["scoring"] == "llama4_top1" else 4
    return {"shapes": {"M": 8, "E": 16, "k": k}, "dtypes": {"router_logits": cell["logits_dtype"]},
            "routing": "nonfinite", "params": params}


def _every_nonfinite_kind(case: Case, inputs: Mapping[str, torch.Tensor]) -> bool:
    x = inputs["router_logits"].detach().cpu().float()
    kinds = (x.isnan().any(dim=1), (x == float("inf")).any(dim=1), (x == float("-inf")).all(dim=1),
             (x == float("-inf")).any(dim=1) & x.isfinite().any(dim=1))
    return all(bool(k.any()) for k in kinds)


NONFINITE_ROWS = ValueClass("nonfinite_rows", lambda a, c: yes(c["nonfinite_rows"]), ("scoring",),
                            _nonfinite_fields, _every_nonfinite_kind)


def _fields_of(cell: Mapping[str, str], m: int, e: int, k: int, group: tuple[int, int], routing: str) -> dict[str, Any]:
    """A case of `cell` with M, E, k, (groups, kept groups) for grouped routing, and a routing pattern."""
    params = ({"num_groups": group[0], "topk_group": group[1], "routed_scaling_factor": 2.5}
              if "scaling_placement" in cell else {})
    k = 1 if cell["scoring"] == "llama4_top1" else k
    return {"shapes": {"M": m, "E": e, "k": k}, "dtypes": {"router_logits": cell["logits_dtype"]},
            "routing": routing, "params": params}


def _extreme_present(case: Case, inputs: Mapping[str, torch.Tensor]) -> bool:
    """Some finite logit past exp's overflow and one at the dtype's largest finite value."""
    x = inputs["router_logits"].detach().cpu()
    big = x.isfinite() & (x.float().abs() > gen.EXP_OVERFLOW)
    return bool(big.any() and (x == torch.finfo(x.dtype).max).any())


def _saturated_present(case: Case, inputs: Mapping[str, torch.Tensor]) -> bool:
    """A row with several sigmoids of exactly 1.0 in fp32 (tied) and a row of only tiny non-zero sigmoids
    (`inputs.TINY_SIGMOID_LOGITS`)."""
    x = inputs["router_logits"].detach().cpu().float()
    tied_at_one = ((torch.sigmoid(x) == 1.0).sum(dim=1) >= 2).any()
    lo, hi = gen.TINY_SIGMOID_LOGITS
    return bool(tied_at_one and ((x >= lo) & (x <= hi)).all(dim=1).any())


def _odd_width_present(case: Case, inputs: Mapping[str, torch.Tensor]) -> bool:
    """Groups whose width (E / groups) is not a power of two, some of them left out."""
    g, e = case.params.get("num_groups", 1), case.shape("E")
    width = e // g
    return g > 1 and case.params.get("topk_group", g) < g and width & (width - 1) != 0


def _unfinite_cell(a: Adapter, c: Mapping[str, str]) -> bool:
    return not yes(c["nonfinite_rows"])


#: logits past exp's overflow and at the dtype's largest finite value (saturated sigmoids, exactly-zero scores)
LARGE_LOGITS = ValueClass("large_logits", _unfinite_cell, ("logits_dtype",),
                          lambda a, c: _fields_of(c, 8, 16, 4, (4, 2), "extreme"), _extreme_present)
#: sigmoid scores tied at exactly 1.0 and rows of tiny non-zero ones, which renormalize to ordinary weights (not
#: renormalized, an error on them is below any bound), with and without a correction bias picking among them
SATURATED_SIGMOIDS = ValueClass("saturated_sigmoids", lambda a, c: _unfinite_cell(a, c) and c["scoring"] == "sigmoid"
                                and yes(c["renormalize"]), ("correction_bias",),
                                lambda a, c: _fields_of(c, 10, 16, 4, (4, 2), "extreme"), _saturated_present)
#: Kimi K2's 384 experts, top-8 (ids past 127 and 255), in groups of 48 for grouped routing
MANY_EXPERTS = ValueClass("many_experts", _unfinite_cell, (), lambda a, c: _fields_of(c, 5, 384, 8, (8, 4), "random"),
                          lambda case, inputs: inputs["router_logits"].shape[1] > 256, sized=True)
#: DeepSeek-V2's groups of 20 (padded to 32 in a power-of-two tile)
ODD_GROUP_WIDTH = ValueClass("odd_group_width", _unfinite_cell, (),
                             lambda a, c: _fields_of(c, 9, 160, 6, (8, 3), "random"), _odd_width_present, sized=True)


def token_subset(case: Case, inputs: Mapping[str, torch.Tensor], rows: slice) -> tuple[Case, dict[str, torch.Tensor]]:
    sub = dict(inputs)
    sub["router_logits"] = inputs["router_logits"][rows]
    n = sub["router_logits"].shape[0]
    return case.replace(shapes={**case.shapes, "M": n}), sub


def invalid(case: Case) -> str | None:
    """Sizes no routing can take: k past E, and for grouped routing groups that do not divide E or keep fewer than
    k experts."""
    e, k = case.shape("E"), case.shape("k")
    if k > e:
        return f"k={k} > E={e}"
    g, tg = case.params.get("num_groups"), case.params.get("topk_group")
    if g is None or tg is None:
        return None
    if e % g or k > tg * (e // g):
        return f"E={e} in {g} groups keeping {tg} cannot hold k={k}"
    return None


def _spec(name: str, title: str, axes: tuple[Axis, ...], classes: tuple[ValueClass, ...]) -> OpSpec:
    return OpSpec(name=name, title=title, axes=axes, make_inputs=make_inputs, outputs=outputs, expected=expected,
                  draw=draw, boundary=boundary, token_subset=token_subset, token_outputs=("topk_weights", "topk_ids"),
                  value_classes=(NONFINITE_ROWS, *classes), stages=stages, invalid=invalid)


SPECS = {
    "routing": _spec("routing", "Top-k routing", ROUTING_AXES, (LARGE_LOGITS, SATURATED_SIGMOIDS, MANY_EXPERTS)),
    "grouped_routing": _spec("grouped_routing", "Grouped top-k routing", GROUPED_AXES,
                             (LARGE_LOGITS, SATURATED_SIGMOIDS, MANY_EXPERTS, ODD_GROUP_WIDTH)),
}
