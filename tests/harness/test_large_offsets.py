"""The large-offsets value class (`harness.ops.large`): judged under the GPU profiles only, one case per op whose
named tensor's last flat offset is 2**31 or past (computed here from the shapes, independently of the class), the
chunked oracle judging as the whole one, and the machine-wide lock around such cases."""

from __future__ import annotations

import pytest
import torch

from harness import ops, registry
from harness.core.case import Case
from harness.engine import chunked, large_lock, runner
from harness.engine import strategies as hs
from harness.engine.coverage import device_for
from harness.engine.fixed import explicit_examples
from harness.ops import large
from harness.ops.common import ROW_TILE
from harness.ops.large import NAME, NOT_EXPRESSIBLE

GATED = ("silu", "gelu", "gelu_tanh", "swigluoai", "swigluoai_uninterleave", "swiglustep")


def _rows(case: Case) -> tuple[int, int]:
    """The first dim of the tensor whose offsets pass 2**31 and its elements per unit, written out per op (not read
    from `harness.ops.large`)."""
    s = case.shapes
    if case.op in ("routing", "grouped_routing"):
        return s["M"], s["E"]  # router_logits [M, E]
    if case.op in ("activation", "act_quant"):
        return s["T"], 2 * s["N"]  # x [T, 2N]
    if case.op == "group_quant":
        return s["M"], s["K"]  # x [M, K]
    if case.op == "reduce":
        return s["M"], s["k"] * s["K"]  # expert_out [M, k, K]
    local = case.params.get("local_experts", s["E"])  # experts: w13 [local experts, 2N (gated) or N, K]
    rows = 2 * s["N"] if case.features["activation"] in GATED else s["N"]
    return local, rows * s["K"]


def _reference(op: str) -> registry.Adapter:
    return next(a for a in registry.all_adapters() if a.op == op and a.name.startswith("reference-"))


@pytest.mark.parametrize("op", ops.available())
def test_the_class_is_judged_under_the_gpu_profiles_only(op: str) -> None:
    spec = ops.get(op)
    for profile in ("ci", "dev", None):
        assert NAME not in [vc.name for vc in large.classes(spec, profile)], (op, profile)
    for profile in ("gpu", "thorough"):
        assert (NAME in [vc.name for vc in large.classes(spec, profile)]) == (op not in NOT_EXPRESSIBLE), op


@pytest.mark.parametrize("op", [op for op in ops.available() if op not in NOT_EXPRESSIBLE])
def test_one_case_per_op_whose_last_rows_start_past_2_31(op: str) -> None:
    """Not only the last element: the last 256 rows (a kernel's last block of rows) start at 2**31 or past it, so
    `row * stride` in int32 wraps there; the experts' last local expert starts past it and a routed token reaches
    it, so `expert * stride` wraps where a kernel reads. The cheapest such case: one row fewer does not."""
    adapter = _reference(op)
    cells = hs.declared_cells(adapter, device_for("sm90"))
    assert not hs.profile_class_cases(adapter, cells, "ci")
    assert not [c for c in explicit_examples(adapter, cells) if _rows(c)[0] * _rows(c)[1] > 1 << 31]
    (case,) = hs.profile_class_cases(adapter, cells, "thorough")
    count, each = _rows(case)
    vc = large.classes(ops.get(op), "thorough")[-1]
    assert vc.present(case, {})
    if op == "experts":
        assert (count - 1) * each >= 1 << 31, case.shapes  # the last local expert's first weight
        small = case.replace(shapes={**case.shapes, "N": 16})  # the same seed, tokens and experts: the same routing
        inputs = ops.get(op).make_inputs(small, "cpu")
        ids = inputs["topk_ids"].long()
        local = inputs["expert_map"].long()[ids] if "expert_map" in inputs else ids
        assert bool((local == count - 1).any()), (case.seed, ids.tolist())
        return
    assert (count - 256) * each >= 1 << 31 > (count - 257) * each, case.shapes
    dim = "T" if "T" in case.shapes else "M"
    fewer = case.replace(shapes={**case.shapes, dim: case.shapes[dim] - 1})
    assert not vc.present(fewer, {}), fewer.shapes


