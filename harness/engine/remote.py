"""Adapters as the judge sees them: declarations read from a kernel host, kernel runs sent to it.

`open_adapter(spec, device)` starts (or reuses) the host for `spec` on `device` and returns a `RemoteAdapter`: an
`Adapter` whose fields come from the host's description and whose rules (`requires`, `conventions_for`,
`interp_features`) and library import are asked of the host, the answers cached. Its kernel never runs in this
process: the runner sends each run to `adapter.host` (`harness.engine.runner`). `expand(specs)` lists adapters
(the groups `all` and `external`, lists and factories under `module:object`) through a host too, so the judge never
imports an adapter module, not even to learn their names.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.core.case import Case
from harness.core.device import LISTING_DEVICE, DeviceInfo
from harness.core.known import KnownFinding
from harness.engine import family_cache
from harness.engine.host import Host, HostDied, close_hosts
from harness.registry import Adapter, Library, SupportRuleError


class HostError(RuntimeError):
    """A host could not describe or list adapters (its module failed, it died while importing)."""


@dataclass(frozen=True)
class RemoteLibrary(Library):
    """A library as its host found it: installed or not, and its provenance label."""

    reported_label: str = ""
    reported_missing: str | None = None

    def label(self) -> str:
        return self.reported_label

    def missing(self) -> str | None:
        return self.reported_missing


def _ask(host: Host, msg: tuple, what: str) -> dict[str, Any]:
    try:
        reply = host.ask(msg)
    except HostDied as e:
        raise HostError(f"{what}: {e}") from None
    if "error" in reply:
        raise HostError(f"{what}: {reply['error']}")
    return reply


def _no_local_run(case: Case, inputs: Any, outputs: Any) -> None:
    raise RuntimeError("a remote adapter's kernel runs in its host (harness.engine.runner sends it there)")


def _requires_marker(device: Any, features: Any, shapes: Any = None) -> None:  # answered by `_rule` below
    return None


@dataclass(frozen=True)
class RemoteAdapter(Adapter):
    """An adapter whose module lives in a kernel host (`host`); `spec` names it there."""

    spec: str = ""
    host: Host | None = field(default=None, compare=False, repr=False)
    rule_kind: str | None = None  # None: no rule; "cell": the rule ignores shapes; "shapes": it takes them
    notes: tuple[str, ...] = ()  # what the host said its module changed on import (diagnostics)
    tampered: str = ""  # how another module changed its declarations in the host (`registry.sealed`)
    module: str | None = None  # the module of its run function (in the host)
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def _asked(self, key: tuple, msg: tuple) -> dict[str, Any]:
        k = json.dumps(key, sort_keys=True, default=str)
        if k not in self._cache:
            assert self.host is not None
            self._cache[k] = _ask(self.host, msg, f"adapter {self.name}")
        return self._cache[k]

    def prefetch_rules(self, device: DeviceInfo | None, cells: Sequence[Mapping[str, str]],
                       shapes: Sequence[Mapping[str, int]] | None = None) -> None:
        """The rule's answers for `cells` asked in one request instead of one each (planning asks thousands: each a
        round trip to the host): whole cells, or each with its `shapes` (where the rule takes shapes)."""
        if self.rule_kind is None or (shapes is not None and self.rule_kind != "shapes"):
            return
        dev = None if device is None else device.to_dict()
        asked = [(dict(c), None if shapes is None else dict(shapes[i])) for i, c in enumerate(cells)]
        keys = {json.dumps(("rule", dev, c, s), sort_keys=True, default=str): (c, s) for c, s in asked}
        todo = [k for k in keys if k not in self._cache]
        if not todo:
            return
        assert self.host is not None
        msg = ("rules", self.spec, dev, [keys[k][0] for k in todo]) + (
            () if shapes is None else ([keys[k][1] for k in todo],))
        reply = _ask(self.host, msg, f"adapter {self.name}")
        for k, answer in zip(todo, reply.get("ok", [])):
            self._cache[k] = answer

    def _rule(self, device: DeviceInfo | None, features: Mapping[str, str],
              shapes: Mapping[str, int] | None) -> str | None:
        if self.rule_kind is None:
            return None
        if self.rule_kind == "cell":
            shapes = None
        dev = None if device is None else device.to_dict()
        reply = self._asked(("rule", dev, dict(features), None if shapes is None else dict(shapes)),
                            ("rule", self.spec, dev, dict(features), None if shapes is None else dict(shapes)))
        if "rule_error" in reply:
            raise SupportRuleError(reply["rule_error"])
        return reply.get("ok")

    def case_unsupported(self, device: DeviceInfo, features: Mapping[str, str],
                         shapes: Mapping[str, int]) -> str | None:
        return self._rule(device, features, shapes) if self.rule_kind == "shapes" else None

    def _check_known_case(self, found: KnownFinding) -> None:
        """Checked in the host, which made the adapter (asking the rule here would cost a request per finding)."""

    def conventions_of(self, case: Case, device: DeviceInfo) -> dict[str, Any]:
        from harness.core import conventions as conv

        merged = dict(self.conventions)
        if self.conventions_for is not None:
            reply = self._asked(("conventions", case.to_dict(), device.to_dict()),
                                ("conventions", self.spec, case.to_dict(), device.to_dict()))
            if "ok" not in reply:
                raise ValueError(reply.get("error", "conventions_for failed"))
            conv.validate(self.op, reply["ok"], f"adapter {self.name!r}: conventions_for")
            merged.update(reply["ok"])
        return merged

    def library_error(self) -> str:
        if self.library is None:
            return ""
        try:
            return str(self._asked(("library",), ("library", self.spec)).get("ok", ""))
        except HostError as e:
            return str(e)


def _interp(adapter_ref: list[RemoteAdapter]) -> Any:
    def interp_features(features: Mapping[str, str]) -> set[str]:
        a = adapter_ref[0]
        return set(a._asked(("interp", dict(features)), ("interp", a.spec, dict(features))).get("ok", []))

    return interp_features


def _marker_conventions_for(case: Case, device: DeviceInfo) -> Mapping[str, Any]:  # answered by conventions_of
    return {}


def from_manifest(m: Mapping[str, Any], spec: str, host: Host) -> RemoteAdapter:
    """The judge's view of the adapter a host described."""
    lib = m.get("library")
    library = None if lib is None else RemoteLibrary(
        distribution=lib["distribution"], module=lib["module"], written_for=lib["written_for"],
        install=lib["install"], reported_label=lib["label"], reported_missing=lib["missing"])
    limits = {k: tuple(v) if isinstance(v, list) else v for k, v in (m.get("limits") or {}).items()}
    ref: list[RemoteAdapter] = []
    adapter = RemoteAdapter(
        name=m["name"], op=m["op"], source=m["source"], run=_no_local_run,
        support={k: tuple(v) for k, v in m["support"].items()}, generations=tuple(m["generations"]),
        conventions=dict(m["conventions"]), properties=frozenset(m["properties"]), limits=limits,
        requires=_requires_marker if m.get("rule") else None,
        interp_features=_interp(ref) if m.get("interp_features") else None, description=m.get("description", ""),
        test_aid=bool(m.get("test_aid")), conventions_for=_marker_conventions_for if m.get("conventions_for") else None,
        library=library, spec=spec, host=host, rule_kind=m.get("rule"),
        notes=tuple([*m.get("import_changes", []), *m.get("import_accepted", [])]), tampered=m.get("tampered") or "",
        known=tuple(KnownFinding.from_dict(k) for k in m.get("known", [])), module=m.get("module"))
    ref.append(adapter)
    return adapter


