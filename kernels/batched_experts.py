"""Triton experts on the batched format: x [E, max_tokens, K] with expert_num_tokens [E].

    out[e, r] = W2[e] . act(W13[e] . x[e, r] + b13[e]) + b2[e]     for r < expert_num_tokens[e]

The same grouped-GEMM kernel as the standard format (`kernels.fused_experts._moe_gemm_kernel`, BATCHED=True):
block pid_m covers rows [r0, r0 + BLOCK_M) of expert pid_m // cdiv(max_tokens, BLOCK_M); blocks at or past the
expert's count exit at once, so no layout is built and there is no host synchronization. GEMM1 fuses the
activation (fp32, stored rounded to x.dtype); GEMM2 stores its fp32 accumulator plus bias rounded once to the
output dtype. There is no router weight and no reduce (they belong to the prepare/finalize steps); rows at or
past the count are not written.

Quantized schemes (kernels.quant_gemm) as in the standard format; activation scales are indexed by the flattened
row e * T + r, and a per-tensor scale (x's and the intermediate's) covers the rows below the counts only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton

from kernels.fused_experts import (
    SWIGLUOAI_PARAMS,
    Config,
    _act_code,
    _check_weights,
    gemm_configs,
    launch_gemm,
)

if TYPE_CHECKING:
    from kernels.quant_gemm import ExpertsQuant

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
    quant: ExpertsQuant | None = None,
) -> torch.Tensor:
    """Experts on x [E, T, K]; expert_num_tokens [E] int32/int64 in [0, T]. Returns out [E, T, K] in x.dtype
    (rows at or past the count left as they were). quant: as kernels.fused_experts.fused_experts; a per-tensor
    scale covers the rows below the counts only."""
    act = _act_code(activation)
    if x.dim() != 3 or expert_num_tokens.shape != (x.shape[0],):
        raise ValueError(f"x must be [E, T, K] and expert_num_tokens [E], got {list(x.shape)}, "
                         f"{list(expert_num_tokens.shape)}")
    e, t, k_dim = x.shape
    if w13.shape[0] != e:
        raise ValueError(f"w13 must have one expert per batch of x ({e}), got {list(w13.shape)}")
    n = _check_weights(x.dtype, k_dim, w13, w2, act, quant)
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if e == 0 or t == 0 or k_dim == 0:
        return out
    counts = expert_num_tokens if expert_num_tokens.dtype == torch.int32 else expert_num_tokens.to(torch.int32)
    c1, c2 = gemm_configs(configs, t, n, k_dim, x.dtype, act=act, experts=e, quant=quant)
    num_pid_m = e * triton.cdiv(t, c1.block_m)
    io_dtype = x.dtype
    q1 = q2 = None
    per_tensor = quant is not None and quant.w8a8 and quant.per_tensor
    if quant is not None:
        xs = None
        if quant.w8a8:
            rows = x.reshape(e * t, k_dim)
            if per_tensor:  # rows past a count are no input: keep them out of the tensor's amax
                valid = torch.arange(t, device=x.device)[None, :] < counts[:, None]
                rows = torch.where(valid.reshape(-1, 1), rows, torch.zeros((), dtype=x.dtype, device=x.device))
            codes, xs = quant.quantize_activation(rows)
            x = codes.view(e, t, k_dim)
        q1 = quant.operands("w13", xs)
    # rows past the counts are never written: a per-tensor re-quantization reads them, so they must hold zeros
    inter = (torch.zeros if per_tensor else torch.empty)(e, t, n, dtype=io_dtype, device=x.device)
    launch_gemm(x, w13, w13_bias, inter, None, c1, act=act, interleaved=activation == "swigluoai", weight_mode=0,
                n=n, num_pid_m=num_pid_m, counts=counts, rows_per_expert=t, alpha=alpha, beta=beta, limit=limit,
                q=q1)
    if quant is not None:
        a_s = None
        if quant.w8a8:
            codes, a_s = quant.quantize_activation(inter.view(e * t, n))
            inter = codes.view(e, t, n)
        q2 = quant.operands("w2", a_s)
    launch_gemm(inter, w2, w2_bias, out, None, c2, act=0, interleaved=False, weight_mode=0, n=k_dim,
                num_pid_m=num_pid_m, counts=counts, rows_per_expert=t, q=q2)
    return out
