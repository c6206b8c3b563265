"""DeepGEMM's grouped-GEMM adapters: registered without the built extension (not-installed, with the build
command), declared for what vLLM's DeepGemmExperts / BatchedDeepGemmExperts run on sm90, and the layout helpers
that stand in for vLLM's Triton permute, checked against vLLM's rules."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import pytest
import torch

from harness import registry
from harness.core.case import Case
from harness.engine import runner
from kernels.adapters.external import deepgemm_experts as dg
from tests.external._where import nominal

_FEATURES = {"format": "standard", "quant_type": "fp8_w8a8", "quant_format": "G128", "activation": "silu",
             "apply_weight_on_input": "N", "expert_map": "N", "dtype": "bfloat16", "bias": "N"}


def _case(adapter: registry.Adapter) -> Case:
    batched = adapter is dg.MASKED
    f = {**_FEATURES, "format": "batched"} if batched else dict(_FEATURES)
    shapes = {"E": 2, "K": 128, "N": 128, "max_tokens": 3} if batched else {"M": 5, "E": 4, "k": 2, "K": 128, "N": 128}
    return Case(op="experts", adapter=adapter.name, features=f, shapes=shapes, dtypes={"x": "bfloat16"}, seed=1,
                routing="random")


@pytest.mark.parametrize("adapter", (dg.CONTIGUOUS, dg.MASKED), ids=lambda a: a.name)
def test_not_installed_names_the_build(adapter, device_info, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("MOE_DEEPGEMM_DIR", str(tmp_path))
    assert registry.resolve(adapter.name) is adapter
    assert adapter.not_installed() is not None and "scripts/deepgemm.sh --build" in adapter.not_installed()
    fresh = dataclasses.replace(adapter, library=dataclasses.replace(adapter.library))  # no cached import
    r = runner.judge(_case(fresh), fresh, nominal(fresh, device_info))
    assert r.verdict == "not-installed" and "scripts/deepgemm.sh" in r.reason


def test_declared_for_sm90_fp8_block_scales_only() -> None:
    for adapter in (dg.CONTIGUOUS, dg.MASKED):
        assert adapter.generations == ("sm90",) and adapter.declares(_case(adapter).features)[0]
        assert adapter.support["quant_format"] == ("G128",) and adapter.support["dtype"] == ("bfloat16",)
        assert not adapter.declares({**_case(adapter).features, "activation": "gelu"})[0]
    assert dg.requires(None, _FEATURES) is None
    assert dg.MASKED.support["format"] == ("batched",) and dg.CONTIGUOUS.support["format"] == ("standard",)


def test_contiguous_layout_pads_each_expert_to_the_alignment() -> None:
    ids = torch.tensor([[0, 2], [2, -1], [0, 0]])
    lay = dg.contiguous_layout(ids, 3, 4)
    assert lay.rows.tolist() == [0, 4, 5, -1, 1, 2]  # expert 0's slots in flat order, expert 2 at the next block
    assert lay.ends.tolist() == [3, 4, 6] and lay.ends.dtype == torch.int32  # psum layout: each expert's end row
    assert lay.m_indices.tolist() == [0, 0, 0, -1, 2, 2, -1, -1] and lay.total == 8  # -1 on padding rows
    for e in range(3):  # every live row lies in its expert's block
        rows = lay.rows[(ids.reshape(-1) == e)]
        assert bool((lay.m_indices[rows] == e).all())


def test_aligned_rows_covers_any_routing() -> None:
    assert dg.aligned_rows(3, 2, 3, 4) == 16  # 6 slots + 3 experts * 3 padding, rounded up to 4
    for tokens, k, e in ((1, 1, 8), (7, 3, 4), (40, 8, 64)):
        ids = torch.randint(0, e, (tokens, k))
        assert dg.contiguous_layout(ids, e, 128).total <= dg.aligned_rows(tokens, k, e, 128)


def test_expected_m_is_the_batch_rows_per_expert() -> None:
    assert dg.expected_m(torch.tensor([0, 3, 1], dtype=torch.int32), 8) == 3
    assert dg.expected_m(torch.tensor([0, 0], dtype=torch.int32), 8) == 1


def test_an_installed_deep_gemm_is_used_when_none_is_built(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from harness.registry import _importable, _installed_version

    site = tmp_path / "site"
    (site / "deep_gemm").mkdir(parents=True)
    (site / "deep_gemm" / "__init__.py").write_text("")
    (site / "deep_gemm-9.9.9.dist-info").mkdir()
    meta = "Metadata-Version: 2.1\nName: deep_gemm\nVersion: 9.9.9\n"
    (site / "deep_gemm-9.9.9.dist-info" / "METADATA").write_text(meta)
    monkeypatch.setenv("MOE_DEEPGEMM_DIR", str(tmp_path / "not-built"))
    lib = dg.LIBRARY
    _installed_version.cache_clear()
    _importable.cache_clear()
    try:
        assert lib.missing() is not None and "neither built" in lib.missing()
        monkeypatch.syspath_prepend(str(site))
        _installed_version.cache_clear()
        _importable.cache_clear()
        assert lib.missing() is None and lib.version() == "9.9.9"
        built = tmp_path / "built" / "pkg" / "deep_gemm"
        built.mkdir(parents=True)
        (built / "_C.cpython-x.so").write_text("")
        monkeypatch.setenv("MOE_DEEPGEMM_DIR", str(tmp_path / "built"))
        assert lib.version() == dg.VERSION  # the folder the build script made wins
    finally:
        _installed_version.cache_clear()
        _importable.cache_clear()


class _BlockStoringDeepGemm:
    """A CPU stand-in for DeepGEMM's sm90 masked grouped GEMM: exact products, stored in whole 64-row blocks with
    no bound at a group's capacity (as its TMA store does), the last group first (the real stores race)."""

    @staticmethod
    def m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, expected_m, disable_ue8m0_cast=True) -> None:  # type: ignore[no-untyped-def]
        (qa, sa), (qb, sb) = a, b
        g, m, k = qa.shape
        flat = d.view(g * m, -1)
        for i, rows in reversed(list(enumerate(masked_m.tolist()))):
            if not rows:
                continue
            xa = qa[i].float() * sa[i].repeat_interleave(128, 1)[:, :k]
            wb = qb[i].float() * sb[i].repeat_interleave(128, 0).repeat_interleave(128, 1)[: qb.shape[1], :k]
            block = -(-rows // 64) * 64
            full = torch.zeros(block, wb.shape[0])
            n = min(block, m)
            full[:n] = xa[:n] @ wb.T
            stop = min(i * m + block, g * m)
            flat[i * m:stop] = full[: stop - i * m].to(d.dtype)


def test_the_masked_path_gives_each_group_whole_blocks(monkeypatch, device_info) -> None:  # type: ignore[no-untyped-def]
    # capacity 5: without padding, group 0's 64-row block would overwrite group 1's rows
    from harness import ops
    from harness.core.compare import compare_bounded

    monkeypatch.setattr(dg, "deep_gemm", lambda: _BlockStoringDeepGemm)
    case = _case(dg.MASKED)
    case = dataclasses.replace(case, shapes={**case.shapes, "max_tokens": 5}, params={"counts": [5, 3]})
    spec = ops.get("experts")
    inputs = spec.make_inputs(case, "cpu")
    out = torch.zeros_like(inputs["x"])
    dg.run_masked(case, inputs, {"out": out})
    (chk,) = spec.expected(case, inputs, dg.MASKED.conventions_of(case, device_info))
    got = compare_bounded("out", out, chk.expected, chk.bound, mask=chk.mask)
    assert got.passed, got.reason


class _ExactContiguousDeepGemm:
    """A CPU stand-in for DeepGEMM's contiguous grouped GEMM: exact products of the dequantized operands per expert
    block (psum layout: each expert's end row), recording the `disable_ue8m0_cast` it is given."""

    casts: ClassVar[list[bool]] = []
    scales: ClassVar[list[torch.Tensor]] = []

    @staticmethod
    def get_mk_alignment_for_contiguous_layout() -> int:
        return 128

    @staticmethod
    def get_theoretical_mk_alignment_for_contiguous_layout(_: int) -> int:
        return 128

    @staticmethod
    def set_mk_alignment_for_contiguous_layout(_: int) -> None:
        pass

    @classmethod
    def m_grouped_fp8_gemm_nt_contiguous(cls, a, b, d, ends, disable_ue8m0_cast=True, use_psum_layout=False) -> None:  # type: ignore[no-untyped-def]
        cls.casts.append(disable_ue8m0_cast)
        (qa, sa), (qb, sb) = a, b
        cls.scales.append(sa[sa > 0])
        k = qa.shape[1]
        start = 0
        for e, end in enumerate(ends.tolist()):
            start = -(-start // 128) * 128
            if end > start:
                xa = qa[start:end].float() * sa[start:end].repeat_interleave(128, 1)[:, :k]
                wb = qb[e].float() * sb[e].repeat_interleave(128, 0).repeat_interleave(128, 1)[: qb.shape[1], :k]
                d[start:end] = (xa @ wb.T).to(d.dtype)
            start = end


@pytest.mark.parametrize("planted", (False, True), ids=("as-declared", "float-scales"))
def test_the_ue8m0_variant_quantizes_with_power_of_two_scales(monkeypatch, device_info, planted) -> None:  # type: ignore[no-untyped-def]
    # vLLM's default on sm90 (FLOAT32_CEIL_UE8M0): power-of-two activation scales for both GEMMs and DeepGEMM's
    # ue8m0 cast allowed; the result within the oracle's bound under the variant's conventions
    from harness import ops
    from harness.core.compare import compare_bounded

    monkeypatch.setattr(dg, "deep_gemm", lambda: _ExactContiguousDeepGemm)
    _ExactContiguousDeepGemm.casts, _ExactContiguousDeepGemm.scales = [], []
    case = dataclasses.replace(_case(dg.CONTIGUOUS_UE8M0), shapes={"M": 24, "E": 4, "k": 2, "K": 256, "N": 256})
    spec = ops.get("experts")
    conventions = dg.CONTIGUOUS_UE8M0.conventions_of(case, device_info)
    case = dataclasses.replace(case, params={**case.params, "weight_quant": conventions["weight_quant"]})
    inputs = spec.make_inputs(case, "cpu")
    assert torch.all(torch.log2(inputs["w13_scale"]).frac() == 0)  # the weights the harness made: ue8m0 scales
    out = torch.zeros_like(inputs["x"])
    dg.run_contiguous(case, inputs, {"out": out}, ue8m0=not planted)
    assert _ExactContiguousDeepGemm.casts == [planted, planted]
    powers = [bool(torch.all(torch.log2(s).frac() == 0)) for s in _ExactContiguousDeepGemm.scales]
    assert powers == [not planted, not planted]
    (chk,) = spec.expected(case, inputs, conventions)
    got = compare_bounded("out", out, chk.expected, chk.bound, mask=chk.mask)
    assert got.passed, got.reason
