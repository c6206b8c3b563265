"""The reference quantization adapters take a huge input a chunk of rows at a time (`harness.ops.common.by_rows`):
their float64 intermediates of a whole case past 2**31 elements killed their kernel host. A chunked run must write
exactly what a whole run writes, in every declared cell (scale layouts padded and swizzled, per-token units, NVFP4's
global scale), the last chunk partial. On a GPU the chunks are computed there: group_quant's oracle is exact
arithmetic, so its chunks write the CPU's bits; act_quant's activation is not (exp), so its chunks pass the judge."""

from __future__ import annotations

import pytest
import torch

from harness import ops, registry
from harness.core.compare import bits
from harness.engine import strategies as hs
from harness.engine.coverage import device_for
from harness.ops import common

#: op -> (its reference adapter, its token dim)
OPS = {"group_quant": ("reference-group-quant", "M"), "act_quant": ("reference-act-quant", "T")}


def _cases(op: str) -> list:  # type: ignore[type-arg]
    name, dim = OPS[op]
    adapter = registry.resolve(name)
    cells = hs.declared_cells(adapter, device_for("interp"))
    found = []
    for c in hs.value_covering_cases(adapter, cells):
        if int(c.shapes.get(dim, 0)) > 0:
            found.append(c.replace(shapes={**c.shapes, dim: 300}))  # chunks of 128 rows: 128, 128, 44
    assert found
    return found


def _run(adapter: registry.Adapter, case, inputs, outputs,  # type: ignore[no-untyped-def]
         device: str = "cpu") -> dict[str, torch.Tensor]:
    mine = {n: t.clone().to(device) for n, t in outputs.items()}
    adapter.run(case, {n: t.to(device) if isinstance(t, torch.Tensor) else t for n, t in inputs.items()}, mine)
    return {n: t.cpu() for n, t in mine.items()}


def _poisoned(spec, case, inputs) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    return {n: torch.full(o.shape, 0x5A, dtype=torch.uint8).view(o.dtype) if o.dtype.itemsize == 1
            else torch.full(o.shape, 7, dtype=o.dtype) for n, o in spec.outputs(case, inputs).items()}


def _assert_chunks_write_the_whole(adapter, spec, case, monkeypatch, device: str = "cpu") -> None:  # type: ignore[no-untyped-def]
    """Chunks of rows (on `device`) write what one whole run on the CPU writes, bit for bit."""
    inputs = spec.make_inputs(case, "cpu")
    outputs = _poisoned(spec, case, inputs)
    monkeypatch.setattr(common, "REFERENCE_CHUNK_ELEMENTS", 1 << 40)
    whole = _run(adapter, case, inputs, outputs)
    monkeypatch.setattr(common, "REFERENCE_CHUNK_ELEMENTS", 1)
    chunks = _run(adapter, case, inputs, outputs, device)
    for name in whole:
        assert torch.equal(bits(whole[name]), bits(chunks[name])), (name, case.features)


#: where the chunks are computed: the CPU everywhere, and the GPU where there is one (what a large case runs)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]


@pytest.mark.parametrize("device", DEVICES)
def test_a_chunked_group_quant_run_writes_what_a_whole_one_writes(device: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    adapter, spec = registry.resolve(OPS["group_quant"][0]), ops.get("group_quant")
    chunked_somewhere = False
    for case in _cases("group_quant"):
        _assert_chunks_write_the_whole(adapter, spec, case, monkeypatch, device)
        chunked_somewhere |= case.features.get("unit") != "tensor"
    assert chunked_somewhere


def test_a_chunked_act_quant_run_on_the_cpu_writes_what_a_whole_one_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    adapter, spec = registry.resolve(OPS["act_quant"][0]), ops.get("act_quant")
    for case in _cases("act_quant"):
        _assert_chunks_write_the_whole(adapter, spec, case, monkeypatch)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="chunks computed on the GPU: needs one")
@pytest.mark.parametrize("op", sorted(OPS))
def test_chunks_computed_on_the_gpu_pass_the_judge(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.core.device import detect
    from harness.engine import runner

    device = detect("cuda")
    adapter = registry.resolve(OPS[op][0])
    monkeypatch.setattr(runner, "CPU_JUDGED_ELEMENTS", 0)  # inputs on the GPU, as a large case's are
    monkeypatch.setattr(common, "REFERENCE_CHUNK_ELEMENTS", 1)
    verdicts = {c.case_id: runner.judge(c, adapter, device) for c in _cases(op)}
    failed = {k: r.reason for k, r in verdicts.items() if r.verdict != "pass"}
    assert not failed, failed


def test_chunks_start_at_multiples_of_128_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ops.get("group_quant")
    case = next(c for c in _cases("group_quant") if c.features.get("unit") == "group")
    inputs = spec.make_inputs(case, "cpu")
    seen = []
    monkeypatch.setattr(common, "REFERENCE_CHUNK_ELEMENTS", 1)
    common.by_rows(lambda c, i, o, **_: seen.append((c.shapes["M"], o["codes"].shape[0])), "group_quant", "M", case,
                   inputs, {n: torch.empty(o.shape, dtype=o.dtype) for n, o in spec.outputs(case, inputs).items()})
    assert seen == [(128, 128), (128, 128), (44, 44)]


#: the reference adapters whose oracle computes where its inputs lie, chunked the same way: op -> (adapter, token dim)
WHERE_INPUTS_LIE = {"routing": ("reference-routing", "M"), "grouped_routing": ("reference-grouped-routing", "M"),
                    "activation": ("reference-activation", "T"), "reduce": ("reference-reduce", "M")}


@pytest.mark.parametrize("op", sorted(WHERE_INPUTS_LIE))
def test_the_other_reference_adapters_chunks_write_what_a_whole_run_writes(op: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    name, dim = WHERE_INPUTS_LIE[op]
    adapter, spec = registry.resolve(name), ops.get(op)
    cases = [c.replace(shapes={**c.shapes, dim: 300})
             for c in hs.value_covering_cases(adapter, hs.declared_cells(adapter, device_for("interp")))
             if int(c.shapes.get(dim, 0)) > 0]
    assert cases
    sizes: list[int] = []
    real = common.row_chunk
    monkeypatch.setattr(common, "row_chunk", lambda *a: sizes.append(a[3].stop - a[3].start) or real(*a))
    for case in cases:
        _assert_chunks_write_the_whole(adapter, spec, case, monkeypatch)
    assert sizes and set(sizes) == {128, 44}  # every case in chunks of whole tiles, the last partial
