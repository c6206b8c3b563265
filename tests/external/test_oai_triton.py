"""OpenAI triton_kernels as vLLM drives it (`vllm-oai-triton-experts`), read from vLLM's CUDA wheel's files (`bash
scripts/third_party.sh`): not-installed without them, its version recorded, imported under its own name without
replacing another `triton_kernels`. On the CPU its GEMMs cannot launch (matmul_ogs asks the GPU target for its tiles:
the cases are not verifiable there), while vLLM's routing over triton_kernels' routing kernels runs in the interpreter
and is checked here against the grouping the oracle uses."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest
import torch

from harness import registry
from harness.core.case import Case
from harness.engine import runner
from harness.registry import FilesLibrary
from kernels.adapters.external import vllm_oai_triton as oai
from tests.external._where import nominal

_FEATURES = {"format": "standard", "quant_type": "mxfp4_a16", "quant_format": "G32", "activation": "swigluoai",
             "apply_weight_on_input": "N", "expert_map": "N", "dtype": "bfloat16", "bias": "Y"}


def _case(adapter: registry.Adapter) -> Case:
    return Case(op="experts", adapter=adapter.name, features=_FEATURES, shapes={"M": 9, "E": 8, "k": 2, "K": 128,
                "N": 128}, dtypes={"x": "bfloat16"}, seed=1, routing="random")


def _files() -> None:
    if oai.LIBRARY.missing() is not None:
        pytest.skip("vLLM's CUDA wheel files are not here (bash scripts/third_party.sh)")


def test_registered_and_not_installed_without_the_files(device_info) -> None:  # type: ignore[no-untyped-def]
    adapter = oai.ADAPTER
    assert registry.resolve(adapter.name) is adapter and isinstance(adapter.library, FilesLibrary)
    gone = dataclasses.replace(adapter, library=dataclasses.replace(oai.LIBRARY, needs=("no/such/file.py",)))
    r = runner.judge(_case(gone), gone, nominal(gone, device_info))
    assert r.verdict == "not-installed" and "scripts/third_party.sh" in r.reason and "vllm==0.32.0" in r.reason


def test_version_and_generation_recorded() -> None:
    _files()
    assert oai.LIBRARY.version() == oai.VERSION and "content sha256" in oai.LIBRARY.label()
    oai.module()
    assert oai._generation() == oai.TRITON_KERNELS
    assert str(oai.triton_kernels_package()) in sys.modules["triton_kernels"].__file__


def test_another_triton_kernels_is_not_replaced(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _files()
    other = types.ModuleType("triton_kernels")
    other.__file__ = "/elsewhere/triton_kernels/__init__.py"
    monkeypatch.setitem(sys.modules, "triton_kernels", other)
    with pytest.raises(RuntimeError, match="another triton_kernels"):
        oai.import_triton_kernels()


def test_not_verifiable_on_the_interpreter(device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    _files()
    here = oai.ADAPTER.device_for(device_info)
    if here.generation != "interp":
        pytest.skip("a GPU judges it (the generic tests)")
    r = runner.judge(_case(oai.ADAPTER), oai.ADAPTER, here, unverifiable=unverifiable)
    assert r.verdict == "not-verifiable" and "gpu_target" in r.reason


def _routing(k: int, mapped: bool) -> tuple[torch.Tensor, torch.Tensor, int, tuple]:
    """vLLM's routing of random ids (distinct per token) and weights, remapped under an expert map as vLLM does."""
    g = torch.Generator().manual_seed(7 + k)
    e, m = 8, 37
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(m)]).to(torch.int32)
    weights = torch.rand(m, k, generator=g)
    mod = oai.module()
    if mapped:  # experts 0, 2, 4, 6 local as 0..3
        emap = torch.tensor([0, -1, 1, -1, 2, -1, 3, -1], dtype=torch.int32)
        local = mod.remap_topk_to_local(ids.to(dev).contiguous(), emap.to(dev)).cpu()
        assert torch.equal(local, torch.where(emap[ids.long()] >= 0, emap[ids.long()], -1).long())
        ids, e = local, 4
    found = mod.make_routing_data(ids.to(dev), weights.to(dev), e)
    return ids, weights, e, found


@pytest.mark.parametrize(("k", "mapped"), [(2, False), (3, False), (4, True)])
def test_routing_groups_slots_by_expert(k: int, mapped: bool) -> None:
    """Per expert, its slots in order (hist, gather/scatter indices), and the gate weights rounded to bf16."""
    _files()
    ids, weights, e, (rd, gather, scatter) = _routing(k, mapped)
    flat = ids.reshape(-1).long()
    valid = flat >= 0
    assert torch.equal(rd.expt_hist.cpu().long(), torch.bincount(flat[valid], minlength=e))
    src = gather.src_indx.cpu().long()[: int(valid.sum())]
    assert sorted(src.tolist()) == torch.nonzero(valid).flatten().tolist()
    assert bool((flat[src][1:] >= flat[src][:-1]).all())  # expert-sorted
    assert torch.equal(gather.dst_indx.cpu().long()[src], torch.arange(src.numel()))  # its inverse
    assert torch.equal(scatter.src_indx.cpu(), gather.dst_indx.cpu())
    gates = rd.gate_scal.cpu()[: src.numel()]
    assert gates.dtype == torch.bfloat16 and torch.equal(gates, weights.reshape(-1)[src].to(torch.bfloat16))


def test_routing_check_catches_a_dropped_slot(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The routing check fails when vLLM's bitmatrix loses a slot (the first token's first expert)."""
    _files()
    mod = oai.module()
    real = mod.pack_bitmatrix

    class Dropping:
        def __getitem__(self, grid):  # type: ignore[no-untyped-def]
            def launch(bitmatrix, topk_ids, *args, **kwargs):  # type: ignore[no-untyped-def]
                real[grid](bitmatrix, topk_ids, *args, **kwargs)
                first = int(topk_ids[0, 0])
                words = bitmatrix.view(torch.int32)  # uint32 has few torch ops on CUDA
                word = int(words[0, first // 32]) & 0xFFFFFFFF & ~(1 << (first % 32))
                words[0, first // 32] = word - (1 << 32) if word >= 1 << 31 else word

            return launch

    monkeypatch.setattr(mod, "pack_bitmatrix", Dropping())
    with pytest.raises(AssertionError):
        test_routing_groups_slots_by_expert(2, False)
