"""The generic tests the pytest plugin runs for every selected adapter (like PyTorch's OpInfo tests).

Collected by `harness.plugin` (not by file name): `pytest --moe-adapter pkg.mod:OBJ` in any repository, or the
adapters published under the `moe_harness.adapters` entry point.

test_declared_cases_pass: hypothesis draws cases inside the adapter's declared support on this device; every
verdict is recorded in the results store; a fail or error fails the test with the case JSON and the command
that replays it.
test_undeclared_cells_rejected_cleanly: cells the adapter does not declare must be rejected with an exception
whose message names the feature (or pass: "works but not claimed"), never crash or return wrong results.
"""

from __future__ import annotations

import re
import zlib

import pytest
from hypothesis import example, given, seed, settings

from harness import ops, registry
from harness.core.case import Case
from harness.core.result import Result
from harness.core.sizes import scale
from harness.core.text import one_line
from harness.engine import runner
from harness.engine import strategies as hs
from harness.plugin import VERIFIED_PROPERTY

pytestmark = pytest.mark.moe_generic

#: Pinned regressions (run first, every time, as hypothesis @example): cases that once failed, by adapter.
REGRESSIONS: dict[str, list[Case]] = {
    # H200: the grouped-routing oracle built its group mask on the CPU for CUDA logits (device mismatch).
    "reference-grouped-routing": [Case(
        op="grouped_routing", adapter="reference-grouped-routing", seed=3, routing="nonfinite",
        features={"scoring": "softmax", "correction_bias": "N", "renormalize": "Y", "scaling_placement": "weights",
                  "logits_dtype": "bfloat16", "nonfinite_rows": "Y"},
        shapes={"M": 1, "E": 256, "k": 8}, dtypes={"router_logits": "bfloat16"},
        params={"num_groups": 8, "topk_group": 4, "routed_scaling_factor": 1.0})],
    # H200: gelu's fp32 tail (1 + erf cancels) exceeded a bound relative to the tiny result.
    "reference-activation": [Case(
        op="activation", adapter="reference-activation", seed=1, features={"activation": "gelu_and_mul",
                                                                            "dtype": "bfloat16"},
        shapes={"N": 63, "T": 1}, dtypes={"x": "bfloat16"})],
}


#: verdicts that verified nothing: the case could not be judged here (an unfaithful interpreter, a missing library)
UNVERIFIED = ("not-verifiable", "not-installed")


def unverified_reasons(results: list[Result], limit: int = 3, width: int = 120) -> str:
    """The distinct reasons of the results that verified nothing, each cut to `width` characters, the first
    `limit` of them."""
    seen = list(dict.fromkeys(f"{r.verdict}: {r.reason}" for r in results if r.verdict in UNVERIFIED))
    cut = [one_line(text, width) for text in seen[:limit]]
    return "; ".join(cut) + (f" (and {len(seen) - limit} more)" if len(seen) > limit else "")


def nothing_verified(results: list[Result]) -> str | None:
    """Why none of `results` verified anything (None when one did, or there are none): a run that judged only
    not-verifiable or not-installed cases has checked nothing and must not read as a pass."""
    if not results or any(r.verdict not in UNVERIFIED for r in results):
        return None
    return f"could not verify any of its {len(results)} cases here: {unverified_reasons(results)}"


def _skip_or_count_unverified(request: pytest.FixtureRequest, name: str, results: list[Result]) -> None:
    """After a generic test of adapter `name` passed: skipped with the reasons when nothing was verified; when only
    some cases were, the count goes into a user property, listed in the terminal summary."""
    if (why := nothing_verified(results)) is not None:
        pytest.skip(f"{name}: {why}")
    verified = sum(r.verdict not in UNVERIFIED for r in results)
    if verified < len(results):
        request.node.user_properties.append(
            (VERIFIED_PROPERTY, f"verified {verified} of {len(results)} cases; the others: "
                                f"{unverified_reasons(results)}"))


def _explain(r: Result) -> str:
    return (f"{r.verdict}: {r.reason}\n  case: {r.case.to_json()}\n"
            f"  replay: save the case JSON to case.json and run `python -m harness replay case.json`")


