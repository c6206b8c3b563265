"""reference.experts against a float64 loop over tokens and slots, written here from docs/SEMANTICS.md §6."""

from __future__ import annotations

import pytest
import torch

from reference.activations import Activation, GateLayout, Rounding
from reference.experts import (
    Accumulation,
    ExpertsQuant,
    IntermediateRounding,
    WeightPlacement,
    batched_experts,
    expert_intermediates,
    fused_experts,
)
from reference.quant import QuantRecipe, dequantize, quantize
from tests.reference.test_activations import DEFAULT_PARAMS, act_up_64, gate_up_columns, no_mul_64

F64 = torch.float64


def act_vec_64(name: Activation, h: list[float]) -> list[float]:
    """The activation of one GEMM1 output row (gate first, the activation's own layout), in float64."""
    if name.value.endswith("_no_mul"):
        return [no_mul_64(name, v) for v in h]
    n = len(h) // 2
    layout = GateLayout.INTERLEAVED if name == Activation.SWIGLUOAI else GateLayout.HALVES
    out = []
    for i in range(n):
        cg, cu = gate_up_columns(i, n, "gate_first", layout)
        a, u = act_up_64(name, h[cg], h[cu], **DEFAULT_PARAMS.get(name, {}))
        out.append(a * u)
    return out


def brute_force(x, w13, w2, tw, ti, name=Activation.SILU_AND_MUL, *, b13=None, b2=None, expert_map=None,
                on_input=False, round_a_to=None):
    """out[t] = sum_j w[t, j] * (W2[e] a + b2[e]), a = act(W13[e] x[t] + b13[e]); one (t, j) at a time."""
    m, kd = x.shape
    out = torch.zeros(m, kd, dtype=F64)
    for t in range(m):
        for j in range(ti.shape[1]):
            e = int(ti[t, j])
            if expert_map is not None:
                e = int(expert_map[e])
                if e < 0:
                    continue
            xt = x[t].double() * (float(tw[t, j]) if on_input else 1.0)
            h = w13[e].double() @ xt
            if b13 is not None:
                h = h + b13[e].double()
            a = torch.tensor(act_vec_64(name, h.tolist()), dtype=F64)
            if round_a_to is not None:
                a = a.to(round_a_to).double()
            y = w2[e].double() @ a
            if b2 is not None:
                y = y + b2[e].double()
            out[t] += (1.0 if on_input else float(tw[t, j])) * y
    return out


def make(m, k, e, kd, n, *, seed=0, dtype=F64, gated=True, ids=None, bias=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, kd, generator=g).to(dtype)
    w13 = (torch.randn(e, (2 if gated else 1) * n, kd, generator=g) / kd**0.5).to(dtype)
    w2 = (torch.randn(e, kd, n, generator=g) / n**0.5).to(dtype)
    tw = torch.rand(m, k, generator=g, dtype=torch.float32) + 0.1
    if ids is None:
        ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(m)]) if m else torch.zeros(0, k)
    ids = ids.to(torch.int32).reshape(m, k)
    b13 = torch.randn(e, w13.shape[1], generator=g).to(dtype) if bias else None
    b2 = torch.randn(e, kd, generator=g).to(dtype) if bias else None
    return x, w13, w2, tw, ids, b13, b2


def assert_close64(out: torch.Tensor, ref: torch.Tensor, tol: float = 1e-10) -> None:
    assert out.shape == ref.shape
    scale = ref.abs().max().item() if ref.numel() else 0.0
    err = (out.double() - ref).abs().max().item() if ref.numel() else 0.0
    assert err <= tol * max(scale, 1.0), f"max error {err:.3g} (scale {scale:.3g})"


# shape cases: (M, k, E, K, N, how the ids are drawn)
SHAPES = {
    "M0": (0, 2, 4, 8, 4, None),
    "M1": (1, 2, 4, 8, 4, None),
    "empty_experts": (9, 2, 8, 8, 4, lambda m, k: torch.randint(0, 2, (m, k))),
    "all_to_one": (7, 1, 5, 8, 4, lambda m, k: torch.full((m, k), 3)),
    "k1": (6, 1, 4, 8, 4, None),
    "k_eq_E": (5, 4, 4, 8, 4, None),
    "E257": (16, 3, 257, 4, 2, None),
}


