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


def test_a_listed_adapter_is_described_from_its_listing_until_its_host_starts_again() -> None:
    """Planning describes every adapter its host listed: from the listing's manifests, without a round trip each;
    a host started again since (its adapters imported anew) is asked."""
    from harness.engine import remote
    from harness.engine.host import Host

    host = Host("cpu")
    asked: list[str] = []
    real = host.ask
    host.ask = lambda msg, *a, **k: asked.append(msg[0]) or real(msg, *a, **k)  # type: ignore[method-assign]
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
