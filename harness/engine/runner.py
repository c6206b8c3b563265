"""Judge one case: build inputs, run the adapter under integrity checks, compare with the oracle.

`judge(case, adapter, device)` never raises for a kernel's misbehaviour: every outcome becomes a `Result` with a
verdict (pass | fail | error | unsupported | not-verifiable), a readable reason and per-check metrics.
Integrity checks on every case: outputs pre-filled with poison and every contract element required written;
inputs unchanged; shape, dtype and contractual strides; no NaN/Inf where the oracle has none; and, where the
adapter declares them, determinism (two runs bitwise equal) and batch invariance.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import signal
import threading
import time
import traceback
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from harness import ops
from harness.core.case import Case
from harness.core.compare import Comparison, bits, compare_bounded, compare_codes, compare_exact, compare_set
from harness.core.device import DeviceInfo
from harness.core.result import Result
from harness.engine import isolation
from harness.ops.base import Check, OutputSpec
from harness.registry import Adapter, SupportRuleError, Unsupported

# Two poison patterns per dtype: an element still holding pattern A after run 1 and pattern B after run 2 was
# never written. Float patterns are NaNs with distinctive payloads.
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


def _int_view_dtype(dtype: torch.dtype) -> torch.dtype:
    return {1: torch.uint8 if dtype == torch.uint8 else torch.int8, 2: torch.int16, 4: torch.int32,
            8: torch.int64}[dtype.itemsize]


def poisoned(spec: OutputSpec, device: str, which: int) -> torch.Tensor:
    """An output tensor of `spec` filled with poison pattern `which` (0 or 1)."""
    if spec.stride is None:
        t = torch.empty(spec.shape, dtype=spec.dtype, device=device)
    else:
        t = torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype, device=device)
    if spec.dtype == torch.bool:
        return t.fill_(bool(which))
    pattern = _POISON[spec.dtype][which]
    if spec.dtype.is_floating_point:
        iv = _int_view_dtype(spec.dtype)
        if spec.dtype.itemsize == 1:
            pattern = pattern - 256 if pattern > 127 else pattern
        t.view(iv).fill_(pattern)  # a view of the same storage, so strides are kept
    else:
        t.fill_(pattern)
    return t


def _is_poison(t: torch.Tensor, which: int) -> torch.Tensor:
    if t.dtype == torch.bool or t.dtype not in _POISON:
        return torch.zeros(t.shape, dtype=torch.bool)
    ref = poisoned(OutputSpec(tuple(t.shape), t.dtype), "cpu", which)
    return bits(t.detach().cpu()) == bits(ref)


def _check(name: str, passed: bool, reason: str = "", **metrics: Any) -> Comparison:
    return Comparison(name, "integrity", passed, reason, metrics)


def _run_adapter(adapter: Adapter, case: Case, inputs: Mapping[str, torch.Tensor],
                 specs: Mapping[str, OutputSpec], device: str, which: int) -> dict[str, torch.Tensor]:
    outputs = {name: poisoned(spec, device, which) for name, spec in specs.items()}
    returned = adapter.run(copy.deepcopy(case), dict(inputs), outputs)  # its own copy: the judge's stays intact
    if returned is not None:
        if not isinstance(returned, Mapping):
            raise TypeError(f"adapter {adapter.name} returned {type(returned).__name__}, expected a dict or None")
        outputs.update(returned)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return outputs


def _structure_checks(specs: Mapping[str, OutputSpec], outputs: Mapping[str, Any]) -> list[Comparison]:
    found = []
    for name, spec in specs.items():
        t = outputs.get(name)
        if not isinstance(t, torch.Tensor):
            why = f"output {name!r} missing or not a tensor ({type(t).__name__})"
            found.append(_check(f"output:{name}", False, why))
            continue
        problems = []
        if tuple(t.shape) != tuple(spec.shape):
            problems.append(f"shape {list(t.shape)} != {list(spec.shape)}")
        if t.dtype != spec.dtype:
            problems.append(f"dtype {t.dtype} != {spec.dtype}")
        if spec.stride is not None and tuple(t.shape) == tuple(spec.shape) and tuple(t.stride()) != spec.stride:
            problems.append(f"strides {t.stride()} != contractual {spec.stride}")
        why = f"output {name!r}: " + "; ".join(problems) if problems else ""
        found.append(_check(f"output:{name}", not problems, why))
    return found


def _unwritten(name: str, first: torch.Tensor, second: torch.Tensor | None, mask: torch.Tensor | None) -> Comparison:
    sus = _is_poison(first, 0)
    if second is not None:
        sus &= _is_poison(second, 1)
    if mask is not None:
        sus &= mask.cpu().expand_as(sus)
    n = int(sus.sum())
    if n == 0:
        return _check(f"written:{name}", True)
    idx = sus.nonzero()[:5].tolist()
    return _check(f"written:{name}", False, f"{name}: {n} of {first.numel()} contract elements never written "
                  f"(poison survived; first at {idx[0]})", unwritten=n, first_indices=idx)


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
    exp_finite = check.expected.detach().cpu().isfinite()
    bad = exp_finite & ~actual.detach().cpu().isfinite()
    if check.mask is not None:
        bad &= check.mask.cpu().expand_as(bad)
    n = int(bad.sum())
    return _check(f"finite:{check.name}", n == 0,
                  f"{check.name}: {n} NaN/Inf elements where the oracle is finite" if n else "", nonfinite=n)


def _unchanged(inputs: Mapping[str, torch.Tensor], snapshot: Mapping[str, torch.Tensor]) -> list[Comparison]:
    found = []
    for name, before in snapshot.items():
        after = inputs[name]
        same = after.shape == before.shape and torch.equal(bits(after.detach().cpu()), bits(before))
        found.append(_check(f"unchanged:{name}", same, "" if same else f"input {name!r} was modified by the kernel"))
    return found


def _summary(checks: list[Comparison]) -> tuple[str, dict[str, Any]]:
    metrics: dict[str, Any] = {}
    margins = [c.metrics["margin"] for c in checks if "margin" in c.metrics]
    if margins:
        metrics["margin"] = max(margins)
    errs = [c.metrics["max_error"] for c in checks if "max_error" in c.metrics]
    if errs:
        metrics["max_error"] = max(errs)
    failed = [c for c in checks if not c.passed]
    metrics["failed_checks"] = [c.name for c in failed]
    return "; ".join(c.reason for c in failed), metrics


def _describe(e: BaseException) -> str:
    """The exception and its causes: a Triton CompilationError names the failing line, its cause says why."""
    parts, seen = [], set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen and len(parts) < 4:
        seen.add(id(cur))
        parts.append(f"{type(cur).__name__}: {cur}".strip())
        cur = cur.__cause__ or cur.__context__
    return " <- caused by ".join(parts)


class CaseTimeout(BaseException):
    """The case ran past its timeout. A BaseException, so that no `except Exception` on the way swallows it."""


def _timeout_s(timeout: float | None) -> float | None:
    if timeout is None and os.environ.get("HARNESS_CASE_TIMEOUT"):
        timeout = float(os.environ["HARNESS_CASE_TIMEOUT"])
    return timeout if timeout and timeout > 0 else None


@contextlib.contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    # SIGALRM interrupts a Python-level hang (the Triton interpreter, a Python loop) on the main thread of a Unix
    # process; elsewhere no deadline applies in-process (the sweep's and replay's child processes are the hard
    # limit, and they also survive a hang inside a C call).
    if seconds is None or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise CaseTimeout(f"no verdict within {seconds:g}s (the kernel never returned)")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def judge(case: Case, adapter: Adapter, device: DeviceInfo, *, unverifiable: set[str] | None = None,
          timeout: float | None = None) -> Result:
    """Run `case` on `adapter` on `device` and judge it. Never raises for kernel misbehaviour.

    timeout: seconds (default: $HARNESS_CASE_TIMEOUT, else none); a case running past it is an error verdict
    ("hang: ..."), where the process can interrupt it (main thread, Unix).
    """
    t0 = time.perf_counter()
    before = isolation.take()
    try:
        with _deadline(_timeout_s(timeout)):
            result = _judge(case, adapter, device, unverifiable=unverifiable)
    except CaseTimeout as e:
        result = Result(case=case, verdict="error", reason=f"hang: {e}", metrics={"timeout": True},
                        declared=adapter.claims(case.features, device),
                        duration_s=round(time.perf_counter() - t0, 4), generation=device.generation,
                        device=device.to_dict())
    changed = isolation.changes(before)
    isolation.restore(before)  # the next case, whoever's, starts from the same state
    return _charged(result, changed) if changed else result


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


def _judge(case: Case, adapter: Adapter, device: DeviceInfo, *, unverifiable: set[str] | None = None) -> Result:
    t0 = time.perf_counter()
    try:
        declared, why_not = adapter.declares(case.features, device)
        broken_rule = ""
    except SupportRuleError as e:  # the adapter's own bug: an error verdict on this case, counted as claimed
        declared, why_not, broken_rule = True, "", str(e)

    def result(verdict: str, reason: str, checks: list[Comparison] | None = None, **metrics: Any) -> Result:
        checks = checks or []
        return Result(case=case, verdict=verdict, reason=reason, metrics=metrics,
                      checks=[c.to_dict() for c in checks], declared=declared,
                      duration_s=round(time.perf_counter() - t0, 4), generation=device.generation,
                      device=device.to_dict())

    if device.generation not in adapter.generations:
        return result("unsupported", f"{adapter.name} does not run on {device.generation}")
    if broken_rule:
        return result("error", f"support rule error: {broken_rule}")
    if (why_shape := adapter.shape_unsupported(case.shapes)) is not None:
        return result("unsupported", f"shape outside the adapter's limits: {why_shape}")
    if unverifiable and adapter.interp_features and device.generation == "interp":
        blocked = sorted(set(adapter.interp_features(case.features)) & unverifiable)
        if blocked:
            return result("not-verifiable", f"the Triton interpreter cannot be made faithful for {', '.join(blocked)}")
    try:
        spec = ops.get(case.op)
        inputs = spec.make_inputs(case, device.device)
        specs = spec.outputs(case, inputs)
    except Exception as e:  # a harness or case problem, not the kernel's
        if not declared:  # e.g. the adapter's conventions do not apply to a cell it does not claim
            return result("unsupported", f"undeclared cell ({why_not}) cannot be built with this adapter's "
                          f"conventions: {type(e).__name__}: {e}", exception=f"{why_not}: {e}")
        return result("error", f"harness could not build the case: {type(e).__name__}: {e}")
    snapshot = {k: v.detach().clone().cpu() for k, v in inputs.items() if isinstance(v, torch.Tensor)}

    try:
        first = _run_adapter(adapter, case, inputs, specs, device.device, 0)
    except Exception as e:
        msg = _describe(e)
        if not declared:
            return result("unsupported", f"rejected undeclared cell ({why_not}): {msg}", exception=msg)
        tb = traceback.extract_tb(e.__traceback__)[-1]
        kind = "rejected a declared cell" if isinstance(e, Unsupported) else "raised"
        return result("error", f"kernel {kind}: {msg} (at {tb.filename}:{tb.lineno})")

    try:
        checks = list(_unchanged(inputs, snapshot))
        checks += _structure_checks(specs, first)
        if not all(c.passed for c in checks):
            reason, metrics = _summary(checks)
            return result("fail", reason, checks, **metrics)
        expected = {c.name: c for c in spec.expected(case, inputs, adapter.conventions)}
        second = None
        if any(_is_poison(first[n], 0).any() for n in specs) or "deterministic" in adapter.properties:
            second = _run_adapter(adapter, case, inputs, specs, device.device, 1)
        for name in specs:
            chk = expected.get(name)
            checks.append(_unwritten(name, first[name], None if second is None else second[name],
                                     None if chk is None else chk.mask))
        for name, chk in expected.items():
            if name not in first:
                checks.append(_check(f"output:{name}", False, f"the oracle expects output {name!r}; kernel gave none"))
                continue
            if (fin := _finite(chk, first[name])) is not None:
                checks.append(fin)
            checks.append(_compare(chk, first[name], first))
        if second is not None and "deterministic" in adapter.properties:
            checks += _determinism_checks(specs, first, second, expected)
        if "batch_invariant" in adapter.properties and spec.token_subset is not None:
            checks.extend(_batch_invariance(case, adapter, spec, inputs, first, device))
    except Exception as e:
        return result("error", f"harness error while judging: {type(e).__name__}: {e}",
                      metrics_trace=traceback.format_exc(limit=4))
    reason, metrics = _summary(checks)
    return result("fail" if reason else "pass", reason, checks, **metrics)


def _determinism_checks(specs: Mapping[str, Any], first: Mapping[str, torch.Tensor],
                        second: Mapping[str, torch.Tensor], expected: Mapping[str, Check]) -> list[Comparison]:
    """Two runs on the same inputs agree bit for bit, within each output's contract mask."""
    checks = []
    for name in specs:
        a, b = bits(first[name].detach().cpu()), bits(second[name].detach().cpu())
        mask = expected[name].mask if name in expected else None
        if mask is not None:  # outside the contract each run keeps its own poison
            mask = mask.detach().cpu().expand(a.shape) if mask.shape != a.shape else mask.detach().cpu()
            a, b = a[mask], b[mask]
        same = torch.equal(a, b)
        checks.append(_check(f"deterministic:{name}", same,
                             "" if same else f"{name}: two runs on the same inputs differ bitwise"))
    return checks


def _batch_invariance(case: Case, adapter: Adapter, spec: ops.OpSpec, inputs: Mapping[str, torch.Tensor],
                      full: Mapping[str, torch.Tensor], device: DeviceInfo) -> list[Comparison]:
    m = case.shapes.get("M", case.shapes.get("T", 0))  # the token dimension (activations call it T)
    if m < 2:
        return []
    rows = slice(0, (m + 1) // 2)
    sub_case, sub_inputs = spec.token_subset(case, inputs, rows)
    sub_out = _run_adapter(adapter, sub_case, sub_inputs, spec.outputs(sub_case, sub_inputs), device.device, 0)
    found = []
    for name in spec.token_outputs:
        same = torch.equal(bits(full[name][rows].detach().cpu()), bits(sub_out[name].detach().cpu()))
        found.append(_check(f"batch_invariant:{name}", same,
                            "" if same else f"{name}: rows change when the other tokens of the batch change"))
    return found
