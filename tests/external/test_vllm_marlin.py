"""vLLM's Marlin MoE adapter: registered without vLLM's CUDA extensions (not-installed, with the command), declared
for what MarlinExperts' `_supports_*` say, and its run function judged on the CPU against stand-ins of the ops'
contracts (written here from the documented layouts, not from the adapter): a repack that keeps the GPTQ codes in a
layout of Marlin's shape, a GEMM that reads rows of sorted_token_ids block by block, dequantizes its expert's
weights from the permuted scales / zero points / bias and applies the router weight when asked, the align, the
activations and the reduce."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from harness import ops as op_specs
from harness import registry
from harness.core.case import Case
from harness.core.compare import compare_bounded
from harness.engine import runner
from kernels.adapters.external import _vllm_cuda
from kernels.adapters.external import vllm_marlin as vm
from reference import permute as ref_permute
from tests.external._where import nominal

_FEATURES = {"format": "standard", "quant_type": "w4a16", "quant_format": "G128", "activation": "silu",
             "apply_weight_on_input": "N", "expert_map": "N", "dtype": "bfloat16", "bias": "N"}


def _case(**features: str) -> Case:
    f = {**_FEATURES, **features}
    k = 1 if f["apply_weight_on_input"] == "Y" else 2
    return Case(op="experts", adapter=vm.ADAPTER.name, features=f,
                shapes={"M": 11, "E": 4, "k": k, "K": 256, "N": 256}, dtypes={"x": f["dtype"]}, seed=3,
                routing="random")


# ------------------------------------------------------------------------------------------ the ops' contracts


def _perm_grouped() -> torch.Tensor:
    return torch.tensor([i + 8 * j for i in range(8) for j in range(8)])


def _perm_single() -> torch.Tensor:
    return torch.tensor([2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)])


def _unpermute(t: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, perm.numel())[:, torch.argsort(perm)].reshape(t.shape)


def _unpack_words(words: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 words -> their 32 // bits unsigned fields along the last dim (field i at bits * i)."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    fields = [(w >> (bits * i)) & ((1 << bits) - 1) for i in range(32 // bits)]
    return torch.stack(fields, dim=-1).reshape(*words.shape[:-1], -1)


class _C:
    @staticmethod
    def gptq_marlin_repack(packed: torch.Tensor, size_k: int, size_n: int, bits: int, a8: bool) -> torch.Tensor:
        # GPTQ: word r of column n holds rows k = r * (32 / bits) + i; kept as [K / 16, N * 16 * bits / 32] words
        q = _unpack_words(packed.T.contiguous(), bits).T  # [K, N]
        assert q.shape == (size_k, size_n) and not a8
        tiles = q.reshape(size_k // 16, 16, size_n).transpose(1, 2).reshape(size_k // 16, -1)
        fields = tiles.reshape(size_k // 16, -1, 32 // bits)
        word = (fields << (torch.arange(32 // bits) * bits)).sum(-1)
        return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)

    @staticmethod
    def silu_and_mul(out: torch.Tensor, h: torch.Tensor) -> None:
        d = h.shape[-1] // 2
        out.copy_(F.silu(h[:, :d].float()).to(h.dtype) * h[:, d:])

    @staticmethod
    def gelu_and_mul(out: torch.Tensor, h: torch.Tensor) -> None:
        d = h.shape[-1] // 2
        out.copy_(F.gelu(h[:, :d].float()).to(h.dtype) * h[:, d:])

    @staticmethod
    def swigluoai_and_mul(out: torch.Tensor, h: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> None:
        g, u = h[:, 0::2].float().clamp(max=limit), h[:, 1::2].float().clamp(-limit, limit)
        out.copy_(((u + 1) * g * torch.sigmoid(alpha * g)).to(h.dtype))


def _weights(q_words: torch.Tensor, s: torch.Tensor, z: torch.Tensor | None, type_id: int,
             dt: torch.dtype) -> torch.Tensor:
    """One expert's [K, N] weights in dt from the repacked codes, Marlin-ordered scales and zero points."""
    bits, bias = (type_id >> 8) & 0xFF, (type_id >> 17) & 0xFFFFFFFF
    k16 = q_words.shape[0]
    q = _unpack_words(q_words, bits).reshape(k16, -1, 16).transpose(1, 2).reshape(k16 * 16, -1)
    groups, n = s.shape
    scales = _unpermute(s, _perm_grouped() if groups > 1 else _perm_single()).reshape(groups, n)
    zero = torch.full((groups, n), bias)
    if z is not None:
        inter = torch.tensor((0, 2, 4, 6, 1, 3, 5, 7))  # the dequantizer's order of 4-bit zero points
        zero = _unpermute(_unpermute(_unpack_words(z, bits), inter), _perm_grouped()).reshape(groups, n)
    rows = q.shape[0] // groups
    diff = (q - zero.repeat_interleave(rows, dim=0)).to(dt)
    return (diff * scales.repeat_interleave(rows, dim=0)).to(dt)


