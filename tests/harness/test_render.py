"""The support-matrix renderer: a small hand-written results file (two generations, a kernel with a failing
case, a stage kernel with an error, a not-verifiable case and a worker death, a test aid that hangs and returns
garbage on undeclared cells, a reference adapter) renders to the expected markdown kept next to it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from harness import cli
from harness.core.case import Case
from harness.core.result import Result
from harness.store import manifest
from harness.store.render import build, dedupe, render_files, to_markdown
from harness.store.results import load_meta, load_results

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"
RESULTS = FIXTURES / "matrix_results.jsonl"
EXPECTED = FIXTURES / "expected_matrix.md"
COMMAND = "python -m harness matrix --from tests/harness/fixtures/matrix_results.jsonl"


def _sealed(path: Path) -> Path:
    """A hand-written results file, given the manifest the judge of this machine would write (a render reads only
    results files whose manifest matches)."""
    manifest.seal(path, manifest.load_key(create=True))
    return path


def _model() -> dict:
    return build(load_results([RESULTS]), load_meta([RESULTS]), command=COMMAND,
                 sources=["tests/harness/fixtures/matrix_results.jsonl"])


def test_renders_the_expected_markdown() -> None:
    got = to_markdown(_model())
    expected = EXPECTED.read_text(encoding="utf-8")
    if got != expected:  # show the first differing line, not two whole documents
        for n, (a, b) in enumerate(zip(got.splitlines(), expected.splitlines()), 1):
            assert a == b, f"line {n} differs"
    assert got == expected


def test_every_failing_case_is_reported_and_nothing_failing_is_listed_as_passing() -> None:
    model = _model()
    results = load_results([RESULTS])
    failing = {(r.adapter, r.generation, r.case.case_id) for r in results
               if r.verdict in ("fail", "error") and "marker" not in r.metrics} | {
        ("toy-quant", "sm90", "4b1cb9189deb"), ("toy-wrong-quant", "interp", "7e7ecd3771b9")}
    dv = model["declared_vs_verified"]
    reported = {(r["adapter"], r["generation"], Path(r["case_file"]).stem.rsplit("-", 1)[-1])
                for r in dv["claimed_but_failing"] + dv["undeclared_not_rejected"]}
    assert reported == failing
    on_the_page = set()
    for a in model["adapters"]:
        on_the_page.update(a["notes"])
        for ax in a["axes"]:
            for v in ax["values"]:
                if v["status"] == "pass":
                    assert v["passed"] == v["exercised"] > 0 and not v["notes"]
                on_the_page.update(v["notes"])
    # every failing case is in one footnote, and every footnote is on a row or a value
    assert on_the_page == {n["id"] for n in model["footnotes"]}
    shown_failing = [r for r in dedupe(results) if r.verdict in ("fail", "error") and r.adapter != "reference"]
    assert sum(c for n in model["footnotes"] for c, _ in n["generations"].values()) == len(shown_failing)
    # a real verdict beats the parent's timeout marker for the same case
    toy = next(a for a in model["adapters"] if a["name"] == "toy-experts")
    assert toy["generations"]["interp"] == {"status": "pass", "exercised": 4, "passed": 4, "nonvacuous": None,
                                            "counts": {"pass": 4, "unsupported": 1}, "runs": ["1111111"]}


def test_non_vacuous_cases_are_counted_per_generation() -> None:
    """Verdicts that record what they exercised: the matrix says how many passing cases could have failed."""
    results = [r for r in load_results([RESULTS]) if r.adapter == "toy-experts" and r.generation == "interp"]
    passing = [r for r in results if r.verdict == "pass"]
    for i, r in enumerate(passing):
        r.metrics["exercised"] = {"vacuous": i == 0, "elements": 8, "nonzero": 0 if i == 0 else 8}
    model = build(results, load_meta([RESULTS]), command=COMMAND, sources=[])
    toy = next(a for a in model["adapters"] if a["name"] == "toy-experts")
    assert toy["generations"]["interp"]["nonvacuous"] == len(passing) - 1
    assert f"pass ({len(passing)}; {len(passing) - 1} non-vacuous) @ 1111111" in to_markdown(model)


def test_cli_renders_from_files_with_json_and_case_files(tmp_path: Path) -> None:
    out = tmp_path / "docs" / "MATRIX.md"
    assert cli.main(["matrix", "--from", str(RESULTS), "--out", str(out)]) == 0
    model = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
    assert model["verdicts"] == 20 and len(model["footnotes"]) == 5
    for rel in model["case_files"]:
        record = json.loads((out.parent / rel).read_text(encoding="utf-8"))
        assert record["verdict"] in ("fail", "error") and record["case"]["adapter"]
    text = out.read_text(encoding="utf-8")
    assert text.startswith("# Kernel-feature support matrix") and "MATRIX.cases/" in text
    assert render_files([RESULTS], out)[2] == 20


def test_a_sweep_merges_every_committed_result_file(tmp_path: Path) -> None:
    """The sweep once merged only `matrix-*` files of the other generations: the pytest plugin's verdicts and the
    cpu generation inside `matrix-interp-*` files were dropped from every matrix a sweep rendered."""
    from harness.commands.matrix import committed_folders, committed_results

    for rel in ("interp/matrix-interp-1-a-main.jsonl", "sm90/matrix/matrix-sm90-2-b-w1.jsonl",
                "sm100/matrix-sm100-3-c-w2.jsonl", "local/matrix-sm90-4-d-w3.jsonl", "sm90/pytest/pytest-x.jsonl",
                "sm100/full/matrix-sm100-5-e-w4.jsonl.gz", "external/local/matrix-interp-6-f-w5.jsonl",
                "sm90/run/matrix-sm90-7-g-main.jsonl", "sm90/notes.txt"):
        f = tmp_path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("")
    found = committed_results(str(tmp_path / "sm90" / "run"), root=str(tmp_path))
    # every generation (this one too), pytest verdicts, gzipped archives; not local folders nor this run's folder
    assert sorted(f.relative_to(tmp_path).as_posix() for f in found) == [
        "interp/matrix-interp-1-a-main.jsonl", "sm100/full/matrix-sm100-5-e-w4.jsonl.gz",
        "sm100/matrix-sm100-3-c-w2.jsonl", "sm90/matrix/matrix-sm90-2-b-w1.jsonl", "sm90/pytest/pytest-x.jsonl"]
    assert [Path(f).name for f in committed_folders(found, root=str(tmp_path))] == ["interp", "sm100", "sm90"]


def test_a_sweep_reads_the_committed_files_the_committed_matrix_was_rendered_from() -> None:
    from harness.commands.matrix import committed_results
    from harness.store.results import result_files

    sources = json.loads((ROOT / "docs" / "SUPPORT_MATRIX.json").read_text(encoding="utf-8"))["sources"]
    rendered_from = {p.resolve() for p in result_files([ROOT / s for s in sources])}
    assert {p.resolve() for p in committed_results(str(ROOT / "results" / "local"))} == rendered_from


def test_the_committed_matrix_re_renders_byte_identically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/SUPPORT_MATRIX.md, .json and case files are what the committed results render to, wherever rendered."""
    monkeypatch.chdir(ROOT)
    out = tmp_path / "elsewhere" / "SUPPORT_MATRIX.md"
    assert cli.main(["matrix", "--from", "results/interp", "results/sm90", "--out", str(out)]) == 0
    docs = ROOT / "docs"
    for name in ("SUPPORT_MATRIX.md", "SUPPORT_MATRIX.json"):
        assert (out.parent / name).read_bytes() == (docs / name).read_bytes(), f"docs/{name} is stale"
    cases = sorted(p.name for p in (out.parent / "SUPPORT_MATRIX.cases").iterdir())
    assert cases == sorted(p.name for p in (docs / "SUPPORT_MATRIX.cases").iterdir())
    for name in cases:
        assert (out.parent / "SUPPORT_MATRIX.cases" / name).read_bytes() == \
            (docs / "SUPPORT_MATRIX.cases" / name).read_bytes(), name


