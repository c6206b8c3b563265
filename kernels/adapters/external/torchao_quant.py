"""torchao's Triton quantizers of activations (torchao 0.18.0) for the `group_quant` op.

- `torchao-fp8-blockwise-act-quant`: `torchao.prototype.blockwise_fp8_training.kernels.
  triton_fp8_blockwise_act_quant_lhs(x, block_size)`, the 1 x block_size fp8 activation quantizer of torchao's
  blockwise fp8 training (block 128 there; the kernel takes any power-of-two block, so 16/32/64/128 are declared).
  Per group: amax = max|x| in fp32 clamped below at fp32(1e-12), the factor fp32(448 / amax) formed in float64
  and rounded once, codes = e4m3(clamp(x * factor, +-448)), and the *reciprocal* 1 / factor (fp32 `tl.div_rn`) is
  what it stores, column-major (strides (1, M)). Conventions: eps 1e-12 on amax in fp32, application
  `qmax_over_amax_rn`, scale formula `reciprocal_of_factor`: judged bit-exactly. Both divisions are correctly
  rounded on the GPU too (float64 division, div_rn), so no approximate-division allowance is declared.
- `torchao-mx-quant`: `torchao.prototype.mx_formats.kernels.triton_to_mxfp8_dim0(x, 32, scaling_mode)`, the Triton
  mxfp8 quantizer along K (bf16 inputs only: it asserts so). See that adapter's notes below.

torchao asks for a contiguous input (it asserts `x.is_contiguous()`): the adapter hands it `x.contiguous()` (the
caller's copy, as torchao's own callers do), so a non-contiguous case tests the same kernel on the same values.
Under Triton's interpreter the autotuned kernels run their first config (harness.engine.interpreter's `autotune`
fix): the tile sizes change, the per-element arithmetic does not.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from harness.core.case import Case
from harness.core.device import DeviceInfo
from harness.registry import Adapter, Library, Unsupported, library_module, register

VERSION = "0.18.0"


def _interpreting_without_gpu() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") and not torch.cuda.is_available()


@contextlib.contextmanager
def _mx_triton_visible() -> Iterator[None]:
    """Under Triton's interpreter (no GPU), let torchao define its MX Triton kernels.

    torchao defines them only where `has_triton() and cuda and sm100+ or (is_ROCM() and is_MI350())`, decided once
    when torchao.prototype.mx_formats.kernels is first imported; elsewhere its entry points raise "needs triton".
    For that import only, torchao.utils' is_ROCM / is_MI350 answer True (the gate opens), then the module's names
    are rebound to the real functions and its IS_ROCM constexpr to False, so the kernels take their NVIDIA branch
    (the PTX ue8m0 conversion, which the interpreter cannot run: the rceil cells are not verifiable there)."""
    yield  # `import torchao` itself (the library import) needs nothing
    if not _interpreting_without_gpu() or "torchao.prototype.mx_formats.kernels" in sys.modules:
        return
    import torch.utils._triton as torch_triton
    import torchao.utils as utils
    import triton.language as tl

    real = {(utils, "is_ROCM"): utils.is_ROCM, (utils, "is_MI350"): utils.is_MI350,
            (torch_triton, "has_triton"): torch_triton.has_triton}
    try:
        for owner, name in real:
            setattr(owner, name, lambda: True)
        kernels = importlib.import_module("torchao.prototype.mx_formats.kernels")
    except Exception as e:  # the MX adapter then fails with torchao's own "needs triton"; the others still run
        MX_SHIM_FAILED.append(f"{type(e).__name__}: {e}")
        return
    finally:
        for (owner, name), fn in real.items():
            setattr(owner, name, fn)
    for (_, name), fn in real.items():
        setattr(kernels, name, fn)
    kernels.IS_ROCM = tl.constexpr(False)


#: why the interpreter shim above could not import torchao's MX kernels (empty: it did, or was not needed)
MX_SHIM_FAILED: list[str] = []


LIBRARY = Library(distribution="torchao", module="torchao", written_for=VERSION,
                  install=f"pip install torchao=={VERSION}", prepare=_mx_triton_visible)
_FP8_GENERATIONS = ("interp", "sm89", "sm90", "sm100")


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _module(name: str) -> Any:
    return library_module(LIBRARY, name)


def _check(name: str, features: Mapping[str, str], support: Mapping[str, tuple[str, ...]]) -> None:
    for axis, values in support.items():
        if features.get(axis) not in values:
            raise Unsupported(f"{name} does not support {axis}={features.get(axis)!r}")


def _fp8_requires(device: DeviceInfo | None, features: Mapping[str, str]) -> str | None:
    if device is not None and device.generation in ("sm80",):
        return "fp8 e4m3 casts need sm89 or newer"
    return None


# ------------------------------------------------------------------------------------------ fp8 blockwise 1 x 128

BLOCKWISE_SUPPORT: dict[str, tuple[str, ...]] = {
    "quant_dtype": ("fp8_e4m3fn",), "unit": ("group",), "group_size": ("128", "64", "32", "16"),
    "scale_rule": ("float",), "scale_layout": ("column_major",),
    "input_dtype": ("bfloat16", "float16", "float32"),
}
BLOCKWISE_CONVENTIONS = {"eps": 1e-12, "eps_placement": "amax", "eps_dtype": "float32",
                         "scale_formula": "reciprocal_of_factor", "application": "qmax_over_amax_rn"}


def _run_blockwise(case: Case, inputs: dict[str, torch.Tensor],
                   outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    f = case.features
    _check("torchao-fp8-blockwise-act-quant", f, BLOCKWISE_SUPPORT)
    kernels = _module("torchao.prototype.blockwise_fp8_training.kernels")
    codes, scales = kernels.triton_fp8_blockwise_act_quant_lhs(inputs["x"].contiguous(), int(f["group_size"]),
                                                              torch.float8_e4m3fn)
    return {"codes": codes, "scales": scales}


def _blockwise_interp(cell: Mapping[str, str]) -> set[str]:
    need = {"fp8_cast", "autotune", "load_store", "reduce_fp32"}
    if cell.get("input_dtype") == "bfloat16":
        need |= {"bf16_arith", "bf16_cast"}
    return need


BLOCKWISE = register(Adapter(
    name="torchao-fp8-blockwise-act-quant", op="group_quant",
    source="torchao.prototype.blockwise_fp8_training.kernels.triton_fp8_blockwise_act_quant_lhs",
    run=_run_blockwise, support=BLOCKWISE_SUPPORT, conventions=BLOCKWISE_CONVENTIONS,
    properties=frozenset({"deterministic"}), generations=_FP8_GENERATIONS, requires=_fp8_requires,
    interp_features=_blockwise_interp, library=LIBRARY,
    description="torchao blockwise fp8 training: 1 x 128 activation groups, x * fp32(448 / amax), 1 / factor "
                "stored column-major",
), replace=True)


# ------------------------------------------------------------------------------------------------ mxfp8 (Triton)

#: torchao's Triton MX quantizer along K: mxfp8 only (torchao 0.18 has no Triton mxfp4 quantizer: MXTensor.to_mx
#: quantizes mxfp4 in plain torch), bf16 inputs only (it asserts), e8m0 codes row-major; swizzling is a separate
#: Triton kernel, triton_mx_block_rearrange, which the swizzle_128x4 cells chain after it. floor -> the OCP floor
#: rule; rceil -> ue8m0 of amax * fp32(1 / 448), rounded up by its bits (PTX cvt.rp.satfinite.ue8m0x2.f32), no eps
#: (an all-zero group gets code 0).
MX_SUPPORT: dict[str, tuple[str, ...]] = {
    "quant_dtype": ("mxfp8",), "unit": ("group",), "group_size": ("32",), "scale_rule": ("ocp_floor", "ue8m0"),
    "scale_layout": ("row_major", "swizzle_128x4"), "input_dtype": ("bfloat16",),
}
MX_CONVENTIONS = {"eps": 0.0, "eps_placement": "amax", "scale_formula": "multiply_reciprocal",
                  "ue8m0_form": "exponent_bits", "ue8m0_clamp": False, "application": "multiply_reciprocal"}
_MX_MODE = {"ocp_floor": "floor", "ue8m0": "rceil"}


def _run_mx(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    f = case.features
    _check("torchao-mx-quant", f, MX_SUPPORT)
    kernels = _module("torchao.prototype.mx_formats.kernels")
    codes, scales = kernels.triton_to_mxfp8_dim0(inputs["x"].contiguous(), 32, _MX_MODE[f["scale_rule"]])
    scales = scales.view(torch.uint8)
    if f["scale_layout"] == "swizzle_128x4":
        scales = kernels.triton_mx_block_rearrange(scales)
    return {"codes": codes, "scales": scales.view(torch.uint8)}


def _mx_requires(device: DeviceInfo | None, features: Mapping[str, str]) -> str | None:
    # torchao defines its MX Triton kernels on sm100+ CUDA (and MI350) only
    if device is not None and device.generation not in ("interp", "sm100"):
        return "torchao's MX Triton kernels need sm100 (torchao gates them on is_sm_at_least_100)"
    return None


def _mx_interp(cell: Mapping[str, str]) -> set[str]:
    need = {"fp8_cast", "autotune", "load_store", "reduce_fp32", "bf16_arith", "bf16_cast"}
    if cell.get("scale_rule") == "ue8m0" and all(cell.get(a) in v for a, v in MX_SUPPORT.items()):
        need.add("inline_asm")  # the rceil mode's PTX cvt.rp.satfinite.ue8m0x2.f32
    return need


MX = register(Adapter(
    name="torchao-mx-quant", op="group_quant", source="torchao.prototype.mx_formats.kernels.triton_to_mxfp8_dim0",
    run=_run_mx, support=MX_SUPPORT, conventions=MX_CONVENTIONS, properties=frozenset({"deterministic"}),
    generations=("interp", "sm100"), requires=_mx_requires, interp_features=_mx_interp, library=LIBRARY,
    description="torchao Triton mxfp8 quantizer along K (dim0): floor (OCP) or rceil e8m0 scales, bf16 input",
), replace=True)


# ------------------------------------------------------------------------------------------ MX (torch, to_mx)

#: torchao's eager MX quantizer `torchao.prototype.mx_formats.mx_tensor.to_mx` (plain torch: what MXTensor uses
#: off sm100 and for mxfp4, which has no Triton quantizer in torchao 0.18; torchao's tests check the Triton mxfp8
#: kernel against it). Declared: the floor mode (the OCP rule) for mxfp8 and mxfp4 on bf16/fp32 inputs (it asserts
#: those), e8m0 codes row-major or swizzled (its is_swizzled_scales). Its rceil mode divides amax by qmax and rounds
#: up by fp32 log2, clamping the exponent at -127 and applying code 0 as 1.0: no convention of the oracle states
#: that, so it is undeclared.
MX_TORCH_SUPPORT: dict[str, tuple[str, ...]] = {
    "quant_dtype": ("mxfp8", "mxfp4"), "unit": ("group",), "group_size": ("32",), "scale_rule": ("ocp_floor",),
    "scale_layout": ("row_major", "swizzle_128x4"), "input_dtype": ("bfloat16", "float32"),
}
_ELEM = {"mxfp8": "float8_e4m3fn", "mxfp4": "float4_e2m1fn_x2"}


def _run_mx_torch(case: Case, inputs: dict[str, torch.Tensor],
                  outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    f = case.features
    _check("torchao-mx-quant-torch", f, MX_TORCH_SUPPORT)
    mx = _module("torchao.prototype.mx_formats.mx_tensor")
    config = _module("torchao.prototype.mx_formats.config")
    scales, codes = mx.to_mx(inputs["x"].contiguous(), getattr(torch, _ELEM[f["quant_dtype"]]), 32,
                             config.ScaleCalculationMode.FLOOR, is_swizzled_scales=f["scale_layout"] == "swizzle_128x4")
    scales = scales.view(torch.uint8)
    if f["scale_layout"] == "swizzle_128x4":  # torchao views the swizzled bytes as [32 M_pad/128, 16 G_pad/4]
        m, k = inputs["x"].shape
        scales = scales.reshape(_round_up(m, 128), _round_up(k // 32, 4))
    return {"codes": codes if f["quant_dtype"] == "mxfp8" else codes.view(torch.uint8), "scales": scales}


def _mx_torch_requires(device: DeviceInfo | None, features: Mapping[str, str]) -> str | None:
    if device is not None and device.generation == "sm80" and features.get("quant_dtype") == "mxfp8":
        return "fp8 e4m3 casts need sm89 or newer"
    return None


MX_TORCH = register(Adapter(
    name="torchao-mx-quant-torch", op="group_quant", source="torchao.prototype.mx_formats.mx_tensor.to_mx",
    run=_run_mx_torch, support=MX_TORCH_SUPPORT, conventions={}, properties=frozenset({"deterministic"}),
    generations=("cpu", "sm89", "sm90", "sm100"), requires=_mx_torch_requires, library=LIBRARY,
    description="torchao eager to_mx (plain torch): mxfp8 and mxfp4, floor (OCP) e8m0 scales",
), replace=True)


# ------------------------------------------------------------------------------------------ NVFP4 (torch)

#: torchao's NVFP4 quantizer `torchao.prototype.mx_formats.nvfp4_tensor.nvfp4_quantize(x, 16, per_tensor_scale)`
#: (plain torch; torchao's Triton NVFP4 quantizer is MSLK's `triton_quantize_nvfp4`, a separate library, not
#: covered here), two-level: the op's global scale input g is torchao's per_tensor_scale (dequant side). The
#: swizzle_128x4 cells chain torchao.prototype.mx_formats.utils.to_blocked (its torch path), as NVFP4Tensor.to_nvfp4
#: does. Conventions: s_blk = e4m3(clamp((amax / 6) / g, 2^-6, 448)), x * ((1 / g) / s_blk), e2m1 ties to even;
#: amax / 6 is a division by a Python scalar, which CUDA performs as a multiplication by fp32(1 / 6)
#: (scale_formula multiply_reciprocal on GPUs, divide on the CPU).
NVFP4_SUPPORT: dict[str, tuple[str, ...]] = {
    "quant_dtype": ("nvfp4",), "unit": ("group",), "group_size": ("16",), "scale_rule": ("float",),
    "scale_layout": ("row_major", "swizzle_128x4"), "input_dtype": ("bfloat16", "float32"),
}
NVFP4_CONVENTIONS = {"global_scale": "dequant_side", "nvfp4_scale_form": "reciprocal_over_block",
                     "application": "multiply_reciprocal", "nvfp4_block_floor": True, "e2m1_ties": "even",
                     "scale_formula": "divide"}


def _nvfp4_conventions(case: Case, device: DeviceInfo) -> dict[str, Any]:
    return {} if device.generation in ("cpu", "interp") else {"scale_formula": "multiply_reciprocal"}


def _run_nvfp4(case: Case, inputs: dict[str, torch.Tensor],
               outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    f = case.features
    _check("torchao-nvfp4-quant", f, NVFP4_SUPPORT)
    nv = _module("torchao.prototype.mx_formats.nvfp4_tensor")
    x = inputs["x"].contiguous()
    scales, codes = nv.nvfp4_quantize(x, 16, inputs["global_scale"])
    scales = scales.view(torch.uint8).reshape(x.shape[0], -1)
    if f["scale_layout"] == "swizzle_128x4":
        utils = _module("torchao.prototype.mx_formats.utils")
        m, g = scales.shape
        scales = utils.to_blocked(scales).view(_round_up(m, 128), _round_up(g, 4))
    return {"codes": codes.view(torch.uint8), "scales": scales}


NVFP4 = register(Adapter(
    name="torchao-nvfp4-quant", op="group_quant", source="torchao.prototype.mx_formats.nvfp4_tensor.nvfp4_quantize",
    run=_run_nvfp4, support=NVFP4_SUPPORT, conventions=NVFP4_CONVENTIONS, conventions_for=_nvfp4_conventions,
    properties=frozenset({"deterministic"}), generations=("cpu", "sm89", "sm90", "sm100"), library=LIBRARY,
    description="torchao NVFP4 (plain torch): e4m3 block scales of 16 floored at 2^-6, dequant-side global scale",
), replace=True)
