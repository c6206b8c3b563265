"""`reference-*` adapters: the oracle itself run through the full harness path.

They declare everything the oracle implements and must pass every case; they are the self-test of the
machinery (inputs, outputs, integrity checks, comparisons) and the first rows of the matrix.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from harness.core.case import Case
from harness.core.device import DeviceInfo
from harness.ops import activation as act_op
from harness.ops import experts as experts_op
from harness.ops import routing as routing_op
from harness.ops.common import by_rows
from harness.registry import Adapter, register
from reference import activations, experts, permute, reduce, routing

Tensors = dict[str, torch.Tensor]
ALL = "reference"


def _values(spec_axes: tuple, **overrides: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    return {a.name: overrides.get(a.name, a.values) for a in spec_axes}


def _run_routing(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    logits, k = inputs["router_logits"], case.shape("k")
    if case.features["scoring"] == "llama4_top1":
        w, ids = routing.llama4_top1_route(logits)
    elif case.op == "grouped_routing":
        w, ids = routing.grouped_topk_route(logits, k, **routing_op._route_kwargs(case, inputs))
    else:
        w, ids = routing.topk_route(logits, k, **routing_op._route_kwargs(case, inputs))
    outputs["topk_weights"].copy_(w)
    outputs["topk_ids"].copy_(ids)


def _llama4_only_plain(device: DeviceInfo, f: Mapping[str, str]) -> str | None:
    if f.get("scoring") == "llama4_top1" and (f.get("renormalize") == "Y" or f.get("correction_bias") == "Y"):
        return "llama4_top1 takes neither renormalize nor a correction bias"
    return None


def _run_align(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    em = case.features["expert_map"]
    layout = permute.align_block_size(
        inputs["topk_ids"], int(case.features["block_size"]), case.shape("E"), expert_map=inputs.get("expert_map"),
        ep_convention=permute.ExpertMapConvention(em if em != "none" else "keep_invalid_blocks"))
    outputs["sorted_token_ids"].copy_(layout.sorted_token_ids)
    outputs["expert_ids"].copy_(layout.expert_ids)
    outputs["num_tokens_post_padded"].copy_(layout.num_tokens_post_padded)


def _run_activation(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    name = case.features["activation"]
    outputs["out"].copy_(activations.apply_activation(name, inputs["x"], **act_op.oracle_kwargs({}, name)))


def _run_reduce(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    from harness.ops.reduce import _kwargs

    outputs["out"].copy_(reduce.unpermute_reduce(
        inputs["expert_out"], inputs["topk_weights"], inputs["topk_ids"],
        accumulation=reduce.ReduceAccumulation(case.features["accumulation"]), expert_map=inputs.get("expert_map"),
        **_kwargs(case)))


def _reduce_consistent(device: DeviceInfo, f: Mapping[str, str]) -> str | None:
    if f.get("weights_applied") == "Y" and f.get("apply_weight_on_input") == "Y":
        return "weights cannot be both pre-applied to the output and applied on the input"
    return None


def _in_chunks(run: Callable[[Case, Tensors, Tensors], None], dim: str) -> Callable[[Case, Tensors, Tensors], None]:
    """`run` taking an input past REFERENCE_CHUNK_ELEMENTS a chunk of rows along `dim` at a time (`by_rows`): the
    oracle's intermediates of a whole large-offsets case held tens of gigabytes in its kernel host. These oracles
    compute where their inputs lie, so the chunks do too."""
    def chunked(case: Case, inputs: Tensors, outputs: Tensors) -> None:
        by_rows(lambda c, i, o, on_device: run(c, i, o), case.op, dim, case, inputs, outputs)
    chunked.__doc__ = run.__doc__
    return chunked


def _run_experts(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    from harness.ops import experts_quant

    kw = experts_op._oracle_kwargs(case, {})
    biases = {b: inputs[b] for b in ("w13_bias", "w2_bias") if b in inputs}
    sch = experts_quant.scheme(case, {})
    quant = None if sch is None else experts_quant.to_experts_quant(inputs, sch)
    w13, w2 = (inputs["w13"], inputs["w2"]) if quant is None else (None, None)
    if case.features["format"] == "batched":
        out = experts.batched_experts(inputs["x"], inputs["expert_num_tokens"], w13, w2, **kw, **biases, quant=quant)
    else:
        out = experts.fused_experts(inputs["x"], w13, w2, inputs["topk_weights"],
                                    inputs["topk_ids"], **kw, **biases, expert_map=inputs.get("expert_map"),
                                    apply_router_weight_on_input=case.features["apply_weight_on_input"] == "Y",
                                    quant=quant)
    outputs["out"].copy_(out)


def _experts_consistent(device: DeviceInfo, f: Mapping[str, str]) -> str | None:
    if f.get("format") == "batched" and (f.get("apply_weight_on_input") == "Y" or f.get("expert_map") == "Y"):
        return "the batched format carries no router weights or expert map (they belong to the prepare step)"
    return None


def _register() -> None:
    from harness.ops import align
    from harness.ops import reduce as reduce_op

    # Not batch invariant: on CUDA, torch picks reduction kernels by batch size (softmax rows changed with M on
    # an H200), so the oracle itself does not promise it.
    common = dict(source="reference", properties=frozenset({"deterministic"}))
    nonfinite = {"nonfinite": "zero"}
    register(Adapter(name="reference-routing", op="routing", run=_in_chunks(_run_routing, "M"),
                     requires=_llama4_only_plain, support=_values(routing_op.ROUTING_AXES),
                     description="reference.routing", conventions=nonfinite,
                     **common), replace=True)
    register(Adapter(name="reference-grouped-routing", op="grouped_routing", run=_in_chunks(_run_routing, "M"),
                     support=_values(routing_op.GROUPED_AXES), description="reference.routing", conventions=nonfinite,
                     **common), replace=True)
    register(Adapter(name="reference-align", op="align", run=_run_align, support=_values(align.AXES),
                     description="reference.permute.align_block_size", **common), replace=True)
    register(Adapter(name="reference-activation", op="activation", run=_in_chunks(_run_activation, "T"),
                     support=_values(act_op.AXES), description="reference.activations", **common), replace=True)
    register(Adapter(name="reference-reduce", op="reduce", run=_in_chunks(_run_reduce, "M"),
                     support=_values(reduce_op.AXES), requires=_reduce_consistent, description="reference.reduce",
                     **common), replace=True)
    register(Adapter(name="reference-experts", op="experts", run=_run_experts, support=_values(experts_op.AXES),
                     requires=_experts_consistent, description="reference.experts", **common), replace=True)


    # Ops whose spec modules define their own reference adapters (REFERENCE_ADAPTERS), so adding an op touches one
    # module only.
    import importlib

    from harness import ops

    for op in ("group_quant", "act_quant", "permute"):
        module_name = ops._MODULES[op]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise
            continue
        for a in getattr(module, "REFERENCE_ADAPTERS", ()):
            register(a, replace=True)


_register()
