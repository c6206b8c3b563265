"""vLLM's CUTLASS fp8 MoE (`vllm-cutlass-experts`, `vllm-cutlass-batched-experts`): registered without vLLM's CUDA
extensions (not-installed, with the command that brings them), declared for what the source's `_supports_*` accept,
and its driver judged on the CPU against stand-ins of the CUDA ops' contracts (tests/external/_cutlass_standins.py),
with garbage in every buffer nothing wrote."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from harness import ops, registry
from harness.core.case import Case
from harness.core.compare import compare_bounded
from harness.engine import runner
from kernels.adapters.external import _vllm_cuda
from kernels.adapters.external import vllm_cutlass as vc
from tests.external import _cutlass_standins as so
from tests.external._where import nominal

_FEATURES = {"format": "standard", "quant_type": "fp8_w8a8", "quant_format": "A", "activation": "silu",
             "apply_weight_on_input": "N", "expert_map": "N", "dtype": "bfloat16", "bias": "N"}


def _case(adapter: registry.Adapter, m: int = 5, k: int = 2, params: dict[str, Any] | None = None,
          **features: str) -> Case:
    f = {**_FEATURES, **features}
    if adapter is vc.BATCHED:
        f["format"] = "batched"
        shapes = {"E": 3, "K": 32, "N": 16, "max_tokens": 6}
    else:
        shapes = {"M": m, "E": 4, "k": k, "K": 48, "N": 32}
    return Case(op="experts", adapter=adapter.name, features=f, shapes=shapes, dtypes={"x": f["dtype"]}, seed=3,
                routing="random", params=params or {})


def _stand_in(monkeypatch: pytest.MonkeyPatch, scratch: bool = True) -> tuple[so.MoeOps, so.COps]:
    moe, c = so.MoeOps(scratch), so.COps()
    monkeypatch.setattr(_vllm_cuda, "ops", so.namespaces(moe, c))
    monkeypatch.setattr(vc, "torch", so.GarbageTorch())
    return moe, c


def _judged(adapter: registry.Adapter, case: Case, device_info: Any) -> Any:
    """Run the adapter in-process on the case's inputs and judge its output."""
    spec = ops.get("experts")
    inputs = spec.make_inputs(case, "cpu")
    out = torch.full_like(inputs["x"], float("nan"))
    adapter.run(case, inputs, {"out": out})
    (chk,) = spec.expected(case, inputs, adapter.conventions_of(case, device_info))
    return compare_bounded("out", out, chk.expected, chk.bound, mask=chk.mask)


@pytest.mark.parametrize("adapter", (vc.STANDARD, vc.BATCHED), ids=lambda a: a.name)
def test_not_installed_names_the_command(adapter, device_info) -> None:  # type: ignore[no-untyped-def]
    assert registry.resolve(adapter.name) is adapter and adapter.library is _vllm_cuda.LIBRARY
    gone = dataclasses.replace(adapter, library=dataclasses.replace(_vllm_cuda.LIBRARY, needs=("no/such.so",)))
    r = runner.judge(_case(adapter), gone, nominal(gone, device_info))
    assert r.verdict == "not-installed" and "scripts/vllm_cuda.sh" in r.reason and "vllm==0.32.0" in r.reason
    if not torch.cuda.is_available():  # the extensions need a CUDA device whether or not their files are here
        assert adapter.not_installed() is not None


#: cutlass_moe.py's _supports_quant_scheme pairs (weight key, activation key) -> the op's quant_format (None: no cell,
#: the op's activation scales are dynamic)
SOURCE_SCHEMES = {("kFp8StaticChannelSym", "kFp8DynamicTokenSym"): "A",
                  ("kFp8StaticTensorSym", "kFp8DynamicTensorSym"): "T",
                  ("kFp8StaticTensorSym", "kFp8StaticTensorSym"): None}
#: activation.py: gated members of _APPLY_MOE_ACTIVATIONS (CutlassExpertsFp8Base._supports_activation)
SOURCE_GATED = {"silu", "gelu", "gelu_tanh", "situ", "swigluoai", "swigluoai_uninterleave", "swiglustep"}


def test_declared_for_what_the_source_supports() -> None:
    op_activations = set(next(ax.values for ax in ops.get("experts").axes if ax.name == "activation"))
    assert set(vc.SUPPORT["activation"]) == SOURCE_GATED & op_activations == set(vc.BATCHED.support["activation"])
    assert set(vc.SUPPORT["quant_format"]) == {f for f in SOURCE_SCHEMES.values() if f}
    assert vc.BATCHED.support["quant_format"] == ("A",)  # T: a per-expert prepare, a whole-batch GEMM2 scale
    assert vc.SUPPORT["expert_map"] == ("N", "Y") and vc.BATCHED.support["expert_map"] == ("N",)
    assert vc.SUPPORT["bias"] == ("N",) and set(vc.SUPPORT["dtype"]) == {"bfloat16", "float16"}
    assert vc.STANDARD.generations == vc.BATCHED.generations == ("sm90", "sm100")  # its wrapper: 9.0 <= cap < 11.0
    assert vc.requires(_device("sm80"), _FEATURES) is not None
    assert vc.requires(_device("sm90"), _FEATURES) is None
    conv = vc.conventions_for(_case(vc.STANDARD, quant_format="T", activation="swigluoai"), _device("sm90"))
    assert conv["rounding"] == "round_once" and conv["act_quant"]["application"] == "multiply_reciprocal"


