"""Process-state changes the judge takes without blame: a well-known library's own first-import effects (torch.compile
imports torch._dynamo, which wraps torch.manual_seed and, through sympy, adds a warning filter), exactly those and
only in the window where the library was first imported; and the settings an adapter accepts by name with
`harness.adapters.accept_process_state` (never a namespace the oracle computes with).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from harness import registry
from harness.adapters import accept_process_state
from harness.core import isolation
from harness.core.case import Case
from harness.core.device import detect
from harness.engine import runner

ROOT = Path(__file__).resolve().parents[2]
_REFERENCE = registry.resolve("reference-activation")
CASE = Case(op="activation", adapter="accepting", features={"activation": "silu_and_mul", "dtype": "float32"},
            shapes={"T": 4, "N": 24}, dtypes={"x": "float32"}, seed=3)

# Judges every planned case of the cells the adapters named on the command line declare, in a process where
# torch._dynamo was never imported (a test session's process cannot promise that); prints one JSON line of verdicts.
_JUDGE_FRESH = """
import collections, dataclasses, json, sys, warnings
import torch
from harness import registry
from harness.core.device import detect
from harness.engine import runner
from harness.sweep import plan
assert "torch._dynamo" not in sys.modules
found = {}
for spec in sys.argv[1:]:
    adapter = registry.resolve(spec.removesuffix("+hostile"))
    if spec.endswith("+hostile"):  # compiles on its first call and changes the state itself as well
        lazy = adapter
        def run(case, inputs, outputs):
            lazy.run(case, inputs, outputs)
            torch.manual_seed = lambda seed: None
            warnings.simplefilter("ignore")
        adapter = dataclasses.replace(lazy, name="hostile-lazy", run=run)
    cases = [case for case in plan(adapter, "quick").cases if adapter.claims(case.features)]
    results = [runner.judge(case, adapter, detect("cpu")) for case in cases]
    found[spec] = {"verdicts": dict(collections.Counter(r.verdict for r in results)),
                   "reasons": sorted({r.reason for r in results if r.verdict not in ("pass", "unsupported")}),
                   "seconds": [r.duration_s for r in results if r.verdict == "pass"]}
