"""The experts error bound multiplies by each expert's weights converted (and made absolute) one expert at a time:
whole float64 copies of a large case's weights, and the batched format's padding rows, held 8 to 18 times its
inputs (85 GiB for one case on an H200). Its values are unchanged (compared bit for bit on the covering cases when
it changed)."""

from __future__ import annotations

import torch

from harness.ops import experts


def test_the_bound_of_plain_weights_takes_them_as_they_are() -> None:
    cpu = {"w13": torch.randn(3, 8, 4, dtype=torch.bfloat16), "w2": torch.randn(3, 4, 4, dtype=torch.bfloat16)}
    _, _, w13, w2 = experts._weights64(cpu, None, torch.device("cpu"))
    assert w13 is cpu["w13"] and w2 is cpu["w2"]  # no float64 copy of every expert at once


def test_a_per_slot_product_with_magnitudes_multiplies_by_each_experts_absolute_weights() -> None:
    g = torch.Generator().manual_seed(0)
    rows, w = torch.randn(5, 4, generator=g, dtype=torch.float64), torch.randn(3, 6, 4, generator=g).bfloat16()
    ids = torch.tensor([2, -1, 0, 2, 1])
    got = experts._per_slot_matmul(rows, w, ids, magnitude=True)
    for r, e in enumerate(ids.tolist()):
        want = torch.zeros(6, dtype=torch.float64) if e < 0 else rows[r] @ w[e].double().abs().T
        torch.testing.assert_close(got[r], want, rtol=1e-12, atol=0)  # one row, or a batch: the order may differ
    assert not torch.equal(got, experts._per_slot_matmul(rows, w, ids))


def _covering_cases(adapter_name: str) -> list:  # type: ignore[type-arg]
    from harness import registry
    from harness.engine import strategies as hs
    from harness.engine.coverage import device_for

    adapter = registry.resolve(adapter_name)
    return hs.value_covering_cases(adapter, hs.declared_cells(adapter, device_for("sm90")))


def test_a_bound_taken_a_chunk_of_rows_at_a_time_is_the_whole_ones(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Many wide rows (a large-offsets case: hundreds of rows of width 2**22) are bounded a chunk of rows at a time:
    each row's bound is its own, so the chunks give the whole bound (to the last bits of a float64 product, whose
    summation order may follow the rows' count), in both formats and under every quantization scheme covered."""
    from harness import ops

    spec = ops.get("experts")
    calls: list[int] = []
    real = experts._rows_bound
    monkeypatch.setattr(experts, "_rows_bound", lambda *a, **k: calls.append(a[5].shape[0]) or real(*a, **k))
    chunked = set()
    # approximate division: the kernel's GEMM1 input codes may differ from the oracle's, a bound of their own
    for case, conventions in [(c, conv) for c in _covering_cases("reference-experts")
                              for conv in ({}, {"division": "approximate"})
                              if not conv or c.features["quant_type"] != "none"]:
        inputs = spec.make_inputs(case, "cpu")
        monkeypatch.setattr(experts, "BOUND_CHUNK_ELEMENTS", 1 << 40)
        whole = spec.expected(case, inputs, conventions)
        calls.clear()
        monkeypatch.setattr(experts, "BOUND_CHUNK_ELEMENTS", 1)  # a row at a time
        parts = spec.expected(case, inputs, conventions)
        if len(calls) > 1:
            chunked.add((case.features["format"], bool(conventions)))
        for w, p in zip(whole, parts, strict=True):
            assert torch.equal(w.expected, p.expected), case.features
            torch.testing.assert_close(p.bound, w.bound, rtol=1e-12, atol=0)
    assert {f for f, _ in chunked} == {"standard", "batched"} and (True in {c for _, c in chunked})
