"""The worked example of examples/my_kernel (an external Triton kernel verified with this harness): its adapter goes
through the generic tests, the sweep and replay in the interpreter, and its entry point resolves."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import plugin, registry
from harness.cli import main
from harness.engine import runner
from harness.engine.profiles import PROFILES
from harness.plugin import generic
from harness.store.results import ResultStore, load_results

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "my_kernel"
SPEC = "my_moe_kernel.harness_adapter:ADAPTER"


@pytest.fixture
def example_on_path(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(EXAMPLE))  # as `pip install -e examples/my_kernel` would
    return registry.resolve(SPEC)


def test_generic_tests_pass_on_the_example(example_on_path, device_info, unverifiable, tmp_path, request) -> None:  # type: ignore[no-untyped-def]
    adapter = example_on_path
    assert adapter.name == "my-silu-mul" and adapter.source == "my_moe_kernel.swiglu"
    with ResultStore(tmp_path, run_id="example") as store:
        generic.test_declared_cases_pass(adapter.name, (0, 1), device_info, store, unverifiable, PROFILES["ci"],
                                         request)
        generic.test_undeclared_cells_rejected_cleanly(adapter.name, device_info, store, unverifiable, request)
    verdicts = {r.verdict for r in load_results([tmp_path])}
    assert verdicts <= {"pass", "unsupported", "not-verifiable"} and "pass" in verdicts


def test_sweep_and_replay_on_the_example(example_on_path, device_info, unverifiable, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from harness.sweep import sweep

    adapter = example_on_path
    # the matrix's sweep, in process: declared cells pass, the other activations are rejected cleanly
    with ResultStore(tmp_path / "matrix", run_id="m") as store:
        counts = sweep([SPEC], device_info, store, unverifiable=unverifiable, out=None)[SPEC]
    assert counts["pass"] >= 3 and counts["unsupported"] > 0
    assert set(counts) <= {"pass", "unsupported", "not-verifiable"}, counts

    # a kernel judged under the wrong convention fails, leaves a case file, and the fixed adapter replays it
    wrong = dataclasses.replace(adapter, name="my-silu-mul-up-first",
                                conventions={**adapter.conventions, "gate_order": "up_first"})
    case = runner.Case(op="activation", adapter=wrong.name, features={"activation": "silu_and_mul",
                       "dtype": "float32"}, shapes={"T": 3, "N": 40}, dtypes={"x": "float32"}, seed=5)
    with ResultStore(tmp_path / "bug", run_id="b") as store:
        store.append(runner.judge(case, wrong, device_info, unverifiable=unverifiable))
    (case_file,) = (tmp_path / "bug" / "cases").glob("*.json")
    assert main(["replay", str(case_file), "--adapter", SPEC, "--device", device_info.device]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pass: my-silu-mul on ") and "recorded: fail" in out


def test_the_committed_case_file_names_the_example_adapter(example_on_path) -> None:  # type: ignore[no-untyped-def]
    """Its README replays and bisects it as written, with no --adapter: the adapter it names must exist."""
    from harness.store.casefiles import read_case_file

    recorded = read_case_file(EXAMPLE / "cases" / "wrong-gate-order.json")
    assert recorded.adapter_object == SPEC and recorded.adapter == example_on_path.name == recorded.case["adapter"]
    assert recorded.recorded["verdict"] == "fail"


def test_entry_point_of_the_example_resolves(example_on_path) -> None:  # type: ignore[no-untyped-def]
    if sys.version_info < (3, 11):
        pytest.skip("tomllib needs Python 3.11")
    import tomllib

    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    entry_points = project["entry-points"][registry.ENTRY_POINT_GROUP]
    assert entry_points == {"my-silu-mul": SPEC}
    for name, target in entry_points.items():
        assert registry.resolve(target).name == name


def _pytest_in(folder: Path, *args: str) -> subprocess.CompletedProcess:
    import os

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(root)])}
    env.pop("PYTEST_XDIST_WORKER", None)  # the inner run is its own session, not one of our workers
    env.pop("PYTEST_XDIST_TESTRUNUID", None)
    for key in ("HYPOTHESIS_PROFILE", "MOE_HARNESS_PROFILE"):  # a GPU run's gpu profile: 60 cases a cell, not 8
        env.pop(key, None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin.load_args(), *args],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=600)


def test_the_example_repository_runs_the_generic_tests_through_the_plugin(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """As an outside repository: from its own folder, its own tests and the plugin's generic tests run together;
    a wrong adapter given the same way fails there."""
    repo = tmp_path / "my_kernel"
    shutil.copytree(EXAMPLE, repo, ignore=shutil.ignore_patterns("results", "__pycache__"))
    done = _pytest_in(repo, "-v", "--moe-adapter", SPEC, "--moe-results-dir", str(tmp_path / "res"))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    for test in ("tests/test_silu_mul.py::test_silu_mul_matches_torch PASSED",
                 "test_declared_cases_pass[my-silu-mul-shard0] PASSED",
                 "test_undeclared_cells_rejected_cleanly[my-silu-mul] PASSED"):
        assert test in out, out[-3000:]
    assert {r.verdict for r in load_results([tmp_path / "res"])} >= {"pass", "unsupported"}

    (repo / "wrong_adapter.py").write_text(
        "import dataclasses\nfrom my_moe_kernel.harness_adapter import ADAPTER\n"
        "WRONG = dataclasses.replace(ADAPTER, name='my-silu-mul-up-first',\n"
        "                            conventions={**ADAPTER.conventions, 'gate_order': 'up_first'})\n")
    done = _pytest_in(repo, "--moe-adapter", "wrong_adapter:WRONG", "-k", "declared_cases",
                      "--moe-results-dir", str(tmp_path / "res-wrong"))
    assert done.returncode == 1 and "1 failed" in done.stdout, (done.stdout + done.stderr)[-3000:]
