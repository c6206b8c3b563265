"""FlashInfer's CUTLASS fused MoE adapter: registered without FlashInfer (not-installed, naming the install), declared
for the sm90 paths vLLM's FlashInferExperts takes, and its call (W13 handed over as [up; gate], the router weights,
the block scales) checked against a CPU stand-in of the kernel's documented contract."""

from __future__ import annotations

import dataclasses
import types

import torch
import torch.nn.functional as F

from harness import ops, registry
from harness.core.case import Case
from harness.core.compare import compare_bounded
from harness.engine import runner
from kernels.adapters.external import flashinfer_experts as fi
from tests.external._where import nominal

_FEATURES = {"format": "standard", "quant_type": "none", "quant_format": "-", "activation": "silu",
             "apply_weight_on_input": "N", "expert_map": "N", "dtype": "bfloat16", "bias": "N"}


def _case(**features: str) -> Case:
    return Case(op="experts", adapter=fi.EXPERTS.name, features={**_FEATURES, **features},
                shapes={"M": 5, "E": 4, "k": 2, "K": 128, "N": 128}, dtypes={"x": "bfloat16"}, seed=1,
                routing="random")


def test_not_installed_names_the_install(device_info, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("MOE_FLASHINFER_DIR", str(tmp_path))
    if fi.Library.missing(fi.LIBRARY) is None:  # FlashInfer itself installed here: nothing to show
        return
    assert registry.resolve(fi.EXPERTS.name) is fi.EXPERTS
    assert "pip install flashinfer-python" in fi.EXPERTS.not_installed()
    fresh = dataclasses.replace(fi.EXPERTS, library=dataclasses.replace(fi.EXPERTS.library))
    r = runner.judge(_case(), fresh, nominal(fresh, device_info))
    assert r.verdict == "not-installed" and "scripts/flashinfer.sh" in r.reason


def test_declared_for_the_sm90_bf16_and_fp8_block_scale_paths() -> None:
    assert fi.EXPERTS.generations == ("sm90",) and fi.EXPERTS.declares(_case().features)[0]
    assert fi.requires(None, {**_FEATURES, "quant_type": "fp8_w8a8", "quant_format": "G128"}) is None
    assert fi.requires(None, {**_FEATURES, "quant_type": "fp8_w8a8", "quant_format": "T"}) is not None
    assert not fi.EXPERTS.declares({**_FEATURES, "activation": "gelu"})[0]


def test_w31_puts_up_before_gate() -> None:
    w = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)  # 2 experts, gate rows 0-1, up rows 2-3
    assert torch.equal(fi.w31(w)[:, :2], w[:, 2:]) and torch.equal(fi.w31(w)[:, 2:], w[:, :2])


def _contract(calls: list) -> types.SimpleNamespace:  # type: ignore[type-arg]
    """cutlass_fused_moe's bf16 contract as the adapter declares it: fc1 rows are [up; gate], Swiglu is
    silu(gate) * up, GEMM1's and the activation's outputs in bf16, the slots weighted by token_final_scales and
    summed in fp32."""

    def cutlass_fused_moe(*, input, token_selected_experts, token_final_scales, fc1_expert_weights,
                          fc2_expert_weights, output_dtype, quant_scales, output, use_deepseek_fp8_block_scale,
                          activation_type) -> None:
        calls.append({"scales": quant_scales, "fp8": use_deepseek_fp8_block_scale, "act": activation_type})
        n = fc1_expert_weights.shape[1] // 2
        acc = torch.zeros(input.shape, dtype=torch.float32)
        for t in range(input.shape[0]):
            for j, e in enumerate(token_selected_experts[t].tolist()):
                gu = (fc1_expert_weights[e].float() @ input[t].float()).to(output_dtype).float()
                h = (F.silu(gu[n:]) * gu[:n]).to(output_dtype).float()
                acc[t] += token_final_scales[t, j] * (fc2_expert_weights[e].float() @ h)
        output.copy_(acc.to(output_dtype))

    act = types.SimpleNamespace(Swiglu="swiglu")
    return types.SimpleNamespace(cutlass_fused_moe=cutlass_fused_moe, ActivationType=act)


def test_the_call_matches_the_kernel_contract(monkeypatch, device_info) -> None:  # type: ignore[no-untyped-def]
    calls: list = []  # type: ignore[type-arg]
    monkeypatch.setattr(fi, "fused_moe", lambda: _contract(calls))
    case = _case()
    spec = ops.get("experts")
    inputs = spec.make_inputs(case, "cpu")
    out = torch.zeros_like(inputs["x"])
    fi.run(case, inputs, {"out": out})
    assert calls == [{"scales": [], "fp8": False, "act": "swiglu"}]
    (chk,) = spec.expected(case, inputs, fi.EXPERTS.conventions_of(case, device_info))
    got = compare_bounded("out", out, chk.expected, chk.bound, mask=chk.mask)
    assert got.passed, got.reason
