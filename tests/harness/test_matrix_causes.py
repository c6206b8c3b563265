"""The matrix's footnotes are causes of failure: one per failing check (or exception type) and the facts that set its
cases apart, on the values those facts name (on the kernel's name when no feature value sets it apart), numbered in
reading order, with the reason in full and a bound of 0 called a bit-exact check."""

from __future__ import annotations

import dataclasses
import re

from harness.core.case import Case
from harness.core.causes import separate
from harness.core.result import Result
from harness.store.render import build, to_markdown

ACTIVATIONS = ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul")
DTYPES = ("bfloat16", "float16", "float32")
RESHAPE = "kernel raised: RuntimeError: cannot reshape tensor of 0 elements into shape [0, 2, -1] (at /x/y.py:131)"
OUT = ("out: 10 of 32 elements outside the error bound (margin 3.69); worst at [0, 5]: got -0.0022583, "
       "expected -0.00331116, bound 0.000285")


def _result(adapter: str, act: str, dtype: str, t: int, verdict: str = "pass", reason: str = "",
            seed: int = 1, **metrics: object) -> Result:
    case = Case(op="activation", adapter=adapter, features={"activation": act, "dtype": dtype},
                shapes={"T": t, "N": 8}, seed=seed)
    return Result(case=case, verdict=verdict, reason=reason, metrics=dict(metrics), generation="cpu",
                  device={"device_name": "x86_64", "commit": "abcdef0"}, run_id="r")


def _kernel(adapter: str, judge) -> list[Result]:  # type: ignore[no-untyped-def]
    """Every (activation, dtype) cell of `adapter` at T = 0 and T = 5, judged by `judge(act, dtype, t)`."""
    return [_result(adapter, a, d, t, *judge(a, d, t)) for a in ACTIVATIONS for d in DTYPES for t in (0, 5)]


def _empty_batch_raises(a: str, d: str, t: int) -> tuple[str, str]:
    return ("error", RESHAPE) if t == 0 else ("pass", "")


def _two_causes(a: str, d: str, t: int) -> tuple[str, str]:
    if a == "gelu_and_mul":
        return "error", "kernel raised: ValueError: gelu is not supported"
    return ("fail", OUT) if d == "bfloat16" else ("pass", "")


def _row(model: dict, name: str) -> dict:
    return next(a for a in model["adapters"] if a["name"] == name)


def _value_notes(row: dict) -> dict[tuple[str, str], list[int]]:
    return {(ax["name"], v["value"]): v["notes"] for ax in row["axes"] for v in ax["values"] if v["notes"]}


def test_one_cause_over_many_values_is_one_footnote_on_the_row() -> None:
    """vLLM's CPU grouped top-k fails only for an empty batch: its row once carried a footnote on every value,
    each blaming another value."""
    model = build(_kernel("k", _empty_batch_raises))
    [note] = model["footnotes"]
    row = _row(model, "k")
    assert row["notes"] == [note["id"]] and not _value_notes(row)
    assert note["text"].startswith("Fails for an empty batch (T = 0) on cpu (9 of 18 cases): raises "
                                   "`RuntimeError: cannot reshape tensor of 0 elements into shape [0, 2, -1]`")
    assert "<sup>" not in "".join(line for line in to_markdown(model).splitlines() if line.startswith("| k |"))[5:]


def test_two_causes_give_two_footnotes_each_on_its_value() -> None:
    model = build(_kernel("k", _two_causes))
    row = _row(model, "k")
    notes = {n["id"]: n for n in model["footnotes"]}
    assert len(notes) == 2 and row["notes"] == []
    by_value = _value_notes(row)
    assert set(by_value) == {("activation", "gelu_and_mul"), ("dtype", "bfloat16")}
    [gelu], [bf16] = by_value[("activation", "gelu_and_mul")], by_value[("dtype", "bfloat16")]
    assert notes[gelu]["text"].startswith("Fails for Activation = gelu_and_mul on cpu (6 of 18 cases): raises "
                                          "`ValueError: gelu is not supported`")
    assert notes[bf16]["text"].startswith(f"Fails for Dtype = bfloat16 on cpu (4 of 18 cases): {OUT}")
    text = to_markdown(model)
    # a value that only failed is listed struck through, with its footnote
    assert f"~~gelu_and_mul~~<sup>{gelu}</sup>" in text and f"~~bfloat16~~<sup>{bf16}</sup>" in text


def test_a_cause_no_value_sets_apart_goes_on_the_row() -> None:
    """The same cell passes at other sizes: no feature value separates the failure, so no value carries it."""
    results = [_result("k", a, d, t, seed=s) for a in ACTIVATIONS for d in DTYPES for t in (3, 5) for s in (1, 2)]
    results.append(_result("k", "silu_and_mul", "float32", 7, "fail", OUT))
    model = build(results)
    [note] = model["footnotes"]
    assert _row(model, "k")["notes"] == [note["id"]] and not _value_notes(_row(model, "k"))
    assert "no feature value sets apart" in note["text"]


def test_two_facts_together_name_a_cause_on_both_values() -> None:
    """A failure that needs two features together (vLLM's bias scaled by the router weight with weight-on-input) is
    named by those two, not by the first values the failing case happens to have."""
    def judge(a: str, d: str, t: int) -> tuple[str, str]:
        return ("fail", OUT) if (a, d) == ("gelu_and_mul", "float16") else ("pass", "")

    model = build(_kernel("k", judge))
    [note] = model["footnotes"]
    assert note["text"].startswith("Fails for Activation = gelu_and_mul with Dtype = float16 on cpu")
    assert _value_notes(_row(model, "k")) == {("activation", "gelu_and_mul"): [1], ("dtype", "float16"): [1]}


