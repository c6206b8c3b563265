"""Bad inputs to `matrix --from`, `matrix --resume`, `matrix --results-dir` and `replay`: each gives one line and
the usage exit code (2) within seconds, and changes nothing. Each runs in a subprocess with a timeout, so that a
hang fails the test instead of hanging the suite."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.core.case import Case
from harness.core.result import Result
from harness.store.results import ResultStore, load

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "harness" / "fixtures" / "matrix_results.jsonl"
TIMEOUT_S = 120  # a hang fails here; a healthy refusal takes a few seconds (most of it importing torch)


def _cli(args: list[str], tmp_path: Path) -> tuple[int, str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MOE_HARNESS_KEY_FILE": str(tmp_path / "key")}
    t0 = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "harness", *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`{' '.join(args)}` hung ({TIMEOUT_S} s)")
    return done.returncode, done.stderr.strip(), time.monotonic() - t0


def _one_line_usage_error(rc: int, err: str, *words: str) -> None:
    assert rc == 2, err
    assert "\n" not in err and "Traceback" not in err and err.startswith("error: "), err
    for w in words:
        assert w in err, err


@pytest.fixture
def bad(tmp_path: Path) -> dict[str, Path]:
    found = {"fifo": tmp_path / "fifo.jsonl", "zero": tmp_path / "zero.jsonl", "case_fifo": tmp_path / "case.json",
             "case_zero": tmp_path / "zero-case.json", "dangling_dir": tmp_path / "with-dangling",
             "gz": tmp_path / "cut.jsonl.gz", "file": tmp_path / "a-file"}
    os.mkfifo(found["fifo"])
    os.mkfifo(found["case_fifo"])
    found["zero"].symlink_to("/dev/zero")
    found["case_zero"].symlink_to("/dev/zero")
    found["dangling_dir"].mkdir()
    (found["dangling_dir"] / "gone.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    whole = gzip.compress(FIXTURE.read_bytes())
    found["gz"].write_bytes(whole[: len(whole) // 2])
    found["file"].write_text("not a folder\n")
    return found


@pytest.mark.parametrize(("argv", "words"), [
    (["matrix", "--from", "{fifo}"], "is a FIFO"),
    (["matrix", "--from", "{zero}"], "is a character device"),
    (["matrix", "--from", "{dangling_dir}"], "gone.jsonl' is a dangling symbolic link"),
    (["matrix", "--from", "{gz}"], "cut.jsonl.gz' is a truncated or corrupt gzip file"),
    (["replay", "{case_fifo}"], "is a FIFO"),
    (["replay", "{case_zero}"], "is a character device"),
    (["matrix", "--results-dir", "{file}", "--adapter", "reference-activation"], "is a file, not a folder"),
    (["matrix", "--results-dir", "{file}"], "is a file, not a folder"),
], ids=["from-fifo", "from-dev-zero", "from-dangling-link", "from-truncated-gz", "replay-fifo", "replay-dev-zero",
        "results-dir-file", "results-dir-file-all-adapters"])
def test_a_bad_input_is_one_line_and_exit_2_without_hanging(argv: list[str], words: str, bad: dict[str, Path],
                                                            tmp_path: Path) -> None:
    args = [a.format(**{k: str(v) for k, v in bad.items()}) for a in argv]
    if args[0] == "matrix" and "--from" in args:
        args += ["--out", str(tmp_path / "out" / "M.md")]
    rc, err, spent = _cli(args, tmp_path)
    _one_line_usage_error(rc, err, words)
    assert spent < TIMEOUT_S / 2, f"refused, but only after {spent:.0f} s"
    assert not (tmp_path / "out").exists()
    assert bad["file"].read_text() == "not a folder\n"


def _case(seed: int) -> Case:
    return Case(op="activation", adapter="reference-activation",
                features={"activation": "silu_and_mul", "dtype": "float32"}, shapes={"T": 3, "N": 8}, seed=seed)


def _interrupted_run(folder: Path) -> Path:
    """A run cut short after three verdicts (its manifest's last checkpoint covers them)."""
    with ResultStore(folder, run_id="matrix-interp-cut", worker="main") as store:
        store.append_meta("run", {"generation": "interp", "profile": "quick", "commit": "aaaaaaa", "dirty": False})
        for seed in (1, 2, 3):
            store.append(Result(case=_case(seed), verdict="pass", generation="interp"))
    return store.path


def test_resume_over_a_corrupt_middle_line_names_it_and_changes_nothing(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOE_HARNESS_KEY_FILE", str(tmp_path / "key"))  # the key the command below uses
    folder = tmp_path / "results"
    path = _interrupted_run(folder)
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = lines[2][: len(lines[2]) // 2] + "\n"  # line 3: cut in the middle, more lines after it
    path.write_text("".join(lines))
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    rc, err, _ = _cli(["matrix", "--resume", "matrix-interp-cut", "--results-dir", str(folder), "--adapter",
                       "reference-activation", "--device", "cpu", "--out", ""], tmp_path)
    _one_line_usage_error(rc, err, "line 3 is not a valid result record", "--drop-bad-lines")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # nothing rewritten


def test_drop_bad_lines_leaves_them_in_the_file_and_out_of_every_read(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.store import manifest
    from harness.sweep import judged_before

    monkeypatch.setenv("MOE_HARNESS_KEY_FILE", str(tmp_path / "key"))
    folder = tmp_path / "results"
    path = _interrupted_run(folder)
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = lines[2][: len(lines[2]) // 2] + "\n"
    path.write_text("".join(lines))
    with pytest.raises(ValueError, match="line 3 is not a valid result record"):
        judged_before(str(folder), "matrix-interp-cut")
    done, notes = judged_before(str(folder), "matrix-interp-cut", drop_bad_lines=True)
    assert sorted(r.case.seed for r in done.values()) == [1, 3]  # line 3 held the second verdict
    assert notes and "dropped:" in notes[0] and "line 3" in notes[0]
    with pytest.warns(UserWarning, match=r"1 line\(s\) written before were not the judge's"), \
            ResultStore(folder, run_id="matrix-interp-cut", worker="main") as store:  # the resumed run goes on
        store.append(Result(case=_case(2), verdict="pass", generation="interp"))
    assert path.read_text().splitlines(keepends=True)[:len(lines)] == lines  # the bad line is kept in the file
    gate = manifest.Gate()
    results, _ = load([folder], gate=gate)
    assert sorted(r.case.seed for r in results) == [1, 2, 3]
    assert gate.notes == [f"left out: {path}: line 3 (excluded by its manifest)"], gate.notes


def test_a_gzip_archive_that_is_whole_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The truncated archive above is refused for being truncated, not for being gzip."""
    from harness.store import manifest

    monkeypatch.setenv("MOE_HARNESS_KEY_FILE", str(tmp_path / "key"))
    path = _interrupted_run(tmp_path / "results")
    gz = path.with_name(path.name + ".gz")
    gz.write_bytes(gzip.compress(path.read_bytes()))
    path.unlink()
    results, _ = load([gz], gate=manifest.Gate())
    assert [json.loads(json.dumps(r.case.seed)) for r in results] == [1, 2, 3]
