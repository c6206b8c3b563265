"""Quantization and dequantization of activations and weights (docs/SEMANTICS.md §2).

One object, `QuantRecipe`, states an adapter's whole convention (element dtype, unit, group size, scale rule,
eps, how the scale is applied, int8 rounding, scale layout, ...); `quantize(x, recipe)` returns a
`QuantizedTensor` and `dequantize(qt)` maps it back to float32 as (q - zero_point) * scale.

Shapes. x is [..., M, K] (K = last dim, the reduction dim of the following GEMM; M = rows: tokens for
activations, output channels N for weights; leading dims are batch dims such as experts E). Units:
- `tensor`: one scale for all of x; scales shape [] (0-d).
- `row`: per token / per output channel; scales [..., M, 1].
- `group`: groups of `group_size` contiguous elements along K; scales [..., M, G], G = ceil(K / group_size).
  K must be a multiple of group_size unless `ragged_k` (the last group is then shorter).
- `block`: 2-D blocks of `block_rows` x `group_size` over (M, K) (128x128 DeepSeek FP8 weights); scales
  [..., ceil(M / block_rows), G]; edge blocks are ragged and computed over their valid elements only.

Element dtypes (`QuantDtype`) and what `codes` hold:
- fp8_e4m3fn / fp8_e4m3fnuz / fp8_e5m2: uint8 bit patterns [..., M, K] (view them as torch float8 to compare
  with a kernel; compare NaN codes by pattern). Scaled values are clamped to [-qmax, qmax] before the exact
  round-to-nearest-even encode, so the result never depends on torch's cast.
- int8: int8 [..., M, K], rounding per `Int8Rounding`.
- mxfp8 (e4m3fn elements) / mxfp4 (e2m1, packed two per byte along K: element 2i low nibble): blocks of 32,
  scales are e8m0 codes (uint8), rule `ocp_floor` (default) or `ue8m0`.
- nvfp4: blocks of 16, e2m1 elements packed, block scales are e4m3fn codes (uint8), plus an fp32 per-tensor
  `global_scale` (`GlobalScaleConvention`).
- w4a16: uint4 weights packed two per byte along K ([..., N, K/2], element k in byte k//2 at shift 4*(k%2));
  zero points (if `zero_point`) uint4 [..., N, G] packed along N the same way ([..., N/2, G]); implicit zp 8.
- w8a16: uint8 weights [..., N, K]; zero points (if `zero_point`) uint8 [..., N, G]; implicit zp 128.
Scales of fp8/int8/w4a16/w8a16 are float32 (powers of two under `ue8m0`/`ocp_floor`).

All scaling arithmetic is float32 (bf16/fp16 inputs are converted to float32 first, exactly). A zero scale
quantizes its unit to zero codes. Inputs containing NaN or inf raise ValueError: production kernels disagree
on them (CUDA fmaxf drops NaN from amax, others propagate it), so the oracle leaves them undefined; the exact
per-format behaviour of NaN/inf *codes* is in `reference.formats.encode`.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, fields
from typing import Any

import torch

from reference import formats
from reference._checks import check_choice, check_int, check_tensor
from reference.formats import FloatFormat, NegativeZero, Ties
from reference.scales import (
    EpsPlacement,
    ScaleApplication,
    ScaleFormula,
    ScaleLayout,
    ScaleRule,
    Ue8m0Form,
    apply_scale,
    compute_scale,
    from_layout,
    to_layout,
)

__all__ = [
    "EpsDtype",
    "GlobalScaleConvention",
    "Int8Rounding",
    "Nvfp4ScaleForm",
    "QuantDtype",
    "QuantRecipe",
    "QuantUnit",
    "QuantizedTensor",
    "dequantize",
    "logical_scales",
    "quantize",
    "resolve_eps",
    "round_int8",
    "scale_from_amax",
    "unit_amax",
]

_X_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class QuantDtype(str, enum.Enum):
    """Quantized element type / scheme (module docstring)."""

    FP8_E4M3FN = "fp8_e4m3fn"
    FP8_E4M3FNUZ = "fp8_e4m3fnuz"
    FP8_E5M2 = "fp8_e5m2"
    INT8 = "int8"
    MXFP8 = "mxfp8"
    MXFP4 = "mxfp4"
    NVFP4 = "nvfp4"
    W4A16 = "w4a16"
    W8A16 = "w8a16"


class QuantUnit(str, enum.Enum):
    """What one scale covers: the whole tensor, a row, a group of a row along K, or a 2-D block."""

    TENSOR = "tensor"
    ROW = "row"
    GROUP = "group"
    BLOCK = "block"


class Int8Rounding(str, enum.Enum):
    """int8 rounding of v = x / s.

    `half_even`: round half to even, then saturate to [-128, 127] (vLLM `scaled_int8_quant`).
    `half_away`: round half away from zero, then saturate (`per_token_quant_int8`).
    `truncate`: clamp to [-128, 127], then truncate toward zero (`per_token_group_quant_int8`).
    """

    HALF_EVEN = "half_even"
    HALF_AWAY = "half_away"
    TRUNCATE = "truncate"


class GlobalScaleConvention(str, enum.Enum):
    """What NVFP4's fp32 per-tensor scale holds.

    `quant_side`: gs = 448*6 / amax_tensor; block scale code = e4m3(gs * amax_blk/6); element scale = s_blk / gs.
    `dequant_side`: g = amax_tensor / (448*6); block scale code = e4m3((amax_blk/6) / g); element scale = s_blk * g.
    """

    QUANT_SIDE = "quant_side"
    DEQUANT_SIDE = "dequant_side"


class EpsDtype(str, enum.Enum):
    """In which dtype eps guards amax: `float32` (the default: fp32(eps)), `bfloat16` or `float16` (eps rounded to
    that dtype first), or `input`: rounded to the dtype of the tensor quantized (x's; the quantized schemes of the
    experts op: the activations' dtype), as torch code `x.abs().amax(-1).clamp(min=eps)` on a bf16/fp16 x computes
    (vLLM's torch reference of per-token-group quantization); bf16(1e-10) is 1.0004e-10. eps is converted as
    torch converts a Python scalar for a tensor of that dtype: to float32, then to the dtype (`resolve_eps`)."""

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    INPUT = "input"


class Nvfp4ScaleForm(str, enum.Enum):
    """How NVFP4 forms the factor that scales x from the block scale s_blk and the global scale (gs quant-side,
    g dequant-side).

    `element_scale` (default): es = s_blk / gs (quant side) or s_blk * g (dequant side); x scaled by es per
        `application`.
    `global_reciprocal`: es = s_blk * fp32(1 / gs) (vLLM's CUDA quantizer and its torch reference, quant side;
        dequant side as the default); x scaled by es per `application` (vLLM: multiply_reciprocal).
    `reciprocal_over_block`: x * fp32(r / s_blk) with r = gs (quant side) or fp32(1 / g) (dequant side, torchao's
        `(1 / per_tensor_scale) / block_scale`); needs application `multiply_reciprocal`.
    Dequantization multiplies codes by es of the form (`reciprocal_over_block`: the default's es).
    """

    ELEMENT_SCALE = "element_scale"
    GLOBAL_RECIPROCAL = "global_reciprocal"
    RECIPROCAL_OVER_BLOCK = "reciprocal_over_block"


_NVFP4_BLOCK_FLOOR = 2.0**-6  # e4m3's smallest normal

_FP8 = {
    QuantDtype.FP8_E4M3FN: FloatFormat.E4M3FN,
    QuantDtype.FP8_E4M3FNUZ: FloatFormat.E4M3FNUZ,
    QuantDtype.FP8_E5M2: FloatFormat.E5M2,
}
_MX = {QuantDtype.MXFP8: FloatFormat.E4M3FN, QuantDtype.MXFP4: FloatFormat.E2M1}
_WEIGHT_ONLY = {QuantDtype.W4A16: 4, QuantDtype.W8A16: 8}
_NVFP4_GLOBAL = 448.0 * 6.0
#: applications whose factor comes from amax, not from the stored scale
_FROM_AMAX = (ScaleApplication.QMAX_OVER_AMAX, ScaleApplication.QMAX_OVER_AMAX_RN)
#: scale formulas that store the reciprocal of a factor qmax / max(amax, eps)
_OF_FACTOR = (ScaleFormula.RECIPROCAL_OF_FACTOR, ScaleFormula.RECIPROCAL_OF_QMAX_OVER_AMAX)
_EPS_DTYPES = {EpsDtype.FLOAT32: torch.float32, EpsDtype.BFLOAT16: torch.bfloat16, EpsDtype.FLOAT16: torch.float16}


def _coerce(name: str, v: object, cls: type[enum.Enum]) -> enum.Enum:
    if isinstance(v, str) and not isinstance(v, cls):
        check_choice(name, v, [m.value for m in cls])
        return cls(v)
    return check_choice(name, v, list(cls))  # type: ignore[return-value]


_ENUM_FIELDS: dict[str, type[enum.Enum]] = {
    "dtype": QuantDtype,
    "unit": QuantUnit,
    "scale_rule": ScaleRule,
    "eps_placement": EpsPlacement,
    "scale_formula": ScaleFormula,
    "application": ScaleApplication,
    "int8_rounding": Int8Rounding,
    "layout": ScaleLayout,
    "global_scale": GlobalScaleConvention,
    "ue8m0_form": Ue8m0Form,
    "eps_dtype": EpsDtype,
    "nvfp4_scale_form": Nvfp4ScaleForm,
    "e2m1_ties": Ties,
    "e2m1_negative_zero": NegativeZero,
}


@dataclass(frozen=True)
class QuantRecipe:
    """One quantization convention (an adapter declares one per quantized input). JSON-serializable.

    dtype: element type / scheme. unit: `group` by default. group_size: K-extent of a group or block (128;
    must be 32 for MX, 16 for NVFP4). block_rows: M-extent of a `block` (128). ragged_k: allow K not a multiple
    of group_size (last group shorter). scale_rule: `float` (default), `ue8m0` or `ocp_floor` (MX default).
    eps (1e-10), eps_placement (`amax`), scale_formula (`divide`): the `float` rule's details.
    ue8m0_clamp: clamp the ue8m0 exponent to [1, 254] (DeepGEMM). application: `divide` (default),
    `multiply_reciprocal` (x * fp32(1/s): DeepGEMM's current helpers, x * (1 / sf)) or `qmax_over_amax`
    (DeepGEMM's older helpers, PyTorch `x * (qmax / max(amax, eps))`: two fp32 roundings, see ScaleApplication)
    or `qmax_over_amax_rn` (the same factor rounded once: torchao's fp8 blockwise kernels).
    int8_rounding: `half_even` (default). layout: scale layout, `row_major` (default); the others need a 2-D x
    and unit `group`/`row`. global_scale: NVFP4's convention (`quant_side`).
    zero_point: w4a16/w8a16 asymmetric quantization with explicit zero points (default symmetric, implicit zp).
    Library-exact details: ue8m0_form (`exponent_bits` or `ceil_log2`, see reference.scales), eps_dtype (`float32`,
    `bfloat16`, `float16` or `input`, see EpsDtype), nvfp4_scale_form (see Nvfp4ScaleForm), nvfp4_block_floor
    (NVFP4 block scales clamped below at 2^-6 before their e4m3 encoding, as torchao does; default False: e4m3
    subnormals and 0),
    e2m1_ties (`even` or `toward_zero`, the tie rule of mxfp4/nvfp4 element codes), e2m1_negative_zero (`kept` or
    `never`: whether a negative mxfp4/nvfp4 element that rounds to zero gets code 0x8 or 0x0, see NegativeZero).
    Use `QuantRecipe.mx(...)`/`nvfp4()` for the schemes' canonical settings.
    """

    dtype: QuantDtype = QuantDtype.FP8_E4M3FN
    unit: QuantUnit = QuantUnit.GROUP
    group_size: int = 128
    block_rows: int = 128
    ragged_k: bool = False
    scale_rule: ScaleRule = ScaleRule.FLOAT
    eps: float = 1e-10
    eps_placement: EpsPlacement = EpsPlacement.AMAX
    scale_formula: ScaleFormula = ScaleFormula.DIVIDE
    ue8m0_clamp: bool = False
    application: ScaleApplication = ScaleApplication.DIVIDE
    int8_rounding: Int8Rounding = Int8Rounding.HALF_EVEN
    layout: ScaleLayout = ScaleLayout.ROW_MAJOR
    global_scale: GlobalScaleConvention = GlobalScaleConvention.QUANT_SIDE
    zero_point: bool = False
    ue8m0_form: Ue8m0Form = Ue8m0Form.EXPONENT_BITS
    eps_dtype: EpsDtype = EpsDtype.FLOAT32
    nvfp4_scale_form: Nvfp4ScaleForm = Nvfp4ScaleForm.ELEMENT_SCALE
    nvfp4_block_floor: bool = False
    e2m1_ties: Ties = Ties.EVEN
    e2m1_negative_zero: NegativeZero = NegativeZero.KEPT

    def __post_init__(self) -> None:
        for name, cls in _ENUM_FIELDS.items():
            object.__setattr__(self, name, _coerce(name, getattr(self, name), cls))
        check_int("group_size", self.group_size, min_value=1)
        check_int("block_rows", self.block_rows, min_value=1)
        for name in ("ragged_k", "ue8m0_clamp", "zero_point", "nvfp4_block_floor"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) or self.eps < 0:
            raise ValueError(f"eps must be a non-negative number, got {self.eps!r}")
        d = self.dtype
        if d in _MX:
            if self.unit != QuantUnit.GROUP or self.group_size != 32:
                raise ValueError(f"group_size must be 32 with unit 'group' for {d.value}, got "
                                 f"{self.unit.value} {self.group_size}")
            if self.scale_rule == ScaleRule.FLOAT:
                raise ValueError(f"scale_rule must be 'ocp_floor' or 'ue8m0' for {d.value} (e8m0 scales)")
        if d == QuantDtype.NVFP4:
            if self.unit != QuantUnit.GROUP or self.group_size != 16:
                raise ValueError(f"group_size must be 16 with unit 'group' for nvfp4, got "
                                 f"{self.unit.value} {self.group_size}")
            if self.scale_rule != ScaleRule.FLOAT:
                raise ValueError("scale_rule must be 'float' for nvfp4 (e4m3 block scales)")
        if (d == QuantDtype.NVFP4 and self.nvfp4_scale_form == Nvfp4ScaleForm.RECIPROCAL_OVER_BLOCK
                and self.application != ScaleApplication.MULTIPLY_RECIPROCAL):
            raise ValueError("nvfp4_scale_form 'reciprocal_over_block' multiplies x by a reciprocal: it needs "
                             "application 'multiply_reciprocal'")
        if d in _WEIGHT_ONLY and self.unit not in (QuantUnit.GROUP, QuantUnit.ROW):
            raise ValueError(f"unit must be 'group' or 'row' for {d.value}, got {self.unit.value}")
        if d in _WEIGHT_ONLY and self.scale_rule != ScaleRule.FLOAT:
            raise ValueError(f"scale_rule must be 'float' for {d.value}")
        if self.scale_rule == ScaleRule.OCP_FLOOR and d not in _MX and d not in _FP8:
            raise ValueError(f"scale_rule 'ocp_floor' is defined for fp8 and MX element types, not {d.value}")
        if self.application in _FROM_AMAX and (
            self.scale_rule != ScaleRule.FLOAT or d not in (*_FP8, QuantDtype.INT8)
            or self.eps_placement != EpsPlacement.AMAX
        ):
            raise ValueError(f"application {self.application.value!r} needs scale_rule 'float' with eps_placement "
                             "'amax' and an fp8 or int8 dtype")
        if self.scale_formula in _OF_FACTOR and (d == QuantDtype.NVFP4 or self.eps_placement != EpsPlacement.AMAX):
            raise ValueError(f"scale_formula {self.scale_formula.value!r} needs eps_placement 'amax' (the factor is "
                             "qmax / max(amax, eps)) and is not an nvfp4 block scale formula")
        if self.layout != ScaleLayout.ROW_MAJOR and self.unit not in (QuantUnit.GROUP, QuantUnit.ROW):
            raise ValueError(f"layout {self.layout.value} needs unit 'group' or 'row', got {self.unit.value}")
        if self.layout == ScaleLayout.PACKED_UE8M0 and (
            d not in _FP8 or self.scale_rule not in (ScaleRule.UE8M0, ScaleRule.OCP_FLOOR)
        ):
            raise ValueError("layout packed_ue8m0 needs an fp8 dtype and power-of-two scales "
                             "(scale_rule 'ue8m0' or 'ocp_floor')")

    @classmethod
    def mx(cls, dtype: QuantDtype | str = QuantDtype.MXFP4, **overrides: Any) -> QuantRecipe:
        """MXFP8/MXFP4: group 32 along K, e8m0 scales by the OCP floor rule (override e.g. scale_rule='ue8m0')."""
        kw: dict[str, Any] = {"unit": QuantUnit.GROUP, "group_size": 32, "scale_rule": ScaleRule.OCP_FLOOR}
        return cls(dtype=dtype, **{**kw, **overrides})  # type: ignore[arg-type]

    @classmethod
    def nvfp4(cls, **overrides: Any) -> QuantRecipe:
        """NVFP4: group 16 along K, e4m3 block scales, quant-side fp32 global scale."""
        kw: dict[str, Any] = {"unit": QuantUnit.GROUP, "group_size": 16, "scale_rule": ScaleRule.FLOAT}
        return cls(dtype=QuantDtype.NVFP4, **{**kw, **overrides})

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (enums as their string values)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = v.value if isinstance(v, enum.Enum) else v
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QuantRecipe:
        """Inverse of `to_dict` (missing keys take their defaults; unknown keys raise ValueError)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"recipe has unknown keys: {', '.join(unknown)}")
        return cls(**d)


@dataclass(frozen=True)
class QuantizedTensor:
    """The result of `quantize` (or a kernel's output wrapped for `dequantize`).

    codes: element codes (module docstring). scales: in `recipe.layout`. shape: logical shape of x.
    global_scale: NVFP4 fp32 0-d tensor in `recipe.global_scale`'s convention, else None.
    zero_points: w4a16/w8a16 with `recipe.zero_point`, else None.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    recipe: QuantRecipe
    shape: tuple[int, ...]
    global_scale: torch.Tensor | None = None
    zero_points: torch.Tensor | None = None


# ------------------------------------------------------------------------------------------------ helpers


def round_int8(v: torch.Tensor, rounding: Int8Rounding | str = Int8Rounding.HALF_EVEN) -> torch.Tensor:
    """Round float32 values (already divided by the scale) to int8 by `rounding` (see `Int8Rounding`)."""
    check_tensor("v", v, dtypes=(torch.float32,))
    rounding = _coerce("rounding", rounding, Int8Rounding)
    v64 = v.to(torch.float64)  # |v| + 0.5 is exact in float64 (it is not in float32 just below .5)
    if rounding == Int8Rounding.HALF_EVEN:
        r = torch.round(v64).clamp(-128, 127)
    elif rounding == Int8Rounding.HALF_AWAY:
        r = (torch.sign(v64) * torch.floor(v64.abs() + 0.5)).clamp(-128, 127)
    else:
        r = torch.trunc(v64.clamp(-128, 127))
    return r.to(torch.int8)


def _qmax(d: QuantDtype) -> float:
    if d in _FP8:
        return formats.spec(_FP8[d]).max_value
    if d in _MX:
        return formats.spec(_MX[d]).max_value
    if d == QuantDtype.NVFP4:
        return 6.0
    return 127.0  # int8


def _emax_elem(d: QuantDtype) -> int | None:
    if d in _FP8:
        return formats.spec(_FP8[d]).emax
    if d in _MX:
        return formats.spec(_MX[d]).emax
    return None


def _num_groups(k: int, recipe: QuantRecipe) -> int:
    if recipe.unit in (QuantUnit.GROUP, QuantUnit.BLOCK):
        return -(-k // recipe.group_size)
    return 1


def _scale_shape(shape: tuple[int, ...], recipe: QuantRecipe) -> tuple[int, ...]:
    if recipe.unit == QuantUnit.TENSOR:
        return ()
    if recipe.unit == QuantUnit.ROW:
        return (*shape[:-1], 1)
    if recipe.unit == QuantUnit.GROUP:
        return (*shape[:-1], _num_groups(shape[-1], recipe))
    return (*shape[:-2], -(-shape[-2] // recipe.block_rows), _num_groups(shape[-1], recipe))


def _check_shape(shape: tuple[int, ...], recipe: QuantRecipe) -> None:
    need = 2 if recipe.unit == QuantUnit.BLOCK or recipe.dtype in _WEIGHT_ONLY else 1
    if len(shape) < need or any(s == 0 for s in shape):
        raise ValueError(f"x must be at least {need}-D and non-empty for unit {recipe.unit.value}, got {list(shape)}")
    k = shape[-1]
    if recipe.unit in (QuantUnit.GROUP, QuantUnit.BLOCK) and k % recipe.group_size:
        if recipe.unit == QuantUnit.GROUP and not recipe.ragged_k:
            raise ValueError(f"group_size {recipe.group_size} does not divide K={k} (set ragged_k=True where the "
                             f"kernel allows a shorter last group)")
    if recipe.dtype in (QuantDtype.MXFP4, QuantDtype.NVFP4, QuantDtype.W4A16) and k % 2:
        raise ValueError(f"K must be even to pack two 4-bit codes per byte, got K={k}")
    if recipe.dtype == QuantDtype.W4A16 and recipe.zero_point and shape[-2] % 2:
        raise ValueError(f"N must be even to pack int4 zero points along N, got N={shape[-2]}")
    if recipe.layout != ScaleLayout.ROW_MAJOR and len(shape) != 2:
        raise ValueError(f"layout {recipe.layout.value} needs a 2-D x, got shape {list(shape)}")


def _unit_reduce(x: torch.Tensor, recipe: QuantRecipe, op: str) -> torch.Tensor:
    """amax ('amax' of |x|), 'max' or 'min' of x over each unit; shaped like the logical scales."""
    fill = {"amax": 0.0, "max": float("-inf"), "min": float("inf")}[op]
    v = x.abs() if op == "amax" else x
    red = torch.amax if op in ("amax", "max") else torch.amin
    if recipe.unit == QuantUnit.TENSOR:
        return red(v)
    if recipe.unit == QuantUnit.ROW:
        return red(v, dim=-1, keepdim=True)
    k = v.shape[-1]
    g = recipe.group_size
    kg = _num_groups(k, recipe)
    vk = torch.full((*v.shape[:-1], kg * g), fill, dtype=v.dtype, device=v.device)
    vk[..., :k] = v  # padding never wins the reduction: the unit is its valid elements
    vk = vk.view(*v.shape[:-1], kg, g)
    if recipe.unit == QuantUnit.GROUP:
        return red(vk, dim=-1)
    m = v.shape[-2]
    br = recipe.block_rows
    mb = -(-m // br)
    vm = torch.full((*v.shape[:-2], mb * br, kg, g), fill, dtype=v.dtype, device=v.device)
    vm[..., :m, :, :] = vk
    vm = vm.view(*v.shape[:-2], mb, br, kg, g)
    return red(red(vm, dim=-1), dim=-2)


def _expand(s: torch.Tensor, shape: tuple[int, ...], recipe: QuantRecipe) -> torch.Tensor:
    """Broadcast logical per-unit values to every element of x (shape `shape`)."""
    if recipe.unit in (QuantUnit.TENSOR, QuantUnit.ROW):
        return s.expand(shape)
    k = shape[-1]
    out = s.repeat_interleave(recipe.group_size, dim=-1)[..., :k]
    if recipe.unit == QuantUnit.BLOCK:
        out = out.repeat_interleave(recipe.block_rows, dim=-2)[..., : shape[-2], :]
    return out


def _check_x(x: object) -> torch.Tensor:
    x = check_tensor("x", x, dtypes=_X_DTYPES)
    if not bool(torch.isfinite(x).all()):
        raise ValueError("x contains NaN or inf: quantization of non-finite values is implementation-defined "
                         "(kernels differ) and the oracle does not define it")
    return x


def logical_scales(qt: QuantizedTensor) -> torch.Tensor:
    """qt's scales back in logical row-major shape (the layout undone); codes stay codes (e8m0/e4m3 uint8)."""
    shape = tuple(qt.shape)
    want = _scale_shape(shape, qt.recipe)
    if qt.recipe.layout == ScaleLayout.ROW_MAJOR:
        s = qt.scales
    else:
        m, g = want
        s = from_layout(qt.scales, qt.recipe.layout, m, g)
    check_tensor("scales", s, shape=want)
    return s


# ----------------------------------------------------------------------------------------------- quantize


def quantize(
    x: torch.Tensor,
    recipe: QuantRecipe,
    *,
    scales: torch.Tensor | None = None,
    global_scale: torch.Tensor | None = None,
) -> QuantizedTensor:
    """Quantize x by `recipe` (module docstring for shapes, units and codes).

    x: float16/bfloat16/float32 [..., M, K], finite (NaN/inf raise ValueError); any strides.
    scales: optional precomputed (static) float32 scales in the logical shape of the unit (not the layout);
        fp8/int8/w4a16/w8a16 symmetric only. global_scale: optional NVFP4 fp32 0-d scale in the recipe's
        convention (default: computed from x's amax).
    Returns a QuantizedTensor whose scales are stored in recipe.layout.
    """
    if not isinstance(recipe, QuantRecipe):
        raise ValueError(f"recipe must be a QuantRecipe, got {type(recipe).__name__}")
    x = _check_x(x)
    shape = tuple(x.shape)
    _check_shape(shape, recipe)
    x32 = x.to(torch.float32)
    d = recipe.dtype
    if scales is not None and recipe.application in _FROM_AMAX:
        raise ValueError(f"scales cannot be given with application {recipe.application.value!r} (the factor comes "
                         "from amax)")
    if scales is not None and (d in _MX or d == QuantDtype.NVFP4 or recipe.zero_point):
        raise ValueError(f"scales cannot be given for {d.value}" + (" with zero points" if recipe.zero_point else ""))
    if global_scale is not None and d != QuantDtype.NVFP4:
        raise ValueError("global_scale is only used by nvfp4")
    given, recipe = recipe, resolve_eps(recipe, x.dtype)
    if d == QuantDtype.NVFP4:
        return dataclasses.replace(_quantize_nvfp4(x32, recipe, global_scale), recipe=given)
    if d in _WEIGHT_ONLY:
        return dataclasses.replace(_quantize_weight_only(x32, recipe, scales), recipe=given)

    if scales is not None:
        check_tensor("scales", scales, dtypes=(torch.float32,), shape=_scale_shape(shape, recipe))
        if not bool(torch.isfinite(scales).all()) or bool((scales < 0).any()):
            raise ValueError("scales must be finite and >= 0")
        s = scales
    else:
        amax = _unit_reduce(x32, recipe, "amax")
        s = scale_from_amax(amax, recipe)
    if recipe.application == ScaleApplication.QMAX_OVER_AMAX:
        y = x32 * _expand(_qmax_over_amax(amax, _qmax(d), recipe.eps), shape, recipe)
    elif recipe.application == ScaleApplication.QMAX_OVER_AMAX_RN:
        y = x32 * _expand(_qmax_over_amax_rn(amax, _qmax(d), recipe.eps), shape, recipe)
    else:
        y = apply_scale(x32, _expand(s, shape, recipe), recipe.application)

    if d == QuantDtype.INT8:
        codes = round_int8(y, recipe.int8_rounding)
        stored = s
    else:
        fmt = _FP8[d] if d in _FP8 else _MX[d]
        qmax = _qmax(d)
        codes = formats.encode(y.clamp(-qmax, qmax), fmt, saturate=True, **_element_rounding(recipe, fmt))
        if fmt == FloatFormat.E2M1:
            codes = formats.pack_nibbles(codes)
        stored = formats.encode(s, FloatFormat.E8M0) if d in _MX else s
    if recipe.layout != ScaleLayout.ROW_MAJOR:
        stored = to_layout(stored.reshape(shape[0], -1), recipe.layout)
    return QuantizedTensor(codes=codes, scales=stored, recipe=given, shape=shape)


def unit_amax(x: torch.Tensor, recipe: QuantRecipe) -> torch.Tensor:
    """float32 amax of each unit of x under `recipe`, in the logical scale shape (the input of `scale_from_amax`)."""
    return _unit_reduce(_check_x(x).to(torch.float32), recipe, "amax")


def scale_from_amax(amax: torch.Tensor, recipe: QuantRecipe,
                    input_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The scales `quantize` gives units whose float32 amax is `amax`, for an input of `input_dtype` (fp8, int8
    and MX dtypes: every scale rule and recipe detail applied). Where the scale is stored as an e8m0 byte (MX,
    the packed_ue8m0 layout) it is the value that byte holds: the codes are computed with it."""
    check_tensor("amax", amax, dtypes=(torch.float32,))
    r = resolve_eps(recipe, input_dtype)
    in_e8m0 = r.dtype in _MX or r.layout == ScaleLayout.PACKED_UE8M0
    return compute_scale(amax, _qmax(r.dtype), r.scale_rule, eps=r.eps, eps_placement=r.eps_placement,
                         formula=r.scale_formula, ue8m0_clamp=r.ue8m0_clamp, emax_elem=_emax_elem(r.dtype),
                         ue8m0_form=r.ue8m0_form, e8m0_range=in_e8m0)


def resolve_eps(recipe: QuantRecipe, input_dtype: torch.dtype) -> QuantRecipe:
    """The recipe with eps as its `eps_dtype` holds it (`input`: input_dtype, the dtype of the tensor quantized),
    converted as torch converts a Python scalar for a tensor of that dtype: to float32, then to the dtype. The
    result's eps_dtype is float32 (eps is then a value of that dtype, compared in fp32 exactly)."""
    if recipe.eps_dtype == EpsDtype.FLOAT32:
        return recipe
    check_choice("input_dtype", input_dtype, _X_DTYPES)
    dtype = input_dtype if recipe.eps_dtype == EpsDtype.INPUT else _EPS_DTYPES[recipe.eps_dtype]
    eps = float(torch.tensor(float(recipe.eps), dtype=torch.float32).to(dtype))
    return dataclasses.replace(recipe, eps=eps, eps_dtype=EpsDtype.FLOAT32)


def _element_rounding(recipe: QuantRecipe, fmt: FloatFormat) -> dict[str, Any]:
    """formats.encode's tie and zero-sign arguments for the recipe's element format (e2m1's are declared)."""
    if fmt != FloatFormat.E2M1:
        return {}
    return {"ties": recipe.e2m1_ties, "negative_zero": recipe.e2m1_negative_zero}


def _qmax_over_amax(amax: torch.Tensor, qmax: float, eps: float) -> torch.Tensor:
    """The factor PyTorch code `qmax / amax.clamp(min=eps)` computes: torch evaluates a Python scalar divided by
    a tensor as `reciprocal() * qmax`, so two float32 roundings (fp32(1/a), then the product), not one."""
    a = torch.maximum(amax, torch.full_like(amax, eps)).to(torch.float64)
    recip = (1.0 / a).to(torch.float32)  # correctly rounded: float64 has more than 2 * 24 + 2 bits
    return (recip.to(torch.float64) * qmax).to(torch.float32)  # the fp32 x fp32 product is exact in float64


def _qmax_over_amax_rn(amax: torch.Tensor, qmax: float, eps: float) -> torch.Tensor:
    """fp32(qmax / max(amax, eps)), correctly rounded (the float64 quotient rounded once: innocuous double rounding
    for a division of float32 values); 0 where max(amax, eps) is 0, so that the unit's codes are zeros."""
    a = torch.maximum(amax, torch.full_like(amax, eps)).to(torch.float64)
    safe = torch.where(a == 0, torch.ones_like(a), a)
    return torch.where(a == 0, torch.zeros_like(a), qmax / safe).to(torch.float32)


def _nvfp4_global(amax_t: torch.Tensor, recipe: QuantRecipe) -> torch.Tensor:
    a = torch.maximum(amax_t, torch.full_like(amax_t, recipe.eps))
    c = torch.full_like(a, _NVFP4_GLOBAL)
    return c / a if recipe.global_scale == GlobalScaleConvention.QUANT_SIDE else a / c


def _nvfp4_element_scale(block_codes: torch.Tensor, gs: torch.Tensor, recipe: QuantRecipe) -> torch.Tensor:
    """es, the value one element code stands for per unit of e2m1 (Nvfp4ScaleForm)."""
    sb = formats.decode(block_codes, FloatFormat.E4M3FN)
    g = gs.expand(sb.shape).contiguous()
    if recipe.global_scale == GlobalScaleConvention.DEQUANT_SIDE:
        return sb * g
    if recipe.nvfp4_scale_form == Nvfp4ScaleForm.GLOBAL_RECIPROCAL:
        return sb * (1.0 / g)
    return sb / g


def _nvfp4_scaled(x32: torch.Tensor, block_codes: torch.Tensor, gs: torch.Tensor, recipe: QuantRecipe,
                  shape: tuple[int, ...]) -> torch.Tensor:
    """x in units of e2m1 before the element rounding."""
    if recipe.nvfp4_scale_form != Nvfp4ScaleForm.RECIPROCAL_OVER_BLOCK:
        es = _nvfp4_element_scale(block_codes, gs, recipe)
        return apply_scale(x32, _expand(es, shape, recipe), recipe.application)
    sb = formats.decode(block_codes, FloatFormat.E4M3FN)
    g = gs.expand(sb.shape).contiguous()
    r = g if recipe.global_scale == GlobalScaleConvention.QUANT_SIDE else 1.0 / g
    safe = torch.where(sb == 0, torch.ones_like(sb), sb)
    factor = torch.where(sb == 0, torch.zeros_like(sb), r / safe)  # a zero block scale: zero codes
    return x32 * _expand(factor, shape, recipe)


def _quantize_nvfp4(x32: torch.Tensor, recipe: QuantRecipe, global_scale: torch.Tensor | None) -> QuantizedTensor:
    shape = tuple(x32.shape)
    if global_scale is None:
        gs = _nvfp4_global(x32.abs().amax(), recipe)
    else:
        gs = check_tensor("global_scale", global_scale, dtypes=(torch.float32,), shape=())
        if not (bool(torch.isfinite(gs)) and float(gs) > 0):
            raise ValueError(f"global_scale must be finite and > 0, got {float(gs)}")
        gs = gs.to(x32.device)
    amax_b = _unit_reduce(x32, recipe, "amax")
    six = torch.full_like(amax_b, 6.0)
    per = amax_b / six if recipe.scale_formula == ScaleFormula.DIVIDE else amax_b * (1.0 / six)
    g = gs.expand(per.shape).contiguous()
    sb = per * g if recipe.global_scale == GlobalScaleConvention.QUANT_SIDE else per / g
    if recipe.nvfp4_block_floor:
        sb = torch.maximum(sb, torch.full_like(sb, _NVFP4_BLOCK_FLOOR))
    block_codes = formats.encode(sb, FloatFormat.E4M3FN, saturate=True)
    y = _nvfp4_scaled(x32, block_codes, gs, recipe, shape)
    codes = formats.pack_nibbles(formats.encode(y.clamp(-6.0, 6.0), FloatFormat.E2M1, saturate=True,
                                                **_element_rounding(recipe, FloatFormat.E2M1)))
    stored = block_codes
    if recipe.layout != ScaleLayout.ROW_MAJOR:
        stored = to_layout(block_codes, recipe.layout)
    return QuantizedTensor(codes=codes, scales=stored, recipe=recipe, shape=shape, global_scale=gs.clone())


def _quantize_weight_only(x32: torch.Tensor, recipe: QuantRecipe, scales: torch.Tensor | None) -> QuantizedTensor:
    shape = tuple(x32.shape)
    bits = _WEIGHT_ONLY[recipe.dtype]
    top = (1 << bits) - 1  # 15 or 255
    mid = 1 << (bits - 1)  # implicit zero point 8 or 128
    if recipe.zero_point:
        # asymmetric (GPTQ/AWQ-like): the unit's range [min(lo, 0), max(hi, 0)] mapped onto [0, top]
        lo = torch.clamp(_unit_reduce(x32, recipe, "min"), max=0.0)
        hi = torch.clamp(_unit_reduce(x32, recipe, "max"), min=0.0)
        s = _recipe_float_scale(hi - lo, float(top), recipe)
        zp = torch.round(apply_scale(-lo, s, ScaleApplication.DIVIDE).to(torch.float64)).clamp(0, top)
    else:
        if scales is not None:
            s = check_tensor("scales", scales, dtypes=(torch.float32,), shape=_scale_shape(shape, recipe))
        else:
            s = _recipe_float_scale(_unit_reduce(x32, recipe, "amax"), float(mid - 1), recipe)
        zp = torch.full(s.shape, float(mid), dtype=torch.float64, device=s.device)
    v = apply_scale(x32, _expand(s, shape, recipe), recipe.application).to(torch.float64)
    q = (torch.round(v) + _expand(zp, shape, recipe)).clamp(0, top).to(torch.uint8)
    zpt = zp.to(torch.uint8) if recipe.zero_point else None
    if bits == 4:
        q = formats.pack_nibbles(q, dim=-1)
        if zpt is not None:
            zpt = formats.pack_nibbles(zpt, dim=-2)
    return QuantizedTensor(codes=q, scales=s, recipe=recipe, shape=shape, zero_points=zpt)


def _recipe_float_scale(extent: torch.Tensor, qmax: float, recipe: QuantRecipe) -> torch.Tensor:
    """The recipe's `float` rule applied to an extent (amax, or max - min for asymmetric weights)."""
    return compute_scale(extent, qmax, ScaleRule.FLOAT, eps=recipe.eps, eps_placement=recipe.eps_placement,
                         formula=recipe.scale_formula)


# --------------------------------------------------------------------------------------------- dequantize


def dequantize(qt: QuantizedTensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values of qt: (q - zero_point) * scale per element (zero_point 0 except w4a16/w8a16), multiplied in
    out_dtype: float32 (default, docs/SEMANTICS.md §2) or float64 (exact products, for the experts oracle;
    scales themselves, e.g. NVFP4's block scale times global scale, are still formed in float32).

    Validates codes, scales (in the recipe's layout), zero points and global scale against qt.shape and
    qt.recipe, raising ValueError naming the offending field. NaN fp8 codes dequantize to NaN.
    """
    if not isinstance(qt, QuantizedTensor):
        raise ValueError(f"qt must be a QuantizedTensor, got {type(qt).__name__}")
    r, shape, d = qt.recipe, tuple(qt.shape), qt.recipe.dtype
    _check_shape(shape, r)
    k = shape[-1]
    packed_k = d in (QuantDtype.MXFP4, QuantDtype.NVFP4, QuantDtype.W4A16)
    code_shape = (*shape[:-1], k // 2) if packed_k else shape
    code_dtype = torch.int8 if d == QuantDtype.INT8 else torch.uint8
    check_tensor("codes", qt.codes, dtypes=(code_dtype,), shape=code_shape)
    if r.layout == ScaleLayout.PACKED_UE8M0:
        check_tensor("scales", qt.scales, dtypes=(torch.int32,))
    elif d in _MX or d == QuantDtype.NVFP4:
        check_tensor("scales", qt.scales, dtypes=(torch.uint8,))
    else:
        check_tensor("scales", qt.scales, dtypes=(torch.float32,))
    check_choice("out_dtype", out_dtype, (torch.float32, torch.float64))
    od = out_dtype
    s = logical_scales(qt)

    if d == QuantDtype.NVFP4:
        gs = check_tensor("global_scale", qt.global_scale, dtypes=(torch.float32,), shape=())
        es = _nvfp4_element_scale(s, gs, r)
        q = formats.decode(formats.unpack_nibbles(qt.codes), FloatFormat.E2M1)
        return q.to(od) * _expand(es, shape, r).to(od)
    if d in _MX:
        s = formats.decode(s, FloatFormat.E8M0)
        c = qt.codes if d == QuantDtype.MXFP8 else formats.unpack_nibbles(qt.codes)
        return formats.decode(c, _MX[d]).to(od) * _expand(s, shape, r).to(od)
    if d in _FP8:
        return formats.decode(qt.codes, _FP8[d]).to(od) * _expand(s, shape, r).to(od)
    if d == QuantDtype.INT8:
        return qt.codes.to(od) * _expand(s, shape, r).to(od)

    bits = _WEIGHT_ONLY[d]
    q = formats.unpack_nibbles(qt.codes) if bits == 4 else qt.codes
    if r.zero_point:
        zshape = (*s.shape[:-2], s.shape[-2] // 2, s.shape[-1]) if bits == 4 else s.shape
        zp = check_tensor("zero_points", qt.zero_points, dtypes=(torch.uint8,), shape=zshape)
        zp = formats.unpack_nibbles(zp, dim=-2) if bits == 4 else zp
    else:
        if qt.zero_points is not None:
            raise ValueError("zero_points given but recipe.zero_point is False (implicit zero point)")
        zp = torch.full(s.shape, 1 << (bits - 1), dtype=torch.uint8, device=s.device)
    diff = q.to(od) - _expand(zp.to(od), shape, r)
    return diff * _expand(s, shape, r).to(od)
