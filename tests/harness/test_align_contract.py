"""The align op's output contract: which part of each buffer the kernel writes (convention `tail`), and the
expert-parallel layout that pools every non-local entry into leading -1 blocks (convention `invalid_blocks`).

The kernels here are small pure-torch aligns written for these tests: they list each group's entries in descending
flattened index (the order within a group is free, so they are never the oracle bitwise) and write exactly the part
of each buffer they are told to.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch

from harness.core.case import Case
from harness.core.device import detect
from harness.engine import runner
from harness.ops import align as align_op
from harness.registry import Adapter
from reference import permute as ref

DEV = detect("cpu")
SUPPORT = {a.name: a.values for a in align_op.AXES}


def _groups(flat: list[int], num_experts: int, emap: list[int] | None, layout: str) -> list[tuple[int, list[int]]]:
    """(expert id written, entries) per group, in layout order. layout: per_expert | pooled | exclude."""
    wid = list(range(num_experts)) if emap is None else emap
    found = []
    if layout == "pooled":
        pool = [i for i, v in enumerate(flat) if wid[v] == -1]
        if pool:
            found.append((-1, pool))
    for x in range(num_experts):
        mine = [i for i, v in enumerate(flat) if v == x]
        if mine and (wid[x] != -1 or layout == "per_expert"):
            found.append((wid[x], mine))
    return found


def _kernel(layout: str | None = None, tail: str = "poison", bug: str | None = None) -> Any:
    """layout: None follows the cell (exclude, else per_expert). tail: poison (left as the harness filled it),
    oracle (sentinel and -1), zeros (expert_ids past the used blocks 0). bug: wrong_expert_id (the last used
    block's), entry_dropped (the first used entry holds the sentinel), last_block_unwritten (the last used block,
    in both buffers, and num_tokens_post_padded a block short)."""

    def run(case: Case, inputs: Mapping[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
        bs, e = int(case.features["block_size"]), case.shape("E")
        cell_layout = "exclude" if case.features["expert_map"] == "exclude" else "per_expert"
        flat = inputs["topk_ids"].reshape(-1).tolist()
        emap = inputs["expert_map"].tolist() if "expert_map" in inputs else None
        numel = len(flat)
        ids: list[int] = []
        eids: list[int] = []
        for wid, entries in _groups(flat, e, emap, layout or cell_layout):
            padded = -(-len(entries) // bs) * bs
            ids += sorted(entries, reverse=True) + [numel] * (padded - len(entries))
            eids += [wid] * (padded // bs)
        if bug == "wrong_expert_id" and eids:
            eids[-1] += 1
        if bug == "entry_dropped" and ids:
            ids[0] = numel  # the sentinel where a real entry belongs
        if bug == "last_block_unwritten" and eids:
            ids, eids = ids[:-bs], eids[:-1]
        sorted_out, eids_out = outputs["sorted_token_ids"], outputs["expert_ids"]
        if tail == "oracle":
            sorted_out.fill_(numel)
            eids_out.fill_(-1)
        elif tail == "zeros":
            sorted_out.fill_(numel)
            eids_out.fill_(0)
        sorted_out[: len(ids)] = torch.tensor(ids, dtype=torch.int32)
        eids_out[: len(eids)] = torch.tensor(eids, dtype=torch.int32)
        outputs["num_tokens_post_padded"][0] = len(ids)

    return run


def _adapter(conventions: Mapping[str, Any] | None = None, **kernel: Any) -> Adapter:
    return Adapter(name="align-contract-test", op="align", source="tests", run=_kernel(**kernel), support=SUPPORT,
                   conventions=dict(conventions or {}), properties=frozenset({"deterministic"}), test_aid=True)


def _case(expert_map: str = "none", m: int = 33, seed: int = 3) -> Case:
    params = {"local_experts": 3} if expert_map != "none" else {}
    return Case(op="align", adapter="align-contract-test",
                features={"block_size": "16", "expert_map": expert_map, "ids_dtype": "int32"},
                shapes={"M": m, "E": 8, "k": 2}, dtypes={"topk_ids": "int32"}, params=params, seed=seed)


def _judge(adapter: Adapter, case: Case):  # type: ignore[no-untyped-def]
    return runner.judge(case, adapter, DEV)


def _oracle(case: Case, conv: ref.ExpertMapConvention) -> ref.SortedTokenLayout:
    inputs = align_op.make_inputs(case, "cpu")
    return ref.align_block_size(inputs["topk_ids"], 16, case.shape("E"), expert_map=inputs.get("expert_map"),
                                ep_convention=conv)


# ------------------------------------------------------------------------------------------------------------
# tail: written (the default) or unwritten
# ------------------------------------------------------------------------------------------------------------


def test_the_cases_have_a_tail() -> None:
    """Otherwise the tests below would test nothing."""
    for em in ("none", "keep_invalid_blocks", "exclude"):
        layout = _oracle(_case(em), ref.ExpertMapConvention(em if em != "none" else "keep_invalid_blocks"))
        assert int(layout.num_tokens_post_padded[0]) < layout.sorted_token_ids.numel()


@pytest.mark.parametrize("m", [0, 33])
@pytest.mark.parametrize("expert_map", ["none", "keep_invalid_blocks", "exclude"])
def test_an_unwritten_tail_fails_unless_declared(expert_map: str, m: int) -> None:
    case = _case(expert_map, m)
    r = _judge(_adapter(), case)
    assert r.verdict == "fail", r.reason
    assert {"written:sorted_token_ids", "written:expert_ids"} <= set(r.metrics["failed_checks"]), r.reason
    r = _judge(_adapter({"tail": "unwritten"}), case)
    assert r.verdict == "pass", r.reason


def test_declaring_written_while_leaving_the_tail_unwritten_fails() -> None:
    r = _judge(_adapter({"tail": "written"}), _case())
    assert r.verdict == "fail" and "written:expert_ids" in r.metrics["failed_checks"], r.reason
    assert _judge(_adapter({"tail": "written"}, tail="oracle"), _case()).verdict == "pass"


def test_the_tail_values_are_judged_only_when_written_is_declared() -> None:
    """vLLM fills expert_ids past the used blocks with 0: not the -1 the `written` contract states."""
    r = _judge(_adapter(tail="zeros"), _case())
    assert r.verdict == "fail" and "expert_ids" in r.metrics["failed_checks"], r.reason
    r = _judge(_adapter({"tail": "unwritten"}, tail="zeros"), _case())
    assert r.verdict == "pass", r.reason


@pytest.mark.parametrize("bug, check", [("wrong_expert_id", "expert_ids"), ("entry_dropped", "sorted_token_ids")])
@pytest.mark.parametrize("expert_map", ["none", "keep_invalid_blocks"])
def test_the_used_part_is_still_judged_under_an_unwritten_tail(expert_map: str, bug: str, check: str) -> None:
    wrong = _judge(_adapter({"tail": "unwritten"}, bug=bug), _case(expert_map))
    assert wrong.verdict == "fail", wrong.reason
    assert check in wrong.metrics["failed_checks"], wrong.reason


def test_the_used_part_comes_from_the_oracle_not_the_kernel() -> None:
    """A kernel that stops one block short, and says so in num_tokens_post_padded, does not shrink its contract:
    the block it left unwritten is still required written."""
    r = _judge(_adapter({"tail": "unwritten"}, bug="last_block_unwritten"), _case())
    assert r.verdict == "fail", r.reason
    assert {"written:sorted_token_ids", "written:expert_ids", "num_tokens_post_padded"} <= set(
        r.metrics["failed_checks"]), r.reason


def test_a_bad_tail_value_is_refused() -> None:
    with pytest.raises(ValueError, match=r"tail='partial' is not one of 'written', 'unwritten'"):
        _adapter({"tail": "partial"})


# ------------------------------------------------------------------------------------------------------------
# invalid_blocks: per_expert (the default) or pooled_first, in keep_invalid_blocks cells
# ------------------------------------------------------------------------------------------------------------


def test_the_case_tells_the_two_layouts_apart() -> None:
    case = _case("keep_invalid_blocks")
    pooled = _oracle(case, ref.ExpertMapConvention.POOL_INVALID_FIRST)
    kept = _oracle(case, ref.ExpertMapConvention.KEEP_INVALID_BLOCKS)
    assert int(pooled.expert_ids[0]) == -1
    assert not torch.equal(pooled.expert_ids, kept.expert_ids)


@pytest.mark.parametrize("tail", ["written", "unwritten"])
def test_a_pooled_kernel_passes_where_it_says_so(tail: str) -> None:
    r = _judge(_adapter({"invalid_blocks": "pooled_first", "tail": tail}, layout="pooled",
                        tail="oracle" if tail == "written" else "poison"), _case("keep_invalid_blocks"))
    assert r.verdict == "pass", r.reason


@pytest.mark.parametrize("layout, conventions", [
    ("pooled", {}),  # pooled, declared nothing
    ("pooled", {"invalid_blocks": "per_expert"}),
    ("per_expert", {"invalid_blocks": "pooled_first"}),
    ("exclude", {"invalid_blocks": "pooled_first"}),
])
def test_a_layout_other_than_the_declared_one_fails(layout: str, conventions: dict[str, str]) -> None:
    r = _judge(_adapter(conventions, layout=layout, tail="oracle"), _case("keep_invalid_blocks"))
    assert r.verdict == "fail", r.reason
    assert "sorted_token_ids" in r.metrics["failed_checks"], r.reason


@pytest.mark.parametrize("expert_map, layout", [("none", "pooled"), ("exclude", "exclude")])
def test_invalid_blocks_is_not_read_where_no_entry_is_kept_non_local(expert_map: str, layout: str) -> None:
    r = _judge(_adapter({"invalid_blocks": "pooled_first"}, layout=layout, tail="oracle"), _case(expert_map))
    assert r.verdict == "pass", r.reason
