"""scripts/compare_align.py: the tree's align and the one at a git revision must build equal layouts before they
are timed; in the interpreter against HEAD they agree, and a planted swap of two entries fails every point."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "compare_align.py"


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs the git checkout")
@pytest.mark.parametrize("plant", [False, True])
def test_both_versions_are_checked_before_timing(plant: bool) -> None:
    p = subprocess.run([sys.executable, str(SCRIPT), "--against", "HEAD", "--smoke", *(["--plant"] if plant else [])],
                       capture_output=True, text=True, timeout=300)
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 4, p.stdout + p.stderr
    if plant:
        assert p.returncode == 1 and all(r["verified"].startswith("no:") for r in rows), rows
    else:
        assert p.returncode == 0 and all(r["verified"] == "yes" for r in rows), rows
