"""Routing oracle: which k experts each token goes to, and with what weight (docs/SEMANTICS.md §1).

Every function takes `router_logits [M, E]` (fp16, bf16, fp32 or fp64) and computes in fp32, or in fp64 when
the logits are fp64. Routing functions return `(topk_weights [M, k] fp32, topk_ids [M, k] int32)`; M = 0 gives
empty outputs. Scores (softmax probabilities, sigmoids) and the renormalization sum are evaluated in float64
and rounded once to the compute dtype, with sums in a fixed order: results depend on the logits' values only,
never on their strides or on how the rows are batched.

Ties. The oracle breaks ties deterministically toward the lower expert index, and returns each row's ids in
descending order of selection score (ties: ascending id). Neither is part of the contract: production kernels
break ties differently (vLLM's CUDA kernel prefers the lower index, `torch.topk` is unspecified). The contract
is set semantics, so every routing function has a companion `*_selection_scores` returning the `[M, E]` scores
the selection was made on (biased scores; experts excluded by group masking at -inf). A kernel's id set is
valid iff `valid_topk_selection(selection_scores, ids)` holds: its selected scores are, as a multiset, the
k largest of the row. Weights are then compared gathered in the kernel's own order.

Non-finite logits (padding rows of CUDA graphs) are implementation-defined in production; the oracle's rule is
the `NonFinitePolicy` argument (default `ZERO`, see there). Whatever the rule, `routing_ids_well_formed` states
the minimum a kernel owes such rows: no duplicate ids and every id in [0, E).
"""

from __future__ import annotations

import enum
import math

import torch

from reference._checks import FLOAT_DTYPES, INT_INDEX_DTYPES, check_choice, check_int, check_tensor

__all__ = [
    "NonFinitePolicy",
    "ScalingPlacement",
    "Scoring",
    "SoftmaxOrder",
    "grouped_topk_route",
    "grouped_topk_selection_scores",
    "llama4_top1_route",
    "llama4_top1_selection_scores",
    "routing_ids_well_formed",
    "topk_route",
    "topk_selection_scores",
    "valid_topk_selection",
]


class Scoring(str, enum.Enum):
    """How logits become scores: softmax over all E experts, or elementwise sigmoid `1/(1+exp(-x))`."""

    SOFTMAX = "softmax"
    SIGMOID = "sigmoid"


class SoftmaxOrder(str, enum.Enum):
    """Where the softmax sits relative to the top-k selection (softmax scoring only).

    - `SOFTMAX_THEN_TOPK`: softmax over all E experts, select the k largest probabilities; the weights are
      those probabilities (optionally renormalized over the k).
    - `TOPK_THEN_SOFTMAX`: select the k largest *logits*, softmax over those k only (FlashInfer's
      "Renormalize" routing). Equal in exact arithmetic to SOFTMAX_THEN_TOPK with renormalize, different
      in the last bits; the weights always sum to 1, so `renormalize` must be True with it.
    """

    SOFTMAX_THEN_TOPK = "softmax_then_topk"
    TOPK_THEN_SOFTMAX = "topk_then_softmax"


class ScalingPlacement(str, enum.Enum):
    """Where grouped routing's `routed_scaling_factor` is applied.

    - `WEIGHTS`: multiplied into the returned weights (vLLM, FlashInfer).
    - `REDUCE`: the weights are returned unscaled; the unpermute-reduce multiplies each token's summed output
      by the factor (SGLang). The routing oracle only validates the factor in this case.
    """

    WEIGHTS = "weights"
    REDUCE = "reduce"