def test_declared_cases_pass(moe_adapter_name, moe_shard, moe_device, moe_results, moe_unverifiable,  # type: ignore[no-untyped-def]
                             moe_profile, request) -> None:
    adapter = registry.resolve(moe_adapter_name)
    moe_device = adapter.device_for(moe_device)  # a CPU-native kernel is judged on `cpu`, not `interp`
    cells = hs.declared_cells(adapter, moe_device)
    if cells and (missing := adapter.not_installed()) is not None:
        _record_not_installed(adapter, cells, moe_device, moe_results)
        pytest.skip(f"{moe_adapter_name}: not installed, its {len(cells)} declared cells recorded as such: {missing}")
    if not cells:
        pytest.skip(f"{moe_adapter_name} declares no cell on {moe_device.generation} (reported as unsupported)")
    index, count = moe_shard
    if count > 1:  # this item's share: every count-th cell (round robin when there are fewer cells than shards)
        cells = cells[index::count] or [cells[index % len(cells)]]

    judged: list[Result] = []

    def prop(case):  # type: ignore[no-untyped-def]
        moe_results.begin(case, moe_device.to_dict(), moe_device.generation)  # resolved if the kernel kills us
        r = runner.judge(case, adapter, moe_device, unverifiable=moe_unverifiable)
        moe_results.append(r)
        judged.append(r)
        assert r.verdict in ("pass", "not-verifiable"), _explain(r)

    deliberate: set[str] = set()
    if index == 0:
        for pinned in explicit_examples(adapter, cells):
            deliberate.add(pinned.case_id)
            prop = example(case=pinned)(prop)
    test = given(case=hs.cases(adapter, cells))(prop)
    if count > 1:  # the examples are divided too, each shard with its own reproducible seed
        examples = max(4, -(-moe_profile.max_examples // count))
        test = seed(zlib.crc32(f"{moe_adapter_name}/{index}".encode()))(
            settings(moe_profile, max_examples=examples, derandomize=False, database=None)(test))
    else:
        test = settings(moe_profile)(test)
    test()
    _fail_on_vacuous_cells(judged, deliberate)
    _skip_or_count_unverified(request, moe_adapter_name, judged)


def _record_not_installed(adapter: registry.Adapter, cells: list[dict[str, str]], device, results) -> None:  # type: ignore[no-untyped-def]
    """One `not-installed` verdict per declared cell (the runner's gate answers it without running anything)."""
    spec = ops.get(adapter.op)
    for cell in cells:
        case = Case(op=adapter.op, adapter=adapter.name, features=dict(cell), **spec.boundary(adapter, cell)[0])
        results.append(runner.judge(case, adapter, device))


def explicit_examples(adapter: registry.Adapter, cells: list[dict[str, str]]) -> list[Case]:
    """Cases run first, every time, before the drawn ones: the adapter's pinned regressions, the vacuous boundary
    cases hypothesis never draws, a few small cases that cover every declared value of every axis, and on the GPU
    scale one case past each of the kernel's declared internal thresholds (the planted-bug suite runs the same)."""
    found = [*REGRESSIONS.get(adapter.name, []), *_vacuous_boundary_cases(adapter, cells),
             *hs.value_covering_cases(adapter, cells)]
    if scale() == "large":  # past the kernel's declared internal thresholds, where such sizes are affordable
        found += hs.threshold_cases(adapter, cells)
    return found


def _vacuous_boundary_cases(adapter: registry.Adapter, cells: list[dict[str, str]]) -> list[Case]:
    """The op's boundary cases with no token (M or T = 0) and with no local expert, the first of each kind among
    the cells: their expected output is empty or all zeros, so hypothesis never draws them, but a kernel must still
    handle them (write its zeros, not crash)."""
    kinds = {"no token": lambda f: 0 in (f["shapes"].get("M"), f["shapes"].get("T")),
             "no local expert": lambda f: f.get("params", {}).get("local_experts") == 0}
    found: dict[str, Case] = {}
    for cell in cells[:64]:
        for fields in ops.get(adapter.op).boundary(adapter, cell):
            for kind, matches in kinds.items():
                if kind not in found and matches(fields):
                    found[kind] = Case(op=adapter.op, adapter=adapter.name, features=dict(cell), **fields)
        if len(found) == len(kinds):
            break
    return list(found.values())


def _fail_on_vacuous_cells(judged: list[Result], deliberate: set[str]) -> None:
    """A declared cell whose every drawn case passed vacuously (an all-zero or empty expected output, which any
    kernel that clears its output passes) was not tested: say so instead of passing."""
    cells: dict[str, list[bool]] = {}
    for r in judged:
        if r.verdict != "pass" or r.case.case_id in deliberate:
            continue
        key = ", ".join(f"{k}={v}" for k, v in sorted(r.case.features.items()))
        cells.setdefault(key, []).append(bool(r.metrics.get("exercised", {}).get("vacuous", False)))
    empty = [key for key, vac in cells.items() if all(vac)]
    assert not empty, ("declared cells exercised only by vacuous cases (all-zero or empty expected output: nothing "
                       "was tested): " + "; ".join(empty))


def _normalized(text: str) -> str:
    return re.sub(r"[\s_\-]+", " ", text.lower())


def test_undeclared_cells_rejected_cleanly(moe_adapter_name, moe_device, moe_results,  # type: ignore[no-untyped-def]
                                           moe_unverifiable, request) -> None:
    adapter = registry.resolve(moe_adapter_name)
    moe_device = adapter.device_for(moe_device)
    spec = ops.get(adapter.op)
    cells = hs.undeclared_cells(adapter, moe_device)
    if moe_device.generation not in adapter.generations:
        pytest.skip(f"{moe_adapter_name} does not run on {moe_device.generation} (reported as unsupported)")
    if (missing := adapter.not_installed()) is not None:
        pytest.skip(f"{moe_adapter_name}: not installed (its declared cells are recorded as such): {missing}")
    problems = []
    judged: list[Result] = []
    for cell in cells[:12]:
        fields = spec.boundary(adapter, cell)[1]
        case = runner.Case(op=adapter.op, adapter=adapter.name, features=cell, **fields)
        moe_results.begin(case, moe_device.to_dict(), moe_device.generation)
        # the fixture also installs the interpreter's fidelity fixes: without them (this test alone in a process)
        # an interpreted bf16 tl.dot returns garbage
        r = runner.judge(case, adapter, moe_device, unverifiable=moe_unverifiable)
        moe_results.append(r)
        judged.append(r)
        if r.verdict in ("pass", "not-verifiable"):
            continue  # works but not claimed (reported by the matrix), or not checkable by this interpreter
        if r.verdict != "unsupported":
            problems.append(f"undeclared cell {cell}: {_explain(r)}")
            continue
        msg = _normalized(r.metrics.get("exception", ""))
        words = [_normalized(w) for w in list(cell) + list(cell.values()) if len(w) > 1]
        if not any(w in msg for w in words):
            problems.append(f"undeclared cell {cell} rejected with a message naming no feature: {r.reason}")
    assert not problems, "\n".join(problems)
    _skip_or_count_unverified(request, moe_adapter_name, judged)
