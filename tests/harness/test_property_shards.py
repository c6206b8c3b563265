"""How many shards each adapter's property test is split into (`harness.plugin.schedule.shards_for`): a long one
recorded in the durations file gets more, so that no item of a parallel GPU run goes past about a minute and a
half; each item is then expected to take its adapter's recorded total over its shard count."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from harness import plugin
from harness.plugin import schedule
from harness.plugin.schedule import (
    ITEM_TARGET_S,
    MAX_SHARDS,
    SPLIT_ABOVE_S,
    Expected,
    property_seconds,
    shards_for,
)

GENERIC = "harness/plugin/generic.py::test_declared_cases_pass"
#: the longest an item may take in the GPU suite
ITEM_LIMIT_S = 90.0


def _recorded(seconds: dict[str, list[float]]) -> dict[str, float]:
    """A durations file's entries: each adapter's property test recorded as one item per shard."""
    found = {f"{GENERIC}[{name}-shard{i}]": s for name, shards in seconds.items() for i, s in enumerate(shards)}
    found["tests/harness/test_other.py::test_x"] = 5.0
    return found


def test_a_long_property_test_is_split_into_more_shards() -> None:
    # the SGLang shards of the GPU suite before: 340 s and 285 s among four
    durations = _recorded({"slow": [340.0, 285.0, 40.0, 35.0], "fast": [10.5] * 4, "huge": [3000.0] * 4,
                           "short": [6.0, 6.0, 2.0, 6.0]})
    assert property_seconds(durations) == {"slow": 700.0, "fast": 42.0, "huge": 12000.0, "short": 20.0}
    assert shards_for("slow", durations, base=4) == MAX_SHARDS  # its heaviest share: 340 s x 4 / 60 s = 23
    even = _recorded({"even": [100.0] * 4, "uneven": [150.0, 50.0, 100.0, 100.0]})
    assert shards_for("even", even, base=4) == 7  # 400 s / 60 s
    assert shards_for("uneven", even, base=4) == 10  # the same 400 s, but one share of 150 s: 600 s / 60 s
    assert shards_for("fast", durations, base=4) == 4  # not fewer than the session's count past SPLIT_ABOVE_S
    assert shards_for("short", durations, base=4) == 1  # under it: one item, one kernel host start
    assert shards_for("short", durations, base=1) == 1
    assert shards_for("unknown", durations, base=4) == 4
    assert shards_for("huge", durations, base=4) == MAX_SHARDS
    assert shards_for("slow", durations, base=1) == 1  # a session that does not split (CPU, few workers)
    # recorded under another shard count (unsplit here): the same total
    assert shards_for("slow", {f"{GENERIC}[slow-shard0]": 700.0}, base=2) == 12


def test_a_short_property_test_is_one_item() -> None:
    """Recorded under SPLIT_ABOVE_S (its heaviest share times its shards: 9 s x 4 = 36 s), an adapter's property
    test is one item however many shards it was recorded with; at or past it, the session's count."""
    assert SPLIT_ABOVE_S == 40.0
    assert shards_for("a", _recorded({"a": [9.0, 5.0, 5.0, 5.0]}), base=4) == 1
    assert shards_for("a", _recorded({"a": [39.0]}), base=4) == 1
    assert shards_for("a", _recorded({"a": [10.0, 5.0, 5.0, 5.0]}), base=4) == 4
    assert shards_for("a", _recorded({"a": [20.0, 20.0]}), base=2) == 2


def test_no_item_is_expected_past_the_limit_where_the_cap_allows() -> None:
    rng = random.Random(7)
    for _ in range(200):
        recorded = {f"a{n}": [rng.uniform(0, 300) for _ in range(rng.choice([1, 2, 4]))] for n in range(8)}
        durations = _recorded(recorded)
        base = rng.choice([2, 4])
        plan = {name: shards_for(name, durations, base) for name in recorded}
        ids = [f"{GENERIC}[{name}-shard{i}]" for name, count in plan.items() for i in range(count)]
        expected = Expected(durations, ids)
        for name, count in plan.items():
            total = sum(recorded[name])
            per_item = expected.seconds(f"{GENERIC}[{name}-shard0]", 0.0)
            assert per_item == pytest.approx(total / count)
            assert per_item <= ITEM_TARGET_S or count == MAX_SHARDS
            heaviest = max(recorded[name]) * len(recorded[name]) / count  # its heaviest share, split further
            assert heaviest <= ITEM_TARGET_S or count == MAX_SHARDS
            assert per_item <= ITEM_LIMIT_S or total > MAX_SHARDS * ITEM_LIMIT_S


