"""The order xdist hands tests out in: longest first, so that the long tests start at once on every worker instead
of ending the run alone on one (xdist's `load` mode deals the first quarter of the items out round robin, then
feeds workers as they finish).

The times come from a file of measured durations (`--moe-durations FILE`, written by `--moe-record-durations FILE`
on a run of the same suite on the same kind of machine): a JSON object of node ids to seconds. A test it does not
know counts as the median of those it knows (a property test split into shards as the unsplit one); without such a
file the generic property tests go first (on a GPU they are the longest), in their collected order otherwise.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

#: the generic test that judges an adapter's declared cells under hypothesis: the long one of each adapter
PROPERTY_TEST = "test_declared_cases_pass"


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
        default = statistics.median(durations.values())
        items.sort(key=lambda item: -expected_seconds(item.nodeid, durations, default))
    else:
        items.sort(key=lambda item: getattr(item, "originalname", item.name) != PROPERTY_TEST)


def expected_seconds(nodeid: str, durations: Mapping[str, float], default: float) -> float:
    """The measured time of a test, or of the same property test measured unsplit (its `-shard0` item)."""
    if nodeid in durations:
        return durations[nodeid]
    return durations.get(re.sub(r"-shard\d+\]$", "-shard0]", nodeid), default)


class DurationRecorder:
    """Collects each test's duration (setup, call and teardown) and writes them to `path` when the session ends
    (on the xdist controller, which sees every worker's reports)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self, session: Any, exitstatus: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({k: round(v, 2) for k, v in sorted(self.seconds.items())}, indent=0) + "\n",
                             encoding="utf-8")
