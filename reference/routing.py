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
the selection was made on (biased scores; experts of unkept groups at -inf, or 0 when zero-filled). A kernel's
id set is valid iff `valid_topk_selection(selection_scores, ids)` holds: it is a top-k of the row under some
tie-break.
Grouped routing chooses twice, groups then experts, and ties may occur at either level, so its ids are judged by
`valid_grouped_topk_selection`, which accepts any admissible choice of groups. Both take an `atol`: the ids are
then a top-k of the scores after moving each by at most atol / 2 (a kernel that rounds its scores differently).
Weights are then compared gathered in the kernel's own order.

Masked experts. A -Inf logit is how a model masks an expert out. It is an ordinary value, not an error: its
score is exactly 0 (softmax and sigmoid alike), so without a correction bias a masked expert is selected only
when fewer than k experts of the row (of its kept groups, for grouped routing) have a positive score; the free
slots then go to zero-score experts, any of them (a tie), with weight 0. With a correction bias its selection
score is its bias, as every production router computes it. Logit-ranked selections (Llama 4, TOPK_THEN_SOFTMAX)
rank it last. Only a row whose logits are *all* -Inf is non-finite.

Non-finite logits (NaN, +Inf, all -Inf: padding rows of CUDA graphs) are implementation-defined in production;
the oracle's rule is the `NonFinitePolicy` argument (default `ZERO`, see there). Whatever the rule,
`routing_ids_well_formed` states the minimum a kernel owes such rows: no duplicate ids and every id in [0, E).
"""

from __future__ import annotations

import enum
import math
from typing import NamedTuple

import torch

from reference._checks import FLOAT_DTYPES, INT_INDEX_DTYPES, check_choice, check_int, check_tensor

__all__ = [
    "GroupScoring",
    "NonFinitePolicy",
    "ScalingPlacement",
    "Scoring",
    "SoftmaxOrder",
    "UnkeptGroups",
    "finite_or_masked_rows",
    "grouped_topk_group_scores",
    "grouped_topk_route",
    "grouped_topk_selection_scores",
    "llama4_top1_route",
    "llama4_top1_selection_scores",
    "routing_ids_well_formed",
    "topk_route",
    "topk_selection_scores",
    "valid_grouped_topk_selection",
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


class GroupScoring(str, enum.Enum):
    """How grouped routing scores a group to choose the `topk_group` kept ones, on the *selection* scores (the
    biased scores when a correction bias is given, else the scores).

    - `MAX`: the group's largest selection score.
    - `TOP2_SUM`: the sum of the group's two largest selection scores (one rounded add); a group of one expert
      scores its one selection score.

    Not given (None): TOP2_SUM with a correction bias, MAX without (DeepSeek-V3 and V2 as vLLM and SGLang compute
    them); that rule needs at least 2 experts per group with a bias.
    """

    MAX = "max"
    TOP2_SUM = "top2_sum"


class UnkeptGroups(str, enum.Enum):
    """What grouped routing does with the experts of the groups it does not keep.

    - `EXCLUDED`: their selection score is -Inf: they are chosen never (the kept groups always hold k experts).
    - `ZERO_FILLED`: their selection score is 0 (routers that mask with `masked_fill(..., 0.0)`): they tie with the
      kept experts whose selection score is 0 (masked or underflowed ones), and beat the negative biased ones. The
      weight of an expert chosen so is still its unbiased score.
    """

    EXCLUDED = "excluded"
    ZERO_FILLED = "zero_filled"


class NonFinitePolicy(str, enum.Enum):
    """What the oracle does with NaN / +-Inf logits.

    - `ZERO` (vLLM's current CUDA kernel): every non-finite *score* (probability or sigmoid) is replaced by 0
      before selection and in the weights. With softmax one NaN or +Inf logit (or a row of -Inf only) makes the
      whole row NaN, so the row's scores are all 0: ids are 0..k-1 (ties to the lower index) and weights are 0
      (with a correction bias, the bias alone then decides the selection; weights stay 0). With sigmoid only the
      NaN experts get score 0 (sigmoid(+-Inf) = 1 or 0 is finite). Where the selection is made on raw logits
      (`TOPK_THEN_SOFTMAX`, Llama4), a NaN logit ranks as -Inf; non-finite weights computed afterwards are
      replaced by 0. A renormalization whose sum is 0 returns zeros. For finite logits ZERO changes nothing.
    - `PROPAGATE` (torch code without guards, e.g. vLLM's torch routers): IEEE arithmetic throughout. NaN
      ranks above every number in each selection, groups included (the order of torch.topk and torch.sort), so
      NaN experts are selected first; a softmax row with a NaN, a +Inf or only -Inf logits is NaN throughout
      (NaN weights); a renormalization divides by the plain sum (0 / 0 is NaN), or by sum + renormalize_eps
      where that is given (0 / eps is 0).
    - `RAISE`: a non-finite row (a NaN or +Inf logit, or only -Inf ones) raises ValueError, for callers that must
      never see such rows; masked experts (-Inf beside finite logits) are ordinary.

    Rows whose logits are finite or masked (some -Inf, the rest finite) compute the same under ZERO and PROPAGATE,
    except a renormalization over k zero scores (zeros under ZERO, NaN under PROPAGATE).
    """

    ZERO = "zero"
    PROPAGATE = "propagate"
    RAISE = "raise"


# ----------------------------------------------------------------------------------------------- helpers


def _logits(router_logits: object, nonfinite: object) -> tuple[torch.Tensor, NonFinitePolicy]:
    """Validate the logits and the policy; return the logits in the compute dtype (fp32, or fp64)."""
    t = check_tensor("router_logits", router_logits, ndim=2, dtypes=FLOAT_DTYPES)
    if t.shape[1] < 1:
        raise ValueError(f"router_logits must have at least one expert column, got shape {list(t.shape)}")
    policy = NonFinitePolicy(check_choice("nonfinite", nonfinite, list(NonFinitePolicy)))
    if policy is NonFinitePolicy.RAISE and not bool(finite_or_masked_rows(t).all()):
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
    """Indices of the k largest entries per row, descending, ties toward the lower index, NaN first.

    A stable descending sort keeps equal values in ascending index order, which is the tie rule, and puts NaN
    before +Inf, as torch.topk does (what PROPAGATE means; under ZERO no NaN gets here).
    """
    return torch.sort(values, dim=-1, descending=True, stable=True).indices[:, :k]


def _eps(renormalize_eps: object) -> float:
    e = renormalize_eps
    if isinstance(e, bool) or not isinstance(e, (int, float)) or not math.isfinite(e) or e < 0:
        raise ValueError(f"renormalize_eps must be a finite number >= 0, got {e!r}")
    return float(e)


def _renormalize(w: torch.Tensor, policy: NonFinitePolicy, eps: float) -> torch.Tensor:
    """Divide each row by its sum (the sum formed in float64 in a fixed order and rounded once to w's dtype, then
    one division). With eps > 0 the divisor is that sum + eps (the add rounded in w's dtype): a zero sum gives
    zeros, a NaN sum NaN, under every policy. With eps = 0 a zero sum (all k weights 0, e.g. a NaN row under ZERO)
    returns the row unchanged, i.e. zeros, instead of 0/0; under PROPAGATE the division is plain (0/0 and NaN sums
    give NaN)."""
    s = _row_sum(w.to(torch.float64)).to(w.dtype)
    if eps > 0:
        return w / (s + eps)
    if policy is NonFinitePolicy.PROPAGATE:
        return w / s
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
    renormalize_eps: object,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x, policy = _logits(router_logits, nonfinite)
    eps = _eps(renormalize_eps)
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
        weights = _renormalize(weights, policy, eps)
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
    renormalize_eps: float = 0.0,
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
        renormalize_eps: finite, >= 0 (default 0). When > 0 the renormalization divides by sum + renormalize_eps
            instead (a zero sum gives zeros and a NaN sum NaN under every `nonfinite` rule; torch routers that
            write `w / (w.sum() + 1e-20)`). Unused without renormalize and with TOPK_THEN_SOFTMAX.

    Returns:
        (topk_weights [M, k] fp32, topk_ids [M, k] int32), both contiguous, each row in descending order of
        selection score, ties toward the lower expert index (the contract is set semantics, see module doc).
    """
    w, ids, _ = _topk(router_logits, k, scoring, renormalize, correction_bias, order, nonfinite, renormalize_eps)
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
    renormalize_eps: float = 0.0,
) -> torch.Tensor:
    """The [M, E] scores `topk_route` (same arguments) selects on, in the compute dtype (fp32, or fp64).

    SOFTMAX_THEN_TOPK / SIGMOID: the scores (non-finite ones zeroed under ZERO) plus the correction bias.
    TOPK_THEN_SOFTMAX: the logits themselves (a NaN as -Inf under ZERO). Feed to `valid_topk_selection`.
    """
    return _topk(router_logits, k, scoring, renormalize, correction_bias, order, nonfinite, renormalize_eps)[2]


# ------------------------------------------------------------------------------------------- grouped top-k


class _Grouped(NamedTuple):
    weights: torch.Tensor  # [M, k] fp32
    ids: torch.Tensor  # [M, k] int32
    selection: torch.Tensor  # [M, E]: biased scores in the kept groups, `fill` elsewhere
    biased: torch.Tensor  # [M, E]: biased scores before the group mask
    group_scores: torch.Tensor  # [M, G]
    group_scoring: GroupScoring  # the rule in force (None resolved)
    fill: float  # the unkept groups' selection score: -inf or 0


def _group_shape(num_experts: int, k: int, num_groups: object, topk_group: object) -> tuple[int, int, int]:
    """(num_groups, experts per group, topk_group), validated."""
    num_groups = check_int("num_groups", num_groups, min_value=1)
    if num_experts % num_groups != 0:
        raise ValueError(f"num_groups must divide the number of experts E={num_experts}, got {num_groups}")
    per_group = num_experts // num_groups
    topk_group = check_int("topk_group", topk_group, min_value=1, max_value=num_groups)
    if k > topk_group * per_group:
        raise ValueError(
            f"k must be <= topk_group * experts per group = {topk_group} * {per_group}, got {k}"
        )
    return num_groups, per_group, topk_group


def _group_scoring(group_scoring: object, biased: bool, num_groups: int, per_group: int) -> GroupScoring:
    """The group rule in force: the declared one, or (None) top-2 sum with a bias and max without."""
    if group_scoring is not None:
        return GroupScoring(check_choice("group_scoring", group_scoring, list(GroupScoring)))
    if biased and per_group < 2:
        raise ValueError(
            f"num_groups={num_groups} leaves {per_group} expert per group; the correction_bias path needs "
            "at least 2 experts per group (group score = sum of the top-2 biased scores), unless group_scoring "
            "is given"
        )
    return GroupScoring.TOP2_SUM if biased else GroupScoring.MAX


def _scaling(routed_scaling_factor: object, scaling_placement: object) -> tuple[float, ScalingPlacement]:
    f = routed_scaling_factor
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or f <= 0:
        raise ValueError(f"routed_scaling_factor must be a finite number > 0, got {f!r}")
    return f, ScalingPlacement(check_choice("scaling_placement", scaling_placement, list(ScalingPlacement)))


def _group_scores(biased: torch.Tensor, num_groups: int, rule: GroupScoring) -> torch.Tensor:
    """[M, G]: each group's largest selection score, or the sum of its two largest (its one, in a group of one).
    NaN ranks first in both (torch's max and descending sort), so a group holding a NaN scores NaN."""
    by_group = biased.reshape(biased.shape[0], num_groups, biased.shape[1] // num_groups)
    if rule is GroupScoring.MAX:
        return by_group.max(dim=-1).values
    top = torch.sort(by_group, dim=-1, descending=True).values
    return top[..., 0] + top[..., 1] if top.shape[-1] > 1 else top[..., 0]


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
    group_scoring: object,
    unkept_groups: object,
    renormalize_eps: object,
) -> _Grouped:
    x, policy = _logits(router_logits, nonfinite)
    m, num_experts = x.shape
    k = _k(k, num_experts)
    num_groups, per_group, topk_group = _group_shape(num_experts, k, num_groups, topk_group)
    scoring = Scoring(check_choice("scoring", scoring, list(Scoring)))
    bias = _bias(correction_bias, num_experts, x.dtype)
    rule = _group_scoring(group_scoring, bias is not None, num_groups, per_group)
    unkept = UnkeptGroups(check_choice("unkept_groups", unkept_groups, list(UnkeptGroups)))
    if not isinstance(renormalize, bool):
        raise ValueError(f"renormalize must be a bool, got {type(renormalize).__name__}")
    factor, placement = _scaling(routed_scaling_factor, scaling_placement)
    eps = _eps(renormalize_eps)

    scores = _scores(x, scoring)
    if policy is NonFinitePolicy.ZERO:
        scores = _zero_nonfinite(scores)
    biased = scores if bias is None else scores + bias

    group_scores = _group_scores(biased, num_groups, rule)
    kept_groups = _topk_lower_index(group_scores, topk_group)
    group_kept = torch.zeros(m, num_groups, dtype=torch.bool, device=x.device).scatter(1, kept_groups, True)
    expert_kept = group_kept.repeat_interleave(per_group, dim=1)
    # EXCLUDED fills with -inf, not 0: biased scores may be negative, and a 0 would then beat a kept expert
    fill = -math.inf if unkept is UnkeptGroups.EXCLUDED else 0.0
    selection = biased.masked_fill(~expert_kept, fill)

    ids = _topk_lower_index(selection, k)
    weights = scores.gather(1, ids)  # unbiased
    if renormalize:
        weights = _renormalize(weights, policy, eps)
    if placement is ScalingPlacement.WEIGHTS:
        weights = weights * factor
    return _Grouped(*_finalize(weights, ids), selection, biased, group_scores, rule, fill)


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
    group_scoring: GroupScoring | None = None,
    unkept_groups: UnkeptGroups = UnkeptGroups.EXCLUDED,
    renormalize_eps: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped top-k routing (DeepSeek-V2: softmax, no bias; DeepSeek-V3: sigmoid with correction bias).

    Steps, in the compute dtype (fp32, or fp64 for fp64 logits):
      1. scores = softmax over all E, or sigmoid; biased = scores + correction_bias (or scores).
      2. The E experts form `num_groups` contiguous groups of E // num_groups, each scored by `group_scoring` on
         its biased scores: MAX, its largest; TOP2_SUM, the sum of its two largest (its one score in a group of
         one). Not given: TOP2_SUM with a correction bias, MAX without.
      3. Keep the `topk_group` best groups (ties toward the lower group index); every expert of another group
         gets selection score -Inf (`unkept_groups=EXCLUDED`; not 0: biased scores can be negative), or 0
         (ZERO_FILLED).
      4. Pick the k largest selection scores (ties toward the lower expert index).
      5. weights = the unbiased scores of the picked experts; if `renormalize`, divided by their sum (a zero
         sum returns zeros), or by sum + renormalize_eps when that is > 0; then, with scaling_placement=WEIGHTS,
         multiplied by `routed_scaling_factor` (division first, then the multiplication, each rounded). With
         REDUCE the weights stay unscaled and the reduce applies the factor.

    Args:
        router_logits: [M, E], fp16/bf16/fp32/fp64.
        k: 1 <= k <= topk_group * (E // num_groups).
        num_groups: divides E. topk_group: 1 <= topk_group <= num_groups.
        scoring: SOFTMAX or SIGMOID (required: the DeepSeek generations differ).
        correction_bias: optional [E] fp32 (fp64 allowed for fp64 logits), finite; needs >= 2 experts/group
            when group_scoring is not given.
        renormalize: default True. routed_scaling_factor: finite, > 0, default 1.0.
        scaling_placement: WEIGHTS (default) or REDUCE, see `ScalingPlacement`.
        nonfinite: see `NonFinitePolicy` (default ZERO).
        group_scoring: see `GroupScoring`; None (default) for the rule of step 2.
        unkept_groups: EXCLUDED (default) or ZERO_FILLED, see `UnkeptGroups`.
        renormalize_eps: finite, >= 0 (default 0), see `topk_route`.

    Returns:
        (topk_weights [M, k] fp32, topk_ids [M, k] int32), rows in descending selection-score order.
    """
    g = _grouped(
        router_logits, k, num_groups, topk_group, scoring, correction_bias, renormalize,
        routed_scaling_factor, scaling_placement, nonfinite, group_scoring, unkept_groups, renormalize_eps,
    )
    return g.weights, g.ids


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
    group_scoring: GroupScoring | None = None,
    unkept_groups: UnkeptGroups = UnkeptGroups.EXCLUDED,
    renormalize_eps: float = 0.0,
) -> torch.Tensor:
    """The [M, E] selection scores of `grouped_topk_route` (same arguments), in the compute dtype: biased
    scores for experts in kept groups, -Inf (or 0, ZERO_FILLED) for the others. Feed to `valid_topk_selection`.

    Note: under ties between *group* scores the kept groups themselves are a choice; these scores encode the
    oracle's choice (lower group index). Judge a kernel's ids with `valid_grouped_topk_selection`, which accepts
    every admissible group choice."""
    return _grouped(
        router_logits, k, num_groups, topk_group, scoring, correction_bias, renormalize,
        routed_scaling_factor, scaling_placement, nonfinite, group_scoring, unkept_groups, renormalize_eps,
    ).selection


def grouped_topk_group_scores(
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
    group_scoring: GroupScoring | None = None,
    unkept_groups: UnkeptGroups = UnkeptGroups.EXCLUDED,
    renormalize_eps: float = 0.0,
) -> torch.Tensor:
    """The [M, num_groups] group scores of `grouped_topk_route` (same arguments; step 2), in the compute dtype: the
    values whose exact ties the lower group index breaks."""
    return _grouped(
        router_logits, k, num_groups, topk_group, scoring, correction_bias, renormalize,
        routed_scaling_factor, scaling_placement, nonfinite, group_scoring, unkept_groups, renormalize_eps,
    ).group_scores


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


def finite_or_masked_rows(router_logits: torch.Tensor) -> torch.Tensor:
    """Per row of `router_logits [M, E]`: True iff it has no NaN, no +Inf and at least one finite logit (-Inf
    logits, masked experts, are allowed). Returns bool [M]. Such rows compute the same under ZERO and PROPAGATE
    (but for a renormalization over k zero scores); the others (NaN, +Inf, only -Inf) are the non-finite rows
    the `NonFinitePolicy` decides."""
    t = check_tensor("router_logits", router_logits, ndim=2, dtypes=FLOAT_DTYPES)
    return ~(t.isnan() | t.isposinf()).any(dim=1) & t.isfinite().any(dim=1)


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


def _atol(atol: object) -> float:
    if isinstance(atol, bool) or not isinstance(atol, (int, float)) or not atol >= 0:
        raise ValueError(f"atol must be a number >= 0, got {atol!r}")
    return float(atol)


def _chosen(ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """[M, E] bool: which experts the (well-formed or not) ids select; out-of-range ids select nothing."""
    inside = (ids >= 0) & (ids < num_experts)
    hit = torch.zeros(ids.shape[0], num_experts + 1, dtype=torch.bool, device=ids.device)
    return hit.scatter(1, torch.where(inside, ids, num_experts), True)[:, :num_experts]


def _is_topk(s: torch.Tensor, chosen: torch.Tensor, atol: float) -> torch.Tensor:
    """Per row: the chosen entries are a top-k of `s` under a tie-break within atol. NaN ranks above every number:
    the chosen set must hold min(k, #NaN) of the row's NaNs, and among the numbers, every chosen one must be at
    least every unchosen one minus atol (compared in float64: an atol below the scores' ulp must not round away)."""
    s = s.to(torch.float64)
    k = chosen.sum(dim=1)
    nan = s.isnan()
    nan_ok = (chosen & nan).sum(dim=1) == torch.minimum(k, nan.sum(dim=1))
    inf = torch.tensor(math.inf, dtype=s.dtype, device=s.device)
    lowest_chosen = torch.where(chosen & ~nan, s, inf).amin(dim=1)
    best_left = torch.where(~chosen & ~nan, s, -inf).amax(dim=1)
    # where both are the same infinity, inf - atol is inf again: a tie, which is valid
    return nan_ok & (lowest_chosen >= best_left - atol)


def valid_topk_selection(
    selection_scores: torch.Tensor, ids: torch.Tensor, *, atol: float = 0.0
) -> torch.Tensor:
    """Per row: is `ids` a valid top-k choice under `selection_scores` (set semantics, any tie-break)?

    Contract: the ids are valid iff they are distinct, in [0, E), and a top-k of the row's scores after moving each
    score by at most atol / 2, i.e. no unselected score exceeds the lowest selected one by more than atol. With
    atol = 0 (the default) this is exact: the multiset of the selected scores equals that of the row's k largest,
    so exactly tied scores may be swapped and nothing else. NaN ranks above every number (torch.topk's order, what
    `NonFinitePolicy.PROPAGATE` computes) and NaNs tie with each other.

    Args:
        selection_scores: [M, E] float (+-Inf and NaN allowed), e.g. from `topk_selection_scores`.
        ids: [M, k] int32/int64, 1 <= k <= E, in any order.
        atol: >= 0; accepts near-tie swaps by a kernel that rounds its scores differently.

    Returns:
        bool [M].
    """
    s = check_tensor("selection_scores", selection_scores, ndim=2, dtypes=FLOAT_DTYPES)
    m, num_experts = s.shape
    t = _ids(ids, rows=m)
    if not 1 <= t.shape[1] <= num_experts:
        raise ValueError(f"ids must have between 1 and E={num_experts} columns, got shape {list(t.shape)}")
    atol = _atol(atol)
    return _rows_well_formed(t, num_experts) & _is_topk(s, _chosen(t, num_experts), atol)


def _admissible_groups(
    biased: torch.Tensor, group_scores: torch.Tensor, chosen: torch.Tensor, ids: torch.Tensor, topk_group: int,
    atol: float, group_atol: float, fill: float,
) -> torch.Tensor:
    """Per row: is there a set S of topk_group groups, admissible at group level, under which the chosen experts
    are a top-k within atol of the selection scores S gives (biased scores in S's groups, `fill` elsewhere)?

    S is admissible iff every group outside S scores at most group_atol above S's lowest group. The chosen experts
    are a top-k within atol iff for some threshold t every chosen score is >= t and every unchosen one <= t + atol;
    t = the lowest chosen score works if any does, and that is a chosen expert's biased score or the fill, so those
    are the candidates. For a candidate t and a candidate lowest group score lo, a group may be in S when its
    experts meet t (`fits_in`) and it scores >= lo, may be out when the fill meets t (`fits_out`), and must be in
    when it scores above lo + group_atol. NaN counts as +Inf: no score of grouped routing is +Inf.
    """
    m, num_groups = group_scores.shape
    per_group = biased.shape[1] // num_groups
    inf = math.inf
    # float64, so that an atol below the scores' ulp does not round away
    key = torch.where(biased.isnan(), inf, biased).to(torch.float64)
    gkey = torch.where(group_scores.isnan(), inf, group_scores).to(torch.float64)
    ch = chosen.reshape(m, num_groups, per_group)
    by_group = key.reshape(m, num_groups, per_group)
    in_low = torch.where(ch, by_group, inf).amin(dim=2)[:, None, :]  # [M, 1, G]: lowest chosen score if kept
    in_high = torch.where(ch, -inf, by_group).amax(dim=2)[:, None, :]  # best unchosen score if kept
    out_low = torch.where(ch.any(dim=2), fill, inf)[:, None, :]
    out_high = torch.where((~ch).any(dim=2), fill, -inf)[:, None, :]
    # candidate thresholds [M, T, 1]: the chosen experts' scores and the fill; with fill -Inf every chosen expert
    # must be kept, so the lowest chosen score is the one candidate
    t = key.gather(1, ids)
    t = t.amin(dim=1, keepdim=True) if fill == -inf else torch.cat([t, key.new_full((m, 1), fill)], dim=1)
    t = t[:, :, None]
    fits_in = (in_low >= t) & (in_high <= t + atol)  # [M, T, G]
    fits_out = (out_low >= t) & (out_high <= t + atol)
    lo = gkey[:, None, :, None]  # [M, 1, candidate, 1]
    forced = gkey[:, None, None, :] > lo + group_atol  # [M, 1, candidate, group]
    usable = (gkey[:, None, None, :] >= lo) & fits_in[:, :, None, :]  # [M, T, candidate, group]
    need = forced | ~fits_out[:, :, None, :]
    n_need = need.sum(dim=3)
    fits = (~need | usable).all(dim=3) & (n_need <= topk_group)
    spare = (usable & ~need).sum(dim=3)
    return (fits & (n_need + spare >= topk_group)).flatten(1).any(dim=1)


def breaks_ties_toward_lower_index(
    selection_scores: torch.Tensor, ids: torch.Tensor, *, valid_exactly: torch.Tensor
) -> torch.Tensor:
    """Per row: does `ids` follow the lower-index tie rule, given that it is (`valid_exactly`) or is not a valid
    choice with atol = 0?

    Contract: among exactly tied selection scores (groups too, for grouped routing, whose selection scores already
    mask the groups the lower-index rule keeps) the lower expert index is chosen, so a row valid at atol = 0 must
    choose exactly the experts a stable descending sort of `selection_scores` puts first. A row that is not valid
    at atol = 0 chose among near ties (or wrongly, which the validity check judges): no rule of exact ties applies
    to it, and it passes here.

    Args:
        selection_scores: [M, E] float, the oracle's (`topk_selection_scores`, `grouped_topk_selection_scores`).
        ids: [M, k] int, the kernel's choice, well formed (distinct, in [0, E)).
        valid_exactly: bool [M], `valid_topk_selection` / `valid_grouped_topk_selection` with atol = 0.

    Returns:
        bool [M].
    """
    s = check_tensor("selection_scores", selection_scores, ndim=2, dtypes=FLOAT_DTYPES)
    t = _ids(ids, rows=s.shape[0])
    num_experts = s.shape[1]
    lower = _chosen(_topk_lower_index(s, t.shape[1]), num_experts)
    same = (_chosen(t, num_experts) == lower).all(dim=1)
    return same | ~valid_exactly.to(torch.bool)


def valid_grouped_topk_selection(
    router_logits: torch.Tensor,
    ids: torch.Tensor,
    *,
    num_groups: int,
    topk_group: int,
    scoring: Scoring,
    correction_bias: torch.Tensor | None = None,
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
    scaling_placement: ScalingPlacement = ScalingPlacement.WEIGHTS,
    nonfinite: NonFinitePolicy = NonFinitePolicy.ZERO,
    group_scoring: GroupScoring | None = None,
    unkept_groups: UnkeptGroups = UnkeptGroups.EXCLUDED,
    renormalize_eps: float = 0.0,
    atol: float = 0.0,
) -> torch.Tensor:
    """Per row: is `ids [M, k]` a valid grouped top-k of `router_logits` (the other arguments as for
    `grouped_topk_route`, k = ids.shape[1]) under some tie-break within atol, at group level and expert level?

    Contract. Group scores and biased scores are those of `grouped_topk_route` (steps 1-2). A set S of
    `topk_group` groups is an admissible group choice iff no group outside S scores more than `group_atol` above
    the lowest group score in S, where group_atol = atol for the MAX group score (and for TOP2_SUM over groups of
    one expert) and 2 * atol for a TOP2_SUM of two scores: S is a top-topk_group of the group scores after moving
    each by at most group_atol / 2. The ids are valid iff they are distinct, in [0, E), and for some admissible S
    they are a top-k within atol (`valid_topk_selection`) of S's selection scores: the biased scores of S's
    experts, and -Inf (EXCLUDED: so the ids all lie in S's groups) or 0 (ZERO_FILLED: an unkept expert ties with
    the kept ones of selection score 0) for the others. With atol = 0 only exact ties are free, at both levels:
    a group may be kept in place of a tied one, never in place of one that scores more. NaN ranks above every
    number (under PROPAGATE NaN experts and groups come first). The oracle's own ids are always valid.

    Returns:
        bool [M].
    """
    t = _ids(ids)
    atol = _atol(atol)
    g = _grouped(
        router_logits, t.shape[1], num_groups, topk_group, scoring, correction_bias, renormalize,
        routed_scaling_factor, scaling_placement, nonfinite, group_scoring, unkept_groups, renormalize_eps,
    )
    m, num_experts = g.biased.shape
    if t.shape[0] != m:
        raise ValueError(f"ids must have {m} rows (one per token), got shape {list(t.shape)}")
    t = t.to(g.biased.device)
    well_formed = _rows_well_formed(t, num_experts)
    chosen = _chosen(t, num_experts)
    # the oracle's own group choice is admissible: rows valid under it need no search
    ok = well_formed & _is_topk(g.selection, chosen, atol)
    two_scores = g.group_scoring is GroupScoring.TOP2_SUM and num_experts // g.group_scores.shape[1] > 1
    group_atol = atol * (2 if two_scores else 1)
    rest = (well_formed & ~ok).nonzero().flatten()
    # the search holds [rows, T, G, G] booleans (T = 1, or k + 1 zero-filled): a few million at a time
    thresholds = 1 if g.fill == -math.inf else t.shape[1] + 1
    step = max(1, (1 << 22) // max(1, thresholds * g.group_scores.shape[1] ** 2))
    for start in range(0, rest.numel(), step):
        rows = rest[start:start + step]
        ok[rows] = _admissible_groups(g.biased[rows], g.group_scores[rows], chosen[rows], t[rows], topk_group,
                                      atol, group_atol, g.fill)
    return ok