#: the top-level packages of this repository's own adapters (our kernels, the references): trusted alike
OWN_PACKAGES = ("kernels", "reference", "harness")
#: the family of this repository's own adapters registered by name (`host_family`)
OWN_FAMILY = family_cache.OWN


def host_family(adapter: Any) -> str | None:
    """Which adapters may share a kernel host with this one (None: it gets a host of its own): those of one
    installed library (its distribution: one body of code, trusted or not as a whole), and this repository's own
    adapters when registered by name. A user's `module:object`, another package's entry point and a test's fixture
    each keep a host of their own, so that a kernel that tampers with its host reaches no other adapter's
    verdicts."""
    library = adapter.library.distribution if adapter.library is not None else None
    return family_of(getattr(adapter, "spec", "") or adapter.name, getattr(adapter, "module", None), library)


def manifest_family(spec: str, manifest: Mapping[str, Any]) -> str | None:
    """`host_family` of the adapter a host described in `manifest` (a listing's), loaded by `spec`."""
    lib = manifest.get("library")
    return family_of(spec, manifest.get("module"), lib.get("distribution") if lib else None)


def family_of(spec: str, module: str | None, library: str | None) -> str | None:
    if os.environ.get("MOE_HARNESS_SHARED_HOSTS", "") in ("0", "off"):  # every adapter a host of its own
        return None
    if library is not None:
        return f"library:{library}"
    if ":" not in spec and (module or "").split(".")[0] in OWN_PACKAGES:
        return OWN_FAMILY
    return None