@pytest.mark.parametrize("quant", ["none", "fp8_w8a8"])
def test_an_experts_case_takes_a_seed_that_routes_to_the_last_local_expert(quant: str) -> None:
    """The grown experts case keeps the small case's tokens and experts and takes the first seed whose routing
    reaches the last local expert, counting from the case's own: with one token of k = 1 over 8 experts, seed 1
    does not, a later seed does. The seeds are checked with the op's whole input builder, quantized weights
    included (the search reads a cheaper one)."""
    adapter = _reference("experts")
    cell = next(c for c in hs.declared_cells(adapter, device_for("sm90")) if c["quant_type"] == quant)
    base = {"features": dict(cell), "shapes": {"M": 1, "E": 8, "k": 1, "K": 32, "N": 16},
            "dtypes": {"x": cell["dtype"]}, "routing": "random", "params": {}, "seed": 1}
    seed = large.grow("experts", adapter, base)["seed"]
    hits = []
    for s in range(1, seed + 1):
        small = Case(op="experts", adapter=adapter.name, **{**base, "seed": s})
        hits.append(int(ops.get("experts").make_inputs(small, "cpu")["topk_ids"].reshape(-1)[0]) == 7)
    assert seed > 1 and hits[-1] and not any(hits[:-1]), (seed, hits)


#: (op, axis values of its reference cell) for the chunk test: row-independent ops
CHUNKED_OPS = ("routing", "grouped_routing", "activation", "act_quant", "group_quant", "reduce")


def _small_case(op: str) -> tuple[registry.Adapter, Case]:
    adapter = _reference(op)
    cells = hs.declared_cells(adapter, device_for("interp"))
    cases = [c for c in hs.value_covering_cases(adapter, cells)
             if c.shapes.get("M", c.shapes.get("T", 0)) >= 5 and c.features.get("unit") != "tensor"]
    return adapter, cases[0]


def _verdicts(checks: list, outputs: dict) -> list[bool]:  # type: ignore[type-arg]
    return [all(c.passed for c in runner._judged(chk, outputs[chk.name], outputs)) for chk in checks]


@pytest.mark.parametrize("op", CHUNKED_OPS)
def test_the_chunked_oracle_judges_as_the_whole_one(op: str) -> None:
    adapter, case = _small_case(op)
    keep: dict = {}  # type: ignore[type-arg]
    r = runner.judge(case, adapter, device_for("interp"), keep=keep)
    assert r.verdict == "pass", r.reason
    spec, conv = ops.get(op), adapter.conventions_of(case, device_for("interp"))
    inputs = spec.make_inputs(case, "cpu")
    whole = spec.expected(case, inputs, conv)
    parts = chunked.expected(spec, case, inputs, conv, runner._judged, rows_per_chunk=2, sampled=None)
    assert all(c.mode == "custom" and c.judge is not None for c in parts)  # really chunked
    outputs = dict(keep["outputs"])
    assert _verdicts(whole, outputs) == _verdicts(parts, outputs) == [True] * len(whole)
    name = spec.token_outputs[0]  # a wrong last row: both fail
    bad = outputs[name].clone()
    bad[-1] = (bad[-1].float() + 7).to(bad.dtype) if bad.is_floating_point() else bad[-1] + 1
    wrong = {**outputs, name: bad}
    assert not all(_verdicts(whole, wrong)) and not all(_verdicts(parts, wrong))


def test_the_judged_chunks_are_the_ends_and_a_random_sample() -> None:
    """The first and the last chunk always (the last holds the offsets past 2**31), the others drawn afresh each
    time: over many draws every middle chunk is picked, so no fixed row is never judged."""
    draws = [chunked.judged_chunks(10, 2) for _ in range(300)]
    assert all(len(d) == 4 and d[0] == 0 and d[-1] == 9 and d == sorted(set(d)) for d in draws)
    assert {i for d in draws for i in d} == set(range(10))
    assert chunked.judged_chunks(4, 2) == [0, 1, 2, 3] and chunked.judged_chunks(7, None) == list(range(7))


def _sampled_judging(monkeypatch: pytest.MonkeyPatch, wrong_row: int | None, unwritten_row: int | None):  # type: ignore[no-untyped-def]
    """A group_quant case of 8 rows judged a row a chunk, 1 sampled row between the ends, by the reference adapter
    with one row's codes made wrong or left unwritten."""
    import dataclasses

    adapter, case = _small_case("group_quant")
    case = case.replace(shapes={**case.shapes, "M": 8}, params={**case.params, "pattern": "random"})
    monkeypatch.setattr(chunked, "chunk_rows", lambda spec, c, *a, **k: 1)
    monkeypatch.setattr(chunked, "SAMPLED_CHUNKS", 1)
    monkeypatch.setattr(chunked.expected, "__defaults__", (None, 1))

    def run(c, inputs, outputs):  # type: ignore[no-untyped-def]
        mine = {n: torch.empty_like(t) for n, t in outputs.items()}
        adapter.run(c, inputs, mine)
        if wrong_row is not None:
            mine["codes"][wrong_row] = (mine["codes"][wrong_row].float() * 0.5).to(mine["codes"].dtype)
        for name, t in mine.items():
            rows = [r for r in range(t.shape[0]) if not (name == "codes" and r == unwritten_row)]
            outputs[name][rows] = t[rows]

    return runner.judge(case, dataclasses.replace(adapter, run=run), device_for("interp"), extra_runs={})


