"""Adapters of third-party kernel libraries (vLLM's CPU build, vLLM's CUDA extensions' ops, vLLM's and SGLang's Triton
MoE read from their files, torchao, Liger): one module per library.

Every adapter here is registered whether or not its library is installed: its support is written down for the
library version it names (`harness.registry.Library`), and the library is imported only when a case runs. Where it
is missing, each of its cases is reported `not-installed` with the command that installs it, never as an error and
never dropped. Nothing of the libraries' code is copied here: the adapters call it, or read it at run time from the
library's own files (`harness.registry.sourcefiles`).
"""

from __future__ import annotations

import importlib
import pkgutil
import warnings

FAILED: dict[str, str] = {}


def _load_all() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_"):  # shared helpers, not adapter modules
            continue
        name = f"{__name__}.{info.name}"
        try:
            importlib.import_module(name)
        except Exception as e:  # isolate each library's adapters
            FAILED[name] = f"{type(e).__name__}: {e}"
            warnings.warn(f"external adapters in {name} unavailable: {FAILED[name]}", stacklevel=2)


_load_all()
