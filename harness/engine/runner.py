"""Judge one case: build inputs, run the adapter under integrity checks, compare with the oracle.

`judge(case, adapter, device)` never raises for a kernel's misbehaviour: every outcome becomes a `Result` with a
verdict (pass | fail | error | unsupported | not-verifiable), a readable reason and per-check metrics.
Integrity checks on every case: outputs pre-filled with poison and every contract element required written;
inputs unchanged; shape, dtype and contractual strides; no NaN/Inf where the oracle has none; and, where the
adapter declares them, determinism (two runs bitwise equal) and batch invariance.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import functools
import gc
import math
import os
import re
import secrets
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from harness import ops, registry
from harness.core import isolation
from harness.core.case import Case
from harness.core.causes import EXTRA_RUNS
from harness.core.compare import Comparison, bits, compare_bounded, compare_codes, compare_exact, compare_set, run_bits
from harness.core.device import CACHED_MEMORY_KEPT_MB, DeviceInfo, release_cached_memory
from harness.core.layouts import contiguous_strides as _contiguous
from harness.core.result import Result
from harness.engine import chunked, large_lock
from harness.engine.arena import Arena, DeviceArena, arena_bytes
from harness.engine.device_share import DeviceShareError
from harness.engine.host import STICKY_CUDA, HostDied, KernelRaised
from harness.engine.hosted import REJECTIONS, KernelExitAttempt, contained_call, from_interpreter, where  # noqa: F401  (re-exported)
from harness.engine.interpreter import TRITON_VERSION, unverified_reason
from harness.engine.interpreter_faults import interpreter_fault
from harness.engine.remote import RemoteAdapter
from harness.ops.base import Check, OutputSpec
from harness.registry import Adapter, SupportRuleError, Unsupported

# The first run's output buffers hold "garbage" (finite values of assorted magnitudes, drawn from a generator this
# process seeds privately: nothing a kernel could recognise as the judge's, unlike a fixed pattern); the second
# run's hold poison pattern B (NaNs with a distinctive payload for floats). An element still holding its garbage
# after run 1 and pattern B after run 2 was never written. Pattern A is the older fixed first fill (kept for the
# tests that build buffers by hand).
_POISON: dict[torch.dtype, tuple[int, int]] = {
    torch.float64: (0x7FF8DEADBEEFDEAD, 0x7FF4BADC0FFEE000),
    torch.float32: (0x7FC0DEAD, 0x7FA0BEEF),
    torch.bfloat16: (0x7FDE, 0x7FAD),
    torch.float16: (0x7EAD, 0x7DEF),
    torch.float8_e4m3fn: (0x7F, 0xFF),
    torch.float8_e5m2: (0x7F, 0xFE),
    torch.int64: (0x5A5A5A5A5A5A5A5A, -0x5A5A5A5A5A5A5A5B),
    torch.int32: (0x5A5A5A5A, -0x5A5A5A5B),
    torch.int16: (0x5A5A, -0x5A5B),
    torch.int8: (0x5A, -0x5B),
    torch.uint8: (0xA5, 0x5A),
}


#: the phase a kernel run's time counts in (a verdict's metrics.time_s; the others: `_Judging.spent`)
_PHASE_OF_RUN = {"first run": "first_run", "second run": "second_run"}

#: a case on a GPU whose inputs hold at most this many elements is built and judged on the CPU when its kernel runs
#: in a kernel host (`_Judging.inputs`); larger ones on the GPU
CPU_JUDGED_ELEMENTS = 1 << 24

#: seconds the judge waits at the end of a case before it checks that no output changed after the kernel returned
SETTLE_S = 0.005
#: one judging in this many, drawn each time, also runs the kernel again (`fresh_inputs`)
FRESH_EVERY = 8


def fresh_selected() -> bool:
    """Whether this judging gets the extra runs: drawn from the OS's random source each time, never a function of the
    case (a kernel could tell, from its case alone, which runs are the checked ones)."""
    return secrets.randbelow(FRESH_EVERY) == 0
#: poisoned elements around every output buffer, each side: a write out of bounds within this distance is caught
GUARD_BYTES = 64 * 1024
#: an output's start in its band moves in steps of this many bytes (the alignment of torch's CUDA caching
#: allocator, so an output stays as aligned as one torch allocated) ...
PLACE_ALIGN = 512
#: ... by one of this many steps, drawn for every run
PLACE_STEPS = 128


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where an output lies in its band (elements): its strides, its span, the elements before it, the band's."""

    stride: tuple[int, ...]
    span: int
    lead: int
    size: int


def place(spec: OutputSpec) -> Placement:
    """Where an output of `spec` lies in its band, drawn from the OS's random source for each run, in both paths
    (the judge's process and a kernel host's arena): at least GUARD_BYTES of guard on each side, the rest of the
    slack before or after it. A fixed place would let a kernel tell from its output's storage offset or its
    address that it is being judged. The band's size depends on `spec` alone."""
    stride = spec.stride if spec.stride is not None else _contiguous(tuple(spec.shape))
    span = 0 if 0 in spec.shape else 1 + sum((n - 1) * st for n, st in zip(spec.shape, stride))
    step, guard = PLACE_ALIGN // spec.dtype.itemsize, GUARD_BYTES // spec.dtype.itemsize
    lead = guard + step * secrets.randbelow(PLACE_STEPS)
    return Placement(tuple(stride), span, lead, 2 * guard + step * (PLACE_STEPS - 1) + span)


def _int_view_dtype(dtype: torch.dtype) -> torch.dtype:
    return {1: torch.uint8 if dtype == torch.uint8 else torch.int8, 2: torch.int16, 4: torch.int32,
            8: torch.int64}[dtype.itemsize]


def _fill_poison(t: torch.Tensor, which: int) -> torch.Tensor:
    if t.dtype == torch.bool:
        return t.fill_(bool(which))
    pattern = _POISON[t.dtype][which]
    if t.dtype.is_floating_point:
        if t.dtype.itemsize == 1:
            pattern = pattern - 256 if pattern > 127 else pattern
        t.view(_int_view_dtype(t.dtype)).fill_(pattern)  # a view of the same storage, so strides are kept
    else:
        t.fill_(pattern)
    return t


_GARBAGE = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
_FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def _garbage(n: int, dtype: torch.dtype) -> torch.Tensor:
    """`n` values of `dtype` like stale memory: finite, assorted magnitudes and signs, never poison pattern B."""
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=_GARBAGE).bool()
    if dtype.is_floating_point:
        v = torch.randn(n, generator=_GARBAGE) * torch.exp2(torch.randint(-8, 9, (n,), generator=_GARBAGE).float())
        if dtype in _FP8_MAX:
            v = v.clamp(-_FP8_MAX[dtype], _FP8_MAX[dtype])
        return v.to(dtype)
    info = torch.iinfo(dtype)
    v = torch.randint(max(info.min, -2**62), min(info.max, 2**62), (n,), generator=_GARBAGE, dtype=torch.int64)
    v = v.to(dtype)
    b = _POISON[dtype][1]
    return torch.where(v == b, v ^ 1, v) if dtype in _POISON else v


#: a buffer larger than this is filled with one block of garbage repeated: drawing 2**31 values on the CPU took
#: tens of seconds a run (what the written check needs is a copy of what was there, not values never repeated)
GARBAGE_BLOCK = 1 << 22