@pytest.mark.parametrize("case", list(SHAPES))
def test_shapes_against_brute_force(case) -> None:
    m, k, e, kd, n, draw = SHAPES[case]
    ids = draw(m, k) if draw else None
    x, w13, w2, tw, ids, _, _ = make(m, k, e, kd, n, seed=11, ids=ids)
    out = fused_experts(x, w13, w2, tw, ids, compute_dtype=F64)
    assert out.dtype == F64 and out.shape == (m, kd)
    assert_close64(out, brute_force(x, w13, w2, tw, ids))
    if case == "k_eq_E":  # the same expert twice in a row is legal too (the reduce sums both slots)
        ids = torch.full((m, k), 2, dtype=torch.int64)
        assert_close64(fused_experts(x, w13, w2, tw, ids, compute_dtype=F64), brute_force(x, w13, w2, tw, ids))


@pytest.mark.parametrize("name", list(Activation), ids=lambda a: a.value)
def test_every_activation_with_bias(name) -> None:
    gated = not name.value.endswith("_no_mul")
    x, w13, w2, tw, ids, b13, b2 = make(6, 2, 4, 8, 4, seed=12, gated=gated, bias=True)
    x = x * 3  # GEMM1 outputs beyond the swiglu limits
    out = fused_experts(x, w13, w2, tw, ids, activation=name, w13_bias=b13, w2_bias=b2, compute_dtype=F64)
    assert_close64(out, brute_force(x, w13, w2, tw, ids, name, b13=b13, b2=b2))


def test_biases_in_another_float_dtype() -> None:
    x, w13, w2, tw, ids, b13, b2 = make(4, 2, 3, 8, 4, seed=13, bias=True)
    out = fused_experts(x, w13, w2, tw, ids, w13_bias=b13.float(), w2_bias=b2.float(), compute_dtype=F64)
    assert_close64(out, brute_force(x, w13, w2, tw, ids, b13=b13.float(), b2=b2.float()))


@pytest.mark.parametrize("local", ["none", "some", "all"])
def test_expert_map(local) -> None:
    e_global = 8
    local_globals = {"none": [], "some": [6, 1, 3], "all": list(range(8))[::-1]}[local]
    emap = torch.full((e_global,), -1, dtype=torch.int32)
    for i, eg in enumerate(local_globals):
        emap[eg] = i
    e_local = len(local_globals)
    x, _, _, tw, ids, _, _ = make(10, 3, e_global, 8, 4, seed=14)
    _, w13, w2, _, _, b13, b2 = make(1, 1, max(e_local, 1), 8, 4, seed=15, bias=True)
    w13, w2, b13, b2 = w13[:e_local], w2[:e_local], b13[:e_local], b2[:e_local]
    out = fused_experts(x, w13, w2, tw, ids, expert_map=emap, w13_bias=b13, w2_bias=b2, compute_dtype=F64)
    ref = brute_force(x, w13, w2, tw, ids, b13=b13, b2=b2, expert_map=emap)
    assert_close64(out, ref)
    if local == "none":
        assert torch.equal(out, torch.zeros_like(out))
    inter = expert_intermediates(x, w13, w2, tw, ids, expert_map=emap, compute_dtype=F64)
    assert torch.equal(inter.local, emap.long()[ids.long()] >= 0)
    assert not inter.y[~inter.local].any()


@pytest.mark.parametrize("bias", [False, True])
def test_apply_router_weight_on_input(bias) -> None:
    x, w13, w2, tw, ids, b13, b2 = make(7, 1, 4, 8, 4, seed=16, bias=bias)
    tw = tw * 3  # far from 1 so that applying it at the wrong place shows
    out = fused_experts(x, w13, w2, tw, ids, w13_bias=b13, w2_bias=b2, apply_router_weight_on_input=True,
                        compute_dtype=F64)
    assert_close64(out, brute_force(x, w13, w2, tw, ids, b13=b13, b2=b2, on_input=True))


def test_bf16_intermediate_rounding_and_fp32_compute() -> None:
    x, w13, w2, tw, ids, _, _ = make(12, 2, 4, 16, 8, seed=17, dtype=torch.bfloat16)
    ref = brute_force(x, w13, w2, tw, ids, round_a_to=torch.bfloat16)
    for cd in (torch.float32, F64):
        out = fused_experts(x, w13, w2, tw, ids, compute_dtype=cd, out_dtype=F64)
        # bounded by one bf16 flip of an activation at a rounding tie (rare), plus fp32 dot error
        assert_close64(out, ref, tol=1e-2)
        assert (out - ref).abs().max() < (out - brute_force(x, w13, w2, tw, ids)).abs().max()
    assert fused_experts(x, w13, w2, tw, ids).dtype == torch.bfloat16


