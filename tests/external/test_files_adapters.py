"""The adapters that read a library's kernels from its files (SGLang's Triton MoE, vLLM's Triton GEMMs standard and
batched): registered without the files (not-installed, with the way to get them), judged with them
(`bash scripts/third_party.sh` unpacks them into third_party/), and each fails when one of its steps is broken."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness import registry
from harness.core.case import Case
from harness.engine import runner
from harness.registry import FilesLibrary
from kernels.adapters.external import sglang_triton as sg
from kernels.adapters.external import vllm_triton_files as vf
from reference import permute as ref_permute
from tests.external._where import nominal, running

_FEATURES = {"format": "standard", "quant_type": "none", "quant_format": "-", "activation": "silu",
             "apply_weight_on_input": "N", "expert_map": "N", "dtype": "float16", "bias": "N"}
ADAPTERS = (sg.EXPERTS, vf.STANDARD, vf.BATCHED)


def _case(adapter: registry.Adapter, **features: str) -> Case:
    f = {**_FEATURES, **features}
    shapes = {"E": 4, "K": 64, "N": 32, "max_tokens": 5} if f["format"] == "batched" else \
        {"M": 9, "E": 8, "k": 2, "K": 64, "N": 32}
    return Case(op="experts", adapter=adapter.name, features=f, shapes=shapes, dtypes={"x": f["dtype"]}, seed=1,
                routing="random")


def _files(adapter: registry.Adapter) -> None:
    lib = adapter.library
    if lib is None or lib.missing() is not None:
        pytest.skip(f"{adapter.name}: its library's files are not here (bash scripts/third_party.sh)")


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.name)
def test_registered_and_not_installed_without_the_files(adapter, device_info) -> None:  # type: ignore[no-untyped-def]
    assert registry.resolve(adapter.name) is adapter and isinstance(adapter.library, FilesLibrary)
    gone = dataclasses.replace(adapter, library=dataclasses.replace(adapter.library, needs=("no/such/file.py",)))
    r = runner.judge(_case(gone, format="batched") if adapter is vf.BATCHED else _case(gone), gone,
                     nominal(gone, device_info))
    assert r.verdict == "not-installed" and "scripts/third_party.sh" in r.reason


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.name)
def test_passes_and_a_planted_activation_bug_fails(adapter, device_info, unverifiable,  # type: ignore[no-untyped-def]
                                                    monkeypatch) -> None:
    _files(adapter)
    here = running(adapter, device_info)
    case = _case(adapter, format="batched") if adapter is vf.BATCHED else _case(adapter)
    assert runner.judge(case, adapter, here, unverifiable=unverifiable).verdict == "pass"
    if adapter is sg.EXPERTS:  # SGLang's own activation is torch's: plant the bug in the alignment stand-in
        real = sg.align_block_size

        def shifted(topk_ids, block_size, num_experts, *a, **k):  # type: ignore[no-untyped-def]
            ids, experts, ntpp = real(topk_ids, block_size, num_experts, *a, **k)
            return ids, torch.roll(experts, 1), ntpp

        monkeypatch.setattr(sg.module(), "moe_align_block_size", shifted)
    else:
        real_act = vf.activation
        monkeypatch.setattr(vf, "activation", lambda name, h, dt: real_act(name, h * (1 + 2.0**-6), dt))
    assert runner.judge(case, adapter, here, unverifiable=unverifiable).verdict == "fail"


def test_sglang_alignment_stand_in_pools_other_ranks_first() -> None:
    """SGLang bins id + 1, so the -1 ids of other ranks' experts come first, in -1 blocks of their own."""
    ids = torch.tensor([[1, -1], [0, -1], [1, 0]], dtype=torch.int32)
    sorted_ids, experts, ntpp = sg.align_block_size(ids, 4, 2)
    assert experts[0].item() == -1 and experts[1:3].tolist() == [0, 1]
    assert set(sorted_ids[:2].tolist()) == {1, 3} and int(ntpp.item()) == 12
    lay = ref_permute.align_block_size(ids.to(torch.int64) + 1, 4, 3, expert_map=torch.tensor([-1, 0, 1]),
                                       ep_convention=ref_permute.ExpertMapConvention.POOL_INVALID_FIRST)
    assert torch.equal(lay.expert_ids, experts)


def test_sglang_topk_one_divergence(device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    """SGLang's portable path sums a never-written buffer over the output when top-k is 1 (docs/FINDINGS.md): the
    declared known finding's case fails as declared, and the same case at top-k 2 passes (outside the region)."""
    from harness.plugin.generic import known_outcome

    _files(sg.EXPERTS)
    here = running(sg.EXPERTS, device_info)
    found = sg.TOPK1_UNWRITTEN
    assert sg.EXPERTS.declares(found.case.features)[0]
    r = runner.judge(found.case, sg.EXPERTS, here, unverifiable=unverifiable)
    assert known_outcome(found, r)[0] == "reproduced", known_outcome(found, r)[1]
    outside = found.case.replace(shapes={**found.case.shapes, "k": 2})
    assert not found.contains(outside)
    assert runner.judge(outside, sg.EXPERTS, here, unverifiable=unverifiable).verdict == "pass"


def test_sglang_fp8_tie_rows_on_the_h100_pass_only_as_approximate_division(device_info) -> None:  # type: ignore[no-untyped-def]
    # SGLang's output on the H100 for a case whose even rows are exact quantization ties (committed bits): its fp8
    # group quantizer breaks those ties the other way; declared as approximate division it passes, and the
    # declaration leaves the other rows' bound as it was
    import json
    from pathlib import Path

    from harness import ops
    from harness.core.compare import compare_bounded

    doc = json.loads((Path(__file__).parent / "fixtures" / "sglang-fp8-g128-h100-tie-rows.json").read_text())
    case = Case.from_dict(doc["case"])
    out = torch.tensor(doc["out_bfloat16_bits"], dtype=torch.int16).view(torch.bfloat16)
    spec = ops.get("experts")
    inputs = spec.make_inputs(case, "cpu")
    h100 = dataclasses.replace(device_info, generation="sm90", device="cuda:0")
    declared = sg.EXPERTS.conventions_of(case, h100)
    assert declared.get("division") == "approximate"
    interp = dataclasses.replace(device_info, generation="interp", device="cpu")
    assert "division" not in sg.EXPERTS.conventions_of(case, interp)

    def check(conventions: dict):  # type: ignore[no-untyped-def]
        return {c.name: c for c in spec.expected(case, inputs, conventions)}["out"]

    def judged(got: torch.Tensor, chk) -> bool:  # type: ignore[no-untyped-def]
        return compare_bounded("out", got, chk.expected, chk.bound, mask=chk.mask).passed

    approx, exact = check(declared), check({k: v for k, v in declared.items() if k != "division"})
    assert judged(out, approx)
    assert not judged(out, exact)
    # only the tie rows (even) are loosened: row 1's bound is the same, and an error there still fails
    assert torch.equal(approx.bound[1], exact.bound[1]) and bool((approx.bound[0] > exact.bound[0]).all())
    off_row = out.clone()
    off_row[1] = (off_row[1].float() * 1.5).to(torch.bfloat16)
    assert not judged(off_row, approx)
