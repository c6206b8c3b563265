"""Each adapter's declarations as its own module left them: one adapter module must not change another's.

Every process that imports adapter modules (a kernel host, the planning host that imports them all) takes a
fingerprint of each adapter's declaration fields when the import that defined it ends (`seal`), and compares every
earlier adapter's fields with their fingerprints after each later import (then the culprit is that import) and
whenever the adapter is described or run (`tampered`). A changed declaration is named in one line; its adapter's
cases are then judged a harness error (`harness.engine.runner`), never silently unsupported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

#: adapter name -> (its declaration object, the fingerprint of each field, the import that defined it)
_SEALED: dict[str, tuple[Any, dict[str, str], str]] = {}
#: adapter name -> how its declaration was changed (one line)
TAMPERED: dict[str, str] = {}


def _canon(value: Any) -> Any:
    """A comparable form of a field: containers by content, callables by identity and code."""
    if isinstance(value, Mapping):
        return tuple(sorted((repr(k), _canon(v)) for k, v in value.items()))
    if isinstance(value, (set, frozenset)):
        return tuple(sorted(repr(_canon(v)) for v in value))
    if isinstance(value, (list, tuple)):
        return tuple(_canon(v) for v in value)
    if callable(value) and not isinstance(value, type):
        return ("callable", id(value), id(getattr(value, "__code__", None)))
    return repr(value)


def fingerprint(adapter: Any) -> dict[str, str]:
    """Field name -> a fingerprint of its value (every dataclass field of the adapter)."""
    return {f.name: repr(_canon(getattr(adapter, f.name))) for f in dataclasses.fields(adapter)}


def _changed(name: str, current: Any) -> list[str]:
    prints = _SEALED[name][1]
    now = fingerprint(current)
    return [f for f in prints if now.get(f) != prints[f]]


def seal(origin: str, defined: Iterable[Any], registry: Mapping[str, Any]) -> None:
    """After the import `origin`: name the earlier adapters it changed, then fingerprint the ones it defined."""
    new = {a.name: a for a in defined}
    for name in [n for n in _SEALED if n not in new and n not in TAMPERED]:
        fields = _changed(name, registry.get(name, _SEALED[name][0]))
        if fields:
            TAMPERED[name] = (f"adapter {name}'s declaration was changed by another module ({origin} imported "
                              f"after {_SEALED[name][2]}): fields {', '.join(fields)}")
    for name, adapter in new.items():
        if name not in _SEALED or _SEALED[name][2] == origin:  # its own module may define it again (a factory)
            _SEALED[name] = (adapter, fingerprint(adapter), origin)


def tampered(name: str, registry: Mapping[str, Any]) -> str:
    """Why adapter `name`'s declaration is not what its module left ("" when it is, or was never sealed here)."""
    if name in TAMPERED or name not in _SEALED:
        return TAMPERED.get(name, "")
    fields = _changed(name, registry.get(name, _SEALED[name][0]))
    if fields:
        TAMPERED[name] = (f"adapter {name}'s declaration was changed after {_SEALED[name][2]} was imported "
                          f"(by another module or a kernel run): fields {', '.join(fields)}")
    return TAMPERED.get(name, "")
