"""What a sweep, a replay and the results store do with runs cut short, runs started twice, odd names and odd
kernels: each test here failed before its fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import sweep
from harness.core.case import Case
from harness.core.device import detect
from harness.core.result import Result
from harness.engine import remote, runner
from harness.store import render
from harness.store.casefiles import read_case_file, write_case_file
from harness.store.results import ResultStore, load_results

ROOT = Path(__file__).resolve().parents[2]
WRONG = "tests.harness.fixtures.hostile_adapters:ATTACKS#hostile-plain-wrong"
CASE = Case(op="activation", adapter="hostile-plain-wrong",
            features={"activation": "silu_and_mul", "dtype": "float32"}, shapes={"T": 4, "N": 24},
            dtypes={"x": "float32"}, seed=1)


def _result(verdict: str, reason: str, **metrics: object) -> Result:
    return Result(case=CASE, verdict=verdict, reason=reason, metrics=dict(metrics), declared=True,
                  generation="interp", device=detect("cpu").to_dict())


def test_resume_judges_the_cases_of_an_adapter_that_could_not_be_loaded(tmp_path: Path) -> None:
    with ResultStore(tmp_path, run_id="r", worker="main") as store:
        store.append(_result("error", "adapter could not be loaded in the worker: ImportError", marker="unloadable"))
        store.append(_result("error", "not run: worker processes fail to start", marker="died"))
    assert sweep.judged_before(str(tmp_path), "r")[0] == {}


def test_two_sweeps_of_one_run_id_cannot_run_at_once(tmp_path: Path) -> None:
    held = sweep._lock_run(str(tmp_path), "r")
    try:
        with pytest.raises(ValueError, match="being swept by another process"):
            sweep.run_sweep(["reference-activation"], detect("cpu"), str(tmp_path), run_id="r", jobs=1, out=None,
                            resume=True)
    finally:
        held.close()


@pytest.mark.parametrize("run_id", ["../outside", "a/b", ".hidden"])
def test_a_run_id_is_a_name_never_a_path(tmp_path: Path, run_id: str) -> None:
    with pytest.raises(ValueError, match="run id"):
        sweep.run_sweep(["reference-activation"], detect("cpu"), str(tmp_path / "r"), run_id=run_id, jobs=1,
                        out=None, resume=True)
    assert not list(tmp_path.rglob("*.jsonl"))


def test_a_last_line_cut_right_after_a_brace_is_a_cut_line(tmp_path: Path) -> None:
    line = json.dumps(_result("pass", "").to_dict(), sort_keys=True)
    cut = line[: line.index("}") + 1]  # ends with a `}`, no newline: a writer killed there
    path = tmp_path / "cut.jsonl"
    path.write_text(line + "\n" + cut, encoding="utf-8")
    assert len(load_results([path])) == 1


def test_a_same_size_rewrite_within_one_clock_tick_is_restored_at_close(tmp_path: Path) -> None:
    """A kernel that turns "fail" into "pass" keeps the file's inode and size, and within one tick of the coarse
    clock its ctime too: the store compares the contents when it closes."""
    store = ResultStore(tmp_path, run_id="t")
    store.append(_result("fail", "out: wrong"))
    text = store.path.read_text(encoding="utf-8")
    store.path.write_text(text.replace('"verdict": "fail"', '"verdict": "pass"'), encoding="utf-8")
    store._seen = store._stamp()  # as if the rewrite fell in the same clock tick as the store's last write
    store.close()
    assert [r.verdict for r in load_results([store.path])] == ["fail"]
    assert store.tampered == 1


def test_a_case_file_of_a_module_object_adapter_names_it(tmp_path: Path) -> None:
    r = runner.judge(CASE, remote.open_adapter(WRONG, "cpu"), detect("cpu"))
    assert r.verdict == "fail" and r.metrics.get("adapter_object") == WRONG
    case_file = read_case_file(write_case_file(r, tmp_path))
    assert WRONG in case_file.adapter_specs  # replay finds it in a fresh process


def test_markdown_cells_hold_no_raw_html() -> None:
    text = render._cell("<script>alert(1)</script> | <img src=x> & 1<sup>2</sup>")
    assert "<script>" not in text and "<img" not in text and "\\|" in text and "<sup>2</sup>" in text


def test_replay_refuses_a_device_that_is_not_one(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "harness", "replay", str(tmp_path / "x.json"), "--device", "bogus"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--device must be auto, cpu, cuda or cuda:N" in done.stderr, done.stderr


def test_a_kernel_raising_a_base_exception_is_a_fail_of_its_case_in_replay(tmp_path: Path) -> None:
    spec = "tests.harness.fixtures.hostile_adapters:ATTACKS#hostile-base-exception"
    r = runner.judge(CASE.replace(adapter="hostile-base-exception"), remote.open_adapter(spec, "cpu"), detect("cpu"))
    assert r.verdict == "error" and "KernelPanic" in r.reason, r.reason
    path = write_case_file(r, tmp_path)
    done = subprocess.run([sys.executable, "-m", "harness", "replay", str(path), "--device", "cpu"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 1, done.stdout + done.stderr  # a verdict on the kernel, never "cannot test here"


@pytest.mark.parametrize(("env", "words"), [("HARNESS_CASE_TIMEOUT", "--moe-case-timeout"),
                                            ("MOE_HARNESS_SHARDS", "--moe-shards"),
                                            ("MOE_HARNESS_GPUS", "--moe-gpus")])
def test_a_bad_environment_variable_is_a_usage_error_not_a_traceback(env: str, words: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "moe_generic",
                           "--moe-adapter", "reference-activation", "--collect-only"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), env: "abc"})
    out = done.stdout + done.stderr
    assert done.returncode == 4 and words in out and "Traceback" not in out, out[-2000:]
