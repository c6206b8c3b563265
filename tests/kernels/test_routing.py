"""The Triton routing kernels beyond the generic property test: shapes it draws rarely (groups padded to a power of
two, E = 1024, k = 32, DeepSeek-V3), the exact non-finite rule, the kernel's own row order, strided logits, argument
checks, and (GPU only) offsets beyond 2^31."""

from __future__ import annotations

import pytest
import torch

import kernels.adapters.routing  # noqa: F401  (registers the adapters)
from harness import registry
from harness.core.case import Case
from harness.core.device import detect
from harness.engine import runner
from kernels import routing as kr
from reference import routing as ref

DEV = detect("auto")
# The interpreter-fidelity fixes (libdevice among them) are installed by this session fixture.
pytestmark = pytest.mark.usefixtures("unverifiable")
ROUTING = {"scoring": "softmax", "renormalize": "Y", "correction_bias": "N", "logits_dtype": "float32",
           "nonfinite_rows": "N"}
GROUPED = {"scoring": "sigmoid", "correction_bias": "Y", "renormalize": "Y", "scaling_placement": "weights",
           "logits_dtype": "float32", "nonfinite_rows": "N"}


def _judge(op: str, features: dict[str, str], m: int, e: int, k: int, routing: str = "random", **params) -> None:
    adapter = "triton-routing" if op == "routing" else "triton-grouped-routing"
    case = Case(op=op, adapter=adapter, features=features, shapes={"M": m, "E": e, "k": k}, seed=7,
                dtypes={"router_logits": features["logits_dtype"]}, routing=routing, params=params)
    r = runner.judge(case, registry.resolve(adapter), DEV)
    assert r.verdict == "pass", f"{r.verdict}: {r.reason}\n{case.to_json()}"


@pytest.mark.parametrize(("e", "g", "tg", "k"), [
    (12, 2, 1, 3),  # 6 experts per group in 8 slots: the padding slots alias the next group's ids
    (96, 3, 2, 7),  # 3 groups in 4 slots
    (514, 2, 1, 32),  # 257 per group, k at the kernel's limit
    (256, 8, 4, 8),  # DeepSeek-V3
])
@pytest.mark.parametrize("scoring", ["sigmoid", "softmax"])
def test_grouped_shapes(e: int, g: int, tg: int, k: int, scoring: str) -> None:
    _judge("grouped_routing", {**GROUPED, "scoring": scoring}, 37, e, k, num_groups=g, topk_group=tg,
           routed_scaling_factor=2.5)


@pytest.mark.parametrize(("e", "k", "scoring", "bias"), [
    (1024, 32, "softmax", "N"), (1000, 17, "sigmoid", "Y"), (1, 1, "sigmoid", "N"), (129, 1, "llama4_top1", "N"),
])
def test_plain_shapes(e: int, k: int, scoring: str, bias: str) -> None:
    renorm = "N" if scoring == "llama4_top1" else "Y"
    _judge("routing", {**ROUTING, "scoring": scoring, "correction_bias": bias, "renormalize": renorm}, 19, e, k)


def _nonfinite_logits(e: int) -> torch.Tensor:
    x = torch.randn(6, e, generator=torch.Generator().manual_seed(1))
    x[0] = float("nan")  # whole row NaN
    x[1, 3] = float("nan")  # one NaN expert
    x[2, 5] = float("inf")
    x[3] = float("-inf")
    x[4, :4] = float("-inf")
    return x.to(DEV.device)


@pytest.mark.parametrize(("scoring", "bias"), [("softmax", False), ("softmax", True), ("sigmoid", False),
                                               ("sigmoid", True), ("llama4_top1", False)])
def test_nonfinite_rows_follow_the_zero_rule_exactly(scoring: str, bias: bool) -> None:
    """ids equal to the oracle's, in its order (descending score, ties to the lower id); weights equal."""
    e, k = 16, 1 if scoring == "llama4_top1" else 4
    x = _nonfinite_logits(e)
    b = torch.linspace(-0.5, 0.5, e, device=x.device) if bias else None
    if scoring == "llama4_top1":
        want_w, want_ids = ref.llama4_top1_route(x.cpu())
    else:
        want_w, want_ids = ref.topk_route(x.cpu(), k, scoring=ref.Scoring(scoring), renormalize=True,
                                          correction_bias=None if b is None else b.cpu())
    w, ids = kr.topk_route(x, k, scoring=scoring, renormalize=scoring != "llama4_top1", correction_bias=b)
    assert torch.equal(ids.cpu(), want_ids)
    torch.testing.assert_close(w.cpu(), want_w, rtol=2e-6, atol=0)