class NonFinitePolicy(str, enum.Enum):
    """What the oracle does with NaN / +-Inf logits.

    - `ZERO` (vLLM's current CUDA kernel): every non-finite *score* (probability or sigmoid) is replaced by 0
      before selection and in the weights. With softmax one NaN or +Inf logit makes the whole row NaN, so the
      row's scores are all 0: ids are 0..k-1 (ties to the lower index) and weights are 0 (with a correction
      bias, the bias alone then decides the selection; weights stay 0). With sigmoid only the NaN experts get
      score 0 (sigmoid(+-Inf) = 1 or 0 is finite). Where the selection is made on raw logits
      (`TOPK_THEN_SOFTMAX`, Llama4), a NaN logit ranks as -Inf; non-finite weights computed afterwards are
      replaced by 0. For finite logits ZERO changes nothing.
    - `RAISE`: any non-finite logit raises ValueError (for callers that must never see such rows).
    """

    ZERO = "zero"
    RAISE = "raise"


# ----------------------------------------------------------------------------------------------- helpers


def _logits(router_logits: object, nonfinite: object) -> tuple[torch.Tensor, NonFinitePolicy]:
    """Validate the logits and the policy; return the logits in the compute dtype (fp32, or fp64)."""
    t = check_tensor("router_logits", router_logits, ndim=2, dtypes=FLOAT_DTYPES)
    if t.shape[1] < 1:
        raise ValueError(f"router_logits must have at least one expert column, got shape {list(t.shape)}")
    policy = NonFinitePolicy(check_choice("nonfinite", nonfinite, list(NonFinitePolicy)))
    if policy is NonFinitePolicy.RAISE and not bool(torch.isfinite(t).all()):
        raise ValueError("router_logits contains NaN or Inf and nonfinite=RAISE")
    compute = torch.float64 if t.dtype == torch.float64 else torch.float32
    return t.to(compute), policy


def _k(k: object, num_experts: int) -> int:
    check_int("k", k, min_value=1)
    if k > num_experts:  # type: ignore[operator]
        raise ValueError(f"k must be <= the number of experts E={num_experts}, got {k}")
    return k  # type: ignore[return-value]


def _bias(correction_bias: object, num_experts: int, compute: torch.dtype) -> torch.Tensor | None:
    """fp32 [E] (fp64 also accepted when the logits are fp64), finite; returned in the compute dtype."""
    if correction_bias is None:
        return None
    allowed = (torch.float32, torch.float64) if compute == torch.float64 else (torch.float32,)
    b = check_tensor("correction_bias", correction_bias, dtypes=allowed, shape=[num_experts])
    if not bool(torch.isfinite(b).all()):
        raise ValueError("correction_bias must be finite")
    return b.to(compute)


