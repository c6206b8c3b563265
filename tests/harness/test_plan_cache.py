"""Plans remembered per machine (harness.sweep.plan_cache): a remembered plan is the plan made fresh; a changed
declaration or adapter source makes a new key; an entry not signed with this machine's key is never used."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import harness.sweep as sweep
from harness import registry
from harness.sweep import plan_cache
from harness.sweep.selection import plan

ADAPTER = "reference-activation"


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cache and the machine's key in folders of this test's own, the cache turned on."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("MOE_HARNESS_KEY_FILE", str(tmp_path / "config" / "key"))
    monkeypatch.delenv(plan_cache.ENV, raising=False)
    return tmp_path / "cache" / "moe-harness" / "plans"


def _device() -> object:
    return type("Dev", (), {"generation": "interp"})()


def test_remembered_plan_is_the_fresh_plan(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    adapter = registry.resolve(ADAPTER)
    fresh = plan(adapter, "quick")
    first = sweep._planned(adapter, ADAPTER, "quick", _device())
    assert list(cache.glob("*.json")), "the judge's first plan was not kept"
    monkeypatch.setattr(sweep, "plan", lambda *a: pytest.fail("planned again although a signed entry matches"))
    again = sweep._planned(adapter, ADAPTER, "quick", _device())
    assert again == first == fresh
    assert [c.case_id for c in again.cases] == [c.case_id for c in fresh.cases]


def test_switched_off_keeps_nothing(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    monkeypatch.setenv(plan_cache.ENV, "off")
    sweep._planned(registry.resolve(ADAPTER), ADAPTER, "quick", _device())
    assert not cache.exists()


def test_a_changed_declaration_is_a_new_key() -> None:
    adapter = registry.resolve(ADAPTER)
    narrower = dataclasses.replace(adapter, support={**adapter.support, "dtype": ("float32",)})
    assert plan_cache.key(adapter, ADAPTER, "quick", "interp") != plan_cache.key(narrower, ADAPTER, "quick", "interp")
    assert plan_cache.key(adapter, ADAPTER, "quick", "interp") != plan_cache.key(adapter, ADAPTER, "full", "interp")


def test_an_edited_adapter_source_is_a_new_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "mods" / "plan_cached_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    module = package / "adapter.py"
    module.write_text("def requires(cell):\n    return None\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(package.parent))
    spec, adapter = "plan_cached_pkg.adapter:ADAPTER", registry.resolve(ADAPTER)
    before = plan_cache.key(adapter, spec, "quick", "interp")
    module.write_text("def requires(cell):\n    return 'no bf16' if cell['dtype'] == 'bfloat16' else None\n",
                      encoding="utf-8")
    assert plan_cache.key(adapter, spec, "quick", "interp") != before


def _entry(cache: Path) -> tuple[str, dict]:
    [path] = cache.glob("*.json")
    return path.stem, json.loads(path.read_text(encoding="utf-8"))


def test_an_entry_written_without_the_key_is_refused(cache: Path) -> None:
    adapter = registry.resolve(ADAPTER)
    fresh = sweep._planned(adapter, ADAPTER, "quick", _device())
    name, entry = _entry(cache)
    body = json.loads(entry["plan"])
    body["cases"] = body["cases"][:1]  # a planted plan: one case, the rest never judged
    forged = json.dumps(body, sort_keys=True)
    for mac in (plan_cache._sign(b"not this machine's key", name, forged), entry["hmac"], ""):
        (cache / f"{name}.json").write_text(json.dumps({"plan": forged, "hmac": mac}), encoding="utf-8")
        assert plan_cache.load(name) is None
        assert sweep._planned(adapter, ADAPTER, "quick", _device()) == fresh
        (cache / f"{name}.json").write_text(json.dumps({"plan": forged, "hmac": mac}), encoding="utf-8")


def test_an_entry_signed_for_another_key_is_refused(cache: Path) -> None:
    adapter = registry.resolve(ADAPTER)
    sweep._planned(adapter, ADAPTER, "quick", _device())
    name, entry = _entry(cache)
    (cache / f"{'0' * len(name)}.json").write_text(json.dumps(entry), encoding="utf-8")
    assert plan_cache.load("0" * len(name)) is None
    assert plan_cache.load(name) is not None


def test_another_library_version_or_entry_point_source_is_a_new_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A registered adapter's rules may live in the library it wraps or in a package registering it by entry point:
    the library's version (or why it is missing) and those packages' sources are in the key."""
    from harness.registry import Library

    adapter = registry.resolve(ADAPTER)

    class Installed(Library):
        def label(self) -> str:
            return self.written_for

        def missing(self) -> str | None:
            return None

    older, newer = (dataclasses.replace(adapter, library=Installed("somelib", "somelib", v, "")) for v in ("1", "2"))
    assert plan_cache.key(older, ADAPTER, "quick", "interp") != plan_cache.key(newer, ADAPTER, "quick", "interp")
    before = plan_cache.key(adapter, ADAPTER, "quick", "interp")
    monkeypatch.setattr(plan_cache, "_entry_point_sources", lambda: "edited")
    assert plan_cache.key(adapter, ADAPTER, "quick", "interp") != before


def _no_float16(device: object, features: dict) -> str | None:  # type: ignore[type-arg]
    return "no float16" if features.get("dtype") == "float16" else None


#: resolvable as tests.harness.test_plan_cache:CELL_RULED (a support rule of whole cells, asked in a host)
CELL_RULED = dataclasses.replace(registry.resolve(ADAPTER), name="cell-ruled", requires=_no_float16)


def test_the_rules_of_whole_cells_asked_at_once_answer_as_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planning asks the host for the rule's answer of every cell in one request (thousands of round trips
    otherwise): the answers are those asked one by one, and no cell is asked again."""
    from harness import ops
    from harness.engine import remote

    cells = ops.get("activation").all_cells()
    spec = "tests.harness.test_plan_cache:CELL_RULED"
    one = remote.open_adapter(spec, "cpu")
    try:
        singly = [one.claims(c) for c in cells]
    finally:
        remote.close_adapter(spec, "cpu")
    batch = remote.open_adapter(spec, "cpu")
    try:
        batch.prefetch_rules(None, cells)
        monkeypatch.setattr(remote, "_ask", lambda *a: pytest.fail(f"asked again: {a[1][:3]}"))
        assert [batch.claims(c) for c in cells] == singly
    finally:
        monkeypatch.undo()
        remote.close_adapter(spec, "cpu")
    assert True in singly and False in singly


def test_an_adapters_declared_and_undeclared_cells_ask_its_host_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each generic test lists the cells it draws from: asked one at a time, the experts' 3,360 cells were as many
    round trips to the kernel host, in every test of every adapter. Asked at once, the cells are the same."""
    from harness.core.device import detect
    from harness.engine import remote
    from harness.engine import strategies as hs

    spec, device = "tests.harness.test_plan_cache:CELL_RULED", detect("cpu")
    real = remote._ask
    for listed in (hs.declared_cells, hs.undeclared_cells):
        adapter = remote.open_adapter(spec, "cpu")
        asked: list[str] = []
        monkeypatch.setattr(remote, "_ask", lambda host, msg, what, asked=asked: asked.append(msg[0]) or
                            real(host, msg, what))
        try:
            cells = listed(adapter, device)
        finally:
            monkeypatch.undo()
            remote.close_adapter(spec, "cpu")
        assert cells and cells == listed(CELL_RULED, device), listed.__name__
        assert len(asked) <= 1, (listed.__name__, asked)
