"""What a kernel under test may not change in the process that judges it.

The oracle runs in the kernel's process, so a kernel could change what the oracle computes (replace
`torch.nn.functional.silu`, a `reference.*` function, the default dtype, TF32 matmuls) or what later cases see (the
default device, the working directory, warning filters). `take()` records that state, `changes(before)` names what
differs after a kernel ran, and `restore(before)` puts it back, so the change is charged to the case that made it and
no other verdict depends on it.

Watched: the attributes of the namespaces the oracle calls (torch, torch.nn.functional, torch.special, torch.linalg,
torch.Tensor, every `reference.*` module; replaced or deleted names, and for torch.Tensor added ones too, since an
added method shadows the C implementation), the default dtype and device, grad mode, deterministic algorithms, the
fp32 matmul precision and TF32 switches, the thread count, the working directory, warning filters, the SIGINT and
SIGTERM handlers and the blocked-signal mask. The CPU RNG state is restored without blame (kernels may draw random
numbers). Also watched: flush-denormal (read by computing with a denormal), mkldnn, the cudnn switches and the CUDA
reduced-precision reduction switches. Not covered: the state of other libraries.
`pristine()` gives the oracle the functions as they were when the harness loaded; `Containment` refuses the exits
a kernel attempts while it runs.

Not charged, though undone like any change: what well-known libraries change on their first import, whether that
happens when an adapter module is imported or at a kernel's first call (`torch.compile` imports torch._dynamo
lazily): exactly the changes listed in `LIBRARY_WRAPPERS` and `LIBRARY_FILTERS`, and only in the window where that
library was first imported. Registering ops (`torch.library`, `torch.ops`) and compiling Triton kernels change
nothing watched. A change a kernel needs on purpose is accepted by name with `accept_process_state`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import CodeType, ModuleType
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
    found.update(_backend_flags())
    if hasattr(signal, "pthread_sigmask"):  # a blocked SIGALRM would disable every later case's deadline
        found["blocked signals"] = (lambda: sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])),
                                    lambda v: signal.pthread_sigmask(signal.SIG_SETMASK, v))
    if hasattr(torch, "get_default_device"):
        found["default device"] = (lambda: str(torch.get_default_device()), torch.set_default_device)
    return found


def _flag(owner: Any, attr: str) -> tuple[Callable[[], Any], Callable[[Any], Any]]:
    return (lambda: getattr(owner, attr)), (lambda v: setattr(owner, attr, v))


def _flushes_denormals() -> bool:
    """Whether this thread flushes denormals to zero (torch.set_flush_denormal has no getter: a denormal times one
    reads as zero when it does)."""
    return float((torch.tensor([1e-40], dtype=torch.float32) * 1.0)[0]) == 0.0


def _backend_flags() -> dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]]:
    """Switches of torch's backends that change what later computations give (or how fast), all process-wide."""
    cuda, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    found = {"flush denormal": (_flushes_denormals, torch.set_flush_denormal),
             "mkldnn": _flag(torch.backends.mkldnn, "enabled"),
             "cudnn enabled": _flag(cudnn, "enabled"), "cudnn benchmark": _flag(cudnn, "benchmark"),
             "cudnn deterministic": _flag(cudnn, "deterministic")}
    for dtype in ("fp16", "bf16"):
        attr = f"allow_{dtype}_reduced_precision_reduction"
        if hasattr(cuda, attr):
            found[f"cuda {dtype} reduced-precision reduction"] = _flag(cuda, attr)
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
    libraries: frozenset[str] = frozenset()  # the modules of LIBRARY_WRAPPERS / LIBRARY_FILTERS imported by then
    accepted: int = 0  # how many changes `accept_process_state` had accepted by then