def test_intermediate_rounding_conventions() -> None:
    x, w13, w2, tw, ids, _, _ = make(8, 2, 4, 16, 8, seed=18, dtype=torch.bfloat16)

    def representable(t):
        return torch.equal(t, t.to(torch.bfloat16).to(t.dtype))

    kinds = {r: expert_intermediates(x, w13, w2, tw, ids, intermediate_rounding=r) for r in IntermediateRounding}
    none, act_out, both = (kinds[r] for r in IntermediateRounding)
    assert not representable(none.h) and not representable(none.a)
    assert not representable(act_out.h) and representable(act_out.a)
    assert representable(both.h) and representable(both.a)
    # the activation is applied to h: a matches the float64 formula on the stored h
    for inter, rounded in ((none, False), (act_out, True), (both, True)):
        h = inter.h.reshape(-1, inter.h.shape[-1])
        a = torch.tensor([act_vec_64(Activation.SILU_AND_MUL, row) for row in h.double().tolist()], dtype=F64)
        want = a.to(torch.bfloat16).double() if rounded else a
        got = inter.a.reshape(a.shape).double()
        assert (got == want).float().mean() > 0.97 if rounded else torch.allclose(got, want, rtol=1e-5)
    with pytest.raises(ValueError, match="activation_rounding must be ROUND_ONCE when intermediate_rounding"):
        expert_intermediates(x, w13, w2, tw, ids, intermediate_rounding=IntermediateRounding.NONE,
                             activation_rounding=Rounding.ROUND_ACTIVATION_FIRST)


def test_activation_rounding_reaches_the_activation() -> None:
    x, w13, w2, tw, ids, _, _ = make(16, 2, 4, 16, 32, seed=19, dtype=torch.bfloat16)
    first = expert_intermediates(x, w13, w2, tw, ids, activation_rounding=Rounding.ROUND_ACTIVATION_FIRST)
    once = expert_intermediates(x, w13, w2, tw, ids)
    assert torch.equal(first.h, once.h)
    h = first.h.reshape(-1, first.h.shape[-1]).double()
    n = h.shape[1] // 2
    silu = h[:, :n] * torch.sigmoid(h[:, :n])
    want = (silu.to(torch.bfloat16).double() * h[:, n:]).to(torch.bfloat16).double()
    assert (first.a.reshape(want.shape).double() == want).float().mean() > 0.97
    assert (first.a != once.a).float().mean() > 0.05


def _weighted_reduce(y, tw, od, placement, accumulation):
    """Section 5 in float64 from the intermediates y [M, k, K], written slot by slot."""
    m, k, kd = y.shape
    if placement == WeightPlacement.ROUNDED_EXPERT_OUTPUT:
        y = y.to(od).double()
    if accumulation == Accumulation.FP32:
        acc = torch.zeros(m, kd, dtype=F64)
        for j in range(k):
            acc += tw[:, j : j + 1].double() * y[:, j].double()
        return acc.to(od)
    if accumulation == Accumulation.ROUNDED_SLOTS:
        acc = torch.zeros(m, kd, dtype=F64)
        for j in range(k):
            acc += (tw[:, j : j + 1].double() * y[:, j].double()).to(od).double()
        return acc.to(od)
    acc = torch.zeros(m, kd, dtype=od)
    for j in range(k):
        acc = (acc.double() + (tw[:, j : j + 1].double() * y[:, j].double()).to(od).double()).to(od)
    return acc


@pytest.mark.parametrize("placement", list(WeightPlacement), ids=lambda v: v.value)
@pytest.mark.parametrize("accumulation", list(Accumulation), ids=lambda v: v.value)
def test_reduce_conventions(placement, accumulation) -> None:
    x, w13, w2, tw, ids, _, _ = make(32, 4, 6, 32, 16, seed=20, dtype=torch.bfloat16)
    y = expert_intermediates(x, w13, w2, tw, ids, compute_dtype=F64).y
    out = fused_experts(x, w13, w2, tw, ids, weight_placement=placement, accumulation=accumulation,
                        compute_dtype=F64)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, _weighted_reduce(y, tw, torch.bfloat16, placement, accumulation))
    default = fused_experts(x, w13, w2, tw, ids, compute_dtype=F64)
    if (placement, accumulation) != (WeightPlacement.ACCUMULATOR, Accumulation.FP32):
        assert not torch.equal(out, default)  # every convention is observable at these shapes


