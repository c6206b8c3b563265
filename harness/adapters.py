"""The public API for adapter authors (a stable import path): `Adapter`, `Library`, `Unsupported`, `register`,
`resolve`, `all_adapters`, `adapter_factory`, the entry-point group name, and `accept_process_state` (accept a named
process-state change a kernel makes on purpose). They live in `harness.registry` and `harness.core.isolation`; code
inside the harness imports them from there, kernel packages from here."""

from harness.core.isolation import accept_process_state
from harness.registry import (
    ENTRY_POINT_GROUP,
    Adapter,
    FilesLibrary,
    Library,
    Unsupported,
    adapter_factory,
    all_adapters,
    register,
    resolve,
)

__all__ = ["ENTRY_POINT_GROUP", "Adapter", "FilesLibrary", "Library", "Unsupported", "accept_process_state",
           "adapter_factory", "all_adapters", "register", "resolve"]
