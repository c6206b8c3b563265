"""Adapters of the kernels this project ships: one module per stage (`kernels/adapters/<stage>.py`).

Every module in this package is imported and registers its adapters on import. A module that fails to import
(a kernel with a syntax error, a missing optional dependency) is reported as a warning and skipped, so one broken
kernel never hides the others.
"""

from __future__ import annotations

import importlib
import pkgutil
import warnings

FAILED: dict[str, str] = {}


def _load_all() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        name = f"{__name__}.{info.name}"
        try:
            importlib.import_module(name)
        except Exception as e:  # isolate each kernel module
            FAILED[name] = f"{type(e).__name__}: {e}"
            warnings.warn(f"kernel adapters in {name} unavailable: {FAILED[name]}", stacklevel=2)


_load_all()
