"""The benchmark runner: verification status, isolated failures and the exit code (timings are never asserted)."""

from __future__ import annotations

from harness.commands.bench import BenchCase, exit_code, run_cases


def _boom() -> None:
    raise RuntimeError("kernel exploded")


def test_rows_report_verification_and_isolate_a_failing_kernel() -> None:
    cases = [
        BenchCase("ok", "a", kernel=lambda: None, reference=lambda: None, bytes_moved=10, verify=lambda: None),
        BenchCase("replay", "a", kernel=lambda: None),  # a variant timed without its own verification
        BenchCase("wrong", "b", kernel=lambda: None, verify=lambda: "3 codes differ"),
        BenchCase("raises", "c", kernel=_boom, verify=lambda: None),
    ]
    rows = {r["case"]: r for r in run_cases(cases, "cpu")}
    assert rows["ok"]["verified"] == "yes" and rows["ok"]["kernel_us"] >= 0 and "speedup" in rows["ok"]
    assert rows["replay"]["verified"] == "not run" and "error" not in rows["replay"]
    assert rows["wrong"]["verified"] == "no: 3 codes differ"
    assert "kernel exploded" in rows["raises"]["error"]
    assert exit_code([rows["ok"], rows["replay"]]) == 0
    assert exit_code([rows["ok"], rows["wrong"]]) == 1
    assert exit_code([rows["raises"]]) == 1