def test_batched_against_standard_and_brute_force() -> None:
    e, kd, n, max_tokens = 5, 16, 8, 6
    x, w13, w2, tw, ids, b13, b2 = make(9, 2, e, kd, n, seed=21, dtype=torch.bfloat16, bias=True)
    ids[:, 0] = torch.tensor([0, 0, 1, 1, 1, 3, 3, 3, 3], dtype=torch.int32)  # expert 2 and 4 may be empty
    ids[:, 1] = torch.tensor([1, 3, 0, 4, 3, 1, 4, 0, 1], dtype=torch.int32)
    xb = torch.full((e, max_tokens, kd), float("nan"), dtype=torch.bfloat16)  # rows beyond the count unused
    counts = torch.zeros(e, dtype=torch.int32)
    where = {}
    for t in range(ids.shape[0]):
        for j in range(ids.shape[1]):
            ex = int(ids[t, j])
            xb[ex, counts[ex]] = x[t]
            where[(t, j)] = (ex, int(counts[ex]))
            counts[ex] += 1
    out = batched_experts(xb, counts, w13, w2, w13_bias=b13, w2_bias=b2, out_dtype=torch.float32)
    assert out.shape == (e, max_tokens, kd) and out.dtype == torch.float32
    inter = expert_intermediates(x, w13, w2, tw, ids, w13_bias=b13, w2_bias=b2)
    for (t, j), (ex, r) in where.items():
        assert torch.allclose(out[ex, r], inter.y[t, j], rtol=1e-6, atol=1e-6)
        ref = brute_force(x[t : t + 1], w13, w2, torch.ones(1, 1), ids[t : t + 1, j : j + 1], b13=b13, b2=b2,
                          round_a_to=torch.bfloat16)
        assert_close64(out[ex, r : r + 1], ref, tol=1e-2)
    for ex in range(e):
        assert not out[ex, int(counts[ex]):].any()
    # default output dtype is the input dtype, rounded once from the fp32 result
    assert torch.equal(batched_experts(xb, counts, w13, w2, w13_bias=b13, w2_bias=b2), out.to(torch.bfloat16))


def test_fp32_matmul_precision_is_set_and_restored() -> None:
    x, w13, w2, tw, ids, _, _ = make(4, 2, 3, 8, 4, seed=22, dtype=torch.float32)
    saved = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        out = fused_experts(x, w13, w2, tw, ids)
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(saved)
    assert_close64(out, brute_force(x, w13, w2, tw, ids, round_a_to=torch.float32), tol=1e-5)


