"""The experts op's `intermediate_quant` and `act_quant_scope` conventions: a kernel that re-quantizes its activation
output before GEMM2 (the fused_moe kernels) and one that multiplies it unquantized by the dequantized W2 (vLLM's
NaiveBatchedExperts); one per-tensor activation scale over a whole batched input and one per expert's batch (vLLM's
batched prepare). Each is judged by its own oracle, and fails under the other's."""

from __future__ import annotations

import dataclasses

import pytest

from harness.core.case import Case
from harness.engine import runner
from kernels.adapters import experts as ours


def _case(adapter_name: str) -> Case:
    f = {"format": "batched", "quant_type": "fp8_w8a8", "quant_format": "A", "activation": "silu",
         "apply_weight_on_input": "N", "expert_map": "N", "dtype": "bfloat16", "bias": "N"}
    return Case(op="experts", adapter=adapter_name, features=f, shapes={"E": 4, "K": 64, "N": 32, "max_tokens": 9},
                dtypes={"x": "bfloat16"}, seed=3, routing="random")


@pytest.mark.parametrize("convention, verdict", [("requantized", "pass"), ("none", "fail")])
def test_a_requantizing_kernel_fails_under_intermediate_quant_none(convention, verdict, device_info,  # type: ignore[no-untyped-def]
                                                                    unverifiable) -> None:
    adapter = ours.TRITON_BATCHED_ADAPTER
    if device_info.generation not in adapter.generations:
        pytest.skip(f"{adapter.name} does not run on {device_info.generation}")
    declared = dataclasses.replace(adapter, name=f"{adapter.name}-{convention}",
                                   conventions={**adapter.conventions, "intermediate_quant": convention})
    case = _case(declared.name)
    assert declared.declares(case.features)[0]
    assert runner.judge(case, declared, device_info, unverifiable=unverifiable).verdict == verdict


def test_an_unknown_value_is_refused() -> None:
    with pytest.raises(ValueError, match="intermediate_quant"):
        dataclasses.replace(ours.TRITON_BATCHED_ADAPTER, conventions={"intermediate_quant": "sometimes"})


@pytest.mark.parametrize("scope, verdict", [("batch", "pass"), ("expert", "fail")])
def test_a_batch_wide_tensor_scale_fails_under_act_quant_scope_expert(scope, verdict, device_info,  # type: ignore[no-untyped-def]
                                                                       unverifiable) -> None:
    """Our batched kernel takes one per-tensor scale over the whole batch; vLLM's batched path one per expert."""
    adapter = ours.TRITON_BATCHED_ADAPTER
    if device_info.generation not in adapter.generations:
        pytest.skip(f"{adapter.name} does not run on {device_info.generation}")
    declared = dataclasses.replace(adapter, name=f"{adapter.name}-{scope}",
                                   conventions={**adapter.conventions, "act_quant_scope": scope})
    case = _case(declared.name).replace(features={**_case("x").features, "quant_format": "T"})
    assert declared.declares(case.features)[0]
    assert runner.judge(case, declared, device_info, unverifiable=unverifiable).verdict == verdict
