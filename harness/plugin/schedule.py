"""The order xdist hands tests out in: longest first, so that the long tests start at once on every worker instead
of ending the run alone on one (xdist's `load` mode deals the first quarter of the items out round robin, then
feeds workers as they finish).

The times come from a file of measured durations (`--moe-durations FILE`, written by `--moe-record-durations FILE`
on a run of the same suite on the same kind of machine): a JSON object of node ids to seconds. A test it does not
know (one added since) counts as the longest it knows of the test's module, or of all where it knows none there: a
new test starts early, where a long one cannot end the run alone (counted as the median, new process tests of 20 to
37 s started 240 s into a GPU suite and ended it 50 s later with one to four workers busy). A property-test shard
counts as its adapter's recorded property test (its shards summed) over the shards it is split into now (one of an
adapter the file does not know: the median recorded property-test item); without such a file the generic property
tests go first (on a GPU they are the longest), in their collected order otherwise.

The same file sets how many shards each adapter's property test is split into where a session splits them
(`shards_for`): an adapter whose recorded property test is long gets more, so that no item, the heaviest share
included, runs past about `ITEM_TARGET_S` (one long item ends a parallel run alone).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

#: the generic test that judges an adapter's declared cells under hypothesis: the long one of each adapter
PROPERTY_TEST = "test_declared_cases_pass"
#: a property-test item's node id: its adapter, and its shard where it is split
_PROPERTY_ITEM = re.compile(rf"::{PROPERTY_TEST}\[(?P<name>.+?)(?:-shard(?P<shard>\d+))?\]$")
#: seconds a property-test item should take at most: a longer recorded property test is split into more shards
ITEM_TARGET_S = 60.0
#: the most shards one adapter's property test is split into (each shard draws at least a few cases of its own)
MAX_SHARDS = 16
#: a property test recorded as shorter than this (its shares summed as the heaviest implies) is not split: each
#: item starts a kernel host with a CUDA context of its own, and in the loaded GPU suite the four 6-s shards of a
#: reference adapter (2.2 s each on an idle H200) were mostly those starts
SPLIT_ABOVE_S = 40.0


def property_seconds(durations: Mapping[str, float]) -> dict[str, float]:
    """Each adapter's recorded property test in seconds: its shards' durations summed (whatever count it was
    recorded with)."""
    found: dict[str, float] = {}
    for nodeid, seconds in durations.items():
        if (m := _PROPERTY_ITEM.search(nodeid)) is not None:
            found[m["name"]] = found.get(m["name"], 0.0) + seconds
    return found


def property_peaks(durations: Mapping[str, float]) -> dict[str, float]:
    """Each adapter's recorded property test as its heaviest shard implies: that shard's seconds times the shards it
    was recorded with. The cells are dealt round robin, so the shares are uneven (74 s beside 40 s on an H200), and
    the heaviest is the item that runs longest."""
    peak: dict[str, float] = {}
    count: dict[str, int] = {}
    for nodeid, seconds in durations.items():
        if (m := _PROPERTY_ITEM.search(nodeid)) is not None:
            peak[m["name"]] = max(peak.get(m["name"], 0.0), seconds)
            count[m["name"]] = count.get(m["name"], 0) + 1
    return {name: peak[name] * count[name] for name in peak}


def shards_for(name: str, durations: Mapping[str, float], base: int, *, target_s: float = ITEM_TARGET_S,
               most: int = MAX_SHARDS) -> int:
    """How many shards adapter `name`'s property test is split into: `base` (the session's count), or more where
    its recorded property test would make the heaviest item of `base` shards longer than `target_s` (at most
    `most`; `property_peaks`), or one where it is recorded as shorter than `SPLIT_ABOVE_S`. A session that does not
    split (`base` 1: one worker, or a CPU run) is left so; an adapter the file does not know (a new one) gets
    `base`: on a GPU with eight workers or more, 4."""
    total = property_peaks(durations).get(name)
    if base <= 1 or total is None:
        return base
    if total < SPLIT_ABOVE_S:
        return 1
    return max(base, min(most, math.ceil(total / target_s)))


def shard_counts(nodeids: Iterable[str]) -> dict[str, int]:
    """How many shards each adapter's property test has among `nodeids` (collected items)."""
    found: dict[str, int] = {}
    for nodeid in nodeids:
        if (m := _PROPERTY_ITEM.search(nodeid)) is not None:
            found[m["name"]] = found.get(m["name"], 0) + 1
    return found


