"""Hypothesis profiles: `ci` (CPU CI, few examples), `dev`, `gpu` and `thorough` (GPU runs).

Selected by pytest's `--hypothesis-profile NAME` or the `HYPOTHESIS_PROFILE` environment variable; the
default is `ci`.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def register_profiles() -> None:
    # `ci` repeats hypothesis' built-in ci settings (derandomize, no database, print blob) with few examples.
    settings.register_profile(
        "ci", max_examples=8, derandomize=True, database=None, print_blob=True,
        phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target), **_COMMON,
    )
    settings.register_profile("dev", max_examples=30, print_blob=True, **_COMMON)
    settings.register_profile("gpu", max_examples=60, derandomize=True, database=None, print_blob=True, **_COMMON)
    settings.register_profile(
        "thorough", max_examples=300, derandomize=True, database=None, print_blob=True, **_COMMON
    )


def load_profile(name: str | None = None) -> str:
    register_profiles()
    name = name or os.environ.get("HYPOTHESIS_PROFILE") or "ci"
    settings.load_profile(name)
    return name
