"""The routing oracle's declarable rules `group_scoring`, `unkept_groups` and `renormalize_eps` against a direct
emulation written here: plain loops over numpy scalars (each score evaluated in float64 and rounded once to fp32,
fp32 adds and divisions), compared bit for bit; and the grouped validity check against an enumeration of every
id set those rules admit under ties."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from reference.routing import (
    GroupScoring,
    NonFinitePolicy,
    Scoring,
    UnkeptGroups,
    grouped_topk_route,
    topk_route,
    valid_grouped_topk_selection,
)

F32 = np.float32
NAN, INF = math.nan, math.inf


# --------------------------------------------------------------------------------------- direct emulation


def _scores(row: list[float], scoring: str, zero_nonfinite: bool) -> list[np.float32]:
    """Scores in float64, each rounded once to fp32; non-finite ones 0 under the ZERO rule."""
    x = np.array(row, dtype=np.float64)
    with np.errstate(all="ignore"):
        if scoring == "softmax":
            e = np.exp(x - x.max())  # NaN, +inf or only -inf make the whole row NaN
            s = [F32(v / math.fsum(e)) for v in e]
        else:
            s = [F32(1.0 / (1.0 + np.exp(-v))) for v in x]
    return [F32(0.0) if zero_nonfinite and not np.isfinite(v) else v for v in s]


def _order(values: list) -> list[int]:
    """Indices, best first: NaN first, then descending value, ties toward the lower index."""
    return sorted(range(len(values)), key=lambda i: (0, 0.0, i) if np.isnan(values[i]) else (1, -values[i], i))


def _group_score(members: list[np.float32], rule: str) -> np.float32:
    best = [members[i] for i in _order(members)]
    if rule == "max":
        return best[0]
    return best[0] + best[1] if len(best) > 1 else best[0]  # an fp32 add


def _renormalize(w: list[np.float32], policy: str, eps: float) -> list[np.float32]:
    total = F32(math.fsum(float(v) for v in w))  # exact for the moderate scores used here, rounded once
    with np.errstate(all="ignore"):
        if eps > 0:
            return [v / (total + F32(eps)) for v in w]
        if policy == "propagate" or total > 0:
            return [v / total for v in w]
        return list(w)


def _emulate(x: torch.Tensor, k: int, *, scoring: str, bias: torch.Tensor | None = None, groups: int = 1,
             topk_group: int = 1, rule: str | None = None, unkept: str = "excluded", policy: str = "zero",
             eps: float = 0.0, renormalize: bool = True, factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped top-k (groups=1: plain top-k) as the rules say, row by row."""
    rule = rule or ("top2_sum" if bias is not None else "max")
    all_w, all_ids = [], []
    for row in x.tolist():
        s = _scores(row, scoring, policy == "zero")
        biased = s if bias is None else [v + F32(b) for v, b in zip(s, bias.tolist())]  # fp32 adds
        n = len(row) // groups
        gs = [_group_score(biased[g * n:(g + 1) * n], rule) for g in range(groups)]
        kept = set(_order(gs)[:topk_group])
        fill = F32(-INF) if unkept == "excluded" else F32(0.0)
        selection = [biased[i] if i // n in kept else fill for i in range(len(row))]
        ids = _order(selection)[:k]
        w = [s[i] for i in ids]
        w = _renormalize(w, policy, eps) if renormalize else w
        all_w.append([v * F32(factor) for v in w])
        all_ids.append(ids)
    return torch.tensor(np.array(all_w, dtype=np.float32)), torch.tensor(all_ids, dtype=torch.int32)


def _assert_bitwise(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> None:
    assert torch.equal(got[1], want[1]), (got[1], want[1])
    gw, ww = got[0], want[0]
    assert torch.equal(gw.isnan(), ww.isnan()), (gw, ww)
    assert torch.equal(torch.where(gw.isnan(), 0.0, gw).view(torch.int32),
                       torch.where(ww.isnan(), 0.0, ww).view(torch.int32)), (gw, ww)


def _masked_logits(m: int, e: int, seed: int) -> torch.Tensor:
    """Logits in [-4, 4] (moderate scores: the emulation's renormalization sum is exact), a third of the rows with
    most experts masked (-inf), so the kept groups often hold fewer than k positive scores."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(m, e, generator=g, dtype=torch.float64) * 8 - 4
    masked = (torch.arange(m) % 3 == 0)[:, None] & (torch.rand(m, e, generator=g) < 0.8)
    return x.masked_fill(masked, -INF).to(torch.float32)


def _bias(e: int, seed: int) -> torch.Tensor:
    # negative on average: under zero filling an unkept expert (0) then beats kept experts of negative biased score
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(e, generator=g, dtype=torch.float64) - 0.9).to(torch.float32)


# ------------------------------------------------------------------------------------- grouped, bit-exact

RULES = [None, "max", "top2_sum"]


@pytest.mark.parametrize("unkept", ["excluded", "zero_filled"])
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize(("scoring", "biased"), [("softmax", False), ("sigmoid", True), ("sigmoid", False)])
def test_grouped_rules_match_the_direct_emulation(scoring: str, biased: bool, rule: str | None, unkept: str) -> None:
    x = _masked_logits(48, 16, seed=3)
    bias = _bias(16, seed=4) if biased else None
    kw = dict(num_groups=4, topk_group=2, scoring=scoring, correction_bias=bias, routed_scaling_factor=2.5,
              unkept_groups=unkept, **({} if rule is None else {"group_scoring": rule}))
    got = grouped_topk_route(x, 4, **kw)
    want = _emulate(x, 4, scoring=scoring, bias=bias, groups=4, topk_group=2, rule=rule, unkept=unkept, factor=2.5)
    _assert_bitwise(got, want)
    assert bool(valid_grouped_topk_selection(x, got[1], **kw).all())


def test_the_rules_change_the_routing_on_the_emulation_data() -> None:
    """Each rule's value routes some rows of the data above differently (the tests above can tell them apart)."""
    x, bias = _masked_logits(48, 16, seed=3), _bias(16, seed=4)
    for scoring, b in (("softmax", None), ("sigmoid", bias)):
        kw = dict(num_groups=4, topk_group=2, scoring=scoring, correction_bias=b)
        by_rule = [grouped_topk_route(x, 4, group_scoring=r, **kw)[1] for r in ("max", "top2_sum")]
        by_fill = [grouped_topk_route(x, 4, unkept_groups=u, **kw)[1] for u in ("excluded", "zero_filled")]
        assert (by_rule[0].sort().values != by_rule[1].sort().values).any(dim=1).sum() >= 3
        assert (by_fill[0].sort().values != by_fill[1].sort().values).any(dim=1).sum() >= 3


@pytest.mark.parametrize("biased", [True, False])
def test_top2_sum_over_groups_of_one_scores_the_one_expert(biased: bool) -> None:
    x = _masked_logits(24, 8, seed=5)
    bias = _bias(8, seed=6) if biased else None
    kw = dict(num_groups=8, topk_group=3, scoring="sigmoid", correction_bias=bias, group_scoring="top2_sum")
    got = grouped_topk_route(x, 2, **kw)
    _assert_bitwise(got, _emulate(x, 2, scoring="sigmoid", bias=bias, groups=8, topk_group=3, rule="top2_sum"))
    # a group of one: its score is its expert's, so the kept groups are the top-3 experts and top2_sum = max
    assert torch.equal(got[1], grouped_topk_route(x, 2, **{**kw, "group_scoring": "max"})[1])
    # undeclared, the bias path keeps its requirement of two experts per group
    if biased:
        with pytest.raises(ValueError, match="at least 2 experts per group"):
            grouped_topk_route(x, 2, **{**kw, "group_scoring": None})


def test_group_scoring_value_errors() -> None:
    x = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="group_scoring must be one of"):
        grouped_topk_route(x, 2, num_groups=2, topk_group=1, scoring="sigmoid", group_scoring="top3_sum")
    with pytest.raises(ValueError, match="unkept_groups must be one of"):
        grouped_topk_route(x, 2, num_groups=2, topk_group=1, scoring="sigmoid", unkept_groups="zero")
    for eps in (-1e-20, INF, True):
        with pytest.raises(ValueError, match="renormalize_eps must be a finite number >= 0"):
            topk_route(x, 2, renormalize=True, renormalize_eps=eps)


# ---------------------------------------------------------------------------------- the zero-filled witness

WITNESS = torch.tensor([[-3.07] + [-INF] * 15])
W_KW = dict(num_groups=4, topk_group=2, scoring="softmax")


def test_zero_filled_witness_admits_zero_score_ids_from_unkept_groups() -> None:
    router = torch.tensor([[0, 10, 11, 12]])  # 10, 11: group 2; 12: group 3 (kept: group 0 and one other)
    assert not bool(valid_grouped_topk_selection(WITNESS, router, **W_KW)[0])
    assert bool(valid_grouped_topk_selection(WITNESS, router, **W_KW, unkept_groups="zero_filled")[0])
    # zeros from three groups tie as well; a zero in place of the positive score does not
    assert bool(valid_grouped_topk_selection(WITNESS, torch.tensor([[0, 5, 10, 15]]), **W_KW,
                                             unkept_groups="zero_filled")[0])
    assert not bool(valid_grouped_topk_selection(WITNESS, torch.tensor([[1, 10, 11, 12]]), **W_KW,
                                                 unkept_groups="zero_filled")[0])
    w, ids = grouped_topk_route(WITNESS, 4, **W_KW, unkept_groups="zero_filled")
    assert ids.tolist() == [[0, 1, 2, 3]] and w.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    assert torch.equal(w, grouped_topk_route(WITNESS, 4, **W_KW)[0])


# ------------------------------------------------------------------------------------ renormalize_eps

EPS_ROWS = torch.tensor([
    [-INF] * 8,  # sigmoid: all scores 0; softmax: NaN
    [NAN] * 8,
    [0.5, -1.0, 2.0, 1.5, -0.5, 0.25, 3.0, -2.0],  # a normal row: sum + 1e-20 is the sum in fp32
    [-50.0, -51.0, -49.5, -52.0, -50.5, -53.0, -49.0, -51.5],  # sigmoid sums ~1e-21: the eps shows
    [1.0, -INF, -INF, -INF, 0.5, -INF, -INF, -INF],  # masked: fewer than k positive scores
])


@pytest.mark.parametrize("eps", [1e-20, 0.0])
@pytest.mark.parametrize("policy", ["propagate", "zero"])
@pytest.mark.parametrize("scoring", ["sigmoid", "softmax"])
def test_renormalize_eps_matches_the_direct_emulation(scoring: str, policy: str, eps: float) -> None:
    kw = dict(scoring=scoring, nonfinite=NonFinitePolicy(policy), renormalize=True, renormalize_eps=eps)
    want = _emulate(EPS_ROWS, 4, scoring=scoring, policy=policy, eps=eps)
    _assert_bitwise(topk_route(EPS_ROWS, 4, **kw), want)
    grouped = _emulate(EPS_ROWS, 4, scoring=scoring, groups=4, topk_group=2, policy=policy, eps=eps, factor=2.5)
    _assert_bitwise(grouped_topk_route(EPS_ROWS, 4, num_groups=4, topk_group=2, routed_scaling_factor=2.5, **kw),
                    grouped)


def test_renormalize_eps_witness_rows() -> None:
    """sum + 1e-20 with NaN propagating: an all -inf sigmoid row gives 0, a NaN row NaN; neither old rule fits."""
    w, _ = topk_route(EPS_ROWS, 4, scoring="sigmoid", renormalize=True, nonfinite="propagate", renormalize_eps=1e-20)
    assert w[0].tolist() == [0.0] * 4 and bool(w[1].isnan().all()) and bool(w[2].isfinite().all())
    assert bool(w[3].sum() < 0.5)  # sum + 1e-20 with a sum of ~1e-21
    plain, _ = topk_route(EPS_ROWS, 4, scoring="sigmoid", renormalize=True, nonfinite="propagate")
    zero, _ = topk_route(EPS_ROWS, 4, scoring="sigmoid", renormalize=True, nonfinite="zero")
    assert bool(plain[0].isnan().all()) and zero[1].tolist() == [0.0] * 4
    assert torch.equal(w[2], plain[2]) and torch.equal(w[2], zero[2])
    soft, _ = topk_route(EPS_ROWS, 4, scoring="softmax", renormalize=True, nonfinite="propagate", renormalize_eps=1e-20)
    assert bool(soft[0].isnan().all()) and bool(soft[1].isnan().all())  # softmax of only -inf is NaN


# ------------------------------------------------------------------------- validity against enumeration


def _admitted(biased: list[np.float32], rule: str, fill: float, groups: int, topk_group: int,
              k: int) -> set[frozenset[int]]:
    """Every id set the rules admit for one row, by enumeration: for each choice of groups none of which scores
    below a dropped group, the selection (biased scores in the kept groups, the fill elsewhere) and its k-subsets
    whose sorted values equal the k largest."""
    e = len(biased)
    n = e // groups
    gs = [_group_score(biased[g * n:(g + 1) * n], rule) for g in range(groups)]
    found: set[frozenset[int]] = set()
    for kept in itertools.combinations(range(groups), topk_group):
        dropped = [g for g in range(groups) if g not in kept]
        if dropped and min(gs[g] for g in kept) < max(gs[g] for g in dropped):
            continue
        sel = [float(biased[i]) if i // n in kept else fill for i in range(e)]
        best = sorted(sel, reverse=True)[:k]
        for subset in itertools.combinations(range(e), k):
            if sorted((sel[i] for i in subset), reverse=True) == best:
                found.add(frozenset(subset))
    return found


@pytest.mark.parametrize("unkept", ["excluded", "zero_filled"])
@pytest.mark.parametrize("rule", ["max", "top2_sum"])
@pytest.mark.parametrize(("groups", "per_group", "topk_group", "k", "biased"), [
    (4, 2, 2, 3, True), (4, 2, 2, 3, False), (3, 3, 2, 4, False), (6, 1, 3, 2, True), (2, 4, 1, 3, True),
])
def test_grouped_validity_against_enumeration(groups: int, per_group: int, topk_group: int, k: int, biased: bool,
                                              rule: str, unkept: str) -> None:
    e = groups * per_group
    g = torch.Generator().manual_seed(70 + e)
    x = torch.randint(-1, 2, (8, e), generator=g).to(torch.float32)  # few values: ties everywhere
    x[torch.rand(8, e, generator=g) < 0.4] = -INF  # masked experts: zero scores
    x[0] = -INF
    x[0, 0] = 0.0
    bias = ((torch.arange(per_group) / 4).repeat(groups) - 0.375).to(torch.float32) if biased else None
    kw = dict(num_groups=groups, topk_group=topk_group, scoring=Scoring.SIGMOID, correction_bias=bias,
              group_scoring=GroupScoring(rule), unkept_groups=UnkeptGroups(unkept))
    subsets = list(itertools.combinations(range(e), k))
    ids = torch.tensor(subsets)
    fill = -INF if unkept == "excluded" else 0.0
    for row in range(x.shape[0]):
        s = _scores(x[row].tolist(), "sigmoid", True)
        b = s if bias is None else [v + F32(c) for v, c in zip(s, bias.tolist())]
        want = _admitted(b, rule, fill, groups, topk_group, k)
        got = valid_grouped_topk_selection(x[row:row + 1].expand(len(subsets), e), ids, **kw)
        assert {frozenset(s) for s, ok in zip(subsets, got.tolist()) if ok} == want, f"row {row}"
        _, own = grouped_topk_route(x[row:row + 1], k, **kw)
        assert frozenset(own[0].tolist()) in want
