"""The adapter model: conventions validated against the one schema (harness.core.conventions), conventions that
depend on the case, support rules over combinations, devices and shapes, and the generated reference."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import registry
from harness.commands import conventions as conventions_command
from harness.core import conventions as conv
from harness.core.case import Case
from harness.core.device import detect
from harness.engine import runner
from harness.sweep.selection import plan

ROOT = Path(__file__).resolve().parents[2]
_REF = registry.resolve("reference-activation")
CASE = Case(op="activation", adapter="x", features={"activation": "silu_and_mul", "dtype": "float32"},
            shapes={"T": 3, "N": 8}, dtypes={"x": "float32"}, seed=1)


def _activation(**kw) -> registry.Adapter:  # type: ignore[no-untyped-def]
    return dataclasses.replace(_REF, name=kw.pop("name", "conv-test"), source="tests", **kw)


@pytest.mark.parametrize(("conventions", "words"), [
    ({"gate_ordr": "up_first"}, ["unknown convention 'gate_ordr'", "valid: gate_order, layout"]),
    ({"gate_order": "upfirst"}, ["gate_order='upfirst'", "'gate_first', 'up_first'"]),
    ({"alpha": "big"}, ["alpha must be a number"]),
])
def test_a_bad_convention_is_an_error_naming_the_key_and_the_valid_ones(conventions: dict, words: list) -> None:
    with pytest.raises(ValueError) as e:
        _activation(conventions=conventions)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_recipe_conventions_are_checked_field_by_field() -> None:
    ref = registry.resolve("reference-experts")
    with pytest.raises(ValueError, match="act_quant has unknown field 'epsilon'"):
        dataclasses.replace(ref, name="x", conventions={"act_quant": {"epsilon": 1e-4}})
    with pytest.raises(ValueError, match=r"application='divid'"):
        dataclasses.replace(ref, name="x", conventions={"act_quant": {"application": "divid"}})


def test_the_cli_refuses_an_adapter_with_a_misspelled_convention(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "harness", "matrix", "--device", "cpu", "--adapter",
                        "tests.harness.fixtures.bad_conventions_adapter:ADAPTER", "--results-dir", str(tmp_path),
                        "--out", ""], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "unknown convention 'gate_ordr'" in p.stderr and "gate_order" in p.stderr, p.stderr[-2000:]


def test_every_registered_adapter_states_valid_conventions() -> None:
    for a in registry.all_adapters():
        conv.validate(a.op, a.conventions, a.name)


def test_every_convention_key_is_read_by_the_harness() -> None:
    """A key nothing reads is a promise the oracle does not keep (the old `expert_map_convention`)."""
    sources = "\n".join(p.read_text() for p in (ROOT / "harness/ops").glob("*.py"))
    for op, entries in conv.BY_OP.items():
        for c in entries:
            assert re.search(rf"[\"']{c.key}[\"']", sources), f"{op}: convention {c.key!r} is read nowhere"


def test_conventions_that_depend_on_the_case_are_followed() -> None:
    """The kernel computes gate-first; an adapter that says up-first for float32 only must fail there alone."""
    def rule(case: Case, device: object) -> dict:
        return {"gate_order": "up_first"} if case.features["dtype"] == "float32" else {}

    a = _activation(conventions_for=rule)
    assert runner.judge(CASE, a, detect("cpu")).verdict == "fail"
    bf16 = CASE.replace(features={**CASE.features, "dtype": "bfloat16"}, dtypes={"x": "bfloat16"})
    assert runner.judge(bf16, a, detect("cpu")).verdict == "pass"


def test_case_dependent_conventions_are_validated_too() -> None:
    a = _activation(conventions_for=lambda case, device: {"gate_order": "sideways"})
    r = runner.judge(CASE, a, detect("cpu"))
    assert r.verdict == "error" and "gate_order='sideways'" in r.reason, r.reason


def _never_run(case, inputs, outputs):  # type: ignore[no-untyped-def]
    raise AssertionError("the kernel ran")


def test_a_support_rule_over_shapes_reports_the_case_unsupported_without_running_it() -> None:
    def rule(device, features, shapes):  # type: ignore[no-untyped-def]
        return "T > 2 only" if shapes is not None and shapes["T"] > 2 else None

    a = _activation(requires=rule, run=_never_run)
    r = runner.judge(CASE, a, detect("cpu"))
    assert r.verdict == "unsupported" and "T > 2 only" in r.reason and r.declared, r.reason


def test_the_planner_follows_the_support_rule() -> None:
    """A combination the rule excludes is planned as undeclared (one case to see it rejected), not as declared."""
    def rule(device, features):  # type: ignore[no-untyped-def]
        return "no gelu in float16" if features == {"activation": "gelu_and_mul", "dtype": "float16"} else None

    p = plan(_activation(requires=rule), "quick")
    count = {tuple(sorted(c.features.items())): 0 for c in p.cases}
    for c in p.cases:
        count[tuple(sorted(c.features.items()))] += 1
    excluded = tuple(sorted({"activation": "gelu_and_mul", "dtype": "float16"}.items()))
    assert count[excluded] == 1 and max(count.values()) > 1


def test_a_device_rule_still_works_when_planning_without_a_device() -> None:
    a = _activation(requires=lambda device, features: "needs sm90" if device.generation != "sm90" else None)
    assert a.declares(CASE.features)[0]  # planning: cannot tell, so declared
    assert not a.declares(CASE.features, detect("cpu"))[0]


def test_the_committed_conventions_reference_is_current() -> None:
    committed = (ROOT / "docs/CONVENTIONS.md").read_text()
    assert committed == conventions_command.render(), \
        "docs/CONVENTIONS.md is stale: run python -m harness conventions --out docs/CONVENTIONS.md"
