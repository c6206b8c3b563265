"""The quick subset (tests/quick.py, `pytest -m quick`): every area has tests, every entry names a test, the measured
total fits the budget, and `-m quick` selects exactly the listed tests, the plugin's generic tests included."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.quick import QUICK, QUICK_BUDGET_S, area_of, matches

ROOT = Path(__file__).resolve().parents[1]
DURATIONS = ROOT / "tests" / "durations" / "cpu.json"
AREAS = ("reference", "kernels", "harness", "docs")


def measured() -> dict[str, float]:
    return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text(encoding="utf-8")).items()}


def defined(prefix: str) -> bool:
    """A file or folder that exists, or a test function defined in its file (a test too new to be measured)."""
    path, _, function = prefix.partition("::")
    if not (ROOT / path).exists() or "[" in function:
        return False
    return not function or re.search(rf"^def {re.escape(function)}\(", (ROOT / path).read_text(encoding="utf-8"),
                                     re.MULTILINE) is not None


def quick_seconds(durations: dict[str, float]) -> dict[str, float]:
    """The measured seconds of the quick tests, by area."""
    total = dict.fromkeys(QUICK, 0.0)
    for nodeid, seconds in durations.items():
        if (area := area_of(nodeid)) is not None:
            total[area] += seconds
    return total


def test_every_area_has_quick_tests() -> None:
    durations = measured()
    assert set(QUICK) == set(AREAS), f"the quick areas are {AREAS}, got {sorted(QUICK)}"
    for area, prefixes in QUICK.items():
        assert prefixes, f"quick area {area!r} lists no test"
        assert any(area_of(n) == area for n in durations), f"quick area {area!r} names no measured test"


def test_every_entry_names_a_test() -> None:
    durations = measured()
    stale = [p for prefixes in QUICK.values() for p in prefixes
             if not any(matches(p, n) for n in durations) and not defined(p)]
    assert not stale, f"tests/quick.py names tests that do not exist (renamed?): {stale}"


def test_the_quick_set_fits_its_budget() -> None:
    by_area = quick_seconds(measured())
    total = sum(by_area.values())
    areas = ", ".join(f"{area} {seconds:.0f} s" for area, seconds in by_area.items())
    assert total <= QUICK_BUDGET_S, (f"the quick tests take {total:.0f} s of measured time, over the budget of "
                                     f"{QUICK_BUDGET_S:.0f} s: {areas}")


def test_prefixes_name_folders_files_functions_and_shards() -> None:
    generic = "harness/plugin/generic.py::test_declared_cases_pass[triton-reduce-shard0]"
    assert matches(generic, "harness/plugin/generic.py::test_declared_cases_pass[triton-reduce-shard1]")
    assert not matches(generic, "harness/plugin/generic.py::test_declared_cases_pass[triton-reduce-x-shard0]")
    assert matches("tests/reference/", "tests/reference/test_scales.py::test_bad_arguments")
    assert matches("tests/test_golden.py", "tests/test_golden.py::test_golden_reproduces[a]")
    assert not matches("tests/test_golden.py", "tests/test_golden.py.bak::test")
    assert matches("tests/a.py::test_x", "tests/a.py::test_x[1-2]")
    assert not matches("tests/a.py::test_x", "tests/a.py::test_xy")


def test_minus_m_quick_selects_the_listed_tests() -> None:
    """Collected for real: the marker reaches the generic tests the plugin adds, and nothing unlisted is selected."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for key in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_TESTRUNUID", "PYTEST_XDIST_WORKER_COUNT"):
        env.pop(key, None)
    done = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-m", "quick", "-p", "no:cacheprovider",
                           "-n", "0", "tests/harness/test_core.py", "tests/test_scripts.py",
                           "--moe-adapter", "triton-routing", "--moe-adapter", "reference-routing"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    selected = [line for line in done.stdout.splitlines() if "::" in line]
    assert any(n.startswith("tests/harness/test_core.py::") for n in selected), done.stdout
    assert "harness/plugin/generic.py::test_declared_cases_pass[triton-routing-shard0]" in selected, done.stdout
    assert "harness/plugin/generic.py::test_undeclared_cells_rejected_cleanly[triton-routing]" in selected
    unlisted = [n for n in selected if area_of(n) is None]
    assert not unlisted, f"selected by -m quick but not listed in tests/quick.py: {unlisted}"
    assert not any("reference-routing" in n or "test_scripts" in n for n in selected), done.stdout