#: (spec, device, TRITON_INTERPRET) -> the adapter and its host, least recently used first
_OPEN: dict[tuple[str, str, str], RemoteAdapter] = {}
#: the same keys -> the adapter's host family (`host_family`), as it was opened
_FAMILIES: dict[tuple[str, str, str], str | None] = {}
#: kernel hosts one judging process keeps running, on a GPU and elsewhere: each is a process with torch loaded and,
#: on a GPU, a CUDA context (hundreds of MB of device memory), and a pytest worker meets every adapter. The least
#: recently used one is stopped beyond this; its adapter object stays usable (a stopped host starts again on the
#: next request, which names the adapter it needs, at the cost of importing the adapter's module again)
MAX_OPEN_HOSTS = {"cuda": 3, "cpu": 24}


def _cap(device: str) -> int:
    return MAX_OPEN_HOSTS["cuda" if device.startswith("cuda") else "cpu"]


def open_adapter(spec: str, device: str, *, host: Host | None = None, spare: Host | None = None,
                 family: str | None = None) -> RemoteAdapter:
    """The adapter `spec` (a registered name or `module:object[#name]`) in a kernel host of its own on `device`
    (or in `host`, shared with other adapters, to read their declarations: planning runs no kernel). spare: a host
    on `device` started ahead and holding no adapter yet, to load it into instead of starting one (unused when the
    adapter's host is open already, or when the spare was started for another family: its Triton cache folder is
    that family's, `family_cache`). family: its `host_family`; an open host of that family on `device` takes it
    instead of a new one. ValueError when the spec names no adapter, HostError when the host cannot load it."""
    if host is not None:
        return _described(spec, host)
    # a host takes the judge's environment when it starts: one started under another TRITON_INTERPRET (a test that
    # ran a CPU command in this process) compiled its kernels the other way, so it is not this request's host
    key = (spec, device, os.environ.get("TRITON_INTERPRET", ""))
    if key in _OPEN:
        _OPEN[key] = _OPEN.pop(key)  # now the most recently used
        return _OPEN[key]
    mate = next((a for k, a in reversed(_OPEN.items()) if family is not None and k[1:] == key[1:]
                 and _FAMILIES.get(k) == family and a.host is not None and a.host.alive()), None)
    if mate is None:
        _stop_least_recent(device)
    kind = family or spec  # its Triton cache folder (`family_cache`): a spare started for another is not its host
    fresh = spare if spare is not None and spare.family == kind else None
    _OPEN[key] = _described(spec, mate.host if mate is not None else fresh or Host(device, family=kind))
    _FAMILIES[key] = family
    return _OPEN[key]