def _device(generation: str) -> Any:
    from harness.core.device import DeviceInfo

    return DeviceInfo(generation=generation, device="cuda:0", device_name="x", capability=(9, 0),
                      torch_version="", triton_version=None, python_version="", commit="", dirty=False)


@pytest.mark.parametrize("quant_format", ("T", "A"))
@pytest.mark.parametrize("activation", ("silu", "gelu", "swigluoai"))
@pytest.mark.parametrize("expert_map", ("N", "Y"))
def test_the_standard_path_passes_on_stand_ins(quant_format, activation, expert_map, monkeypatch,
                                               device_info) -> None:  # type: ignore[no-untyped-def]
    moe, c = _stand_in(monkeypatch)
    params = {"local_experts": 2} if expert_map == "Y" else {}
    case = _case(vc.STANDARD, params=params, quant_format=quant_format, activation=activation, expert_map=expert_map)
    got = _judged(vc.STANDARD, case, device_info)
    assert got.passed, got.reason
    assert moe.calls == ["moe_permute_with_scratch"] and c.calls == ["cutlass_moe_mm"] * 2


@pytest.mark.parametrize("quant_format", ("T", "A"))
def test_more_than_64_rows_and_fp16_take_the_unswapped_sizes(quant_format, monkeypatch, device_info) -> None:  # type: ignore[no-untyped-def]
    _stand_in(monkeypatch, scratch=False)  # and vLLM's permute without scratch buffers
    case = _case(vc.STANDARD, m=40, k=2, params={"local_experts": 3}, quant_format=quant_format, expert_map="Y",
                 dtype="float16")
    got = _judged(vc.STANDARD, case, device_info)
    assert got.passed, got.reason


def test_the_batched_path_passes_on_stand_ins(monkeypatch, device_info) -> None:  # type: ignore[no-untyped-def]
    _, c = _stand_in(monkeypatch)
    case = dataclasses.replace(_case(vc.BATCHED), params={"counts": [5, 0, 2]})
    got = _judged(vc.BATCHED, case, device_info)
    assert got.passed, got.reason
    assert c.calls == ["cutlass_moe_mm"] * 2


def test_the_router_weight_on_the_input_is_applied_twice(monkeypatch, device_info) -> None:  # type: ignore[no-untyped-def]
    # vLLM's prepare weights x (in x's dtype) and moe_unpermute weights the output again: what comes out is the
    # router-weight-on-the-output answer for the weighted x, not the op's answer
    _stand_in(monkeypatch)
    spec = ops.get("experts")
    case = _case(vc.STANDARD, m=9, k=1, apply_weight_on_input="Y")
    inputs = spec.make_inputs(case, "cpu")
    out = torch.full_like(inputs["x"], float("nan"))
    vc.STANDARD.run(case, inputs, {"out": out})
    conventions = vc.STANDARD.conventions_of(case, device_info)
    for on_input, x in (("Y", inputs["x"]), ("N", inputs["x"] * inputs["topk_weights"].to(inputs["x"].dtype))):
        cell = dataclasses.replace(case, features={**case.features, "apply_weight_on_input": on_input})
        (chk,) = spec.expected(cell, {**inputs, "x": x}, conventions)
        assert compare_bounded("out", out, chk.expected, chk.bound).passed == (on_input == "N"), on_input


def test_cells_vllm_has_no_path_for_are_refused(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _stand_in(monkeypatch)
    for adapter, features in ((vc.STANDARD, {"quant_format": "G128"}), (vc.STANDARD, {"bias": "Y"}),
                              (vc.BATCHED, {"quant_format": "T"}), (vc.STANDARD, {"activation": "silu_no_mul"})):
        case = dataclasses.replace(_case(adapter), features={**_case(adapter).features, **features})
        with pytest.raises(registry.Unsupported, match=next(iter(features))):
            adapter.run(case, {}, {})


def test_bad_weight_scales_are_named(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _stand_in(monkeypatch)
    case = _case(vc.STANDARD, quant_format="A")
    inputs = ops.get("experts").make_inputs(case, "cpu")
    inputs["w2_scale"] = inputs["w2_scale"][:, :, 0]
    with pytest.raises(ValueError, match=r"w2_scale must be \[4, 48, 1\]"):
        vc.run_standard(case, inputs, {"out": torch.empty_like(inputs["x"])})
