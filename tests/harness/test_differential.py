"""`python -m harness differential`: the interpreter's verdicts against the compiled kernel's, case by case.

No GPU here: both sides run on the interpreter, one of them perturbed through its kernel hosts' environment (a fake
adapter that plants a deviation per cell, and the interpreter's bf16 arithmetic fix switched off on one side).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from harness.core.case import Case
from harness.core.device import detect
from harness.core.result import Result
from harness.ops.base import Check
from harness.store.results import not_a_results_file
from harness.sweep import differential as d

ROOT = Path(__file__).resolve().parents[2]
FAKE = "tests.harness.fixtures.differential_adapter:ADAPTER"
PLANT = "MOE_TEST_DIFFERENTIAL"  # the fixture's variable (not imported: its module imports triton)


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **extra}
    env.pop("TRITON_INTERPRET", None)
    return env


# -- classes and comparisons, on values built here ----------------------------------------------------------------

@pytest.mark.parametrize("interp, gpu, identical, want", [
    ("pass", "pass", True, "agree"),
    ("pass", "pass", False, "agree_within_contract"),
    ("fail", "pass", False, "interp_only_failure"),
    ("pass", "fail", False, "gpu_only_failure"),
    ("fail", "fail", True, "both_fail"),
    ("error", "pass", False, "not_comparable"),
    ("pass", "not-verifiable", False, "not_comparable"),
    ("unsupported", "unsupported", True, "not_comparable"),
])
def test_classes_follow_the_two_verdicts(interp: str, gpu: str, identical: bool, want: str) -> None:
    assert d.classify(interp, gpu, identical) == want


def test_a_one_sided_failure_of_a_kernel_whose_two_runs_differ_is_its_nondeterminism() -> None:
    assert d.classify("fail", "pass", False, unstable=True) == "nondeterministic"
    assert d.classify("pass", "fail", False, unstable=True) == "nondeterministic"
    assert d.classify("fail", "fail", False, unstable=True) == "both_fail"
    flaky = Result.__new__(Result)
    object.__setattr__(flaky, "metrics", {"failed_checks": ["out", "deterministic:out"]})
    steady = Result.__new__(Result)
    object.__setattr__(steady, "metrics", {"failed_checks": ["out"]})
    assert d.unstable(flaky) and not d.unstable(steady)


def test_outputs_are_compared_bit_for_bit_within_the_contract() -> None:
    x = torch.tensor([[1.0, 2.0, float("nan")], [4.0, 5.0, 6.0]])
    y = x.clone()
    y[0, 1] = 2.5  # differs by 0.5
    y[1, 2] = -6.0  # differs by 12, outside the mask below: not compared
    y[0, 2] = float("inf")  # NaN against Inf
    mask = torch.tensor([[True, True, True], [True, True, False]])
    found = d.compare_outputs({"outputs": {"out": x}, "expected": {"out": Check("out", "bounded", mask=mask)}},
                              {"outputs": {"out": y}, "expected": {"out": Check("out", "bounded", mask=mask)}})
    assert found["out"]["equal"] is False
    assert (found["out"]["elements"], found["out"]["differing"]) == (5, 2)
    assert found["out"]["first_index"] == [0, 1]
    assert found["out"]["max_abs_diff"] == 0.5
    assert found["out"]["nonfinite"] == 1
    same = d.compare_tensors(x, x.clone(), torch.ones(x.shape, dtype=torch.bool))  # NaN equals its own bits
    assert same["equal"] is True and same["differing"] == 0


def test_elements_left_untouched_are_not_compared() -> None:
    x, y = torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)
    y[3] = 7  # each run's own stale value in a row the kernel must leave alone
    untouched = torch.tensor([False, False, False, True])
    found = d.compare_outputs({"outputs": {"n": x}, "expected": {"n": Check("n", "exact", untouched=untouched)}},
                              {"outputs": {"n": y}, "expected": {"n": Check("n", "exact", untouched=untouched)}})
    assert found["n"]["equal"] is True and found["n"]["elements"] == 3


def test_agreement_within_contract_names_the_approximation() -> None:
    differ = {"out": {"mode": "bounded", "equal": False}, "ids": {"mode": "exact", "equal": True}}
    why = d.contract_why("experts", differ, {"matmul_precision": "fp8_mma_promoted"})
    assert why.startswith("out: bounded") and "fp8 fast accumulation" in why and "ids" not in why
    assert "GEMM accumulation order" in d.contract_why("experts", differ, {})
    assert "approximate division" in d.contract_why("group_quant", {"q": {"mode": "codes", "equal": False},
                                                                     "s": {"mode": "bounded", "equal": False}},
                                                    {"division": "approximate"})


def test_the_judge_works_on_the_inputs_it_is_given() -> None:
    """`runner.judge(inputs=..., keep=...)`: the given tensors, not the seed's, reach the kernel and the oracle, and
    the first run's outputs are kept (here all-zero inputs: silu(0) * 0 is 0 everywhere)."""
    from harness import ops, registry
    from harness.engine import runner

    case = Case(op="activation", adapter="reference-activation", features={"activation": "silu_and_mul",
                "dtype": "float32"}, shapes={"T": 3, "N": 8}, dtypes={"x": "float32"}, seed=5)
    given = {k: torch.zeros_like(v) for k, v in ops.get("activation").make_inputs(case, "cpu").items()}
    keep: dict = {}
    r = runner.judge(case, registry.resolve("reference-activation"), detect("cpu"), inputs=given, keep=keep)
    assert r.verdict == "pass", r.reason
    assert torch.equal(keep["outputs"]["out"], torch.zeros(3, 8))
    assert torch.equal(keep["expected"]["out"].expected, torch.zeros(3, 8))
    assert all(not v.any() for v in given.values())  # the judge worked on copies