def _row_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim (keepdim) by pairwise halving: a fixed order of elementwise adds, so the result does
    not depend on the layout (torch's reduction kernels pick their order by stride and length)."""
    while t.shape[-1] > 1:
        if t.shape[-1] % 2:
            t = torch.cat([t, torch.zeros_like(t[..., :1])], dim=-1)  # + 0 is exact
        half = t.shape[-1] // 2
        t = t[..., :half] + t[..., half:]
    return t


def _scores(x: torch.Tensor, scoring: Scoring) -> torch.Tensor:
    """Softmax over the last dim as exp(x - max) / sum(exp(x - max)), or sigmoid as 1 / (1 + exp(-x)).

    Evaluated in float64 and rounded once to x's dtype (for fp32: each score correctly rounded, up to float64's
    own ~1e-16 error), with a fixed-order sum: the same bits for every layout, batch size and split of the rows.
    """
    x64 = x.to(torch.float64)
    if scoring is Scoring.SOFTMAX:
        e = torch.exp(x64 - x64.max(dim=-1, keepdim=True).values)
        return (e / _row_sum(e)).to(x.dtype)
    return (1.0 / (1.0 + torch.exp(-x64))).to(x.dtype)


def _zero_nonfinite(t: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(t), t, torch.zeros_like(t))


def _nan_to_neg_inf(t: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isnan(t), torch.full_like(t, -math.inf), t)


def _topk_lower_index(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest entries per row, descending, ties toward the lower index (no NaN allowed).

    A stable descending sort keeps equal values in ascending index order, which is the tie rule.
    """
    return torch.sort(values, dim=-1, descending=True, stable=True).indices[:, :k]


def _renormalize(w: torch.Tensor) -> torch.Tensor:
    """Divide each row by its sum (the sum formed in float64 in a fixed order and rounded once to w's dtype, then
    one division). A zero sum (all k weights 0, e.g. a NaN row under ZERO) returns the row unchanged, i.e. zeros,
    instead of 0/0."""
    s = _row_sum(w.to(torch.float64)).to(w.dtype)
    return w / torch.where(s > 0, s, torch.ones_like(s))


def _finalize(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return weights.to(torch.float32).contiguous(), ids.to(torch.int32).contiguous()


# --------------------------------------------------------------------------------------------- plain top-k


def _topk(
    router_logits: object,
    k: object,
    scoring: object,
    renormalize: object,
    correction_bias: object,
    order: object,
    nonfinite: object,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x, policy = _logits(router_logits, nonfinite)
    num_experts = x.shape[1]
    k = _k(k, num_experts)
    scoring = Scoring(check_choice("scoring", scoring, list(Scoring)))
    order = SoftmaxOrder(check_choice("order", order, list(SoftmaxOrder)))
    if not isinstance(renormalize, bool):
        raise ValueError(f"renormalize must be a bool, got {type(renormalize).__name__}")
    bias = _bias(correction_bias, num_experts, x.dtype)

    if order is SoftmaxOrder.TOPK_THEN_SOFTMAX:
        if scoring is not Scoring.SOFTMAX:
            raise ValueError(f"order={order.value!r} requires scoring='softmax', got {scoring.value!r}")
        if bias is not None:
            raise ValueError(f"correction_bias is not supported with order={order.value!r}")
        if not renormalize:
            raise ValueError(
                f"renormalize must be True with order={order.value!r} (its weights always sum to 1)"
            )
        selection = _nan_to_neg_inf(x) if policy is NonFinitePolicy.ZERO else x
        ids = _topk_lower_index(selection, k)
        weights = _scores(x.gather(1, ids), Scoring.SOFTMAX)
        weights = _zero_nonfinite(weights) if policy is NonFinitePolicy.ZERO else weights
        return (*_finalize(weights, ids), selection)

    scores = _scores(x, scoring)
    if policy is NonFinitePolicy.ZERO:
        scores = _zero_nonfinite(scores)
    selection = scores if bias is None else scores + bias
    ids = _topk_lower_index(selection, k)
    weights = scores.gather(1, ids)  # the unbiased scores: the bias only selects
    if renormalize:
        weights = _renormalize(weights)
    return (*_finalize(weights, ids), selection)


def topk_route(
    router_logits: torch.Tensor,
    k: int,
    *,
    scoring: Scoring = Scoring.SOFTMAX,
    renormalize: bool = False,
    correction_bias: torch.Tensor | None = None,
    order: SoftmaxOrder = SoftmaxOrder.SOFTMAX_THEN_TOPK,
    nonfinite: NonFinitePolicy = NonFinitePolicy.ZERO,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain top-k routing (Mixtral, Qwen-MoE, ...).

    Args:
        router_logits: [M, E], fp16/bf16/fp32/fp64; computed in fp32 (fp64 if the logits are fp64).
        k: experts per token, 1 <= k <= E.
        scoring: SOFTMAX (over all E, as exp(x - max) / sum) or SIGMOID (1 / (1 + exp(-x))).
        renormalize: divide the k weights by their sum (a zero sum returns zeros). Must be True with
            order=TOPK_THEN_SOFTMAX, whose weights sum to 1 by construction (no second division is done).
        correction_bias: optional [E] fp32 (fp64 allowed for fp64 logits), finite; added to the scores for the
            selection only. The returned weights are the unbiased scores of the selected experts.
            Not allowed with TOPK_THEN_SOFTMAX.
        order: SOFTMAX_THEN_TOPK (default) or TOPK_THEN_SOFTMAX (softmax scoring only), see `SoftmaxOrder`.
        nonfinite: rule for NaN/Inf logits, see `NonFinitePolicy` (default ZERO).

    Returns:
        (topk_weights [M, k] fp32, topk_ids [M, k] int32), both contiguous, each row in descending order of
        selection score, ties toward the lower expert index (the contract is set semantics, see module doc).
    """
    w, ids, _ = _topk(router_logits, k, scoring, renormalize, correction_bias, order, nonfinite)
    return w, ids


def topk_selection_scores(
    router_logits: torch.Tensor,
    k: int,
    *,
    scoring: Scoring = Scoring.SOFTMAX,
    renormalize: bool = False,
    correction_bias: torch.Tensor | None = None,
    order: SoftmaxOrder = SoftmaxOrder.SOFTMAX_THEN_TOPK,
    nonfinite: NonFinitePolicy = NonFinitePolicy.ZERO,
) -> torch.Tensor:
    """The [M, E] scores `topk_route` (same arguments) selects on, in the compute dtype (fp32, or fp64).

    SOFTMAX_THEN_TOPK / SIGMOID: the scores (non-finite ones zeroed under ZERO) plus the correction bias.
    TOPK_THEN_SOFTMAX: the logits themselves (a NaN as -Inf under ZERO). Feed to `valid_topk_selection`.
    """
    return _topk(router_logits, k, scoring, renormalize, correction_bias, order, nonfinite)[2]


# ------------------------------------------------------------------------------------------- grouped top-k


def _grouped(
    router_logits: object,
    k: object,
    num_groups: object,
    topk_group: object,
    scoring: object,
    correction_bias: object,
    renormalize: object,
    routed_scaling_factor: object,
    scaling_placement: object,
    nonfinite: object,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x, policy = _logits(router_logits, nonfinite)
    m, num_experts = x.shape
    k = _k(k, num_experts)
    num_groups = check_int("num_groups", num_groups, min_value=1)
    if num_experts % num_groups != 0:
        raise ValueError(f"num_groups must divide the number of experts E={num_experts}, got {num_groups}")
    per_group = num_experts // num_groups
    topk_group = check_int("topk_group", topk_group, min_value=1, max_value=num_groups)
    if k > topk_group * per_group:
        raise ValueError(
            f"k must be <= topk_group * experts per group = {topk_group} * {per_group}, got {k}"
        )
    scoring = Scoring(check_choice("scoring", scoring, list(Scoring)))
    bias = _bias(correction_bias, num_experts, x.dtype)
    if bias is not None and per_group < 2:
        raise ValueError(
            f"num_groups={num_groups} leaves {per_group} expert per group; the correction_bias path needs "
            "at least 2 experts per group (group score = sum of the top-2 biased scores)"
        )
    if not isinstance(renormalize, bool):
        raise ValueError(f"renormalize must be a bool, got {type(renormalize).__name__}")
    if (
        isinstance(routed_scaling_factor, bool)
        or not isinstance(routed_scaling_factor, (int, float))
        or not math.isfinite(routed_scaling_factor)
        or routed_scaling_factor <= 0
    ):
        raise ValueError(f"routed_scaling_factor must be a finite number > 0, got {routed_scaling_factor!r}")
    placement = ScalingPlacement(check_choice("scaling_placement", scaling_placement, list(ScalingPlacement)))

    scores = _scores(x, scoring)
    if policy is NonFinitePolicy.ZERO:
        scores = _zero_nonfinite(scores)
    biased = scores if bias is None else scores + bias

    by_group = biased.reshape(m, num_groups, per_group)
    if bias is None:
        group_scores = by_group.max(dim=-1).values
    else:
        top2 = torch.sort(by_group, dim=-1, descending=True).values
        group_scores = top2[..., 0] + top2[..., 1]
    kept_groups = _topk_lower_index(group_scores, topk_group)
    group_kept = torch.zeros(m, num_groups, dtype=torch.bool, device=x.device).scatter(1, kept_groups, True)
    expert_kept = group_kept.repeat_interleave(per_group, dim=1)
    # -inf, not 0: biased scores may be negative, and a 0 could then beat an allowed expert.
    selection = biased.masked_fill(~expert_kept, -math.inf)

    ids = _topk_lower_index(selection, k)
    weights = scores.gather(1, ids)  # unbiased
    if renormalize:
        weights = _renormalize(weights)
    if placement is ScalingPlacement.WEIGHTS:
        weights = weights * routed_scaling_factor
    return (*_finalize(weights, ids), selection)


def grouped_topk_route(
    router_logits: torch.Tensor,
    k: int,
    *,
    num_groups: int,
    topk_group: int,
    scoring: Scoring,
    correction_bias: torch.Tensor | None = None,
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
    scaling_placement: ScalingPlacement = ScalingPlacement.WEIGHTS,
    nonfinite: NonFinitePolicy = NonFinitePolicy.ZERO,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped top-k routing (DeepSeek-V2: softmax, no bias; DeepSeek-V3: sigmoid with correction bias).

    Steps, in the compute dtype (fp32, or fp64 for fp64 logits):
      1. scores = softmax over all E, or sigmoid; biased = scores + correction_bias (or scores).
      2. The E experts form `num_groups` contiguous groups of E // num_groups. Group score = max of the group's
         unbiased scores without a bias; with a bias, the sum of the group's two largest biased scores.
      3. Keep the `topk_group` best groups (ties toward the lower group index); every expert of another group
         gets selection score -Inf (not 0: biased scores can be negative).
      4. Pick the k largest selection scores (ties toward the lower expert index).
      5. weights = the unbiased scores of the picked experts; if `renormalize`, divided by their sum (a zero
         sum returns zeros); then, with scaling_placement=WEIGHTS, multiplied by `routed_scaling_factor`
         (division first, then the multiplication, each rounded). With REDUCE the weights stay unscaled and
         the reduce applies the factor.

    Args:
        router_logits: [M, E], fp16/bf16/fp32/fp64.
        k: 1 <= k <= topk_group * (E // num_groups).
        num_groups: divides E. topk_group: 1 <= topk_group <= num_groups.
        scoring: SOFTMAX or SIGMOID (required: the DeepSeek generations differ).
        correction_bias: optional [E] fp32 (fp64 allowed for fp64 logits), finite; needs >= 2 experts/group.
        renormalize: default True. routed_scaling_factor: finite, > 0, default 1.0.
        scaling_placement: WEIGHTS (default) or REDUCE, see `ScalingPlacement`.
        nonfinite: see `NonFinitePolicy` (default ZERO).

    Returns:
        (topk_weights [M, k] fp32, topk_ids [M, k] int32), rows in descending selection-score order.
    """
    w, ids, _ = _grouped(
        router_logits, k, num_groups, topk_group, scoring, correction_bias, renormalize,
        routed_scaling_factor, scaling_placement, nonfinite,
    )
    return w, ids


def grouped_topk_selection_scores(
    router_logits: torch.Tensor,
    k: int,
    *,
    num_groups: int,
    topk_group: int,
    scoring: Scoring,
    correction_bias: torch.Tensor | None = None,
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
    scaling_placement: ScalingPlacement = ScalingPlacement.WEIGHTS,
    nonfinite: NonFinitePolicy = NonFinitePolicy.ZERO,
) -> torch.Tensor:
    """The [M, E] selection scores of `grouped_topk_route` (same arguments), in the compute dtype: biased
    scores for experts in kept groups, -Inf for the masked ones. Feed to `valid_topk_selection`.

    Note: under ties between *group* scores the kept groups themselves are a choice; these scores encode the
    oracle's choice (lower group index)."""
    return _grouped(
        router_logits, k, num_groups, topk_group, scoring, correction_bias, renormalize,
        routed_scaling_factor, scaling_placement, nonfinite,
    )[2]


# ------------------------------------------------------------------------------------------------ Llama 4


def _llama4(router_logits: object, nonfinite: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x, policy = _logits(router_logits, nonfinite)
    selection = _nan_to_neg_inf(x) if policy is NonFinitePolicy.ZERO else x
    ids = _topk_lower_index(selection, 1)
    weights = _scores(x.gather(1, ids), Scoring.SIGMOID)
    if policy is NonFinitePolicy.ZERO:
        weights = _zero_nonfinite(weights)
    return (*_finalize(weights, ids), selection)


def llama4_top1_route(
    router_logits: torch.Tensor, *, nonfinite: NonFinitePolicy = NonFinitePolicy.ZERO
) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama 4 routing: top-1 on the raw logits (ties toward the lower index), weight = sigmoid(logit)
    computed as 1 / (1 + exp(-x)) in fp32 (fp64 for fp64 logits), no renormalization. Used with
    apply-router-weight-on-input.

    Returns (topk_weights [M, 1] fp32, topk_ids [M, 1] int32). `nonfinite`: see `NonFinitePolicy`.
    """
    w, ids, _ = _llama4(router_logits, nonfinite)
    return w, ids


def llama4_top1_selection_scores(
    router_logits: torch.Tensor, *, nonfinite: NonFinitePolicy = NonFinitePolicy.ZERO
) -> torch.Tensor:
    """The [M, E] selection scores of `llama4_top1_route`: the logits in the compute dtype (NaN as -Inf
    under ZERO)."""
    return _llama4(router_logits, nonfinite)[2]


# ------------------------------------------------------------------------------------- checking a kernel


def _ids(ids: object, rows: int | None = None) -> torch.Tensor:
    t = check_tensor("ids", ids, ndim=2, dtypes=INT_INDEX_DTYPES)
    if rows is not None and t.shape[0] != rows:
        raise ValueError(f"ids must have {rows} rows (one per token), got shape {list(t.shape)}")
    return t.to(torch.int64)


def _rows_well_formed(ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    in_range = ((ids >= 0) & (ids < num_experts)).all(dim=1)
    s = torch.sort(ids, dim=1).values
    distinct = (s[:, 1:] != s[:, :-1]).all(dim=1)
    return in_range & distinct


def routing_ids_well_formed(ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Per row of `ids [M, k]` (int32/int64): True iff the ids are pairwise distinct and all in
    [0, num_experts). Returns a bool tensor [M]. The minimum any kernel owes every row, NaN rows included."""
    num_experts = check_int("num_experts", num_experts, min_value=1)
    return _rows_well_formed(_ids(ids), num_experts)


def valid_topk_selection(
    selection_scores: torch.Tensor, ids: torch.Tensor, *, atol: float = 0.0
) -> torch.Tensor:
    """Per row: is `ids` a valid top-k choice under `selection_scores` (set semantics, any tie-break)?

    Args:
        selection_scores: [M, E] float, no NaN (-Inf allowed), e.g. from `topk_selection_scores`.
        ids: [M, k] int32/int64, 1 <= k <= E, in any order.
        atol: default 0 (exact). With atol > 0, the sorted selected scores may differ from the sorted k largest
            by up to atol each (accepts near-tie swaps by a kernel that rounds its scores differently).

    Returns:
        bool [M]: True iff the row's ids are distinct, in [0, E), and the multiset of their selection scores
        equals the multiset of the row's k largest selection scores.
    """
    s = check_tensor("selection_scores", selection_scores, ndim=2, dtypes=FLOAT_DTYPES)
    if bool(torch.isnan(s).any()):
        raise ValueError("selection_scores must not contain NaN")
    m, num_experts = s.shape
    t = _ids(ids, rows=m)
    if not 1 <= t.shape[1] <= num_experts:
        raise ValueError(f"ids must have between 1 and E={num_experts} columns, got shape {list(t.shape)}")
    if isinstance(atol, bool) or not isinstance(atol, (int, float)) or not atol >= 0:
        raise ValueError(f"atol must be a number >= 0, got {atol!r}")
    k = t.shape[1]
    ok = _rows_well_formed(t, num_experts)
    picked = s.gather(1, t.clamp(0, num_experts - 1))
    picked = torch.sort(picked, dim=1, descending=True).values
    best = torch.sort(s, dim=1, descending=True).values[:, :k]
    close = (picked == best) | ((picked - best).abs() <= atol)
    return ok & close.all(dim=1)
