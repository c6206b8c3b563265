"""Naive batched experts in plain torch (the seed table's "naive batched" row: a test aid, not a production kernel).

x [E, max_tokens, K], expert_num_tokens [E]; for each expert, one host sync for its count, then its valid rows:

    h = x[e, :cnt] . W13[e]^T + b13[e]     fp32 matmul ("highest": no TF32), stored in x.dtype (rounded)
    a = act(h)                              fp32 from the rounded h, stored in x.dtype (rounded)
    out[e, :cnt] = a . W2[e]^T + b2[e]      fp32, rounded once to x.dtype

It stores both intermediates in the activation dtype, as vLLM's NaiveBatchedExperts does
(IntermediateRounding.GEMM1_AND_ACTIVATION_OUTPUT). Activations are written out here from their formulas (not
taken from `reference`), so the test aid is independent of the oracle.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

__all__ = ["ACTIVATIONS", "activation_fn", "naive_batched_experts"]

SWIGLUOAI = {"alpha": 1.702, "beta": 1.0, "limit": 7.0}


def _silu_mul(h: torch.Tensor) -> torch.Tensor:
    g, u = h.chunk(2, dim=-1)
    return F.silu(g) * u


def _gelu_mul(h: torch.Tensor) -> torch.Tensor:
    g, u = h.chunk(2, dim=-1)
    return F.gelu(g) * u


def _swigluoai(h: torch.Tensor) -> torch.Tensor:
    g = h[..., 0::2].clamp(max=SWIGLUOAI["limit"])  # interleaved: gate even, up odd
    u = h[..., 1::2].clamp(-SWIGLUOAI["limit"], SWIGLUOAI["limit"])
    return g * torch.sigmoid(SWIGLUOAI["alpha"] * g) * (u + SWIGLUOAI["beta"])


#: the oracle's activation names -> fp32 implementations
ACTIVATIONS = {"silu_and_mul": _silu_mul, "gelu_and_mul": _gelu_mul, "swigluoai": _swigluoai,
               "silu_no_mul": F.silu, "gelu_no_mul": F.gelu}


def activation_fn(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The fp32 implementation of activation `name`; ValueError naming the choices for any other name."""
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]


def naive_batched_experts(
    x: torch.Tensor,
    expert_num_tokens: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    *,
    activation: str = "silu_and_mul",
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Experts on x [E, T, K]; rows at or past expert_num_tokens[e] of `out` are left as they were."""
    act = activation_fn(activation)
    if out is None:
        out = torch.zeros_like(x)
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        for e, cnt in enumerate(expert_num_tokens.tolist()):
            if cnt == 0:
                continue
            h = x[e, :cnt].float() @ w13[e].float().T
            if w13_bias is not None:
                h = h + w13_bias[e].float()
            a = act(h.to(x.dtype).float()).to(x.dtype).float()
            y = a @ w2[e].float().T
            if w2_bias is not None:
                y = y + w2_bias[e].float()
            out[e, :cnt] = y.to(out.dtype)
    finally:
        torch.set_float32_matmul_precision(saved)
    return out
