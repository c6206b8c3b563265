"""Fault injection on a real GPU: out-of-bounds writes, outputs on the wrong device, an illegal memory
access in the sweep and in the pytest path. Each fault leaves the right verdict on the faulty kernel and every
other verdict intact. These need CUDA: on a machine without one they are reported as skipped with that reason (the
GPU machine runs them; its results are committed under results/sm90/)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA fault injection needs a GPU")

ROOT = Path(__file__).resolve().parents[2]
FAULTS = "tests.harness.fixtures.cuda_faults"
FAKES = "tests.harness.fixtures.fake_adapters"
CELL = {"activation": "silu_and_mul", "dtype": "float32"}


def _judge(name: str):  # type: ignore[no-untyped-def]
    from harness import registry
    from harness.core.case import Case
    from harness.core.device import detect
    from harness.engine import runner

    adapter = registry.resolve(f"{FAULTS}:{name}")
    case = Case(op="activation", adapter=adapter.name, features=CELL, shapes={"T": 33, "N": 129},
                dtypes={"x": "float32"}, seed=1)
    return runner.judge(case, adapter, detect("cuda"))


def test_a_triton_write_past_the_end_of_an_output_fails() -> None:
    r = _judge("OOB")
    assert r.verdict == "fail" and "guard:out" in r.metrics["failed_checks"], r.reason
    assert "wrote 64 elements outside the output buffer (first 1 elements past its end)" in r.reason


def test_outputs_returned_on_the_cpu_fail() -> None:
    r = _judge("CPU_OUTPUT")
    assert r.verdict == "fail" and "on device cpu, the case runs on cuda" in r.reason, r.reason


def test_illegal_addresses_in_a_sweep_leave_every_other_verdict_intact(tmp_path: Path) -> None:
    from harness import registry, sweep
    from harness.core.device import detect
    from harness.store.results import load_results
    from harness.sweep.selection import Shard

    spec = f"{FAULTS}:ILLEGAL"
    # a third of the cells: each bad case costs a fresh kernel host with a fresh CUDA context (seconds), so three
    # workers replace theirs side by side instead of one after another
    shard = Shard(1, 3)
    planned = shard.of(sweep.plan(registry.resolve(spec), "quick")).cases
    bad = {c.case_id for c in planned if c.features["dtype"] == "float32"}
    assert len(bad) >= 3 and len(planned) > len(bad)  # several in one chunk, among good ones
    sweep.run_sweep([spec], detect("cuda"), str(tmp_path), profile="quick", run_id="t", jobs=3, case_timeout=300,
                    out=None, shard=shard)
    results = {r.case.case_id: r for r in load_results([tmp_path])}
    assert set(results) == {c.case_id for c in planned}
    for case_id, r in results.items():
        if case_id in bad:
            assert r.verdict == "error" and "illegal memory access" in r.reason, r.reason
        else:
            assert r.verdict in ("pass", "unsupported"), r.reason


def test_an_illegal_address_in_the_pytest_path_fails_only_its_own_test(tmp_path: Path) -> None:
    # the ci profile whatever this session's (a GPU run exports HYPOTHESIS_PROFILE=gpu): each float32 case loses
    # its host's CUDA context, and a fresh one costs seconds
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--moe-profile", "ci",
           "harness/plugin/generic.py::test_declared_cases_pass", "--moe-adapter", f"{FAULTS}:ILLEGAL",
           "--moe-adapter", f"{FAKES}:CORRECT", "--moe-adapter", f"{FAKES}:CORRECT_OTHER",
           "--moe-results-dir", str(tmp_path)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PYTEST_XDIST_WORKER", None)
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    failed = [line for line in out.splitlines() if line.startswith("FAILED")]
    assert p.returncode == 1 and failed, out[-3000:]
    assert all("cuda-illegal-address" in line for line in failed), out[-3000:]
