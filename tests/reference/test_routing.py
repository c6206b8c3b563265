"""The routing oracle against independent derivations: float64 formulas, brute-force enumeration, invariants."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from reference.routing import (
    NonFinitePolicy,
    ScalingPlacement,
    Scoring,
    SoftmaxOrder,
    finite_or_masked_rows,
    grouped_topk_group_scores,
    grouped_topk_route,
    grouped_topk_selection_scores,
    llama4_top1_route,
    llama4_top1_selection_scores,
    routing_ids_well_formed,
    topk_route,
    topk_selection_scores,
    valid_grouped_topk_selection,
    valid_topk_selection,
)

NAN, INF = math.nan, math.inf


def _randn(m: int, e: int, seed: int, dtype: torch.dtype = torch.float32, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m, e, generator=g, dtype=torch.float64) * scale).to(dtype)


# Independent float64 formulas (numpy, not the oracle's torch code).
def softmax64(x: torch.Tensor) -> np.ndarray:
    a = x.to(torch.float64).numpy()
    e = np.exp(a - a.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def sigmoid64(x: torch.Tensor) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x.to(torch.float64).numpy()))


def scores64(x: torch.Tensor, scoring: Scoring) -> np.ndarray:
    return softmax64(x) if scoring is Scoring.SOFTMAX else sigmoid64(x)


def assert_ids_are_topk_of(ref: np.ndarray, ids: torch.Tensor) -> None:
    """The multiset of ref's values at ids equals the multiset of each row's k largest values."""
    k = ids.shape[1]
    picked = np.sort(np.take_along_axis(ref, ids.long().numpy(), axis=1), axis=1)[:, ::-1]
    best = np.sort(ref, axis=1)[:, ::-1][:, :k]
    np.testing.assert_array_equal(picked, best)


def check_shapes(w: torch.Tensor, ids: torch.Tensor, m: int, k: int) -> None:
    assert w.dtype == torch.float32 and ids.dtype == torch.int32
    assert tuple(w.shape) == (m, k) and tuple(ids.shape) == (m, k)
    assert w.is_contiguous() and ids.is_contiguous()


# --------------------------------------------------------------------------------------------- softmax


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("renormalize", [False, True])
def test_softmax_topk_matches_float64_formula(dtype: torch.dtype, renormalize: bool) -> None:
    x = _randn(32, 16, seed=1, dtype=dtype)
    w, ids = topk_route(x, 4, renormalize=renormalize)
    check_shapes(w, ids, 32, 4)
    p = softmax64(x)
    assert_ids_are_topk_of(p, ids)
    want = np.take_along_axis(p, ids.long().numpy(), axis=1)
    if renormalize:
        want = want / want.sum(axis=1, keepdims=True)
    # fp32 arithmetic over 16 experts: a few ulp; fp16/bf16 arithmetic would be off by ~1e-3.
    np.testing.assert_allclose(w.numpy(), want, rtol=4e-6, atol=0)
    # The oracle's order: descending weight.
    assert bool((w[:, :-1] >= w[:, 1:]).all())


def test_topk_then_softmax_equals_renormalized_softmax_within_rounding() -> None:
    x = _randn(64, 32, seed=2)
    w1, ids1 = topk_route(x, 6, renormalize=True)
    w2, ids2 = topk_route(x, 6, renormalize=True, order=SoftmaxOrder.TOPK_THEN_SOFTMAX)
    assert torch.equal(ids1, ids2)
    torch.testing.assert_close(w2, w1, rtol=2e-6, atol=0)
    # and the k-way softmax itself against float64
    want = softmax64(torch.gather(x, 1, ids2.long()))
    np.testing.assert_allclose(w2.numpy(), want, rtol=2e-6, atol=0)
    # its selection scores are the logits
    assert torch.equal(topk_selection_scores(x, 6, renormalize=True, order="topk_then_softmax"), x)


@pytest.mark.parametrize("renormalize", [False, True])
def test_sigmoid_scoring_matches_float64_formula(renormalize: bool) -> None:
    x = _randn(32, 24, seed=3, dtype=torch.bfloat16)
    w, ids = topk_route(x, 5, scoring=Scoring.SIGMOID, renormalize=renormalize)
    s = sigmoid64(x)
    assert_ids_are_topk_of(s, ids)
    want = np.take_along_axis(s, ids.long().numpy(), axis=1)
    if renormalize:
        want = want / want.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(w.numpy(), want, rtol=2e-6, atol=0)


def test_float64_logits_are_computed_in_float64() -> None:
    # Two logits that are equal in fp32 but not in fp64: fp64 arithmetic must prefer expert 1.
    x = torch.tensor([[1.0, 1.0 + 1e-12, -3.0]], dtype=torch.float64)
    for fn in (lambda t: topk_route(t, 1), lambda t: llama4_top1_route(t),
               lambda t: topk_route(t, 1, scoring="sigmoid")):
        w, ids = fn(x)
        assert ids.tolist() == [[1]] and w.dtype == torch.float32
    assert topk_selection_scores(x, 1).dtype == torch.float64
    # and they are the float64 values rounded once
    w, _ = topk_route(x, 3)
    np.testing.assert_allclose(w.numpy(), np.sort(softmax64(x), axis=1)[:, ::-1], rtol=1e-7)


# ------------------------------------------------------------------------------------------ correction bias


def test_bias_selects_but_never_leaks_into_weights() -> None:
    x = _randn(16, 12, seed=4)
    bias = torch.zeros(12)
    bias[[1, 5, 9]] = 50.0  # forces the selection whatever the logits
    for scoring in Scoring:
        w, ids = topk_route(x, 3, scoring=scoring, correction_bias=bias)
        assert all(set(r) == {1, 5, 9} for r in ids.tolist())
        want = np.take_along_axis(scores64(x, scoring), ids.long().numpy(), axis=1)
        np.testing.assert_allclose(w.numpy(), want, rtol=4e-6, atol=0)
        assert float(w.max()) <= 1.0


def test_random_bias_selection_against_float64() -> None:
    x = _randn(32, 16, seed=5)
    bias = _randn(1, 16, seed=6, scale=0.5)[0]
    w, ids = topk_route(x, 4, scoring="sigmoid", correction_bias=bias, renormalize=True)
    s = sigmoid64(x)
    assert_ids_are_topk_of(s + bias.double().numpy(), ids)
    want = np.take_along_axis(s, ids.long().numpy(), axis=1)
    np.testing.assert_allclose(w.numpy(), want / want.sum(axis=1, keepdims=True), rtol=4e-6)
    sel = topk_selection_scores(x, 4, scoring="sigmoid", correction_bias=bias, renormalize=True)
    np.testing.assert_allclose(sel.numpy(), s + bias.double().numpy(), rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------------------------------- grouped top-k


def brute_force_grouped(
    scores: np.ndarray, bias: np.ndarray | None, num_groups: int, topk_group: int, k: int
) -> list[set[int]]:
    """All id sets a correct grouped router may return for one row, by enumeration.

    A choice of topk_group groups is allowed iff each kept group scores >= every dropped group; among the
    experts of an allowed choice, the best id sets are the k-subsets with the largest sum of biased scores.
    """
    e = scores.shape[0]
    n = e // num_groups
    biased = scores + (bias if bias is not None else 0.0)
    gscore = []
    for g in range(num_groups):
        members = range(g * n, (g + 1) * n)
        if bias is None:
            gscore.append(max(scores[i] for i in members))
        else:
            gscore.append(max(biased[i] + biased[j] for i, j in itertools.combinations(members, 2)))
    results: list[tuple[float, set[int]]] = []
    for kept in itertools.combinations(range(num_groups), topk_group):
        dropped = [g for g in range(num_groups) if g not in kept]
        if dropped and min(gscore[g] for g in kept) < max(gscore[g] for g in dropped):
            continue
        allowed = [i for g in kept for i in range(g * n, (g + 1) * n)]
        for subset in itertools.combinations(allowed, k):
            results.append((sum(biased[i] for i in subset), set(subset)))
    best = max(r[0] for r in results)
    return [s for total, s in results if total == best]


GROUPED_CONFIGS = [
    # E, num_groups, topk_group, k, scoring, with_bias
    (8, 4, 2, 3, Scoring.SIGMOID, True),
    (8, 4, 2, 3, Scoring.SOFTMAX, False),
    (12, 4, 3, 5, Scoring.SIGMOID, True),
    (12, 6, 2, 4, Scoring.SOFTMAX, True),
    (6, 6, 3, 2, Scoring.SOFTMAX, False),  # one expert per group (unbiased path only)
    (10, 5, 1, 2, Scoring.SIGMOID, False),
    (8, 2, 2, 8, Scoring.SIGMOID, True),  # k = E
]


@pytest.mark.parametrize(("e", "groups", "topk_group", "k", "scoring", "with_bias"), GROUPED_CONFIGS)
def test_grouped_topk_matches_brute_force(
    e: int, groups: int, topk_group: int, k: int, scoring: Scoring, with_bias: bool
) -> None:
    m = 12
    x = _randn(m, e, seed=10 + e + groups)
    bias = _randn(1, e, seed=20 + e, scale=0.3)[0] if with_bias else None
    factor = 2.5
    w, ids = grouped_topk_route(
        x, k, num_groups=groups, topk_group=topk_group, scoring=scoring, correction_bias=bias,
        routed_scaling_factor=factor,
    )
    check_shapes(w, ids, m, k)
    s = scores64(x, scoring)
    b = bias.double().numpy() if bias is not None else None
    for row in range(m):
        options = brute_force_grouped(s[row], b, groups, topk_group, k)
        assert len(options) == 1, "random inputs should not tie"
        assert set(ids[row].tolist()) == options[0], f"row {row}"
    want = np.take_along_axis(s, ids.long().numpy(), axis=1)
    want = want / want.sum(axis=1, keepdims=True) * factor
    np.testing.assert_allclose(w.numpy(), want, rtol=4e-6, atol=0)


def test_grouped_masks_with_minus_inf_not_zero() -> None:
    # All biased scores are negative: a masked expert at 0 would beat every allowed one.
    e, groups = 8, 4
    x = _randn(16, e, seed=30)
    bias = torch.full((e,), -10.0)
    kw = dict(num_groups=groups, topk_group=1, scoring=Scoring.SIGMOID, correction_bias=bias)
    _, ids = grouped_topk_route(x, 2, **kw)
    for row in ids.tolist():
        assert row[0] // 2 == row[1] // 2, "both experts must come from the one kept group"
    sel = grouped_topk_selection_scores(x, 2, **kw)
    assert int(torch.isneginf(sel).sum(dim=1).unique().item()) == e - 2
    assert bool((sel[torch.isfinite(sel)] < 0).all())


def test_grouped_unbiased_group_score_is_max_not_top2_sum() -> None:
    # group 0 = {0.9, 0.0}, group 1 = {0.6, 0.6} in logits: max picks group 0, a top-2 sum would pick group 1.
    x = torch.tensor([[0.9, -9.0, 0.6, 0.6]])
    _, ids = grouped_topk_route(x, 1, num_groups=2, topk_group=1, scoring="sigmoid")
    assert ids.tolist() == [[0]]
    bias = torch.zeros(4)
    _, ids = grouped_topk_route(x, 1, num_groups=2, topk_group=1, scoring="sigmoid", correction_bias=bias)
    assert ids.tolist() == [[2]]


def test_grouped_group_scores_are_max_or_top2_sum_of_biased_scores() -> None:
    x = torch.tensor([[0.9, -9.0, 0.6, 0.6]])
    sig = [1 / (1 + math.exp(-v)) for v in x[0].tolist()]
    got = grouped_topk_group_scores(x, 1, num_groups=2, topk_group=1, scoring="sigmoid")
    assert torch.allclose(got, torch.tensor([[sig[0], sig[2]]]))
    bias = torch.tensor([0.0, 0.5, -0.25, 0.0])
    got = grouped_topk_group_scores(x, 1, num_groups=2, topk_group=1, scoring="sigmoid", correction_bias=bias)
    assert torch.allclose(got, torch.tensor([[sig[0] + sig[1] + 0.5, sig[2] + sig[3] - 0.25]]))


def test_grouped_bias_does_not_leak_and_scaling_placement() -> None:
    x = _randn(8, 16, seed=31)
    bias = _randn(1, 16, seed=32)[0]
    kw = dict(num_groups=4, topk_group=2, scoring=Scoring.SIGMOID, correction_bias=bias, renormalize=False)
    w_red, ids_red = grouped_topk_route(x, 4, routed_scaling_factor=2.5,
                                        scaling_placement=ScalingPlacement.REDUCE, **kw)
    w_one, ids_one = grouped_topk_route(x, 4, routed_scaling_factor=1.0, **kw)
    w_wgt, ids_wgt = grouped_topk_route(x, 4, routed_scaling_factor=2.5, **kw)
    assert torch.equal(ids_red, ids_one) and torch.equal(ids_red, ids_wgt)
    assert torch.equal(w_red, w_one)  # REDUCE: unscaled
    s = np.take_along_axis(sigmoid64(x), ids_red.long().numpy(), axis=1)
    np.testing.assert_allclose(w_red.numpy(), s, rtol=2e-6)  # the unbiased scores
    np.testing.assert_allclose(w_wgt.numpy(), s * 2.5, rtol=2e-6)


def test_grouped_single_group_e257_equals_plain_topk() -> None:
    x = _randn(6, 257, seed=33)
    bias = _randn(1, 257, seed=34, scale=0.1)[0]
    w, ids = grouped_topk_route(x, 8, num_groups=1, topk_group=1, scoring="sigmoid", correction_bias=bias)
    s = sigmoid64(x)
    assert_ids_are_topk_of(s + bias.double().numpy(), ids)
    want = np.take_along_axis(s, ids.long().numpy(), axis=1)
    np.testing.assert_allclose(w.numpy(), want / want.sum(axis=1, keepdims=True), rtol=4e-6)
    w2, ids2 = topk_route(x, 8, scoring="sigmoid", correction_bias=bias, renormalize=True)
    assert torch.equal(ids, ids2) and torch.equal(w, w2)


def test_grouped_ties_break_toward_lower_group_and_expert() -> None:
    x = torch.zeros(3, 12)
    x[1] = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0], dtype=torch.float32)  # groups 1, 2 tie
    x[2] = torch.tensor([1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0], dtype=torch.float32)  # every group ties
    for bias in (None, torch.zeros(12)):
        kw = dict(num_groups=4, topk_group=2, scoring=Scoring.SIGMOID, correction_bias=bias)
        _, ids = grouped_topk_route(x, 4, **kw)
        assert ids.tolist() == [[0, 1, 2, 3], [3, 4, 5, 6], [0, 3, 1, 2]]
        sel = grouped_topk_selection_scores(x, 4, **kw)
        assert bool(valid_topk_selection(sel, ids).all())
        s = sigmoid64(x)
        for row in range(3):
            b = None if bias is None else np.zeros(12)
            assert set(ids[row].tolist()) in brute_force_grouped(s[row], b, 4, 2, 4)


# ----------------------------------------------------------------------------------------------- ties


def test_equal_logits_give_lowest_ids_and_valid_selection() -> None:
    x = torch.full((2, 8), 0.25, dtype=torch.bfloat16)
    w, ids = topk_route(x, 3)
    assert ids.tolist() == [[0, 1, 2]] * 2
    np.testing.assert_allclose(w.numpy(), np.full((2, 3), 1 / 8), rtol=1e-6)
    sel = topk_selection_scores(x, 3)
    assert bool(valid_topk_selection(sel, ids).all())
    # any other distinct ids are just as valid under ties
    assert bool(valid_topk_selection(sel, torch.tensor([[7, 2, 5], [6, 4, 0]])).all())


@pytest.mark.parametrize("scoring", list(Scoring))
def test_partial_ties_follow_lower_index_rule(scoring: Scoring) -> None:
    g = torch.Generator().manual_seed(40)
    x = torch.randint(-2, 3, (24, 10), generator=g).to(torch.float32)  # many equal logits
    _, ids = topk_route(x, 4, scoring=scoring)
    for row, got in zip(x.tolist(), ids.tolist()):
        # scoring is monotone, so scores tie exactly where the integer logits tie
        assert got == sorted(range(10), key=lambda i: (-row[i], i))[:4]
    assert bool(valid_topk_selection(topk_selection_scores(x, 4, scoring=scoring), ids).all())


def test_valid_topk_selection_against_enumeration() -> None:
    scores = torch.tensor([[3.0, 1.0, 3.0, 2.0, 1.0, -INF], [0.0, 0.0, 0.0, 0.0, 5.0, 0.0]])
    k = 3
    for row in range(2):
        vals = scores[row].tolist()
        best = max(sum(vals[i] for i in c) for c in itertools.combinations(range(6), k))
        for perm in itertools.permutations(range(6), k):
            ids = torch.tensor([perm] * 2)
            got = bool(valid_topk_selection(scores, ids)[row])
            assert got == (sum(vals[i] for i in perm) == best), (row, perm)
    bad = torch.tensor([[0, 0, 2], [4, 0, 6]])  # duplicate; out of range
    assert valid_topk_selection(scores, bad).tolist() == [False, False]
    assert valid_topk_selection(scores, torch.tensor([[0, 2, -1], [4, 0, 1]])).tolist() == [False, True]


def test_valid_topk_selection_atol_accepts_near_ties_only() -> None:
    s = torch.tensor([[1.0, 0.999, 0.5]])
    swapped = torch.tensor([[1]])
    assert not bool(valid_topk_selection(s, swapped)[0])
    assert bool(valid_topk_selection(s, swapped, atol=0.01)[0])
    assert not bool(valid_topk_selection(s, torch.tensor([[2]]), atol=0.01)[0])


def test_routing_ids_well_formed() -> None:
    ids = torch.tensor([[0, 3], [3, 3], [-1, 2], [1, 4], [2, 1]], dtype=torch.int32)
    assert routing_ids_well_formed(ids, 4).tolist() == [True, False, False, False, True]
    assert routing_ids_well_formed(torch.empty(0, 2, dtype=torch.int64), 4).shape == (0,)


# ---------------------------------------------------------------------------------------------- sizes


def test_m_zero_gives_empty_outputs() -> None:
    x = torch.empty(0, 8, dtype=torch.bfloat16)
    for w, ids in (
        topk_route(x, 2),
        topk_route(x, 2, renormalize=True, order="topk_then_softmax"),
        topk_route(x, 2, scoring="sigmoid", correction_bias=torch.zeros(8)),
        grouped_topk_route(x, 2, num_groups=4, topk_group=2, scoring="sigmoid", correction_bias=torch.zeros(8)),
        llama4_top1_route(x),
    ):
        assert w.dtype == torch.float32 and ids.dtype == torch.int32 and w.shape[0] == ids.shape[0] == 0
    assert topk_selection_scores(x, 2).shape == (0, 8)
    assert valid_topk_selection(torch.empty(0, 8), torch.empty(0, 2, dtype=torch.int32)).shape == (0,)


def test_m_one_k_one_and_k_equals_e() -> None:
    x = _randn(1, 7, seed=41)
    w, ids = topk_route(x, 1)
    assert ids.item() == int(np.argmax(x.numpy()))
    w, ids = topk_route(x, 7, renormalize=True)
    assert sorted(ids[0].tolist()) == list(range(7))
    np.testing.assert_allclose(float(w.double().sum()), 1.0, rtol=1e-6)
    np.testing.assert_allclose(w.numpy(), np.take_along_axis(softmax64(x), ids.long().numpy(), 1), rtol=4e-6)


# --------------------------------------------------------------------------------------------- Llama 4


def test_llama4_top1_against_argmax_and_sigmoid_formula() -> None:
    x = _randn(20, 16, seed=42, dtype=torch.bfloat16)
    x[3] = 0.5  # a tied row
    w, ids = llama4_top1_route(x)
    check_shapes(w, ids, 20, 1)
    for row, got in zip(x.float().tolist(), ids[:, 0].tolist()):
        assert got == min(range(16), key=lambda i: (-row[i], i))
    want = sigmoid64(torch.gather(x, 1, ids.long()))
    np.testing.assert_allclose(w.numpy(), want, rtol=2e-6, atol=0)
    assert torch.equal(llama4_top1_selection_scores(x), x.float())


# --------------------------------------------------------------------------------------- non-finite rows


def _nonfinite_rows(e: int) -> torch.Tensor:
    x = _randn(5, e, seed=43)
    x[0] = NAN
    x[1, 2] = NAN
    x[2, 5] = INF
    x[3, [1, 4]] = -INF
    return x  # row 4 stays finite


def test_zero_policy_softmax_rows() -> None:
    x = _nonfinite_rows(8)
    for renormalize in (False, True):
        w, ids = topk_route(x, 3, renormalize=renormalize)
        assert bool(routing_ids_well_formed(ids, 8).all()) and bool(torch.isfinite(w).all())
        # a NaN or +Inf anywhere makes the softmax row NaN -> all scores 0 -> ids 0..k-1, weights 0
        assert ids[:3].tolist() == [[0, 1, 2]] * 3
        assert w[:3].eq(0).all()
        # -Inf logits are ordinary: probability 0, never selected over finite experts
        assert not ({1, 4} & set(ids[3].tolist()))
        want = np.take_along_axis(softmax64(x[3:]), ids[3:].long().numpy(), axis=1)
        if renormalize:
            want = want / want.sum(axis=1, keepdims=True)
        np.testing.assert_allclose(w[3:].numpy(), want, rtol=4e-6)


def test_zero_policy_sigmoid_zeroes_only_nan_experts() -> None:
    x = _nonfinite_rows(8)
    w, ids = topk_route(x, 3, scoring="sigmoid")
    assert ids[0].tolist() == [0, 1, 2] and w[0].eq(0).all()
    assert 2 not in ids[1].tolist() or bool(w[1].eq(0).any())
    assert ids[2, 0].item() == 5 and w[2, 0].item() == 1.0  # sigmoid(+Inf) = 1
    sel = topk_selection_scores(x, 3, scoring="sigmoid")
    assert sel[1, 2].item() == 0.0 and not bool(torch.isnan(sel).any())


def test_zero_policy_on_logit_selection_and_grouped() -> None:
    x = _nonfinite_rows(8)
    w, ids = topk_route(x, 3, renormalize=True, order="topk_then_softmax")
    assert ids[0].tolist() == [0, 1, 2] and w[0].eq(0).all()  # NaN ranks as -Inf
    assert 2 not in ids[1].tolist()
    assert w[2].eq(0).all()  # softmax over a selected +Inf is NaN -> 0
    w, ids = llama4_top1_route(x)
    assert ids[:3, 0].tolist() == [0, ids[1, 0].item(), 5] and w[0, 0].item() == 0.0 and w[2, 0].item() == 1.0
    bias = torch.arange(8, dtype=torch.float32) / 8  # the bias alone decides NaN rows
    w, ids = grouped_topk_route(x, 2, num_groups=4, topk_group=2, scoring="softmax", correction_bias=bias)
    assert bool(routing_ids_well_formed(ids, 8).all()) and bool(torch.isfinite(w).all())
    assert ids[0].tolist() == [7, 6] and w[0].eq(0).all()
    w, ids = grouped_topk_route(x, 2, num_groups=4, topk_group=2, scoring="softmax")
    assert ids[0].tolist() == [0, 1] and w[0].eq(0).all()


def test_raise_policy() -> None:
    x = _nonfinite_rows(8)
    with pytest.raises(ValueError, match="router_logits contains NaN or Inf"):
        topk_route(x, 2, nonfinite=NonFinitePolicy.RAISE)
    with pytest.raises(ValueError, match="router_logits contains NaN or Inf"):
        llama4_top1_route(x, nonfinite="raise")
    w, _ = topk_route(x[4:], 2, nonfinite="raise")
    assert bool(torch.isfinite(w).all())


# ---------------------------------------------------------------------------------- property (hypothesis)


@given(
    m=st.integers(0, 6), groups=st.sampled_from([1, 2, 4]), per_group=st.integers(2, 5),
    data=st.data(), seed=st.integers(0, 2**16),
)
def test_any_routing_is_well_formed_and_self_valid(m: int, groups: int, per_group: int, data, seed: int) -> None:  # type: ignore[no-untyped-def]
    e = groups * per_group
    topk_group = data.draw(st.integers(1, groups))
    k = data.draw(st.integers(1, topk_group * per_group))
    x = _randn(m, e, seed=seed, dtype=torch.float16, scale=3.0)
    bias = _randn(1, e, seed=seed + 1, scale=0.5)[0]
    kw = dict(num_groups=groups, topk_group=topk_group, scoring=Scoring.SIGMOID, correction_bias=bias)
    before = x.clone()
    cases = [
        (grouped_topk_route(x, k, **kw), grouped_topk_selection_scores(x, k, **kw)),
        (topk_route(x, k, renormalize=True), topk_selection_scores(x, k, renormalize=True)),
    ]
    for (w, ids), scores in cases:
        assert bool(routing_ids_well_formed(ids, e).all())
        assert bool(valid_topk_selection(scores, ids).all())
        assert bool(torch.isfinite(w).all()) and bool((w >= 0).all())
    assert torch.equal(x, before)  # inputs unchanged


# --------------------------------------------------------------------------------------------- errors

X = torch.zeros(2, 8)
B8 = torch.zeros(8)

ERRORS = [
    (lambda: topk_route([[1.0]], 1), "router_logits must be a torch.Tensor"),
    (lambda: topk_route(torch.zeros(8), 1), "router_logits must be 2-D"),
    (lambda: topk_route(torch.zeros(2, 8, dtype=torch.int32), 1), "router_logits must have dtype"),
    (lambda: topk_route(torch.zeros(2, 0), 1), "router_logits must have at least one expert"),
    (lambda: topk_route(X, 0), "k must be >= 1"),
    (lambda: topk_route(X, 2.0), "k must be an int"),
    (lambda: topk_route(X, 9), r"k must be <= the number of experts E=8, got 9"),
    (lambda: topk_route(X, 2, scoring="relu"), "scoring must be one of"),
    (lambda: topk_route(X, 2, order="sorted"), "order must be one of"),
    (lambda: topk_route(X, 2, nonfinite="ignore"), "nonfinite must be one of"),
    (lambda: topk_route(X, 2, renormalize=1), "renormalize must be a bool"),
    (lambda: topk_route(X, 2, correction_bias=torch.zeros(7)), r"correction_bias must have shape \[8\]"),
    (lambda: topk_route(X, 2, correction_bias=torch.zeros(1, 8)), r"correction_bias must have shape \[8\]"),
    (lambda: topk_route(X, 2, correction_bias=torch.zeros(8, dtype=torch.bfloat16)),
     "correction_bias must have dtype in"),
    (lambda: topk_route(X, 2, correction_bias=torch.zeros(8, dtype=torch.float64)),
     "correction_bias must have dtype in"),
    (lambda: topk_route(X, 2, correction_bias=torch.full((8,), NAN)), "correction_bias must be finite"),
    (lambda: topk_route(X, 2, renormalize=True, order="topk_then_softmax", scoring="sigmoid"),
     "requires scoring='softmax'"),
    (lambda: topk_route(X, 2, renormalize=True, order="topk_then_softmax", correction_bias=B8),
     "correction_bias is not supported with order='topk_then_softmax'"),
    (lambda: topk_route(X, 2, order="topk_then_softmax"), "renormalize must be True with order="),
    (lambda: grouped_topk_route(X, 9, num_groups=2, topk_group=1, scoring="softmax"),
     "k must be <= the number of experts"),
    (lambda: grouped_topk_route(X, 2, num_groups=3, topk_group=1, scoring="softmax"),
     "num_groups must divide the number of experts E=8, got 3"),
    (lambda: grouped_topk_route(X, 2, num_groups=0, topk_group=1, scoring="softmax"), "num_groups must be >= 1"),
    (lambda: grouped_topk_route(X, 2, num_groups=2, topk_group=3, scoring="softmax"),
     "topk_group must be <= 2, got 3"),
    (lambda: grouped_topk_route(X, 2, num_groups=2, topk_group=0, scoring="softmax"), "topk_group must be >= 1"),
    (lambda: grouped_topk_route(X, 5, num_groups=2, topk_group=1, scoring="softmax"),
     r"k must be <= topk_group \* experts per group = 1 \* 4, got 5"),
    (lambda: grouped_topk_route(X, 2, num_groups=8, topk_group=4, scoring="sigmoid", correction_bias=B8),
     "at least 2 experts per group"),
    (lambda: grouped_topk_route(X, 2, num_groups=2, topk_group=1, scoring="tanh"), "scoring must be one of"),
    (lambda: grouped_topk_route(X, 2, num_groups=2, topk_group=1, scoring="sigmoid",
                                correction_bias=torch.zeros(4)), r"correction_bias must have shape \[8\]"),
    (lambda: grouped_topk_route(X, 2, num_groups=2, topk_group=1, scoring="sigmoid", routed_scaling_factor=0.0),
     "routed_scaling_factor must be a finite number > 0"),
    (lambda: grouped_topk_route(X, 2, num_groups=2, topk_group=1, scoring="sigmoid",
                                routed_scaling_factor=INF), "routed_scaling_factor must be a finite number > 0"),
    (lambda: grouped_topk_route(X, 2, num_groups=2, topk_group=1, scoring="sigmoid", scaling_placement="gemm"),
     "scaling_placement must be one of"),
    (lambda: grouped_topk_route(X, 2, num_groups=2, topk_group=1, scoring="sigmoid", renormalize=None),
     "renormalize must be a bool"),
    (lambda: llama4_top1_route(torch.zeros(3)), "router_logits must be 2-D"),
    (lambda: valid_topk_selection(X, torch.zeros(2, 2)), "ids must have dtype in"),
    (lambda: valid_topk_selection(X, torch.zeros(3, 2, dtype=torch.int32)), "ids must have 2 rows"),
    (lambda: valid_topk_selection(X, torch.zeros(2, 9, dtype=torch.int32)), "ids must have between 1 and E=8"),
    (lambda: valid_grouped_topk_selection(X, torch.zeros(3, 2, dtype=torch.int32), num_groups=2, topk_group=1,
                                          scoring="softmax"), "ids must have 2 rows"),
    (lambda: valid_grouped_topk_selection(X, torch.zeros(2, 2, dtype=torch.int32), num_groups=2, topk_group=1,
                                          scoring="softmax", atol=-1e-6), "atol must be a number"),
    (lambda: valid_topk_selection(X, torch.zeros(2, 1, dtype=torch.int32), atol=-1.0), "atol must be a number"),
    (lambda: routing_ids_well_formed(torch.zeros(2, 2, dtype=torch.int32), 0), "num_experts must be >= 1"),
    (lambda: routing_ids_well_formed(torch.zeros(2), 4), "ids must be 2-D"),
]


@pytest.mark.parametrize(("call", "match"), ERRORS, ids=[m for _, m in ERRORS])
def test_value_errors(call, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=match):
        call()


def test_fp64_bias_allowed_with_fp64_logits() -> None:
    x = _randn(3, 8, seed=44, dtype=torch.float64)
    _, ids = topk_route(x, 2, scoring="sigmoid", correction_bias=torch.zeros(8, dtype=torch.float64))
    assert bool(routing_ids_well_formed(ids, 8).all())


# ------------------------------------------------------------------ the tie rule: perturbations, groups, NaN


def test_valid_topk_selection_atol_is_a_perturbation_not_a_chain() -> None:
    # 0.95 and 0.9 are each within 0.06 of their neighbour, but dropping 1.0 for 0.9 moves a score by 0.1
    s = torch.tensor([[1.0, 0.95, 0.9]])
    got = {ids: bool(valid_topk_selection(s, torch.tensor([ids]), atol=0.06)[0]) for ids in [(0, 1), (0, 2), (1, 2)]}
    assert got == {(0, 1): True, (0, 2): True, (1, 2): False}


def test_valid_topk_selection_ranks_nan_first() -> None:
    s = torch.tensor([[NAN, 1.0, INF, 0.0], [NAN, NAN, NAN, NAN], [NAN, NAN, 2.0, 1.0]])
    def ok(ids: list[list[int]]) -> list[bool]:
        return valid_topk_selection(s, torch.tensor(ids)).tolist()
    assert ok([[0], [3], [0]]) == [True, True, True]
    assert ok([[2], [1], [1]]) == [False, True, True]  # +Inf ranks below NaN; NaNs tie
    assert ok([[0, 2], [0, 1], [0, 1]]) == [True, True, True]
    assert ok([[2, 1], [2, 3], [0, 2]]) == [False, True, False]


def test_grouped_tied_groups_may_be_swapped() -> None:
    # all 16 experts score 1/16: every pair of groups ties, so any 4 ids within 2 groups are a valid choice
    x = torch.zeros(1, 16)
    kw = dict(num_groups=4, topk_group=2, scoring="softmax")
    ids = torch.tensor([[9, 10, 11, 12]])  # groups 2 and 3, the oracle keeps 0 and 1
    assert not bool(valid_topk_selection(grouped_topk_selection_scores(x, 4, **kw), ids)[0])
    assert bool(valid_grouped_topk_selection(x, ids, **kw)[0])
    assert not bool(valid_grouped_topk_selection(x, torch.tensor([[0, 5, 9, 13]]), **kw)[0])  # 4 groups


def test_grouped_clearly_worse_group_or_expert_is_invalid() -> None:
    # groups of 2, sigmoid max: g0 = s(3), g1 = g2 = s(2) tie, g3 = s(0); topk_group = 2 keeps g0 and g1 or g2
    x = torch.tensor([[3.0, 0.0, 2.0, 0.0, 2.0, 0.0, 0.0, -1.0]])
    kw = dict(num_groups=4, topk_group=2, scoring="sigmoid")
    got = {ids: bool(valid_grouped_topk_selection(x, torch.tensor([ids]), **kw)[0])
           for ids in [(0, 2), (0, 4), (2, 0), (0, 6), (2, 4), (0, 1)]}
    # (0, 6): g3 kept over g1/g2; (2, 4): g0 dropped; (0, 1): expert 1 (s(0)) kept over expert 2 (s(2))
    assert got == {(0, 2): True, (0, 4): True, (2, 0): True, (0, 6): False, (2, 4): False, (0, 1): False}


def test_grouped_near_tie_within_atol_at_group_level() -> None:
    # fp32 sigmoid: s(16) = 1 - 2^-23, s(17) = 1 - 2^-24 (1 - 1.1e-7 and 1 - 4.1e-8, rounded): group 1 wins by 2^-24
    x = torch.tensor([[16.0, 0.0, 17.0, 0.0], [2.0, 0.0, 3.0, 0.0]])
    kw = dict(num_groups=2, topk_group=1, scoring="sigmoid")
    sel = grouped_topk_selection_scores(x, 1, **kw)
    assert sel[0, 2].item() - sel[0].max().item() == 0.0 and sel[0, 2].item() == 1 - 2**-24
    ids = torch.tensor([[0], [0]])
    assert valid_grouped_topk_selection(x, ids, **kw).tolist() == [False, False]
    assert valid_grouped_topk_selection(x, ids, **kw, atol=1e-6).tolist() == [True, False]
    # with a bias the group score sums two biased scores: a gap of 2 * atol is still a tie there
    bias = torch.zeros(4)
    x2 = torch.tensor([[16.0, 16.0, 17.0, 17.0]])  # g0 = 2 (1 - 2^-23), g1 = 2 (1 - 2^-24): 2^-23 apart
    kw2 = dict(kw, correction_bias=bias)
    assert not bool(valid_grouped_topk_selection(x2, torch.tensor([[0]]), **kw2, atol=0.75 * 2**-24)[0])
    assert bool(valid_grouped_topk_selection(x2, torch.tensor([[0]]), **kw2, atol=2**-24)[0])


def _grouped_valid_sets(scores: torch.Tensor, biased: torch.Tensor, with_bias: bool, num_groups: int,
                        topk_group: int, k: int) -> set[frozenset[int]]:
    """Every id set a grouped router may return for one row under exact ties, by enumeration: for each choice of
    groups none of which scores below a dropped group, the k-subsets of its experts with the largest sum."""
    e = scores.shape[0]
    n = e // num_groups
    if with_bias:  # the oracle's fp32 top-2 sum
        gscore = [float(torch.sort(biased[g * n:(g + 1) * n], descending=True).values[:2].sum()) for g in
                  range(num_groups)]
    else:
        gscore = [float(scores[g * n:(g + 1) * n].max()) for g in range(num_groups)]
    found: set[frozenset[int]] = set()
    for kept in itertools.combinations(range(num_groups), topk_group):
        dropped = [g for g in range(num_groups) if g not in kept]
        if dropped and min(gscore[g] for g in kept) < max(gscore[g] for g in dropped):
            continue
        allowed = [i for g in kept for i in range(g * n, (g + 1) * n)]
        # the multiset of the k largest decides: compare sorted values, not float sums (no rounding)
        best = sorted((float(biased[i]) for i in allowed), reverse=True)[:k]
        for subset in itertools.combinations(allowed, k):
            if sorted((float(biased[i]) for i in subset), reverse=True) == best:
                found.add(frozenset(subset))
    return found


@pytest.mark.parametrize(("groups", "per_group", "topk_group", "k", "scoring", "with_bias"), [
    (4, 2, 2, 3, Scoring.SIGMOID, True), (4, 2, 2, 2, Scoring.SOFTMAX, False), (3, 3, 2, 4, Scoring.SIGMOID, False),
    (6, 1, 3, 2, Scoring.SOFTMAX, False), (2, 4, 1, 3, Scoring.SIGMOID, True),
])
def test_grouped_validity_against_enumeration_under_ties(
    groups: int, per_group: int, topk_group: int, k: int, scoring: Scoring, with_bias: bool
) -> None:
    e = groups * per_group
    g = torch.Generator().manual_seed(50 + e)
    x = torch.randint(-1, 2, (6, e), generator=g).to(torch.float32)  # three values: ties everywhere
    x[0] = 0.0
    bias = (torch.arange(per_group) / 4).repeat(groups).to(torch.float32) if with_bias else None
    kw = dict(num_groups=groups, topk_group=topk_group, scoring=scoring, correction_bias=bias)
    scores = topk_selection_scores(x, 1, scoring=scoring)
    biased = scores if bias is None else scores + bias
    subsets = list(itertools.combinations(range(e), k))
    ids = torch.tensor(subsets)
    for row in range(x.shape[0]):
        want = _grouped_valid_sets(scores[row], biased[row], with_bias, groups, topk_group, k)
        got = valid_grouped_topk_selection(x[row:row + 1].expand(len(subsets), e), ids, **kw)
        assert {frozenset(s) for s, ok in zip(subsets, got.tolist()) if ok} == want, f"row {row}"
        _, own = grouped_topk_route(x[row:row + 1], k, **kw)
        assert frozenset(own[0].tolist()) in want  # the oracle's own choice is one of them


# ------------------------------------------------------------------------------------------ masked experts


def test_finite_or_masked_rows() -> None:
    x = torch.tensor([[0.0, 1.0], [-INF, 1.0], [-INF, -INF], [NAN, 1.0], [INF, 1.0]])
    assert finite_or_masked_rows(x).tolist() == [True, True, False, False, False]


@pytest.mark.parametrize("scoring", list(Scoring))
def test_masked_experts_are_never_selected_over_positive_scores(scoring: Scoring) -> None:
    x = torch.tensor([[-INF, 1.0, 0.5, -INF, 2.0, 0.0], [-INF, 1.0, -INF, -INF, -INF, -INF]])
    for policy in ("zero", "propagate", "raise"):  # masked rows are ordinary under every rule
        w, ids = topk_route(x, 3, scoring=scoring, renormalize=True, nonfinite=policy)
        assert set(ids[0].tolist()) == {1, 2, 4}
        assert ids[1, 0].item() == 1 and w[1, 0].item() == 1.0 and w[1, 1:].eq(0).all()  # then ties at 0
    sel = topk_selection_scores(x, 3, scoring=scoring)
    assert sel[:, [0, 3]].eq(0).all()  # a masked expert scores exactly 0
    assert valid_topk_selection(sel, torch.tensor([[0, 1, 4], [1, 5, 3]])).tolist() == [False, True]
    # grouped, groups of 2: a fully masked group scores 0 and loses to any group with a positive score
    g = torch.tensor([[-INF, -INF, 1.0, 0.5, 2.0, 0.0], [-INF, -INF, -INF, -INF, 2.0, -INF]])
    kw = dict(num_groups=3, scoring=scoring)
    assert valid_grouped_topk_selection(g, torch.tensor([[4, 5], [4, 5]]), topk_group=1, **kw).tolist() == [True] * 2
    assert valid_grouped_topk_selection(g, torch.tensor([[0, 1], [0, 4]]), topk_group=1, **kw).tolist() == [False] * 2
    # two groups kept, 3 ids: row 0 keeps g2 and g1; row 1 has one positive expert, any zero one fills the slots
    got = valid_grouped_topk_selection(g, torch.tensor([[4, 2, 3], [4, 5, 1]]), topk_group=2, **kw)
    assert got.tolist() == [True, True]
    got = valid_grouped_topk_selection(g, torch.tensor([[4, 2, 0], [4, 0, 1]]), topk_group=2, **kw)
    assert got.tolist() == [False, True]


def test_masked_expert_selected_by_its_bias() -> None:
    # with a correction bias the masked expert's selection score is its bias, as production routers compute it
    x = torch.tensor([[-INF, 0.0, 0.0, 0.0]])
    w, ids = topk_route(x, 1, scoring="sigmoid", correction_bias=torch.tensor([1.0, 0.0, 0.0, 0.0]))
    assert ids.tolist() == [[0]] and w.tolist() == [[0.0]]
    w, ids = llama4_top1_route(torch.tensor([[-INF, -5.0]]))  # logit-ranked: last
    assert ids.tolist() == [[1]]


# --------------------------------------------------------------------------------------- PROPAGATE policy


def test_propagate_policy_is_ieee_arithmetic() -> None:
    x = _nonfinite_rows(8)  # NaN row, one NaN, one +Inf, two -Inf, finite
    x = torch.cat([x, torch.full((1, 8), -INF)])  # and a row of -Inf only
    w, ids = topk_route(x, 3, renormalize=True, nonfinite="propagate")
    assert bool(routing_ids_well_formed(ids, 8).all())
    assert w[[0, 1, 2, 5]].isnan().all()  # softmax of a NaN, a +Inf or only -Inf is NaN throughout
    w_zero, ids_zero = topk_route(x, 3, renormalize=True)
    assert torch.equal(w[3:5], w_zero[3:5]) and torch.equal(ids[3:5], ids_zero[3:5])  # masked and finite: alike
    # sigmoid: the NaN expert is selected first with a NaN weight; renormalizing spreads it over the row
    w, ids = topk_route(x, 3, scoring="sigmoid", nonfinite="propagate")
    assert ids[1, 0].item() == 2 and math.isnan(w[1, 0].item()) and bool(w[1, 1:].isfinite().all())
    assert ids[2, 0].item() == 5 and w[2, 0].item() == 1.0  # sigmoid(+Inf) = 1 is finite
    w, _ = topk_route(x, 3, scoring="sigmoid", renormalize=True, nonfinite="propagate")
    assert w[1].isnan().all() and w[5].isnan().all()  # 0 / 0 on the -Inf row
    sel = topk_selection_scores(x, 3, scoring="sigmoid", nonfinite="propagate")
    assert bool(valid_topk_selection(sel, ids).all())
    spare = next(i for i in range(8) if i not in ids[1].tolist())
    without_nan = [spare if i == 2 else i for i in ids[1].tolist()]  # the NaN expert left out
    assert not bool(valid_topk_selection(sel[1:2], torch.tensor([without_nan]))[0])
    # logit-ranked selections put NaN first too
    w, ids = llama4_top1_route(x, nonfinite="propagate")
    assert ids[1, 0].item() == 2 and math.isnan(w[1, 0].item()) and ids[2, 0].item() == 5
    w, ids = topk_route(x, 2, renormalize=True, order="topk_then_softmax", nonfinite="propagate")
    assert 2 in ids[1].tolist() and w[1].isnan().all()


def test_propagate_policy_grouped_keeps_the_nan_group_first() -> None:
    x = _randn(2, 8, seed=45)
    x[0, 6] = NAN  # group 3 of 4
    kw = dict(num_groups=4, topk_group=1, scoring=Scoring.SIGMOID, nonfinite=NonFinitePolicy.PROPAGATE)
    for bias in (None, torch.zeros(8)):
        w, ids = grouped_topk_route(x, 2, correction_bias=bias, **kw)
        assert set(ids[0].tolist()) == {6, 7} and w[0].isnan().all()
        assert valid_grouped_topk_selection(x, ids, correction_bias=bias, **kw).all()
        assert valid_grouped_topk_selection(x, torch.tensor([[7, 6], [0, 1]]), correction_bias=bias,
                                            **kw).tolist()[0]
        assert not valid_grouped_topk_selection(x, torch.tensor([[0, 1], [0, 1]]), correction_bias=bias,
                                                **kw).tolist()[0]


def test_raise_policy_accepts_masked_rows() -> None:
    x = torch.tensor([[-INF, 1.0, 0.0]])
    _, ids = topk_route(x, 2, nonfinite="raise")
    assert set(ids[0].tolist()) == {1, 2}
    with pytest.raises(ValueError, match="router_logits contains NaN or Inf"):
        topk_route(torch.full((1, 3), -INF), 1, nonfinite="raise")
