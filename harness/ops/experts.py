"""Op spec `experts`: end-to-end fused experts, standard (sorted-token) and batched formats (SEMANTICS.md 6).

Judged `bounded` with the error model of harness.errors, propagated through the layer:
  GEMM1   e_h = C_DOT * u_acc * sqrt(K) * (|x| . |W13|)            (+ u_in * |h| if h is stored rounded)
  act     e_a = |d act/d gate| e_h_gate + |d act/d up| e_h_up + u_inter * |a| + fp32 ulps * |a|
  GEMM2   e_y = C_DOT * u_acc * sqrt(N) * (|a| . |W2|) + (e_a . |W2|)
  reduce  e   = sum_j |w_j| e_y_j + C_DOT * u32 * sqrt(k) * sum_j |w_j y_j| + C_OUT * u_out * |out|
The activation's Jacobian comes from autograd on the fp64 intermediates, so every activation gets its own slope.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from hypothesis import strategies as st

from harness import inputs as gen
from harness.adapters import Adapter
from harness.case import Case
from harness.errors import C_DOT, C_OUT, UNIT_ROUNDOFF, unit_roundoff
from harness.ops.activation import oracle_kwargs
from harness.ops.base import Axis, Check, OpSpec, OutputSpec
from harness.ops.common import lim, yes
from harness.strategies import boundary_sizes, num_experts, top_k
from reference import activations as acts
from reference import experts as ref

#: the seed tables' activation names -> the oracle's
ACTIVATIONS = {"silu": "silu_and_mul", "gelu": "gelu_and_mul", "swigluoai": "swigluoai",
               "silu_no_mul": "silu_no_mul", "gelu_no_mul": "gelu_no_mul"}

AXES = (
    Axis("format", "Input act. format", ("standard", "batched")),
    Axis("quant_type", "Quant types", ("none",)),
    Axis("quant_format", "Quant formats", ("-",)),
    Axis("activation", "Activation functions", tuple(ACTIVATIONS)),
    Axis("apply_weight_on_input", "Apply weight on input", ("N", "Y")),
    Axis("expert_map", "Expert map", ("N", "Y")),
    Axis("dtype", "Dtype", ("bfloat16", "float16", "float32")),
    Axis("bias", "Biases", ("N", "Y")),
)


def _act(case: Case) -> str:
    return ACTIVATIONS[case.features["activation"]]


def _batched(case: Case) -> bool:
    return case.features["format"] == "batched"


def make_inputs(case: Case, device: str) -> dict[str, torch.Tensor]:
    e, hidden, n = case.shape("E"), case.shape("K"), case.shape("N")
    dt = case.dtype("x")
    e_local = case.params.get("local_experts", e)
    w1 = 2 * n if acts.is_gated(_act(case)) else n
    found = {"w13": gen.weights(case, "w13", (e_local, w1, hidden), dt, device),
             "w2": gen.weights(case, "w2", (e_local, hidden, n), dt, device)}
    if yes(case.features["bias"]):
        found["w13_bias"] = gen.randn(case, "b13", (e_local, w1), dt, device, scale=0.1)
        found["w2_bias"] = gen.randn(case, "b2", (e_local, hidden), dt, device, scale=0.1)
    if _batched(case):
        t = case.shape("max_tokens")
        counts = torch.randint(0, t + 1, (e_local,), generator=gen.generator(case, "counts"), dtype=torch.int32)
        found["x"] = gen.randn(case, "x", (e_local, t, hidden), dt, device)
        found["expert_num_tokens"] = counts.to(device)
        return found
    m, k = case.shape("M"), case.shape("k")
    found["x"] = gen.randn(case, "x", (m, hidden), dt, device)
    found["topk_weights"] = gen.topk_weights(case, m, k, device)
    found["topk_ids"] = gen.topk_ids(case, m, e, k, device)
    if yes(case.features["expert_map"]):
        found["expert_map"] = gen.expert_map(case, e, device)
    return found


def outputs(case: Case, inputs: Mapping[str, torch.Tensor]) -> dict[str, OutputSpec]:
    return {"out": OutputSpec(tuple(inputs["x"].shape), case.dtype("x"))}


def _oracle_kwargs(case: Case, conventions: Mapping[str, Any]) -> dict[str, Any]:
    kw = oracle_kwargs(conventions, _act(case))
    if "rounding" in kw:
        kw["activation_rounding"] = kw.pop("rounding")
    kw["activation"] = _act(case)
    if "intermediate_rounding" in conventions:
        kw["intermediate_rounding"] = ref.IntermediateRounding(conventions["intermediate_rounding"])
    return kw


def _per_slot_matmul(rows: torch.Tensor, w: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """rows [R, in] times w[ids[r]]^T -> [R, out] (a loop over experts; ids < 0 give zero rows)."""
    out = torch.zeros(rows.shape[0], w.shape[1], dtype=rows.dtype, device=rows.device)
    for e in ids.unique().tolist():
        if e < 0:
            continue
        sel = ids == e
        out[sel] = rows[sel] @ w[e].to(rows.dtype).T
    return out


def _gated_sum(t: torch.Tensor, act: str, conventions: Mapping[str, Any]) -> torch.Tensor:
    """Sum the two h elements (gate and up) that feed each activation output, in the activation's layout."""
    if not acts.is_gated(act):
        return t
    layout = conventions.get("layout") or ("interleaved" if act == "swigluoai" else "halves")
    if layout == "interleaved":
        return t[..., 0::2] + t[..., 1::2]
    half = t.shape[-1] // 2
    return t[..., :half] + t[..., half:]