def test_validation_messages() -> None:
    x, w13, w2, tw, ids, b13, b2 = make(4, 2, 3, 8, 4, seed=23, dtype=torch.bfloat16, bias=True)

    def call(**kw):
        args = dict(x=x, w13=w13, w2=w2, topk_weights=tw, topk_ids=ids)
        args.update(kw)
        return fused_experts(args.pop("x"), args.pop("w13"), args.pop("w2"), args.pop("topk_weights"),
                             args.pop("topk_ids"), **args)

    bad = [
        (dict(x=x[0]), "x must be 2-D"),
        (dict(w13=w13.float()), "w13 must have dtype"),
        (dict(w13=w13[:, :, :4]), r"w13 must have shape \[\*, \*, 8\]"),
        (dict(w13=w13[:, :7]), "w13 must have an even dim 1"),
        (dict(w2=w2[:, :, :3]), r"w2 must have shape \[3, 8, 4\]"),
        (dict(activation="relu2_no_mul"), r"w2 must have shape \[3, 8, 8\]"),
        (dict(activation="tanh"), "activation must be one of"),
        (dict(topk_ids=ids[:3]), r"topk_ids must have shape \[4, k\]"),
        (dict(topk_ids=ids.float()), "topk_ids must have dtype"),
        (dict(topk_ids=ids + 3), r"topk_ids must be in \[0, 3\)"),
        (dict(topk_weights=tw[:, :1]), r"topk_weights must have shape \[4, 2\]"),
        (dict(w13_bias=b13[:, :4]), r"w13_bias must have shape \[3, 8\]"),
        (dict(w2_bias=b2[:2]), r"w2_bias must have shape \[3, 8\]"),
        (dict(apply_router_weight_on_input=True), "apply_router_weight_on_input requires k = 1"),
        (dict(expert_map=torch.tensor([0, 1, -1, -1], dtype=torch.int32)), "expert_map must map global ids"),
        (dict(expert_map=torch.tensor([0, 1, 1, 2], dtype=torch.int32)), "expert_map must map global ids"),
        (dict(expert_map=torch.tensor([[0, 1, 2]])), "expert_map must be 1-D"),
        (dict(compute_dtype=torch.bfloat16), "compute_dtype must be one of"),
        (dict(out_dtype=torch.int32), "out_dtype must be one of"),
        (dict(weight_placement="somewhere"), "weight_placement must be one of"),
        (dict(accumulation="int"), "accumulation must be one of"),
        (dict(intermediate_rounding="maybe"), "intermediate_rounding must be one of"),
        (dict(alpha=1.0), "alpha is not a parameter of activation 'silu_and_mul'"),
    ]
    for kwargs, msg in bad:
        with pytest.raises(ValueError, match=msg):
            call(**kwargs)
    xb = x[None].expand(3, 4, 8)
    with pytest.raises(ValueError, match=r"expert_num_tokens must be in \[0, 4\]"):
        batched_experts(xb, torch.tensor([1, 5, 0]), w13, w2)
    with pytest.raises(ValueError, match=r"expert_num_tokens must have shape \[3\]"):
        batched_experts(xb, torch.tensor([1, 2]), w13, w2)
    with pytest.raises(ValueError, match=r"w13 must have shape \[3, \*, 8\]"):
        batched_experts(xb, torch.tensor([1, 2, 0]), w13[:2], w2)


# ------------------------------------------------------------------------------------------ quantized schemes


def _fp8_fake_quant_rows(v: torch.Tensor, unit: str) -> torch.Tensor:
    """fp8 e4m3 quantize-dequantize written from docs/SEMANTICS.md §2 (float rule, eps 1e-10, divide), float64 out."""
    v32 = v.float().double()
    amax = v32.abs().amax() if unit == "tensor" else v32.abs().amax(dim=-1, keepdim=True)
    s = (amax.clamp(min=float(torch.tensor(1e-10))) / 448.0).float().double()
    q = (v32 / s).float().clamp(-448, 448).to(torch.float8_e4m3fn).double()
    return q * s


def _quantized_weights(w13: torch.Tensor, w2: torch.Tensor, recipe: QuantRecipe) -> tuple[list, list]:
    return [quantize(w, recipe) for w in w13], [quantize(w, recipe) for w in w2]


def _scheme_brute_force(x, q13, q2, tw, ti, act_unit, inter_unit, expert_map=None):
    """Per (token, slot): dequantized weights, fake-quantized x and (over the local slots) intermediate."""
    m, k = ti.shape
    xq = _fp8_fake_quant_rows(x, act_unit) if act_unit else x.double()
    a_rows, slots = [], []
    for t in range(m):
        for j in range(k):
            e = int(ti[t, j]) if expert_map is None else int(expert_map[int(ti[t, j])])
            if e < 0:
                continue
            h = dequantize(q13[e], F64) @ xq[t]
            a = torch.tensor(act_vec_64(Activation.SILU_AND_MUL, h.tolist()), dtype=F64).to(x.dtype)
            a_rows.append(a)
            slots.append((t, j, e))
    out = torch.zeros(m, x.shape[1], dtype=F64)
    if not slots:
        return out
    a_all = torch.stack(a_rows)
    a_all = _fp8_fake_quant_rows(a_all, inter_unit) if inter_unit else a_all.double()
    for (t, j, e), a in zip(slots, a_all):
        out[t] += float(tw[t, j]) * (dequantize(q2[e], F64) @ a)
    return out


