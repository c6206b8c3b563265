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