def test_other_tests_keep_their_measured_time_and_unknown_ones_the_default() -> None:
    durations = _recorded({"slow": [300.0, 300.0]})
    expected = Expected(durations, [f"{GENERIC}[slow-shard{i}]" for i in range(10)])
    assert expected.seconds(f"{GENERIC}[slow-shard7]", 1.0) == pytest.approx(60.0)
    assert expected.seconds("tests/harness/test_other.py::test_x", 1.0) == 5.0
    assert expected.seconds("tests/harness/test_other.py::test_new", 1.0) == 1.0
    # an adapter the file does not know: a typical recorded property-test item, not the default of all tests
    assert expected.seconds(f"{GENERIC}[new-shard0]", 1.0) == 300.0


CUDA = Path(__file__).resolve().parents[1] / "durations" / "cuda.json"


@pytest.mark.parametrize("base", [2, 4])
def test_with_the_recorded_gpu_durations_no_property_item_is_expected_past_a_minute(base: int) -> None:
    """The GPU suite's own file: every adapter's items, its heaviest share included, fit the target (a GPU session
    of 4 to 7 workers splits by 2 at least, of 8 or more by 4), and a new adapter is split as the session splits."""
    durations = json.loads(CUDA.read_text(encoding="utf-8"))
    recorded: dict[str, list[float]] = {}
    for nodeid, seconds in durations.items():
        if nodeid.startswith(GENERIC + "["):
            name = nodeid[len(GENERIC) + 1:-1].rsplit("-shard", 1)[0]
            recorded.setdefault(name, []).append(seconds)
    assert len(recorded) > 20, sorted(recorded)
    over = {name: (count, round(max(s) * len(s) / count, 1)) for name, s in recorded.items()
            if max(s) * len(s) / (count := shards_for(name, durations, base)) > ITEM_TARGET_S}
    assert not over, f"adapters whose heaviest property-test item is expected past {ITEM_TARGET_S:g} s: {over}"
    assert shards_for("an-adapter-not-recorded", durations, base) == base


class _Config:
    def __init__(self, shards: object) -> None:
        self.shards = shards

    def getoption(self, name: str) -> object:
        return {"moe_shards": self.shards}[name]


@pytest.mark.parametrize(("asked", "want"), [("auto", {"slow": 16, "fast": 4}), (3, {"slow": 3, "fast": 3})])
def test_the_session_splits_each_adapter_by_its_recorded_time_unless_told_a_count(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, asked: object, want: dict[str, int]) -> None:
    path = tmp_path / "cuda.json"
    path.write_text(json.dumps(_recorded({"slow": [340.0, 285.0, 40.0, 35.0], "fast": [10.0] * 4})))
    monkeypatch.setattr(plugin, "shard_count", lambda config: 4 if asked == "auto" else asked)
    monkeypatch.setattr(plugin, "durations_file", lambda config: path)
    monkeypatch.setattr(plugin, "selected_adapters", lambda config: ["slow", "fast"])
    assert dict(plugin._shard_plan(_Config(asked))) == want  # type: ignore[arg-type]


def test_items_are_ordered_by_their_share_of_the_recorded_time() -> None:
    class Item:
        def __init__(self, nodeid: str) -> None:
            self.nodeid = nodeid

    durations = _recorded({"slow": [340.0, 285.0, 40.0, 35.0], "mid": [50.0, 50.0]})
    items = [Item(f"{GENERIC}[mid-shard{i}]") for i in range(2)] + [Item("tests/harness/test_other.py::test_x")] \
        + [Item(f"{GENERIC}[slow-shard{i}]") for i in range(12)]
    schedule.order_longest_first(items, durations)  # type: ignore[arg-type]
    # slow: 700 s / 12 = 58 s each, mid: 100 s / 2 = 50 s each, then the rest
    assert [i.nodeid.rsplit("[", 1)[-1][:4] for i in items[:14]] == ["slow"] * 12 + ["mid-"] * 2


def test_a_test_the_file_does_not_know_goes_out_as_the_longest_of_its_module() -> None:
    """A test added since the durations were recorded must not wait behind the short ones: counted as the median, new
    process tests of 20 to 37 s started 240 s into a GPU suite and ended it alone."""
    class Item:
        def __init__(self, nodeid: str) -> None:
            self.nodeid = nodeid

    durations = {"tests/a.py::test_long": 30.0, "tests/a.py::test_short": 0.1, "tests/b.py::test_mid": 10.0,
                 **{f"tests/c.py::test_{i}": 0.2 for i in range(20)}}
    items = [Item(n) for n in [*durations, "tests/a.py::test_new", "tests/new.py::test_new"]]
    schedule.order_longest_first(items, durations)  # type: ignore[arg-type]
    order = [i.nodeid for i in items]
    assert order[:4] == ["tests/a.py::test_long", "tests/a.py::test_new", "tests/new.py::test_new",
                         "tests/b.py::test_mid"]
    expected = Expected(durations, order)
    assert expected.seconds("tests/a.py::test_new") == 30.0
    assert expected.seconds("tests/new.py::test_new") == 30.0  # no test of its module recorded: the longest of all
    assert expected.seconds("tests/a.py::test_new", 1.0) == 1.0  # a default given is kept (the expected-time line)
