"""The Gluon fused-experts path (kernels.gluon_experts) where it cannot run, and on sm90 where it can.

Gluon kernels do not run in Triton's interpreter, so on a CPU these tests check what a user meets there: argument
errors first, then a clear refusal naming why (never a silent fallback), and adapters that declare sm90 only. On an
sm90 GPU the path is judged against the oracle: here on a few pinned cases, and by the generic property test of its
adapter.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness import registry
from harness.core.case import Case
from harness.core.device import detect
from harness.engine import runner
from kernels import gluon_experts as ge
from kernels.adapters import experts as _registers  # noqa: F401 - registers the adapters
from kernels.quant_gemm import ExpertsQuant

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _inputs(m: int = 4, e: int = 4, k: int = 2, hidden: int = 256, n: int = 128, device: str = "cpu"):
    x = torch.randn(m, hidden, device=device).to(torch.bfloat16)
    w13 = torch.randn(e, 2 * n, hidden, device=device).to(torch.float8_e4m3fn)
    w2 = torch.randn(e, hidden, n, device=device).to(torch.float8_e4m3fn)
    q = ExpertsQuant("fp8_w8a8", "G128", torch.ones(e, 2 * n // 128, hidden // 128, device=device),
                     torch.ones(e, hidden // 128, n // 128, device=device))
    ids = torch.randint(0, e, (m, k), device=device, dtype=torch.int32)
    return x, w13, w2, torch.full((m, k), 0.5, device=device), ids, q


def test_bad_arguments_are_named_before_the_device_is_asked() -> None:
    x, w13, w2, tw, ids, q = _inputs()
    with pytest.raises(ValueError, match="fp8_w8a8 G128"):
        ge.gluon_fused_experts(x, w13, w2, tw, ids, dataclasses.replace(q, quant_format="A"))
    with pytest.raises(ValueError, match="multiples of 16"):
        ge.gluon_fused_experts(x[:, :200], w13[:, :, :200], w2[:, :200], tw, ids, q)
    with pytest.raises(ValueError, match="do not agree on E and N"):
        ge.gluon_fused_experts(x, w13, w2[:, :, :64], tw, ids, q)
    with pytest.raises(ValueError, match="w13 and w2 must have dtype"):
        ge.gluon_fused_experts(x, w13.to(torch.bfloat16), w2, tw, ids, q)


@pytest.mark.skipif(SM90, reason="checks the refusal where the path cannot run; this is an sm90 GPU")
def test_without_an_sm90_gpu_the_call_says_why_it_cannot_run() -> None:
    why = ge.unavailable()
    assert why, "the Gluon path claims it can run without an sm90 GPU"
    with pytest.raises(RuntimeError, match="cannot run here"):
        ge.gluon_fused_experts(*_inputs())


def test_the_adapters_are_for_sm90_only() -> None:
    base = detect("cpu")
    adapter = registry.resolve("gluon-experts-fp8-fast")
    assert adapter.generations == ("sm90",)
    f = {"quant_type": "fp8_w8a8", "quant_format": "G128"}
    assert adapter.requires(dataclasses.replace(base, capability=(8, 9)), f)
    assert adapter.requires(dataclasses.replace(base, capability=(10, 0)), f)
    assert adapter.requires(dataclasses.replace(base, capability=(9, 0)), f) == (ge.missing_api() or None)


@pytest.mark.skipif(not SM90, reason="the Gluon kernels run on sm90 GPUs only (not in Triton's interpreter)")
@pytest.mark.parametrize("shapes", [
    {"M": 1, "E": 4, "k": 1, "K": 128, "N": 128},
    {"M": 33, "E": 257, "k": 8, "K": 512, "N": 256},  # more experts than rows, tiles mostly padding
    {"M": 130, "E": 8, "k": 2, "K": 384, "N": 640},  # GEMM1's 64-column tiles end inside a 128-wide scale group
])
def test_pinned_cases_pass_on_sm90(shapes: dict) -> None:
    name = "gluon-experts-fp8-fast"
    features = {"format": "standard", "quant_type": "fp8_w8a8", "quant_format": "G128", "activation": "silu",
                "apply_weight_on_input": "N", "expert_map": "N", "dtype": "bfloat16", "bias": "N"}
    case = Case(op="experts", adapter=name, features=features, seed=7, shapes=shapes, dtypes={"x": "bfloat16"})
    r = runner.judge(case, registry.resolve(name), detect("cuda"))
    assert r.verdict == "pass", f"{r.verdict}: {r.reason}\n{case.to_json()}"


def test_off_sm90_every_case_is_unsupported_never_failed() -> None:
    device = detect("auto")
    if device.generation == "sm90":
        pytest.skip("an sm90 GPU runs the cases (test_pinned_cases_pass_on_sm90)")
    features = {"format": "standard", "quant_type": "fp8_w8a8", "quant_format": "G128", "activation": "silu",
                "apply_weight_on_input": "N", "expert_map": "N", "dtype": "bfloat16", "bias": "N"}
    case = Case(op="experts", adapter="gluon-experts-fp8-fast", features=features, seed=0,
                shapes={"M": 4, "E": 4, "k": 2, "K": 128, "N": 128}, dtypes={"x": "bfloat16"})
    r = runner.judge(case, registry.resolve("gluon-experts-fp8-fast"), device)
    assert r.verdict == "unsupported", f"{r.verdict}: {r.reason}"
