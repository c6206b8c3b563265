"""Tests of kernels.reduce beyond the generic adapter test.

The generic test judges `out` within the op's error bound, at K <= 160 in CI. Here: what the kernel claims more
strongly or what no op spec draws. Output-dtype sequential accumulation is exact by construction (every term and
every add rounded as the oracle does, no fusable multiply-add since each term is rounded first): bitwise for
bf16/fp16. DeepSeek-like rows (k = 8, K = 7168, several column blocks); a scaling factor that fp32 cannot hold
exactly (it must be rounded to fp32, as the oracle does); NaN rows of non-local experts (never read); strided
inputs and an output dtype other than the input's; the launcher's errors naming the bad argument.
"""

from __future__ import annotations

import pytest
import torch

from harness.core.errors import UNIT_ROUNDOFF
from harness.engine.interpreter import unverifiable_here
from kernels import reduce as kred
from reference import reduce as ref

# Installs the interpreter's fidelity fixes (bf16 casts) before any kernel runs; on a Triton version they were not
# verified for, bf16 results cannot be trusted here and those cases say so.
UNVERIFIABLE = unverifiable_here()
SEQ = ref.ReduceAccumulation.OUTPUT_DTYPE_SEQUENTIAL
FP32 = ref.ReduceAccumulation.FP32


def _inputs(m: int, k: int, hidden: int, e: int, dtype: torch.dtype, seed: int):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    y = torch.randn((m, k, hidden), generator=g).to(dtype)
    w = torch.rand((m, k), generator=g) + 0.05
    w = w / w.sum(1, keepdim=True)
    ids = torch.rand((m, e), generator=g).argsort(1)[:, :k].to(torch.int32)
    return y, w, ids


