"""The pytest plugin: which GPU an xdist worker takes, when the plugin is active, which profile the generic tests
use. (That it runs the generic tests from an outside repository is tests/test_examples.py.)"""

from __future__ import annotations

import os

import pytest
import torch

from harness import plugin, registry
from harness.engine.profiles import PROFILES, choose
from harness.plugin.gpus import device_for_worker, parse_gpus, worker_number


def test_workers_spread_round_robin_over_the_gpus() -> None:
    got = [device_for_worker("auto", f"gw{i}", 2) for i in range(5)]
    assert got == ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"]
    assert [device_for_worker("cuda", f"gw{i}", 4, [1, 3]) for i in range(3)] == ["cuda:1", "cuda:3", "cuda:1"]
    assert device_for_worker("auto", None, 3) == "cuda:0"  # no xdist: the first GPU
    assert device_for_worker("cuda:2", "gw5", 4) == "cuda:2"  # pinned
    assert device_for_worker("cpu", "gw1", 4) == "cpu"
    assert device_for_worker("auto", "gw1", 0) == "auto"  # no GPU: the CPU path decides
    assert worker_number("gw12") == 12 and worker_number("master") is None


def test_bad_gpu_choices_are_named() -> None:
    with pytest.raises(ValueError, match="--moe-gpus names GPU"):
        device_for_worker("auto", "gw0", 2, [0, 2])
    with pytest.raises(ValueError, match="--moe-device must be"):
        device_for_worker("tpu", "gw0", 2)
    with pytest.raises(ValueError, match="--moe-gpus must be comma-separated"):
        parse_gpus("0,x")
    assert parse_gpus("") is None and parse_gpus("2, 0") == [2, 0]


def test_this_worker_verifies_on_its_own_device(moe_device, pytestconfig) -> None:  # type: ignore[no-untyped-def]
    """Under xdist on a machine with several GPUs, worker gwK is on GPU K mod N, and torch's current device follows
    (kernels that allocate on "cuda" land there too)."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    want = device_for_worker(pytestconfig.getoption("moe_device"), os.environ.get("PYTEST_XDIST_WORKER"), count,
                             parse_gpus(pytestconfig.getoption("moe_gpus")))
    if want.startswith("cuda:"):
        assert moe_device.device == want
        assert torch.cuda.current_device() == int(want.split(":")[1])
    else:
        assert moe_device.device == "cpu" and moe_device.generation in ("interp", "cpu")


def test_the_plugin_is_inert_where_nothing_is_selected(monkeypatch: pytest.MonkeyPatch, pytestconfig) -> None:  # type: ignore[no-untyped-def]
    assert plugin.is_active(pytestconfig)  # this repository: ini moe_adapters = all
    monkeypatch.setattr(plugin, "adapter_specs", lambda config: [])
    monkeypatch.setattr(plugin, "has_entry_points", lambda: False)
    assert not plugin.is_active(pytestconfig)
    monkeypatch.setattr(plugin, "has_entry_points", lambda: True)
    assert plugin.is_active(pytestconfig)
    assert plugin.ENTRY_POINT_GROUP == registry.ENTRY_POINT_GROUP


def test_the_generic_tests_get_their_own_profile() -> None:
    assert choose(None, None, None, None) == "ci"
    assert choose(None, "my-repos-profile", None, "gpu") == "gpu"  # a repository's own profile is passed over
    assert choose("thorough", "dev") == "thorough"
    assert PROFILES["gpu"].max_examples > PROFILES["ci"].max_examples


def test_loading_the_plugin_imports_no_torch() -> None:
    """The plugin loads in every pytest session of an environment that has moe-harness installed."""
    import subprocess
    import sys

    code = ("import sys, harness.plugin as p; from types import SimpleNamespace as N\n"
            "cfg = N(known_args_namespace=N(moe_adapter=[]), getini=lambda name: [])\n"
            "p.is_active(cfg); print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stdout + done.stderr
