"""A pytest plugin for tests/harness/test_robustness.py: on the xdist controller, a KeyboardInterrupt (Ctrl-C or a
stop signal) leaves the test loop as a RuntimeError, as it does when the signal lands inside a lock's wait in
xdist's event queue ("release unlocked lock"): pytest then ends the session as an internal error."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Generator[None, Any, Any]:
    if hasattr(session.config, "workerinput"):
        return (yield)
    try:
        return (yield)
    except KeyboardInterrupt:
        raise RuntimeError("release unlocked lock") from None