def _emap(e: int, n_local: int) -> torch.Tensor:
    m = torch.full((e,), -1, dtype=torch.int32)
    local = torch.arange(0, e, max(1, e // max(n_local, 1)))[:n_local]
    m[local] = torch.arange(local.numel(), dtype=torch.int32)
    return m


def _run(dev: str, y, w, ids, **kw):  # type: ignore[no-untyped-def]
    if y.dtype == torch.bfloat16 and "bf16_cast" in UNVERIFIABLE:
        pytest.skip("bf16 casts are not faithful in this Triton interpreter (not verifiable here)")
    emap = kw.pop("expert_map", None)
    out = kw.pop("out", None)
    got = kred.unpermute_reduce(y.to(dev), w.to(dev), ids.to(dev), expert_map=None if emap is None else emap.to(dev),
                                out=None if out is None else out.to(dev), **kw)
    return got.cpu()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("factor", [1.0, 0.1])
@pytest.mark.parametrize("mapped", [False, True])
def test_sequential_is_bitwise(dtype, factor, mapped, device_info) -> None:  # type: ignore[no-untyped-def]
    y, w, ids = _inputs(9, 4, 300, 16, dtype, seed=1)
    emap = _emap(16, 6) if mapped else None
    got = _run(device_info.device, y, w, ids, accumulation="output_dtype_sequential", expert_map=emap,
               routed_scaling_factor=factor)
    want = ref.unpermute_reduce(y, w, ids, accumulation=SEQ, expert_map=emap, routed_scaling_factor=factor)
    bad = torch.nonzero(got.view(torch.int16) != want.view(torch.int16))
    assert bad.numel() == 0, f"{bad.shape[0]} elements differ from the oracle's sequence, first at {bad[:3].tolist()}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_deepseek_row_width(dtype, device_info) -> None:  # type: ignore[no-untyped-def]
    """k = 8, K = 7168: seven column blocks per token, fp32 accumulation, factor 2.5 (SGLang placement)."""
    y, w, ids = _inputs(3, 8, 7168, 256, dtype, seed=2)
    got = _run(device_info.device, y, w, ids, routed_scaling_factor=2.5).double()
    want = ref.unpermute_reduce(y.double(), w, ids, routed_scaling_factor=2.5, out_dtype=torch.float64)
    mag = ref.unpermute_reduce(y.double().abs(), w, ids, routed_scaling_factor=2.5, out_dtype=torch.float64)
    u = UNIT_ROUNDOFF[str(dtype).removeprefix("torch.")]
    bound = 4 * UNIT_ROUNDOFF["float32"] * mag * 8**0.5 + u * want.abs()
    err = (got - want).abs()
    assert bool((err <= bound).all()), f"max error/bound {float((err / bound).max()):.3g}"


def test_scaling_factor_rounded_to_fp32(device_info) -> None:  # type: ignore[no-untyped-def]
    """fp32 in and out, k = 1, weight pre-applied: out = fp32(y * fp32(0.1)), bitwise (one multiply)."""
    y, w, ids = _inputs(5, 1, 70, 4, torch.float32, seed=3)
    got = _run(device_info.device, y, w, ids, weights_applied=True, routed_scaling_factor=0.1)
    want = y[:, 0] * torch.tensor(0.1, dtype=torch.float32)
    assert torch.equal(got, want)


def test_nonlocal_nan_rows_are_not_read(device_info) -> None:  # type: ignore[no-untyped-def]
    y, w, ids = _inputs(6, 4, 130, 8, torch.bfloat16, seed=4)
    emap = _emap(8, 3)
    y[~(emap[ids.long()] >= 0)] = float("nan")
    got = _run(device_info.device, y, w, ids, expert_map=emap)
    want = ref.unpermute_reduce(y, w, ids, expert_map=emap)
    assert bool(got.isfinite().all())
    assert torch.equal(got.isfinite(), want.isfinite())
    none_local = ~(emap[ids.long()] >= 0).any(1)
    assert bool((got[none_local] == 0).all())  # a token without a local slot gets 0


def test_strided_inputs_and_fp32_output(device_info) -> None:  # type: ignore[no-untyped-def]
    """A slot-major buffer viewed as [M, k, K] (non-contiguous) and fp32 out from bf16 rows: sequential mode
    then rounds to fp32 only, so the result is the fp32 sum of the fp32 terms in slot order."""
    y, w, ids = _inputs(7, 3, 96, 8, torch.bfloat16, seed=5)
    strided = y.transpose(0, 1).contiguous().transpose(0, 1)
    assert not strided.is_contiguous()
    out = torch.full((7, 96), float("nan"), dtype=torch.float32)
    got = _run(device_info.device, strided, w, ids, out=out, accumulation="fp32")
    want = ref.unpermute_reduce(y, w, ids, out_dtype=torch.float64)
    mag = ref.unpermute_reduce(y.double().abs(), w, ids, out_dtype=torch.float64)
    assert bool(((got.double() - want).abs() <= 4 * UNIT_ROUNDOFF["float32"] * (mag + want.abs())).all())


def test_apply_weight_on_input_skips_weight(device_info) -> None:  # type: ignore[no-untyped-def]
    y, w, ids = _inputs(4, 1, 33, 4, torch.float16, seed=6)
    got = _run(device_info.device, y, w, ids, apply_router_weight_on_input=True)
    assert torch.equal(got, y[:, 0])


@pytest.mark.parametrize("kwargs, word", [
    ({"expert_out": torch.zeros(2, 3)}, "expert_out"),
    ({"expert_out": torch.zeros(2, 1, 4, dtype=torch.float64)}, "expert_out"),
    ({"topk_weights": torch.zeros(2, 1, dtype=torch.float16)}, "topk_weights"),
    ({"topk_weights": torch.zeros(3, 1)}, "topk_weights"),
    ({"accumulation": "bf16"}, "accumulation"),
    ({"weights_applied": True, "apply_router_weight_on_input": True}, "apply_router_weight_on_input"),
    ({"expert_out": torch.zeros(2, 2, 4), "topk_weights": torch.zeros(2, 2), "topk_ids": torch.zeros(2, 2,
      dtype=torch.int32), "apply_router_weight_on_input": True}, "top_k"),
    ({"expert_map": torch.zeros(4)}, "expert_map"),
    ({"expert_map": torch.zeros(4, dtype=torch.int32), "topk_ids": None}, "topk_ids"),
    ({"out": torch.zeros(2, 5)}, "out"),
    ({"routed_scaling_factor": "2"}, "routed_scaling_factor"),
])
def test_launcher_errors_name_the_argument(kwargs, word) -> None:  # type: ignore[no-untyped-def]
    args = {"expert_out": torch.zeros(2, 1, 4), "topk_weights": torch.zeros(2, 1),
            "topk_ids": torch.zeros(2, 1, dtype=torch.int32), **kwargs}
    with pytest.raises(ValueError, match=word):
        kred.unpermute_reduce(args.pop("expert_out"), args.pop("topk_weights"), args.pop("topk_ids"), **args)
