"""The fixed cases every run of the generic test judges before hypothesis' draws: the adapter's pinned
regressions, the vacuous boundary cases hypothesis never draws, a cover of every declared value, one case per
value class and family, and one past each declared threshold (`explicit_examples`). The generic test judges them
(`harness.plugin.generic`), the planted-bug suite runs them, and the coverage report counts them
(`harness.engine.coverage`).
"""

from __future__ import annotations

from harness.core.case import Case
from harness.engine import fitting, strided
from harness.engine import strategies as hs
from harness.registry import Adapter

#: Pinned regressions (run first, every time, before the drawn cases): cases that once failed, by adapter.
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

#: the boundary kinds a kernel must handle though hypothesis never draws them (their expected output is empty or
#: all zeros): the fields that hold each
VACUOUS_KINDS = {"no token": lambda f: 0 in (f["shapes"].get("M"), f["shapes"].get("T")),
                 "no local expert": lambda f: f.get("params", {}).get("local_experts") == 0}


def explicit_examples(adapter: Adapter, cells: list[dict[str, str]], profile: str | None = None) -> list[Case]:
    """Cases run first, every time, before the drawn ones: the adapter's pinned regressions, the vacuous boundary
    cases hypothesis never draws, a few small cases that cover every declared value of every axis, one case of each
    of the op's value classes per family (zero groups, counts at block multiples...), and one case past each of
    the kernel's declared internal thresholds, at the cheapest shape that crosses it (the planted-bug suite runs
    the same). The last three take the layout classes of the tensors of any strides in turn (`strided.spread`).
    Under a GPU `profile` (`harness.ops.large.PROFILES`), last, one case per op past 2**31 elements (contiguous)."""
    cover, past = hs.value_covering_cases(adapter, cells), hs.threshold_cases(adapter, cells)
    # a class the cover or a threshold case already holds in a family gets no second case there (a case the
    # adapter's limits turn away holds nothing: it is never judged)
    judged = [c for c in (*cover, *past) if fitting.accepted(adapter, None, c.features, _fields(c))
              and fitting.follows(adapter, _fields(c))]
    planned = [*cover, *hs.value_class_cases(adapter, cells, held_by=judged), *past]
    return [*REGRESSIONS.get(adapter.name, []), *vacuous_boundary_cases(adapter, cells),
            *strided.spread(adapter, planned), *hs.profile_class_cases(adapter, cells, profile)]


def _fields(case: Case) -> dict[str, object]:
    return {"shapes": case.shapes, "params": case.params}


def vacuous_boundary_cases(adapter: Adapter, cells: list[dict[str, str]]) -> list[Case]:
    """The op's boundary cases with no token (M or T = 0) and with no local expert, the first of each kind among
    the cells: their expected output is empty or all zeros, so hypothesis never draws them, but a kernel must still
    handle them (write its zeros, not crash)."""
    found: dict[str, Case] = {}
    for cell in cells[:64]:
        for fields in fitting.boundary(adapter, cell):
            for kind, matches in VACUOUS_KINDS.items():
                if kind not in found and matches(fields):
                    found[kind] = Case(op=adapter.op, adapter=adapter.name, features=dict(cell), **fields)
        if len(found) == len(VACUOUS_KINDS):
            break
    return list(found.values())
