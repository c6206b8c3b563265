"""`python -m harness explain`: for a kernel that computes with one convention and declares another, the command
names the planted convention first; its file holds the case's tensors; its errors and exit codes.

The planted mismatches are one line each in MISMATCHES (tests/harness/fixtures/mismatch_adapters.py builds the
adapter and the case from a line): the op, the conventions the kernel computes with, those it declares, and
overrides of the op's default cell, sizes and params. A key or value added to harness.core.conventions is tried by
explain without a change to it.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from harness.cli import main
from harness.commands.explain import report
from harness.core import conventions as conv
from harness.core.device import detect
from harness.engine import explain, runner
from harness.store.casefiles import CASE_FILE_KIND
from tests.harness.fixtures.mismatch_adapters import GATE_ORDER, HERE, MATCHING, Mismatch

#: a w8a8 cell (per-token activation scales) and small sizes for it
FP8_A = {"quant_type": "fp8_w8a8", "quant_format": "A"}
SMALL = {"M": 4, "K": 32, "N": 16}
INT8_TOKEN = {"quant_dtype": "int8", "unit": "token", "group_size": "-"}

MISMATCHES = [
    Mismatch("activation", {"gate_order": "up_first"}, {"gate_order": "gate_first"}),
    Mismatch("activation", {"layout": "interleaved"}, {"layout": "halves"}),
    Mismatch("activation", {"rounding": "round_activation_first"}, {"rounding": "round_once"}),
    Mismatch("experts", {"gate_order": "up_first"}),
    Mismatch("experts", {"accumulation": "sequential_out_dtype"}, {"accumulation": "fp32"}, shapes={"k": 4}),
    Mismatch("experts", {"router_weight_dtype": "bfloat16"}, cell={"dtype": "float32"}),
    # the declared accumulation is right and stays declared while the gate order changes
    Mismatch("experts", {"gate_order": "up_first", "accumulation": "sequential_out_dtype"},
             {"accumulation": "sequential_out_dtype"}, shapes={"k": 4}),
    Mismatch("experts", {"act_quant": {"scale_rule": "ue8m0"}}, cell=FP8_A, shapes=SMALL),
    Mismatch("experts", {"act_quant": {"application": "multiply_reciprocal"}}, cell={**FP8_A, "dtype": "float16"},
             shapes=SMALL),
    Mismatch("group_quant", {"scale_formula": "multiply_reciprocal"}, {"scale_formula": "divide"}),
    Mismatch("group_quant", {"application": "multiply_reciprocal"}),
    Mismatch("group_quant", {"int8_rounding": "half_away"}, cell=INT8_TOKEN),
    Mismatch("group_quant", {"eps_placement": "scale"}, params={"pattern": "edges"}),
    Mismatch("experts", {"router_weight_dtype": "float16"}, cell={"dtype": "float32"}),
    Mismatch("group_quant", {"eps_dtype": "bfloat16"}, params={"pattern": "edges"}),
    Mismatch("grouped_routing", {"group_scoring": "max"}, shapes={"M": 64}),
]


def _explained(m: Mismatch) -> tuple[runner.OneRun, explain.Exploration]:
    one = runner.run_once(m.case(), m.adapter(), detect("cpu"))
    assert one.result.verdict == "fail", f"the planted mismatch does not show: {one.result.reason}"
    return one, explain.explore(one)


@pytest.mark.parametrize("m", MISMATCHES, ids=lambda m: m.name.removeprefix("mismatch-"))
def test_explain_names_the_planted_convention_first(m: Mismatch) -> None:
    # the kernel is right where it declares what it computes: the planted key is its only problem
    honest = dataclasses.replace(m, declares={**m.declares, **m.computes})
    assert runner.run_once(honest.case(), honest.adapter(), detect("cpu")).result.verdict == "pass"
    one, found = _explained(m)
    (label, value), = m.planted().items()
    ranked = found.improvements()
    assert ranked and ranked[0].passed, report(one, found)
    assert [c.label for c in ranked[0].changes] == [label], report(one, found)
    # the value the kernel computes with is one that passes (another value of the key may be equivalent here)
    assert any(j.passed and [(c.label, c.value) for c in j.changes] == [(label, value)] for j in ranked)
    first = next(line for line in report(one, found).splitlines() if line.lstrip().startswith("1. "))
    assert " pass " in first and f"{label}=" in first


def test_a_value_added_to_the_schema_is_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    """A value added to the schema (here an fp8 router weight dtype, which the oracle's rounding already takes) is
    tried without a change to explain: its values come from harness.core.conventions."""
    key, value = "router_weight_dtype", "float8_e4m3fn"
    old = conv.for_op("experts")[key]
    wider = dataclasses.replace(old, values={**old.values, value: "rounded to e4m3 first"})
    monkeypatch.setitem(conv.BY_OP, "experts", tuple(wider if c.key == key else c for c in conv.BY_OP["experts"]))
    m = Mismatch("experts", {key: value}, cell={"dtype": "float32"})
    one, found = _explained(m)
    best = found.improvements()[0]
    assert best.passed and [(c.label, c.value) for c in best.changes] == [(key, value)], report(one, found)


def test_number_keys_are_tried_at_their_default_and_a_few_values() -> None:
    changes = explain.single_changes("group_quant", {"eps": 1e-6}, {})
    assert sorted(c.value for c in changes if c.key == "eps") == [1e-12, 1e-10, 1e-4]
    recipe = [c for c in explain.single_changes("experts", {}, {"act_quant": {"scale_rule": "ue8m0"}})
              if c.key == "act_quant"]
    # one field at a time, over the case's own recipe: every field the schema lists for it, the declared value left
    assert {c.field for c in recipe} == set(conv.for_op("experts")["act_quant"].fields)
    assert ("scale_rule", "ue8m0") not in {(c.field, c.value) for c in recipe}
    assert not [c for c in explain.single_changes("experts", {}, {}) if c.key == "weight_quant"]


def test_experts_stages_are_saved_and_are_the_gemms_of_the_slots() -> None:
    m = Mismatch("experts", {"gate_order": "up_first"}, cell={"dtype": "float32"})
    one, found = _explained(m)
    data = explain.tensors(one, found.improvements()[0])
    x, w13, w2 = data["input.x"].double(), data["input.w13"].double(), data["input.w2"].double()
    ids, n = data["input.topk_ids"].long(), w2.shape[2]
    h = torch.einsum("tk,tjnk->tjn", x, w13[ids])  # GEMM1 of every (token, slot), directly
    assert torch.allclose(data["stage.gemm1_out"], h, rtol=1e-12, atol=1e-12)
    gate, up = h[..., :n], h[..., n:]  # the declared order (gate first); the activation output rounded to fp32
    a = (gate * torch.sigmoid(gate) * up).float().double()
    assert torch.allclose(data["stage.activation_out"], a, rtol=1e-6, atol=1e-7)
    assert torch.allclose(data["stage.gemm2_out"], torch.einsum("tjn,tjkn->tjk", data["stage.activation_out"],
                                                                w2[ids]), rtol=1e-12, atol=1e-12)
    assert {"output.out", "expected.out", "bound.out", "best.expected.out"} <= set(data)


def _case_file(tmp_path, m: Mismatch, obj: str) -> str:  # type: ignore[no-untyped-def]
    path = tmp_path / "case.json"
    path.write_text(json.dumps({"kind": CASE_FILE_KIND, "case": m.case().to_dict(), "adapter": m.name,
                                "adapter_object": obj}))
    return str(path)


GATE_ORDER_LINE = Mismatch("activation", {"gate_order": "up_first"}, {"gate_order": "gate_first"})


def test_the_command_runs_the_kernel_in_its_host_and_saves_the_tensors(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert GATE_ORDER.name == GATE_ORDER_LINE.name
    path, out = _case_file(tmp_path, GATE_ORDER_LINE, f"{HERE}:GATE_ORDER"), tmp_path / "e.pt"
    assert main(["explain", path, "--device", "cpu", "--out", str(out)]) == 1
    text = capsys.readouterr().out
    first = next(line for line in text.splitlines() if line.lstrip().startswith("1. "))
    assert 'gate_order="up_first"' in first and " pass " in first, text
    data = torch.load(out)
    assert data["meta"]["ranking"][0]["changes"] == {"gate_order": "up_first"}
    x, got = data["input.x"].float(), data["output.out"].float()
    n = got.shape[1]
    up_first = torch.nn.functional.silu(x[:, n:]) * x[:, :n]  # what the kernel computes, directly
    gate_first = torch.nn.functional.silu(x[:, :n]) * x[:, n:]  # what it declares
    assert torch.allclose(got, up_first, rtol=2**-7, atol=1e-6)
    assert torch.allclose(data["best.expected.out"].float(), up_first, rtol=1e-5, atol=1e-6)
    assert torch.allclose(data["expected.out"].float(), gate_first, rtol=1e-5, atol=1e-6)
    assert "stage.*" in data["meta"]["omitted"]  # the activation oracle has no stages: said, not silent


def test_a_case_that_passes_says_so(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    m = Mismatch("activation", {"gate_order": "up_first"}, {"gate_order": "up_first"})
    assert main(["explain", _case_file(tmp_path, m, f"{HERE}:MATCHING"), "--device", "cpu"]) == 0
    assert MATCHING.name == m.name
    assert capsys.readouterr().out.startswith("pass: ")


def test_bad_input_is_one_line_and_exit_2_or_125(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["explain", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot read case file" in err and len(err.splitlines()) == 1
    path = _case_file(tmp_path, GATE_ORDER_LINE, None)  # names the adapter only by a name unknown here
    assert main(["explain", path, "--device", "cpu", "--adapter", "no-such-adapter"]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown adapter 'no-such-adapter'" in err and len(err.splitlines()) == 1
    assert main(["explain", path, "--device", "cpu"]) == 125  # the case file's adapter: not runnable here
    err = capsys.readouterr().err.strip()
    assert err.startswith("not runnable here") and len(err.splitlines()) == 1


def test_progress_is_printed_when_the_judging_takes_long(monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    from harness.commands import explain as command

    monkeypatch.setattr(command, "PROGRESS_AFTER_S", 0.0)
    one = runner.run_once(GATE_ORDER_LINE.case(), GATE_ORDER_LINE.adapter(), detect("cpu"))
    found = explain.explore(one, command._progress())
    err = capsys.readouterr().err.splitlines()
    assert err and err[-1].startswith(f"explain: judged {len(found.singles) + len(found.pairs)} of ")