# -- both sides on the interpreter, one perturbed ---------------------------------------------------------------

#: cell -> (what the interpreter side plants, what the "GPU" side plants, the class it must get)
CELLS = {
    ("silu_and_mul", "float32"): ("exact", "exact", "agree"),
    ("gelu_and_mul", "float32"): ("exact", "nudge", "agree_within_contract"),
    ("relu2_no_mul", "float32"): ("exact", "wrong", "gpu_only_failure"),
    ("silu_and_mul", "bfloat16"): ("triton", "triton", "interp_only_failure"),  # bf16_arith off on the interp side
    ("gelu_and_mul", "bfloat16"): ("wrong", "wrong", "both_fail"),
    ("relu2_no_mul", "bfloat16"): ("raise", "exact", "not_comparable"),
}


def _plants(which: int) -> str:
    return ",".join(f"{a}/{t}={hows[which]}" for (a, t), hows in CELLS.items())


@pytest.fixture(scope="module")
def pair():
    interp_dev = dataclasses.replace(detect("cpu"), generation="interp")
    sides = [d.Side("interp", "cpu", interp_dev, (("TRITON_INTERPRET", "1"), (PLANT, _plants(0)),
                                                  ("HARNESS_INTERP_DISABLE", "bf16_arith"))),
             d.Side("gpu", "cpu", interp_dev, (("TRITON_INTERPRET", "1"), (PLANT, _plants(1))), "gpu (test)")]
    opened = [d.open_side(FAKE, s) for s in sides]
    yield opened
    for o in opened:
        o.close()


def test_each_planted_difference_gets_its_class(pair) -> None:
    found = {}
    for (act, dtype), (_, _, want) in CELLS.items():
        case = Case(op="activation", adapter="differential-fake", features={"activation": act, "dtype": dtype},
                    shapes={"T": 5, "N": 16}, dtypes={"x": dtype}, seed=3)
        r = d.compare_case(case, pair, timeout=60)
        found[(act, dtype)] = r
        assert r["class"] == want, (act, dtype, r["why"], r["interp"], r["gpu"])
    out = {cell: r["outputs"].get("out", {}) for cell, r in found.items()}
    assert out[("silu_and_mul", "float32")]["equal"] is True
    assert out[("gelu_and_mul", "float32")]["differing"] == 1  # the one nudged element
    assert out[("relu2_no_mul", "float32")]["differing"] == 5 * 16
    assert out[("gelu_and_mul", "bfloat16")]["equal"] is True  # the same wrong bits on both sides
    assert out[("relu2_no_mul", "bfloat16")] == {}  # the raising side kept no output
    assert "planted error" in found[("relu2_no_mul", "bfloat16")]["why"]
    assert found[("silu_and_mul", "bfloat16")]["why"].startswith("interp fails: out:")
    assert found[("gelu_and_mul", "float32")]["why"].startswith("out: bounded")


