"""Op spec `reduce`: weighted unpermute-reduce over the k slots (docs/SEMANTICS.md §5).

With fp32 accumulation the only error a correct kernel may add is the final rounding (1 u of the output format)
plus a random-walk fp32 term, so a kernel that accumulates in bf16 where fp32 is declared falls outside the bound.
With sequential output-dtype accumulation the oracle emulates the sequence, and each add may round either way.
Inputs are in the contract while |factor| * sum |w y| is finite in the output dtype (then no partial sum overflows,
in any order); the `dtype_extremes` class holds expert outputs at the dtype's largest finite value within that.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from hypothesis import strategies as st

from harness.core import inputs as gen
from harness.core import layouts
from harness.core.case import Case
from harness.core.errors import C_DOT, UNIT_ROUNDOFF, unit_roundoff
from harness.core.sizes import edge_sizes, span
from harness.ops.base import Axis, Check, OpSpec, OutputSpec, ValueClass
from harness.ops.common import draw_experts, draw_map, draw_top_k, ends_routed, lim, map_fields, yes
from harness.registry import Adapter
from reference import reduce as ref

AXES = (
    Axis("accumulation", "Accumulation", ("fp32", "output_dtype_sequential")),
    Axis("weights_applied", "Weights pre-applied", ("N", "Y")),
    Axis("apply_weight_on_input", "Apply weight on input", ("N", "Y")),
    Axis("expert_map", "Expert map", ("N", "Y")),
    Axis("dtype", "Dtype", ("bfloat16", "float16", "float32")),
)


#: the order-sensitive rows' big and small magnitudes: 2^26 apart, past fp32's 24 bits, so a small term added
#: before the big pair cancels is lost and one added after it is kept
ORDER_BIG, ORDER_SMALL = 2.0**12, 2.0**-14


def make_inputs(case: Case, device: str) -> dict[str, torch.Tensor]:
    m, e, k, hidden = case.shape("M"), case.shape("E"), case.shape("k"), case.shape("K")
    counts = case.params.get("counts")
    found = {
        "expert_out": gen.randn(case, "expert_out", (m, k, hidden), case.dtype("expert_out"), device),
        "topk_weights": gen.topk_weights(case, m, k, device),
        "topk_ids": (gen.topk_ids(case, m, e, k, device) if counts is None
                     else gen.ids_for_counts(case, counts, m, k, device)),
    }
    if case.params.get("values") == "zero_weights":
        found["topk_weights"] = gen.zero_weights(case, found["topk_weights"])
    if case.params.get("values") == "extremes" and k and m:
        found["expert_out"] = _with_extremes(case, found["expert_out"])
    if case.params.get("values") == "order" and k >= 3 and m:
        found["expert_out"], found["topk_weights"] = _order_sensitive(case, found["expert_out"],
                                                                      found["topk_weights"])
    if yes(case.features["expert_map"]):
        found["expert_map"] = gen.expert_map(case, e, device, routed=found["topk_ids"])
    return found


def _order_sensitive(case: Case, y: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token, three slots (their places drawn): a big term, its exact negation with the same weight, and a small
    term 2^26 below them: summed in slot order, the small term survives only where it comes last, so a changed
    summation order changes the rounded result (and two orders give two results)."""
    g = gen.generator(case, "order")
    y, w = y.clone(), w.clone()
    for t in range(y.shape[0]):
        a, b, c = torch.randperm(y.shape[1], generator=g)[:3].tolist()
        y[t, a] = y[t, a] * ORDER_BIG
        y[t, b] = -y[t, a]
        w[t, b] = w[t, a]
        y[t, c] = y[t, c] * ORDER_SMALL
    return y, w


def _with_extremes(case: Case, y: torch.Tensor) -> torch.Tensor:
    """y with, token by token, the dtype's largest finite value, its negation and its smallest normal in one
    column of one slot (the slot cycles, the column is drawn), the other slots ordinary: with router weights
    below 1 that sum to 1 the weighted sum stays within the output dtype's range (the contract's)."""
    info, g = torch.finfo(y.dtype), gen.generator(case, "extremes")
    y = y.clone()
    for t in range(y.shape[0]):
        c = int(torch.randint(0, y.shape[2], (1,), generator=g))
        y[t, t % y.shape[1], c] = (info.max, -info.max, info.tiny)[t % 3]
    return y


def outputs(case: Case, inputs: Mapping[str, torch.Tensor]) -> dict[str, OutputSpec]:
    shape = (case.shape("M"), case.shape("K"))
    return {"out": OutputSpec(shape, case.dtype("expert_out"), layouts.output_stride(case.layout, "out", shape))}


def _kwargs(case: Case) -> dict[str, Any]:
    f = case.features
    return {"weights_applied": yes(f["weights_applied"]),
            "apply_router_weight_on_input": yes(f["apply_weight_on_input"]),
            "routed_scaling_factor": case.params.get("routed_scaling_factor", 1.0)}


