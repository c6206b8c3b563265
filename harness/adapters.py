"""The public API for adapter authors (a stable import path): `Adapter`, `Library`, `Unsupported`, `register`,
`resolve`, `all_adapters`, `adapter_factory`, the entry-point group name, `accept_process_state` (accept a named
process-state change a kernel makes on purpose) and `KnownFinding` (a documented divergence of a third-party
kernel). They live in `harness.registry`, `harness.core.isolation` and `harness.core.known`; code inside the
harness imports them from there, kernel packages from here."""

from harness.core.isolation import accept_process_state
from harness.core.known import KnownFinding
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

__all__ = ["ENTRY_POINT_GROUP", "Adapter", "FilesLibrary", "KnownFinding", "Library", "Unsupported",
           "accept_process_state", "adapter_factory", "all_adapters", "register", "resolve"]
