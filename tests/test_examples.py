"""The worked example of examples/my_kernel (an external Triton kernel verified with this harness): its adapter goes
through the generic tests, the sweep and replay in the interpreter, and its entry point resolves."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from harness import registry
from harness.cli import main
from harness.engine import runner
from harness.store.results import ResultStore, load_results
from tests import test_adapters as generic

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "my_kernel"
SPEC = "my_moe_kernel.harness_adapter:ADAPTER"


@pytest.fixture
def example_on_path(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(EXAMPLE))  # as `pip install -e examples/my_kernel` would
    return registry.resolve(SPEC)


def test_generic_tests_pass_on_the_example(example_on_path, device_info, unverifiable, tmp_path) -> None:  # type: ignore[no-untyped-def]
    adapter = example_on_path
    assert adapter.name == "my-silu-mul" and adapter.source == "my_moe_kernel.swiglu"
    with ResultStore(tmp_path, run_id="example") as store:
        generic.test_declared_cases_pass(adapter.name, (0, 1), device_info, store, unverifiable)
        generic.test_undeclared_cells_rejected_cleanly(adapter.name, device_info, store)
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
    assert main(["replay", str(case_file), "--adapter", SPEC, "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pass: my-silu-mul on ") and "recorded: fail" in out


def test_entry_point_of_the_example_resolves(example_on_path) -> None:  # type: ignore[no-untyped-def]
    if sys.version_info < (3, 11):
        pytest.skip("tomllib needs Python 3.11")
    import tomllib

    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    entry_points = project["entry-points"][registry.ENTRY_POINT_GROUP]
    assert entry_points == {"my-silu-mul": SPEC}
    for name, target in entry_points.items():
        assert registry.resolve(target).name == name
