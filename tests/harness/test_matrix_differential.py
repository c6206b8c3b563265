"""The support matrix shows what the differential runs under its results folders found: per kernel and generation,
the latest run's cases per class and a note in plain words (a GPU-only failure names a replayable case; an
interpreter-only one is a fidelity defect). The fixture is a few records of a real H200 run, two of them turned
into disagreements; the expected counts are counted here from its lines."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

from harness.store import manifest
from harness.store.casefiles import read_case_file
from harness.store.render import render_files

FIXTURES = Path(__file__).parent / "fixtures"
RUN = FIXTURES / "differential_run"
RUN_ID = "differential-sm90-20261128T131629-596ded"
VERDICTS = FIXTURES / "matrix_results.jsonl"
# the columns as the section must show them (written out here, not read from the code under test)
CLASS_ORDER = ("agree", "agree_within_contract", "interp_only_failure", "gpu_only_failure", "nondeterministic",
               "both_fail", "not_comparable")
SECTION = "## Interpreter against the GPU"
NOTE = 3 + len(CLASS_ORDER)  # the note's column: after kernel, generation, cases and the classes


def _records() -> list[dict]:
    return [json.loads(line) for line in (RUN / "cases.jsonl").read_text(encoding="utf-8").splitlines()]


def _results(tmp_path: Path, *, with_run: bool = True) -> Path:
    """A results folder: the renderer's verdict fixture and, under sm90/differential/, the fixture run."""
    root = tmp_path / "results"
    (root / "interp").mkdir(parents=True)
    shutil.copy(VERDICTS, root / "interp" / VERDICTS.name)
    manifest.seal(root / "interp" / VERDICTS.name, manifest.load_key(create=True))  # a copy: vouched for here
    if with_run:
        shutil.copytree(RUN, root / "sm90" / "differential" / RUN_ID)
        manifest.seal(root / "sm90" / "differential" / RUN_ID / "cases.jsonl", manifest.load_key(create=True))
    return root


def _older_run(root: Path, records: list[dict]) -> None:
    """An earlier run of the same generation, every case of it not comparable: the matrix must not show it."""
    old = "differential-sm90-20261101T000000-000000"
    folder = root / "sm90" / "differential" / old
    folder.mkdir(parents=True)
    lines = [json.dumps({**r, "class": "not_comparable"}) for r in records[:3]]
    (folder / "cases.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "summary.md").write_text(f"# Differential run {old}\n", encoding="utf-8")
    manifest.seal(folder / "cases.jsonl", manifest.load_key(create=True))  # read: older, not left out


def _rows(text: str) -> dict[str, list[str]]:
    """The section's table: kernel -> its cells."""
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in body.splitlines() if line.startswith("| ")]
    assert rows[0][:3] == ["Kernel", "Generation", "Cases"]
    return {r[0]: r for r in rows[1:]}


def _render(paths: list, out: Path, skipped: list | None = None) -> tuple[str, dict]:
    md, js, _ = render_files(paths, out, on_skip=lambda p, why: (skipped if skipped is not None else []).append(p))
    return md.read_text(encoding="utf-8"), json.loads(js.read_text(encoding="utf-8"))


def test_the_matrix_has_a_row_per_kernel_with_the_latest_runs_counts(tmp_path: Path) -> None:
    root = _results(tmp_path)
    records = _records()
    _older_run(root, records)
    skipped: list = []
    text, model = _render([root], tmp_path / "out" / "M.md", skipped)
    rows = _rows(text)
    by = {}
    for r in records:
        by.setdefault(r["adapter"], Counter())[r["class"]] += 1
    assert sorted(rows) == sorted(by)
    for name, counts in by.items():
        want = [str(sum(counts.values()))] + [str(counts[c] or "") for c in CLASS_ORDER]
        assert rows[name][1] == "sm90" and rows[name][2:NOTE] == want, (name, rows[name])
    assert RUN_ID in text and "20261101T000000" not in text  # the latest run of sm90 only
    assert "NVIDIA H200" in text
    # agreement in plain words; a side that judged nothing is named with its verdicts
    assert rows["triton-align"][NOTE] == "CPU verdicts hold on sm90"
    assert rows["sglang-triton-experts"][NOTE] == ("CPU verdicts hold on sm90 in the 1 case(s) compared; 1 case(s) not "
                                                "compared (interpreter: 1 error)")
    assert not skipped  # the run's file is read, not reported as a file of other data
    assert [r["run"] for r in model["differential"]["runs"]] == [RUN_ID]


