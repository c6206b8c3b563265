"""Build a mutant adapter: a base adapter whose kernel (or adapter) module is replaced by a patched copy.

A mutant is a list of exact text replacements applied to the source of one module (`kernels.<stage>` or
`kernels.adapters.<stage>`). The patched source is compiled as a new module under its own name (the real kernel
is never touched) and registered in `linecache`, because Triton reads a kernel's source with `inspect`. The
adapter module is re-executed with registration disabled, its references to the original kernel module (and to
functions imported from it) are rebound to the patched copy (a kernel module the adapter reaches through others,
e.g. kernels.group_quant through kernels.quant_gemm: those named in `via` are copied and rebound the same way, so
the bug reaches this adapter only), and the adapter named `base` in it is returned
under the mutant's name, with its support narrowed to the mutant's focus cells (MUTANTS_UNNARROWED=1: not narrowed,
to measure what the unnarrowed generic search of CI catches).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import linecache
import os
import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from unittest import mock

from harness import registry
from harness.registry import Adapter


@dataclass(frozen=True)
class Patch:
    """Replace `old` by `new`, expecting exactly `count` occurrences of `old` (a refactor must fail loudly)."""

    old: str
    new: str
    count: int = 1


@dataclass(frozen=True)
class Mutant:
    name: str
    base: str  # the adapter the mutant is built from
    module: str  # the module whose source is patched
    patches: tuple[Patch, ...]
    bug: str  # the bug class it stands for
    #: axis -> values: the cells the bug lives in (the mutant declares only these); {} = every base cell
    focus: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: modules between the adapter and `module` (the adapter's import first): each is re-executed as a copy that
    #: calls the patched one, so that a bug planted in a shared kernel reaches this adapter's path only
    via: tuple[str, ...] = ()


class PatchNotFound(AssertionError):
    pass


def patched_source(m: Mutant) -> str:
    src = inspect.getsource(importlib.import_module(m.module))
    for p in m.patches:
        n = src.count(p.old)
        if n != p.count:
            raise PatchNotFound(f"mutant {m.name}: expected {p.count} occurrence(s) of {p.old!r} in {m.module}, "
                                f"found {n} (the module changed: update the mutant)")
        src = src.replace(p.old, p.new)
    return src


def _load(name: str, src: str, origin: str) -> types.ModuleType:
    filename = f"<mutant {name}: {origin}>"
    # Triton reads @jit sources through inspect/linecache; mtime None keeps the entry from being invalidated
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    mod = types.ModuleType(name)
    mod.__file__ = filename
    sys.modules[name] = mod
    exec(compile(src, filename, "exec"), mod.__dict__)
    return mod


def _rebind(mod: types.ModuleType, swaps: list[tuple[types.ModuleType, types.ModuleType]]) -> None:
    """Point `mod`'s references to each original module (and to functions/classes imported from it) at its copy."""
    for original, mutated in swaps:
        for key, value in list(vars(mod).items()):
            if value is original:
                setattr(mod, key, mutated)
            # defined there: Triton's interpreter leaks its own globals (dataclass, np...) into kernel modules
            elif (callable(value) and getattr(value, "__module__", None) == original.__name__
                  and getattr(original, getattr(value, "__name__", ""), None) is value):
                setattr(mod, key, getattr(mutated, value.__name__))


def _adapter_module_of(base: Adapter) -> str:
    return base.run.__module__


def build(m: Mutant) -> Adapter:
    """The mutant's adapter (not registered)."""
    base = registry.resolve(m.base)
    adapter_mod_name = _adapter_module_of(base)
    safe = m.name.replace("-", "_")
    src = patched_source(m)
    swaps: list[tuple[types.ModuleType, types.ModuleType]] = []
    if m.module == adapter_mod_name:
        adapter_src = src
    else:
        original = importlib.import_module(m.module)
        swaps.append((original, _load(f"mutants.{safe}.kernel", src, m.module)))
        for i, name in enumerate(reversed(m.via)):  # the module nearest the patched one first
            orig = importlib.import_module(name)
            copy = _load(f"mutants.{safe}.via{i}", inspect.getsource(orig), name)
            _rebind(copy, swaps)
            swaps.append((orig, copy))
        adapter_src = inspect.getsource(importlib.import_module(adapter_mod_name))
    made: list[Adapter] = []

    def capture(a: Adapter, replace: bool = False) -> Adapter:
        made.append(a)
        return a

    with mock.patch.object(registry, "register", capture):
        amod = _load(f"mutants.{safe}.adapter", adapter_src, adapter_mod_name)
    _rebind(amod, swaps)
    found = [a for a in made if a.name == m.base]
    if len(found) != 1:
        raise AssertionError(f"mutant {m.name}: adapter {m.base!r} not found in {adapter_mod_name}")
    # MUTANTS_UNNARROWED=1: the mutant keeps its base's whole support, as the generic test CI runs sees a bug
    focus = {} if os.environ.get("MUTANTS_UNNARROWED") else m.focus
    support = {a: tuple(v for v in vals if v in focus.get(a, vals)) for a, vals in found[0].support.items()}
    for axis, values in m.focus.items():
        if not set(values) <= set(found[0].support.get(axis, ())):
            raise AssertionError(f"mutant {m.name}: focus {axis}={values} outside {m.base}'s support")
    return dataclasses.replace(found[0], name=f"mutant-{m.name}", source=f"{m.module} (mutant {m.name})",
                               support=support)