def _foreign(spaces: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Watched callables defined outside torch, the standard library and the oracle: a library imported before the
    harness that replaced a function the oracle calls. name -> the module that defined the replacement."""
    allowed = {"torch", "reference", "typing_extensions", *sys.stdlib_module_names}
    found = {}
    for space, names in spaces.items():
        for name, obj in names.items():
            module = getattr(obj, "__module__", None) if callable(obj) else None
            if isinstance(module, str) and module.split(".")[0] not in allowed:
                found[f"{space}.{name}"] = module
    return found


#: the namespaces as they were when the harness loaded (before any adapter module): what the oracle computes with
ORIGINALS: dict[str, dict[str, Any]] = {name: dict(vars(ns)) for name, ns in _namespaces().items()}
#: watched functions that were already foreign replacements then (name -> defining module): the oracle cannot be
#: sealed from those, so the runner refuses to judge while there are any
FOREIGN: dict[str, str] = _foreign(ORIGINALS)


#: watched attributes that a library replaces on its first import by a wrapper of the same function (`__wrapped__`
#: is the function before): attribute -> (the library, the files that define the wrapper). torch._dynamo wraps
#: torch.manual_seed so that compiled code never traces into seeding.
LIBRARY_WRAPPERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "torch.manual_seed": ("torch._dynamo", (os.path.join("torch", "_compile.py"),
                                            os.path.join("torch", "_dynamo", ""))),
}
#: warning filters that a library adds on its first import: (the library, action, category as module.qualname).
#: sympy, which torch._dynamo and torch._inductor import, shows each of its deprecation warnings once.
LIBRARY_FILTERS: tuple[tuple[str, str, str], ...] = (
    ("sympy", "once", "sympy.utilities.exceptions.SymPyDeprecationWarning"),
)
_LIBRARIES = frozenset([*(lib for lib, _ in LIBRARY_WRAPPERS.values()), *(f[0] for f in LIBRARY_FILTERS)])


def _loaded() -> frozenset[str]:
    return frozenset(m for m in _LIBRARIES if m in sys.modules)


def _library_wrapper(attr: str, old: Any, new: Any, before: State) -> bool:
    """Whether replacing `attr` (`old` -> `new`) is the wrapping its library does on first import, in this window."""
    if attr not in LIBRARY_WRAPPERS or getattr(new, "__wrapped__", _MISSING) is not old:
        return False
    library, files = LIBRARY_WRAPPERS[attr]
    code = getattr(new, "__code__", None)
    return (library not in before.libraries and library in sys.modules and isinstance(code, CodeType)
            and any(f in code.co_filename for f in files))


def _is_library_filter(entry: Any, libraries: frozenset[str]) -> bool:
    if not (isinstance(entry, tuple) and len(entry) == 5):
        return False
    action, message, category, module, lineno = entry
    name = f"{getattr(category, '__module__', '')}.{getattr(category, '__qualname__', '')}"
    return (message is None and module is None and lineno == 0
            and any((lib, action, name) == f for f in LIBRARY_FILTERS for lib in libraries))


def _library_filters(old: list, new: list, before: State) -> bool:
    """Whether the filters went from `old` to `new` only by the ones libraries first imported in this window add."""
    fresh = _loaded() - before.libraries
    return bool(fresh) and [f for f in new if not _is_library_filter(f, fresh)] == old


def accept_current() -> None:
    """Take the watched namespaces as they are now as the originals: for a test that replaces a torch function on
    purpose (a CPU stand-in for a CUDA-only op), before judging and again after undoing it."""
    ORIGINALS.clear()
    ORIGINALS.update({name: dict(vars(ns)) for name, ns in _namespaces().items()})
    FOREIGN.clear()


def take() -> State:
    """The watched state now (namespaces seen for the first time join the originals)."""
    settings = {}
    for name, (read, _) in _settings().items():
        try:
            settings[name] = read()
        except Exception:  # a backend without the setting: nothing to watch
            continue
    attrs = {}
    for name, ns in _namespaces().items():
        attrs[name] = dict(vars(ns))
        ORIGINALS.setdefault(name, attrs[name])
    return State(attrs=attrs, settings=settings, rng=torch.get_rng_state(), libraries=_loaded(),
                 accepted=_accepted_count())


@contextlib.contextmanager
def pristine() -> Iterator[None]:
    """The watched namespaces as originally loaded, for the oracle; whatever was there before comes back after."""
    spaces = _namespaces()
    swapped: list[tuple[Any, str, Any]] = []
    for space, names in ORIGINALS.items():
        target = spaces.get(space)
        if target is None:
            continue
        now = vars(target)
        for name, obj in names.items():
            current = now.get(name, _MISSING)
            if current is not obj:
                swapped.append((target, name, current))
                setattr(target, name, obj)
        if space == "torch.Tensor":
            for name in set(now) - set(names):
                swapped.append((target, name, now[name]))
                delattr(target, name)
    try:
        yield
    finally:
        for target, name, obj in reversed(swapped):
            if obj is _MISSING:
                delattr(target, name)
            else:
                setattr(target, name, obj)


def changes(before: State) -> list[str]:
    """What differs from `before`, named (e.g. "torch.nn.functional.silu replaced", "default dtype
    torch.float32 -> torch.float64"); a library's own first-import changes (`LIBRARY_WRAPPERS`, `LIBRARY_FILTERS`)
    are left out."""
    found = []
    spaces = _namespaces()
    for space, names in before.attrs.items():
        now = vars(spaces[space]) if space in spaces else {}
        for name, obj in names.items():
            current = now.get(name, _MISSING)
            if current is not obj and not _library_wrapper(f"{space}.{name}", obj, current, before):
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
        if value != before.settings[name] and not (
                name == "warning filters" and _library_filters(before.settings[name], value, before)):
            found.append(f"{name} {_short(before.settings[name])} -> {_short(value)}")
    return found


def restore(before: State, *, rng: bool = True) -> None:
    """Put back everything `changes` watches (and the RNG state, unless `rng=False`: between two runs of one
    kernel the random stream goes on, so a kernel whose output depends on it is seen to be nondeterministic)."""
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
    if rng and before.rng is not None:
        torch.set_rng_state(before.rng)


#: watched settings that guard the judge itself (its deadline, Ctrl-C and SIGTERM): never accepted
_SAFEGUARDS = ("SIGINT handler", "SIGTERM handler", "blocked signals")
#: the changes `accept_process_state` accepted in this process, in order (the oldest dropped past _KEPT)
_ACCEPTED: list[str] = []
_dropped = 0
_KEPT = 10_000


def _accepted_count() -> int:
    return _dropped + len(_ACCEPTED)


def accepted(before: State) -> list[str]:
    """The changes `accept_process_state` accepted since `before` was taken, named like `changes` names them, with
    " (accepted)" after each: what a verdict records so that a reader sees them."""
    return _ACCEPTED[max(before.accepted - _dropped, 0):]


def acceptable() -> list[str]:
    """The names `accept_process_state` takes: the watched settings but the judge's own safeguards."""
    return [name for name in _settings() if name not in _SAFEGUARDS]


def accept_process_state(*names: str) -> contextlib.AbstractContextManager[None]:
    """Accept, inside a `with` block, changes to the named process settings (e.g. `"warning filters"`, `"thread
    count"`; `acceptable()` lists them) that a kernel or its library makes on purpose: they are not charged to the
    case. What changed is put back when the block ends (no later code, and no other case, sees it) and recorded
    (`accepted`). Use it around the code that makes the change, in `run` or around an import in an adapter module:

        with accept_process_state("warning filters"):
            out = library_kernel(x)

    Each setting must be named; a name in a namespace the oracle computes with (`torch.*`,
    `torch.nn.functional.*`, `reference.*`, ...) or a safeguard of the judge's is refused here, with ValueError."""
    if not names:
        raise ValueError("accept_process_state: name what it accepts (e.g. \"warning filters\"); "
                         f"it can accept: {', '.join(acceptable())}")
    settings = _settings()
    for name in names:
        space = max((ns for ns in _namespaces() if name == ns or name.startswith(ns + ".")), key=len, default=None)
        if space is not None:
            raise ValueError(f"accept_process_state: {name!r} is in {space}, a namespace the oracle computes with; a "
                             "kernel may never change it, accepted or not")
        if name in _SAFEGUARDS:
            raise ValueError(f"accept_process_state: {name!r} guards the judge itself (its deadline and Ctrl-C); "
                             "it cannot be accepted")
        if name not in settings:
            raise ValueError(f"accept_process_state: unknown process state {name!r}; it can accept: "
                             f"{', '.join(acceptable())}")
    return _accepting({name: settings[name] for name in names})


@contextlib.contextmanager
def _accepting(settings: dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]]) -> Iterator[None]:
    global _dropped
    entry = {}
    for name, (read, _) in settings.items():
        with contextlib.suppress(Exception):  # a backend without the setting: nothing to accept
            entry[name] = read()
    try:
        yield
    finally:
        for name, value in entry.items():
            read, write = settings[name]
            with contextlib.suppress(Exception):
                now = read()
                if now != value:
                    _ACCEPTED.append(f"{name} {_short(value)} -> {_short(now)} (accepted)")
                    write(value)
        if len(_ACCEPTED) > _KEPT:  # a long sweep: only recent windows are ever asked about
            drop = len(_ACCEPTED) - _KEPT // 2
            _dropped += drop
            del _ACCEPTED[:drop]