@pytest.mark.parametrize("bias", [False, True])
def test_grouped_nonfinite_rows(bias: bool) -> None:
    e, k = 32, 4
    x = _nonfinite_logits(e)
    b = torch.linspace(0.5, -0.5, e, device=x.device) if bias else None
    kw = dict(num_groups=8, topk_group=2, renormalize=True, routed_scaling_factor=2.5)
    for scoring in ("softmax", "sigmoid"):
        want_w, want_ids = ref.grouped_topk_route(x.cpu(), k, scoring=ref.Scoring(scoring),
                                                  correction_bias=None if b is None else b.cpu(), **kw)
        w, ids = kr.grouped_topk_route(x, k, scoring=scoring, correction_bias=b, **kw)
        assert torch.equal(ids.cpu(), want_ids), scoring
        torch.testing.assert_close(w.cpu(), want_w, rtol=2e-6, atol=0)


def test_ties_go_to_the_lower_index_in_descending_order() -> None:
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, 2.0]], device=DEV.device)
    _, ids = kr.topk_route(x, 5, scoring="softmax")
    assert ids.cpu().tolist() == [[1, 2, 4, 3, 5]]
    # groups {0,1}, {2,3}, {4,5} score 3, 3, 3 (max): the two lower groups are kept.
    _, ids = kr.grouped_topk_route(x, 4, num_groups=3, topk_group=2, scoring="softmax")
    assert ids.cpu().tolist() == [[1, 2, 3, 0]]


def test_strided_logits_and_outputs() -> None:
    big = torch.randn(23, 2 * 40, generator=torch.Generator().manual_seed(2)).to(DEV.device)
    x = big[:, ::2]  # stride (80, 2)
    w_out = torch.full((23, 2 * 6), float("nan"), device=x.device)[:, ::2]
    ids_out = torch.full((6, 23), -1, dtype=torch.int32, device=x.device).t()
    b = torch.randn(40, generator=torch.Generator().manual_seed(3)).to(x.device)
    kr.topk_route(x, 6, scoring="sigmoid", renormalize=True, correction_bias=b, out_weights=w_out, out_ids=ids_out)
    w, ids = kr.topk_route(x.contiguous(), 6, scoring="sigmoid", renormalize=True, correction_bias=b)
    assert torch.equal(ids_out, ids) and torch.equal(w_out, w)


def test_empty_batch_launches_nothing() -> None:
    w, ids = kr.grouped_topk_route(torch.empty(0, 256, device=DEV.device), 8, num_groups=8, topk_group=4,
                                   scoring="sigmoid", correction_bias=torch.zeros(256, device=DEV.device))
    assert w.shape == ids.shape == (0, 8)


@pytest.mark.parametrize(("call", "message"), [
    (lambda x: kr.topk_route(x[:, :1], 2), "k=2"),
    (lambda x: kr.topk_route(torch.zeros(2, 1025), 1), "E=1025"),
    (lambda x: kr.topk_route(x, 33), "k=33"),
    (lambda x: kr.topk_route(x, 1, scoring="llama4_top1", renormalize=True), "llama4_top1"),
    (lambda x: kr.grouped_topk_route(x, 2, num_groups=3, topk_group=1, scoring="sigmoid"), "num_groups=3"),
    (lambda x: kr.grouped_topk_route(x, 9, num_groups=8, topk_group=1, scoring="sigmoid"), "k=9"),
    (lambda x: kr.grouped_topk_route(x, 1, num_groups=64, topk_group=1, scoring="sigmoid",
                                     correction_bias=torch.zeros(64)), "2 experts per group"),
    (lambda x: kr.topk_route(x.double(), 1), "router_logits"),
])
def test_argument_checks(call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        call(torch.zeros(2, 64))


@pytest.mark.gpu
def test_offsets_beyond_int32() -> None:
    """M * E = 2^31 + 2^9 elements: the last rows are only reachable with 64-bit offsets."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device with 5 GB free (4 GiB of bf16 logits)")
    m, e, k = (1 << 23) + 2, 256, 8
    x = torch.randn(m, e, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(e, device="cuda") * 0.5
    kw = dict(num_groups=8, topk_group=4, renormalize=True, routed_scaling_factor=2.5)
    w, ids = kr.grouped_topk_route(x, k, scoring="sigmoid", correction_bias=b, **kw)
    tail = slice(m - 64, m)
    want_w, want_ids = ref.grouped_topk_route(x[tail].cpu(), k, scoring=ref.Scoring.SIGMOID,
                                              correction_bias=b.cpu(), **kw)
    assert torch.equal(ids[tail].cpu(), want_ids)
    torch.testing.assert_close(w[tail].cpu(), want_w, rtol=1e-5, atol=0)
