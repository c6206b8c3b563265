"""scripts/probe_align_rank.py: both ways of ranking align's in-chunk entries agree with the torch reference in the
interpreter, and a planted wrong rank fails the probe's check (so its GPU timings are of verified kernels)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "probe_align_rank.py"


@pytest.mark.parametrize("plant", [False, True])
def test_the_probe_checks_every_rank_before_timing(plant: bool) -> None:
    p = subprocess.run([sys.executable, str(SCRIPT), "--smoke", *(["--plant"] if plant else [])],
                       capture_output=True, text=True, timeout=300)
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert {r["way"] for r in rows} == {"network", "count"} and len(rows) == 4, p.stdout + p.stderr
    counted = [r["verified"] for r in rows if r["way"] == "count"]
    assert all(r["verified"] == "yes" for r in rows if r["way"] == "network"), rows
    if plant:
        assert p.returncode == 1 and all(v.startswith("no:") for v in counted), rows
    else:
        assert p.returncode == 0 and counted == ["yes", "yes"], rows
