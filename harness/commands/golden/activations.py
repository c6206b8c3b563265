"""Golden cases of the gated activations (reference.activations): one per activation, plus conventions."""

from __future__ import annotations

import torch

from harness.commands.golden import golden
from reference.activations import Activation, GateOrder, Rounding, apply_activation


def _x(seed: int, width: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(8, width, generator=g) * 4.0).to(torch.bfloat16)  # beyond +-7: the clamps act


def _case(name: Activation, seed: int) -> dict[str, torch.Tensor]:
    width = 32 if name.value.endswith("_no_mul") else 64
    x = _x(seed, width)
    # bf16 outputs only: an fp32 output would pin the last ulp of torch's CPU transcendentals (vectorized
    # per instruction set), which is not part of the oracle's contract.
    out = {"x": x, "out": apply_activation(name, x)}
    if not name.value.endswith("_no_mul"):
        out["out_round_activation_first"] = apply_activation(name, x, rounding=Rounding.ROUND_ACTIVATION_FIRST)
        out["out_up_first"] = apply_activation(name, x, gate_order=GateOrder.UP_FIRST)
        out["out_clamp_limit_2"] = apply_activation(name, x, clamp_limit=2.0)
    return out


def _register(name: Activation, seed: int) -> None:
    golden(f"activations_{name.value}")(lambda: _case(name, seed))


for _seed, _name in enumerate(Activation):
    _register(_name, 100 + _seed)
