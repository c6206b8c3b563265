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
