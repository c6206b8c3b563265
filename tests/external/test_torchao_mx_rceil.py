"""The oracle's MX `ue8m0` rule in its `ceil_log2` form against torchao's own eager `to_mx` in RCEIL mode, on all-zero
blocks, blocks whose amax / qmax lies below 2^-127 (fp32 and bf16 subnormals among them) and random normal blocks.

torchao 0.18 (the version the adapters are written for) computes the byte as clamp(ceil(log2(amax / qmax)), -127,
127) + 127, which the oracle reproduces bit for bit, but it multiplies a block whose byte is 0 by 1.0 rather than by
2^127, so those blocks' codes are the codes of x itself (all zeros); the oracle computes them with the scale the
byte holds, 2^-127, as torchao's main branch since does. The test reads which of the two the installed torchao does.
"""

from __future__ import annotations

import pytest
import torch

from reference import formats
from reference.quant import QuantRecipe, quantize
from tests.reference.test_library_conventions import mx_rceil_blocks

pytest.importorskip("torchao", reason="torchao is not installed here: scripts/external_env.sh installs it")

_ELEM = {"mxfp8": ("float8_e4m3fn", formats.FloatFormat.E4M3FN, 448.0),
         "mxfp4": ("float4_e2m1fn_x2", formats.FloatFormat.E2M1, 6.0)}


def _to_mx(x: torch.Tensor, dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao's eager to_mx in RCEIL mode: (codes, e8m0 bytes [R, K/32]) as uint8."""
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    scales, codes = to_mx(x.contiguous(), getattr(torch, _ELEM[dtype][0]), 32, ScaleCalculationMode.RCEIL)
    return codes.view(torch.uint8), scales.view(torch.uint8).reshape(x.shape[0], -1)


def _rounds_by_log2() -> bool:
    """Whether torchao's RCEIL byte is ceil(fp32 log2(amax / qmax)): amax / 448 = 16 * (1 + 2^-23) has log2 4 in
    fp32 (byte 131), where rounding by the bits (torchao after 0.18) gives 2^5 (byte 132)."""
    _, scales = _to_mx(torch.full((1, 32), 7168.0 + 2.0**-10), "mxfp8")
    return int(scales[0, 0]) == 131


def _byte_0_applied_as_one() -> bool:
    """Whether torchao multiplies a byte-0 block by 1.0 (torchao 0.18: 2^-126 quantizes to +0) or by 2^127 (2.0)."""
    x = torch.zeros(1, 32)
    x[0, 0] = 2.0**-126
    codes, scales = _to_mx(x, "mxfp8")
    assert int(scales[0, 0]) == 0
    return int(codes[0, 0]) == 0


@pytest.mark.parametrize("dtype", ["mxfp8", "mxfp4"])
@pytest.mark.parametrize("input_dtype", [torch.bfloat16, torch.float32])
def test_ceil_log2_bytes_and_codes_are_torchao_to_mx_rceil(dtype: str, input_dtype: torch.dtype) -> None:
    if not _rounds_by_log2():
        pytest.skip("this torchao rounds RCEIL scales by their fp32 bits, not by fp32 log2: no ceil_log2 form")
    x = mx_rceil_blocks(input_dtype)
    codes, scales = _to_mx(x, dtype)
    qt = quantize(x, QuantRecipe.mx(dtype, scale_rule="ue8m0", eps=0.0, ue8m0_form="ceil_log2"))
    assert torch.equal(qt.scales, scales)

    flushed = (scales[:, 0] == 0) & (x.float().abs().amax(-1) > 0)
    assert int(flushed.sum()) > 5  # the tiny blocks are there
    if not _byte_0_applied_as_one():
        assert torch.equal(qt.codes, codes)
        return
    assert torch.equal(qt.codes[~flushed], codes[~flushed])
    # torchao 0.18: a nonzero block with byte 0 is scaled by 1.0, i.e. its codes are those of x itself
    _, fmt, qmax = _ELEM[dtype]
    as_one = formats.encode(x[flushed].float().clamp(-qmax, qmax), fmt)
    if fmt == formats.FloatFormat.E2M1:
        as_one = formats.pack_nibbles(as_one)
    assert torch.equal(codes[flushed], as_one)
    assert not torch.equal(qt.codes[flushed], codes[flushed])  # where the oracle uses 2^-127
