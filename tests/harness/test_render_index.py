"""The render index lets a render read past the files of runs the matrix no longer shows, and renders the same
matrix as reading every file: when files are added, when a run is resumed in a new file, when an indexed file changed
or is gone, and when the manifest gate leaves out a file of a shown run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.core.result import Result
from harness.store import manifest, record, render_index
from harness.store.render import render_files
from harness.store.results import ResultStore, load, result_files
from tests.harness.test_matrix_runs import _case, _sweep

DEVICE = {"device_name": "NVIDIA H100", "capability": [9, 0], "torch_version": "2.11", "triton_version": "3.6.0"}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """Three sweeps of kernel k: a (also the only one of `other`), b (complete, shown), c (later but cut short)."""
    root = tmp_path / "sm90"
    _sweep(root / "a", "matrix-sm90-a", "aaaaaaa", 100, {"k": ["pass", "fail"], "other": ["pass"]})
    _sweep(root / "b", "matrix-sm90-b", "bbbbbbb", 200, {"k": ["pass", "pass"]})
    _sweep(root / "c", "matrix-sm90-c", "ccccccc", 300, {"k": ["fail"]}, planned={"k": 2})
    record.write_render_index(root)
    return root


def _runs(root: Path, **kw) -> set[str]:  # type: ignore[no-untyped-def]
    results, meta = load(result_files([root]), skip_older=True, **kw)
    return {r.run_id for r in results} | {str(m.get("run_id")) for m in meta}


def _same_render(root: Path, tmp: Path) -> None:
    """The render of the folder, and of its files named one by one (index used), is the render of a copy without
    the index."""
    bare = tmp / "bare" / root.name
    shutil.copytree(root, bare)
    (bare / render_index.INDEX_NAME).unlink()
    want = render_files([bare], tmp / "want" / "M.md", shown_sources=["r"])
    for name, paths in (("dir", [root]), ("files", result_files([root]))):
        got = render_files(paths, tmp / name / "M.md", shown_sources=["r"])
        assert got[0].read_bytes() == want[0].read_bytes() and got[1].read_bytes() == want[1].read_bytes(), name


def test_the_index_marks_the_unshown_run_older_and_a_render_reads_past_it(tree: Path, tmp_path: Path) -> None:
    index = record.render_index_of(tree)
    older = {rel.split("/")[0] for rel, e in index["files"].items() if e["older"]}
    assert older == {"c"}
    assert record.render_index_is_fresh(tree)
    assert _runs(tree) == {"matrix-sm90-a", "matrix-sm90-b"}  # c's files were not read
    _same_render(tree, tmp_path)


def test_a_new_sweep_is_read_and_still_renders_the_same(tree: Path, tmp_path: Path) -> None:
    _sweep(tree / "d", "matrix-sm90-d", "ddddddd", 400, {"k": ["pass", "fail"]})
    assert not record.render_index_is_fresh(tree)  # stale, but still safe
    assert _runs(tree) == {"matrix-sm90-a", "matrix-sm90-b", "matrix-sm90-d"}
    _same_render(tree, tmp_path)


def test_files_of_other_data_are_told_once_when_the_read_starts_over(tree: Path, tmp_path: Path) -> None:
    """A read that starts over (the index no longer holds) names each file of other data once, not once a pass: the
    matrix collects differential runs that way."""
    (tree / "bench").mkdir()
    (tree / "bench" / "probe.jsonl").write_text('{"shape": "x", "us": 1.0}\n')
    told: list[Path] = []
    load(result_files([tree]), skip_older=True, on_skip=lambda path, why: told.append(path))
    assert told == [tree / "bench" / "probe.jsonl"]
    with ResultStore(tree / "c", run_id="matrix-sm90-c", worker="w2") as store:  # c resumed: read again, all
        store.append(Result(case=_case("k", 2), verdict="pass", generation="sm90",
                            device={**DEVICE, "commit": "ccccccc"}, timestamp=310))
    told.clear()
    load(result_files([tree]), skip_older=True, on_skip=lambda path, why: told.append(path))
    assert told == [tree / "bench" / "probe.jsonl"]


def test_a_run_resumed_in_a_new_file_reads_its_skipped_files(tree: Path, tmp_path: Path) -> None:
    # c's second case, written later in a file of its own: c is now complete and the latest, so it is shown
    with ResultStore(tree / "c", run_id="matrix-sm90-c", worker="w2") as store:
        store.append(Result(case=_case("k", 2), verdict="pass", generation="sm90",
                            device={**DEVICE, "commit": "ccccccc"}, timestamp=310))
    assert "matrix-sm90-c" in _runs(tree)
    results, _ = load([tree], skip_older=True)
    assert sum(r.run_id == "matrix-sm90-c" for r in results) == 2  # the skipped file was read after all
    _same_render(tree, tmp_path)


@pytest.mark.parametrize("how", ["changed", "gone"])
def test_an_indexed_file_that_changed_or_is_gone_turns_the_index_off(tree: Path, tmp_path: Path, how: str) -> None:
    target = next((tree / "b").glob("*-w1.jsonl"))
    if how == "changed":
        target.write_text(target.read_text() + "\n")
    else:
        target.unlink()
        manifest.manifest_path(target).unlink()
    assert "matrix-sm90-c" in _runs(tree)
    _same_render(tree, tmp_path)


def test_a_shown_file_left_out_by_the_gate_turns_the_index_off(tree: Path) -> None:
    shown = next((tree / "b").glob("*-w1.jsonl"))

    class LeavesOutB(manifest.Gate):
        def admit(self, path: Path, data: bytes) -> list[int] | None:
            if path == shown:
                self.notes.append(f"left out: {path}")
                return None
            return super().admit(path, data)

    gate = LeavesOutB()
    assert "matrix-sm90-c" in _runs(tree, gate=gate)  # c may be what the matrix shows now: read
    assert len(gate.notes) == 1  # named once, not once per pass


def _corrupt(index: dict, how: str) -> str:
    """The real index of the tree, one entry of a shown file (the first) and one of an older file broken `how`."""
    shown = next(rel for rel, e in index["files"].items() if not e["older"])
    older = next(rel for rel, e in index["files"].items() if e["older"])
    if how == "entry":
        index["files"][shown] = 3
    elif how == "sha":
        index["files"][older]["sha256"] = 1
    elif how == "runs":
        index["files"][older]["runs"] = "matrix-sm90-c"
    elif how == "older":
        index["files"][older]["older"] = "yes"
    return json.dumps(index)


@pytest.mark.parametrize("how", ["not json", "a list", "files a list", "another schema", "entry", "sha", "runs",
                                 "older"])
def test_an_index_that_is_not_one_is_not_used(tree: Path, tmp_path: Path, how: str) -> None:
    """A broken or foreign index never stops a render: it reads every file."""
    index = record.render_index_of(tree)
    text = {"not json": "{", "a list": "[1, 2]", "files a list": '{"schema": 1, "files": [1]}',
            "another schema": json.dumps({**index, "schema": 99})}.get(how) or _corrupt(index, how)
    (tree / render_index.INDEX_NAME).write_text(text)
    assert "matrix-sm90-c" in _runs(tree)
    _same_render(tree, tmp_path)