def _short(value: Any) -> str:
    text = str(value) if not isinstance(value, list) else f"{len(value)} entries"
    return text if len(text) <= 60 else text[:57] + "..."


class KernelExit(BaseException):
    """The kernel called `os._exit`; refused, so that the process and every verdict after it survive."""


class Containment:
    """While a kernel runs (`with Containment() as c:`): `os._exit` raises `KernelExit` instead of ending the
    process (only in this process: a child the kernel forked still exits), and a real Ctrl-C is told apart from a
    KeyboardInterrupt the kernel raises itself (`c.interrupted`)."""

    def __init__(self) -> None:
        self.interrupted = False
        self._pid = os.getpid()
        self._exits: dict[ModuleType, Callable[[int], Any]] = {}
        self._old_sigint: Any = None

    def _refuse_exit(self, status: int = 0) -> None:
        if os.getpid() != self._pid:
            self._exits[os](status)
        raise KernelExit(f"the kernel called os._exit({status})")

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.interrupted = True
        raise KeyboardInterrupt

    def __enter__(self) -> Containment:
        import posix

        for module in (os, posix):
            self._exits[module] = module._exit
            module._exit = self._refuse_exit  # type: ignore[assignment]
        if threading.current_thread() is threading.main_thread():
            self._old_sigint = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc: object) -> None:
        for module, original in self._exits.items():
            module._exit = original  # type: ignore[assignment]
        if self._old_sigint is not None:
            signal.signal(signal.SIGINT, self._old_sigint)