def test_a_sampled_case_names_its_rows_and_judges_its_last(monkeypatch: pytest.MonkeyPatch) -> None:
    ok = _sampled_judging(monkeypatch, None, None)
    assert ok.verdict == "pass", ok.reason
    codes = next(c for c in ok.checks if c["name"] == "codes")
    judged = codes["metrics"]["rows_judged"]
    assert codes["metrics"]["rows"] == 8 and judged[0] == [0, 0] and judged[-1] == [7, 7] and len(judged) == 3
    bad = _sampled_judging(monkeypatch, 7, None)
    assert bad.verdict == "fail" and "rows 7..7" in bad.reason, bad.reason


def test_what_a_sampled_case_exercised_is_its_judged_rows() -> None:
    """A sampled check has no expected tensor of all rows: what the case exercised counts its judged chunks'."""
    adapter, case = _small_case("reduce")
    spec, conv = ops.get("reduce"), adapter.conventions_of(case, device_for("interp"))
    inputs = spec.make_inputs(case, "cpu")
    whole = runner.exercised(spec.expected(case, inputs, conv))["elements"]
    rows = case.shapes["M"]
    sampled = chunked.expected(spec, case, inputs, conv, runner._judged, rows_per_chunk=1, sampled=1)
    assert all(c.expected is None and len(c.parts) == 3 for c in sampled)
    assert runner.exercised(sampled)["elements"] == whole * 3 // rows > 0


