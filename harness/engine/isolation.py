"""What a kernel under test may not change in the process that judges it.

The oracle runs in the kernel's process, so a kernel could change what the oracle computes (replace
`torch.nn.functional.silu`, a `reference.*` function, the default dtype, TF32 matmuls) or what later cases see (the
default device, the working directory, warning filters). `take()` records that state, `changes(before)` names what
differs after a kernel ran, and `restore(before)` puts it back, so the change is charged to the case that made it and
no other verdict depends on it.

Watched: the attributes of the namespaces the oracle calls (torch, torch.nn.functional, torch.special, torch.linalg,
torch.Tensor, every `reference.*` module; replaced or deleted names, and for torch.Tensor added ones too, since an
added method shadows the C implementation), the default dtype and device, grad mode, deterministic algorithms, the
fp32 matmul precision and TF32 switches, the thread count, the working directory, warning filters and the SIGINT and
SIGTERM handlers. The CPU RNG state is restored without blame (kernels may draw random numbers). Not covered: the
flush-denormal mode (torch has no getter for it) and state of other libraries.
"""

from __future__ import annotations

import os
import signal
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

_MISSING = object()


def _namespaces() -> dict[str, Any]:
    spaces: dict[str, Any] = {"torch": torch, "torch.nn.functional": torch.nn.functional,
                              "torch.special": torch.special, "torch.linalg": torch.linalg,
                              "torch.Tensor": torch.Tensor}
    spaces.update({name: m for name, m in sorted(sys.modules.items())
                   if (name == "reference" or name.startswith("reference.")) and isinstance(m, ModuleType)})
    return spaces


def _settings() -> dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]]:
    """name -> (read, write) of each process-wide setting."""
    found: dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]] = {
        "default dtype": (torch.get_default_dtype, torch.set_default_dtype),
        "grad mode": (torch.is_grad_enabled, torch.set_grad_enabled),
        "deterministic algorithms": (torch.are_deterministic_algorithms_enabled, torch.use_deterministic_algorithms),
        "fp32 matmul precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        "cuda matmul TF32": (lambda: torch.backends.cuda.matmul.allow_tf32,
                             lambda v: setattr(torch.backends.cuda.matmul, "allow_tf32", v)),
        "cudnn TF32": (lambda: torch.backends.cudnn.allow_tf32,
                       lambda v: setattr(torch.backends.cudnn, "allow_tf32", v)),
        "thread count": (torch.get_num_threads, torch.set_num_threads),
        "working directory": (os.getcwd, os.chdir),
        "warning filters": (lambda: list(warnings.filters), _set_filters),
        "SIGINT handler": (lambda: signal.getsignal(signal.SIGINT), lambda h: signal.signal(signal.SIGINT, h)),
        "SIGTERM handler": (lambda: signal.getsignal(signal.SIGTERM), lambda h: signal.signal(signal.SIGTERM, h)),
    }
    if hasattr(torch, "get_default_device"):
        found["default device"] = (lambda: str(torch.get_default_device()), torch.set_default_device)
    return found


def _set_filters(filters: list) -> None:
    warnings.filters[:] = filters
    warnings._filters_mutated()  # type: ignore[attr-defined]  # invalidate the per-module "already warned" caches


@dataclass
class State:
    """The watched state at one moment."""

    attrs: dict[str, dict[str, Any]] = field(default_factory=dict)  # namespace -> name -> object
    settings: dict[str, Any] = field(default_factory=dict)
    rng: torch.Tensor | None = None


#: the namespaces as they were when the judge started: a kernel library that patched torch at import is caught too
ORIGINALS: dict[str, dict[str, Any]] = {name: dict(vars(ns)) for name, ns in _namespaces().items()}


def accept_current() -> None:
    """Take the watched namespaces as they are now as the originals: for a test that replaces a torch function on
    purpose (a CPU stand-in for a CUDA-only op), before judging and again after undoing it."""
    ORIGINALS.clear()
    ORIGINALS.update({name: dict(vars(ns)) for name, ns in _namespaces().items()})


def take() -> State:
    settings = {}
    for name, (read, _) in _settings().items():
        try:
            settings[name] = read()
        except Exception:  # a backend without the setting: nothing to watch
            continue
    originals = {name: ORIGINALS.get(name) or dict(vars(ns)) for name, ns in _namespaces().items()}
    return State(attrs=originals, settings=settings, rng=torch.get_rng_state())


def changes(before: State) -> list[str]:
    """What differs from `before`, named (e.g. "torch.nn.functional.silu replaced", "default dtype
    torch.float32 -> torch.float64")."""
    found = []
    spaces = _namespaces()
    for space, names in before.attrs.items():
        now = vars(spaces[space]) if space in spaces else {}
        for name, obj in names.items():
            current = now.get(name, _MISSING)
            if current is not obj:
                found.append(f"{space}.{name} {'deleted' if current is _MISSING else 'replaced'}")
        if space == "torch.Tensor":
            found += [f"torch.Tensor.{name} added" for name in sorted(set(now) - set(names))]
    for name, (read, _) in _settings().items():
        if name not in before.settings:
            continue
        try:
            value = read()
        except Exception:
            continue
        if value != before.settings[name]:
            found.append(f"{name} {_short(before.settings[name])} -> {_short(value)}")
    return found


def restore(before: State) -> None:
    """Put back everything `changes` watches (and the RNG state)."""
    spaces = _namespaces()
    for space, names in before.attrs.items():
        target = spaces.get(space)
        if target is None:
            continue
        now = vars(target)
        for name, obj in names.items():
            if now.get(name, _MISSING) is not obj:
                setattr(target, name, obj)
        if space == "torch.Tensor":
            for name in set(now) - set(names):
                delattr(target, name)
    for name, (read, write) in _settings().items():
        if name in before.settings:
            try:
                if read() != before.settings[name]:
                    write(before.settings[name])
            except Exception:
                continue
    if before.rng is not None:
        torch.set_rng_state(before.rng)


def _short(value: Any) -> str:
    text = str(value) if not isinstance(value, list) else f"{len(value)} entries"
    return text if len(text) <= 60 else text[:57] + "..."
