"""vLLM's CUDA stage ops (kernels/adapters/external/vllm_cuda_stages.py), judged on the CPU with stand-ins of the
ops' contracts (plain torch written here from the contracts the module docstring states) in place of
`_vllm_cuda.ops`: each adapter's run function passes its op's checks, and fails them when the op is given a planted
bug (weights of the wrong slots, scales of the wrong group, ...). What the real kernels compute is judged on a GPU;
here the adapters' calls (arguments, buffers, layouts) and their declared conventions are."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from harness import registry
from harness.core.case import Case
from harness.engine import runner
from kernels.adapters.external import _vllm_cuda
from kernels.adapters.external import vllm_cuda_stages as vc
from kernels.adapters.external import vllm_triton_files as vf
from tests.external._where import nominal

FP8 = torch.float8_e4m3fn


# ----------------------------------------------------------------------------------- stand-ins of the contracts


def _pick(sel: torch.Tensor, k: int) -> torch.Tensor:
    """The k largest per row, ties to the lower index."""
    return torch.sort(sel, dim=1, descending=True, stable=True).indices[:, :k]


def _topk(w: torch.Tensor, ids: torch.Tensor, scores: torch.Tensor, renorm: bool, bias: Any, factor: float) -> None:
    scores = torch.where(scores.isfinite(), scores, torch.zeros_like(scores))
    chosen = _pick(scores + (0 if bias is None else bias), ids.shape[1])
    picked = scores.gather(1, chosen)
    if renorm:
        total = picked.sum(dim=1, keepdim=True)
        picked = picked / torch.where(total > 0, total, torch.ones_like(total))
    w.copy_(picked * factor)
    ids.copy_(chosen)


def topk_softmax(w, ids, rows, logits, renorm, bias, is_padding):  # type: ignore[no-untyped-def]
    _topk(w, ids, torch.softmax(logits.float(), dim=1), renorm, bias, 1.0)


def topk_sigmoid(w, ids, rows, logits, renorm, bias, factor, is_padding):  # type: ignore[no-untyped-def]
    _topk(w, ids, torch.sigmoid(logits.float()), renorm, bias, factor)


def grouped_topk(scores, n_group, topk_group, topk, renorm, factor, bias, scoring_func):  # type: ignore[no-untyped-def]
    s = scores.float() if scoring_func == 0 else torch.sigmoid(scores.float())
    sel = s + bias.float()
    m, e = sel.shape
    group_scores = sel.view(m, n_group, -1).topk(2, dim=2).values.sum(dim=2)
    kept = torch.zeros((m, n_group), dtype=torch.bool).scatter_(1, _pick(group_scores, topk_group), True)
    sel = sel.masked_fill(~kept.repeat_interleave(e // n_group, dim=1), float("-inf"))
    chosen = _pick(sel, topk)
    w = s.gather(1, chosen)
    if renorm:
        w = w / (w.sum(dim=1, keepdim=True) + 1e-20)
    return (w * factor).float(), chosen.to(torch.int32)


def moe_align_block_size(ids, num_experts, block, sorted_ids, expert_ids, ntpp, expert_map, scatter):  # type: ignore[no-untyped-def]
    flat = ids.reshape(-1).long()
    group = flat if expert_map is None else expert_map.long()[flat]
    sorted_ids.fill_(flat.numel())
    expert_ids.fill_(-1)
    at = 0
    for expert in range(num_experts):
        rows = torch.nonzero(group == expert).reshape(-1)
        sorted_ids[at:at + rows.numel()] = rows.to(torch.int32)
        blocks = -(-rows.numel() // block)
        expert_ids[at // block:at // block + blocks] = expert
        at += blocks * block
    ntpp.fill_(at)


def moe_sum(y, out, topk_ids=None, expert_map=None):  # type: ignore[no-untyped-def]
    terms = y.float()
    if expert_map is not None:
        local = expert_map.long()[topk_ids.long()] >= 0
        terms = torch.where(local[:, :, None], terms, torch.zeros_like(terms))
    out.copy_(terms.sum(dim=1).to(out.dtype))


def _gated(act: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., None]:
    def op(out: torch.Tensor, x: torch.Tensor) -> None:  # the activation rounded before the multiply
        d = x.shape[1] // 2
        gate = act(x[:, :d].float()).to(x.dtype).float()
        out.copy_((gate * x[:, d:].float()).to(out.dtype))
    return op


def swigluoai_and_mul(out, x, alpha=1.702, limit=7.0):  # type: ignore[no-untyped-def]
    g = x[:, ::2].float().clamp(max=limit)
    u = x[:, 1::2].float().clamp(-limit, limit)
    out.copy_(((u + 1) * g * torch.sigmoid(alpha * g)).to(out.dtype))


def _group_scales(x: torch.Tensor, group: int, eps: float, qmax: float, ue8m0: bool) -> torch.Tensor:
    m, k = x.shape
    s = x.float().abs().view(m, k // group, group).amax(dim=2).clamp_min(eps) / qmax
    return torch.exp2(torch.ceil(torch.log2(s.clamp_min(1e-10)))) if ue8m0 else s


def per_token_group_fp8_quant(x, q, s, group, eps, lo, hi, ue8m0, column_major, tma):  # type: ignore[no-untyped-def]
    scales = _group_scales(x, group, eps, hi, ue8m0)
    q.copy_((x.float() / scales.repeat_interleave(group, dim=1)).clamp(lo, hi).to(FP8))
    s.copy_(scales)  # into the caller's layout (its strides)


def per_token_group_quant_int8(x, q, s, group, eps, lo, hi):  # type: ignore[no-untyped-def]
    scales = _group_scales(x, group, eps, hi, False)
    q.copy_(torch.trunc((x.float() / scales.repeat_interleave(group, dim=1)).clamp(lo, hi)).to(torch.int8))
    s.copy_(scales)


def dynamic_scaled_fp8_quant(q, x, s):  # type: ignore[no-untyped-def]
    s.copy_(x.float().abs().amax().reshape(1) / 448.0)
    q.copy_((x.float() * (1.0 / s)).clamp(-448.0, 448.0).to(FP8))


def dynamic_per_token_scaled_fp8_quant(q, x, s, scale_ub):  # type: ignore[no-untyped-def]
    s.copy_((x.float().abs().amax(dim=1, keepdim=True) / 448.0).clamp_min(1.0 / (448.0 * 512.0)))
    q.copy_((x.float() / s).clamp(-448.0, 448.0).to(FP8))


def _namespaces(**bugs: Any) -> dict[str, SimpleNamespace]:
    moe = dict(topk_softmax=topk_softmax, topk_sigmoid=topk_sigmoid, grouped_topk=grouped_topk,
               moe_align_block_size=moe_align_block_size, moe_sum=moe_sum)
    c = dict(silu_and_mul=_gated(torch.nn.functional.silu), gelu_and_mul=_gated(torch.nn.functional.gelu),
             gelu_tanh_and_mul=_gated(lambda t: torch.nn.functional.gelu(t, approximate="tanh")),
             swigluoai_and_mul=swigluoai_and_mul, per_token_group_fp8_quant=per_token_group_fp8_quant,
             per_token_group_quant_int8=per_token_group_quant_int8, dynamic_scaled_fp8_quant=dynamic_scaled_fp8_quant,
             dynamic_per_token_scaled_fp8_quant=dynamic_per_token_scaled_fp8_quant)
    for name, op in bugs.items():
        (moe if name in moe else c)[name] = op
    return {"_moe_C": SimpleNamespace(**moe), "_C": SimpleNamespace(**c)}


def _use(monkeypatch: pytest.MonkeyPatch, **bugs: Any) -> None:
    found = _namespaces(**bugs)
    monkeypatch.setattr(_vllm_cuda, "ops", lambda namespace: found[namespace])


# ----------------------------------------------------------------------------------------- planted bugs


def _weights_rolled(w, ids, rows, logits, renorm, bias, *rest):  # type: ignore[no-untyped-def]
    (topk_softmax if len(rest) == 1 else topk_sigmoid)(w, ids, rows, logits, renorm, bias, *rest)
    w.copy_(torch.roll(w, 1, dims=1))  # each weight beside another slot's id


def _grouped_weights_rolled(*args):  # type: ignore[no-untyped-def]
    w, ids = grouped_topk(*args)
    return torch.roll(w, 1, dims=1), ids


def _align_shifted(ids, num_experts, block, sorted_ids, expert_ids, ntpp, *rest):  # type: ignore[no-untyped-def]
    moe_align_block_size(ids, num_experts, block, sorted_ids, expert_ids, ntpp, *rest)
    used = int(ntpp) // block
    expert_ids[:used] = torch.roll(expert_ids[:used], 1)


def _sum_drops_last_slot(y, out, *rest):  # type: ignore[no-untyped-def]
    moe_sum(y[:, :-1], out, *[None if r is None else r[:, :-1] if r.dim() == 2 else r for r in rest])


def _gate_and_up_swapped(out, x):  # type: ignore[no-untyped-def]
    d = x.shape[1] // 2
    _gated(torch.nn.functional.silu)(out, torch.cat([x[:, d:], x[:, :d]], dim=1))


def _fp8_scales_of_next_group(x, q, s, group, *rest):  # type: ignore[no-untyped-def]
    per_token_group_fp8_quant(x, q, s, group, *rest)
    s.copy_(torch.roll(s.clone(), 1, dims=1))


def _int8_scales_of_next_group(x, q, s, group, *rest):  # type: ignore[no-untyped-def]
    per_token_group_quant_int8(x, q, s, group, *rest)
    s.copy_(torch.roll(s.clone(), 1, dims=1))


# ---------------------------------------------------------------------------------------------------- cases

def _case(adapter: registry.Adapter, features: dict[str, str], shapes: dict[str, int], dtypes: dict[str, str],
          params: dict[str, Any] | None = None, routing: str = "random") -> Case:
    return Case(op=adapter.op, adapter=adapter.name, features=features, shapes=shapes, dtypes=dtypes, seed=3,
                routing=routing, params=params or {})


@pytest.fixture(scope="module")
def cpu_device():  # type: ignore[no-untyped-def]
    """The stand-in tests judge on the CPU, also on a GPU machine (the ops are stood in by torch code there)."""
    from harness.core.device import detect

    return detect("cpu")


def _on_cpu(adapter: registry.Adapter) -> registry.Adapter:
    """The adapter as a kernel of this machine (its CUDA ops stood in), without its library's check."""
    return dataclasses.replace(adapter, generations=("interp", "cpu"), library=None)