def _interp(verdict: str, triton: str, seconds: float, seed: int = 1, activation: str = "silu_and_mul") -> Result:
    case = Case(op="activation", adapter="k", features={"activation": activation, "dtype": "float32"},
                shapes={"M": seed}, seed=seed)
    return Result(case=case, verdict=verdict, reason=f"{verdict} on {triton}", generation="interp",
                  device={"triton_version": triton}, timestamp=1000.0 + seconds)


def test_a_verdict_of_another_triton_interpreter_is_shown_apart_never_merged() -> None:
    """A fresh machine's interpreter (another Triton) once replaced the committed interp verdicts and made
    false "claimed but failing" rows; each Triton's verdicts are their own generation now, named with it."""
    committed = [_interp("pass", "3.9.0", 0, seed) for seed in (1, 2)]
    local = [_interp("fail", "3.10.0", 100, 1), _interp("not-verifiable", "3.10.0", 100, 2)]
    model = build(committed + local)
    gens = [g["generation"] for g in model["generations"]]
    assert gens == ["interp (Triton 3.10.0)", "interp (Triton 3.9.0)"]
    assert [g["triton"] for g in model["generations"]] == [["3.10.0"], ["3.9.0"]]
    row = model["adapters"][0]["generations"]
    assert row["interp (Triton 3.9.0)"]["status"] == "pass" and row["interp (Triton 3.9.0)"]["exercised"] == 2
    assert [r["generation"] for r in model["declared_vs_verified"]["claimed_but_failing"]] == \
        ["interp (Triton 3.10.0)"]
    [record] = model["case_files"].values()
    assert record["generation"] == "interp" and all("Triton-3.10.0" in p for p in model["case_files"])
    assert "| interp (Triton 3.9.0) " in to_markdown(model)
    assert [g["generation"] for g in build(committed)["generations"]] == ["interp"]  # one Triton: as before