@pytest.mark.parametrize("unit,weight_unit", [("tensor", "tensor"), ("row", "row")])
def test_fp8_w8a8_scheme_against_per_token_loop(unit: str, weight_unit: str) -> None:
    """fp8 T (per-tensor acts, per-expert weights) and A (per-token acts, per-channel weights); the intermediate
    is re-quantized with the activation's recipe, per-tensor over the local slots only."""
    g = torch.Generator().manual_seed(5)
    m, e, k, kd, n = 7, 6, 2, 32, 16
    x = torch.randn(m, kd, generator=g).bfloat16()
    w13 = torch.randn(e, 2 * n, kd, generator=g) / kd**0.5
    w2 = torch.randn(e, kd, n, generator=g) / n**0.5
    q13, q2 = _quantized_weights(w13, w2, QuantRecipe(unit=weight_unit))
    tw = torch.rand(m, k, generator=g)
    ti = torch.randint(0, 8, (m, k), generator=g)
    expert_map = torch.tensor([0, -1, 1, 2, -1, 3, 4, 5])  # 8 global experts, 6 local
    act = QuantRecipe(unit=unit)
    quant = ExpertsQuant(q13, q2, act=act, intermediate=act)
    got = fused_experts(x, None, None, tw, ti, quant=quant, expert_map=expert_map, compute_dtype=F64,
                        out_dtype=F64)
    want = _scheme_brute_force(x, q13, q2, tw, ti, unit, unit, expert_map)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_block_quantized_weights_and_group_acts_differ_from_unquantized() -> None:
    """G128: 128x128 block weights, per-token-group acts; the result equals the unquantized oracle run on the
    dequantized operands (composition), and differs from the unquantized result (quantization happened)."""
    g = torch.Generator().manual_seed(6)
    m, e, k, kd, n = 5, 3, 2, 256, 160
    x = torch.randn(m, kd, generator=g).bfloat16()
    w13 = torch.randn(e, 2 * n, kd, generator=g) / kd**0.5
    w2 = torch.randn(e, kd, n, generator=g) / n**0.5
    q13, q2 = _quantized_weights(w13, w2, QuantRecipe(unit="block", ragged_k=True))
    tw, ti = torch.rand(m, k, generator=g), torch.randint(0, e, (m, k), generator=g)
    act = QuantRecipe(group_size=128, ragged_k=True)
    got = fused_experts(x, None, None, tw, ti, quant=ExpertsQuant(q13, q2, act=act, intermediate=act),
                        compute_dtype=F64, out_dtype=F64)
    xq = dequantize(quantize(x, act), F64)
    inter = expert_intermediates(xq, torch.stack([dequantize(q, F64) for q in q13]),
                                 torch.stack([dequantize(q, F64) for q in q2]), tw, ti, compute_dtype=F64,
                                 intermediate_rounding=IntermediateRounding.NONE)
    a_rows = inter.a.reshape(m * k, n).to(torch.bfloat16)
    aq = dequantize(quantize(a_rows, act), F64).reshape(m, k, n)
    want = torch.zeros(m, kd, dtype=F64)
    for t in range(m):
        for j in range(k):
            want[t] += float(tw[t, j]) * (dequantize(q2[int(ti[t, j])], F64) @ aq[t, j])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    plain = fused_experts(x.double(), w13.double(), w2.double(), tw, ti, compute_dtype=F64)
    assert not torch.allclose(got, plain, rtol=1e-4, atol=0)


