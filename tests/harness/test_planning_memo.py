"""What planning remembers to be fast (each op's cells and limit keys are made once, not three times per adapter)
never leaks between callers: a caller's changes to what it was given, and a spec's changed axes, are not served
back."""

from __future__ import annotations

import dataclasses

import pytest

from harness import ops
from harness.core import limits
from harness.ops.base import Axis


def test_a_callers_change_to_a_cell_is_not_served_to_the_next() -> None:
    spec = ops.get("activation")
    first = spec.all_cells()
    first[0]["activation"] = "changed"
    first.pop()
    again = spec.all_cells()
    assert again[0]["activation"] != "changed" and len(again) == len(first) + 1


def test_cells_follow_the_specs_axes(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = dataclasses.replace(ops.get("activation"))
    before = spec.all_cells()
    narrowed = tuple(Axis(a.name, a.title, a.values[:1]) for a in spec.axes)
    monkeypatch.setattr(spec, "axes", narrowed)
    assert len(spec.all_cells()) == 1 < len(before)


def test_an_ops_limit_keys_cannot_be_changed_by_a_caller() -> None:
    keys = limits.keys("experts")
    with pytest.raises(TypeError):
        keys["max_E"] = None  # type: ignore[index]
    assert "max_E" in limits.keys("experts")


def _counting(host) -> list[str]:  # type: ignore[no-untyped-def]
    """The kind of every request `host` is asked from now on."""
    asked: list[str] = []
    real = host.ask
    host.ask = lambda msg, *a, **k: asked.append(msg[0]) or real(msg, *a, **k)
    return asked


def test_a_listed_adapter_is_described_from_its_listing_until_its_host_starts_again() -> None:
    """Planning describes every adapter its host listed: from the listing's manifests, without a round trip each;
    a host started again since (its adapters imported anew) is asked."""
    from harness.engine import remote
    from harness.engine.host import Host

    host = Host("cpu")
    real = host.ask
    asked = _counting(host)
    try:
        specs = remote.expand(["reference-activation", "reference-reduce"], host=host).specs
        asked.clear()
        described = [remote.open_adapter(s, "cpu", host=host) for s in specs]
        assert "describe" not in asked and [a.name for a in described] == ["reference-activation", "reference-reduce"]
        assert real(("describe", specs[0]))["ok"] == remote._LISTED[host][1][specs[0]]  # what a describe answers
        host.close()
        host.start()
        remote.open_adapter(specs[0], "cpu", host=host)
        assert asked.count("describe") == 1
    finally:
        host.close()


def test_a_cells_shape_rule_is_asked_once_for_its_boundary_cases_with_the_same_answers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An adapter in a kernel host answers its shape rule for all of a cell's boundary cases in one request (it was
    a round trip each); the boundary cases fitted are those of asking one at a time."""
    from harness.engine import fitting, remote
    from harness.engine.host import Host

    spec = "tests.harness.fixtures.coverage_adapters:NEVER_FLOAT32"
    cells = [{"activation": "silu_and_mul", "dtype": dt} for dt in ("float32", "bfloat16")]
    fitted: dict[bool, list] = {}  # type: ignore[type-arg]
    for at_once in (True, False):
        host = Host("cpu")
        asked = _counting(host)
        try:
            adapter = remote.open_adapter(spec, "cpu", host=host)
            assert adapter.rule_kind == "shapes"
            if not at_once:  # every answer asked on its own, as before
                monkeypatch.setattr(fitting, "_ask_rules_at_once", lambda *a: None)
            asked.clear()
            fitted[at_once] = [fitting.boundary(adapter, c) for c in cells]
            fitted[at_once].append([fitting.accepted(adapter, None, c, f)  # each answer, as the plan reads it
                                    for c in cells for f in ops.get("activation").boundary(adapter, c)])
            if at_once:
                assert asked.count("rules") == len(cells) and asked.count("rule") < len(fitted[True][0]), asked
            else:
                assert "rules" not in asked and asked.count("rule") >= len(fitted[False][0])
        finally:
            host.close()
    assert fitted[True] == fitted[False]
    assert True in fitted[True][-1] and False in fitted[True][-1]  # float32's cases turned away, the others not