def test_a_not_verifiable_verdict_never_replaces_a_verified_one() -> None:
    """Later not-verifiable verdicts of the same interpreter fill only cells that nothing verified."""
    earlier = [_interp("pass", "3.9.0", 0, 1), _interp("fail", "3.9.0", 0, 2)]
    later = [_interp("not-verifiable", "3.9.0", 100, seed) for seed in (1, 2, 3)]  # seed 3: same cell, new case
    elsewhere = _interp("not-verifiable", "3.9.0", 100, 1, activation="gelu_and_mul")  # a cell nothing verified
    model = build(earlier + later + [elsewhere])
    counts = model["adapters"][0]["generations"]["interp"]["counts"]
    assert counts == {"fail": 1, "not-verifiable": 1, "pass": 1}
    assert [r["cases"] for r in model["declared_vs_verified"]["not_verifiable"]] == [1]


def _git(folder: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=folder, check=True,
                   capture_output=True)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_render_deletes_only_its_own_stale_case_files_and_never_committed_ones(tmp_path: Path) -> None:
    """A render once deleted every *.json of the case folder: committed case files and files of others too."""
    _git(tmp_path, "init", "-q")
    out = tmp_path / "docs" / "MATRIX.md"
    assert cli.main(["matrix", "--from", str(RESULTS), "--out", str(out)]) == 0
    committed = sorted((tmp_path / "docs" / "MATRIX.cases").iterdir())
    assert committed
    _git(tmp_path, "add", "docs")
    _git(tmp_path, "commit", "-q", "-m", "matrix")
    foreign = tmp_path / "docs" / "MATRIX.cases" / "kept-by-hand.json"
    foreign.write_text("{}")
    other = tmp_path / "other.jsonl"  # the same failures judged again: other case ids, other case files
    lines = [json.loads(line) for line in RESULTS.read_text(encoding="utf-8").splitlines()]
    for d in lines:
        if "case" in d:
            d["case"]["seed"] += 100
    other.write_text("".join(json.dumps(d) + "\n" for d in lines), encoding="utf-8")
    _sealed(other)
    assert cli.main(["matrix", "--from", str(other), "--out", str(out)]) == 0
    second = set((tmp_path / "docs" / "MATRIX.cases").iterdir()) - set(committed) - {foreign}
    assert second and all(p.exists() for p in committed)  # committed: kept although no longer listed
    passing = tmp_path / "passing.jsonl"
    passing.write_text("".join(json.dumps(d) + "\n" for d in lines if d.get("verdict") == "pass"), encoding="utf-8")
    _sealed(passing)
    assert cli.main(["matrix", "--from", str(passing), "--out", str(out)]) == 0
    assert not any(p.exists() for p in second)  # its own stale outputs, never committed: removed
    assert all(p.exists() for p in committed) and foreign.exists()


