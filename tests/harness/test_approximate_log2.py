"""An approximate log2 in the float form of the ue8m0 rule (vLLM's Triton group quantizer: exp2(ceil(tl.log2(s))),
lg2.approx on NVIDIA GPUs) is a declared, judged convention: where log2 s lies within the
approximation's error of an integer either power of two is accepted, everywhere else the scale is exact; a wrong
or non-power-of-two scale still fails."""

from __future__ import annotations

import torch

from harness.core.case import Case
from harness.ops import group_quant as op

F = {"quant_dtype": "fp8_e4m3fn", "unit": "group", "group_size": "128", "scale_rule": "ue8m0",
     "scale_layout": "row_major", "input_dtype": "float32"}
CONV = {"eps": 1e-10, "eps_placement": "amax", "scale_formula": "multiply_reciprocal", "application": "divide",
        "ue8m0_form": "ceil_log2"}


def _x() -> torch.Tensor:
    """Groups whose amax / 448 is one or two ulps above 1 or 2 (a correctly rounded log2 is then just above an
    integer, an approximate one may fall on it), and ordinary groups."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 4 * 128, generator=g)
    for row, k in ((0, 0), (1, 1), (2, 0), (3, 1)):
        target = torch.tensor(448.0 * 2.0**k, dtype=torch.float32)
        amax = torch.nextafter(torch.nextafter(target, torch.tensor(1e9)), torch.tensor(1e9)) if row > 1 else \
            torch.nextafter(target, torch.tensor(1e9))
        x[row, :128] = x[row, :128].clamp(-1, 1) * 0.5 * float(amax)
        x[row, 5] = float(amax)
    return x


def _kernel(x: torch.Tensor, log2_error: float, scale_factor: float = 1.0) -> dict[str, torch.Tensor]:
    """The quantizer with a log2 off by `log2_error` (an approximate instruction): scales and codes."""
    a = x.abs().view(x.shape[0], -1, 128).amax(dim=2).clamp(min=1e-10)
    raw = a * torch.tensor(1.0 / 448.0, dtype=torch.float32)
    s = torch.exp2(torch.ceil(torch.log2(raw.double()) + log2_error)).float() * scale_factor
    q = (x / s.repeat_interleave(128, dim=1)).clamp(-448, 448).to(torch.float8_e4m3fn)
    return {"codes": q, "scales": s}


def _judge(x: torch.Tensor, conventions: dict, outs: dict[str, torch.Tensor]) -> dict[str, bool]:
    case = Case(op="group_quant", adapter="t", features=F, shapes={"M": x.shape[0], "K": x.shape[1]},
                dtypes={"x": "float32"})
    return {c.name: c.judge(outs[c.name], outs).passed if c.judge else bool(torch.equal(outs[c.name], c.expected))
            for c in op.expected(case, {"x": x}, conventions)}


def test_an_approximate_log2_is_accepted_only_where_it_can_round_differently() -> None:
    x = _x()
    low = _kernel(x, -2.0**-22)  # the approximation lands below the integer: one power of two smaller
    exact = _kernel(x, 0.0)
    assert not torch.equal(low["scales"], exact["scales"])  # the inputs reach the boundary
    approx = {**CONV, "log2": "approximate"}
    assert _judge(x, approx, low) == {"codes": True, "scales": True}
    assert _judge(x, approx, exact) == {"codes": True, "scales": True}
    assert _judge(x, CONV, low)["scales"] is False  # declared correctly rounded: the smaller scale fails
    assert _judge(x, CONV, exact)["scales"] is True


def test_a_wrong_scale_still_fails_under_an_approximate_log2() -> None:
    x = _x()
    approx = {**CONV, "log2": "approximate"}
    assert _judge(x, approx, _kernel(x, 0.0, scale_factor=2.0))["scales"] is False  # one power of two off
    off_pow2 = _kernel(x, -2.0**-22)
    off_pow2["scales"][:2, 0] *= 1.5  # between the two allowed powers of two, but not a power of two
    assert _judge(x, approx, off_pow2)["scales"] is False
    # a log2 error far beyond the instruction's: rows whose log2 is not near an integer get other scales
    assert _judge(x, approx, _kernel(x, -0.3))["scales"] is False
