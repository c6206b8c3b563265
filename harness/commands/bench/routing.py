"""Benchmarks of ops `routing` and `grouped_routing`: the Triton routing kernel at model shapes.

Per shape (`harness.commands.bench.SHAPES`: M tokens, E experts, top-k): softmax top-k with renormalize on bf16 logits
(Mixtral / Qwen3 routing), and, where E = 256, DeepSeek-V3's grouped routing (sigmoid, correction bias, 8 groups,
top-4 groups, routed_scaling_factor 2.5) on fp32 logits. bytes_moved = logits read once + bias + weights and ids
written once. At M = 4096 that is 2-4 MiB: the kernel is launch and latency bound, far from the copy bandwidth, so
each configuration is also timed replaying a CUDA graph (how decode steps run it), which removes the host launch.

`reference` times the torch oracle (reference.routing) on the same device. `verify` judges the exact timed case
through the harness (`runner.judge`: oracle, set semantics, error bound, determinism and batch invariance). Off
the GPU the kernel runs in the interpreter: a smoke run with M = 64.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from harness.commands.bench import SHAPES, BenchCase
from harness.core.case import Case

#: (op, adapter, features, params, shapes it applies to)
CONFIGS: tuple[tuple[str, str, dict[str, str], dict[str, Any]], ...] = (
    ("routing", "triton-routing", {"scoring": "softmax", "renormalize": "Y", "correction_bias": "N",
                                   "logits_dtype": "bfloat16", "nonfinite_rows": "N"}, {}),
    ("grouped_routing", "triton-grouped-routing", {"scoring": "sigmoid", "correction_bias": "Y", "renormalize": "Y",
                                                   "scaling_placement": "weights", "logits_dtype": "float32",
                                                   "nonfinite_rows": "N"},
     {"num_groups": 8, "topk_group": 4, "routed_scaling_factor": 2.5}),
)


def _calls(case: Case, inputs: dict[str, torch.Tensor], out: dict[str, torch.Tensor]) -> tuple[Callable, Callable]:
    from kernels import routing as kr
    from reference import routing as ref

    logits, bias, k, p = inputs["router_logits"], inputs.get("correction_bias"), case.shape("k"), case.params
    dst = dict(out_weights=out["topk_weights"], out_ids=out["topk_ids"])
    if case.op == "routing":
        return (lambda: kr.topk_route(logits, k, scoring="softmax", renormalize=True, **dst),
                lambda: ref.topk_route(logits, k, scoring=ref.Scoring.SOFTMAX, renormalize=True))
    kw = dict(num_groups=p["num_groups"], topk_group=p["topk_group"], correction_bias=bias, renormalize=True,
              routed_scaling_factor=p["routed_scaling_factor"])
    return (lambda: kr.grouped_topk_route(logits, k, scoring="sigmoid", **kw, **dst),
            lambda: ref.grouped_topk_route(logits, k, scoring=ref.Scoring.SIGMOID, **kw))


def _graphed(fn: Callable[[], Any]) -> Callable[[], Any]:
    """`fn` captured into a CUDA graph on the first call (inside the bench's error handling), then replayed."""
    graph: list[torch.cuda.CUDAGraph] = []

    def replay() -> None:
        if not graph:
            fn()  # compile outside the capture
            torch.cuda.synchronize()
            graph.append(torch.cuda.CUDAGraph())
            with torch.cuda.graph(graph[0]):
                fn()
        graph[0].replay()

    return replay


def _verify(case: Case, device: str) -> Callable[[], str | None]:
    def check() -> str | None:
        from harness import registry
        from harness.core.device import detect
        from harness.engine import runner

        r = runner.judge(case, registry.resolve(case.adapter), detect(device))
        return None if r.verdict == "pass" else f"{r.verdict}: {r.reason}"[:300]

    return check


def cases(device: str, shapes: list[str]) -> list[BenchCase]:
    from harness import ops

    cuda = device.startswith("cuda")
    if not cuda:
        from harness.engine.interpreter import unverifiable_here

        unverifiable_here()  # interpreter fidelity fixes (libdevice, bf16 casts)
    found = []
    for shape in shapes or list(SHAPES):
        s = SHAPES[shape]
        m, e, k = (s["M"] if cuda else 64), s["E"], s["k"]
        for op, adapter, features, params in CONFIGS:
            if op == "grouped_routing" and e != 256:
                continue
            case = Case(op=op, adapter=adapter, features=features, shapes={"M": m, "E": e, "k": k}, seed=0,
                        dtypes={"router_logits": features["logits_dtype"]}, params=params)
            spec = ops.get(op)
            inputs = spec.make_inputs(case, device)
            out = {n: torch.empty(o.shape, dtype=o.dtype, device=device) for n, o in spec.outputs(case, inputs).items()}
            kernel, reference = _calls(case, inputs, out)
            moved = sum(t.numel() * t.element_size() for t in (*inputs.values(), *out.values()))
            name = f"{shape} {op} M={m} E={e} k={k} {features['logits_dtype']}"
            found.append(BenchCase(name=name, adapter=adapter, kernel=kernel, reference=reference, bytes_moved=moved,
                                   verify=_verify(case, device)))
            if cuda:
                # The oracle syncs (argument checks), so it cannot be captured: its eager time is in the row above.
                found.append(BenchCase(name=name + " (CUDA graph)", adapter=adapter, kernel=_graphed(kernel),
                                       bytes_moved=moved))
    return found
