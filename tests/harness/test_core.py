"""Self-tests of Case serialization, the results store and the comparison modes."""

from __future__ import annotations

import json

import pytest
import torch

from harness.core.case import Case
from harness.core.compare import compare_bounded, compare_codes, compare_exact, compare_set
from harness.store.results import Result, ResultsFileError, ResultStore, load_results

CASE = Case(op="experts", adapter="a", features={"activation": "silu"}, shapes={"M": 3, "K": 8}, seed=5,
            dtypes={"x": "bfloat16"}, params={"local_experts": 2, "scale": 2.5}, layout={"non_contiguous": True})


def test_case_round_trips_losslessly() -> None:
    again = Case.from_json(CASE.to_json())
    assert again == CASE and again.case_id == CASE.case_id


@pytest.mark.parametrize(("change", "message"), [
    ({"op": "nope"}, "Case.op must be one of"),
    ({"seed": -1}, "Case.seed must be a non-negative int"),
    ({"shapes": {"M": 1.5}}, r"Case.shapes\['M'\]"),
    ({"dtypes": {"x": "bf17"}}, "unknown dtype 'bf17'"),
    ({"routing": "zipf"}, "Case.routing must be one of"),
    ({"params": {"x": float("nan")}}, "must not be NaN"),
])
def test_bad_case_fields_are_named(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CASE.replace(**change)


def test_case_from_json_rejects_unknown_and_missing_fields() -> None:
    with pytest.raises(ValueError, match="unknown case field"):
        Case.from_dict({**CASE.to_dict(), "colour": 1})
    with pytest.raises(ValueError, match="missing field"):
        Case.from_dict({"op": "experts"})
    with pytest.raises(ValueError, match="not valid JSON"):
        Case.from_json("{")


def test_store_flushes_each_record_and_loader_tolerates_truncated_last_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = ResultStore(tmp_path, run_id="r", worker="gw0")
    for verdict in ("pass", "fail"):
        store.append(Result(case=CASE, verdict=verdict, metrics={"margin": 0.1}))
    assert len(store.path.read_text().splitlines()) == 2  # written before close: a crash loses nothing
    store.close()
    with open(store.path, "a") as fh:
        fh.write(json.dumps(Result(case=CASE, verdict="pass").to_dict())[:40])  # killed mid-write
    results = load_results([tmp_path])
    assert [r.verdict for r in results] == ["pass", "fail"] and results[0].case == CASE


def test_loader_reads_gzipped_archives(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Committed sweeps are gzipped: a folder of .jsonl and .jsonl.gz reads as one set, either file alone too."""
    import gzip

    lines = [json.dumps(Result(case=CASE, verdict=v).to_dict()) for v in ("pass", "fail", "unsupported")]
    (tmp_path / "a.jsonl").write_text(lines[0] + "\n")
    with gzip.open(tmp_path / "b.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write(lines[1] + "\n" + lines[2] + "\n")
    assert sorted(r.verdict for r in load_results([tmp_path])) == ["fail", "pass", "unsupported"]
    assert [r.verdict for r in load_results([tmp_path / "b.jsonl.gz"])] == ["fail", "unsupported"]


def test_loader_reports_real_corruption_with_file_and_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "bad.jsonl"
    p.write_text("not json\n" + json.dumps(Result(case=CASE, verdict="pass").to_dict()) + "\n")
    with pytest.raises(ResultsFileError, match=r"bad\.jsonl:1"):
        load_results([p])
    with pytest.raises(ResultsFileError, match="does not exist"):
        load_results([tmp_path / "missing"])


def test_exact_is_bitwise_and_nan_aware() -> None:
    a = torch.tensor([1.0, float("nan"), 0.0])
    assert compare_exact("t", a, torch.tensor([1.0, float("nan"), 0.0])).passed
    c = compare_exact("t", a, torch.tensor([1.0, float("nan"), -0.0]))
    assert not c.passed and c.metrics["mismatches"] == 1 and c.metrics["first_indices"] == [[2]]


def test_set_ignores_order_within_rows() -> None:
    assert compare_set("ids", torch.tensor([[3, 1], [0, 2]]), torch.tensor([[1, 3], [2, 0]])).passed
    c = compare_set("ids", torch.tensor([[3, 1], [0, 2]]), torch.tensor([[1, 3], [2, 1]]))
    assert not c.passed and "row [1]" in c.reason


def test_codes_counts_steps() -> None:
    assert compare_codes("q", torch.tensor([5, 7]), torch.tensor([6, 7]), k=1).passed
    assert not compare_codes("q", torch.tensor([5, 7]), torch.tensor([7, 7]), k=1).passed


def test_bounded_reports_margin_and_fails_nan() -> None:
    e = torch.tensor([1.0, 2.0])
    c = compare_bounded("y", torch.tensor([1.05, 2.0]), e, torch.tensor([0.1, 0.1]))
    assert c.passed and abs(c.metrics["margin"] - 0.5) < 1e-6
    c = compare_bounded("y", torch.tensor([1.0, float("nan")]), e, torch.tensor([0.1, 0.1]))
    assert not c.passed and c.metrics["mismatches"] == 1
    c = compare_bounded("y", torch.tensor([1.3, 2.0]), e, torch.tensor([0.1, 0.1]))
    assert not c.passed and "margin 3" in c.reason
    # a zero bound (a step judged bit-exact): equal passes with margin 0, any error is an infinite margin
    c = compare_bounded("y", torch.tensor([1.0, 2.0]), e, torch.tensor([0.0, 0.0]))
    assert c.passed and c.metrics["margin"] == 0.0
    c = compare_bounded("y", torch.tensor([1.0, 2.0 + 2**-20]), e, torch.tensor([0.1, 0.0]))
    assert not c.passed and c.metrics["margin"] == float("inf") and "exact: the bound is 0" in c.reason


def test_commit_override_for_copied_trees(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from harness.core.device import git_state

    monkeypatch.setenv("MOE_HARNESS_COMMIT", "0123abc+dirty")
    assert git_state() == ("0123abc", True)
    monkeypatch.setenv("MOE_HARNESS_COMMIT", "0123abc")
    assert git_state() == ("0123abc", False)
    monkeypatch.delenv("MOE_HARNESS_COMMIT")
    assert git_state()[0] != "0123abc"


def _strict(line: str) -> dict:
    def refuse(constant: str) -> None:
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(line, parse_constant=refuse)


def test_records_are_strict_json_even_with_infinite_metrics(tmp_path) -> None:  # type: ignore[no-untyped-def]
    r = Result(case=CASE, verdict="fail", reason="r", metrics={"margin": float("inf"), "worst": [float("nan"), 1.0],
                                                             "low": float("-inf")})
    with ResultStore(tmp_path, run_id="s") as store:
        store.append(r)
        store.append_meta("run", {"wall_s": float("nan")})
    lines = (tmp_path / "s.jsonl").read_text().splitlines()
    records = [_strict(line) for line in lines]  # Infinity / NaN would be refused here
    assert records[0]["metrics"] == {"margin": "inf", "worst": ["nan", 1.0], "low": "-inf"}
    (case_file,) = (tmp_path / "cases").glob("*.json")  # the failure's case file is strict too
    _strict(case_file.read_text())


def test_appending_after_a_partial_last_line_keeps_the_file_readable(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A worker killed mid-write leaves an unterminated line; a resumed run appending to the same file must not
    continue it (a corrupt line mid-file would make the whole file unreadable)."""
    with ResultStore(tmp_path, run_id="run", worker="main") as store:
        store.append(Result(case=CASE, verdict="pass"))
    path = tmp_path / "run-main.jsonl"
    path.write_text(path.read_text() + '{"case": {"op": "exp')  # killed mid-line
    with ResultStore(tmp_path, run_id="run", worker="main") as store:
        store.append(Result(case=CASE.replace(seed=6), verdict="pass"))
    got = load_results([tmp_path], strict=True)
    assert [r.case.seed for r in got] == [5, 6]