def test_a_sampled_case_still_requires_every_row_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows the oracle leaves out are still in the written check (the chunks' masks are all-true): a row the kernel
    never wrote fails whether or not it was sampled."""
    for row in range(1, 7):
        r = _sampled_judging(monkeypatch, None, row)
        assert r.verdict == "fail" and "written:codes" in r.metrics["failed_checks"], (row, r.reason)


def test_chunks_only_large_row_independent_cases() -> None:
    spec = ops.get("group_quant")
    _, case = _small_case("group_quant")
    assert chunked.chunk_rows(spec, case) is None
    assert chunked.chunk_rows(spec, case, chunk_elements=8, above=0) is not None
    tensor = case.replace(features={**case.features, "unit": "tensor"})
    assert chunked.chunk_rows(spec, tensor, chunk_elements=8, above=0) is None


def test_a_large_case_holds_the_machine_wide_lock(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "lock")
    with large_lock.one_at_a_time(100, above=10, path=path) as held:
        assert held and not large_lock.free(path)
    assert large_lock.free(path)
    with large_lock.one_at_a_time(10, above=10, path=path) as held:
        assert not held and large_lock.free(path)


def test_free_says_whether_another_holds_the_lock(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "lock")
    assert large_lock.free(path)
    with large_lock.one_at_a_time(100, above=10, path=path):  # a lock of its own open file: as another process's
        assert not large_lock.free(path)
    assert large_lock.free(path)


def test_the_generic_test_judges_its_large_case_at_the_first_draw_where_the_lock_is_free(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Left for after the draws, the large cases of items started together met at the machine-wide lock; a draw
    takes the large case first when no other process holds it, and waits for nothing when one does."""
    from types import SimpleNamespace

    from harness.plugin import generic

    path = str(tmp_path / "lock")
    monkeypatch.setattr(large_lock, "lock_path", lambda: path)
    search = generic._Search(SimpleNamespace(known=()), None, None, None)
    order: list[str] = []
    monkeypatch.setattr(search, "example", lambda case: order.append(f"large {case.seed}"))
    monkeypatch.setattr(search, "judge", lambda case: order.append(f"draw {case.seed}") or SimpleNamespace(
        verdict="pass", case=case))
    search.large = [Case(op="reduce", adapter="x", features={}, shapes={}, seed=9)]
    with large_lock.one_at_a_time(100, above=10, path=path):  # another judge's large case
        search.prop(Case(op="reduce", adapter="x", features={}, shapes={}, seed=1))
    assert order == ["draw 1"] and search.large
    search.prop(Case(op="reduce", adapter="x", features={}, shapes={}, seed=2))
    search.prop(Case(op="reduce", adapter="x", features={}, shapes={}, seed=3))
    assert order == ["draw 1", "large 9", "draw 2", "draw 3"] and not search.large


def test_large_routing_inputs_are_drawn_on_the_device_with_the_random_pattern(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ops whose inputs follow a routing pattern grow their large case with `random`, the pattern drawn on the
    device past DEVICE_DRAWN_ABOVE elements (the others draw row by row on the CPU); smaller tensors, other patterns
    and the CPU keep the CPU's draw, so every replayable small case keeps its inputs."""
    from harness.core import inputs as gen

    for op in ("routing", "grouped_routing", "reduce"):
        adapter = _reference(op)
        for cell in hs.declared_cells(adapter, device_for("sm90"))[:3]:
            fields = {"features": dict(cell), **large._cheapest_boundary(op, adapter, cell)}
            fields["routing"] = "skewed"
            assert large.grow(op, adapter, fields)["routing"] == "random", op
    big = Case(op="routing", adapter="x", features={}, shapes={}, seed=1, routing="random")
    m, e = gen.DEVICE_DRAWN_ABOVE // 64 + 1, 64
    assert gen._on_device(big, (m, e), "cuda:0")
    assert not gen._on_device(big, (m, e), "cpu")
    assert not gen._on_device(big, (m - 1, e), "cuda:0")
    assert not gen._on_device(big.replace(routing="skewed"), (m, e), "cuda:0")
    # below the threshold a GPU case's logits are the CPU's draw, moved (what a replay on another machine rebuilds)
    monkeypatch.setattr(gen, "_drawn", lambda *a, **k: pytest.fail("drawn on the device below the threshold"))
    small = big.replace(shapes={"M": 5, "E": 8, "k": 2})
    assert gen.router_logits(small, 5, 8, torch.float32, "cpu").shape == (5, 8)


def test_a_padded_scale_layout_is_chunked_by_its_tiles() -> None:
    """A swizzled scale layout pads its rows to 128-row tiles: chunks of whole tiles, the last chunk's check over
    its padded rows, judge as the whole case does (and catch a wrong last row)."""
    adapter = _reference("group_quant")
    cells = hs.declared_cells(adapter, device_for("interp"))
    case = next(c for c in hs.value_covering_cases(adapter, cells) if c.features.get("scale_layout") == "swizzle_128x4")
    case = case.replace(shapes={**case.shapes, "M": 300})
    keep: dict = {}  # type: ignore[type-arg]
    assert runner.judge(case, adapter, device_for("interp"), keep=keep).verdict == "pass"
    spec, conv = ops.get("group_quant"), adapter.conventions_of(case, device_for("interp"))
    inputs = spec.make_inputs(case, "cpu")
    whole = spec.expected(case, inputs, conv)
    parts = chunked.expected(spec, case, inputs, conv, runner._judged, rows_per_chunk=128, sampled=None)
    outputs = dict(keep["outputs"])
    assert _verdicts(whole, outputs) == _verdicts(parts, outputs) == [True] * len(whole)
    bad = outputs["codes"].clone()
    bad[-1] = (bad[-1].float() + 7).to(bad.dtype) if bad.is_floating_point() else bad[-1] + 1
    assert not all(_verdicts(parts, {**outputs, "codes": bad}))


def test_chunks_are_whole_tiles_of_rows() -> None:
    spec = ops.get("group_quant")
    case = Case(op="group_quant", adapter="x", shapes={"M": 1 << 20, "K": 3072},  # 1,365 rows unaligned
                features={"unit": "group", "group_size": "128"})
    rows = chunked.chunk_rows(spec, case)
    assert rows is not None and rows % ROW_TILE == 0, rows


@pytest.mark.parametrize("op", [op for op in ops.available() if op not in NOT_EXPRESSIBLE])
def test_the_generic_test_tells_its_large_case_from_the_other_fixed_ones(op: str) -> None:
    """The generic test judges the fixed cases past 2**31 elements after its draws (`large.holds`): the large case
    holds, none of the others does."""
    adapter = _reference(op)
    cells = hs.declared_cells(adapter, device_for("sm90"))
    fixed = explicit_examples(adapter, cells, "gpu")
    held = [c for c in fixed if large.holds(c)]
    assert held and held == hs.profile_class_cases(adapter, cells, "gpu")
