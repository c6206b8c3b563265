"""The reference quantization adapters take a huge input a chunk of rows at a time (`harness.ops.common.by_rows`):
their float64 intermediates of a whole case past 2**31 elements killed their kernel host. A chunked run must write
exactly what a whole run writes, in every declared cell (scale layouts padded and swizzled, per-token units, NVFP4's
global scale), the last chunk partial."""

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


def _run(adapter: registry.Adapter, case, inputs, outputs) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    mine = {n: t.clone() for n, t in outputs.items()}
    adapter.run(case, inputs, mine)
    return mine


@pytest.mark.parametrize("op", sorted(OPS))
def test_a_chunked_reference_run_writes_what_a_whole_one_writes(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    adapter, spec = registry.resolve(OPS[op][0]), ops.get(op)
    chunked_somewhere = False
    for case in _cases(op):
        inputs = spec.make_inputs(case, "cpu")
        outputs = {n: torch.full(o.shape, 0x5A, dtype=torch.uint8).view(o.dtype) if o.dtype.itemsize == 1
                   else torch.full(o.shape, 7, dtype=o.dtype) for n, o in spec.outputs(case, inputs).items()}
        monkeypatch.setattr(common, "REFERENCE_CHUNK_ELEMENTS", 1 << 40)
        whole = _run(adapter, case, inputs, outputs)
        monkeypatch.setattr(common, "REFERENCE_CHUNK_ELEMENTS", 1)
        chunks = _run(adapter, case, inputs, outputs)
        for name in whole:
            assert torch.equal(bits(whole[name]), bits(chunks[name])), (name, case.features)
        chunked_somewhere |= case.features.get("unit") != "tensor"
    assert chunked_somewhere


def test_chunks_start_at_multiples_of_128_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ops.get("group_quant")
    case = next(c for c in _cases("group_quant") if c.features.get("unit") == "group")
    inputs = spec.make_inputs(case, "cpu")
    seen = []
    monkeypatch.setattr(common, "REFERENCE_CHUNK_ELEMENTS", 1)
    common.by_rows(lambda c, i, o: seen.append((c.shapes["M"], o["codes"].shape[0])), "group_quant", "M", case,
                   inputs, {n: torch.empty(o.shape, dtype=o.dtype) for n, o in spec.outputs(case, inputs).items()})
    assert seen == [(128, 128), (128, 128), (44, 44)]