def expected(case: Case, inputs: Mapping[str, torch.Tensor], conventions: Mapping[str, Any]) -> list[Check]:
    cpu = {n: t.detach().cpu() for n, t in inputs.items()}
    acc = ref.ReduceAccumulation(case.features["accumulation"])
    y, w = cpu["expert_out"], cpu["topk_weights"]
    kw = dict(_kwargs(case), expert_map=cpu.get("expert_map"))
    out_dtype = y.dtype
    u_out = unit_roundoff(out_dtype)
    k = case.shape("k")
    # magnitudes: sum over slots of |w * y| (the same reduce on absolute values, in fp64)
    mag = ref.unpermute_reduce(y.double().abs(), w.abs(), cpu["topk_ids"], accumulation=ref.ReduceAccumulation.FP32,
                               **{**kw, "routed_scaling_factor": abs(kw["routed_scaling_factor"])}).abs()
    if acc is ref.ReduceAccumulation.FP32:
        want = ref.unpermute_reduce(y.double(), w, cpu["topk_ids"], accumulation=acc, out_dtype=torch.float64, **kw)
        tiny = float(torch.finfo(out_dtype).smallest_normal)
        bound = C_DOT * UNIT_ROUNDOFF["float32"] * math.sqrt(k) * mag + 1.0 * u_out * want.abs() + tiny
    else:
        lo, hi = _sequential_interval(case, cpu)
        want, bound = (lo + hi) / 2, (hi - lo) / 2 + float(torch.finfo(out_dtype).smallest_normal)
    return [Check("out", "bounded", expected=want, bound=bound)]


