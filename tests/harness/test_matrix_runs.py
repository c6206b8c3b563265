"""Each generation's column shows one run per kernel: the latest complete one (`current_runs`); older runs are
rendered only with `--history`, which says where a cell mixes runs; the committed results render to the same bytes
whatever order their files are read in, and with the older runs' files pruned."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from harness import cli
from harness.core.case import Case
from harness.core.result import Result
from harness.store.render import build, render_files, to_markdown
from harness.store.results import ResultStore, current_runs, load, partition_files, result_files

ROOT = Path(__file__).resolve().parents[2]
DEVICE = {"device_name": "NVIDIA H100", "capability": [9, 0], "torch_version": "2.11", "triton_version": "3.6.0"}


def _case(adapter: str, seed: int, dtype: str = "float32") -> Case:
    return Case(op="activation", adapter=adapter, features={"activation": "silu_and_mul", "dtype": dtype},
                shapes={"T": 3, "N": 8}, seed=seed)


def _sweep(folder: Path, run_id: str, commit: str, when: float, verdicts: dict[str, list[str]],
           planned: dict[str, int] | None = None, shard: str = "") -> None:
    """A sweep's files: its run record, each adapter's plan, and its verdicts (`planned`: cases per adapter, by
    default as many as it has verdicts)."""
    with ResultStore(folder, run_id=run_id, worker="main") as store:
        store.append_meta("run", {"generation": "sm90", "device": DEVICE, "profile": "quick", "commit": commit,
                                  "dirty": False, "shard": shard})
        for adapter, vs in verdicts.items():
            store.append_meta("adapter", {"adapter": adapter, "op": "activation", "generation": "sm90",
                                          "cases": (planned or {}).get(adapter, len(vs))})
    with ResultStore(folder, run_id=run_id, worker="w1") as store:
        for adapter, vs in verdicts.items():
            for i, v in enumerate(vs):
                store.append(Result(case=_case(adapter, i + 1), verdict=v, reason="" if v == "pass" else "boom",
                                    generation="sm90", device={**DEVICE, "commit": commit}, timestamp=when + i))


def test_the_latest_complete_run_of_each_kernel_is_current(tmp_path: Path) -> None:
    _sweep(tmp_path / "a", "matrix-sm90-a", "aaaaaaa", 100, {"k": ["pass", "fail"], "other": ["pass"]})
    _sweep(tmp_path / "b", "matrix-sm90-b", "bbbbbbb", 200, {"k": ["pass", "pass"]})
    # the latest run of `k` was cut short: one of its two planned cases has a verdict
    _sweep(tmp_path / "c", "matrix-sm90-c", "ccccccc", 300, {"k": ["fail"]}, planned={"k": 2})
    plugin = tmp_path / "plugin"  # the pytest plugin's verdicts: no sweep record, never preferred to a sweep
    with ResultStore(plugin, run_id="pytest-x", worker="gw0") as store:
        store.append(Result(case=_case("k", 9), verdict="fail", generation="sm90", device=DEVICE, timestamp=400))
    runs = current_runs([tmp_path])
    assert {k: r.commit for k, r in runs.items()} == {("sm90", "k"): "bbbbbbb", ("sm90", "other"): "aaaaaaa"}
    assert runs[("sm90", "k")].files == set((tmp_path / "b").glob("*.jsonl"))
    current, older = partition_files([tmp_path])
    assert current == sorted([*(tmp_path / "a").glob("*.jsonl"), *(tmp_path / "b").glob("*.jsonl")])
    assert older == sorted([*(tmp_path / "c").glob("*.jsonl"), *plugin.glob("*.jsonl")])

    md, js, n = render_files([tmp_path], tmp_path / "out" / "M.md")
    model = json.loads(js.read_text())
    k = next(a for a in model["adapters"] if a["name"] == "k")["generations"]["sm90"]
    assert (k["exercised"], k["passed"], k["runs"]) == (2, 2, ["bbbbbbb"]) and n == 3
    assert not model["declared_vs_verified"]["claimed_but_failing"]  # the older failure is not shown
    assert [(r["run"], r["kernels"]) for r in model["runs"]] == [("aaaaaaa", ["other"]), ("bbbbbbb", ["k"])]
    assert "pass (2) @ bbbbbbb" in md.read_text()


def test_history_renders_every_run_and_marks_the_cells_that_mix_them(tmp_path: Path) -> None:
    _sweep(tmp_path / "a", "matrix-sm90-a", "aaaaaaa", 100, {"k": ["pass", "fail"], "other": ["pass"]})
    _sweep(tmp_path / "b", "matrix-sm90-b", "bbbbbbb", 200, {"k": ["pass"]})  # judged the first case again
    results, meta = load([tmp_path])
    model = build(results, meta, history=True)
    k = next(a for a in model["adapters"] if a["name"] == "k")["generations"]["sm90"]
    assert k["runs"] == ["aaaaaaa", "bbbbbbb"] and (k["exercised"], k["passed"]) == (2, 1) and model["history"]
    text = to_markdown(model)
    tables, generations = text.split("## Runs shown")[0], text.split("## Generations")[1].split("## Declared")[0]
    for section in (tables, generations):  # the kernel's cell in its table and in the Generations table
        [row] = [line for line in section.splitlines() if re.match(r"\| k(<sup>[\d,]+</sup>)? ", line)]
        assert "mixes 2 runs" in row, row
    assert "pass (1) @ aaaaaaa" in generations  # one run only: no mixing said
    out = tmp_path / "out" / "M.md"
    assert cli.main(["matrix", "--from", str(tmp_path / "a"), str(tmp_path / "b"), "--history", "--out", str(out)]) == 0
    rendered = out.read_text()
    assert "mixes 2 runs" in rendered and "--history" in rendered.split("```")[1]
    assert cli.main(["matrix", "--from", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)]) == 0
    assert "mixes" not in out.read_text()


def test_the_shards_of_one_sweep_are_one_run(tmp_path: Path) -> None:
    """Shards run on several machines have run ids of their own; together they are one complete run."""
    _sweep(tmp_path / "old", "matrix-sm90-old", "aaaaaaa", 100, {"k": ["pass", "pass"]})
    for i, shard in enumerate(("1/2", "2/2")):
        _sweep(tmp_path / f"s{i}", f"matrix-sm90-s{i}-shard{i + 1}of2", "bbbbbbb", 200 + 10 * i,
               {"k": ["pass"]}, planned={"k": 2}, shard=shard)
    # different cases in each shard, as the planner splits them
    for i in (0, 1):
        path = next((tmp_path / f"s{i}").glob("*-w1.jsonl"))
        d = json.loads(path.read_text())
        d["case"]["seed"] = 10 + i
        path.write_text(json.dumps(d) + "\n")
    runs = current_runs([tmp_path])
    assert runs[("sm90", "k")].commit == "bbbbbbb" and len(runs[("sm90", "k")].ids) == 2


@pytest.fixture(scope="module")
def committed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed results rendered once (the JSON is next to it)."""
    out = tmp_path_factory.mktemp("first") / "SUPPORT_MATRIX.md"
    render_files([ROOT / "results/interp", ROOT / "results/sm90"], out, shown_sources=["results"],
                 on_skip=lambda path, why: None)
    return out


