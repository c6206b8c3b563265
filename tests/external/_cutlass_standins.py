"""CPU stand-ins for the contracts of the vLLM CUDA ops `vllm-cutlass-experts` calls (written here in plain torch from
what each op is documented and read to do, not from the adapter), and a `torch` whose uninitialized buffers hold
garbage (NaN, negative integers) as a GPU workspace may: an adapter that reads a buffer nothing wrote fails.

Each stand-in checks its arguments' dtypes, shapes and strides as the real op's contract needs them, so a wrong
argument raises instead of being silently reinterpreted."""

from __future__ import annotations

from typing import Any

import torch

FP8_MAX = 448.0


def _fp8(t: torch.Tensor) -> torch.Tensor:
    return t.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


class MoeOps:
    """`torch.ops._moe_C`: the permute (with or without its scratch buffers) and the weighted unpermute-reduce."""

    def __init__(self, scratch: bool = True) -> None:
        self.scratch = scratch
        self.calls: list[str] = []

    def moe_permute_unpermute_supported(self) -> bool:
        return self.scratch

    def moe_permute_sort_workspace_size(self, rows: int, n_expert: int) -> int:
        return 4 * rows + n_expert

    def moe_permute_with_scratch(self, *args: Any) -> None:
        assert len(args) == 15, len(args)
        sort, *three = args[11:]
        assert sort.dtype == torch.int8 and all(t.dtype == torch.int32 and t.shape == args[1].shape for t in three)
        self.calls.append("moe_permute_with_scratch")
        self._permute(*args[:11])

    def moe_permute(self, *args: Any) -> None:
        self.calls.append("moe_permute")
        self._permute(*args)

    def _permute(self, x: torch.Tensor, ids: torch.Tensor, indices: torch.Tensor, emap: torch.Tensor | None,
                 n_expert: int, n_local: int, topk: int, rows: torch.Tensor, first: torch.Tensor,
                 inverse: torch.Tensor, source: torch.Tensor) -> None:
        """Slots of local experts in expert order (flat slot order within one), the others after them."""
        m = x.shape[0]
        assert ids.dtype == torch.int32 and indices.dtype == torch.int32 and ids.shape == (m, topk)
        assert emap is None or (emap.dtype == torch.int32 and emap.numel() == n_expert)
        assert emap is not None or n_expert == n_local
        assert first.dtype == torch.int64 and first.shape == (n_local + 1,)
        assert rows.shape == (m * topk, x.shape[1]) and rows.dtype == x.dtype
        assert inverse.dtype == torch.int32 and inverse.shape == (m, topk) and source.shape == (m * topk,)
        flat = ids.reshape(-1).long()
        local = emap.long()[flat] if emap is not None else flat
        local = torch.where((local >= 0) & (local < n_local), local, -1)
        order = torch.sort(torch.where(local >= 0, local, n_local), stable=True).indices
        counts = torch.bincount(local[local >= 0], minlength=n_local)[:n_local]
        first.zero_()
        first[1:] = torch.cumsum(counts, 0)
        valid = int(first[-1])
        slot = indices.reshape(-1).long()[order]
        source.copy_(slot.to(torch.int32))
        inverse.view(-1)[slot] = torch.arange(m * topk, dtype=torch.int32)
        rows[:valid] = x[slot[:valid] // topk]

    def moe_unpermute(self, y: torch.Tensor, w: torch.Tensor, inverse: torch.Tensor, first: torch.Tensor | None,
                      topk: int, out: torch.Tensor) -> None:
        """Each token's slots: the row in y's dtype, times its fp32 weight, summed in fp32, one rounding; slots past
        the valid rows (non-local experts) add nothing."""
        m = out.shape[0]
        assert w.dtype == torch.float32 and w.shape == (m, topk) and y.dtype == out.dtype and out.is_contiguous()
        assert inverse.dtype == torch.int32 and inverse.numel() == m * topk and y.shape == (m * topk, out.shape[1])
        valid = int(first[-1]) if first is not None else m * topk
        inv = inverse.view(m, topk).long()
        acc = torch.zeros(m, out.shape[1], dtype=torch.float32)
        for j in range(topk):
            keep = inv[:, j] < valid
            acc[keep] += w[keep, j, None] * y[inv[keep, j]].float()
        out.copy_(acc.to(out.dtype))


class COps:
    """`torch.ops._C`: the fp8 quantizers, the activations, the problem sizes and the grouped GEMM."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def cutlass_group_gemm_supported(self, capability: int) -> bool:
        return capability >= 90

    def dynamic_scaled_fp8_quant(self, q: torch.Tensor, a: torch.Tensor, scale: torch.Tensor) -> None:
        """Per tensor: scale amax / 448 (no guard), codes a * fp32(1 / scale)."""
        assert scale.dtype == torch.float32 and scale.numel() == 1 and q.dtype == torch.float8_e4m3fn
        s = a.float().abs().amax() / FP8_MAX
        scale.copy_(s.reshape(scale.shape))
        q.copy_(_fp8(a.float() * (1.0 / s)))

    def dynamic_per_token_scaled_fp8_quant(self, q: torch.Tensor, a: torch.Tensor, scale: torch.Tensor,
                                           scale_ub: torch.Tensor | None) -> None:
        """Per row: scale max(amax / 448, 1 / (448 * 512)), codes a / scale."""
        assert scale.dtype == torch.float32 and scale.shape == (a.shape[0], 1) and scale_ub is None
        s = torch.clamp(a.float().abs().amax(dim=1, keepdim=True) / FP8_MAX, min=1.0 / (FP8_MAX * 512.0))
        scale.copy_(s)
        q.copy_(_fp8(a.float() / s))

    def silu_and_mul(self, out: torch.Tensor, h: torch.Tensor) -> None:
        d = h.shape[-1] // 2
        g = h[..., :d].float()
        out.copy_(((g / (1.0 + torch.exp(-g))).to(h.dtype).float() * h[..., d:].float()).to(out.dtype))

    def gelu_and_mul(self, out: torch.Tensor, h: torch.Tensor) -> None:
        d = h.shape[-1] // 2
        g = h[..., :d].float()
        act = (g * 0.5 * (1.0 + torch.erf(g * 2.0**-0.5))).to(h.dtype)
        out.copy_((act.float() * h[..., d:].float()).to(out.dtype))

    def swigluoai_and_mul(self, out: torch.Tensor, h: torch.Tensor, alpha: float = 1.702,
                          limit: float = 7.0) -> None:
        g = h[..., 0::2].float().clamp(max=limit)
        u = h[..., 1::2].float().clamp(-limit, limit)
        out.copy_(((u + 1.0) * g * torch.sigmoid(alpha * g)).to(out.dtype))

    @staticmethod
    def _sizes(s1: torch.Tensor, s2: torch.Tensor, counts: torch.Tensor, n: int, k: int, swap: bool) -> None:
        assert s1.dtype == s2.dtype == torch.int32 and s1.shape == s2.shape == (counts.numel(), 3)
        for e, m in enumerate(counts.tolist()):
            s1[e] = torch.tensor([2 * n, m, k] if swap else [m, 2 * n, k])
            s2[e] = torch.tensor([k, m, n] if swap else [m, k, n])

    def get_cutlass_moe_mm_problem_sizes_from_expert_offsets(self, first: torch.Tensor, s1: torch.Tensor,
                                                             s2: torch.Tensor, n: int, k: int, swap: bool) -> None:
        assert first.dtype == torch.int64 and first.numel() == s1.shape[0] + 1
        self._sizes(s1, s2, first[1:] - first[:-1], n, k, swap)

    def get_cutlass_batched_moe_mm_data(self, offsets: torch.Tensor, s1: torch.Tensor, s2: torch.Tensor,
                                        counts: torch.Tensor, e: int, padded_m: int, n: int, k: int) -> None:
        assert offsets.dtype == torch.int32 and counts.dtype == torch.int32 and offsets.shape == (e,)
        offsets.copy_(torch.arange(e, dtype=torch.int32) * padded_m)
        self._sizes(s1, s2, counts, n, k, e * padded_m <= 64)

    def cutlass_moe_mm(self, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, a_scales: torch.Tensor,
                       b_scales: torch.Tensor, offsets: torch.Tensor, sizes: torch.Tensor, a_strides: torch.Tensor,
                       b_strides: torch.Tensor, c_strides: torch.Tensor, per_act_token: bool,
                       per_out_ch: bool) -> None:
        """Per expert e: rows [offsets[e], + m_e) of out = a_scale * b_scale * (a @ b[e]^T), exact products, fp32
        scaling, one rounding; (m_e, n_e, k_e) from sizes[e], read swapped for at most 64 rows of a."""
        e_count = offsets.numel()
        assert a.dtype == b.dtype == torch.float8_e4m3fn and out.dtype in (torch.bfloat16, torch.float16)
        assert offsets.dtype == torch.int64 and sizes.dtype == torch.int32 and sizes.shape == (e_count, 3)
        assert all(t.dtype == torch.int64 and t.shape == (e_count,) for t in (a_strides, b_strides, c_strides))
        assert a_scales.dtype == b_scales.dtype == torch.float32 and b.shape[0] == e_count
        assert a_scales.numel() == (a.shape[0] if per_act_token else 1)
        assert b_scales.numel() == e_count * (out.shape[1] if per_out_ch else 1)
        self.calls.append("cutlass_moe_mm")
        swap = a.shape[0] <= 64
        for e in range(e_count):
            n_e, m_e, k_e = sizes[e].tolist() if swap else sizes[e, [1, 0, 2]].tolist()
            assert (n_e, k_e) == tuple(b.shape[1:]) == (out.shape[1], a.shape[1]), (sizes[e], b.shape, out.shape)
            assert (int(a_strides[e]), int(b_strides[e]), int(c_strides[e])) == (k_e, k_e, n_e)
            if m_e == 0:
                continue
            rows = slice(int(offsets[e]), int(offsets[e]) + m_e)
            acc = (a[rows].double() @ b[e].double().T).float()
            sa = a_scales.reshape(-1)[rows, None] if per_act_token else a_scales.reshape(-1)[0]
            sb = b_scales.reshape(e_count, -1)[e] if per_out_ch else b_scales.reshape(-1)[e]
            out[rows] = (sa * (sb * acc)).to(out.dtype)


class GarbageTorch:
    """`torch` whose `empty` buffers hold garbage: NaN in float ones (fp8 included), -7 in integer ones."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def empty(*shape: Any, dtype: torch.dtype | None = None, device: Any = None, **kw: Any) -> torch.Tensor:
        t = torch.empty(*shape, dtype=dtype, device=device, **kw)
        if t.dtype == torch.float8_e4m3fn:
            return t.view(torch.uint8).fill_(0x7F).view(torch.float8_e4m3fn)
        return t.fill_(float("nan") if t.is_floating_point() else -7)

    @staticmethod
    def empty_like(t: torch.Tensor, **kw: Any) -> torch.Tensor:
        return GarbageTorch.empty(t.shape, dtype=kw.get("dtype", t.dtype), device=t.device)


def namespaces(moe: MoeOps, c: COps) -> Any:
    """A replacement for `_vllm_cuda.ops`."""
    found = {"_moe_C": moe, "_C": c}

    def ops(namespace: str) -> Any:
        return found[namespace]

    return ops