def test_the_interpreter_side_keeps_its_fidelity_layer_without_a_plant(pair) -> None:
    """The same Triton bf16 cell with the fix on: bit-identical (the perturbation came from the switched-off fix)."""
    interp_dev = pair[0].side.device
    side = d.Side("interp", "cpu", interp_dev, (("TRITON_INTERPRET", "1"), (PLANT, _plants(0))))
    opened = d.open_side(FAKE, side)
    try:
        case = Case(op="activation", adapter="differential-fake",
                    features={"activation": "silu_and_mul", "dtype": "bfloat16"}, shapes={"T": 5, "N": 16},
                    dtypes={"x": "bfloat16"}, seed=3)
        assert d.compare_case(case, [opened, pair[1]], timeout=60)["class"] == "agree"
    finally:
        opened.close()


# -- the command ----------------------------------------------------------------------------------------------------

def test_without_a_gpu_the_command_says_so_at_once() -> None:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", "import sys; from harness.cli import main; rc = main(['differential']);"
                        " print(rc, 'torch' in sys.modules)"], env=_env(CUDA_VISIBLE_DEVICES=""), cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.stdout.split() == ["2", "False"], p.stdout + p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "needs a CUDA GPU" in p.stderr
    assert time.monotonic() - t0 < 20


def test_the_command_writes_a_record_per_case_and_a_summary(tmp_path: Path) -> None:
    sides = {"interp": {}, "gpu": {PLANT: "relu2_no_mul/float32=wrong"}}
    p = subprocess.run([sys.executable, "-m", "harness", "differential", "--adapter", FAKE, "--out", str(tmp_path),
                        "--jobs", "1"], env=_env(MOE_HARNESS_DIFFERENTIAL_SIDES=json.dumps(sides)), cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    records = [json.loads(line) for line in (tmp_path / "cases.jsonl").read_text().splitlines()]
    assert len(records) == 12, p.stderr  # 6 declared cells, 2 quick cases each
    for r in records:  # the planted cell fails on the "GPU" side wherever it has an element to get wrong
        wrong = r["cell"] == {"activation": "relu2_no_mul", "dtype": "float32"} and r["shapes"]["T"] > 0
        assert r["class"] == ("gpu_only_failure" if wrong else "agree"), r
        assert r["interp"]["generation"] == r["gpu"]["generation"] == "interp"
    failing = sum(r["class"] == "gpu_only_failure" for r in records)
    assert failing and p.returncode == 1, p.stderr
    summary = (tmp_path / "summary.md").read_text()
    assert f"| differential-fake | 12 | {12 - failing} |  |  | {failing} |  |  |" in summary
    assert f"### gpu_only_failure ({failing})" in summary
    assert "[12/12 " in p.stderr
    # committed runs lie under results/, whose JSONL the matrix renders: this file must not pass for verdicts
    assert not_a_results_file((tmp_path / "cases.jsonl").read_text().splitlines())


def test_the_run_file_gets_a_manifest_that_vouches_for_its_lines_and_no_forged_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command's writer signs what it wrote, as a results store does; a line appended after is named and the
    file left out by the gate every reader uses."""
    from harness.commands.differential import _Report
    from harness.store import differential, manifest

    monkeypatch.setenv(manifest.KEY_ENV, str(tmp_path / "key"))
    lines = (ROOT / "tests/harness/fixtures/differential_run/cases.jsonl").read_text(encoding="utf-8").splitlines()
    report = _Report(tmp_path, len(lines), "differential-test-run")
    for line in lines:
        report.add(json.loads(line))
    report.close()
    gate = manifest.Gate()
    run = differential.read_run(report.path, gate)
    assert run is not None and not gate.notes and len(run.records) == len(lines), gate.notes
    assert manifest.inspect(report.path, report.path.read_bytes(), manifest.load_key()).signed
    with open(report.path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({**json.loads(lines[0]), "class": "agree"}) + "\n")
    gate = manifest.Gate()
    assert differential.find_runs([tmp_path], gate) == []
    assert len(gate.notes) == 1 and "cases.jsonl (does not match its manifest: 1 line changed" in gate.notes[0]