print(json.dumps(found))
"""

_COMPILED = "tests.harness.fixtures.compiled_adapter"
_LAZY = "tests.harness.fixtures.compiled_lazy_adapter"


def _judged_fresh(*specs: str) -> dict[str, dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH")] if p)}
    p = subprocess.run([sys.executable, "-c", _JUDGE_FRESH, *specs], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_kernel_compiled_on_import_passes_every_case_when_right_and_fails_on_wrong_math() -> None:
    found = _judged_fresh(f"{_COMPILED}:COMPILED", f"{_COMPILED}:WRONG")
    right, wrong = found[f"{_COMPILED}:COMPILED"], found[f"{_COMPILED}:WRONG"]
    assert right["verdicts"].get("pass", 0) >= 3 and set(right["verdicts"]) == {"pass"}, right
    assert wrong["verdicts"].get("fail", 0) >= 3, wrong
    assert all("outside the error bound" in r and "process state" not in r for r in wrong["reasons"]), wrong


def test_a_kernel_compiled_on_its_first_call_passes_every_case_when_right() -> None:
    got = _judged_fresh(f"{_LAZY}:LAZY")[f"{_LAZY}:LAZY"]
    assert got["verdicts"].get("pass", 0) >= 3 and set(got["verdicts"]) == {"pass"}, got


def test_a_compiled_kernel_that_changes_the_state_itself_is_still_charged() -> None:
    got = _judged_fresh(f"{_LAZY}:LAZY+hostile")[f"{_LAZY}:LAZY+hostile"]
    assert set(got["verdicts"]) == {"fail"} and got["verdicts"]["fail"] >= 3, got
    for reason in got["reasons"]:  # the first case's too, where torch._dynamo was imported
        assert "torch.manual_seed replaced" in reason and "warning filters" in reason, reason


# The same rule in this process, with the window's first import of the library written into `before` (torch._dynamo
# and sympy may well be loaded here already).


def _fresh_window(*libraries: str) -> isolation.State:
    before = isolation.take()
    return dataclasses.replace(before, libraries=before.libraries - set(libraries))


def _sympy_filter() -> tuple:
    from sympy.utilities.exceptions import SymPyDeprecationWarning

    return ("once", None, SymPyDeprecationWarning, None, 0)


def test_dynamo_wrapping_manual_seed_on_its_first_import_is_not_charged_but_undone() -> None:
    import torch._dynamo  # loaded, as it is once the window's import is over

    before = _fresh_window("torch._dynamo")
    seed = torch.manual_seed
    try:
        torch.manual_seed = torch._disable_dynamo(seed)  # what torch._dynamo's import does
        assert isolation.changes(before) == []
    finally:
        isolation.restore(before)
    assert torch.manual_seed is seed


@pytest.mark.parametrize("how", ["by a kernel, dynamo loaded before", "not a wrapper of it"])
def test_any_other_replacement_of_manual_seed_is_charged(how: str) -> None:
    import torch._dynamo

    before = isolation.take() if how.startswith("by a kernel") else _fresh_window("torch._dynamo")
    seed = torch.manual_seed
    try:
        torch.manual_seed = torch._disable_dynamo(seed) if how.startswith("by a kernel") else lambda s: seed(s)
        assert isolation.changes(before) == ["torch.manual_seed replaced"]
    finally:
        isolation.restore(before)


@pytest.mark.parametrize("extra, charged", [(None, False), ("error", True), ("ignore-sympy", True)])
def test_only_the_filter_sympy_adds_on_its_first_import_is_not_charged(extra: str | None, charged: bool) -> None:
    before = _fresh_window("sympy")
    try:
        action, message, category, module, lineno = _sympy_filter()
        warnings.filters.insert(0, (action, message, category, module, lineno))
        if extra == "error":
            warnings.simplefilter("error")
        elif extra == "ignore-sympy":  # the library's category, but not the library's filter
            warnings.filters[0] = ("ignore", message, category, module, lineno)
        assert bool(isolation.changes(before)) is charged, isolation.changes(before)
    finally:
        isolation.restore(before)
    assert warnings.filters == before.settings["warning filters"]


def test_the_sympy_filter_outside_sympys_first_import_is_charged() -> None:
    entry = _sympy_filter()  # imports sympy before the window (torch 2.14 no longer imports it with torch)
    before = isolation.take()
    try:
        warnings.filters.insert(0, entry)
        assert isolation.changes(before) == [f"warning filters {len(warnings.filters) - 1} entries -> "
                                             f"{len(warnings.filters)} entries"]
    finally:
        isolation.restore(before)


def _registers_an_op() -> Callable[..., None]:
    ops: list = []

    def run(case, inputs, outputs):  # type: ignore[no-untyped-def]
        if not ops:  # registered on the first call, as a library registers its ops when first used
            lib = torch.library.Library("moe_harness_isolation_test", "DEF")
            lib.define("silu_and_mul(Tensor x) -> Tensor")
            lib.impl("silu_and_mul", lambda x: F.silu(x.float().chunk(2, -1)[0]) * x.float().chunk(2, -1)[1], "CPU")
            ops.append(lib)
        outputs["out"].copy_(torch.ops.moe_harness_isolation_test.silu_and_mul(inputs["x"]))

    return run


def test_a_kernel_that_registers_a_torch_library_op_passes() -> None:
    adapter = dataclasses.replace(_REFERENCE, name="registers-op", run=_registers_an_op())
    for seed in range(2):
        r = runner.judge(CASE.replace(adapter=adapter.name, seed=seed), adapter, detect("cpu"))
        assert r.verdict == "pass", r.reason


# accept_process_state: the public way to accept a named change


def _silence() -> None:
    warnings.filterwarnings("ignore", message="noisy library: .*")


def _one_thread() -> None:
    torch.set_num_threads(torch.get_num_threads() % 2 + 1)  # a change whatever the count was (1 under xdist)


def _chdir() -> None:
    os.chdir(os.path.dirname(os.getcwd()) or "/")


ACCEPTABLE: dict[str, Callable[[], None]] = {"warning filters": _silence, "thread count": _one_thread,
                                             "working directory": _chdir}


def _changes(name: str, accept: tuple[str, ...]) -> registry.Adapter:
    def run(case, inputs, outputs):  # type: ignore[no-untyped-def]
        if accept:
            with accept_process_state(*accept):
                ACCEPTABLE[name]()
                _REFERENCE.run(case, inputs, outputs)
        else:
            ACCEPTABLE[name]()
            _REFERENCE.run(case, inputs, outputs)

    return dataclasses.replace(_REFERENCE, name="accepting", run=run)


@pytest.mark.parametrize("name", list(ACCEPTABLE))
def test_accepting_a_named_change_makes_the_case_pass_and_the_change_is_still_undone(name: str) -> None:
    device = detect("cpu")
    plain = runner.judge(CASE, _changes(name, ()), device)
    assert plain.verdict == "fail" and f"kernel changed the process state (restored): {name}" in plain.reason
    state = (list(warnings.filters), torch.get_num_threads(), os.getcwd())
    before = isolation.take()
    r = runner.judge(CASE, _changes(name, (name,)), device)
    assert r.verdict == "pass", r.reason
    assert (list(warnings.filters), torch.get_num_threads(), os.getcwd()) == state
    assert [a for a in isolation.accepted(before) if a.startswith(name) and a.endswith("(accepted)")], \
        isolation.accepted(before)


def test_accepting_one_setting_does_not_accept_another() -> None:
    def run(case, inputs, outputs):  # type: ignore[no-untyped-def]
        with accept_process_state("thread count"):
            _silence()
            _REFERENCE.run(case, inputs, outputs)

    r = runner.judge(CASE, dataclasses.replace(_REFERENCE, name="accepting", run=run), detect("cpu"))
    assert r.verdict == "fail" and "warning filters" in r.reason, r.reason


def test_a_verdict_records_what_its_kernel_accepted() -> None:
    r = runner.judge(CASE, _changes("warning filters", ("warning filters",)), detect("cpu"))
    assert r.verdict == "pass" and "warning filters" in json.dumps(r.metrics), r.metrics


def test_an_adapter_module_accepts_its_librarys_change_on_import() -> None:
    filters = list(warnings.filters)
    adapter = registry.resolve("tests.harness.fixtures.accepting_adapter:ADAPTER")
    assert list(warnings.filters) == filters and adapter.name not in registry.IMPORT_CHANGES
    assert any(a.startswith("warning filters") for a in registry.IMPORT_ACCEPTED[adapter.name])
    threads = torch.get_num_threads()
    r = runner.judge(CASE.replace(adapter=adapter.name), adapter, detect("cpu"))
    assert r.verdict == "pass", r.reason
    assert torch.get_num_threads() == threads


@pytest.mark.parametrize("name, words", [
    ("torch.nn.functional.silu", "'torch.nn.functional.silu' is in torch.nn.functional, a namespace the oracle"),
    ("reference.activations.apply_activation", "is in reference.activations, a namespace the oracle"),
    ("torch.manual_seed", "'torch.manual_seed' is in torch, a namespace the oracle"),
    ("torch.Tensor.sigmoid", "is in torch.Tensor, a namespace the oracle"),
    ("blocked signals", "guards the judge itself"),
    ("warning filter", "unknown process state 'warning filter'; it can accept: "),
])
def test_accepting_an_oracle_namespace_or_a_safeguard_is_refused_naming_it(name: str, words: str) -> None:
    with pytest.raises(ValueError, match="accept_process_state: ") as e:
        accept_process_state("thread count", name)
    assert words in str(e.value)


def test_accepting_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="name what it accepts"):
        accept_process_state()


def test_a_kernel_that_tries_to_accept_an_oracle_function_is_an_error_naming_it() -> None:
    def run(case, inputs, outputs):  # type: ignore[no-untyped-def]
        with accept_process_state("torch.nn.functional.silu"):
            _REFERENCE.run(case, inputs, outputs)

    r = runner.judge(CASE, dataclasses.replace(_REFERENCE, name="accepting", run=run), detect("cpu"))
    assert r.verdict == "error" and "'torch.nn.functional.silu' is in torch.nn.functional" in r.reason, r.reason
