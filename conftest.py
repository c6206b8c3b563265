"""pytest configuration: device selection, Triton interpreter, hypothesis profiles, markers, result collection.

Options: --device auto|cpu|cuda[:N], --adapter NAME (repeatable filter, also module:object), --results-dir DIR.
Every verdict the generic tests produce is appended to a JSONL results file per xdist worker under --results-dir.
"""

from __future__ import annotations

import os

# The Triton interpreter must be chosen before any kernel module imports triton.
if os.environ.get("TRITON_INTERPRET") is None:
    try:
        import torch

        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
    except ImportError:  # pragma: no cover - torch is a hard requirement
        pass

import pytest

from harness.engine.profiles import register_profiles

register_profiles()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("moe-harness")
    group.addoption("--device", default="auto", help="device to verify on: auto (default), cpu, cuda, cuda:N")
    group.addoption("--adapter", action="append", default=[],
                    help="only these adapters (name or module:object); repeatable")
    group.addoption("--shards", type=int, default=int(os.environ.get("HARNESS_SHARDS", "1")),
                    help="split each adapter's property test into N test items (cells and examples divided), so "
                         "pytest-xdist runs one adapter on several workers (GPU runs)")
    group.addoption("--results-dir", default="results/local",
                    help="where verdicts are written (one JSONL file per run and xdist worker)")


def pytest_configure(config: pytest.Config) -> None:
    from hypothesis import settings

    if not config.getoption("hypothesis_profile", default=None):
        settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "ci")


@pytest.fixture(scope="session")
def device_info(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    from harness.core.device import detect

    return detect(request.config.getoption("--device"))


@pytest.fixture(scope="session")
def unverifiable() -> set[str]:
    """Interpreter features that could not be made faithful (cells depending on them are not-verifiable)."""
    from harness.engine.interpreter import unverifiable_here

    return unverifiable_here()


@pytest.fixture(scope="session")
def result_store(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    from harness.store.results import ResultStore, new_run_id

    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID", "")[:12] or new_run_id()
    store = ResultStore(request.config.getoption("--results-dir"), run_id=f"pytest-{run_id}",
                        worker=os.environ.get("PYTEST_XDIST_WORKER"))
    yield store
    store.close()


def selected_adapters(config: pytest.Config) -> list[str]:
    from harness import registry

    wanted = config.getoption("--adapter")
    if wanted:
        return [registry.resolve(w).name for w in wanted]
    return [a.name for a in registry.all_adapters()]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "adapter_name" in metafunc.fixturenames:
        metafunc.parametrize("adapter_name", selected_adapters(metafunc.config))
    if "shard" in metafunc.fixturenames:
        shards = metafunc.config.getoption("--shards")
        if shards < 1:
            raise pytest.UsageError(f"--shards must be >= 1, got {shards}")
        metafunc.parametrize("shard", [(i, shards) for i in range(shards)], ids=[f"shard{i}" for i in range(shards)])
