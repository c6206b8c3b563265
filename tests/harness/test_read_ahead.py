"""A render given the committed results read ahead (while a sweep judged) renders what a render reading every file
renders: with the read used, and with it refused when a file changed since, when a new file lies under an indexed
folder, or when the sweep's files hold a run the index let the read skip."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from harness.core.device import detect
from harness.core.result import Result
from harness.store import record, render
from harness.store.read_ahead import ReadAhead
from harness.store.render import render_files
from harness.store.results import ResultStore, result_files
from tests.harness.test_matrix_runs import DEVICE, _case, _sweep


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """Committed sweeps under an indexed folder (c cut short, so older), and a sweep of this machine outside it."""
    root = tmp_path / "results" / "sm90"
    _sweep(root / "a", "matrix-sm90-a", "aaaaaaa", 100, {"k": ["pass", "fail"], "other": ["pass"]})
    _sweep(root / "b", "matrix-sm90-b", "bbbbbbb", 200, {"k": ["pass", "pass"]})
    _sweep(root / "c", "matrix-sm90-c", "ccccccc", 300, {"k": ["fail"]}, planned={"k": 2})
    record.write_render_index(root)
    _sweep(tmp_path / "local", "matrix-sm90-d", "ddddddd", 400, {"other": ["fail", "pass"]})
    return root


def _own(tree: Path) -> list[Path]:
    return result_files([tree.parent.parent / "local"])


def _render(paths: list[Path], out: Path, ahead: ReadAhead | None = None) -> dict[str, bytes]:
    """The rendered markdown and JSON (named the same in every call's folder: the case files' links name it)."""
    told: list[str] = []
    md, js, _ = render_files(paths, out / "M.md", shown_sources=["r"], ahead=ahead,
                             on_skip=lambda path, why: told.append(path.name), on_left_out=told.append)
    return {"md": md.read_bytes(), "json": js.read_bytes(), "told": json.dumps(told).encode()}


def _loads(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The files of each `load` the render makes itself."""
    calls: list[list[str]] = []
    real = render.load

    def spy(paths, **kw):  # type: ignore[no-untyped-def]
        calls.append(sorted(Path(p).name for p in result_files(paths)))
        return real(paths, **kw)

    monkeypatch.setattr(render, "load", spy)
    return calls


def _both(tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, bytes], list[list[str]]]:
    """The render of the sweep's and the committed files with a read ahead of the committed ones, checked against
    the render without one; and the files of each `load` the render with it made itself."""
    committed = result_files([tree])
    paths = _own(tree) + committed
    want = _render(paths, tmp_path / "want")
    calls = _loads(monkeypatch)
    got = _render(paths, tmp_path / "got", _ahead(committed))
    assert got == want
    return got, calls


def _ahead(committed: list[Path]) -> ReadAhead:
    ahead = ReadAhead(committed)
    ahead.start()
    return ahead


def test_the_read_ahead_is_used_and_renders_the_same(tree: Path, tmp_path: Path, monkeypatch) -> None:
    (tree / "bench").mkdir()
    (tree / "bench" / "probe.jsonl").write_text('{"shape": "x", "us": 1.0}\n')  # other data: told, as before
    edited = tree / "a" / "matrix-sm90-a-w1.jsonl"  # no longer what its manifest vouches for: left out, and told
    edited.write_text(edited.read_text().replace("boom", "bang"))
    got, calls = _both(tree, tmp_path, monkeypatch)
    assert calls == [sorted(p.name for p in _own(tree))]  # the render read only the sweep's own files
    assert b"probe.jsonl" in got["told"] and b"left out" in got["told"]


def test_a_file_changed_after_the_read_is_read_again(tree: Path, tmp_path: Path, monkeypatch) -> None:
    committed = result_files([tree])
    ahead = _ahead(committed)
    ahead.take()  # the read is done before the change
    # run b (shown) gets one more verdict, with its manifest brought along: a change the render must show
    with ResultStore(tree / "b", run_id="matrix-sm90-b", worker="w1") as store:
        store.append(Result(case=_case("k", 7), verdict="fail", reason="late", generation="sm90",
                            device={**DEVICE, "commit": "bbbbbbb"}, timestamp=250))
    paths = _own(tree) + committed
    calls = _loads(monkeypatch)
    got = _render(paths, tmp_path / "got", ahead)
    assert len(calls) == 1 and len(calls[0]) == len(paths)  # every file read again
    monkeypatch.undo()
    assert got == _render(paths, tmp_path / "want")
    assert b"late" in got["json"]


def test_a_new_file_under_an_indexed_folder_is_read_with_the_rest(tree: Path, tmp_path: Path, monkeypatch) -> None:
    committed = result_files([tree])
    ahead = _ahead(committed)
    ahead.take()
    _sweep(tree / "e", "matrix-sm90-e", "eeeeeee", 500, {"k": ["fail", "fail"]})
    paths = _own(tree) + result_files([tree])
    calls = _loads(monkeypatch)
    got = _render(paths, tmp_path / "got", ahead)
    monkeypatch.undo()
    assert got == _render(paths, tmp_path / "want")
    assert len(calls) == 2 and len(calls[-1]) == len(paths)  # the sweep's files, then every file


def test_the_sweeps_files_holding_a_skipped_run_make_the_render_read_everything(tree: Path, tmp_path: Path,
                                                                                  monkeypatch) -> None:
    """A run the index calls older (c, cut short) resumed into this machine's folder: its skipped file is current
    again, which only a read of every file finds."""
    local = tree.parent.parent / "local"
    shutil.rmtree(local)
    with ResultStore(local, run_id="matrix-sm90-c", worker="w2") as store:
        store.append(Result(case=_case("k", 2), verdict="pass", generation="sm90",
                            device={**DEVICE, "commit": "ccccccc"}, timestamp=310))
    _, calls = _both(tree, tmp_path, monkeypatch)
    assert len(calls) == 2 and len(calls[-1]) == len(_own(tree)) + len(result_files([tree]))


def test_a_read_ahead_never_started_or_of_other_paths_is_not_used(tree: Path, tmp_path: Path, monkeypatch) -> None:
    committed = result_files([tree])
    paths = _own(tree) + committed
    want = _render(paths, tmp_path / "want")
    calls = _loads(monkeypatch)
    assert _render(paths, tmp_path / "idle", ReadAhead(committed)) == want
    assert len(calls) == 1 and len(calls[0]) == len(paths)
    # a read of the sweep's files and one committed file: the rest, under an indexed folder, cannot be added to it
    assert _render(paths, tmp_path / "other", _ahead(committed[:1] + _own(tree))) == want
    assert len(calls) == 3 and len(calls[-1]) == len(paths)


def test_a_sweep_calls_on_planned_once_its_plans_are_all_made(tmp_path: Path) -> None:
    from harness import sweep

    names = ["reference-activation", "reference-reduce"]
    seen: list[list[str]] = []

    def planned() -> None:
        meta = [json.loads(line) for line in (tmp_path / "r-main.jsonl").read_text().splitlines() if line.strip()]
        seen.append(sorted(m["adapter"] for m in meta if m.get("kind") == "adapter"))

    sweep.run_sweep(names, detect("cpu"), str(tmp_path), run_id="r", jobs=1, out=io.StringIO(), on_planned=planned)
    assert seen == [names]
