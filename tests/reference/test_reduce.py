"""The unpermute-reduce oracle (reference.reduce) against float64 per-token loops and hand-derived values."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from reference.reduce import ReduceAccumulation, unpermute_reduce

FP32 = ReduceAccumulation.FP32
SEQ = ReduceAccumulation.OUTPUT_DTYPE_SEQUENTIAL

UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float64: 2.0**-53}


def make_inputs(m: int, k: int, h: int, e: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(m, k, h, generator=g).to(dtype)
    w = torch.rand(m, k, generator=g) + 0.05
    rows = [torch.randperm(e, generator=g)[:k] for _ in range(m)]
    ids = torch.stack(rows).to(torch.int32) if rows else torch.zeros(0, k, dtype=torch.int32)
    return y, w, ids


def exact_sum(y, w, ids, *, weighted=True, local=None, factor=1.0) -> torch.Tensor:
    """float64, token by token and slot by slot: factor * sum over local slots of w * y (no rounding)."""
    m, k, h = y.shape
    out = torch.zeros(m, h, dtype=torch.float64)
    for t in range(m):
        for j in range(k):
            if local is not None and int(local[int(ids[t, j])]) < 0:
                continue
            term = y[t, j].double()
            if weighted:
                term = term * float(w[t, j])
            out[t] += term
    return out * factor


def sequential_sum(y, w, ids, out_dtype, *, weighted=True, local=None) -> torch.Tensor:
    """The sequential convention from its statement: terms computed in fp32 and rounded to the output dtype,
    then each add done exactly (float64), rounded to fp32 and then to the output dtype."""
    m, k, h = y.shape
    out = torch.zeros(m, h, dtype=torch.float64)
    for t in range(m):
        acc = torch.zeros(h, dtype=torch.float64)
        for j in range(k):
            if local is not None and int(local[int(ids[t, j])]) < 0:
                continue
            term = y[t, j].double() * (float(w[t, j]) if weighted else 1.0)
            term = term.float().to(out_dtype).double()
            acc = (acc + term).float().to(out_dtype).double()
        out[t] = acc
    return out


@given(
    m=st.integers(0, 6),
    k=st.integers(1, 6),
    h=st.integers(1, 9),
    dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
    seed=st.integers(0, 2**31),
)
def test_fp32_accumulation_within_one_rounding(m, k, h, dtype, seed) -> None:
    y, w, ids = make_inputs(m, k, h, 8, dtype, seed)
    out = unpermute_reduce(y, w, ids)
    assert out.dtype == dtype and out.shape == (m, h)
    exact = exact_sum(y, w, ids)
    abs_terms = exact_sum(y.abs(), w, ids)
    # one rounding to the output dtype, plus fp32 products and k fp32 adds
    bound = UNIT_ROUNDOFF[dtype] * exact.abs() + (k + 1) * 2.0**-24 * abs_terms
    assert ((out.double() - exact).abs() <= bound).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp32_accumulation_is_exactly_one_rounding_on_representable_terms(dtype) -> None:
    """Small integers times power-of-two weights: every fp32 product and sum is exact, so the result must be
    the float64 sum rounded once to the output dtype."""
    g = torch.Generator().manual_seed(5)
    y = torch.randint(-200, 200, (16, 4, 32), generator=g).to(dtype)
    w = 2.0 ** torch.randint(-6, 2, (16, 4), generator=g).float()
    ids = torch.zeros(16, 4, dtype=torch.int32)
    out = unpermute_reduce(y, w, ids, accumulation=FP32)
    assert torch.equal(out, exact_sum(y, w, ids).to(dtype))


@given(
    m=st.integers(1, 5),
    k=st.integers(1, 6),
    dtype=st.sampled_from([torch.bfloat16, torch.float16]),
    weights_applied=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_sequential_accumulation_matches_float64_loop(m, k, dtype, weights_applied, seed) -> None:
    y, w, ids = make_inputs(m, k, 7, 8, dtype, seed)
    out = unpermute_reduce(y, w, ids, accumulation=SEQ, weights_applied=weights_applied)
    assert out.dtype == dtype
    assert torch.equal(out, sequential_sum(y, w, ids, dtype, weighted=not weights_applied).to(dtype))


def test_sequential_and_fp32_accumulation_differ_hand_derived() -> None:
    """bf16 has 8 significant bits: 1 + 2^-8 is a tie and rounds to even (1), twice; fp32 keeps 1 + 2^-7."""
    y = torch.tensor([[[1.0], [2.0**-8], [2.0**-8]]], dtype=torch.bfloat16)
    w = torch.ones(1, 3)
    ids = torch.tensor([[0, 1, 2]], dtype=torch.int32)
    seq = unpermute_reduce(y, w, ids, accumulation=SEQ, weights_applied=True)
    fp32 = unpermute_reduce(y, w, ids, accumulation=FP32, weights_applied=True)
    assert seq.item() == 1.0
    assert fp32.item() == 1.0 + 2.0**-7


def test_sequential_and_fp32_accumulation_differ_on_random_bf16() -> None:
    y, w, ids = make_inputs(32, 8, 64, 16, torch.bfloat16, 1)
    seq = unpermute_reduce(y, w, ids, accumulation=SEQ)
    fp32 = unpermute_reduce(y, w, ids, accumulation=FP32)
    assert (seq != fp32).any()
    # and the fp32 one is the more accurate of the two on average
    exact = exact_sum(y, w, ids)
    assert (fp32.double() - exact).abs().mean() < (seq.double() - exact).abs().mean()


@pytest.mark.parametrize("accumulation", list(ReduceAccumulation))
def test_weights_applied_skips_the_weight(accumulation) -> None:
    y, w, ids = make_inputs(4, 3, 5, 6, torch.float32, 2)
    out = unpermute_reduce(y, w, ids, accumulation=accumulation, weights_applied=True)
    ones = unpermute_reduce(y, torch.ones_like(w), ids, accumulation=accumulation)
    assert torch.equal(out, ones)
    assert not torch.equal(out, unpermute_reduce(y, w, ids, accumulation=accumulation))
    assert torch.allclose(out.double(), exact_sum(y, w, ids, weighted=False), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("accumulation", list(ReduceAccumulation))
def test_apply_router_weight_on_input(accumulation) -> None:
    y, w, ids = make_inputs(5, 1, 4, 4, torch.bfloat16, 3)
    out = unpermute_reduce(y, w, ids, accumulation=accumulation, apply_router_weight_on_input=True)
    assert torch.equal(out, y[:, 0])
    out = unpermute_reduce(
        y, w, ids, accumulation=accumulation, apply_router_weight_on_input=True, routed_scaling_factor=2.0
    )
    assert torch.equal(out, y[:, 0] * 2)


@pytest.mark.parametrize("accumulation", list(ReduceAccumulation))
def test_expert_map_gives_partial_sums_and_ignores_nonlocal_rows(accumulation) -> None:
    y, w, ids = make_inputs(6, 3, 5, 6, torch.float32, 4)
    expert_map = torch.tensor([-1, 0, -1, 1, 2, -1], dtype=torch.int32)
    ids[0] = torch.tensor([0, 2, 5])  # a token with no local slot
    nonlocal_slot = expert_map[ids.long()] < 0
    y[nonlocal_slot] = float("nan")  # whatever a non-local row holds must not leak
    out = unpermute_reduce(y, w, ids, accumulation=accumulation, expert_map=expert_map)
    assert not out.isnan().any()
    assert torch.equal(out[0], torch.zeros(5))
    expected = exact_sum(y, w, ids, local=expert_map)
    assert torch.allclose(out.double(), expected, rtol=1e-6, atol=1e-6)


def test_expert_map_with_no_local_experts_gives_zeros() -> None:
    y, w, ids = make_inputs(3, 2, 4, 4, torch.bfloat16, 6)
    out = unpermute_reduce(y, w, ids, expert_map=torch.full((4,), -1, dtype=torch.int32))
    assert torch.equal(out, torch.zeros(3, 4, dtype=torch.bfloat16))


def test_routed_scaling_factor_fp32() -> None:
    y, w, ids = make_inputs(5, 4, 6, 8, torch.bfloat16, 7)
    out = unpermute_reduce(y, w, ids, routed_scaling_factor=2.5)
    exact = exact_sum(y, w, ids, factor=2.5)
    bound = 2.0**-8 * exact.abs() + 6 * 2.0**-24 * exact_sum(y.abs(), w, ids, factor=2.5)
    assert ((out.double() - exact).abs() <= bound).all()
    # applied to the fp32 sum, before the single rounding (a factor of 2 is exact in fp32)
    assert torch.equal(
        unpermute_reduce(y, w, ids, routed_scaling_factor=2.0, out_dtype=torch.float32),
        unpermute_reduce(y, w, ids, out_dtype=torch.float32) * 2,
    )


def test_routed_scaling_factor_sequential_scales_the_rounded_sum() -> None:
    y, w, ids = make_inputs(5, 4, 6, 8, torch.bfloat16, 8)
    seq = sequential_sum(y, w, ids, torch.bfloat16)
    out = unpermute_reduce(y, w, ids, accumulation=SEQ, routed_scaling_factor=2.5)
    assert torch.equal(out, (seq * 2.5).float().to(torch.bfloat16))


def test_out_dtype_fp32_from_bf16_is_the_unrounded_fp32_sum() -> None:
    g = torch.Generator().manual_seed(9)
    y = torch.randint(-100, 100, (4, 3, 8), generator=g).to(torch.bfloat16) / 64
    w = torch.full((4, 3), 0.5)
    ids = torch.zeros(4, 3, dtype=torch.int32)
    out = unpermute_reduce(y, w, ids, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    assert torch.equal(out.double(), exact_sum(y, w, ids))


def test_fp64_input_is_summed_in_fp64() -> None:
    y, w, ids = make_inputs(4, 5, 6, 8, torch.float64, 10)
    out = unpermute_reduce(y, w, ids)
    assert out.dtype == torch.float64
    assert torch.allclose(out, exact_sum(y, w, ids), rtol=1e-14, atol=1e-14)
    assert not torch.equal(out, unpermute_reduce(y.float(), w, ids).double())


def test_empty_batch() -> None:
    out = unpermute_reduce(torch.zeros(0, 2, 5, dtype=torch.bfloat16), torch.zeros(0, 2),
                           torch.zeros(0, 2, dtype=torch.int32))
    assert out.shape == (0, 5) and out.dtype == torch.bfloat16


Y = torch.zeros(2, 2, 3)
W = torch.ones(2, 2)
IDS = torch.zeros(2, 2, dtype=torch.int32)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(expert_out=Y[0]), "expert_out must be 3-D"),
        (dict(expert_out=Y.int()), "expert_out must have dtype"),
        (dict(topk_weights=W.bfloat16()), "topk_weights must have dtype"),
        (dict(topk_weights=W[:1]), r"topk_weights must have shape \[2, 2\]"),
        (dict(topk_ids=IDS.float()), "topk_ids must have dtype"),
        (dict(topk_ids=IDS[:, :1]), r"topk_ids must have shape \[2, 2\]"),
        (dict(topk_ids=-1 - IDS), "topk_ids must hold expert ids >= 0"),
        (dict(accumulation="bf16"), "accumulation must be one of"),
        (dict(apply_router_weight_on_input=True), "apply_router_weight_on_input requires top_k == 1, got top_k=2"),
        (dict(expert_out=Y[:, :1], topk_weights=W[:, :1], topk_ids=IDS[:, :1], apply_router_weight_on_input=True,
              weights_applied=True), "apply_router_weight_on_input and weights_applied are exclusive"),
        (dict(weights_applied=1), "weights_applied must be a bool"),
        (dict(expert_map=torch.zeros(2, 2, dtype=torch.int32)), "expert_map must be 1-D"),
        (dict(expert_map=torch.zeros(2)), "expert_map must have dtype"),
        (dict(expert_map=torch.tensor([0, 0], dtype=torch.int32)), "expert_map local ids"),
        (dict(expert_map=[0]), "expert_map must be a torch.Tensor"),
        (dict(topk_ids=IDS + 2, expert_map=torch.tensor([0, -1], dtype=torch.int32)),
         r"topk_ids must hold expert ids in \[0, 2\)"),
        (dict(routed_scaling_factor="2"), "routed_scaling_factor must be a float"),
        (dict(out_dtype=torch.int32), "out_dtype must be one of"),
    ],
)
def test_errors(kwargs, match: str) -> None:
    args = dict(expert_out=Y, topk_weights=W, topk_ids=IDS)
    args.update(kwargs)
    y, w, i = args.pop("expert_out"), args.pop("topk_weights"), args.pop("topk_ids")
    with pytest.raises(ValueError, match=match):
        unpermute_reduce(y, w, i, **args)
