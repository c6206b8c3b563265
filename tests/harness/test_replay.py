"""Case files and contained replay: a failure writes a case file, replay reproduces its verdict, and the exit codes
follow `git bisect run` (0 pass, 1 fail, 125 cannot test here), a crashing or hanging kernel included.

The adapters below are imported by the replay child as `tests.harness.test_replay:NAME` (the child is a fresh,
spawned process), so they live at module level.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from harness import registry
from harness.cli import main
from harness.commands.replay import EXIT_BAD_FILE, EXIT_FAIL, EXIT_PASS, EXIT_UNTESTABLE, exit_code_for, replay
from harness.core.case import Case
from harness.core.device import detect
from harness.engine import runner
from harness.registry import Adapter
from harness.store.casefiles import CASE_FILE_KIND, parse_case_file, read_case_file, write_case_file
from harness.store.results import ResultStore

CELL = {"activation": "silu_and_mul", "dtype": "float32"}
SUPPORT = {"activation": ("silu_and_mul",), "dtype": ("float32",)}
HERE = "tests.harness.test_replay"


def _reference(case, inputs, outputs):  # type: ignore[no-untyped-def]
    registry.resolve("reference-activation").run(case, inputs, outputs)


def _off_by_one(case, inputs, outputs):  # type: ignore[no-untyped-def]
    _reference(case, inputs, outputs)
    outputs["out"][-1, -1] += 1.0


def _segfault(case, inputs, outputs):  # type: ignore[no-untyped-def]
    os.kill(os.getpid(), signal.SIGSEGV)  # what an out-of-bounds store does to the process


def _adapter(name: str, run, generations: tuple[str, ...] = ("interp", "cpu")) -> Adapter:  # type: ignore[no-untyped-def]
    return Adapter(name=name, op="activation", source=HERE, run=run, support=SUPPORT, generations=generations,
                   conventions={"gate_order": "gate_first", "rounding": "round_once"})


PASSING = _adapter("replay-passing", _reference)
WRONG = _adapter("replay-wrong", _off_by_one)
CRASHING = _adapter("replay-crashing", _segfault)
SM90_ONLY = _adapter("replay-sm90-only", _reference, generations=("sm90",))


def _case(adapter: Adapter, seed: int = 1) -> Case:
    return Case(op="activation", adapter=adapter.name, features=CELL, shapes={"T": 5, "N": 16},
                dtypes={"x": "float32"}, seed=seed)


def _case_file(tmp_path, adapter: Adapter, obj: str) -> str:  # type: ignore[no-untyped-def]
    """A case file naming the adapter only by `module:object` (the child has no registration)."""
    path = tmp_path / f"{adapter.name}.json"
    path.write_text(json.dumps({"kind": CASE_FILE_KIND, "case": _case(adapter).to_dict(), "adapter": adapter.name,
                                "adapter_object": obj}))
    return str(path)


def test_failure_writes_a_case_file_and_replay_reproduces_it(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    registry.register(WRONG, replace=True)
    registry.register(PASSING, replace=True)
    dev = detect("cpu")
    bad, good = runner.judge(_case(WRONG), WRONG, dev), runner.judge(_case(PASSING), PASSING, dev)
    assert (bad.verdict, good.verdict) == ("fail", "pass")
    with ResultStore(tmp_path / "results", run_id="t") as store:
        store.append(bad)
        store.append(good)
    files = sorted((tmp_path / "results" / "cases").glob("*.json"))
    assert [f.stem for f in files] == [bad.case.case_id]  # failures only
    record = json.loads(files[0].read_text())
    assert record["adapter"] == "replay-wrong" and record["adapter_object"] == f"{HERE}:WRONG"
    assert record["verdict"] == "fail" and record["generation"] == dev.generation
    assert record["versions"]["torch"] == dev.torch_version
    failed = [c for c in record["comparisons"] if not c["passed"]]
    assert [(c["name"], c["mode"]) for c in failed] == [("out", "bounded")] and failed[0]["metrics"]["margin"] > 1
    assert record["metrics"]["failed_checks"] == ["out"]

    code = main(["replay", str(files[0]), "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == EXIT_FAIL, out
    assert out.startswith("fail: replay-wrong on ") and "failed checks: out" in out and "margin:" in out
    assert "recorded: fail" in out and "-> reproduced" in out


@pytest.mark.parametrize(("obj", "code", "words"), [
    (f"{HERE}:PASSING", EXIT_PASS, "pass: replay-passing"),
    (f"{HERE}:SM90_ONLY", EXIT_UNTESTABLE, "does not run on"),
    ("no_such_kernel_package.adapter:ADAPTER", EXIT_UNTESTABLE, "adapter not importable"),
    (f"{HERE}:CRASHING", EXIT_FAIL, "killed by SIGSEGV"),
], ids=["pass", "unsupported-generation", "not-importable", "segfault"])
def test_replay_exit_codes(tmp_path, capsys, obj: str, code: int, words: str) -> None:  # type: ignore[no-untyped-def]
    name = obj.rsplit(":", 1)[1].lower()
    path = _case_file(tmp_path, _adapter(f"replay-{name}-unregistered", _reference), obj)
    got = main(["replay", path, "--device", "cpu"])
    out = capsys.readouterr().out
    assert got == code, out
    assert words in out


def test_a_hang_is_a_failure_not_a_wait() -> None:
    cf = parse_case_file({"case": _case(PASSING).to_dict(), "adapter_object": f"{HERE}:PASSING"})
    t0 = time.perf_counter()
    outcome = replay(cf, device="cpu", timeout=0.3)  # the child cannot even start in 0.3 s: it is killed
    assert (outcome.verdict, outcome.exit_code) == ("fail", EXIT_FAIL)
    assert "hung" in outcome.reason and time.perf_counter() - t0 < 30


def test_unreadable_case_files(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "junk.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "nocase.json").write_text(json.dumps({"op": "activation"}))
    for name in ("junk.json", "list.json", "nocase.json", "missing.json"):
        assert main(["replay", str(tmp_path / name)]) == EXIT_BAD_FILE
        assert "cannot read case file" in capsys.readouterr().err


def test_older_case_formats_are_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    case = _case(PASSING)
    bare = tmp_path / "bare.json"
    bare.write_text(case.to_json())
    rendered = tmp_path / "rendered.json"  # harness.store.render's SUPPORT_MATRIX.cases files
    rendered.write_text(json.dumps({"case": case.to_dict(), "generation": "sm90", "verdict": "fail"}))
    assert read_case_file(bare).adapter_specs == ["replay-passing"]
    cf = read_case_file(rendered)
    assert cf.recorded["verdict"] == "fail" and cf.case == case.to_dict()
    r = runner.judge(case, PASSING, detect("cpu"))
    written = write_case_file(r, tmp_path / "cases", adapter_object="pkg.mod:OBJ")
    assert read_case_file(written).adapter_specs == ["replay-passing", "pkg.mod:OBJ"]


def test_exit_code_mapping() -> None:
    assert exit_code_for("pass") == EXIT_PASS
    assert exit_code_for("fail", "out: 3 elements outside the bound") == EXIT_FAIL
    assert exit_code_for("error", "kernel raised: RuntimeError: CUDA error: illegal memory access") == EXIT_FAIL
    assert exit_code_for("error", "kernel raised: CompilationError: at 3:4 (at x.py:1)") == EXIT_UNTESTABLE
    assert exit_code_for("error", "harness could not build the case: ValueError: no size 'K'") == EXIT_UNTESTABLE
    for v in ("unsupported", "not-verifiable", "untestable"):
        assert exit_code_for(v) == EXIT_UNTESTABLE