def test_the_committed_results_render_to_the_same_bytes_in_any_file_order(committed: Path, tmp_path: Path) -> None:
    first = committed
    files = result_files([ROOT / "results/interp", ROOT / "results/sm90"])
    random.Random(7).shuffle(files)
    _, older = partition_files([ROOT / "results/interp", ROOT / "results/sm90"])
    # with the files that hold only older runs pruned (other data, such as differential runs, is never pruned) the
    # same matrix renders too
    kept = [f for f in files if f not in set(older)]
    # (a second render in the fixture's own order would add nothing the shuffled one does not: 10 s of CI)
    for name, paths in (("shuffled", files), ("pruned", kept)):
        out = tmp_path / name / "SUPPORT_MATRIX.md"
        render_files(paths, out, shown_sources=["results"], on_skip=lambda path, why: None)
        assert out.read_bytes() == first.read_bytes(), name
        assert out.with_suffix(".json").read_bytes() == first.with_suffix(".json").read_bytes(), name


def test_each_generation_of_the_committed_matrix_shows_one_run_per_kernel(committed: Path) -> None:
    model = json.loads(committed.with_suffix(".json").read_text(encoding="utf-8"))
    for a in model["adapters"]:
        for g, s in a["generations"].items():
            assert len(s["runs"]) <= 1, (a["name"], g, s["runs"])
    runs = current_runs([ROOT / "results/interp", ROOT / "results/sm90"])
    shown = {(r["generation"], k) for r in model["runs"] for k in r["kernels"]}
    assert shown == set(runs)
