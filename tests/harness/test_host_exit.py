"""A judging process that ends with an uncaught exception while a kernel host of its is running exits, its
traceback printed, instead of waiting forever for that host (multiprocessing's exit handler joins its children,
and the exception's frames keep the host object alive)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
from harness.engine import remote
from harness.engine.host import Host

host = Host("cpu")
remote.expand(["reference-activation"], host=host)  # started, and left running
raise RuntimeError("an unexpected error in the judging process")
"""


def test_an_uncaught_exception_with_a_host_running_ends_the_process() -> None:
    try:
        done = subprocess.run([sys.executable, "-c", PROGRAM], cwd=ROOT, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        raise AssertionError("the process never ended: its exit waited for the running kernel host") from None
    assert done.returncode == 1 and "an unexpected error in the judging process" in done.stderr, done.stderr[-2000:]