def test_weight_only_int4_with_zero_points_matches_unpacked_formula() -> None:
    """w4a16: no activation quantization, weights (q - zp) * s per group of 32 from the packed nibbles."""
    g = torch.Generator().manual_seed(8)
    m, e, k, kd, n = 4, 2, 2, 64, 32
    x = torch.randn(m, kd, generator=g).bfloat16()
    w13 = torch.randn(e, 2 * n, kd, generator=g)
    w2 = torch.randn(e, kd, n, generator=g)
    recipe = QuantRecipe(dtype="w4a16", group_size=32, zero_point=True)
    q13, q2 = _quantized_weights(w13, w2, recipe)

    def unpacked(q) -> torch.Tensor:  # byte k//2, shift 4*(k%2); zero points packed along rows the same way
        rows, cols = q.shape
        codes = torch.stack([(q.codes >> 4 * (c % 2))[:, c // 2] & 15 for c in range(cols)], dim=1).double()
        zp = torch.stack([(q.zero_points >> 4 * (r % 2))[r // 2] & 15 for r in range(rows)]).double()
        col_group = torch.arange(cols) // 32
        return (codes - zp[:, col_group]) * q.scales.double()[:, col_group]  # exact products

    tw, ti = torch.rand(m, k, generator=g), torch.randint(0, e, (m, k), generator=g)
    got = fused_experts(x, None, None, tw, ti, quant=ExpertsQuant(q13, q2), compute_dtype=F64, out_dtype=F64)
    want = brute_force(x, torch.stack([unpacked(q) for q in q13]), torch.stack([unpacked(q) for q in q2]), tw, ti,
                       round_a_to=torch.bfloat16)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_batched_quantized_padding_rows_do_not_move_per_tensor_scales() -> None:
    g = torch.Generator().manual_seed(9)
    e, t, kd, n = 3, 4, 32, 16
    x = torch.randn(e, t, kd, generator=g).bfloat16()
    counts = torch.tensor([2, 0, 3])
    huge = x.clone()
    huge[0, 2:], huge[1], huge[2, 3:] = 1e4, -1e4, 3e3  # rows beyond the counts
    q13, q2 = _quantized_weights(torch.randn(e, 2 * n, kd, generator=g), torch.randn(e, kd, n, generator=g),
                                 QuantRecipe(unit="tensor"))
    quant = ExpertsQuant(q13, q2, act=QuantRecipe(unit="tensor"), intermediate=QuantRecipe(unit="tensor"))
    a = batched_experts(x, counts, None, None, quant=quant, compute_dtype=F64, out_dtype=F64)
    b = batched_experts(huge, counts, None, None, quant=quant, compute_dtype=F64, out_dtype=F64)
    assert torch.equal(a, b)
    xq = _fp8_fake_quant_rows(torch.cat([x[0, :2], x[2, :3]]), "tensor")
    h = dequantize(q13[0]).double() @ xq[0]
    a0 = torch.tensor(act_vec_64(Activation.SILU_AND_MUL, h.tolist()), dtype=F64)
    assert a[0, 0].abs().max() > 0 and a[1].abs().max() == 0
    assert torch.isfinite(a0).all()


def test_nvfp4_scheme_uses_the_given_activation_global_scale() -> None:
    g = torch.Generator().manual_seed(10)
    m, e, kd, n = 3, 2, 32, 16
    x = torch.randn(m, kd, generator=g).bfloat16()
    recipe = QuantRecipe.nvfp4()
    q13, q2 = _quantized_weights(torch.randn(e, 2 * n, kd, generator=g), torch.randn(e, kd, n, generator=g), recipe)
    tw, ti = torch.rand(m, 1, generator=g), torch.randint(0, e, (m, 1), generator=g)

    def run(gs: float) -> torch.Tensor:
        quant = ExpertsQuant(q13, q2, act=recipe, intermediate=recipe, act_global_scale=torch.tensor(gs),
                             intermediate_global_scale=torch.tensor(gs))
        return fused_experts(x, None, None, tw, ti, quant=quant, compute_dtype=F64, out_dtype=F64)

    amax = float(x.float().abs().max())
    assert not torch.equal(run(448 * 6 / amax), run(448 * 6 / amax / 3))


def test_quantized_scheme_bad_arguments() -> None:
    g = torch.Generator().manual_seed(11)
    w = torch.randn(2, 16, 32, generator=g)
    q13, q2 = _quantized_weights(w, torch.randn(2, 32, 8, generator=g), QuantRecipe(unit="row"))
    x, tw, ti = torch.randn(3, 32).bfloat16(), torch.rand(3, 1), torch.zeros(3, 1, dtype=torch.int64)
    with pytest.raises(ValueError, match="w13 and w2 must be None"):
        fused_experts(x, w.bfloat16(), None, tw, ti, quant=ExpertsQuant(q13, q2))
    with pytest.raises(ValueError, match="one QuantizedTensor per local expert"):
        ExpertsQuant(q13, q2[:1])
    with pytest.raises(ValueError, match="act must be a QuantRecipe"):
        ExpertsQuant(q13, q2, act="fp8")  # type: ignore[arg-type]


def test_dequantized_weights_are_computed_once_per_device() -> None:
    g = torch.Generator().manual_seed(12)
    q13, q2 = _quantized_weights(torch.randn(2, 16, 32, generator=g), torch.randn(2, 32, 8, generator=g),
                                 QuantRecipe(unit="row"))
    quant = ExpertsQuant(q13, q2)
    w13, w2 = quant.dequantized_weights(torch.device("cpu"))
    assert quant.dequantized_weights("cpu")[0] is w13  # the oracle's several passes share one dequantization
    assert torch.equal(w2[1], dequantize(q2[1], F64))
