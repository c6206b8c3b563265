"""Tests of kernels.activation and kernels.act_quant beyond the generic adapter test.

The generic test draws 8 cases per adapter in CI, fewer than the adapters' cells; here every declared cell of
triton-activation and a covering set of triton-act-quant's cells is judged on fixed boundary shapes, plus what no
op spec reaches: launcher arguments the adapters do not declare (gate order, layout, clamp on the plain
activation, strided inputs and outputs), DeepSeek-like group counts spread over several programs, and the
launchers' errors naming the bad argument.
"""

from __future__ import annotations

import pytest
import torch

from harness import registry
from harness.core.case import Case
from harness.core.errors import elementwise_bound
from harness.engine import runner
from harness.ops import act_quant as aq_op
from harness.ops import activation as act_op
from kernels import act_quant as aq
from kernels import activation as kact
from reference import activations as ref

ACT = "triton-activation"
AQ = "triton-act-quant"


def _judge(adapter: str, device_info, unverifiable, **fields) -> None:  # type: ignore[no-untyped-def]
    a = registry.resolve(adapter)
    case = Case(op=a.op, adapter=a.name, **fields)
    r = runner.judge(case, a, device_info, unverifiable=unverifiable)
    assert r.verdict in ("pass", "not-verifiable"), f"{r.verdict}: {r.reason}\n{case.to_json()}"


