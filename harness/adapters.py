"""The public API for adapter authors (a stable import path): `Adapter`, `Library`, `Unsupported`, `register`,
`resolve`, `all_adapters`, `adapter_factory` and the entry-point group name. They live in `harness.registry`; code
inside the harness imports them from there, kernel packages from here."""

from harness.registry import (
    ENTRY_POINT_GROUP,
    Adapter,
    Library,
    Unsupported,
    adapter_factory,
    all_adapters,
    register,
    resolve,
)

__all__ = ["ENTRY_POINT_GROUP", "Adapter", "Library", "Unsupported", "adapter_factory", "all_adapters", "register",
           "resolve"]
