"""What a session says before its first test: a line at once (importing torch and Triton, listing the adapters in a
kernel host and collecting take seconds on a small machine, minutes on a busy one, and pytest prints nothing until
they are done), then how long the collected tests are expected to take, from the measured durations.

Both only at the default verbosity or above (`-q` keeps a session quiet), never in an xdist worker.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from harness.plugin.schedule import Expected


def starting_line() -> str:
    """The first line of a session that runs generic tests."""
    line = ("moe-harness: importing torch and Triton, listing the adapters in a kernel host and collecting the tests "
            "(about 10 s on 2 idle cores, more on a busy machine)")
    if sys.dont_write_bytecode:
        line += ("; bytecode caching is off (PYTHONDONTWRITEBYTECODE), so every module is compiled again: a few "
                 "seconds more")
    return line


def wanted(config: pytest.Config) -> bool:
    """Default verbosity or more, in the process that reports (not an xdist worker)."""
    early = getattr(config, "known_args_namespace", None) or config.option
    return getattr(early, "verbose", 0) >= 0 and not os.environ.get("PYTEST_XDIST_WORKER")


def say_starting(config: pytest.Config) -> None:
    if not wanted(config):
        return
    capture = config.pluginmanager.getplugin("capturemanager")  # pytest captures from its first hooks on
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        sys.stdout.write(starting_line() + "\n")
        sys.stdout.flush()


def expected_line(nodeids: Iterable[str], durations: Mapping[str, float], source: Path | str, workers: int) -> str:
    """How long the tests `nodeids` are expected to take on `workers` processes: their measured durations, a test
    not measured counted as the median of those that were."""
    ids = list(nodeids)
    default = statistics.median(durations.values()) if durations else 0.0
    expected = Expected(durations, ids)
    total = sum(expected.seconds(i, default) for i in ids)
    new = sum(expected.seconds(i, -1.0) < 0 for i in ids)
    unknown = f"; {new} not measured, counted as {default:.2f} s each" if new else ""
    per = f", about {_span(total / workers)} on {workers} workers" if workers > 1 else ""
    return (f"moe-harness: {len(ids)} tests, {_span(total)} of measured work ({source}{unknown}){per}, "
            "plus a kernel host's start per worker and adapter")


def _span(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


class ExpectedTime:
    """On the reporting process: the expected-time line once the tests are collected (by this process, or by the
    first xdist worker to report its collection)."""

    def __init__(self, durations: Mapping[str, float], source: Path | str, workers: int) -> None:
        self.durations, self.source, self.workers = durations, source, workers
        self.said = False

    def _say(self, config: pytest.Config, nodeids: Iterable[str]) -> None:
        reporter = config.pluginmanager.getplugin("terminalreporter")
        if self.said or reporter is None or not self.durations:
            return
        self.said = True
        reporter.write_line(expected_line(nodeids, self.durations, self.source, self.workers))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if session.items:
            self._say(session.config, (item.nodeid for item in session.items))

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self._say(node.config, ids)