def _stop_least_recent(device: str) -> None:
    """Before a host starts on `device`: stop the least recently used hosts of its kind beyond the cap (hosts, not
    adapters: adapters of one family share one). Their adapter objects stay usable."""
    recent: dict[int, Host] = {}  # by the most recent use of any of its adapters
    for k, a in _OPEN.items():
        if _cap(k[1]) == _cap(device) and a.host is not None:
            recent.pop(id(a.host), None)
            recent[id(a.host)] = a.host
    hosts = list(recent.values())
    for old in hosts[: max(0, len(hosts) - _cap(device) + 1)]:
        if old.alive():
            old.close()


#: the manifests a host's listing returned (`expand`), by host: the process that listed them and each spec's. A
#: planning that describes every listed adapter again in that process asks nothing (61 round trips, each making the
#: manifest again in the host); a host started again since asks.
_LISTED: weakref.WeakKeyDictionary[Host, tuple[Any, dict[str, dict[str, Any]]]] = weakref.WeakKeyDictionary()


def _described(spec: str, host: Host) -> RemoteAdapter:
    listed = _LISTED.get(host)
    if listed is not None and listed[0] is host.proc and spec in listed[1]:
        return from_manifest(listed[1][spec], spec, host)
    reply = _ask(host, ("describe", spec), f"adapter {spec!r}")
    if "usage_error" in reply:
        raise ValueError(reply["usage_error"])
    return from_manifest(reply["ok"], spec, host)


def close_adapter(spec: str, device: str) -> None:
    """Stop the hosts of `spec` on `device` (one per TRITON_INTERPRET setting they were started under)."""
    for key in [k for k in _OPEN if k[:2] == (spec, device)]:
        found = _OPEN.pop(key)
        _FAMILIES.pop(key, None)
        if found.host is not None:
            found.host.close()


@atexit.register
def close_all() -> None:
    """Stop every open host together, within one deadline (harness.engine.host.close_hosts)."""
    hosts = [a.host for a in _OPEN.values() if a.host is not None]
    _OPEN.clear()
    _FAMILIES.clear()
    with contextlib.suppress(Exception):
        close_hosts(list({id(h): h for h in hosts}.values()))


@dataclass
class Catalog:
    """What a host found when it loaded the adapters: the specs to judge (groups expanded), their names, each
    one's description (`manifests`, by name) and the providers that failed to load."""

    specs: list[str]
    names: list[str]
    load_failures: dict[str, str]
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)

    def spec_of(self, name: str) -> str:
        return self.specs[self.names.index(name)] if name in self.names else name


def expand(specs: list[str], *, probe: bool = False, host: Host | None = None,
           early: dict[str, Any] | None = None) -> Catalog:
    """`registry.expand` (every registered adapter when `specs` is empty), done in a host; ValueError for a spec
    that names nothing. probe: first import the adapter modules in a probe child (an import that ends the process
    from C code is named, not fatal); early: the output of such a child started ahead (`harness.engine.early_probe`),
    used where it probed what the host would. host: a CPU host to do it in, left running (its adapters stay
    imported, for planning); default a new one, closed."""
    own = host is None
    host = host or Host(LISTING_DEVICE)
    try:
        reply = _ask(host, ("expand", list(specs), probe, early), "listing adapters")
    finally:
        if own:
            host.close()
    if "usage_error" in reply:
        raise ValueError(reply["usage_error"])
    manifests = dict(reply.get("manifests") or {})
    if not own:  # left running: its adapters may be described again (planning)
        _LISTED[host] = (host.proc, {spec: manifests[name] for spec, name in zip(reply["specs"], reply["names"])
                                     if name in manifests})
    return Catalog(list(reply["specs"]), list(reply["names"]), dict(reply.get("load_failures") or {}), manifests)
