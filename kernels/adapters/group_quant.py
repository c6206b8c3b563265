"""Adapter of kernels/group_quant.py (op `group_quant`).

Declares every 8-bit cell of the op (not the MX / NVFP4 formats): fp8 e4m3fn and int8; group (16/32/64/128), token and
tensor units; float and ue8m0 scales; the four layouts of fp32 scales; bf16/fp16/fp32 inputs. Conventions (what the
oracle uses to judge it bit-exactly): scale = max(amax, 1e-10) / qmax, correctly rounded (vLLM's and SGLang's
per-token-group kernels: eps on amax, `amax / qmax`); elements x / scale, correctly rounded (vLLM's CUDA kernel divides;
its power-of-two path multiplies by the exact reciprocal, which is the same); ue8m0 by the bit-form round-up without
DeepGEMM's exponent clamp (with eps 1e-10 the exponent never leaves [1, 254], so the clamp cannot be observed); int8
rounds half to even then saturates (vLLM `scaled_int8_quant`; vLLM's `per_token_group_quant_int8` truncates instead -
the launcher's `int8_rounding="truncate"`, tested in tests/kernels/test_group_quant.py).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from harness.core.case import Case
from harness.core.device import DeviceInfo
from harness.ops.group_quant import AXES, MX_DTYPES
from harness.registry import Adapter, Unsupported, register
from kernels.group_quant import group_quant

#: every cell of the op's 8-bit formats; the MX and NVFP4 formats, their ocp_floor rule and swizzled block scales
#: are not this kernel's (undeclared: run rejects them)
_NOT_HERE = {"quant_dtype": (*MX_DTYPES, "nvfp4"), "scale_rule": ("ocp_floor",), "scale_layout": ("swizzle_128x4",)}
SUPPORT: dict[str, tuple[str, ...]] = {a.name: tuple(v for v in a.values if v not in _NOT_HERE.get(a.name, ()))
                                       for a in AXES}
CONVENTIONS = {"eps": 1e-10, "eps_placement": "amax", "scale_formula": "divide", "application": "divide",
               "int8_rounding": "half_even", "ue8m0_clamp": False}


def _check_declared(features: Mapping[str, str]) -> None:
    for axis, values in SUPPORT.items():
        if features.get(axis) not in values:
            raise Unsupported(f"triton-group-quant does not support {axis}={features.get(axis)!r}")


def requires(device: DeviceInfo, features: Mapping[str, str]) -> str | None:
    if features.get("quant_dtype") == "fp8_e4m3fn" and device.generation == "sm80":
        return "fp8 e4m3 casts need sm89 or newer"
    return None


def _interp_features(features: Mapping[str, str]) -> set[str]:
    # in-kernel fp8 casts (fp8_cast fix); int8 casts of clamped values (fp_to_int fix)
    return {"fp8_cast"} if features.get("quant_dtype") == "fp8_e4m3fn" else {"fp_to_int_overflow"}


def run(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor],
        fast_division: bool = False) -> None:
    f = case.features
    _check_declared(f)
    unit = f["unit"]
    group_quant(inputs["x"], dtype=f["quant_dtype"], unit=unit,
                group_size=int(f["group_size"]) if unit == "group" else 128, scale_rule=f["scale_rule"],
                layout=f["scale_layout"], eps=CONVENTIONS["eps"], int8_rounding=CONVENTIONS["int8_rounding"],
                fast_division=fast_division, out=outputs["codes"], scales=outputs["scales"])


def run_fast_division(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
    run(case, inputs, outputs, fast_division=True)


#: the kernel's internal thresholds (kernels.group_quant: MAX_TILE = 8192, TILE_ELEMS = 4096, 1024-column
#: per-tensor tiles), each crossed in the cells whose path it splits
CROSS = {"cross_K": [
    {"at": 8192 + 128, "where": {"unit": ("token",)}},  # a row past the register tile: the two-pass wide-row kernel
    {"at": 1024 + 1, "where": {"unit": ("tensor",)}},  # per-tensor: a second 1024-column amax chunk and quant tile
    # 33 groups of 128: past the 4096-element tile's 32 groups, a second program along K
    {"at": 33 * 128, "where": {"unit": ("group",), "group_size": ("128",)}},
]}

ADAPTER = register(Adapter(
    name="triton-group-quant", op="group_quant", source="kernels.group_quant", run=run, support=SUPPORT,
    conventions=CONVENTIONS, properties=frozenset({"deterministic"}),
    generations=("interp", "sm80", "sm89", "sm90", "sm100", "sm120"), requires=requires,
    interp_features=_interp_features, limits=CROSS,
    description="Triton dynamic 8-bit quant: per-token-group (any group size dividing K), per-token, per-tensor",
))

#: the same kernel dividing with fp32 `/` (approximate on NVIDIA GPUs): declared as such, judged by what that
#: division can produce (harness.ops.group_quant), exact on the interpreter
FAST_DIVISION_ADAPTER = register(Adapter(
    name="triton-group-quant-fastdiv", op="group_quant", source="kernels.group_quant", run=run_fast_division,
    support=SUPPORT, conventions={**CONVENTIONS, "division": "approximate"}, properties=frozenset({"deterministic"}),
    generations=("interp", "sm80", "sm89", "sm90", "sm100", "sm120"), requires=requires,
    interp_features=_interp_features, limits=CROSS,
    description="triton-group-quant with fp32 '/' (div.full.f32 on the GPU) instead of tl.div_rn",
))
