"""The module paths of the flat layout, kept importable: `import harness.device` gives `harness.core.device` (with a
DeprecationWarning naming the new path), so adapters and scripts written before the layered layout keep working.
Only `harness.adapters` and `harness.case` are the documented import paths for adapter authors."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

MOVED: dict[str, str] = {
    "harness.device": "harness.core.device",
    "harness.errors": "harness.core.errors",
    "harness.compare": "harness.core.compare",
    "harness.inputs": "harness.core.inputs",
    "harness.results": "harness.store.results",
    "harness.render": "harness.store.render",
    "harness.runner": "harness.engine.runner",
    "harness.strategies": "harness.engine.strategies",
    "harness.interpreter": "harness.engine.interpreter",
    "harness.profiles": "harness.engine.profiles",
    "harness.reference_adapters": "harness.ops.reference",
    "harness.replay": "harness.commands.replay",
    "harness.diff": "harness.commands.diff",
    "harness.bisect": "harness.commands.bisect",
    "harness.bench": "harness.commands.bench",
    "harness.golden": "harness.commands.golden",
}


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"{spec.name} moved to {MOVED[spec.name]}", DeprecationWarning, stacklevel=2)
        return importlib.import_module(MOVED[spec.name])  # the module itself: one object under both names

    def exec_module(self, module: ModuleType) -> None:
        pass  # already executed under its real name


def install() -> None:
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
