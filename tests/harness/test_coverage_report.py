"""The draw-coverage report (`python -m harness coverage`): every declared axis value, value class, expert-map
shape, boundary kind and threshold of the adapters we ship is exercised by the `ci` plan of their generic tests;
one that is not is a gap (exit 1, listed), one that cannot apply is n/a."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness import cli, ops, registry
from harness.engine import coverage as cov
from harness.engine import strategies as hs
from harness.engine.profiles import PROFILES
from tests.harness.fixtures import coverage_adapters as planted

ROOT = Path(__file__).resolve().parents[2]

#: gaps of today's plan, each with why; a new gap fails, and so does an entry here that is covered again
KNOWN_GAPS: set[tuple[str, str, str]] = set()


def _gaps(report: dict) -> set[tuple[str, str, str]]:
    return {(a["adapter"], r["section"], r["item"]) for a in report["adapters"] for r in a["rows"]
            if r["status"] == "gap"}


def test_the_ci_plan_of_our_adapters_exercises_everything_they_declare(tmp_path: Path) -> None:
    """The report as CI would run it, in a process of its own: hypothesis draws constants from the modules a
    process has loaded, so the draws are those of the command, not of whatever this test process imported."""
    out = tmp_path / "coverage.json"
    p = subprocess.run([sys.executable, "-m", "harness", "coverage", "--profile", "ci", "--json", "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode in (0, 1), p.stderr[-3000:]
    report = json.loads(out.read_text())
    gaps = _gaps(report)
    assert p.returncode == (1 if gaps else 0), p.stdout[-2000:]
    new, covered = gaps - KNOWN_GAPS, KNOWN_GAPS - gaps
    assert not new, "declared and never exercised by the ci plan: " + "; ".join(map(str, sorted(new)))
    assert not covered, "exercised now, remove from KNOWN_GAPS: " + "; ".join(map(str, sorted(covered)))
    names = {a["adapter"] for a in report["adapters"]}
    assert {"triton-experts", "triton-activation", "reference-routing"} <= names
    assert all(a.library is None for a in map(registry.resolve, names))  # ours only, by default
    counted = [a for a in report["adapters"] if not a["skipped"]]
    assert all(a["drawn"] > 0 and a["fixed"] > 0 for a in counted)
    assert p.stdout.strip().splitlines()[-1].startswith("coverage (ci, interp): ")


def _rows(report: cov.AdapterCoverage) -> dict[tuple[str, str], cov.Row]:
    return {(r.section, r.item): r for r in report.rows}


def test_a_declared_value_whose_every_case_is_turned_away_is_a_gap() -> None:
    device = cov.device_for("interp")
    planted_report = cov.adapter_coverage(planted.NEVER_FLOAT32, device, PROFILES["ci"])
    honest = cov.adapter_coverage(registry.resolve("reference-activation"), device, PROFILES["ci"])
    assert _rows(honest)[("axis", "dtype=float32")].status == "ok"
    row = _rows(planted_report)[("axis", "dtype=float32")]
    assert (row.drawn, row.fixed, row.status) == (0, 0, "gap")
    # the value class judged per dtype has no float32 case either
    assert [r.item for r in planted_report.gaps()] == ["dtype=float32", "dtype_extremes (dtype=float32)"]
    assert any("no float32 case" in why for why in planted_report.turned_away)


def test_a_threshold_its_limits_keep_out_of_reach_is_a_gap_and_the_command_exits_1(tmp_path: Path, capsys,  # type: ignore[no-untyped-def]
                                                                                    monkeypatch) -> None:
    monkeypatch.setenv("HARNESS_SCALE", "small")
    spec = "tests.harness.fixtures.coverage_adapters:"
    out = tmp_path / "report.md"
    assert cli.main(["coverage", "--adapter", spec + "CROSSED", "--out", str(out)]) == 0
    assert "every declared thing exercised" in capsys.readouterr().out
    assert "| threshold `T >= 9` |" in out.read_text()
    assert cli.main(["coverage", "--adapter", spec + "UNCROSSED", "--out", str(out)]) == 1
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert "1 gap(s): fixture-coverage-uncrossed threshold T >= 9" in summary, summary
    text = out.read_text()
    assert "| threshold `T >= 9` | **0** |" in text and "gap: threshold `T >= 9`" in text
    # T a multiple of 4 has no one-row case: not applicable, not a gap
    assert "n/a: boundary `one token row`: the adapter's limits leave no boundary case of this kind" in text


def test_a_class_that_cannot_apply_is_not_applicable_rather_than_a_gap() -> None:
    report = cov.adapter_coverage(planted.NO_NONFINITE, cov.device_for("interp"), PROFILES["ci"])
    row = _rows(report)[("value class", "nonfinite_rows")]
    assert row.status == "n/a" and "applies" in row.why
    assert not report.gaps()
    honest = cov.adapter_coverage(registry.resolve("reference-routing"), cov.device_for("interp"), PROFILES["ci"])
    assert {r.status for r in honest.rows if r.section == "value class"} == {"ok"}


def test_an_unknown_op_or_generation_is_refused_naming_the_valid_ones(capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli.main(["coverage", "--op", "routingg"]) == 2
    assert "--op must be one of" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["coverage", "--generation", "sm70"])
    assert "interp" in capsys.readouterr().err


def test_the_value_classes_read_the_same_from_the_inputs_before_quantizing() -> None:
    """Experts' `class_inputs` skip quantizing the weights (the coverage report asks every planned case): each value
    class is present in them exactly where it is in the full inputs."""
    spec = ops.get("experts")
    adapter = registry.resolve("triton-experts")
    cases = hs.value_class_cases(adapter, hs.declared_cells(adapter, cov.device_for("interp")))
    assert spec.class_inputs is not None and len(cases) >= 4
    seen = set()
    for case in cases:
        full, cheap = spec.make_inputs(case, "cpu"), spec.class_inputs(case, "cpu")
        for vc in spec.value_classes:
            if vc.applies(adapter, case.features):
                held = vc.present(case, full)
                assert vc.present(case, cheap) == held, (vc.name, case.to_json())
                seen.add((vc.name, held))
    assert ("zero_rows", True) in seen and ("block_counts", True) in seen
