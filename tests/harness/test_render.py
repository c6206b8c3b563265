"""The support-matrix renderer: a small hand-written results file (two generations, a kernel with a failing
case, a stage kernel with an error, a not-verifiable case and a worker death, a test aid that hangs and returns
garbage on undeclared cells, a reference adapter) renders to the expected markdown kept next to it."""

from __future__ import annotations

import json
from pathlib import Path

from harness import cli
from harness.store.render import build, render_files, to_markdown
from harness.store.results import load_meta, load_results

FIXTURES = Path(__file__).parent / "fixtures"
RESULTS = FIXTURES / "matrix_results.jsonl"
EXPECTED = FIXTURES / "expected_matrix.md"
COMMAND = "python -m harness matrix --from tests/harness/fixtures/matrix_results.jsonl"


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
    for a in model["adapters"]:
        for ax in a["axes"]:
            for v in ax["values"]:
                if v["status"] == "pass":
                    assert v["passed"] == v["exercised"] > 0
                if v["status"] == "partial":
                    assert v["note"], (a["name"], ax["name"], v["value"])
    # a real verdict beats the parent's timeout marker for the same case
    toy = next(a for a in model["adapters"] if a["name"] == "toy-experts")
    assert toy["generations"]["interp"] == {"status": "pass", "exercised": 4, "passed": 4, "nonvacuous": None,
                                            "counts": {"pass": 4, "unsupported": 1}}


def test_non_vacuous_cases_are_counted_per_generation() -> None:
    """Verdicts that record what they exercised: the matrix says how many passing cases could have failed."""
    results = [r for r in load_results([RESULTS]) if r.adapter == "toy-experts" and r.generation == "interp"]
    passing = [r for r in results if r.verdict == "pass"]
    for i, r in enumerate(passing):
        r.metrics["exercised"] = {"vacuous": i == 0, "elements": 8, "nonzero": 0 if i == 0 else 8}
    model = build(results, load_meta([RESULTS]), command=COMMAND, sources=[])
    toy = next(a for a in model["adapters"] if a["name"] == "toy-experts")
    assert toy["generations"]["interp"]["nonvacuous"] == len(passing) - 1
    assert f"interp ({len(passing) - 1} non-vacuous)" in to_markdown(model)


def test_cli_renders_from_files_with_json_and_case_files(tmp_path: Path) -> None:
    out = tmp_path / "docs" / "MATRIX.md"
    assert cli.main(["matrix", "--from", str(RESULTS), "--out", str(out)]) == 0
    model = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
    assert model["verdicts"] == 20 and len(model["footnotes"]) == 6
    for rel in model["case_files"]:
        record = json.loads((out.parent / rel).read_text(encoding="utf-8"))
        assert record["verdict"] in ("fail", "error") and record["case"]["adapter"]
    text = out.read_text(encoding="utf-8")
    assert text.startswith("# Kernel-feature support matrix") and "MATRIX.cases/" in text
    assert render_files([RESULTS], out)[2] == 20


def test_a_fresh_sweep_merges_the_committed_results_of_other_generations(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from harness.commands.matrix import committed_other_generations

    for rel in ("interp/matrix-interp-1-a-main.jsonl", "sm90/matrix/matrix-sm90-2-b-w1.jsonl",
                "sm100/matrix-sm100-3-c-w2.jsonl", "local/matrix-sm90-4-d-w3.jsonl", "sm90/pytest/pytest-x.jsonl",
                "sm100/full/matrix-sm100-5-e-w4.jsonl.gz"):
        f = tmp_path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("")
    names = [f.name for f in committed_other_generations("sm90", str(tmp_path / "local"), root=str(tmp_path))]
    # not sm90, not local, not pytest; gzipped archives too
    assert sorted(names) == ["matrix-interp-1-a-main.jsonl", "matrix-sm100-3-c-w2.jsonl",
                             "matrix-sm100-5-e-w4.jsonl.gz"]
    names = [f.name for f in committed_other_generations("interp", str(tmp_path / "elsewhere"), root=str(tmp_path))]
    assert sorted(names) == ["matrix-sm100-3-c-w2.jsonl", "matrix-sm100-5-e-w4.jsonl.gz", "matrix-sm90-2-b-w1.jsonl"]


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
    """A result folder may hold tuning data (results/sm90/tune/*.jsonl): --from and diff skip it with a note, and
    still refuse a corrupt results file."""
    folder = tmp_path / "results"
    (folder / "tune").mkdir(parents=True)
    (folder / "run.jsonl").write_text(RESULTS.read_text(encoding="utf-8"), encoding="utf-8")
    (folder / "tune" / "split.jsonl").write_text('{"shape": "deepseek-v3", "M": 1, "us": 65.0}\n', encoding="utf-8")
    out = tmp_path / "MATRIX.md"
    assert cli.main(["matrix", "--from", str(folder), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count("note: skipped") == 1 and "split.jsonl: not a results file" in err
    alone = tmp_path / "alone.md"
    assert cli.main(["matrix", "--from", str(RESULTS), "--out", str(alone)]) == 0
    assert json.loads(out.with_suffix(".json").read_text())["adapters"] == \
        json.loads(alone.with_suffix(".json").read_text())["adapters"]
    assert cli.main(["diff", str(folder), str(RESULTS)]) == 0
    assert "split.jsonl: not a results file" in capsys.readouterr().err

    lines = RESULTS.read_text(encoding="utf-8").splitlines()
    (folder / "run.jsonl").write_text("\n".join([lines[0], '{"case": 1}', *lines[1:]]) + "\n", encoding="utf-8")
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
    out = tmp_path / "deep" / "docs" / "MATRIX.md"
    assert cli.main(["matrix", "--from", str(results), "--out", str(out)]) == 0
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.json"))
    assert written and all(str(p).startswith("deep/docs/") for p in written), written
    assert any("escaped" in p.name for p in written)


def test_footnotes_name_the_smallest_cause() -> None:
    """A failure that needs two features together (vLLM's bias scaled by the router weight with weight-on-input) is
    named by those two, not by the first four values the failing case happens to have (issue 18 item 5)."""
    from harness.core.case import Case
    from harness.core.result import Result
    from harness.store.render import _where

    axes = [{"name": n, "title": t} for n, t in (("activation", "Activation"), ("apply_weight_on_input",
             "Apply weight on input"), ("expert_map", "Expert map"), ("dtype", "Dtype"), ("bias", "Biases"))]

    def r(verdict: str, act: str, awoi: str, emap: str, dt: str, bias: str, seed: int) -> Result:
        f = {"activation": act, "apply_weight_on_input": awoi, "expert_map": emap, "dtype": dt, "bias": bias}
        case = Case(op="experts", adapter="a", features=f, shapes={"M": 3 + seed}, seed=seed)
        return Result(case=case, verdict=verdict)

    failing = [r("fail", "gelu", "Y", "Y", "float16", "Y", 1)]
    passing = [r("pass", "gelu", "Y", "Y", "float16", "N", 2), r("pass", "silu", "N", "Y", "float16", "Y", 3),
               r("pass", "gelu", "N", "N", "bfloat16", "Y", 4), r("pass", "silu", "Y", "N", "float32", "N", 5)]
    assert _where(failing, passing, axes, "") == "Apply weight on input = Y, Biases = Y"
    # one attribute that only the failing cases have is named alone
    passing.append(r("pass", "gelu", "N", "Y", "float16", "Y", 6))
    assert _where(failing, [p for p in passing if p.case.features["apply_weight_on_input"] == "N"], axes, "") == \
        "Apply weight on input = Y"
