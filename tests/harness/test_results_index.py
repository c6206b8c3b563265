"""results/README.md is generated from the result files (harness.store.record): the same files give the same bytes,
each verdict folder's row says what its files record, and the committed index is what the committed results
generate (a stale index fails, as a stale support matrix does)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.core.case import Case
from harness.core.result import Result
from harness.store import record
from harness.store.results import ResultStore

ROOT = Path(__file__).resolve().parents[2]
#: 2026-01-02 12:00 UTC
STAMP = 1767355200.0
DEVICE = {"device_name": "NVIDIA H100 80GB HBM3", "torch_version": "2.11.0+cu130", "triton_version": "3.6.0",
          "commit": "abc1234def5678", "dirty": False, "generation": "sm90"}


def _result(verdict: str, seed: int, run_id: str, adapter: str = "triton-activation") -> Result:
    case = Case(op="activation", adapter=adapter, features={"activation": "silu_and_mul", "dtype": "float32"},
                shapes={"M": seed + 1}, seed=seed)
    return Result(case=case, verdict=verdict, generation="sm90", device=DEVICE, run_id=run_id,
                  timestamp=STAMP + seed)


def _tree(root: Path) -> Path:
    """A results folder: one sweep (parent file with its run record, one worker's verdicts), one pytest run, a
    bench folder and a git-ignored local run."""
    run = root / "sm90" / "2026-01-02-abc1234-demo"
    rid = "matrix-sm90-20260102T120000-aaaaaa"
    with ResultStore(run / "matrix-quick", run_id=rid, worker="main") as main:
        main.append_meta("run", {"command": "python -m harness matrix --profile quick --adapter triton-activation "
                                            "--out /root/out/M.md --results-dir /tmp/r", "device": DEVICE})
    with ResultStore(run / "matrix-quick", run_id=rid, worker="w1") as worker:
        worker.append(_result("pass", 1, rid))
        worker.append(_result("unsupported", 2, rid))
        worker.append(_result("fail", 3, rid))
    with ResultStore(run / "pytest", run_id="pytest-0123456789ab", worker="gw0") as store:
        store.append(_result("pass", 4, "pytest-0123456789ab", adapter="reference-activation"))
    with ResultStore(root / "sm90" / "local", run_id="pytest-ffffffffffff") as store:
        store.append(_result("pass", 5, "pytest-ffffffffffff"))
    bench = root / "sm90" / "bench" / "2026-01-02-abc1234-probes"
    bench.mkdir(parents=True)
    (bench / "README.md").write_text("# Tile probes of the demo kernel\n\nMore text.\n", encoding="utf-8")
    (bench / "device.txt").write_text("name, memory.total [MiB], driver_version\nNVIDIA H100 80GB HBM3, 81559 MiB, 1\n"
                                      "commit: abc1234def5678+dirty\n", encoding="utf-8")
    (bench / "probe_1.jsonl").write_text('{"shape": "demo", "us": 1.0}\n', encoding="utf-8")
    return root


def test_the_same_files_give_the_same_bytes(tmp_path: Path) -> None:
    root = _tree(tmp_path / "results")
    first = record.render(root)
    assert record.render(root) == first
    assert first.startswith(record.PREAMBLE)


def test_a_row_says_what_the_files_record(tmp_path: Path) -> None:
    text = record.render(_tree(tmp_path / "results"))
    rows = {line.split(" | ")[0].strip("| `"): line for line in text.splitlines() if line.startswith("| `")}
    assert sorted(rows) == ["sm90/2026-01-02-abc1234-demo/matrix-quick/", "sm90/2026-01-02-abc1234-demo/pytest/",
                            "sm90/bench/2026-01-02-abc1234-probes/"]  # the local run is not committed
    sweep = rows["sm90/2026-01-02-abc1234-demo/matrix-quick/"]
    for expected in ("| 2026-01-02 |", "| sm90 |", "| NVIDIA H100 80GB HBM3 |", "torch 2.11.0+cu130, Triton 3.6.0",
                     "| abc1234 |", "`python -m harness matrix --profile quick --adapter triton-activation`",
                     "`matrix-sm90-20260102T120000-aaaaaa`", "| 3: 1 pass, 1 fail, 1 unsupported |"):
        assert expected in sweep, (expected, sweep)
    assert "/root/out" not in sweep and "/tmp/r" not in sweep  # where it wrote is not what it ran
    assert "pytest with the harness plugin (reference-activation)" in rows["sm90/2026-01-02-abc1234-demo/pytest/"]
    bench = rows["sm90/bench/2026-01-02-abc1234-probes/"]
    assert "| Tile probes of the demo kernel | NVIDIA H100 80GB HBM3 | abc1234 (dirty) | 1 `.jsonl` |" in bench


def test_check_says_when_the_index_is_stale(tmp_path: Path) -> None:
    root = _tree(tmp_path / "results")
    assert record.main(["--root", str(root), "--check"]) == 1  # no index yet
    assert record.main(["--root", str(root)]) == 0
    assert record.main(["--root", str(root), "--check"]) == 0
    rid = "matrix-sm90-20260102T120000-aaaaaa"
    with ResultStore(root / "sm90" / "2026-01-02-abc1234-demo" / "matrix-quick", run_id=rid, worker="w2") as store:
        store.append(_result("pass", 6, rid))
    assert record.main(["--root", str(root), "--check"]) == 1


def test_the_committed_index_is_what_the_committed_results_generate() -> None:
    committed = (ROOT / "results" / "README.md").read_text(encoding="utf-8")
    assert committed == record.render(ROOT / "results"), \
        "results/README.md is stale: regenerate it with `python scripts/results_readme.py`"


@pytest.mark.parametrize("generation", ["interp", "sm90"])
def test_the_committed_render_indexes_are_what_the_committed_results_generate(generation: str) -> None:
    """A stale index costs a render time, never a verdict (tests/harness/test_render_index.py): still, it is kept
    fresh with the README."""
    from harness.store import render_index

    assert record.render_index_is_fresh(ROOT / "results" / generation), \
        f"results/{generation}/{render_index.INDEX_NAME} is stale: run `python scripts/results_readme.py`"


def test_a_differential_run_is_listed_as_such(tmp_path: Path) -> None:
    """A differential run's records are not verdicts: its folder once got a verdicts row that said nothing."""
    import json
    import shutil
    from collections import Counter

    root = _tree(tmp_path / "results")
    run = ROOT / "tests" / "harness" / "fixtures" / "differential_run"
    rid = "differential-sm90-20261128T131629-596ded"
    shutil.copytree(run, root / "sm90" / "differential" / rid)
    from harness.store import manifest

    manifest.seal(root / "sm90" / "differential" / rid / "cases.jsonl", manifest.load_key(create=True))  # a copy
    text = record.render(root)
    verdicts, diffs = text.split("## Verdicts", 1)[1].split("## Interpreter against the GPU", 1)
    assert "differential" not in verdicts
    row = next(line for line in diffs.splitlines() if line.startswith(f"| `sm90/differential/{rid}/`"))
    records = [json.loads(line) for line in (run / "cases.jsonl").read_text(encoding="utf-8").splitlines()]
    counts = Counter(r["class"] for r in records)
    classes = ", ".join(f"{counts[c]} {c}" for c in ("agree", "agree_within_contract", "interp_only_failure",
                                                      "gpu_only_failure", "both_fail", "not_comparable") if counts[c])
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:] == ["2026-11-28", "sm90", "NVIDIA H200", "torch 2.11.0+cu130, Triton 3.6.0", "d405659 (dirty)",
                         f"`{rid}`", str(len({r["adapter"] for r in records})), f"{len(records)}: {classes}"], cells


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="reads git's list of committed files")
def test_large_results_files_are_committed_gzipped() -> None:
    """A lent GPU machine copies the whole checkout (64 MiB with what a run carries): every results file git would
    commit over the limit is gzipped, except sealed verdict files (their manifest hashes the plain lines)."""
    import subprocess

    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard",
                             "results"], capture_output=True, text=True, check=True).stdout.splitlines()
    plain = [name for name in listed if not name.endswith((".gz", ".manifest"))
             and (ROOT / name).is_file() and (ROOT / name).stat().st_size > record.PLAIN_LIMIT_BYTES
             and not (ROOT / (name + ".manifest")).exists()]
    assert not plain, f"gzip these (gzip -n): {plain}"
