"""vLLM's experts adapters (kernels/adapters/external/vllm_experts.py): registered without vLLM, judged with it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness import registry
from harness.core.case import Case
from harness.engine import runner
from kernels.adapters.external import vllm_experts as ve
from tests.external._where import nominal

_FEATURES = {"format": "standard", "quant_type": "none", "quant_format": "-", "activation": "silu",
             "apply_weight_on_input": "N", "expert_map": "N", "dtype": "float16", "bias": "N"}


def _case(adapter: registry.Adapter, k: int = 2, **features: str) -> Case:
    f = {**_FEATURES, **features}
    # G128 cells: K and N multiples of the group (two groups along K); the others: small tiles
    dims = {"K": 256, "N": 128} if f["quant_format"] == "G128" else {"K": 64, "N": 32}
    return Case(op="experts", adapter=adapter.name, features=f, shapes={"M": 17, "E": 8, "k": k, **dims},
                dtypes={"x": f["dtype"]}, seed=1, routing="random")


#: every quantized cell declared, with the verdict vLLM 0.32 earns on fp16 inputs
_QUANT_CELLS = [(qt, qf) for qt, fmts in ve.TRITON_QUANT.items() for qf in fmts]


def _planted_verdict(case, device_info, unverifiable, **step) -> str:  # type: ignore[no-untyped-def]
    """The verdict of vLLM's Triton path with one of its steps replaced (a planted bug)."""
    def run(c, inputs, outputs):  # type: ignore[no-untyped-def]
        ve.run_triton(c, inputs, outputs, **step)

    planted = dataclasses.replace(ve.TRITON, name="vllm-triton-experts-planted", run=run)
    return runner.judge(case.replace(adapter=planted.name), planted, device_info, unverifiable=unverifiable).verdict


def _vllm() -> None:
    pytest.importorskip("vllm")


def test_registered_and_not_installed_without_vllm(device_info) -> None:  # type: ignore[no-untyped-def]
    for adapter in (ve.TRITON, ve.CPU):
        assert registry.resolve(adapter.name) is adapter and adapter.library is ve.LIBRARY
        gone = dataclasses.replace(adapter, library=dataclasses.replace(ve.LIBRARY, distribution="no-such-dist-xyz",
                                                                        module="no_such_module_xyz"))
        r = runner.judge(_case(gone), gone, nominal(gone, device_info))
        assert r.verdict == "not-installed" and "pip install" in r.reason


@pytest.mark.parametrize("k", [2, 6])
def test_triton_passes_and_a_planted_reduce_bug_fails(k, device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    _vllm()
    case = _case(ve.TRITON, k=k, bias="Y")
    assert runner.judge(case, ve.TRITON, device_info, unverifiable=unverifiable).verdict == "pass"

    def fp32_sum(cache3: torch.Tensor, out: torch.Tensor) -> None:  # an fp32 reduce where moe_sum is sequential
        out.copy_(cache3.float().sum(dim=1) * (1 + 2.0**-9))

    assert _planted_verdict(case, device_info, unverifiable, reduce=fp32_sum) == "fail"


def test_triton_bias_with_weight_on_input_diverges(device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    """vLLM scales the GEMM1 bias by the router weight when it applies the weight on the input: undeclared, and
    judged wrong (a divergence the harness reports, not a clean rejection)."""
    _vllm()
    case = _case(ve.TRITON, k=1, bias="Y", apply_weight_on_input="Y")
    assert not ve.TRITON.declares(case.features)[0]
    assert runner.judge(case, ve.TRITON, device_info, unverifiable=unverifiable).verdict == "fail"


def test_cpu_passes_and_a_planted_bug_fails(device_info) -> None:  # type: ignore[no-untyped-def]
    _vllm()
    case = _case(ve.CPU, bias="Y")
    assert runner.judge(case, ve.CPU, device_info).verdict == "pass"

    def run(c, inputs, outputs):  # type: ignore[no-untyped-def]
        ve.run_cpu(c, inputs, outputs)
        outputs["out"][0, 0] += 2.0**-4

    planted = dataclasses.replace(ve.CPU, name="vllm-cpu-experts-planted", run=run)
    assert runner.judge(case.replace(adapter=planted.name), planted, device_info).verdict == "fail"


def test_cpu_rejects_what_it_does_not_support(device_info) -> None:  # type: ignore[no-untyped-def]
    _vllm()
    r = runner.judge(_case(ve.CPU, activation="silu_no_mul"), ve.CPU, device_info)
    assert r.verdict == "unsupported" and "silu_no_mul" in r.reason


@pytest.mark.parametrize(("qt", "qf"), [c for c in _QUANT_CELLS if c != ("int8_w8a8", "T")])
def test_triton_quantized_cells_pass(qt, qf, device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    _vllm()
    case = _case(ve.TRITON, quant_type=qt, quant_format=qf)
    assert ve.TRITON.declares(case.features)[0]
    r = runner.judge(case, ve.TRITON, device_info, unverifiable=unverifiable)
    assert r.verdict == "pass", r.reason


def test_triton_int8_per_tensor_raises(device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    """vLLM's dynamic per-tensor int8 path forms the scale in the activation dtype, which static_scaled_int8_quant
    rejects (it takes fp32): the declared cell errors, a finding."""
    _vllm()
    case = _case(ve.TRITON, quant_type="int8_w8a8", quant_format="T")
    r = runner.judge(case, ve.TRITON, device_info, unverifiable=unverifiable)
    assert r.verdict == "error" and "Float" in r.reason, r.reason


@pytest.mark.parametrize(("qt", "qf"), [("fp8_w8a8", "G128"), ("fp8_w8a8", "A"), ("int8_w8a8", "A")])
def test_triton_planted_activation_scale_bug_fails(qt, qf, device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    """A quantizer whose scales are off by 2^-7 (codes unchanged) must fail: the conventions are checked."""
    _vllm()
    case = _case(ve.TRITON, quant_type=qt, quant_format=qf)

    def skewed(a, quant_dtype, flags, recipe):  # type: ignore[no-untyped-def]
        q, s = ve.quantize_input(a, quant_dtype, flags, recipe)
        return q, s * (1 + 2.0**-7)

    assert _planted_verdict(case, device_info, unverifiable, quantize=skewed) == "fail"


def test_triton_rejects_what_it_cannot_express(device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    _vllm()
    case = _case(ve.TRITON, quant_type="w4a16", quant_format="A")
    assert not ve.TRITON.declares(case.features)[0]
    r = runner.judge(case, ve.TRITON, device_info, unverifiable=unverifiable)
    assert r.verdict == "unsupported" and "w4a16 A" in r.reason, r.reason