def test_separate_prefers_the_set_that_covers_most_cases() -> None:
    failing = [r for r in _kernel("k", _empty_batch_raises) if r.verdict != "pass"]
    fine = [r for r in _kernel("k", _empty_batch_raises) if r.verdict == "pass"]
    [(facts, cases)] = separate(failing, fine, ["activation", "dtype"])
    assert facts == (("shape", "T", "0"),) and len(cases) == len(failing)
    # silu_and_mul sets the first case apart, bfloat16 both: one cause, not two
    failing = [_result("k", "silu_and_mul", "bfloat16", 5, "fail", OUT), _result("k", "gelu_and_mul", "bfloat16", 5,
                                                                              "fail", OUT)]
    fine = [_result("k", "gelu_and_mul", "float16", 5), _result("k", "gelu_tanh_and_mul", "float32", 5)]
    [(facts, cases)] = separate(failing, fine, ["activation", "dtype"])
    assert facts == (("feature", "dtype", "bfloat16"),) and cases == failing


def _sups(markdown: str) -> list[int]:
    """The footnote numbers in the order a reader meets them in the kernel tables."""
    tables = markdown.split("## Runs shown", 1)[0]
    return [int(n) for group in re.findall(r"<sup>([\d,]+)</sup>", tables) for n in group.split(",")]


def test_footnotes_are_numbered_in_reading_order() -> None:
    """Third-party kernels come first, each table left to right and top to bottom: the first mark is 1 and each
    new mark is the next number (the committed matrix once started at 16)."""
    third_party = [dataclasses.replace(r, metrics={"library": "somelib 1.0"}) for r in _kernel("z-lib", _two_causes)]
    model = build([*_kernel("a-ours", _empty_batch_raises), *_kernel("b-ours", _two_causes), *third_party])
    marks = _sups(to_markdown(model))
    first_seen = list(dict.fromkeys(marks))
    assert first_seen == list(range(1, len(model["footnotes"]) + 1)) == [1, 2, 3, 4, 5]
    assert _row(model, "z-lib")["section"] == "third_party"
    assert set(_value_notes(_row(model, "z-lib"))) and min(min(v) for v in _value_notes(_row(model, "z-lib"))
                                                            .values()) == 1
    # the footnote list under each table is in the same order
    listed = [int(m) for m in re.findall(r"^(\d+)\. ", to_markdown(model), re.MULTILINE)]
    assert listed == sorted(listed)


def test_an_exact_check_is_called_bit_exact_and_values_are_never_cut() -> None:
    """A bound of 0 once printed as "margin 3.91e+297", and reasons were cut just before the values."""
    old = ("out: 22 of 32 elements outside the error bound (margin 3.91e+297); worst at [0, 0]: got -0.589844, "
           "expected -0.59375, bound 0")
    new = ("out: 22 of 32 elements outside the error bound (margin inf); worst at [0, 0]: got -0.589844, "
           "expected -0.59375, bound 0 (exact: the bound is 0 there)")
    for reason in (old, new):
        def judge(a: str, d: str, t: int, reason: str = reason) -> tuple[str, str]:
            return ("fail", reason) if d == "bfloat16" else ("pass", "")

        model = build(_kernel("k", judge))
        [note] = model["footnotes"]
        assert "out: 22 of 32 elements differ (bit-exact check); worst at [0, 0]: got -0.589844, expected -0.59375;" \
            in note["text"] + ";", note["text"]
        assert "e+" not in to_markdown(model) and "margin inf" not in to_markdown(model)
    # a real margin stays, with every value in full
    model = build(_kernel("k", _two_causes))
    assert any(OUT in n["text"] for n in model["footnotes"])
    long = "; ".join(f"check{i}: got 1.234567, expected 7.654321" for i in range(20))
    model = build(_kernel("k", lambda a, d, t: ("fail", long) if d == "float32" else ("pass", "")))
    text = model["footnotes"][0]["text"]
    assert text.endswith(" ...") and re.search(r"expected 7\.654321 \.\.\.$", text), text


def test_the_extra_runs_drawn_for_some_judgings_do_not_split_one_bug() -> None:
    """One wrong activation: the judgings that were drawn for the extra runs also fail those runs' checks; they are
    the same cause as the others (the draw is random), and a case wrong only on its repeated run is one of its own."""
    from harness.core.causes import what_failed

    plain = _result("k", "gelu_and_mul", "bfloat16", 5, "fail", OUT, failed_checks=["out"])
    drawn = _result("k", "gelu_and_mul", "float16", 5, "fail", OUT,
                    failed_checks=["out", "repeat:out", "fresh_inputs:out"])
    other_order = _result("k", "gelu_and_mul", "float32", 5, "fail", OUT,
                          failed_checks=["out", "fresh_inputs:out", "repeat:out"])
    assert what_failed(plain) == what_failed(drawn) == what_failed(other_order) == ("fail", "out")
    only_again = _result("k", "silu_and_mul", "bfloat16", 5, "fail", OUT,
                         failed_checks=["repeat:out", "fresh_inputs:out"])
    assert what_failed(only_again) == ("fail", "fresh_inputs:out, repeat:out")
