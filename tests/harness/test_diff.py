"""`harness diff` on two small fixed result sets (interp vs sm90): which cells differ, the exact table, the case files
named to replay them, exit codes."""

from __future__ import annotations

import json

from harness.cli import main
from harness.commands.diff import diff, load_side, to_markdown
from harness.core.case import Case
from harness.store.results import Result, ResultStore


def _r(adapter: str, act: str, dtype: str, seed: int, verdict: str, gen: str, t: float = 1.0) -> Result:
    case = Case(op="activation", adapter=adapter, features={"activation": act, "dtype": dtype},
                shapes={"T": 3, "N": 8}, dtypes={"x": dtype}, seed=seed)
    return Result(case=case, verdict=verdict, reason=f"{verdict} reason", generation=gen, timestamp=t,
                  device={"torch_version": "2.x", "commit": "abc"})


def _a() -> list[Result]:
    g = "interp"
    return [
        _r("k", "silu_and_mul", "float32", 0, "pass", g), _r("k", "silu_and_mul", "float32", 1, "fail", g, t=0.5),
        _r("k", "silu_and_mul", "float32", 1, "pass", g, t=2.0),  # a later run of the same case: this one counts
        _r("k", "silu_and_mul", "float16", 0, "fail", g),
        _r("k", "gelu_and_mul", "float32", 0, "fail", g), _r("k", "gelu_and_mul", "float32", 1, "pass", g),
        _r("k", "relu2_no_mul", "float32", 0, "pass", g),
        _r("other", "silu_and_mul", "float32", 0, "error", g),
    ]


def _b() -> list[Result]:
    g = "sm90"
    return [
        _r("k", "silu_and_mul", "float32", 0, "pass", g), _r("k", "silu_and_mul", "float32", 1, "fail", g),
        _r("k", "silu_and_mul", "float16", 0, "fail", g),
        _r("k", "gelu_and_mul", "float32", 0, "pass", g), _r("k", "gelu_and_mul", "float32", 1, "fail", g),
        _r("k", "silu_and_mul", "bfloat16", 0, "unsupported", g),
        _r("other", "silu_and_mul", "float32", 0, "pass", g),
    ]


def _write(tmp_path):  # type: ignore[no-untyped-def]
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    # A: a bare JSONL file (no case files next to it); B: through the store, which writes case files of failures
    (a / "run.jsonl").write_text("".join(json.dumps(r.to_dict()) + "\n" for r in _a()))
    with ResultStore(b, run_id="run") as store:
        for r in _b():
            store.append(r)
    return a, b


def _id(adapter: str, act: str, dtype: str, seed: int) -> str:
    return _r(adapter, act, dtype, seed, "pass", "").case.case_id


def test_diff_table_and_case_files(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _write(tmp_path)
    monkeypatch.chdir(tmp_path)
    d = diff(load_side("a"), load_side("b"))
    assert [(x.adapter, x.cell) for x in d.differing] == [
        ("k", "activation=gelu_and_mul, dtype=float32"),  # fails on both, but in different cases
        ("k", "activation=silu_and_mul, dtype=float32"),
        ("other", "activation=silu_and_mul, dtype=float32"),
    ]
    assert d.same == 1 and len(d.only_a) == 1 and len(d.only_b) == 1
    text = to_markdown(d, cases_dir="out-cases")
    gelu_a, gelu_b = _id("k", "gelu_and_mul", "float32", 0), _id("k", "gelu_and_mul", "float32", 1)
    silu_b, other_a = _id("k", "silu_and_mul", "float32", 1), _id("other", "silu_and_mul", "float32", 0)
    expected = f"""\
# Verdict differences: A = a vs B = b

- A: a (interp; 7 cases)
- B: b (sm90; 7 cases)

| adapter | cell | A | B | replay |
|---|---|---|---|---|
| k | activation=gelu_and_mul, dtype=float32 | fail (1 of 2; 1 pass) | fail (1 of 2; 1 pass) | \
A: `python -m harness replay out-cases/{gelu_a}.json`<br>B: `python -m harness replay b/cases/{gelu_b}.json` |
| k | activation=silu_and_mul, dtype=float32 | pass (2) | fail (1 of 2; 1 pass) | \
B: `python -m harness replay b/cases/{silu_b}.json` |
| other | activation=silu_and_mul, dtype=float32 | error (1) | pass (1) | \
A: `python -m harness replay out-cases/{other_a}.json` |

3 cell(s) differ, 1 agree; 1 only in A, 1 only in B (listed with --all).
"""
    assert text == expected
    written = json.loads((tmp_path / "out-cases" / f"{other_a}.json").read_text())
    assert written["verdict"] == "error" and written["generation"] == "interp" and written["adapter"] == "other"
    assert (tmp_path / "b" / "cases" / f"{gelu_b}.json").is_file()
    listed = to_markdown(d, cases_dir="out-cases", list_all=True)
    assert "| k | activation=relu2_no_mul, dtype=float32 | pass (1) | not run | - |" in listed
    assert "| k | activation=silu_and_mul, dtype=bfloat16 | not run | unsupported (1) | - |" in listed


def test_diff_cli_exit_codes(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    _write(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["diff", "a", "b", "--cases-dir", "c"]) == 1
    assert "3 cell(s) differ" in capsys.readouterr().out
    assert main(["diff", "b", "b"]) == 0
    assert "No cell differs." in capsys.readouterr().out
    assert main(["diff", "a", "missing"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_diff_per_generation_when_both_sides_hold_the_same_generations(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cell = ("k", "silu_and_mul", "float32", 0)
    one = [_r(*cell, "pass", "interp"), _r(*cell, "pass", "sm90")]
    two = [_r(*cell, "pass", "interp"), _r(*cell, "fail", "sm90")]
    for name, rs in (("one", one), ("two", two)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r.to_dict()) + "\n" for r in rs))
    d = diff(load_side(tmp_path / "one.jsonl"), load_side(tmp_path / "two.jsonl"))
    assert [(x.cell, x.generation) for x in d.differing] == [("activation=silu_and_mul, dtype=float32", "sm90")]
    assert "| adapter | cell | generation | A | B | replay |" in to_markdown(d, cases_dir=tmp_path / "c")


def test_diff_given_a_case_file_says_it_takes_result_stores(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    _write(tmp_path)
    monkeypatch.chdir(tmp_path)
    case_file = sorted((tmp_path / "b" / "cases").glob("*.json"))[0]  # a case file the store wrote
    for first, second in ((str(case_file), "a"), ("a", str(case_file))):
        assert main(["diff", first, second]) == 2
        err = capsys.readouterr().err
        assert "is a case file" in err and "result stores" in err and f"harness replay {case_file}" in err, err
        assert "not a valid result record" not in err and "JSON" not in err.split("not results")[0], err
    rendered = tmp_path / "m.json"  # another JSON document: a rendered matrix's
    rendered.write_text(json.dumps({"sources": ["a"], "adapters": []}, indent=1))
    assert main(["diff", "a", str(rendered)]) == 2
    assert "is a JSON document, not results" in capsys.readouterr().err