def test_a_gpu_only_failure_names_a_replayable_case_and_an_interpreter_only_one_a_fidelity_defect(
        tmp_path: Path) -> None:
    root = _results(tmp_path)
    out = tmp_path / "out" / "M.md"
    text, model = _render([root], out)
    rows = _rows(text)
    gpu_only = next(r for r in _records() if r["class"] == "gpu_only_failure")
    note = rows[gpu_only["adapter"]][NOTE]
    assert note.startswith("CPU verdicts do not cover its GPU code: 1 case(s) pass on the interpreter and fail on "
                           "sm90 (a device-dependent code path, or a declaration only the GPU exposes)"), note
    assert f"`{gpu_only['case_id']}`" in note
    # the case it names is a case file that replay reads, with the GPU's verdict
    row = next(r for r in model["differential"]["rows"] if r["adapter"] == gpu_only["adapter"])
    path = out.parent / row["case_files"]["gpu_only_failure"]
    assert f"]({row['case_files']['gpu_only_failure']})" in note
    case = read_case_file(path)
    assert case.case == gpu_only["replay"] and case.recorded["verdict"] == "fail"
    assert case.recorded["generation"] == "sm90"
    interp_only = next(r for r in _records() if r["class"] == "interp_only_failure")
    note = rows[interp_only["adapter"]][NOTE]
    assert note.startswith("interpreter fidelity defect: 1 case(s) fail on the interpreter and pass on sm90"), note
    assert f"`{interp_only['case_id']}`" in note
    for name, cells in rows.items():  # no other kernel is said to disagree
        if name not in (gpu_only["adapter"], interp_only["adapter"]):
            assert "fidelity" not in cells[NOTE] and "do not cover" not in cells[NOTE], cells


def test_the_run_is_found_among_files_as_a_sweep_passes_them(tmp_path: Path) -> None:
    """A sweep renders with the committed results as a list of files (`committed_results`), not folders."""
    from harness.commands.matrix import committed_results

    root = _results(tmp_path)
    files = committed_results(str(tmp_path / "local"), root=root)
    assert any(f.name == "cases.jsonl" for f in files)
    text, _ = _render(files, tmp_path / "out" / "M.md")
    assert set(_rows(text)) == {r["adapter"] for r in _records()}


def test_a_forged_line_appended_to_a_run_file_leaves_the_file_out_and_names_it(tmp_path: Path) -> None:
    """The run's cases.jsonl is read through its manifest as a results file is: intact, it is shown; with a line
    appended that its manifest does not vouch for (a forged agreement), it is left out and named in one line."""
    root = _results(tmp_path)
    notes: list[str] = []
    md, _, _ = render_files([root], tmp_path / "out" / "M.md", on_left_out=notes.append)
    assert not notes and SECTION in md.read_text(encoding="utf-8"), notes
    run_file = root / "sm90" / "differential" / RUN_ID / "cases.jsonl"
    forged = {**_records()[0], "adapter": "forged-kernel", "class": "agree"}
    with open(run_file, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(forged) + "\n")
    md, js, _ = render_files([root], tmp_path / "out" / "M.md", on_left_out=notes.append)
    text = md.read_text(encoding="utf-8")
    assert SECTION not in text and "forged-kernel" not in text
    assert json.loads(js.read_text(encoding="utf-8"))["differential"] == {"runs": [], "rows": []}
    assert len(notes) == 1 and "cases.jsonl" in notes[0] and "does not match its manifest: 1 line changed" \
        in notes[0], notes


def test_no_differential_run_no_section(tmp_path: Path) -> None:
    text, model = _render([_results(tmp_path, with_run=False)], tmp_path / "out" / "M.md")
    assert SECTION not in text
    assert model["differential"] == {"runs": [], "rows": []}


def test_a_nondeterministic_kernel_is_named_as_such_with_its_example() -> None:
    from harness.store import differential as store_diff

    said = store_diff.note({"agree": 3, "nondeterministic": 2}, "sm90", {"nondeterministic": "`abc123`"})
    assert "nondeterminism" in said and "2 case(s)" in said and "`abc123`" in said
    assert "CPU verdicts hold" not in said
