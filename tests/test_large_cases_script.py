"""scripts/large_cases.py, the measurement of docs/PERFORMANCE.md's large cases: without a GPU it lists each
shipped adapter's case past 2**31 elements (every op but align has one) and refuses to judge, saying why."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "large_cases.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_it_lists_a_large_case_for_every_op_but_align() -> None:
    from harness import ops
    from harness.ops.large import LARGE_OFFSET, NOT_EXPRESSIBLE

    done = _run("--list", "--generation", "sm90")
    assert done.returncode == 0, done.stderr
    rows = [line.split("\t") for line in done.stdout.splitlines()]
    assert {op for _, op, *_ in rows} == set(ops.available()) - set(NOT_EXPRESSIBLE)
    for name, _, _, shapes in rows:
        assert name.startswith(("triton-", "reference-", "torch-", "naive-")), name
        assert math.prod(json.loads(shapes).values()) * 2 > LARGE_OFFSET, (name, shapes)  # gated x: [T, 2N]
    assert "triton-align: no large case" in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU it judges them")
def test_without_a_gpu_it_judges_nothing_and_says_why() -> None:
    done = _run("triton-reduce")
    assert done.returncode == 2 and "needs a CUDA GPU" in done.stderr, done.stderr