def _bound(case: Case, cpu: Mapping[str, torch.Tensor], conventions: Mapping[str, Any], x_rows: torch.Tensor,
           ids: torch.Tensor, kw: Mapping[str, Any]) -> torch.Tensor:
    """Per-(row) error bound of the expert output y before the router weight: [R, K]."""
    dt = cpu["w13"].dtype
    u_acc = UNIT_ROUNDOFF["tf32"] if conventions.get("matmul_precision") == "tf32" else UNIT_ROUNDOFF["float32"]
    u_in = unit_roundoff(dt)
    hidden, n = cpu["w2"].shape[1], cpu["w2"].shape[2]
    w13, w2 = cpu["w13"].double(), cpu["w2"].double()
    h = _per_slot_matmul(x_rows.double(), w13, ids)
    mag_h = _per_slot_matmul(x_rows.double().abs(), w13.abs(), ids)
    if "w13_bias" in cpu and cpu["w13_bias"].shape[0] > 0:
        b = cpu["w13_bias"].double()
        h = h + torch.where((ids >= 0)[:, None], b[ids.clamp_min(0)], 0.0)
        mag_h = mag_h + torch.where((ids >= 0)[:, None], b[ids.clamp_min(0)].abs(), 0.0)
    e_h = C_DOT * u_acc * math.sqrt(hidden) * mag_h
    if kw.get("intermediate_rounding") == ref.IntermediateRounding.GEMM1_AND_ACTIVATION_OUTPUT:
        e_h = e_h + u_in * h.abs()
    act_kw = {k: v for k, v in kw.items() if k not in ("activation", "activation_rounding", "intermediate_rounding")}
    hg = h.clone().requires_grad_(True)
    a = acts.apply_activation(kw["activation"], hg, **act_kw)
    (grad,) = torch.autograd.grad(a.sum(), hg)
    a = a.detach()
    e_a = _gated_sum(grad.abs() * e_h, kw["activation"], conventions)
    e_a = e_a + (u_in + 64 * UNIT_ROUNDOFF["float32"]) * a.abs()  # intermediate rounding + fp32 evaluation
    e_y = C_DOT * u_acc * math.sqrt(n) * _per_slot_matmul(a.abs(), w2.abs(), ids) + _per_slot_matmul(e_a, w2.abs(), ids)
    return e_y


