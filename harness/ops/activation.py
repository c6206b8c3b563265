"""Op spec `activation`: gated activations and the no-mul variants (SEMANTICS.md 4).

Judged `bounded` against the oracle's unrounded fp32 result computed with the adapter's conventions: the bound is
one rounding of the output format plus a few dozen fp32 ulps (the GPU's exp/erf/tanh are approximations).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from hypothesis import strategies as st

from harness.core import inputs as gen
from harness.core.case import Case
from harness.core.errors import elementwise_bound, unit_roundoff
from harness.core.sizes import boundary_sizes
from harness.ops.base import Axis, Check, OpSpec, OutputSpec
from harness.ops.common import lim
from harness.registry import Adapter
from reference import activations as ref

DTYPES = ("bfloat16", "float16", "float32")
AXES = (
    Axis("activation", "Activation", tuple(a.value for a in ref.Activation)),
    Axis("dtype", "Dtype", DTYPES),
)
#: conventions the oracle takes from an adapter (strings are converted to the reference enums)
_CONVENTION_KEYS = ("gate_order", "layout", "clamp_limit", "rounding", "alpha", "beta", "limit")
#: the activation parameters each activation accepts (reference.activations.apply_activation rejects others)
_PARAMS_OF = {"swigluoai": ("alpha", "beta", "limit"), "swigluoai_uninterleave": ("alpha", "beta", "limit"),
              "swiglustep": ("limit",)}


def oracle_kwargs(conventions: Mapping[str, Any], activation: str) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    gated = ref.is_gated(activation)
    for key in _CONVENTION_KEYS:
        if key not in conventions or conventions[key] is None:
            continue
        if not gated and key in ("gate_order", "layout", "clamp_limit", "rounding"):
            continue
        if key in ("alpha", "beta", "limit") and key not in _PARAMS_OF.get(activation, ()):
            continue
        v = conventions[key]
        kw[key] = {"gate_order": ref.GateOrder, "layout": ref.GateLayout, "rounding": ref.Rounding}.get(
            key, lambda x: x)(v)
    return kw


#: relative error, in units of the input dtype's unit roundoff, that inner roundings to the input dtype add where a
#: kernel's fp32 transcendental lands on the other side of a rounding boundary than the oracle's: act(gate) moves
#: to a neighbour (2u); with every step rounded, the sigmoid and the products after it as well
_INNER_ROUNDINGS = {ref.Rounding.ROUND_ONCE: 0.0, ref.Rounding.ROUND_ACTIVATION_FIRST: 2.0,
                    ref.Rounding.EVERY_STEP: 6.0}


def inner_rounding_slack(rounding: ref.Rounding | str | None, dtype: torch.dtype) -> float:
    """Relative slack for the inner roundings of a gated activation's `rounding` convention (None: round once)."""
    return _INNER_ROUNDINGS[ref.Rounding(rounding or "round_once")] * unit_roundoff(dtype)


def make_inputs(case: Case, device: str) -> dict[str, torch.Tensor]:
    t, n = case.shape("T"), case.shape("N")
    width = 2 * n if ref.is_gated(case.features["activation"]) else n
    # scale 3: exercise the saturating and clamped regions (swigluoai limit 7) as well as the middle
    return {"x": gen.randn(case, "x", (t, width), case.dtype("x"), device, scale=3.0)}


def outputs(case: Case, inputs: Mapping[str, torch.Tensor]) -> dict[str, OutputSpec]:
    return {"out": OutputSpec((case.shape("T"), case.shape("N")), case.dtype("x"))}


def expected(case: Case, inputs: Mapping[str, torch.Tensor], conventions: Mapping[str, Any]) -> list[Check]:
    act = case.features["activation"]
    x = inputs["x"].detach().cpu()
    kw = oracle_kwargs(conventions, act)
    want = ref.apply_activation(act, x, out_dtype=torch.float32, **kw)
    mag = operand_magnitude(x.float(), act, conventions)
    bound = elementwise_bound(want, x.dtype, ulps_fp32=16, magnitude=mag)
    return [Check("out", "bounded", expected=want,
                  bound=bound + inner_rounding_slack(kw.get("rounding"), x.dtype) * want.abs())]


def operand_magnitude(x: torch.Tensor, act: str, conventions: Mapping[str, Any]) -> torch.Tensor:
    """Per output element, the size of what the fp32 evaluation multiplies: (|gate| + 1) * (|up| + 1) for a gated
    activation (which part is the gate does not matter), |x| * (|x| + 1) for the no-mul ones (relu2 squares)."""
    if not ref.is_gated(act):
        return x.abs() * (x.abs() + 1)
    layout = conventions.get("layout") or ("interleaved" if act == "swigluoai" else "halves")
    if layout == "interleaved":
        p0, p1 = x[..., 0::2], x[..., 1::2]
    else:
        p0, p1 = x.chunk(2, dim=-1)
    return (p0.abs() + 1) * (p1.abs() + 1)


def _fit_n(adapter: Adapter, n: int) -> int:
    """N rounded up to the adapter's `N_multiple` limit (a kernel that needs N % 8 == 0 is judged at such N)."""
    mult = int(adapter.limits.get("N_multiple", 1))
    return -(-n // mult) * mult


def draw(draw: st.DrawFn, adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    t = draw(boundary_sizes(lim(adapter, "block_M"), lim(adapter, "max_M"), minimum=1))  # T = 0: a boundary case
    n = draw(boundary_sizes(lim(adapter, "block_N") if "block_N" in adapter.limits else 64, lim(adapter, "max_N"),
                            minimum=1))
    return {"shapes": {"T": t, "N": _fit_n(adapter, n)}, "dtypes": {"x": cell["dtype"]}}


def boundary(adapter: Adapter, cell: Mapping[str, str]) -> list[dict[str, Any]]:
    return [{"shapes": {"T": t, "N": _fit_n(adapter, n)}, "dtypes": {"x": cell["dtype"]}}
            for t, n in ((0, 8), (1, 1), (7, 63), (17, 64), (33, 129))]


def token_subset(case: Case, inputs: Mapping[str, torch.Tensor], rows: slice) -> tuple[Case, dict[str, torch.Tensor]]:
    x = inputs["x"][rows]
    return case.replace(shapes={**case.shapes, "T": x.shape[0]}), {"x": x}


SPECS = {"activation": OpSpec(name="activation", title="Gated activations", axes=AXES, make_inputs=make_inputs,
                              outputs=outputs, expected=expected, draw=draw, boundary=boundary,
                              token_subset=token_subset, token_outputs=("out",))}
