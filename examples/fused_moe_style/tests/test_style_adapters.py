"""This package's own unit tests: what the adapters declare for which case, and the quantizer's codes. The generic
tests of the adapters come from the moe-harness plugin (see ../pyproject.toml)."""

import pytest
import torch
from fused_moe_style import harness_adapters as h

from harness.case import Case
from kernels.group_quant import group_quant

_CELL = {"format": "standard", "quant_type": "none", "quant_format": "-", "activation": "silu",
         "apply_weight_on_input": "N", "expert_map": "N", "dtype": "bfloat16", "bias": "N"}


def _case(k: int, dtype: str) -> Case:
    return Case(op="experts", adapter="style-fused-moe", features={**_CELL, "dtype": dtype},
                shapes={"M": 4, "E": 8, "k": k, "K": 32, "N": 16}, dtypes={"x": dtype})


def test_conventions_follow_the_case() -> None:
    a = h.STYLE_FUSED_MOE
    for k, acc in ((1, "rounded_slots"), (2, "sequential_out_dtype"), (4, "sequential_out_dtype"),
                   (5, "rounded_slots"), (8, "rounded_slots")):
        for dtype, precision in (("float32", "tf32"), ("bfloat16", "ieee"), ("float16", "ieee")):
            conv = a.conventions_of(_case(k, dtype), None)  # type: ignore[arg-type]
            assert (conv["accumulation"], conv["matmul_precision"]) == (acc, precision), (k, dtype)


def test_bias_with_weight_on_input_is_excluded() -> None:
    a = h.STYLE_FUSED_MOE
    declared, why = a.declares({**_CELL, "bias": "Y", "apply_weight_on_input": "Y"})
    assert not declared and "bias" in why
    assert a.declares({**_CELL, "bias": "Y"})[0] and a.declares({**_CELL, "apply_weight_on_input": "Y"})[0]


def test_quantizer_codes_dequantize_close_to_x(moe_unverifiable) -> None:  # type: ignore[no-untyped-def]
    # on the GPU when there is one; on a CPU machine Triton's interpreter runs it (the moe-harness plugin sets it),
    # with the interpreter's fp8 casts fixed by the plugin's fixture `moe_unverifiable`
    if "fp8_cast" in moe_unverifiable:
        pytest.skip("this Triton's interpreter cannot cast to fp8 faithfully")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(6, 256, generator=torch.Generator().manual_seed(0)).to(device)
    codes, scales = group_quant(x, dtype="fp8_e4m3fn", unit="group", group_size=128, fast_division=True)
    deq = codes.float().reshape(6, 2, 128) * scales[:, :, None]
    # e4m3 keeps 3 mantissa bits: half a step is 2**-4 of the value (subnormal codes: half of 2**-9 times the scale)
    err = (deq.reshape(6, 256) - x).abs()
    assert bool((err <= 2**-4 * x.abs() + 2**-10 * scales.repeat_interleave(128, dim=1)).all())
