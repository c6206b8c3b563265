"""Golden vectors of the quantization oracle: exact format tables and canonical quantized vectors."""

from __future__ import annotations

import torch

from harness.commands.golden import golden
from reference import formats
from reference.quant import QuantRecipe, dequantize, quantize


def _x(m: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-4, 5, (m, 1), generator=g).float())).bfloat16()


def _case(x: torch.Tensor, recipe: QuantRecipe) -> dict[str, torch.Tensor]:
    qt = quantize(x, recipe)
    out = {"x": x, "codes": qt.codes, "scales": qt.scales, "dequant": dequantize(qt)}
    if qt.global_scale is not None:
        out["global_scale"] = qt.global_scale
    if qt.zero_points is not None:
        out["zero_points"] = qt.zero_points
    # 0-d tensors stored as [1]: harness.commands.golden's bitwise check cannot view a 0-d tensor as bytes
    return {k: v.reshape(1) if v.dim() == 0 else v for k, v in out.items()}


@golden("formats_code_tables")
def code_tables() -> dict[str, torch.Tensor]:
    return {fmt.value: formats.code_table(fmt) for fmt in formats.FloatFormat}


@golden("formats_encode_edges")
def encode_edges() -> dict[str, torch.Tensor]:
    x = torch.tensor([0.0, -0.0, 2.0**-10, 2.0**-9 * 1.5, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 240.0, 248.0, 448.0,
                      464.0, 465.0, 57344.0, 61440.0, 1e9, float("inf"), float("nan")])
    x = torch.cat([x, -x])
    out = {"x": x}
    for fmt in formats.FloatFormat:
        if fmt == formats.FloatFormat.E2M1:
            out[fmt.value] = formats.encode(torch.nan_to_num(x, nan=0.0), fmt)
            continue
        out[f"{fmt.value}_sat"] = formats.encode(x, fmt, saturate=True)
        out[fmt.value] = formats.encode(x, fmt, saturate=False)
    return out


@golden("quant_fp8_group128")
def fp8_group128() -> dict[str, torch.Tensor]:
    return _case(_x(4, 256, 1), QuantRecipe())


@golden("quant_fp8_group_ue8m0_packed")
def fp8_group_ue8m0_packed() -> dict[str, torch.Tensor]:
    return _case(_x(5, 160, 2), QuantRecipe(group_size=32, scale_rule="ue8m0", ue8m0_clamp=True, layout="packed_ue8m0"))


@golden("quant_fp8_block_ragged")
def fp8_block() -> dict[str, torch.Tensor]:
    return _case(_x(20, 40, 3), QuantRecipe(unit="block", block_rows=16, group_size=32))


@golden("quant_fp8_e5m2_tensor_mulrecip")
def fp8_e5m2_tensor() -> dict[str, torch.Tensor]:
    return _case(_x(3, 64, 4), QuantRecipe(dtype="fp8_e5m2", unit="tensor", application="multiply_reciprocal"))


@golden("quant_int8_rules")
def int8_rules() -> dict[str, torch.Tensor]:
    x = _x(4, 128, 5)
    out = {"x": x}
    for rule in ("half_even", "half_away", "truncate"):
        qt = quantize(x, QuantRecipe(dtype="int8", unit="row", int8_rounding=rule))
        out[f"codes_{rule}"] = qt.codes
        out["scales"] = qt.scales
    return out


@golden("quant_mxfp8")
def mxfp8() -> dict[str, torch.Tensor]:
    return _case(_x(4, 128, 6), QuantRecipe.mx("mxfp8"))


@golden("quant_mxfp4_swizzled")
def mxfp4() -> dict[str, torch.Tensor]:
    return _case(_x(4, 128, 7), QuantRecipe.mx("mxfp4", layout="swizzle_128x4"))


@golden("quant_nvfp4")
def nvfp4() -> dict[str, torch.Tensor]:
    return _case(_x(4, 128, 8), QuantRecipe.nvfp4())


@golden("quant_nvfp4_dequant_side")
def nvfp4_dequant_side() -> dict[str, torch.Tensor]:
    return _case(_x(4, 128, 8), QuantRecipe.nvfp4(global_scale="dequant_side"))


@golden("quant_w4a16_zp")
def w4a16() -> dict[str, torch.Tensor]:
    return _case(_x(8, 128, 9).view(2, 4, 128), QuantRecipe(dtype="w4a16", group_size=32, zero_point=True))


@golden("quant_w8a16")
def w8a16() -> dict[str, torch.Tensor]:
    return _case(_x(8, 128, 10).view(2, 4, 128), QuantRecipe(dtype="w8a16", group_size=64))
