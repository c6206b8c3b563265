"""Hypothesis profiles of the generic tests: `ci` (CPU CI, few examples), `dev`, `gpu` and `thorough` (GPU runs).

`PROFILES` holds them as settings objects: the pytest plugin applies the chosen one to its generic tests only, so a
kernel repository's own hypothesis profiles are never touched. `register_profiles` also registers them by name with
hypothesis, for this repository's own tests (`--hypothesis-profile NAME`, `HYPOTHESIS_PROFILE`; default `ci`).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

PROFILES: dict[str, settings] = {
    # `ci` repeats hypothesis' built-in ci settings (derandomize, no database, print blob) with few examples.
    "ci": settings(max_examples=8, derandomize=True, database=None, print_blob=True,
                   phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target), **_COMMON),
    "dev": settings(max_examples=30, print_blob=True, **_COMMON),
    "gpu": settings(max_examples=60, derandomize=True, database=None, print_blob=True, **_COMMON),
    "thorough": settings(max_examples=300, derandomize=True, database=None, print_blob=True, **_COMMON),
}


def register_profiles() -> None:
    for name, profile in PROFILES.items():
        settings.register_profile(name, profile)


def load_profile(name: str | None = None) -> str:
    register_profiles()
    name = name or os.environ.get("HYPOTHESIS_PROFILE") or "ci"
    settings.load_profile(name)
    return name


def name_of(profile: settings) -> str | None:
    """The name of one of `PROFILES` (None for another settings object): the profile-only value classes
    (`harness.ops.large`) go by it."""
    return next((name for name, p in PROFILES.items() if p is profile), None)


def choose(*candidates: str | None) -> str:
    """The first candidate that names one of `PROFILES` (others, e.g. a repository's own profile, are passed over);
    `ci` when none does."""
    return next((c for c in candidates if c in PROFILES), "ci")
