"""Triton experts on the batched format: x [E, max_tokens, K] with expert_num_tokens [E].

    out[e, r] = W2[e] . act(W13[e] . x[e, r] + b13[e]) + b2[e]     for r < expert_num_tokens[e]

The same grouped-GEMM kernel as the standard format (`kernels.fused_experts._moe_gemm_kernel`, BATCHED=True):
block pid_m covers rows [r0, r0 + BLOCK_M) of expert pid_m // cdiv(max_tokens, BLOCK_M); blocks at or past the
expert's count exit at once, so no layout is built and there is no host synchronization. GEMM1 fuses the
activation (fp32, stored rounded to x.dtype); GEMM2 stores its fp32 accumulator plus bias rounded once to the
output dtype. There is no router weight and no reduce (they belong to the prepare/finalize steps); rows at or
past the count are not written.
"""

from __future__ import annotations

import torch
import triton

from kernels.fused_experts import (
    GATED,
    SWIGLUOAI_PARAMS,
    Config,
    _act_code,
    _check_weights,
    choose_config,
    launch_gemm,
)

__all__ = ["batched_experts"]


def batched_experts(
    x: torch.Tensor,
    expert_num_tokens: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    *,
    activation: str = "silu_and_mul",
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    alpha: float = SWIGLUOAI_PARAMS["alpha"],
    beta: float = SWIGLUOAI_PARAMS["beta"],
    limit: float = SWIGLUOAI_PARAMS["limit"],
    configs: tuple[Config, Config] | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Experts on x [E, T, K]; expert_num_tokens [E] int32/int64 in [0, T]. Returns out [E, T, K] in x.dtype
    (rows at or past the count left as they were)."""
    act = _act_code(activation)
    if x.dim() != 3 or expert_num_tokens.shape != (x.shape[0],):
        raise ValueError(f"x must be [E, T, K] and expert_num_tokens [E], got {list(x.shape)}, "
                         f"{list(expert_num_tokens.shape)}")
    e, t, k_dim = x.shape
    if w13.shape[0] != e:
        raise ValueError(f"w13 must have one expert per batch of x ({e}), got {list(w13.shape)}")
    n = _check_weights(x.dtype, k_dim, w13, w2, act)
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if e == 0 or t == 0 or k_dim == 0:
        return out
    counts = expert_num_tokens if expert_num_tokens.dtype == torch.int32 else expert_num_tokens.to(torch.int32)
    if configs is None:
        configs = (choose_config(t, n, k_dim, x.dtype, gated=act in GATED),
                   choose_config(t, k_dim, n, x.dtype, gated=False))
    c1, c2 = configs
    if c1.block_m != c2.block_m:
        raise ValueError("GEMM1 and GEMM2 configs must share block_m")
    num_pid_m = e * triton.cdiv(t, c1.block_m)
    inter = torch.empty(e, t, n, dtype=x.dtype, device=x.device)
    launch_gemm(x, w13, w13_bias, inter, None, c1, act=act, interleaved=activation == "swigluoai", weight_mode=0,
                n=n, num_pid_m=num_pid_m, counts=counts, rows_per_expert=t, alpha=alpha, beta=beta, limit=limit)
    launch_gemm(inter, w2, w2_bias, out, None, c2, act=0, interleaved=False, weight_mode=0, n=k_dim,
                num_pid_m=num_pid_m, counts=counts, rows_per_expert=t)
    return out
