"""Approximate division as a declared, judged convention (`division="approximate"` of group_quant).

A kernel whose fp32 `/` is off by up to 2 ulp (Triton on NVIDIA GPUs) is emulated on the CPU: it must pass under
the declaration and fail without it (the declaration is needed), and a planted wrong scale or divisor must fail
under it (the declaration does not let real bugs through).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness import registry
from harness.core.case import Case
from harness.core.device import detect
from harness.engine import runner
from harness.ops import group_quant as gq

CELL = {"quant_dtype": "fp8_e4m3fn", "unit": "group", "group_size": "128", "scale_rule": "float",
        "scale_layout": "row_major", "input_dtype": "bfloat16"}
EXACT = {"eps": 1e-10, "eps_placement": "amax", "scale_formula": "divide", "application": "divide"}


def _cases() -> list[Case]:
    return [Case(op="group_quant", adapter="x", features=CELL, seed=seed, shapes={"M": 33, "K": 384},
                 dtypes={"x": "bfloat16"}, params={"pattern": pattern, "exponent": 0})
            for seed, pattern in ((1, "special"), (2, "random"), (3, "special"))]


def _kernel(steps: int, scale_factor: float = 1.0, divisor_factor: float = 1.0):  # type: ignore[no-untyped-def]
    """Codes of x / s with the quotient moved by up to `steps` fp32 ulps (a seeded random direction per element),
    s the correctly rounded scale (times scale_factor as reported; times divisor_factor as divided by)."""
    def run(case, inputs, outputs):  # type: ignore[no-untyped-def]
        x = inputs["x"].detach().cpu()
        _, s = gq.oracle(x, case.features, EXACT)
        q = (x.double() / (gq._expand(s.double(), case.features, x.shape[1]) * divisor_factor)).float()
        g = torch.Generator().manual_seed(case.seed)
        move = torch.randint(-steps, steps + 1, q.shape, generator=g)
        for _ in range(steps):
            q = torch.where(move > 0, torch.nextafter(q, torch.full_like(q, float("inf"))), q)
            q = torch.where(move < 0, torch.nextafter(q, torch.full_like(q, -float("inf"))), q)
            move = move - move.sign()
        codes, _ = gq.oracle(q, case.features, EXACT, scales=torch.ones_like(s))
        outputs["codes"].copy_(codes)
        outputs["scales"].copy_(s * scale_factor)
    return run


def _adapter(run, division: str) -> registry.Adapter:  # type: ignore[no-untyped-def]
    base = registry.resolve("reference-group-quant")
    return dataclasses.replace(base, name=f"approx-{division}", source="tests", run=run,
                               conventions={**EXACT, "division": division})


def _verdicts(run, division: str) -> list[str]:  # type: ignore[no-untyped-def]
    a = _adapter(run, division)
    return [runner.judge(c, a, detect("cpu")).verdict for c in _cases()]


def test_a_quotient_within_the_division_error_passes_under_the_declaration() -> None:
    assert _verdicts(_kernel(2), "approximate") == ["pass"] * 3


def test_the_same_kernel_fails_without_the_declaration() -> None:
    assert "fail" in _verdicts(_kernel(2), "correctly_rounded")


@pytest.mark.parametrize("bug", [dict(scale_factor=1.01), dict(divisor_factor=1 + 2**-12)])
def test_a_planted_bug_still_fails_under_the_declaration(bug: dict) -> None:
    assert "fail" in _verdicts(_kernel(2, **bug), "approximate"), bug


def test_the_fast_division_kernel_passes_as_declared(device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    """On the interpreter (exact division: its codes are the exact ones) and on a GPU (fp32 `/` approximate)."""
    a = registry.resolve("triton-group-quant-fastdiv")
    for c in _cases():
        r = runner.judge(c.replace(adapter=a.name), a, device_info, unverifiable=unverifiable)
        assert r.verdict in ("pass", "not-verifiable"), r.reason


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU's approximate fp32 division needs a GPU")
def test_on_the_gpu_the_fast_kernel_needs_its_declaration_and_passes_with_it() -> None:
    """Triton's fp32 `/` really is approximate there: large cases differ from correctly rounded codes somewhere
    (so the declaration is needed), and every code is one the declared division can produce."""
    fast = registry.resolve("triton-group-quant-fastdiv")
    undeclared = dataclasses.replace(fast, name="fastdiv-undeclared",
                                     conventions={**fast.conventions, "division": "correctly_rounded"})
    dev = detect("cuda")
    cases = [Case(op="group_quant", adapter=fast.name, features={**CELL, "input_dtype": dt}, seed=seed,
                  shapes={"M": 512, "K": 7168}, dtypes={"x": dt}, params={"pattern": "random", "exponent": 0})
             for seed, dt in ((1, "bfloat16"), (2, "float32"), (3, "float16"))]
    declared = [runner.judge(c, fast, dev) for c in cases]
    assert all(r.verdict == "pass" for r in declared), [r.reason for r in declared]
    plain = [runner.judge(c.replace(adapter=undeclared.name), undeclared, dev) for c in cases]
    assert any(r.verdict == "fail" for r in plain), "fp32 '/' gave correctly rounded codes everywhere"


def test_the_empty_batch_per_tensor_scale_is_judged_under_the_declaration_too() -> None:
    """M = 0 still computes the per-tensor scale of amax = 0 (eps / qmax): by a division, so within its error
    (found on an H100: the fast kernel's eps / 448 was 1 ulp off and judged bitwise)."""
    base = registry.resolve("reference-group-quant")

    def one_ulp_off(case, inputs, outputs):  # type: ignore[no-untyped-def]
        base.run(case, inputs, outputs)
        outputs["scales"].copy_(torch.nextafter(outputs["scales"], torch.full_like(outputs["scales"], 1.0)))

    case = Case(op="group_quant", adapter="x", seed=0, shapes={"M": 0, "K": 64}, dtypes={"x": "float32"},
                features={**CELL, "unit": "tensor", "group_size": "-", "input_dtype": "float32"},
                params={"pattern": "random", "exponent": 1})
    verdict = {d: runner.judge(case, _adapter(one_ulp_off, d), detect("cpu")).verdict
               for d in ("approximate", "correctly_rounded")}
    assert verdict == {"approximate": "pass", "correctly_rounded": "fail"}, verdict
