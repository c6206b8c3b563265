"""Quantized operands of the fused-experts GEMM (`kernels.fused_experts._moe_gemm_kernel`).

Schemes (harness/ops/experts_quant.py has the input contract):
- fp8_w8a8 / int8_w8a8: weights pre-quantized (float8_e4m3fn / int8 codes); activations quantized here, per tensor
  (T), per token (A) or per token-group of 128 (G128, fp8 only), by `kernels.group_quant` (float scale rule,
  max(amax, 1e-10) / qmax, x / scale correctly rounded, int8 rounded half to even). Weight scales: T [E],
  A [E, rows, 1], G128 128x128 blocks [E, ceil(rows/128), K/128].
- w8a16 / w4a16 (and *_zp): uint8 codes (w4: two a byte along K, low nibble first), scales A [E, rows, 1] or
  G128 [E, rows, K/128], zero points implicit (128 / 8) or explicit [E, rows, G] (w4: packed along rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.group_quant import group_quant

__all__ = ["W8A8", "WEIGHT_ONLY", "ExpertsQuant", "QuantOperands", "quantize_activation"]

#: w8a8 quant types -> group_quant dtype
W8A8 = {"fp8_w8a8": "fp8_e4m3fn", "int8_w8a8": "int8"}
#: weight-only quant types -> bits of a code
WEIGHT_ONLY = {"w8a16": 8, "w8a16_zp": 8, "w4a16": 4, "w4a16_zp": 4}
FORMATS = {"fp8_w8a8": ("T", "A", "G128"), "int8_w8a8": ("T", "A"), "w8a16": ("A", "G128"),
           "w8a16_zp": ("G128",), "w4a16": ("A", "G128"), "w4a16_zp": ("G128",)}
_UNIT = {"T": "tensor", "A": "token", "G128": "group"}
GROUP = 128


@dataclass(frozen=True)
class QuantOperands:
    """What one GEMM launch needs to know about its quantized operands.

    a_scale: fp32 scales of A's codes ([1] per tensor, [rows, 1] per row, [rows, K/group] per group) or None
    (A unquantized). w_scale: the weight's fp32 scales (see the module docstring). w_zp: explicit zero points.
    group_k: K extent of one scale (0: constant along K). ws_row_div: weight rows sharing one scale row (128 for
    fp8 blocks). int_dot: int8 x int8. w_codes: 0 weights in A's dtype, 8 or 4: weight-only integer codes.
    """

    a_scale: torch.Tensor | None
    w_scale: torch.Tensor
    w_zp: torch.Tensor | None = None
    group_k: int = 0
    ws_row_div: int = 1
    int_dot: bool = False
    w_codes: int = 0

    def pointers(self, dummy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (self.a_scale if self.a_scale is not None else dummy, self.w_scale,
                self.w_zp if self.w_zp is not None else dummy)

    def strides(self) -> tuple[int, ...]:
        def of(t: torch.Tensor | None, dims: int) -> tuple[int, ...]:
            if t is None:
                return (0,) * dims
            # a size-1 dim is broadcast (stride 0): one scale per tensor / per expert / per row
            st = [0 if n == 1 else s for n, s in zip(t.shape, t.stride(), strict=True)]
            return (*st, *(0,) * (dims - len(st)))[:dims]

        a = of(self.a_scale, 2)
        w = of(self.w_scale, 3)
        if self.w_scale.dim() == 1:  # per tensor: one scale per expert
            w = (self.w_scale.stride(0), 0, 0)
        return (*a, *w, *of(self.w_zp, 3))

    def constexprs(self, block_k: int) -> dict[str, object]:
        if self.group_k and self.group_k % block_k:
            raise ValueError(f"BLOCK_K {block_k} must divide the scale group {self.group_k}")
        return {"A_SCALE": self.a_scale is not None, "W_SCALE": True, "SCALE_IN_LOOP": self.group_k > 0,
                "GROUP_K": self.group_k or GROUP, "WS_ROW_DIV": self.ws_row_div, "INT_DOT": self.int_dot,
                "W_CODES": self.w_codes, "HAS_ZP": self.w_zp is not None}


@dataclass(frozen=True)
class ExpertsQuant:
    """A quantized experts scheme as fused_experts takes it: the cell and the weights' scales / zero points."""

    quant_type: str
    quant_format: str
    w13_scale: torch.Tensor
    w2_scale: torch.Tensor
    w13_zp: torch.Tensor | None = None
    w2_zp: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.quant_format not in FORMATS.get(self.quant_type, ()):
            raise ValueError(f"unsupported quantized scheme {self.quant_type} {self.quant_format}")
        has_zp = self.w13_zp is not None and self.w2_zp is not None
        # no local experts: the harness passes no zero points (nothing would read them)
        if self.quant_type.endswith("_zp") != has_zp and self.w13_scale.shape[0] > 0:
            raise ValueError(f"{self.quant_type}: zero points must be given exactly for the *_zp schemes")

    @property
    def w8a8(self) -> bool:
        return self.quant_type in W8A8

    @property
    def per_tensor(self) -> bool:
        return self.quant_format == "T"

    def code_dtype(self) -> torch.dtype:
        return {"fp8_w8a8": torch.float8_e4m3fn, "int8_w8a8": torch.int8}.get(self.quant_type, torch.uint8)

    def packed_k(self) -> int:
        """K elements per stored weight code along K."""
        return 2 if WEIGHT_ONLY.get(self.quant_type) == 4 else 1

    def operands(self, which: str, a_scale: torch.Tensor | None) -> QuantOperands:
        w_scale = self.w13_scale if which == "w13" else self.w2_scale
        zp = self.w13_zp if which == "w13" else self.w2_zp
        grouped = self.quant_format == "G128"
        if self.w8a8:
            return QuantOperands(a_scale, w_scale, None, GROUP if grouped else 0, GROUP if grouped else 1,
                                 int_dot=self.quant_type == "int8_w8a8")
        return QuantOperands(None, w_scale, zp, GROUP if grouped else 0, 1, w_codes=WEIGHT_ONLY[self.quant_type])

    def quantize_activation(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize_activation(x, self.quant_type, self.quant_format)


def quantize_activation(x: torch.Tensor, quant_type: str, quant_format: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic quantization of rows x [R, K] by the scheme's activation recipe: (codes, fp32 scales)."""
    return group_quant(x, dtype=W8A8[quant_type], unit=_UNIT[quant_format], group_size=GROUP, scale_rule="float",
                       eps=1e-10, int8_rounding="half_even")