def test_selection_names_the_adapters_swept_in_full_next_to_a_pairwise_run() -> None:
    """A quick (pairwise) sweep merged with a full sweep of some adapters of the same op: the provenance must not
    read as if every adapter of the op had only the pairwise cells."""
    from harness.store.render import _selection_text

    sel = {"quick-kernel": {"selection": "pairwise", "cells": 58, "cells_total": 2640},
           "full-kernel": {"selection": "all", "cells": 2640, "cells_total": 2640}}
    infos = {"quick-kernel": {"op": "experts"}, "full-kernel": {"op": "experts"}}
    text = _selection_text(sel, infos, [])
    assert "experts 58 of 2640 (every cell for full-kernel)" in text
    assert "(every cell" not in _selection_text({"quick-kernel": sel["quick-kernel"]}, infos, [])


def test_from_skips_other_jsonl_in_result_folders_with_a_note(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """A result folder may hold tuning data (results/sm90/bench/*-tile-sweep/*.jsonl): --from and diff skip it with a
    note, and still refuse a corrupt results file."""
    folder = tmp_path / "results"
    (folder / "tune").mkdir(parents=True)
    (folder / "run.jsonl").write_text(RESULTS.read_text(encoding="utf-8"), encoding="utf-8")
    _sealed(folder / "run.jsonl")
    for name in ("split.jsonl", "tune.jsonl"):
        (folder / "tune" / name).write_text('{"shape": "deepseek-v3", "M": 1, "us": 65.0}\n', encoding="utf-8")
    out = tmp_path / "MATRIX.md"
    assert cli.main(["matrix", "--from", str(folder), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    # one line for them all, naming where; --verbose lists them
    assert err.count("note: skipped") == 1 and "skipped 2 files that hold no verdicts" in err
    assert f"under {folder / 'tune'}; --verbose lists them" in err and "split.jsonl" not in err
    assert cli.main(["matrix", "--from", str(folder), "--out", str(out), "--verbose"]) == 0
    assert "split.jsonl: its first line is not a result record" in capsys.readouterr().err
    alone = tmp_path / "alone.md"
    assert cli.main(["matrix", "--from", str(RESULTS), "--out", str(alone)]) == 0
    assert json.loads(out.with_suffix(".json").read_text())["adapters"] == \
        json.loads(alone.with_suffix(".json").read_text())["adapters"]
    assert cli.main(["diff", str(folder), str(RESULTS)]) == 0
    err = capsys.readouterr().err
    assert err.count("note: skipped") == 1 and "skipped 2 files" in err

    lines = RESULTS.read_text(encoding="utf-8").splitlines()
    (folder / "run.jsonl").write_text("\n".join([lines[0], '{"case": 1}', *lines[1:]]) + "\n", encoding="utf-8")
    assert cli.main(["matrix", "--from", str(folder), "--out", str(out)]) == 2  # a line added: left out
    assert "run.jsonl (does not match its manifest: 1 line changed)" in capsys.readouterr().err
    _sealed(folder / "run.jsonl")  # a judge that wrote a corrupt line: refused, naming it
    assert cli.main(["matrix", "--from", str(folder), "--out", str(out)]) == 2
    assert "run.jsonl:2: not a valid result record" in capsys.readouterr().err


def test_an_adapter_name_cannot_steer_case_files_out_of_their_folder(tmp_path: Path) -> None:
    """Names come from results files, which anyone can write: `../..` in one must not place a file elsewhere."""
    lines = []
    for line in RESULTS.read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        if "case" in d and d["verdict"] in ("fail", "error"):
            d["case"]["adapter"] = "../../../escaped"
        lines.append(json.dumps(d))
    results = tmp_path / "hostile.jsonl"
    results.write_text("\n".join(lines) + "\n", encoding="utf-8")
    _sealed(results)
    out = tmp_path / "deep" / "docs" / "MATRIX.md"
    assert cli.main(["matrix", "--from", str(results), "--out", str(out)]) == 0
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.json"))
    assert written and all(str(p).startswith("deep/docs/") for p in written), written
    assert any("escaped" in p.name for p in written)
