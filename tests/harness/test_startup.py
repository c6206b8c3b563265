"""The command line starts without torch: a `python -m harness` process imports torch only when it judges.

Importing torch costs about 2 s of CPU. A command's parent that never judges (replay and bisect, whose case is
judged in a child; rendering and diffing recorded verdicts) must not pay it, nor a bisect step at every commit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = "tests/harness/fixtures/matrix_results.jsonl"
CASE = "examples/my_kernel/cases/wrong-gate-order.json"

_PROBE = """
import sys
from harness.cli import main
code = main(sys.argv[1:])
print("torch" in sys.modules)
sys.exit(code)
"""


@pytest.mark.parametrize("args", [
    ["matrix", "--from", RESULTS, "--out", "{tmp}/m.md"],
    ["diff", RESULTS, RESULTS],
    ["replay", CASE, "--adapter", "my_moe_kernel.harness_adapter:ADAPTER", "--device", "cpu"],
], ids=["render", "diff", "replay"])
def test_a_command_that_never_judges_in_its_own_process_never_imports_torch(args: list[str], tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "examples" / "my_kernel")]))
    argv = [a.format(tmp=tmp_path) for a in args]
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False", "torch was imported"
