"""`python -m harness perf-table`: docs/PERFORMANCE.md's experts timing tables are rendered from the committed bench
runs (never typed in), and the render says what the bench measured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.commands import perf_table

ROOT = Path(__file__).resolve().parents[2]
HEADER = ("| case | adapter | floor | verified | kernel_us | % of floor |\n"
          "|------|---------|-------|----------|-----------|------------|\n")


def _run_folder(tmp_path: Path, rows: list[tuple[str, str, float | str]],
                name: str = "2026-01-02-abc1234-bench") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "bench_1.md").write_text(HEADER + "".join(
        f"| {case} | {adapter} | bandwidth | yes | {us} | 0 |\n" for case, adapter, us in rows))
    (folder / "device.txt").write_text("name, memory.total [MiB]\nNVIDIA H200, 143771 MiB\ncommit: def5678\n")
    return folder


def test_the_committed_tables_are_the_render_of_the_runs_they_name() -> None:
    text = (ROOT / "docs/PERFORMANCE.md").read_text(encoding="utf-8")
    assert len(perf_table.blocks(text)) >= 2
    assert perf_table.rendered_again(text, ROOT) == text, \
        "docs/PERFORMANCE.md is stale: run python -m harness perf-table --out docs/PERFORMANCE.md"


def test_a_number_typed_into_a_table_is_stale() -> None:
    text = (ROOT / "docs/PERFORMANCE.md").read_text(encoding="utf-8")
    start, end, _ = perf_table.blocks(text)[0]
    body = text[start:end]
    edited = text[:start] + body.replace("| 16 |", "| 17 |", 1) + text[end:]
    assert edited != text and perf_table.rendered_again(edited, ROOT) != edited


def test_each_kernel_gets_its_time_its_share_of_the_floor_and_ours_a_ratio_to_the_anchor(tmp_path: Path) -> None:
    case = "deepseek-v3 fp8_w8a8 G128 M=64 floor=100.0us (bandwidth)"
    folder = _run_folder(tmp_path, [(case, "triton-experts", 200.0), (case, "vllm-0.32.0 fused_moe_kernel", 400.0),
                                    (case, "deepgemm-2.6.1 grouped GEMMs", 125.0)])
    lines = perf_table.render([str(folder)]).splitlines()
    assert "NVIDIA H200, commit def5678" in lines[0] and "the anchor: vllm-0.32.0 fused_moe_kernel" in lines[0]
    assert lines[2] == ("| shape | scheme | M | floor us | triton-experts us (% of floor) | vllm-0.32.0 "
                        "fused_moe_kernel us (% of floor) | deepgemm-2.6.1 grouped GEMMs us (% of floor) | "
                        "triton-experts / anchor |")
    assert lines[4] == "| deepseek-v3 | fp8_w8a8 G128 | 64 | 100 | 200 (50%) | 400 (25%) | 125 (80%) | 0.50 |"


def test_points_are_ordered_and_a_kernel_missing_at_a_point_is_a_dash(tmp_path: Path) -> None:
    big, small = ("qwen3 bf16 M=4096 floor=50.0us (compute)", "qwen3 bf16 M=16 floor=10.0us (bandwidth)")
    folder = _run_folder(tmp_path, [(big, "triton-experts", 100.0), (small, "triton-experts", 20.0),
                                    (small, "vllm-0.32.0 fused_moe_kernel", 10.0)])
    rows = [line for line in perf_table.render([str(folder)]).splitlines() if line.startswith("| qwen3")]
    assert rows == ["| qwen3 | bf16 | 16 | 10 | 20 (50%) | 10 (100%) | 2.00 |",
                    "| qwen3 | bf16 | 4096 | 50 | 100 (50%) | - | - |"]


def test_a_row_without_a_positive_time_is_left_out_and_a_later_table_wins(tmp_path: Path) -> None:
    case = "q bf16 M=8 floor=10.0us (bandwidth)"
    folder = _run_folder(tmp_path, [(case, "triton-experts", 40.0), ("q bf16 M=9 floor=10.0us (bandwidth)",
                                                                      "triton-experts", "nan")])
    (folder / "bench_2.md").write_text(HEADER + f"| {case} | triton-experts | bandwidth | yes | 20.0 | 0 |\n"
                                       f"| {case} | vllm-x | bandwidth | yes | error | 0 |\n")
    rows = [line for line in perf_table.render([str(folder)]).splitlines() if line.startswith("| q")]
    assert rows == ["| q | bf16 | 8 | 10 | 20 (50%) |"]


def test_tables_of_other_ops_are_left_out_and_a_folder_without_experts_rows_is_an_error(tmp_path: Path) -> None:
    folder = tmp_path / "2026-01-02-abc1234-stages"
    folder.mkdir()
    (folder / "routing.md").write_text("| op | adapter | us |\n|---|---|---|\n| routing M=16 | triton-routing | 5 |\n")
    with pytest.raises(ValueError, match="no experts bench table"):
        perf_table.read_run(folder)
    with pytest.raises(ValueError, match="not a folder"):
        perf_table.read_run(tmp_path / "missing")
    run = perf_table.read_run(_run_folder(tmp_path, [("m bf16 M=1 floor=1.0us (bandwidth)", "triton-experts", 2.0)]))
    assert run.commit == "def5678" and run.device == "NVIDIA H200"


def test_the_command_renders_a_files_blocks_and_refuses_unclear_requests(tmp_path: Path) -> None:
    folder = _run_folder(tmp_path, [("m bf16 M=1 floor=1.0us (bandwidth)", "triton-experts", 2.0)])
    doc = tmp_path / "doc.md"
    doc.write_text(f"intro\n<!-- perf-table: {folder.name} -->\nold\n<!-- /perf-table -->\nafter\n")

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "harness", "perf-table", *args], cwd=tmp_path,
                              capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": ""})

    done = cli("--out", "doc.md")
    assert done.returncode == 0, done.stderr
    text = doc.read_text()
    assert "old" not in text and "| m | bf16 | 1 | 1 | 2 (50%) |" in text
    assert text.endswith("<!-- /perf-table -->\nafter\n")
    assert perf_table.rendered_again(text, tmp_path) == text  # rendering again changes nothing
    for args, words in ((["--out", "doc.md", folder.name], "not both"), ([], "give bench run folders"),
                        (["missing"], "not a folder"), (["--out", "absent.md"], "not a file")):
        done = cli(*args)
        assert done.returncode == 2 and words in done.stderr, done.stderr
    (tmp_path / "plain.md").write_text("no block\n")
    done = cli("--out", "plain.md")
    assert done.returncode == 2 and "no block" in done.stderr