def read_durations(path: str | Path) -> dict[str, float]:
    """The measured durations in `path` (node id -> seconds); a usage error names a file that is not one."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise pytest.UsageError(f"--moe-durations {path}: not a readable JSON file of durations ({e})") from None
    if not isinstance(data, dict) or not all(isinstance(v, (int, float)) for v in data.values()):
        raise pytest.UsageError(f"--moe-durations {path}: expected a JSON object of node ids to seconds")
    return {str(k): float(v) for k, v in data.items()}


def order_longest_first(items: list[pytest.Item], durations: Mapping[str, float]) -> None:
    """Sort `items` in place, longest expected first (a stable sort: ties keep the collected order)."""
    if durations:
        expected = Expected(durations, [item.nodeid for item in items])
        items.sort(key=lambda item: -expected.seconds(item.nodeid))
    else:
        items.sort(key=lambda item: getattr(item, "originalname", item.name) != PROPERTY_TEST)


class Expected:
    """The expected times of the collected tests `nodeids` from measured `durations`."""

    def __init__(self, durations: Mapping[str, float], nodeids: Iterable[str]) -> None:
        self.durations = durations
        self.totals = property_seconds(durations)
        self.shards = shard_counts(nodeids)
        recorded = [s for nodeid, s in durations.items() if _PROPERTY_ITEM.search(nodeid)]
        self.new_property_item = statistics.median(recorded) if recorded else None
        self.longest_in: dict[str, float] = {}
        for nodeid, seconds in durations.items():
            module = _module(nodeid)
            self.longest_in[module] = max(self.longest_in.get(module, 0.0), seconds)
        self.longest = max(durations.values(), default=0.0)

    def seconds(self, nodeid: str, default: float | None = None) -> float:
        """A property-test item's: its adapter's recorded property test over the shards it is split into now, of an
        adapter the file does not know the median recorded property-test item (not the median of all tests, mostly
        short: a new kernel's items would start last); any other test's: its measured time, a shard's not measured
        that of its first (`-shard0`), else `default`, or where none is given the longest recorded of its module (of
        all tests where none of its module is recorded)."""
        m = _PROPERTY_ITEM.search(nodeid)
        if m is not None and m["name"] in self.totals and self.shards.get(m["name"]):
            return self.totals[m["name"]] / self.shards[m["name"]]
        if m is not None and m["name"] not in self.totals and self.new_property_item is not None:
            return self.new_property_item
        if nodeid in self.durations:
            return self.durations[nodeid]
        first = self.durations.get(re.sub(r"-shard\d+\]$", "-shard0]", nodeid))
        if first is not None:
            return first
        if default is not None:
            return default
        return self.longest_in.get(_module(nodeid), self.longest)


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


#: a report's user property: the CPU seconds its test took (`CpuMeter`)
CPU_PROPERTY = "moe_cpu_s"


def cpu_path(path: str | Path) -> Path:
    """Where a durations file's CPU times go: `cuda-durations.json` -> `cuda-durations.cpu.json`."""
    path = Path(path)
    return path.with_name(path.stem + ".cpu" + (path.suffix or ".json"))


class DurationRecorder:
    """Collects each test's duration (setup, call and teardown) and writes them to `path` when the session ends
    (on the xdist controller, which sees every worker's reports); the CPU seconds `CpuMeter` measured go beside it
    (`cpu_path`)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.seconds: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        for key, value in report.user_properties:
            if key == CPU_PROPERTY and isinstance(value, (int, float)):
                self.cpu[report.nodeid] = float(value)

    def pytest_sessionfinish(self, session: Any, exitstatus: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for path, values in ((self.path, self.seconds), (cpu_path(self.path), self.cpu)):
            path.write_text(json.dumps({k: round(v, 2) for k, v in sorted(values.items())}, indent=0) + "\n",
                            encoding="utf-8")


def _cpu_seconds() -> float:
    """User and system CPU of this process and of the children it has waited for (a child pytest, a sweep's CLI)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class CpuMeter:
    """In the process that runs the tests: each test's CPU seconds (setup to teardown; its own and those of the
    processes it started and waited for, not kernel hosts, which a fork server starts), as a user property of its
    teardown report (`CPU_PROPERTY`), which xdist carries to the controller's `DurationRecorder`."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        self.started[item.nodeid] = _cpu_seconds()
        yield
        self.started.pop(item.nodeid, None)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Any:
        outcome = yield
        if call.when == "teardown" and item.nodeid in self.started:
            outcome.get_result().user_properties.append(
                (CPU_PROPERTY, round(_cpu_seconds() - self.started[item.nodeid], 3)))