def _sequential_interval(case: Case, cpu: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The values a sequential output-dtype sum can reach, slot by slot: each term w * y is an fp32 product (within
    u32 of the exact one), rounded to the output dtype; each add is rounded to it (through fp32 or not: both are
    allowed); a factor other than 1 multiplies the rounded sum in fp32, rounded again. Rounding, adding and
    multiplying by a factor > 0 are monotone, so carrying both ends gives every reachable value. An fp32 sum
    rounded once lands outside wherever one of those roundings mattered."""
    y = cpu["expert_out"].double()
    dt, u32 = cpu["expert_out"].dtype, UNIT_ROUNDOFF["float32"]
    kw = _kwargs(case)

    def rnd(t: torch.Tensor) -> torch.Tensor:
        return t.to(dt).double()

    def add(a: torch.Tensor, b: torch.Tensor, pick: Any) -> torch.Tensor:
        return pick(rnd(a + b), rnd((a + b).float()))

    weighted = not (kw["weights_applied"] or kw["apply_router_weight_on_input"])
    t = cpu["topk_weights"].double()[..., None] * y if weighted else y
    t_lo, t_hi = rnd(t - u32 * t.abs()), rnd(t + u32 * t.abs())
    local = torch.ones(cpu["topk_ids"].shape, dtype=torch.bool)
    if "expert_map" in cpu:
        local = cpu["expert_map"].long()[cpu["topk_ids"].long()] >= 0
    lo, hi = torch.zeros_like(y[:, 0]), torch.zeros_like(y[:, 0])
    for j in range(y.shape[1]):  # non-local slots add nothing
        lo = torch.where(local[:, j, None], add(lo, t_lo[:, j], torch.minimum), lo)
        hi = torch.where(local[:, j, None], add(hi, t_hi[:, j], torch.maximum), hi)
    factor = float(torch.tensor(kw["routed_scaling_factor"], dtype=torch.float32))
    if factor != 1.0:
        ends = (rnd((lo * factor).float()), rnd((hi * factor).float()))
        lo, hi = torch.minimum(*ends), torch.maximum(*ends)
    return lo, hi


def _factors(adapter: Adapter) -> list[float]:
    """The routed scaling factors drawn for the adapter, the largest last (its `max_routed_scaling_factor`)."""
    most = lim(adapter, "max_routed_scaling_factor")
    return [f for f in (1.0, 2.5) if most is None or f <= most]


def draw(draw: st.DrawFn, adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    e = draw_experts(draw, adapter)
    k = 1 if yes(cell["apply_weight_on_input"]) else draw_top_k(draw, adapter, e)
    m = draw(edge_sizes(span(adapter, "M"), lim(adapter, "block_M")))  # M = 0: a boundary case
    hidden = draw(edge_sizes(span(adapter, "K"), 64))
    params: dict[str, Any] = {"routed_scaling_factor": draw(st.sampled_from(_factors(adapter))),
                              # order-sensitive sums need three slots: with fewer, router weights of exactly 0
                              "values": draw(st.sampled_from(["random", "order" if k >= 3 else "zero_weights",
                                                              "zero_weights"]))}
    if yes(cell["expert_map"]):
        params.update(draw_map(draw, adapter, e))
    return {"shapes": {"M": m, "E": e, "k": k, "K": hidden}, "dtypes": {"expert_out": cell["dtype"]},
            "routing": draw(st.sampled_from(["random", "skewed", "one_expert"])), "params": params}


def boundary(adapter: Adapter, cell: Mapping[str, str]) -> list[dict[str, Any]]:
    found = []
    for m, e, k, hidden in ((0, 4, 2, 8), (1, 8, 8, 64), (17, 16, 4, 129), (33, 257, 8, 65)):
        if e > lim(adapter, "max_E"):
            continue
        k = 1 if yes(cell["apply_weight_on_input"]) else k
        params: dict[str, Any] = {"routed_scaling_factor": _factors(adapter)[-1]}
        if yes(cell["expert_map"]):  # M = 1: the deliberate none-local case
            params.update(map_fields(adapter, e, e // 2 if m != 1 else 0))
        found.append({"shapes": {"M": m, "E": e, "k": k, "K": hidden}, "dtypes": {"expert_out": cell["dtype"]},
                      "params": params})
    return found


def _order_fields(adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    """Order-sensitive rows (`_order_sensitive`) over three slots, the fewest where the order shows: with two,
    a + b = b + a under any rounding, so a rotated start is no bug there; with three, (a + b) + c and (b + c) + a
    differ under every declared accumulation (per-step rounding, or fp32 rounded once). Under an expert map, a
    contiguous map whose first and last local experts are routed and one local expert left empty."""
    params: dict[str, Any] = {"routed_scaling_factor": _factors(adapter)[-1], "values": "order"}
    e, k = 8, 3
    if yes(cell["expert_map"]):  # globals 2..5 local: local 0 gets 5 slots, local 1 none, local 3 (the last) 6
        params.update(map_fields(adapter, e, 4, "contiguous"), counts=[2, 2, 5, 0, 2, 6, 2, 2])
    m = 7
    return {"shapes": {"M": m, "E": e, "k": k, "K": 65}, "dtypes": {"expert_out": cell["dtype"]},
            "params": params}


def _order_present(case: Case, inputs: Mapping[str, torch.Tensor]) -> bool:
    """Some token holds a term and its exact negation 2^24 or more above another term."""
    y = inputs["expert_out"].detach().cpu().double().abs().amax(dim=2)
    return bool((y.amax(dim=1) >= 2.0**24 * y.amin(dim=1).clamp_min(1e-300)).any())


def _ends_present(case: Case, inputs: Mapping[str, torch.Tensor]) -> bool:
    """The first and the last local expert routed, and some local expert not."""
    return ends_routed(inputs["topk_ids"], inputs["expert_map"])


def _zero_weights_fields(adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    """Router weights of exactly 0 (`inputs.zero_weights`: whole rows and single slots) over four slots."""
    params: dict[str, Any] = {"routed_scaling_factor": 1.0, "values": "zero_weights"}
    if yes(cell["expert_map"]):
        params.update(map_fields(adapter, 8, 8))
    return {"shapes": {"M": 7, "E": 8, "k": 4, "K": 65}, "dtypes": {"expert_out": cell["dtype"]}, "params": params}


def _extremes_fields(adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    """Expert outputs at the dtype's largest finite value, its negation and its smallest normal
    (`_with_extremes`), three slots, factor 1 (2.5 would take the sum past the range: outside the contract)."""
    params: dict[str, Any] = {"routed_scaling_factor": 1.0, "values": "extremes"}
    if yes(cell["expert_map"]):
        params.update(map_fields(adapter, 8, 8))
    return {"shapes": {"M": 6, "E": 8, "k": 3, "K": 65}, "dtypes": {"expert_out": cell["dtype"]}, "params": params}


ZERO_WEIGHTS = ValueClass("zero_weights", lambda a, c: not (yes(c["apply_weight_on_input"])
                                                         or yes(c["weights_applied"])), ("accumulation",),
                          _zero_weights_fields, lambda case, inputs: gen.has_zero_weights(inputs["topk_weights"]))
ORDER = ValueClass("summation_order", lambda a, c: not yes(c["apply_weight_on_input"]), ("accumulation",),
                   _order_fields, _order_present)
#: the router weights applied here (below 1, summing to 1), so that the sum stays in range; per dtype (fp16's
#: range differs from bf16's and fp32's)
DTYPE_EXTREMES = ValueClass("dtype_extremes", lambda a, c: not (yes(c["apply_weight_on_input"])
                                                             or yes(c["weights_applied"])), ("dtype",),
                            _extremes_fields,
                            lambda case, inputs: gen.has_extremes(inputs["expert_out"], case.dtype("expert_out")))
MAP_ENDS = ValueClass("first_and_last_local_expert", lambda a, c: yes(c["expert_map"])
                      and not yes(c["apply_weight_on_input"]), ("accumulation",), _order_fields, _ends_present)


def token_subset(case: Case, inputs: Mapping[str, torch.Tensor], rows: slice) -> tuple[Case, dict[str, torch.Tensor]]:
    sub = {n: (t[rows] if n != "expert_map" else t) for n, t in inputs.items()}
    return case.replace(shapes={**case.shapes, "M": sub["expert_out"].shape[0]}), sub


SPECS = {"reduce": OpSpec(name="reduce", title="Unpermute-reduce", axes=AXES, make_inputs=make_inputs, outputs=outputs,
                          expected=expected, draw=draw, boundary=boundary, token_subset=token_subset,
                          token_outputs=("out",), value_classes=(ORDER, MAP_ENDS, ZERO_WEIGHTS, DTYPE_EXTREMES))}