class _MoeC:
    @staticmethod
    def moe_align_block_size(ids, e, block, sorted_ids, expert_ids, padded, emap, scatter) -> None:  # type: ignore[no-untyped-def]
        lay = ref_permute.align_block_size(ids, block, e, expert_map=emap,
                                           ep_convention=ref_permute.ExpertMapConvention.EXCLUDE)
        n, b = lay.sorted_token_ids.numel(), lay.expert_ids.numel()
        sorted_ids.fill_(ids.numel())
        sorted_ids[:n] = lay.sorted_token_ids
        expert_ids.fill_(-1)
        expert_ids[:b] = lay.expert_ids
        padded[0] = int(lay.num_tokens_post_padded)

    @staticmethod
    def moe_wna16_marlin_gemm(a, c, w, bias, s, a_s, g_s, z, locks, sorted_ids, expert_ids, padded, topk_w,  # type: ignore[no-untyped-def]
                              block, top_k, mul, type_id, size_m, size_n, size_k, atomic, fp32_reduce, zp_float,
                              tk, tn, bps):
        assert a_s is None and g_s is None and not atomic and fp32_reduce and not zp_float
        assert a.shape == (size_m, size_k) and c.shape == (size_m * top_k, size_n) and locks.dtype == torch.int32
        dt = a.dtype
        for blk in range(int(padded[0]) // block):
            e = int(expert_ids[blk])
            rows = sorted_ids[blk * block:(blk + 1) * block].long()
            rows = rows[rows < size_m * top_k]
            wt = _weights(w[e], s[e], None if z is None else z[e], type_id, dt).float()
            res = (a[rows // top_k].float() @ wt).to(dt)
            if bias is not None:
                res = (res.float() + _unpermute(bias[e], _perm_single()).float()).to(dt)
            if mul:
                res = (res.float() * topk_w.reshape(-1)[rows].to(dt).float()[:, None]).to(dt)
            c[rows] = res
        return c

    @staticmethod
    def moe_sum(y: torch.Tensor, out: torch.Tensor, ids: torch.Tensor | None = None,
                emap: torch.Tensor | None = None) -> None:
        keep = torch.ones(ids.shape if ids is not None else y.shape[:2], dtype=torch.bool)
        if emap is not None:
            keep = emap[ids.long()] >= 0
        out.copy_(torch.where(keep[..., None], y.float(), 0.0).sum(dim=1).to(out.dtype))  # skipped: never read


def _stand_in(namespace: str) -> type:
    """`_vllm_cuda.ops` with the stand-ins of this module."""
    return {"_C": _C, "_moe_C": _MoeC}[namespace]


def _judge(case: Case, device_info, run=vm.run) -> tuple[bool, str]:  # type: ignore[no-untyped-def]
    spec = op_specs.get("experts")
    inputs = spec.make_inputs(case, "cpu")
    out = torch.full_like(inputs["x"], float("nan"))
    run(case, inputs, {"out": out})
    (chk,) = spec.expected(case, inputs, vm.ADAPTER.conventions_of(case, device_info))
    got = compare_bounded("out", out, chk.expected, chk.bound, mask=chk.mask)
    return got.passed, got.reason


# ------------------------------------------------------------------------------------------ tests


def test_not_installed_names_the_command(device_info) -> None:  # type: ignore[no-untyped-def]
    assert registry.resolve("vllm-marlin-experts") is vm.ADAPTER
    # the files taken away, as on a machine without them (also where they are present)
    gone = dataclasses.replace(vm.ADAPTER, library=dataclasses.replace(vm.ADAPTER.library, needs=("no/such.so",)))
    why = gone.not_installed()
    assert why is not None and "scripts/vllm_cuda.sh" in why
    r = runner.judge(_case(), gone, nominal(gone, device_info))
    assert r.verdict == "not-installed" and "vllm_cuda.sh" in r.reason


@pytest.mark.parametrize("features", [
    {}, {"quant_type": "w8a16"}, {"quant_type": "w4a16_zp", "bias": "Y"}, {"quant_format": "A", "dtype": "float16"},
    {"quant_type": "w8a16", "quant_format": "A", "activation": "swigluoai", "expert_map": "Y"},
    {"activation": "gelu_no_mul", "bias": "Y", "expert_map": "Y"},
], ids=lambda f: "-".join(f.values()) or "w4a16-G128")
def test_runs_as_the_ops_contracts_say(monkeypatch, device_info, features) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(_vllm_cuda, "ops", _stand_in)
    case = _case(**features)
    if features.get("expert_map") == "Y":
        emap = {"local_experts": 2, "map": "random"}
        case = dataclasses.replace(case, params={**case.params, **emap})
    passed, reason = _judge(case, device_info)
    assert passed, reason


def _swapped_scales(case, inputs, outputs) -> None:  # type: ignore[no-untyped-def]
    """A planted bug: w13's and w2's scales exchanged (same shapes at K = N)."""
    swapped = {**inputs, "w13_scale": inputs["w2_scale"].repeat(1, 2, 1), "w2_scale": inputs["w13_scale"][:, 1::2]}
    vm.run(case, swapped, outputs)


def _no_router_weight(case, inputs, outputs) -> None:  # type: ignore[no-untyped-def]
    """A planted bug: GEMM2 never multiplies by the router weight."""
    real = vm.gemm

    def gemm(*args, **kw):  # type: ignore[no-untyped-def]
        return real(*args, **{**kw, "mul_weights": False})

    vm.gemm, saved = gemm, vm.gemm
    try:
        vm.run(case, inputs, outputs)
    finally:
        vm.gemm = saved


@pytest.mark.parametrize("bug", [_swapped_scales, _no_router_weight], ids=lambda f: f.__name__)
def test_a_planted_bug_fails(monkeypatch, device_info, bug) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(_vllm_cuda, "ops", _stand_in)
    passed, _ = _judge(_case(), device_info, run=bug)
    assert not passed


def test_the_scalar_type_ids_are_vllms() -> None:
    # vllm/scalar_type.py's scalar_types.uint4b8.id, uint8b128.id, uint4.id (computed there once, by vLLM's code)
    assert vm.scalar_type_id(4, 8) == 1125899907892224
    assert vm.scalar_type_id(8, 128) == 1125899923621888
    assert vm.scalar_type_id(4, 0) == 1125899906843648


def test_the_block_size_is_fused_marlin_moes() -> None:
    # M * topk / E / block < 0.9 picks the block: 8 tokens x 2 over 8 experts = 2 slots an expert -> 8
    assert vm.block_size_m(8, 2, 8, 8) == 8
    assert vm.block_size_m(64, 2, 8, 8) == 32  # 16 slots an expert: 16 / 16 = 1.0, 16 / 32 = 0.5
    assert vm.block_size_m(4096, 8, 8, 8) == 64
    # under EP M is scaled by local / global: 64 -> 32 tokens, 16 slots a local expert -> 32 (unscaled: 48)
    assert vm.block_size_m(64, 2, 4, 8) == 32


#: what MarlinExperts' `_supports_*` accept (vllm 0.32.0 marlin_moe.py), in the op's terms: quant schemes kInt4Static,
#: kInt8Static, kInt4StaticAsym (any group: the op has A and G128), every apply_moe_activation activation, the
#: Standard activation format (BatchedMarlinExperts is another class), bf16/fp16 activations (fused_marlin_moe asserts)
SOURCE_SAYS = {"quant_type": {"w4a16", "w8a16", "w4a16_zp"}, "quant_format": {"A", "G128"},
               "activation": {"silu", "gelu", "swigluoai", "silu_no_mul", "gelu_no_mul"}, "format": {"standard"},
               "dtype": {"bfloat16", "float16"}}


@pytest.mark.parametrize("axis", sorted(SOURCE_SAYS))
def test_declared_support_is_what_the_source_says(axis: str) -> None:
    assert set(vm.ADAPTER.support[axis]) == SOURCE_SAYS[axis]


def test_w8a16_zero_points_and_bias_on_a_weighted_input_are_refused() -> None:
    assert vm.requires(None, {**_FEATURES, "quant_type": "w8a16_zp"}) is not None  # no uint8 with zero points
    assert vm.requires(None, {**_FEATURES, "bias": "Y", "apply_weight_on_input": "Y"}) == vm.BIAS_ON_INPUT_WEIGHT
    with pytest.raises(registry.Unsupported):
        vm.run(_case(quant_type="w8a16_zp"), {}, {})


@pytest.mark.parametrize("quant", [("w4a16", "G128"), ("w4a16", "A"), ("w8a16", "G128"), ("w8a16", "A"),
                                   ("w4a16_zp", "G128")], ids="-".join)
def test_prepared_weights_are_the_oracles(monkeypatch, quant) -> None:  # type: ignore[no-untyped-def]
    # each expert's weights as the GEMM's contract reads them back from the prepared tensors: the oracle's
    # dequantized weights with scales in bf16 (one rounding each, 2^-8 relative), the biases as given
    from harness.ops import experts_quant as xq

    monkeypatch.setattr(_vllm_cuda, "ops", _stand_in)
    case = _case(quant_type=quant[0], quant_format=quant[1], bias="Y")
    inputs = op_specs.get("experts").make_inputs(case, "cpu")
    w = vm.prepare(inputs, *quant)
    want13, want2 = xq.to_experts_quant(inputs, xq.scheme(case, {})).dequantized_weights(torch.device("cpu"))
    (bits, bias), _ = vm.QUANT[quant[0]]
    for e in range(inputs["w13"].shape[0]):
        for which, want in (("1", want13), ("2", want2)):
            z = w[f"z{which}"]
            got = _weights(w[f"w{which}"][e], w[f"s{which}"][e], None if z is None else z[e],
                           vm.scalar_type_id(bits, bias), torch.bfloat16).double().T
            assert torch.allclose(got, want[e], rtol=2**-7, atol=0), (which, e)
        assert torch.equal(_unpermute(w["b1"][e], _perm_single()), inputs["w13_bias"][e])
        assert torch.equal(_unpermute(w["b2"][e], _perm_single()), inputs["w2_bias"][e])
