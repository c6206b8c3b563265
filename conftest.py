"""pytest configuration of this repository: the moe-harness plugin (`harness.plugin`) does the work.

The plugin is installed with the package (entry point `pytest11`: `moe_harness`); a checkout that was not
pip-installed (a GPU machine that received a copy of the tree) loads it from here. This repository runs the generic
tests of every registered adapter (ini `moe_adapters = all` in pyproject.toml); `--moe-adapter NAME` narrows them.
Its own tests use the plugin's fixtures under their historical names (device_info, result_store, unverifiable) and
its hypothesis profiles (ci by default) for their own property tests.
"""

from __future__ import annotations

import os

import pytest

import harness.plugin
from harness.engine.profiles import load_profile, register_profiles
from harness.plugin import is_installed
from tests.quick import area_of

register_profiles()  # before hypothesis' own plugin loads --hypothesis-profile NAME
if not is_installed():
    pytest_plugins = ["harness.plugin"]


def pytest_configure(config: pytest.Config) -> None:
    # a test that changes planning in memory must not be handed a plan remembered from another run
    # (tests/harness/test_plan_cache.py turns the cache on in a folder of its own)
    os.environ.setdefault("MOE_HARNESS_PLAN_CACHE", "off")
    if not config.getoption("hypothesis_profile", default=None):
        load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "ci")
    # every test that runs a kernel in Triton's interpreter gets the fidelity fixes of this Triton release, not only
    # the modules that ask for them (a release's own interpreter defect would otherwise fail a kernel test)
    from harness.engine.interpreter import unverifiable_here

    unverifiable_here()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the quick subset (tests/quick.py) before `-m` deselects. The plugin adds the generic tests in a hook of
    its own that may run after this one; adding them is idempotent, so it is done here first."""
    harness.plugin.pytest_collection_modifyitems(session, config, items)
    for item in items:
        if area_of(item.nodeid) is not None:
            item.add_marker(pytest.mark.quick)


@pytest.fixture(scope="session")
def device_info(moe_device):  # type: ignore[no-untyped-def]
    return moe_device


@pytest.fixture(scope="session")
def unverifiable(moe_unverifiable):  # type: ignore[no-untyped-def]
    return moe_unverifiable


@pytest.fixture(scope="session")
def result_store(moe_results):  # type: ignore[no-untyped-def]
    return moe_results


@pytest.fixture(autouse=True)
def _triton_interpret_restored():  # type: ignore[no-untyped-def]
    """A CLI command a test runs in this process with `--device cpu` chooses the interpreter for the process
    (harness.core.device.prepare_interpreter); on a GPU machine the next test must find the compiled setting again,
    or the modules and kernel hosts it imports mix interpreted and compiled kernels."""
    before = os.environ.get("TRITON_INTERPRET")
    yield
    if before is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = before
