"""pytest configuration: device selection, Triton interpreter, hypothesis profiles, markers, results."""

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

from harness.profiles import register_profiles  # noqa: E402

register_profiles()


def pytest_configure(config) -> None:  # type: ignore[no-untyped-def]
    from hypothesis import settings

    if not config.getoption("hypothesis_profile", default=None):
        settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "ci")