ROUTING = {"renormalize": "Y", "correction_bias": "Y", "logits_dtype": "bfloat16", "nonfinite_rows": "N"}
CASES: dict[str, tuple[registry.Adapter, Case, dict[str, Any]]] = {
    "topk_softmax": (vc.TOPK_SOFTMAX, _case(vc.TOPK_SOFTMAX, {"scoring": "softmax", **ROUTING},
                                            {"M": 19, "E": 12, "k": 3}, {"router_logits": "bfloat16"}),
                     {"topk_softmax": _weights_rolled}),
    "topk_sigmoid": (vc.TOPK_SIGMOID, _case(vc.TOPK_SIGMOID, {"scoring": "sigmoid", **ROUTING, "renormalize": "N"},
                                            {"M": 19, "E": 16, "k": 4}, {"router_logits": "float32"}),
                     {"topk_sigmoid": _weights_rolled}),
    "grouped_topk": (vc.GROUPED_TOPK, _case(
        vc.GROUPED_TOPK, {"scoring": "sigmoid", **ROUTING, "scaling_placement": "weights", "logits_dtype": "float32"},
        {"M": 17, "E": 32, "k": 4}, {"router_logits": "float32"},
        {"num_groups": 8, "topk_group": 3, "routed_scaling_factor": 2.5}), {"grouped_topk": _grouped_weights_rolled}),
    "align": (vc.ALIGN, _case(vc.ALIGN, {"block_size": "16", "expert_map": "exclude", "ids_dtype": "int64"},
                              {"M": 21, "E": 8, "k": 2}, {"topk_ids": "int64"}, {"local_experts": 4}),
              {"moe_align_block_size": _align_shifted}),
    "moe_sum": (vc.MOE_SUM, _case(vc.MOE_SUM, {"accumulation": "fp32", "weights_applied": "Y",
                                               "apply_weight_on_input": "N", "expert_map": "Y", "dtype": "bfloat16"},
                                  {"M": 9, "E": 8, "k": 4, "K": 40}, {"expert_out": "bfloat16"},
                                  {"local_experts": 5}), {"moe_sum": _sum_drops_last_slot}),
    "silu_and_mul": (vc.ACTIVATION, _case(vc.ACTIVATION, {"activation": "silu_and_mul", "dtype": "bfloat16"},
                                          {"T": 7, "N": 24}, {"x": "bfloat16"}),
                     {"silu_and_mul": _gate_and_up_swapped}),
    "group_quant_fp8": (vc.GROUP_QUANT_FP8, _case(
        vc.GROUP_QUANT_FP8, {"quant_dtype": "fp8_e4m3fn", "unit": "group", "group_size": "32", "scale_rule": "float",
                             "scale_layout": "column_major_tma", "input_dtype": "bfloat16"},
        {"M": 6, "K": 128}, {"x": "bfloat16"}, {"pattern": "edges"}),
        {"per_token_group_fp8_quant": _fp8_scales_of_next_group}),
    "group_quant_int8": (vc.GROUP_QUANT_INT8, _case(
        vc.GROUP_QUANT_INT8, {"quant_dtype": "int8", "unit": "group", "group_size": "16", "scale_rule": "float",
                              "scale_layout": "row_major", "input_dtype": "float16"},
        {"M": 5, "K": 64}, {"x": "float16"}, {"pattern": "edges"}),
        {"per_token_group_quant_int8": _int8_scales_of_next_group}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_passes_and_a_planted_op_bug_fails(name, monkeypatch, cpu_device) -> None:  # type: ignore[no-untyped-def]
    adapter, case, bug = CASES[name]
    here = _on_cpu(adapter)
    _use(monkeypatch)
    got = runner.judge(case, here, cpu_device)
    assert got.verdict == "pass", got.reason
    _use(monkeypatch, **bug)
    assert runner.judge(case, here, cpu_device).verdict == "fail"


def test_nonfinite_rows_follow_the_zero_rule(monkeypatch, cpu_device) -> None:  # type: ignore[no-untyped-def]
    """NaN, +Inf and all -Inf rows: the kernels clamp non-finite scores to 0 (`nonfinite="zero"`)."""
    case = _case(vc.TOPK_SOFTMAX, {"scoring": "softmax", **ROUTING, "correction_bias": "N", "nonfinite_rows": "Y"},
                 {"M": 8, "E": 16, "k": 4}, {"router_logits": "float16"}, {"values": "every_kind"}, "nonfinite")
    here = _on_cpu(vc.TOPK_SOFTMAX)
    _use(monkeypatch)
    assert runner.judge(case, here, cpu_device).verdict == "pass"
    propagating = dataclasses.replace(here, conventions={**here.conventions, "nonfinite": "propagate"})
    assert runner.judge(case, propagating, cpu_device).verdict == "fail"


def test_grouped_softmax_scores_are_torch_softmax_in_the_logits_dtype(monkeypatch,  # type: ignore[no-untyped-def]
                                                                      cpu_device) -> None:
    case = _case(vc.GROUPED_TOPK, {"scoring": "softmax", **ROUTING, "scaling_placement": "reduce"},
                 {"M": 13, "E": 64, "k": 6}, {"router_logits": "bfloat16"},
                 {"num_groups": 8, "topk_group": 4, "routed_scaling_factor": 2.5})
    _use(monkeypatch)
    assert runner.judge(case, _on_cpu(vc.GROUPED_TOPK), cpu_device).verdict == "pass"
    _use(monkeypatch, grouped_topk=lambda scores, *rest: grouped_topk(scores.float().log(), *rest[:-1], 1))
    assert runner.judge(case, _on_cpu(vc.GROUPED_TOPK), cpu_device).verdict == "fail"


@pytest.mark.parametrize("activation", ["gelu_and_mul", "gelu_tanh_and_mul", "swigluoai"])
def test_each_activation_reaches_its_op(activation, monkeypatch, cpu_device) -> None:  # type: ignore[no-untyped-def]
    case = _case(vc.ACTIVATION, {"activation": activation, "dtype": "float16"}, {"T": 5, "N": 16}, {"x": "float16"})
    _use(monkeypatch)
    assert runner.judge(case, _on_cpu(vc.ACTIVATION), cpu_device).verdict == "pass"
    wrong = {"gelu_and_mul": "gelu_tanh_and_mul", "gelu_tanh_and_mul": "silu_and_mul",
             "swigluoai": "silu_and_mul"}[activation]
    op = vc.ACT_OPS[activation]
    _use(monkeypatch, **{op: lambda out, x, *rest: getattr(_namespaces()["_C"], vc.ACT_OPS[wrong])(out, x)})
    assert runner.judge(case, _on_cpu(vc.ACTIVATION), cpu_device).verdict == "fail"


def test_ue8m0_scales_take_the_floor_before_the_rounding(monkeypatch, cpu_device) -> None:  # type: ignore[no-untyped-def]
    """All-zero groups: the kernel's 1e-10 floor under 2^ceil(log2 s) is eps on the scale, not on amax."""
    case = _case(vc.GROUP_QUANT_FP8, {"quant_dtype": "fp8_e4m3fn", "unit": "group", "group_size": "64",
                                      "scale_rule": "ue8m0", "scale_layout": "row_major", "input_dtype": "float32"},
                 {"M": 4, "K": 128}, {"x": "float32"}, {"pattern": "zeros"})
    here = _on_cpu(vc.GROUP_QUANT_FP8)
    _use(monkeypatch)
    assert runner.judge(case, here, cpu_device).verdict == "pass"
    amax_eps = dataclasses.replace(here, conventions_for=lambda c, d: {"eps_placement": "amax"})
    assert runner.judge(case, amax_eps, cpu_device).verdict == "fail"


@pytest.mark.parametrize("adapter", [vc.TOPK_SOFTMAX, vc.ALIGN, vc.GROUP_QUANT_FP8, vc.CUDA_STANDARD],
                         ids=lambda a: a.name)
def test_not_installed_on_a_machine_without_cuda(adapter, device_info) -> None:  # type: ignore[no-untyped-def]
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the extensions may load")
    assert registry.resolve(adapter.name) is adapter
    fresh = dataclasses.replace(adapter, library=dataclasses.replace(adapter.library))  # no cached import
    r = runner.judge(_any_case(adapter), fresh, nominal(fresh, device_info))
    assert r.verdict == "not-installed"
    assert "scripts/vllm_cuda.sh" in r.reason or "CUDA device" in r.reason, r.reason


def _any_case(adapter: registry.Adapter) -> Case:
    if adapter is vc.CUDA_STANDARD:
        return _experts_case()
    return next(c for a, c, _ in CASES.values() if a is adapter)


#: the op schemas the adapters call, as vLLM 0.32.0's extensions register them
SCHEMAS = {
    "_moe_C": (b"topk_softmax(Tensor! topk_weights, Tensor! topk_indices, Tensor! token_expert_indices, Tensor "
               b"gating_output, bool renormalize, Tensor? bias, Tensor? is_padding)",
               b"topk_sigmoid(Tensor! topk_weights, Tensor! topk_indices, Tensor! token_expert_indices, Tensor "
               b"gating_output, bool renormalize, Tensor? bias, float routed_scaling_factor, Tensor? is_padding)",
               b"grouped_topk(Tensor scores, int n_group, int topk_group, int topk, bool renormalize, float "
               b"routed_scaling_factor, Tensor bias, int scoring_func)",
               b"moe_sum(Tensor input, Tensor! output, Tensor? topk_ids=None, Tensor? expert_map=None)",
               b"n_group should be smaller than or equal to 32", b"topk should be smaller than or equal to 32"),
    "_C": (b"per_token_group_fp8_quant(Tensor input, Tensor! output_q, Tensor! output_s, int group_size, float eps, "
           b"float fp8_min, float fp8_max, bool scale_ue8m0, bool dummy_is_scale_transposed, bool "
           b"dummy_is_tma_aligned )",
           b"per_token_group_quant_int8(Tensor input, Tensor! output_q, Tensor! output_s, int group_size, float eps, "
           b"float int8_min, float int8_max)",
           b"silu_and_mul(Tensor! result, Tensor input)", b"gelu_and_mul(Tensor! out, Tensor input)",
           b"gelu_tanh_and_mul(Tensor! out, Tensor input)",
           b"swigluoai_and_mul(Tensor! out, Tensor input, float alpha=1.702, float limit=7.0)",
           b"dynamic_scaled_fp8_quant(Tensor! result, Tensor input, Tensor! scale)",
           b"dynamic_per_token_scaled_fp8_quant(Tensor! result, Tensor input, Tensor! scale, Tensor? scale_ub)"),
}


def test_declared_support_matches_the_extensions() -> None:
    """The schemas called and the limits declared, against the extension libraries' own text (where they are)."""
    assert vc.GROUPED_LIMITS["max_num_groups"] == 32 and vc.GROUPED_LIMITS["max_k"] == 32
    assert vc.GROUPED_SUPPORT["correction_bias"] == ("Y",) and vc.GROUPED_SUPPORT["nonfinite_rows"] == ("N",)
    assert vc.MOE_SUM.limits["max_routed_scaling_factor"] == 1 and vc.MOE_SUM.support["accumulation"] == ("fp32",)
    found = _vllm_cuda.LIBRARY.found()
    if found is None:
        pytest.skip("vLLM's CUDA extensions are not here (bash scripts/vllm_cuda.sh)")
    for namespace, texts in SCHEMAS.items():
        blob = (found.package / _vllm_cuda.EXTENSIONS[namespace]).read_bytes()
        missing = [t.decode()[:40] for t in texts if t not in blob]
        assert not missing, f"{namespace}: not in the library: {missing}"


def test_moe_sum_declares_no_unweighted_cell() -> None:
    assert not vc.MOE_SUM.declares({"weights_applied": "N", "apply_weight_on_input": "N"})[0]
    assert not vc.MOE_SUM.declares({"weights_applied": "Y", "apply_weight_on_input": "Y"})[0]
    assert vc.MOE_SUM.declares({"accumulation": "fp32", "weights_applied": "N", "apply_weight_on_input": "Y",
                                "expert_map": "Y", "dtype": "float16"})[0]


# ------------------------------------------------------------------------------- the experts row, as vLLM runs it

def _experts_case(**features: str) -> Case:
    f = {"format": "standard", "quant_type": "none", "quant_format": "-", "activation": "silu",
         "apply_weight_on_input": "N", "expert_map": "N", "dtype": "float16", "bias": "N", **features}
    return Case(op="experts", adapter=vc.CUDA_STANDARD.name, features=f, shapes={"M": 9, "E": 8, "k": 2, "K": 64,
                "N": 32}, dtypes={"x": f["dtype"]}, seed=1, routing="random")


def test_the_experts_row_runs_vllm_triton_gemms_between_its_cuda_ops(monkeypatch, cpu_device,  # type: ignore[no-untyped-def]
                                                                      unverifiable) -> None:
    if vf.LIBRARY.missing() is not None:
        pytest.skip("vLLM's fused_moe files are not here (bash scripts/third_party.sh)")
    if cpu_device.generation != "interp":  # a GPU machine: the generic tests judge the real row there
        pytest.skip("Triton's interpreter is not enabled in this session (the row's Triton GEMMs need it on a CPU)")
    here = dataclasses.replace(vc.CUDA_STANDARD, generations=("interp",), library=vf.LIBRARY,
                               interp_features=vf.interp_features)
    case = _experts_case()
    _use(monkeypatch)
    got = runner.judge(case, here, cpu_device, unverifiable=unverifiable)
    assert got.verdict == "pass", got.reason
    assert vf.module(vc.CUDA_OPS).moe_align_block_size is vc.CUDA_OPS.align  # not the stand-in's module
    _use(monkeypatch, moe_sum=_sum_drops_last_slot)
    assert runner.judge(case, here, cpu_device, unverifiable=unverifiable).verdict == "fail"


def test_moe_sum_refuses_the_cells_it_does_not_declare_when_run(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # a sweep runs undeclared cells too: without router weights anywhere the op would sum unweighted slots
    from harness.registry import Unsupported

    monkeypatch.setattr(vc._vllm_cuda, "ops", lambda _: pytest.fail("the op must not be called"))
    case = Case(op="reduce", adapter=vc.MOE_SUM.name, seed=0, routing="random", dtypes={"expert_out": "bfloat16"},
                features={"accumulation": "fp32", "weights_applied": "N", "apply_weight_on_input": "N",
                          "expert_map": "N", "dtype": "bfloat16"}, shapes={"M": 2, "E": 4, "k": 2, "K": 8})
    inputs = {"expert_out": torch.ones(2, 2, 8, dtype=torch.bfloat16), "topk_ids": torch.zeros(2, 2)}
    with pytest.raises(Unsupported, match="no router weights"):
        vc._run_reduce(case, inputs, {"out": torch.zeros(2, 8, dtype=torch.bfloat16)})