def expected(case: Case, inputs: Mapping[str, torch.Tensor], conventions: Mapping[str, Any]) -> list[Check]:
    # The oracle runs where the inputs are (fp64 on a GPU is fast; real shapes on a CPU are not).
    cpu = {n: t.detach() for n, t in inputs.items()}
    dev = cpu["x"].device
    kw = _oracle_kwargs(case, conventions)
    dt = cpu["x"].dtype
    u_out = unit_roundoff(dt)
    biases = {b: cpu[b] for b in ("w13_bias", "w2_bias") if b in cpu}
    tiny = float(torch.finfo(dt).smallest_normal)
    if _batched(case):
        want = ref.batched_experts(cpu["x"], cpu["expert_num_tokens"], cpu["w13"], cpu["w2"], **kw, **biases,
                                   compute_dtype=torch.float64, out_dtype=torch.float64)
        e_loc, t, hidden = cpu["x"].shape
        rows = cpu["x"].reshape(e_loc * t, hidden)
        ids = torch.arange(e_loc, device=dev).repeat_interleave(t)
        mask = (torch.arange(t, device=dev)[None, :] < cpu["expert_num_tokens"][:, None].long())[..., None]
        mask = mask.expand_as(want)
        bound = _bound(case, cpu, conventions, rows, ids, kw).reshape(want.shape)
        bound = bound + C_OUT * u_out * want.abs() + tiny
        return [Check("out", "bounded", expected=want, bound=bound, mask=mask)]
    on_input = yes(case.features["apply_weight_on_input"])
    want = ref.fused_experts(cpu["x"], cpu["w13"], cpu["w2"], cpu["topk_weights"], cpu["topk_ids"], **kw, **biases,
                             expert_map=cpu.get("expert_map"), apply_router_weight_on_input=on_input,
                             compute_dtype=torch.float64, out_dtype=torch.float64)
    m, k = cpu["topk_ids"].shape
    ids = cpu["topk_ids"].long()
    if "expert_map" in cpu:
        ids = cpu["expert_map"].long()[ids]
    w = cpu["topk_weights"].double()
    x_rows = cpu["x"].double().repeat_interleave(k, dim=0)
    if on_input:
        x_rows = x_rows * w.reshape(-1, 1)
    e_y = _bound(case, cpu, conventions, x_rows, ids.reshape(-1), kw).reshape(m, k, cpu["x"].shape[1])
    inter = ref.expert_intermediates(cpu["x"], cpu["w13"], cpu["w2"], cpu["topk_weights"], cpu["topk_ids"],
                                     **kw, **biases, expert_map=cpu.get("expert_map"),
                                     apply_router_weight_on_input=on_input, compute_dtype=torch.float64)
    wa = torch.ones_like(w) if on_input else w.abs()
    wy = (wa[..., None] * inter.y.abs() * inter.local[..., None]).sum(dim=1)
    ey = (wa[..., None] * e_y * inter.local[..., None]).sum(dim=1)
    bound = ey + C_DOT * UNIT_ROUNDOFF["float32"] * math.sqrt(k) * wy + C_OUT * u_out * want.abs() + tiny
    return [Check("out", "bounded", expected=want, bound=bound)]


def draw(draw: st.DrawFn, adapter: Adapter, cell: Mapping[str, str]) -> dict[str, Any]:
    e = draw(num_experts(min(lim(adapter, "max_E"), 64)))
    hidden = draw(boundary_sizes(lim(adapter, "block_K") if "block_K" in adapter.limits else 32, lim(adapter, "max_K"),
                                 minimum=1))
    n = draw(boundary_sizes(lim(adapter, "block_N") if "block_N" in adapter.limits else 32, lim(adapter, "max_N"),
                            minimum=1))
    params: dict[str, Any] = {}
    if cell["format"] == "batched":
        t = draw(boundary_sizes(lim(adapter, "block_M"), lim(adapter, "max_M"), minimum=1))
        return {"shapes": {"E": e, "K": hidden, "N": n, "max_tokens": t}, "dtypes": {"x": cell["dtype"]}}
    k = 1 if yes(cell["apply_weight_on_input"]) else draw(top_k(e, lim(adapter, "max_k")))
    m = draw(boundary_sizes(lim(adapter, "block_M"), lim(adapter, "max_M")))
    if yes(cell["expert_map"]):
        params["local_experts"] = draw(st.integers(min_value=0, max_value=e))
    routing = draw(st.sampled_from(["random", "skewed", "one_expert", "some_empty"]))
    return {"shapes": {"M": m, "E": e, "k": k, "K": hidden, "N": n}, "dtypes": {"x": cell["dtype"]},
            "routing": routing, "params": params}


def boundary(adapter: Adapter, cell: Mapping[str, str]) -> list[dict[str, Any]]:
    found = []
    block = lim(adapter, "block_M")
    for m, e, k, hidden, n, rout in ((1, 4, 2, 32, 16, "random"), (block + 1, 8, 2, 65, 33, "some_empty"),
                                     (2 * block - 1, 257, 4, 16, 16, "random"), (9, 8, 8, 48, 24, "one_expert")):
        if e > lim(adapter, "max_E"):
            continue
        if cell["format"] == "batched":
            found.append({"shapes": {"E": min(e, 16), "K": hidden, "N": n, "max_tokens": m},
                          "dtypes": {"x": cell["dtype"]}})
            continue
        k = 1 if yes(cell["apply_weight_on_input"]) else k
        params = {"local_experts": e // 2} if yes(cell["expert_map"]) else {}
        found.append({"shapes": {"M": m, "E": e, "k": k, "K": hidden, "N": n}, "dtypes": {"x": cell["dtype"]},
                      "routing": rout, "params": params})
    return found


SPECS = {"experts": OpSpec(name="experts", title="Fused experts", axes=AXES, make_inputs=make_inputs, outputs=outputs,
                           expected=expected, draw=draw, boundary=boundary)}