@pytest.mark.parametrize("activation", list(kact.ACTIVATIONS))
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_every_activation_cell(activation, dtype, device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    for seed, (t, n) in enumerate(((7, 63), (33, 129))):
        _judge(ACT, device_info, unverifiable, features={"activation": activation, "dtype": dtype},
               shapes={"T": t, "N": n}, dtypes={"x": dtype}, seed=seed)


def _aq_fields(act: str, dtype: str, gs: int, rule: str, layout: str, clamp: float | None, t: int, g: int,
               seed: int = 0) -> dict:
    return {"features": {"activation": act, "dtype": dtype, "group_size": str(gs), "scale_rule": rule,
                         "scale_layout": layout, "clamp_limit": "N" if clamp is None else "Y"},
            "shapes": {"T": t, "N": g * gs}, "dtypes": {"x": dtype}, "seed": seed,
            "params": {} if clamp is None else {"clamp_limit": clamp}}


_AQ_CASES = (
    # every activation x dtype, ue8m0 packed (the most constrained layout), 5 groups: a partial packed word
    [_aq_fields(a, d, 128, "ue8m0", "packed_ue8m0", None, 9, 5) for a in sorted(kact.GATED)
     for d in ("bfloat16", "float16", "float32")]
    # every group size x rule x layout, with a clamp on half of them
    + [_aq_fields("silu_and_mul", "bfloat16", gs, rule, lay, 2.5 if i % 2 else None, 13, 9, seed=i)
       for i, (gs, rule, lay) in enumerate((gs, rule, lay) for gs in (64, 128) for rule in ("float", "ue8m0")
                                           for lay in aq.SCALE_LAYOUTS if not (lay == "packed_ue8m0"
                                                                               and rule == "float"))]
    # clamp_limit on every activation (0.5 bites nearly everywhere)
    + [_aq_fields(a, "float32", 64, "float", "row_major", 0.5, 5, 3, seed=2) for a in sorted(kact.GATED)]
    # DeepSeek-V3 widths: N = 2048 (16 groups over 4 programs per row block) and N = 512
    + [_aq_fields("silu_and_mul", "bfloat16", 128, "ue8m0", lay, None, 9, g, seed=3)
       for lay in ("packed_ue8m0", "column_major_tma") for g in (16, 4)]
)


@pytest.mark.parametrize("fields", _AQ_CASES, ids=lambda f: "-".join(f["features"].values()) + f"-N{f['shapes']['N']}")
def test_act_quant_cells(fields, device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    _judge(AQ, device_info, unverifiable, **fields)


def test_strided_input(device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    """A padded row stride (harness layout flag non_contiguous) is read correctly by both kernels."""
    _judge(ACT, device_info, unverifiable, features={"activation": "swigluoai", "dtype": "bfloat16"},
           shapes={"T": 11, "N": 40}, dtypes={"x": "bfloat16"}, layout={"non_contiguous": True})
    _judge(AQ, device_info, unverifiable, layout={"non_contiguous": True},
           **_aq_fields("gelu_and_mul", "float16", 64, "float", "column_major", None, 11, 3))


@pytest.mark.parametrize("gate_order", ["gate_first", "up_first"])
@pytest.mark.parametrize("layout", ["halves", "interleaved"])
@pytest.mark.parametrize("clamp_limit", [None, 1.5])
def test_gate_conventions_not_declared_by_the_adapter(gate_order, layout, clamp_limit, device_info,  # type: ignore[no-untyped-def]
                                                      unverifiable) -> None:
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(9, 2 * 70, generator=g) * 3).to(torch.bfloat16).to(device_info.device)
    for act in ("silu_and_mul", "swigluoai"):
        conv = {"gate_order": gate_order, "layout": layout, "clamp_limit": clamp_limit}
        got = kact.gated_activation(x, act, **conv).cpu()
        kw = act_op.oracle_kwargs(conv, act)
        want = ref.apply_activation(act, x.cpu(), out_dtype=torch.float32, **kw)
        mag = aq_op.operand_magnitude(x.cpu(), act, kw)
        bound = elementwise_bound(want, torch.bfloat16, ulps_fp32=16, magnitude=mag)
        err = (got.double() - want.double()).abs()
        assert bool((err <= bound).all()), f"{act} {conv}: max error/bound {float((err / bound).max()):.3g}"


def test_destination_with_row_stride(device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    x = torch.randn(6, 48, dtype=torch.float32).to(device_info.device)
    big = torch.full((6, 40), float("nan"), device=device_info.device)
    out = kact.gated_activation(x, "silu_and_mul", out=big[:, :24])
    want = ref.silu_and_mul(x.cpu())
    assert out.data_ptr() == big.data_ptr()
    assert torch.allclose(out.cpu(), want, rtol=1e-5, atol=1e-6)
    assert bool(big[:, 24:].isnan().all()), "wrote outside the destination view"


def test_empty_batch_and_defaults(device_info) -> None:  # type: ignore[no-untyped-def]
    x = torch.empty(0, 256, dtype=torch.bfloat16, device=device_info.device)
    assert kact.gated_activation(x, "silu_and_mul").shape == (0, 128)
    codes, scales = aq.act_quant(x, scale_layout="packed_ue8m0", scale_rule="ue8m0")
    assert codes.shape == (0, 128) and codes.dtype == torch.float8_e4m3fn
    assert scales.shape == (0, 1) and scales.dtype == torch.int32
    _, s = aq.act_quant(torch.zeros(5, 256, device=device_info.device), scale_layout="column_major_tma")
    assert s.shape == (5, 1) and s.stride() == (1, 8)


_X = torch.zeros(4, 256)
_LAUNCHER_ERRORS = [
    (kact.gated_activation, (_X, "nope"), {}, "activation"),
    (kact.gated_activation, ([[1.0]], "silu_and_mul"), {}, "x must be a torch.Tensor"),
    (kact.gated_activation, (torch.zeros(4), "silu_and_mul"), {}, "x must be 2-D"),
    (kact.gated_activation, (_X.to(torch.float64), "silu_and_mul"), {}, "x dtype"),
    (kact.gated_activation, (torch.zeros(256, 4).t(), "silu_and_mul"), {}, "unit stride"),
    (kact.gated_activation, (torch.zeros(4, 7), "silu_and_mul"), {}, "even number of columns"),
    (kact.gated_activation, (_X, "silu_and_mul"), {"gate_order": "last"}, "gate_order"),
    (kact.gated_activation, (_X, "silu_and_mul"), {"layout": "mixed"}, "layout"),
    (kact.gated_activation, (_X, "silu_and_mul"), {"clamp_limit": -1.0}, "clamp_limit"),
    (kact.gated_activation, (_X, "silu_and_mul"), {"alpha": 1.0}, "alpha"),
    (kact.gated_activation, (_X, "swiglustep"), {"limit": 0.0}, "limit"),
    (kact.gated_activation, (_X, "relu2_no_mul"), {"clamp_limit": 2.0}, "clamp_limit"),
    (kact.gated_activation, (_X, "silu_and_mul"), {"out": torch.zeros(4, 256)}, "out must be [4, 128]"),
    (kact.gated_activation, (_X, "silu_and_mul"), {"out": torch.zeros(4, 128, dtype=torch.float16)}, "out must"),
    (kact.gated_activation, (_X, "silu_and_mul"), {"out": torch.zeros(128, 4).t()}, "out must have unit stride"),
    (aq.act_quant, (_X, "silu_no_mul"), {}, "gated activation"),
    (aq.act_quant, (_X,), {"group_size": 32}, "group_size"),
    (aq.act_quant, (torch.zeros(4, 192),), {"group_size": 64}, "multiple of group_size"),
    (aq.act_quant, (_X,), {"scale_rule": "ocp_floor"}, "scale_rule"),
    (aq.act_quant, (_X,), {"scale_layout": "swizzle_128x4"}, "scale_layout"),
    (aq.act_quant, (_X,), {"scale_layout": "packed_ue8m0"}, "needs scale_rule 'ue8m0'"),
    (aq.act_quant, (_X,), {"eps": -1.0}, "eps"),
    (aq.act_quant, (_X,), {"codes": torch.zeros(4, 128)}, "codes must be [4, 128] float8_e4m3fn"),
    (aq.act_quant, (_X,), {"scales": torch.zeros(1, 4)}, "scales must be [4, 1] torch.float32"),
    (aq.act_quant, (_X,), {"scale_rule": "ue8m0", "scale_layout": "packed_ue8m0", "scales": torch.zeros(4, 1)},
     "scales must be [4, 1] torch.int32"),
]


@pytest.mark.parametrize(("fn", "args", "kwargs", "words"), _LAUNCHER_ERRORS,
                         ids=[f"{i}-{e[3]}" for i, e in enumerate(_LAUNCHER_ERRORS)])
def test_launcher_errors_name_the_argument(fn, args, kwargs, words) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        fn(*args, **kwargs)


def test_undeclared_cell_rejected_by_name() -> None:
    a = registry.resolve(AQ)
    case = Case(op="act_quant", adapter=AQ, **_aq_fields("silu_and_mul", "float32", 128, "float", "packed_ue8m0",
                                                         None, 2, 1))
    with pytest.raises(registry.Unsupported, match="packed_ue8m0"):
        a.run(case, {"x": torch.zeros(2, 256)}, {})


@pytest.mark.parametrize("rule", ["float", "ue8m0"])
def test_all_zero_groups_use_eps(rule, device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    """A group whose activation is all zeros gets the eps scale and zero codes (no 0/0)."""
    fields = _aq_fields("silu_and_mul", "bfloat16", 128, rule, "row_major", None, 4, 2)
    case = Case(op="act_quant", adapter=AQ, **fields)
    x = (torch.randn(4, 512, generator=torch.Generator().manual_seed(1)) * 3).to(torch.bfloat16)
    x[1] = 0.0  # whole row: both groups
    x[2, :128] = 0.0  # gate of group 0 only: silu(0) * up = 0
    codes, scales = aq.act_quant(x.to(device_info.device), scale_rule=rule)
    checks = aq_op.expected(case, {"x": x}, registry.resolve(AQ).conventions)
    outs = {"codes": codes.cpu(), "scales": scales.cpu()}
    for chk in checks:
        verdict = chk.judge(outs[chk.name], outs)
        assert verdict.passed, verdict.reason
    q = codes.cpu().float()
    assert bool((q[1] == 0).all()) and bool((q[2, :128] == 0).all())  # +-0: silu(0) * up keeps up's sign


def test_zero_eps_zero_group_gives_zero_codes(device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    x = torch.zeros(3, 256, device=device_info.device)
    for rule in ("float", "ue8m0"):
        codes, scales = aq.act_quant(x, eps=0.0, scale_rule=rule)
        assert bool((codes.cpu().float() == 0).all()) and bool((scales.cpu() == 0).all()), rule