def _fill(t: torch.Tensor, which: int) -> torch.Tensor:
    """Fill a 1-D buffer for run `which`: 0 garbage, 1 poison pattern B."""
    if which != 0 or t.dtype not in (*_POISON, torch.bool):
        return _fill_poison(t, which)
    n = t.numel()
    if n <= GARBAGE_BLOCK:
        return t.copy_(_garbage(n, t.dtype).to(t.device))
    block = _garbage(GARBAGE_BLOCK, t.dtype).to(t.device)
    whole = n - n % GARBAGE_BLOCK
    t[:whole].view(-1, GARBAGE_BLOCK).copy_(block.expand(whole // GARBAGE_BLOCK, -1))
    t[whole:].copy_(block[: n - whole])
    return t


@dataclasses.dataclass
class Band:
    """An output's whole allocation: `base[start:end]` holds the output, the rest is guard; `initial` is what the
    whole buffer held before the kernel ran (on the CPU), `shape` and `stride` the output's view of it."""

    base: torch.Tensor
    start: int
    end: int
    which: int
    initial: torch.Tensor | None = None
    shape: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()

    def untouched(self, t: torch.Tensor) -> torch.Tensor:
        """Which elements of output `t` still hold what this buffer held before the run (on `t`'s device)."""
        if self.initial is None or tuple(t.shape) != self.shape:
            return _is_poison(t, self.which)
        before = self.initial.as_strided(self.shape, self.stride, self.start)
        return bits(t.detach()) == bits(before.to(t.device))


def banded(spec: OutputSpec, device: str, which: int) -> tuple[torch.Tensor, Band]:
    """An output tensor of `spec` filled for run `which` (0 garbage, 1 poison B), inside a larger buffer of it, at
    a place drawn for this run (`place`)."""
    at = place(spec)
    base = _fill(torch.empty(at.size, dtype=spec.dtype, device=device), which)
    band = Band(base, at.lead, at.lead + at.span, which, base.detach().clone(), tuple(spec.shape), at.stride)
    return base.as_strided(tuple(spec.shape), at.stride, at.lead), band


def poisoned(spec: OutputSpec, device: str, which: int) -> torch.Tensor:
    """An output tensor of `spec` filled with poison pattern `which` (0 or 1), with guard bands."""
    return banded(spec, device, which)[0]


def _is_poison(t: torch.Tensor, which: int) -> torch.Tensor:
    if t.dtype == torch.bool or t.dtype not in _POISON:
        return torch.zeros(t.shape, dtype=torch.bool, device=t.device)
    ref = _fill_poison(torch.empty(t.shape, dtype=t.dtype, device=t.device), which)
    return bits(t.detach()) == bits(ref)


def _check(name: str, passed: bool, reason: str = "", **metrics: Any) -> Comparison:
    return Comparison(name, "integrity", passed, reason, metrics)


def _inside(band: Band, n: int) -> torch.Tensor:
    """Which of the `n` elements of a band's buffer the output views (a strided output leaves gaps in its span)."""
    inside = torch.zeros(n, dtype=torch.bool, device=band.base.device)
    if band.shape and len(band.stride) == len(band.shape) and 0 not in band.shape:
        inside.as_strided(band.shape, band.stride, band.start).fill_(True)
    else:
        inside[band.start:band.end] = True
    return inside


def _guard_hits(band: Band) -> tuple[int, int]:
    """How many elements of a band's buffer outside the output's view changed, and the first one's index. Only the
    guards are read where the view fills its span without gaps (a large output's span is gigabytes)."""
    size = band.base.numel()
    dense = band.end - band.start == math.prod(band.shape)
    count, first = 0, -1
    for lo, hi in ((0, band.start), (band.end, size)) if dense else ((0, size),):
        flat = band.base[lo:hi].detach()
        ref = band.initial[lo:hi].to(flat.device) if band.initial is not None else _fill_poison(
            torch.empty(flat.shape, dtype=flat.dtype, device=flat.device), band.which)
        hit = bits(flat) != bits(ref)
        if not dense:
            hit &= ~_inside(band, size)
        n = int(hit.sum())
        if n and first < 0:
            first = lo + int(hit.nonzero()[0, 0])
        count += n
    return count, first


def _guard_checks(bands: Mapping[str, Band], run: str) -> list[Comparison]:
    """Every guard element still holds its poison: the kernel wrote nothing just before or after an output, nor
    between the elements of a strided one."""
    found = []
    for name, band in bands.items():
        n, first = _guard_hits(band)
        if n:
            where = (f"{band.start - first} elements before its start" if first < band.start
                     else f"{first - band.end + 1} elements past its end" if first >= band.end
                     else f"{first - band.start} elements into its span, between the elements of its view")
            found.append(_check(f"guard:{name}", False, f"{name}: the {run} wrote {n} elements outside the output "
                                f"buffer (first {where})", out_of_bounds=n))
        else:
            found.append(_check(f"guard:{name}", True))
    return found


def _run_adapter(adapter: Adapter, case: Case, inputs: Mapping[str, torch.Tensor],
                 specs: Mapping[str, OutputSpec], device: str, which: int,
                 changed: list[str] | None = None) -> tuple[dict[str, torch.Tensor], dict[str, Band]]:
    """One kernel run on fresh poisoned outputs. What it changed in the process state is appended to `changed` and
    undone at once, so everything after (the comparisons included) runs in the judge's own state."""
    outputs, bands = {}, {}
    for name, spec in specs.items():
        outputs[name], bands[name] = banded(spec, device, which)
    before = isolation.take()
    try:
        returned = contained_call(adapter, case, inputs, outputs, device)
    except Exception as e:
        _by_kernel(e)
        raise
    finally:
        if changed is not None:
            changed += [c for c in isolation.changes(before) if c not in changed]
        isolation.restore(before, rng=False)
    if returned is not None:
        if not isinstance(returned, Mapping):
            raise _by_kernel(TypeError(f"adapter {adapter.name} returned {type(returned).__name__}, expected a dict "
                                       "or None"))
        outputs.update(returned)
    return outputs, bands


class HarnessFault(RuntimeError):
    """The judge's own work around a kernel run failed (its arena, its host's protocol): no kernel's fault."""


def _by_kernel(e: Exception) -> Exception:
    """`e`, marked as raised by the kernel's call (what is not marked was raised by the judge's own code)."""
    with contextlib.suppress(AttributeError):
        e.moe_harness_by_kernel = True  # type: ignore[attr-defined]
    return e


def _kernels(e: BaseException) -> bool:
    """Whether exception `e` is the kernel's (raised in its host, or by its call here), not the judge's."""
    return isinstance(e, (KernelRaised, HostDied)) or bool(getattr(e, "moe_harness_by_kernel", False))


def harness_error(what: str, e: BaseException, **metrics: Any) -> tuple[str, str, dict[str, Any]]:
    """(verdict, reason, metrics) of a case the judge could not judge because of its own failure: an `error` that
    names the harness (`harness_error` in its metrics), never the kernel."""
    return "error", f"harness error {what}: {type(e).__name__}: {e}", {"harness_error": True, **metrics}


def _send_run(adapter: RemoteAdapter, host: Any, case: Case, inputs: Mapping[str, Any],
              specs: Mapping[str, OutputSpec], which: int,
              judged_on: str = "cpu") -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Copy the inputs and poisoned output buffers into the host's arena and have it run the kernel there. The
    reply (JSON), the output buffers and the input copies as they are in the arena after the run. judged_on: the
    device the judge works on; a case judged on the GPU goes through a device arena both processes map (nothing
    crosses the CPU), unless GPU memory cannot be shared here."""
    layouts = {name: place(spec) for name, spec in specs.items()}
    need = [v for v in inputs.values() if isinstance(v, torch.Tensor)]
    need += [(spec.dtype, (layouts[n].size,), (1,)) for n, spec in specs.items()]
    arena = _reserved_arena(host, judged_on, need)
    shared_in, msg_in = {}, {}
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor):
            shared_in[k], slot = arena.put(v)
            msg_in[k] = {"slot": dataclasses.asdict(slot)}
        else:
            msg_in[k] = {"value": v}
    shared_bands, msg_out = {}, {}
    for name, spec in specs.items():
        at = layouts[name]
        base, slot = arena.empty(spec.dtype, (at.size,), (1,))
        _fill(base, which)
        shared_bands[name] = (base, Band(base, at.lead, at.lead + at.span, which, base.clone(), tuple(spec.shape),
                                         at.stride))
        msg_out[name] = {"band": dataclasses.asdict(slot), "start": at.lead, "shape": list(spec.shape),
                         "stride": list(at.stride)}
    if arena.kind == "cuda":
        torch.cuda.synchronize(torch.device(judged_on))  # the copies and fills are in memory before the host reads it
    if not host.alive():
        host.start()
    if arena.sent_to != host.proc.pid:  # a new arena, or a new host: hand it the file
        shared = host.ask(("arena" if arena.kind == "cpu" else "device_arena", arena.size), fd=arena.fd)
        if "device_arena_error" in shared:  # this host cannot map GPU memory of the judge's: shared memory then
            _no_device_arena(host, f"the kernel host could not map it: {shared['device_arena_error']}")
            return _send_run(adapter, host, case, inputs, specs, which, "cpu")
        if "error" in shared:
            raise HarnessFault(f"the kernel host could not map the arena: {shared['error']}")
        arena.sent_to = host.proc.pid
    reply = host.ask(("run", adapter.spec, case.to_dict(), (arena.kind, arena.size), msg_in, msg_out))
    if "error" in reply:
        raise HarnessFault(f"the kernel host could not run the case: {reply['error']}")
    return reply, shared_bands, shared_in


#: a device arena past this many bytes is released after its case (`release_device_arena`), as torch's cached
#: blocks are past CACHED_MEMORY_KEPT_MB: many judges and hosts share one GPU
DEVICE_ARENA_KEPT_BYTES = CACHED_MEMORY_KEPT_MB * 2**20


def _reserved_arena(host: Any, judged_on: str, need: list[Any]) -> Arena:
    """The host's arena for one run, with room for `need`: a device arena for a case judged on the GPU, where GPU
    memory can be shared with the host; else its shared-memory arena."""
    if (judged_on != "cpu" and str(getattr(host, "device", "")).startswith("cuda")
            and getattr(host, "device_share_error", "") is None):
        nbytes = arena_bytes(need, DeviceArena.align)
        try:
            if host.device_arena is None:
                host.device_arena = DeviceArena(nbytes, judged_on)
            else:
                host.device_arena.reserve(nbytes)
            return host.device_arena
        except DeviceShareError as e:
            _no_device_arena(host, str(e))
    if host.arena is None:
        host.arena = Arena()
    host.arena.reserve(arena_bytes(need))
    return host.arena


def _no_device_arena(host: Any, why: str) -> None:
    """This host's runs go through shared memory from now on, and why (`host.device_share_error`)."""
    host.device_share_error = why
    if host.device_arena is not None:
        host.device_arena.close()
        host.device_arena = None


def release_device_arena(adapter: Any) -> None:
    """After a case: a device arena past DEVICE_ARENA_KEPT_BYTES goes back to the GPU, in the judge and (asked) in
    its host. A host that keeps its mapping keeps only that memory, until it ends: the driver never hands it to
    the judge again."""
    host = getattr(adapter, "host", None)
    arena = getattr(host, "device_arena", None)
    if arena is None or arena.size <= DEVICE_ARENA_KEPT_BYTES:
        return
    if host.alive() and arena.sent_to == host.proc.pid:
        with contextlib.suppress(HostDied):
            host.ask(("drop_device_arena",), deadline=60.0)
    arena.close()
    host.device_arena = None


def _reported_problems(meta: Mapping[str, Any], spec: OutputSpec, device: str) -> list[str]:
    """What is wrong with an output the kernel returned, from its host's description of it."""
    if meta.get("type") != "Tensor" or meta.get("layout") != str(torch.strided):
        return [f"a {meta.get('type')} with layout {meta.get('layout')}, not a plain strided torch.Tensor"]
    problems = [f"its values could not be read ({meta['copy_error']})"] if meta.get("copy_error") else []
    got, want = torch.device(meta["device"]), torch.device(device)
    if got.type != want.type or (want.index is not None and got.index != want.index):
        problems.append(f"on device {got}, the case runs on {device}")
    if tuple(meta["shape"]) != tuple(spec.shape):
        problems.append(f"shape {list(meta['shape'])} != {list(spec.shape)}")
    if meta["dtype"] != str(spec.dtype).removeprefix("torch."):
        problems.append(f"dtype torch.{meta['dtype']} != {spec.dtype}")
    if (spec.stride is not None and not problems and 0 not in spec.shape
            and tuple(meta["stride"]) != tuple(spec.stride)):
        problems.append(f"strides {tuple(meta['stride'])} != contractual {spec.stride}")
    return problems


def _on_device(t: torch.Tensor, device: str) -> bool:
    want = torch.device(device)
    if t.device.type != want.type:
        return False
    if want.type == "cuda":
        return t.device.index == (want.index if want.index is not None else torch.cuda.current_device())
    return True


def _structure_checks(specs: Mapping[str, OutputSpec], outputs: Mapping[str, Any], device: str,
                      reported: Mapping[str, Mapping[str, Any]] | None = None,
                      copies_on: str | None = None) -> list[Comparison]:
    """Each output is a plain strided tensor of its spec's shape, dtype and contractual strides on the case's
    device; `reported`: outputs a kernel host said its kernel returned, judged from that description; `copies_on`:
    where the judge's copies of the outputs a kernel host wrote live (their device says nothing of the kernel)."""
    found = []
    for name, spec in specs.items():
        if reported and name in reported:
            problems = _reported_problems(reported[name], spec, device)
            why = f"output {name!r}: " + "; ".join(problems) if problems else ""
            found.append(_check(f"output:{name}", not problems, why))
            continue
        t = outputs.get(name)
        if not isinstance(t, torch.Tensor):
            why = f"output {name!r} missing or not a tensor ({type(t).__name__})"
            found.append(_check(f"output:{name}", False, why))
            continue
        problems = []
        if type(t) is not torch.Tensor or t.layout != torch.strided:  # a subclass could answer anything it is asked
            problems.append(f"a {type(t).__name__} with layout {t.layout}, not a plain strided torch.Tensor")
        elif not _on_device(t, copies_on or device):
            problems.append(f"on device {t.device}, the case runs on {device}")
        if tuple(t.shape) != tuple(spec.shape):
            problems.append(f"shape {list(t.shape)} != {list(spec.shape)}")
        if t.dtype != spec.dtype:
            problems.append(f"dtype {t.dtype} != {spec.dtype}")
        # a tensor with no elements has no memory layout to honour (its strides are whatever torch made up)
        if (spec.stride is not None and tuple(t.shape) == tuple(spec.shape) and t.numel() > 0
                and tuple(t.stride()) != spec.stride):
            problems.append(f"strides {t.stride()} != contractual {spec.stride}")
        why = f"output {name!r}: " + "; ".join(problems) if problems else ""
        found.append(_check(f"output:{name}", not problems, why))
    return found


def _unwritten(name: str, first: torch.Tensor, first_band: Band, second: torch.Tensor | None,
               second_band: Band | None, mask: torch.Tensor | None) -> Comparison:
    sus = first_band.untouched(first)
    if second is not None and second_band is not None:
        sus &= second_band.untouched(second)
    if mask is not None:
        sus &= mask.to(sus.device).expand_as(sus)
    return _element_check(f"written:{name}", sus, "unwritten", lambda n, at: f"{name}: {n} of {first.numel()} "
                          f"contract elements never written (poison survived; first at {at})")


def _touched(name: str, first: torch.Tensor, band: Band, untouched: torch.Tensor) -> Comparison:
    """Elements the contract leaves to the caller (Check.untouched) still hold what their buffer held before."""
    bad = ~band.untouched(first) & untouched.to(first.device).expand(first.shape)
    return _element_check(f"untouched:{name}", bad, "touched", lambda n, at: f"{name}: {n} elements outside the "
                          f"contract were written (the kernel must leave them as they were; first at {at})")


def _element_check(check: str, bad: torch.Tensor, count_key: str, why: Callable[[int, list[int]], str]) -> Comparison:
    """A check that fails on the elements marked in `bad`, naming how many and the first ones."""
    n = int(bad.sum())
    if n == 0:
        return _check(check, True)
    idx = bad.nonzero()[:5].tolist()
    return _check(check, False, why(n, idx[0]), **{count_key: n}, first_indices=idx)


def _compare(check: Check, actual: torch.Tensor, outputs: Mapping[str, torch.Tensor]) -> Comparison:
    if check.mode == "exact":
        return compare_exact(check.name, actual, check.expected, mask=check.mask)
    if check.mode == "set":
        return compare_set(check.name, actual, check.expected, mask=check.mask)
    if check.mode == "codes":
        return compare_codes(check.name, actual, check.expected, k=check.k, step_of=check.step_of, mask=check.mask)
    if check.mode == "bounded":
        return compare_bounded(check.name, actual, check.expected, check.bound, mask=check.mask)
    if check.mode == "custom":
        return check.judge(actual, outputs)
    raise ValueError(f"unknown comparison mode {check.mode!r} for output {check.name!r}")


def _finite(check: Check, actual: torch.Tensor) -> Comparison | None:
    if check.expected is None or not actual.dtype.is_floating_point or actual.dtype.itemsize == 1:
        return None
    exp_finite = check.expected.detach().to(actual.device).isfinite()
    bad = exp_finite & ~actual.detach().isfinite()
    if check.mask is not None:
        bad &= check.mask.to(actual.device).expand_as(bad)
    n = int(bad.sum())
    return _check(f"finite:{check.name}", n == 0,
                  f"{check.name}: {n} NaN/Inf elements where the oracle is finite" if n else "", nonfinite=n)


def _unchanged(inputs: Mapping[str, torch.Tensor], snapshot: Mapping[str, torch.Tensor]) -> list[Comparison]:
    found = []
    for name, before in snapshot.items():
        after = inputs[name]
        same = after.shape == before.shape and torch.equal(bits(after.detach()), bits(before.to(after.device)))
        found.append(_check(f"unchanged:{name}", same, "" if same else f"input {name!r} was modified by the kernel"))
    return found


def _summary(checks: list[Comparison]) -> tuple[str, dict[str, Any]]:
    """The reason and metrics of a judging's checks. Where the first run failed, the extra runs drawn at random (one
    judging in eight) repeat its failure: the reason, margin and error are the first run's, so a verdict reads the
    same whether or not they were drawn (`failed_checks` names every failed check)."""
    failed = [c for c in checks if not c.passed]
    if any(not c.name.startswith(EXTRA_RUNS) for c in failed):
        checks = [c for c in checks if not c.name.startswith(EXTRA_RUNS)]
    metrics: dict[str, Any] = {}
    margins = [c.metrics["margin"] for c in checks if "margin" in c.metrics]
    if margins:
        metrics["margin"] = max(margins)
    errs = [c.metrics["max_error"] for c in checks if "max_error" in c.metrics]
    if errs:
        metrics["max_error"] = max(errs)
    metrics["failed_checks"] = [c.name for c in failed]
    return "; ".join(c.reason for c in checks if not c.passed), metrics


def _describe(e: BaseException) -> str:
    """The exception and its causes: a Triton CompilationError names the failing line, its cause says why."""
    if isinstance(e, KernelRaised):
        return str(e)
    parts, seen = [], set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen and len(parts) < 4:
        seen.add(id(cur))
        parts.append(f"{type(cur).__name__}: {cur}".strip())
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
    return " <- caused by ".join(parts)


def _words(text: str) -> str:
    return re.sub(r"[\s_\-]+", " ", text.lower())


def rejects_cleanly(e: BaseException, features: Mapping[str, str]) -> bool:
    """Whether exception `e` rejects an undeclared cell `features` cleanly: `Unsupported` or `NotImplementedError`
    with a message, or any exception whose message (or a cause's) names an axis or a value of the cell (case,
    spaces, `_` and `-` ignored, whole words only). A bare `assert`, or a crash that names nothing of the cell, does
    not say what is unsupported: the matrix and the pytest plugin both judge it an error (one rule, here)."""
    if isinstance(e, REJECTIONS) and str(e).strip():
        return True
    said, seen, cur = [], set(), e
    if isinstance(e, KernelRaised):  # raised in a kernel host: what it reported of the exception
        if e.info.get("rejection"):
            return True
        said, cur = [m.partition(": ")[2] for m in e.info.get("chain", [])], None
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        said.append(str(cur))
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
    text = _words(" ".join(said))  # whole words: "none" must not match inside "NoneType"
    return any(re.search(rf"(?<![a-z0-9]){re.escape(_words(w))}(?![a-z0-9])", text)
               for w in [*features, *features.values()] if len(w) > 1)


def turned_away_whole(adapter: Adapter, device: DeviceInfo) -> tuple[str, str] | None:
    """(verdict, reason) when the gate turns away every case of `adapter` on `device` before anything of the
    adapter's runs: it does not run on this generation, or its library is not installed (the gate's first rules)."""
    device = adapter.device_for(device)
    if device.generation not in adapter.generations:
        return "unsupported", f"{adapter.name} does not run on {device.generation}"
    if (missing := adapter.not_installed()) is not None:
        return "not-installed", missing
    return None


class CaseTimeout(BaseException):
    """The case ran past its timeout. A BaseException, so that no `except Exception` on the way swallows it."""


def _timeout_s(timeout: float | None) -> float | None:
    if timeout is None and os.environ.get("HARNESS_CASE_TIMEOUT"):
        timeout = float(os.environ["HARNESS_CASE_TIMEOUT"])
    return timeout if timeout and timeout > 0 else None


def _hard_grace(seconds: float) -> float:
    return max(5.0, 0.25 * seconds)


def _arm_hard_stop(seconds: float) -> None:
    for stream in (sys.stderr, sys.__stderr__):  # pytest's capture replaces stderr with an object without a file
        try:
            faulthandler.dump_traceback_later(seconds, exit=True, file=stream)
            return
        except (AttributeError, ValueError, OSError):
            continue


@contextlib.contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    # SIGALRM interrupts a Python-level hang (the Triton interpreter, a Python loop) on the main thread of a Unix
    # process. A hang inside one C call never returns to Python: faulthandler's watchdog thread then prints every
    # thread's stack and ends the process with status 1 after a grace period (the sweep and replay run cases in
    # child processes, and pytest-xdist reports the test as crashed; never a silent wait).
    if seconds is None or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise CaseTimeout(f"no verdict within {seconds:g}s (the kernel never returned)")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    _arm_hard_stop(seconds + _hard_grace(seconds))
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def judge(case: Case, adapter: Adapter, device: DeviceInfo, *, unverifiable: set[str] | None = None,
          timeout: float | None = None, inputs: Mapping[str, Any] | None = None,
          keep: dict[str, Any] | None = None, extra_runs: Mapping[str, Any] | None = None) -> Result:
    """Run `case` on `adapter` on `device` and judge it. Never raises for kernel misbehaviour.

    The oracle's expected outputs are computed before the kernel runs, with the torch and `reference` functions as
    they were when the harness loaded (`isolation.pristine`); every kernel run (the second one and the
    batch-invariance one included) is contained: what it changes in the process state is undone and fails the case,
    an exit it attempts is refused and fails the case. timeout: seconds (default: $HARNESS_CASE_TIMEOUT, else none);
    a case running past it is an error verdict ("hang: ..."), where the process can interrupt it (main thread, Unix).
    inputs: the case's inputs, built already from its seed (`OpSpec.make_inputs`): the judge works on copies of them
    instead of building its own (a differential run hands the same tensors to two devices). keep: a dict the judge
    fills with the first run's outputs (`outputs`: CPU copies, by name) and the oracle's checks (`expected`).
    extra_runs: whether to do the extra runs, and their seed and order (`metrics.extra_runs` of a verdict: a replay's;
    empty: none), else drawn. A judging that ran out of GPU memory (the judge's or the kernel's allocation) is done
    once more under the machine-wide lock, with no large case running; a large case that still does not fit is
    not-verifiable, with the reason, rather than charged to the kernel.
    """
    t0 = time.perf_counter()
    before = isolation.take()
    elements = _input_elements(case)
    again = functools.partial(_judged_once, case, adapter, device, unverifiable, timeout, inputs, keep, extra_runs,
                              elements)
    result, judging = again()
    if _out_of_memory(result):  # most likely another process's large case held the memory: once more, with none
        judging.drop_buffers()
        gc.collect()
        release_cached_memory(device.device)
        result, judging = again(locked_above=-1)
        if _out_of_memory(result) and elements > large_lock.LOCKED_ABOVE:
            result = judging.result("not-verifiable", "not enough GPU memory for this case past "
                                    f"2**{large_lock.LOCKED_ABOVE.bit_length() - 1} input "
                                    "elements, judged twice (the second time with no other large case on the "
                                    f"machine; fewer processes sharing the GPU, or a larger one, would judge it): "
                                    f"{result.reason}")
    # each kernel run was checked on its own (judging.changed); what the judge's own work changed (a module it
    # imported lazily adds a warning filter) is undone without blame
    changed = [*registry.IMPORT_CHANGES.get(adapter.name, []), *judging.changed]
    accepted = [*registry.IMPORT_ACCEPTED.get(adapter.name, []), *isolation.accepted(before)]
    isolation.restore(before)  # the next case, whoever's, starts from the same state
    if judging.used_device:
        _probe_cuda(device)
    metrics = {**result.metrics, "accepted_state": accepted} if accepted else result.metrics
    host_notes = [*getattr(adapter, "notes", ()), *judging.notes]
    if host_notes:  # what the kernel changed in its own host: named, never charged (it cannot reach the judge)
        metrics = {**metrics, "kernel_host": host_notes}
    result = dataclasses.replace(result, metrics=metrics, duration_s=round(time.perf_counter() - t0, 4))
    return _charged(result, changed) if changed else result


#: what a verdict's reason holds when the judge or the kernel ran out of GPU memory (torch's OutOfMemoryError)
OUT_OF_MEMORY = ("OutOfMemoryError", "CUDA out of memory")


def _out_of_memory(result: Result) -> bool:
    return result.verdict in ("error", "fail") and any(m in result.reason for m in OUT_OF_MEMORY)


def _judged_once(case: Case, adapter: Adapter, device: DeviceInfo, unverifiable: set[str] | None,
                 timeout: float | None, inputs: Mapping[str, Any] | None, keep: dict[str, Any] | None,
                 extra_runs: Mapping[str, Any] | None, elements: int,
                 locked_above: int = large_lock.LOCKED_ABOVE) -> tuple[Result, _Judging]:
    """One judging of `case` (`judge`'s), under the machine-wide lock when it holds more than `locked_above` input
    elements; a large case's memory goes back to the GPU before the lock is let go."""
    judging = _Judging(case, adapter, device, unverifiable, given=inputs, keep=keep, replayed=extra_runs)
    try:
        with large_lock.one_at_a_time(elements, above=locked_above) as locked:
            try:
                with _deadline(_timeout_s(timeout)):
                    result = judging.run()
            finally:  # within the lock: the next large case, another process's, gets the memory
                if judging.used_device:
                    release_device_arena(adapter)
                    if locked:
                        judging.drop_buffers()
                        gc.collect()
                        release_cached_memory(device.device)
    except CaseTimeout as e:
        result = judging.result("error", f"hang: {e}", timeout=True)
    return result, judging


def _input_elements(case: Case) -> int:
    try:
        return ops.get(case.op).estimated_input_elements(case)
    except (ValueError, KeyError):  # no spec: the judging itself reports it
        return 0


def _judged(check: Check, actual: torch.Tensor, outputs: Mapping[str, torch.Tensor]) -> list[Comparison]:
    """One output against one check: no NaN/Inf where the oracle is finite, then its comparison mode."""
    return [c for c in (_finite(check, actual), _compare(check, actual, outputs)) if c is not None]


def gated_verdict(case: Case, adapter: Adapter, device: DeviceInfo) -> Result | None:
    """`judge`'s verdict for a case the gate turns away (None for one it would judge), without `judge`'s snapshot
    and restore of the process state: nothing of the adapter runs (a sweep's planning gives the verdicts of
    adapters turned away whole this way, a thousand cases in a second less)."""
    judging = _Judging(case, adapter, device, None)
    result = judging.gate()
    if result is None:
        return None
    if host_notes := [*getattr(adapter, "notes", ()), *judging.notes]:
        result = dataclasses.replace(result, metrics={**result.metrics, "kernel_host": host_notes})
    return result


#: why this process's CUDA context is unusable (a sticky error: illegal address, device assert), or "" while it is
CONTEXT_LOST = ""


def _probe_cuda(device: DeviceInfo) -> None:
    """After a case on a GPU: is the CUDA context still usable? A sticky error makes every later CUDA call fail, so
    the sweep's worker and the pytest plugin stop judging in this process (`context_lost()`)."""
    global CONTEXT_LOST
    if not device.is_cuda or CONTEXT_LOST:
        return
    try:
        torch.cuda.synchronize()
        torch.empty(1, device=device.device).fill_(1).item()
    except Exception as e:
        CONTEXT_LOST = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        return
    release_cached_memory(device.device)  # the oracle's blocks of a large case


def context_lost() -> str:
    """Why this process's CUDA context is unusable after a kernel's sticky error ("" when it is fine)."""
    return CONTEXT_LOST


def _charged(result: Result, changed: list[str]) -> Result:
    """The case whose kernel changed the process state fails, with what it changed (that state is restored)."""
    what = "; ".join(changed[:6]) + (f"; and {len(changed) - 6} more" if len(changed) > 6 else "")
    check = {"name": "process-state", "mode": "custom", "passed": False, "reason": f"kernel changed {what}",
             "metrics": {"changed": changed}}
    return dataclasses.replace(result, verdict="fail", checks=[*result.checks, check],
                               reason=f"kernel changed the process state (restored): {what}"
                                      + (f"; before that: {result.verdict}: {result.reason}" if result.reason else ""),
                               metrics={**result.metrics, "failed_checks": [*result.metrics.get("failed_checks", []),
                                                                            "process-state"]})


class _KernelFailed(Exception):
    """A kernel run ended the judging early: `result` is the verdict."""

    def __init__(self, result: Result):
        super().__init__(result.reason)
        self.result = result


class _Judging:
    """One case being judged: gates, inputs and oracle, the kernel's runs, the checks."""

    def __init__(self, case: Case, adapter: Adapter, device: DeviceInfo, unverifiable: set[str] | None, *,
                 given: Mapping[str, Any] | None = None, keep: dict[str, Any] | None = None,
                 replayed: Mapping[str, Any] | None = None):
        device = adapter.device_for(device)  # a CPU-native kernel on a CPU machine: the `cpu` generation
        self.case, self.adapter, self.device, self.unverifiable = case, adapter, device, unverifiable
        self.given, self.keep = given, keep  # `judge`'s inputs and keep
        self.replayed = replayed  # the seed and order of the extra runs of the verdict replayed (`fresh_inputs`)
        self.recorded: dict[str, Any] = {}  # what the verdict's metrics record of how it was judged
        self.t0 = time.perf_counter()
        self.changed: list[str] = []
        self.notes: list[str] = []  # what a kernel host said it saw: diagnostics, never a verdict
        self.taken: list[tuple[str, dict[str, torch.Tensor], dict[str, Band]]] = []  # remote runs' outputs
        self.returned_at = 0.0  # when the last remote run's reply arrived (the settle time counts from there)
        self.bands: dict[str, dict[str, Band]] = {}  # each run's output buffers, by run
        # the longest of the host-timed kernel runs whose outputs are not yet checked for late writes (`taken`): it
        # sets the settle wait. Only those runs: the first run's time holds its compile (seconds, on a cold cache),
        # and a wait of a tenth of that after every later run was 7% of a cold GPU sweep's time
        self.kernel_s = 0.0
        # seconds per phase, a verdict's metrics.time_s: inputs, oracle, first_run, second_run, other_runs (as the
        # judge waited for them), in_host (what the kernel host timed around its calls), checks; the sweep adds
        # host_start (its worker's wait for the kernel host before the case)
        self.spent: dict[str, float] = {}
        self.where = device.device  # where the judge's own tensors live (inputs, oracle, copies of the outputs)
        self.used_device = False  # whether this process used the case's device (a GPU context to probe after)
        self.second: dict[str, torch.Tensor] | None = None  # `run_once`'s second run's outputs, where it ran one
        try:
            self.declared, self.why_not = adapter.declares(case.features, device)
            self.broken_rule = ""
        except SupportRuleError as e:  # the adapter's own bug: an error verdict on this case, counted as claimed
            self.declared, self.why_not, self.broken_rule = True, "", str(e)

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.spent[phase] = self.spent.get(phase, 0.0) + time.perf_counter() - t0

    def result(self, verdict: str, reason: str, checks: list[Comparison] | None = None, **metrics: Any) -> Result:
        if self.spent:
            metrics = {**metrics, "time_s": {k: round(v, 4) for k, v in self.spent.items()}}
        metrics = {**self.recorded, **metrics}
        if self.adapter.library is not None:  # the library version that produced the verdict (provenance)
            metrics = {**metrics, "library": self.adapter.library.label()}
        if ":" in (spec := getattr(self.adapter, "spec", "")):  # how a replay finds it (`module:object[#name]`)
            metrics = {**metrics, "adapter_object": spec}
        return Result(case=self.case, verdict=verdict, reason=reason, metrics=metrics,
                      checks=[c.to_dict() for c in checks or []], declared=self.declared,
                      duration_s=round(time.perf_counter() - self.t0, 4), generation=self.device.generation,
                      device=self.device.to_dict())

    def gate(self) -> Result | None:
        """The verdict when the case is not judged at all (not this device, a broken rule, outside its limits)."""
        adapter, device = self.adapter, self.device
        if tampered := getattr(adapter, "tampered", ""):  # its declarations cannot be trusted: judge nothing
            return self.result("error", f"harness error: {tampered}", harness_error=True, tampered=True)
        if (whole := turned_away_whole(adapter, device)) is not None:
            return self.result(*whole)
        if adapter.library is not None and (broken := adapter.library_error()):
            return self.result("error", broken)
        if self.broken_rule:
            return self.result("error", f"support rule error: {self.broken_rule}")
        why_shape = adapter.shape_unsupported(self.case.shapes, self.case.params, self.case.layout)
        if why_shape is not None:
            return self.result("unsupported", f"shape outside the adapter's limits: {why_shape}")
        if self.declared:
            try:
                why_case = adapter.case_unsupported(device, self.case.features, self.case.shapes)
            except SupportRuleError as e:
                return self.result("error", f"support rule error: {e}")
            if why_case:
                return self.result("unsupported", f"excluded by the adapter's support rule for these shapes: "
                                                  f"{why_case}")
        if adapter.interp_features and self.unverified_interpreter():
            return self.result("not-verifiable", unverified_reason())
        if self.unverifiable and adapter.interp_features and device.generation == "interp":
            blocked = sorted(set(adapter.interp_features(self.case.features)) & self.unverifiable)
            if blocked:
                return self.result("not-verifiable",
                                   f"the Triton interpreter cannot be made faithful for {', '.join(blocked)}")
        if isolation.FOREIGN:
            names = ", ".join(f"{k} (from {v})" for k, v in sorted(isolation.FOREIGN.items())[:4])
            return self.result("error", f"the oracle cannot be sealed: functions it calls were replaced before "
                               f"moe-harness loaded: {names}; import the harness before the library that does it")
        return None

    def inputs(self, spec: ops.OpSpec, case: Case) -> dict[str, torch.Tensor]:
        """The case's inputs, where the judge works on them (`self.where`). A kernel in a kernel host on a GPU gets
        them through the host's shared memory, so a small case is built and judged on the CPU: inputs are drawn on
        the CPU and the oracle is device-independent, so the verdict is the same; the GPU is left to the kernels
        (many judging processes' small oracle launches on one GPU were most of a GPU sweep's time)."""
        if self.device.device != "cpu" and isinstance(self.adapter, RemoteAdapter) \
                and spec.estimated_input_elements(case) <= CPU_JUDGED_ELEMENTS:
            self.where = "cpu"
        # a large case is built where it is judged: its weights quantized on the CPU took a minute on the H100
        self.used_device = self.where != "cpu"
        if self.given is not None and case is self.case:
            return {k: _copied(v, self.where) for k, v in self.given.items()}
        return spec.make_inputs(case, self.where)

    def kernel(self, inputs: Mapping[str, torch.Tensor], specs: Mapping[str, OutputSpec], which: int,
               run: str, case: Case | None = None) -> dict[str, torch.Tensor]:
        """One contained kernel run; its outputs, or `_KernelFailed` with the verdict (raised, out of bounds)."""
        # a kernel host is handed copies: the judge's own inputs are what they were; in this process, a copy
        snapshot = {k: v if isinstance(self.adapter, RemoteAdapter) else v.detach().clone()
                    for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        reported: Mapping[str, Mapping[str, Any]] = {}
        try:
            with self.timed(_PHASE_OF_RUN.get(run, "other_runs")):
                if isinstance(self.adapter, RemoteAdapter):
                    outputs, bands, after, reported = self.remote(case or self.case, inputs, specs, which, run)
                else:
                    after = inputs
                    outputs, bands = _run_adapter(self.adapter, case or self.case, inputs, specs, self.device.device,
                                                  which, self.changed)
        except HostDied as e:
            raise _KernelFailed(self.result("error", f"{e} (in the kernel's {run})", host_died=str(e))) from None
        except _KernelFailed:  # a late write of the run before, found as this one started
            raise
        except Exception as e:
            if not _kernels(e):  # the judge's own code failed around the run: not the kernel's error
                verdict, reason, metrics = harness_error(f"around the kernel's {run}", e)
                raise _KernelFailed(self.result(verdict, reason, **metrics,
                                                metrics_trace=traceback.format_exc(limit=4))) from None
            raise _KernelFailed(self.raised(e, run)) from None
        self.bands[run] = bands
        checks = _unchanged(after, snapshot) + _guard_checks(bands, run)
        checks += _structure_checks(specs, outputs, self.device.device, reported, copies_on=self.where)
        if not all(c.passed for c in checks):
            reason, metrics = _summary(checks)
            raise _KernelFailed(self.result("fail", reason, checks, **metrics))
        return outputs

    def remote(self, case: Case, inputs: Mapping[str, torch.Tensor], specs: Mapping[str, OutputSpec], which: int,
               run: str) -> tuple[dict[str, torch.Tensor], dict[str, Band], dict[str, torch.Tensor], Mapping]:
        """One run in the adapter's kernel host; what it wrote, copied into the judge's memory at once."""
        assert isinstance(self.adapter, RemoteAdapter) and self.adapter.host is not None
        host = self.adapter.host
        self.late_writes()  # the arena is about to be reused: what the last run wrote after it returned, now
        reply, shared_bands, shared_in = _send_run(self.adapter, host, case, inputs, specs, which, self.where)
        if left := host.sweep_children():
            self.notes.append(f"{left} process(es) the kernel started were still running after its {run}; killed")
        outputs, bands = {}, {}
        for name, (base, band) in shared_bands.items():
            private = base.to(self.where, copy=True)
            spec = specs[name]
            stride = spec.stride if spec.stride is not None else _contiguous(tuple(spec.shape))
            outputs[name] = private.as_strided(tuple(spec.shape), stride, band.start)
            bands[name] = dataclasses.replace(band, base=private)
        # read at once (`_unchanged`); a device arena's gigabytes are compared where they lie, not copied first
        after = {k: t if t.is_cuda else t.clone() for k, t in shared_in.items()}
        self.taken.append((run, {n: shared_bands[n][0] for n in shared_bands}, bands))
        self.returned_at = time.monotonic()
        kernel_s = float(reply.get("kernel_s") or 0.0)
        self.kernel_s = max(self.kernel_s, kernel_s)
        self.spent["in_host"] = self.spent.get("in_host", 0.0) + kernel_s
        self.notes += [f"{c} (in its kernel host; restored there)" for c in reply.get("changed", [])
                       if f"{c} (in its kernel host; restored there)" not in self.notes]
        lost = reply.get("context_lost") or (reply.get("status") == "raised" and STICKY_CUDA.search(
            " ".join((reply.get("exception") or {}).get("chain", []))))
        if lost:  # every later CUDA call of that host would fail: the next case gets a fresh one
            host.kill()
            self.notes.append("its kernel host lost its CUDA context and was replaced")
        if reply.get("status") == "raised":
            raise KernelRaised(reply.get("exception") or {})
        if reply.get("context_lost"):
            raise HostDied(f"the kernel host lost its CUDA context: {reply['context_lost']}")
        return outputs, bands, after, reply.get("returned") or {}

    def drop_buffers(self) -> None:
        """Let go of the runs' output buffers (a large case's gigabytes), once the case is judged."""
        self.bands, self.taken = {}, []

    def late_writes(self, settle: bool = False) -> None:
        """Fail the case when a kernel run's output buffers changed after the judge took its copy (a thread or a
        stream still writing after the kernel returned: what a caller reads later is not what was judged). settle:
        wait first until SETTLE_S (or a tenth of the kernel's time when that is longer) has passed since the last
        run returned, at the end of a case (the comparisons usually took longer than that already)."""
        if settle and self.taken:
            left = max(SETTLE_S, 0.1 * self.kernel_s) - (time.monotonic() - self.returned_at)
            if left > 0:
                time.sleep(left)
        for run, shared, bands in self.taken:
            for name, base in shared.items():
                if not torch.equal(bits(base), bits(bands[name].base.detach().to(base.device))):
                    check = _check(f"settled:{name}", False, f"{name}: the output changed after the kernel's {run} "
                                   "had returned (written late, by a thread or an unsynchronised stream)")
                    self.taken, self.kernel_s = [], 0.0
                    raise _KernelFailed(self.result("fail", check.reason, [check], failed_checks=[check.name]))
        self.taken, self.kernel_s = [], 0.0

    def raised(self, e: Exception, run: str) -> Result:
        msg = _describe(e)
        remote = e.info if isinstance(e, KernelRaised) else None
        interp = remote["interpreter"] if remote is not None else from_interpreter(e)
        if self.unverified_interpreter() and interp:  # the interpreter's crash, not the kernel's
            return self.result("not-verifiable", f"{unverified_reason()}; it raised {msg}")
        fault = remote.get("interpreter_fault") if remote is not None else interpreter_fault(e)
        if fault and self.device.generation == "interp":  # raised by the interpreter itself (interpreter_faults)
            return self.result("not-verifiable", f"Triton's interpreter cannot run this kernel: on its {run} the "
                               f"interpreter raised {fault}", exception=msg)
        # only the first run can reject: a kernel that already ran the cell once has accepted it
        if not self.declared and run == "first run" and rejects_cleanly(e, self.case.features):
            return self.result("unsupported", f"rejected undeclared cell ({self.why_not}): {msg}", exception=msg)
        unsupported = remote["unsupported"] if remote is not None else isinstance(e, Unsupported)
        kind = "rejected a declared cell" if unsupported else "raised"
        if not self.declared:
            kind = (f"rejected undeclared cell ({self.why_not}) naming none of its axes or values" if run == "first run"
                    else f"raised on undeclared cell ({self.why_not})")
        at = remote.get("where", "") if remote is not None else where(e)
        located = f" (at {at})" if at else ""
        type_name = e.type_name if isinstance(e, KernelRaised) else type(e).__name__
        return self.result("error", f"kernel {kind}{'' if run == 'first run' else ' on its ' + run}: {msg}{located}",
                           exception=msg, exception_type=type_name)

    def unverified_interpreter(self) -> bool:
        return bool(self.unverifiable) and TRITON_VERSION in self.unverifiable and self.device.generation == "interp"

    def run(self) -> Result:
        if (gated := self.gate()) is not None:
            return gated
        case, adapter, device = self.case, self.adapter, self.device
        try:
            conventions = adapter.conventions_of(case, device)
        except Exception as e:  # the adapter's own rule for case-dependent conventions is broken
            return self.result("error", f"adapter conventions error: {type(e).__name__}: {e}")
        try:
            spec = ops.get(case.op)
            with self.timed("inputs"):
                inputs = self.inputs(spec, case)
                specs = spec.outputs(case, inputs)
            # before the kernel runs, with the functions as the harness loaded them
            with self.timed("oracle"), isolation.pristine():
                expected = {c.name: c for c in chunked.expected(spec, case, inputs, conventions, _judged)}
        except Exception as e:  # a harness or case problem, not the kernel's
            if not self.declared:  # e.g. the adapter's conventions do not apply to a cell it does not claim
                return self.result("unsupported", f"undeclared cell ({self.why_not}) cannot be built with this "
                                   f"adapter's conventions: {type(e).__name__}: {e}", exception=f"{self.why_not}: {e}")
            return self.result("error", f"harness could not build the case: {type(e).__name__}: {e}",
                               harness_error=True)
        try:
            first = self.kernel(inputs, specs, 0, "first run")
            if self.keep is not None:
                self.keep.update(outputs={n: first[n].detach().cpu().clone() for n in specs
                                          if isinstance(first.get(n), torch.Tensor)}, expected=expected)
            second = None
            untouched = any(self.bands["first run"][n].untouched(first[n]).any() for n in specs)
            if untouched or "deterministic" in adapter.properties:
                second = self.kernel(inputs, specs, 1, "second run")
            with self.timed("checks"):
                checks = self.compare(spec, specs, expected, first, second)
            if "batch_invariant" in adapter.properties and spec.token_subset is not None:
                checks += self.batch_invariance(spec, inputs, first)
            checks += self.fresh_inputs(spec, conventions, expected, inputs)
            with self.timed("checks"):
                self.late_writes(settle=True)
        except _KernelFailed as failed:
            return failed.result
        except Exception as e:
            return self.result(*harness_error("while judging", e)[:2], harness_error=True,
                               metrics_trace=traceback.format_exc(limit=4))
        reason, metrics = _summary(checks)
        return self.result("fail" if reason else "pass", reason, checks, exercised=exercised(expected.values()),
                           **metrics)

    def compare(self, spec: ops.OpSpec, specs: Mapping[str, OutputSpec], expected: Mapping[str, Check],
                first: Mapping[str, torch.Tensor], second: Mapping[str, torch.Tensor] | None) -> list[Comparison]:
        checks = []
        for name in specs:
            chk = expected.get(name)
            again = None if second is None else second[name]
            checks.append(_unwritten(name, first[name], self.bands["first run"][name], again,
                                     self.bands.get("second run", {}).get(name), None if chk is None else chk.mask))
            if chk is not None and chk.untouched is not None:
                checks.append(_touched(name, first[name], self.bands["first run"][name], chk.untouched))
        checks += oracle_checks(expected, first)
        if second is not None and "deterministic" in self.adapter.properties:
            checks += _determinism_checks(specs, first, second, expected)
        return checks

    def fresh_inputs(self, spec: ops.OpSpec, conventions: Mapping[str, Any], expected: Mapping[str, Check],
                     inputs: Mapping[str, Any] | None = None) -> list[Comparison]:
        """For one judging in FRESH_EVERY (drawn at random each time, `fresh_selected`) of a case judged in a kernel
        host: two more runs, in an order drawn at random, each judged against the oracle. One on other input values
        of the same shapes, drawn from an unpredictable seed (a kernel that reuses results, or state derived from
        its inputs, across calls by shape alone is otherwise never given two inputs of one shape in one process);
        one on the case's own inputs again (a kernel right
        only on its first call with them). Neither is told apart from a first run by its buffers or its seed. The
        seed and the order are recorded (`extra_runs` in the verdict's metrics; empty when none were drawn) and a
        replay reuses them."""
        if getattr(self.adapter, "host", None) is None or exercised(expected.values())["vacuous"]:
            return []
        given = self.replayed
        if not (fresh_selected() if given is None else "seed" in given):
            self.recorded["extra_runs"] = {}
            return []
        given = given or {}
        seed = int(given.get("seed", secrets.randbits(31)))
        order = list(given.get("order") or (["fresh", "repeat"] if secrets.randbits(1) else ["repeat", "fresh"]))
        self.recorded["extra_runs"] = {"seed": seed, "order": order}
        found = []
        for what in order:
            if what == "repeat" and inputs is not None:
                out = self.kernel(inputs, spec.outputs(self.case, inputs), 0, "run on the same inputs again")
                found += _renamed(oracle_checks(expected, out), "repeat", "on the same inputs again")
            elif what == "fresh":
                found += self.other_inputs(spec, conventions, seed)
        return found

    def other_inputs(self, spec: ops.OpSpec, conventions: Mapping[str, Any], seed: int) -> list[Comparison]:
        case = self.case.replace(seed=seed)
        with self.timed("inputs"):
            inputs = self.inputs(spec, case)
        with self.timed("oracle"), isolation.pristine():
            again = {c.name: c for c in chunked.expected(spec, case, inputs, conventions, _judged)}
        out = self.kernel(inputs, spec.outputs(case, inputs), 0, "run on other inputs of the same shapes", case)
        found = [_compare(chk, out[name], out) for name, chk in again.items() if name in out]
        return _renamed(found, "fresh_inputs", f"on other inputs of the same shapes (seed {seed})")

    def batch_invariance(self, spec: ops.OpSpec, inputs: Mapping[str, torch.Tensor],
                         full: Mapping[str, torch.Tensor]) -> list[Comparison]:
        m = self.case.shapes.get("M", self.case.shapes.get("T", 0))  # the token dimension (activations call it T)
        if m < 2 or spec.token_subset is None:
            return []
        rows = slice(0, (m + 1) // 2)
        sub_case, sub_inputs = spec.token_subset(self.case, inputs, rows)
        sub_out = self.kernel(sub_inputs, spec.outputs(sub_case, sub_inputs), 0, "batch-invariance run", sub_case)
        found = []
        for name in spec.token_outputs:
            same = torch.equal(run_bits(full[name][rows]), run_bits(sub_out[name]))
            found.append(_check(f"batch_invariant:{name}", same,
                                "" if same else f"{name}: rows change when the other tokens of the batch change"))
        return found


def _renamed(checks: list[Comparison], prefix: str, where: str) -> list[Comparison]:
    """`checks` of an extra run, named `prefix:<check>`, their reasons saying which run."""
    return [dataclasses.replace(c, name=f"{prefix}:{c.name}", reason=f"{where}: {c.reason}" if c.reason else "")
            for c in checks]


def oracle_checks(expected: Mapping[str, Check], outputs: Mapping[str, torch.Tensor]) -> list[Comparison]:
    """The oracle's comparisons of a run's outputs: per expected output, no NaN/Inf where the oracle is finite, then
    its comparison mode."""
    checks = []
    for name, chk in expected.items():
        if name not in outputs:
            checks.append(_check(f"output:{name}", False, f"the oracle expects output {name!r}; kernel gave none"))
            continue
        checks += _judged(chk, outputs[name], outputs)
    return checks


def summarize(checks: list[Comparison]) -> tuple[str, dict[str, Any]]:
    """A verdict's reason (the failed checks' reasons, "" when all pass) and metrics (margin, max_error,
    failed_checks), as `judge` sums its checks up."""
    return _summary(checks)


class OneRun:
    """A case whose kernel ran once (`run_once`): its inputs, the kernel's outputs, the conventions it was judged
    under and that verdict; `judge(conventions)` judges the same outputs again under other conventions, through the
    comparisons of a normal verdict (`_Judging.compare`), without running the kernel again."""

    def __init__(self, judging: _Judging, result: Result, spec: ops.OpSpec | None = None,
                 conventions: Mapping[str, Any] | None = None, inputs: Mapping[str, torch.Tensor] | None = None,
                 outputs: Mapping[str, torch.Tensor] | None = None, expected: Mapping[str, Check] | None = None):
        self.judging, self.result, self.spec = judging, result, spec
        self.conventions = dict(conventions or {})
        self.inputs, self.outputs, self.expected = inputs, outputs, expected

    @property
    def case(self) -> Case:
        return self.judging.case

    def judge(self, conventions: Mapping[str, Any]) -> tuple[list[Comparison], dict[str, Check]]:
        """The checks of the kernel's outputs against the oracle under `conventions`, and the oracle's Checks."""
        assert self.spec is not None and self.inputs is not None and self.outputs is not None
        with isolation.pristine():
            expected = {c.name: c for c in self.spec.expected(self.case, self.inputs, conventions)}
        specs = self.spec.outputs(self.case, self.inputs)
        return self.judging.compare(self.spec, specs, expected, self.outputs, self.judging.second), expected


def run_once(case: Case, adapter: Adapter, device: DeviceInfo, *, unverifiable: set[str] | None = None,
             timeout: float | None = None) -> OneRun:
    """Judge `case` on one kernel run (no second run, batch-invariance or fresh-inputs run): what `explain` needs.
    `result` is the verdict of the oracle's comparisons under the adapter's conventions; where the case stopped
    before the kernel gave outputs (gated, the kernel raised, an integrity check failed) only `result` (and what
    was built by then) is set."""
    before = isolation.take()
    judging = _Judging(case, adapter, device, unverifiable)
    try:
        with _deadline(_timeout_s(timeout)):
            return _run_once(judging)
    except CaseTimeout as e:
        return OneRun(judging, judging.result("error", f"hang: {e}", timeout=True))
    finally:
        isolation.restore(before)


def _run_once(judging: _Judging) -> OneRun:
    if (gated := judging.gate()) is not None:
        return OneRun(judging, gated)
    case = judging.case
    try:
        conventions = judging.adapter.conventions_of(case, judging.device)
    except Exception as e:
        return OneRun(judging, judging.result("error", f"adapter conventions error: {type(e).__name__}: {e}"))
    try:
        spec = ops.get(case.op)
        inputs = judging.inputs(spec, case)
        specs = spec.outputs(case, inputs)
        with isolation.pristine():
            expected = {c.name: c for c in chunked.expected(spec, case, inputs, conventions, _judged)}
    except Exception as e:
        return OneRun(judging, judging.result("error", f"harness could not build the case: {type(e).__name__}: {e}"))
    try:
        first = judging.kernel(inputs, specs, 0, "first run")
        # an element still holding its fill may have been written with that very value: a second run, on other
        # fills, tells (as `judge` does); its outputs only serve that check
        if any(judging.bands["first run"][n].untouched(first[n]).any() for n in specs):
            judging.second = judging.kernel(inputs, specs, 1, "second run")
        checks = judging.compare(spec, specs, expected, first, judging.second)
        judging.late_writes(settle=True)
    except _KernelFailed as failed:
        return OneRun(judging, failed.result, spec, conventions, inputs, None, expected)
    reason, metrics = _summary(checks)
    result = judging.result("fail" if reason else "pass", reason, checks, **metrics)
    return OneRun(judging, result, spec, conventions, inputs, first, expected)


def _copied(v: Any, device: str) -> Any:
    """A copy of input `v` on `device`, with its strides where they fit a fresh buffer (a view of a padded one)."""
    if not isinstance(v, torch.Tensor):
        return v
    try:
        return torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype, device=device).copy_(v)
    except RuntimeError:  # overlapping strides (an expanded view): a dense copy
        return v.detach().to(device, copy=True).contiguous()


def exercised(checks: Iterable[Check]) -> dict[str, Any]:
    """What a case exercised, from the oracle's expected outputs (within their contract masks): elements judged and
    how many of the floating-point ones are non-zero. `vacuous`: nothing judged, or every floating-point expected
    value zero (no local expert, no token): such a case can pass whatever the kernel computes."""
    elements = nonzero = floats = seen = 0
    for chk in (part for c in checks for part in (c.parts or (c,))):
        t = chk.expected
        if t is None:
            continue
        seen += 1
        t = t.detach()
        if chk.mask is not None:
            t = t[chk.mask.detach().to(t.device).expand(t.shape)] if chk.mask.shape != t.shape else t[chk.mask]
        elements += t.numel()
        if t.is_floating_point():
            floats += t.numel()
            nonzero += int((t.float() != 0).sum())
    vacuous = seen > 0 and (elements == 0 or (floats > 0 and nonzero == 0))  # no expected tensor: cannot tell
    return {"elements": elements, "nonzero": nonzero, "vacuous": vacuous}


def _determinism_checks(specs: Mapping[str, Any], first: Mapping[str, torch.Tensor],
                        second: Mapping[str, torch.Tensor], expected: Mapping[str, Check]) -> list[Comparison]:
    """Two runs on the same inputs agree bit for bit, within each output's contract mask."""
    checks = []
    for name in specs:
        a, b = run_bits(first[name]), run_bits(second[name])
        mask = expected[name].mask if name in expected else None
        if mask is not None:  # outside the contract each run keeps its own poison
            mask = mask.detach().to(a.device).expand(a.shape) if mask.shape != a.shape else mask.detach().to(a.device)
            a, b = a[mask], b[mask]
        same = torch.equal(a, b)
        checks.append(_check(f"deterministic:{name}", same,
                             "" if same else f"{name}: two runs on the same inputs differ bitwise"))
    return checks
