"""A session says at once what it is doing before its first test (imports, the adapters' listing and the collection
take seconds, minutes on a busy machine), then how long its tests are expected to take; xdist workers take the
controller's listing of the adapters instead of starting a kernel host each to list them again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from harness import plugin
from harness.plugin.progress import expected_line, starting_line, wanted
from tests.harness.signals import NO_GPU

ROOT = Path(__file__).resolve().parents[2]

PROBE = '''
import pytest

from harness import plugin
from harness.engine import remote


def test_probe(request, monkeypatch):
    def no_listing(*args, **kwargs):
        raise AssertionError("a worker listed the adapters itself")

    monkeypatch.setattr(remote, "expand", no_listing)
    monkeypatch.setattr(plugin, "_CATALOGS", {})
    assert plugin.selected_adapters(request.config) == ["reference-activation"]
'''


def test_the_expected_time_counts_unmeasured_tests_as_the_median_and_shards_as_the_first() -> None:
    durations = {"t.py::a": 10.0, "t.py::b": 20.0, "t.py::c[x-shard0]": 30.0}
    # a 10 + c's shard 30 (measured as shard0) + the unmeasured d at the median, 20: 60 s, 30 s on two workers
    line = expected_line(["t.py::a", "t.py::c[x-shard1]", "t.py::d"], durations, "times.json", 2)
    assert line.startswith("moe-harness: 3 tests, 60 s of measured work (times.json; 1 not measured, counted as "
                           "20.00 s each), about 30 s on 2 workers"), line
    assert "on 1 workers" not in expected_line(["t.py::a"], durations, "times.json", 1)
    assert "3.0 min" in expected_line(["t.py::a"], {"t.py::a": 180.0}, "times.json", 1)


def test_a_quiet_session_or_an_xdist_worker_says_nothing(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    config = SimpleNamespace(known_args_namespace=SimpleNamespace(verbose=0))
    assert wanted(config)  # type: ignore[arg-type]
    assert not wanted(SimpleNamespace(known_args_namespace=SimpleNamespace(verbose=-1)))  # type: ignore[arg-type]
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    assert not wanted(config)  # type: ignore[arg-type]


def test_the_first_line_comes_at_once_and_workers_take_the_controllers_listing(tmp_path: Path) -> None:
    (tmp_path / "test_listing_probe.py").write_text(PROBE, encoding="utf-8")
    probe = "test_listing_probe.py::test_probe"
    (tmp_path / "times.json").write_text(json.dumps({probe: 30.0}), encoding="utf-8")
    plugin_arg = plugin.load_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_arg, "-n", "2", str(tmp_path / probe),
         "--moe-adapter", "reference-activation", "--moe-results-dir", str(tmp_path / "results"), "--rootdir",
         str(tmp_path), "--moe-durations", str(tmp_path / "times.json"), "-k", "probe"],
        cwd=tmp_path, env=dict(env, PYTHONPATH=str(ROOT), **NO_GPU), capture_output=True, text=True, timeout=300)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
    assert lines[0] == starting_line(), lines[:3]  # before pytest's header, which waits for the listing
    expected = [line for line in lines if line.startswith("moe-harness: 1 tests, ")]
    assert expected == ["moe-harness: 1 tests, 30 s of measured work (times.json), about 15 s on 2 "
                        "workers, plus a kernel host's start per worker and adapter"], done.stdout[-3000:]
