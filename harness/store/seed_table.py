"""The seed table: vLLM's `moe_kernel_features.md` (v0.15.0) and SGLang's MoE implementations, one row per system
they name, in their columns, each cell generated from the verdicts of the adapters that run that system's code
(`SEED_ROWS`). A row whose kernels no verdict covers says why ("not verifiable here: <reason>") rather than being left
out. docs/SEED_TABLE.md puts this table beside the hand-written one and explains every difference.

A cell lists the values some case of the row's adapters exercised, each with the generations it was verified on:
`interp`, `sm90` where every such case passed there, `sm90 partial` where some failed (the kernel sections' footnotes
say which and why), struck through where all failed; values no case exercised (rejected as undeclared, or not run)
are not listed. "Modular" is a property of the
library's API (whether the kernel is a modular-kernel experts class), not of numerics: it is copied from the seed and
marked so. "Verified on" names each generation where some case passed, with passed/exercised counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SeedRow:
    """One row of the seed table: the system's kernel name, the adapters that run its code, what the seed says of
    its API (`modular`, `source`), and why it is not verifiable here when no adapter covers it."""

    system: str
    kernel: str
    adapters: tuple[str, ...]
    modular: str
    source: str
    unverifiable: str = ""


_SM100 = "needs an SM100 (Blackwell) GPU; the lent GPU is an H100 (sm90)"
SEED_ROWS: tuple[SeedRow, ...] = (
    SeedRow("vLLM", "triton", ("vllm-triton-standard", "vllm-triton-experts-cuda-ops", "vllm-triton-experts"), "Y",
            "fused_experts, TritonExperts"),
    SeedRow("vLLM", "triton (batched)", ("vllm-triton-batched",), "Y", "BatchedTritonExperts"),
    SeedRow("vLLM", "deep gemm", ("deepgemm-contiguous-experts", "deepgemm-masked-experts",
                                    "deepgemm-contiguous-experts-ue8m0", "deepgemm-masked-experts-ue8m0"), "Y",
            "DeepGemmExperts, BatchedDeepGemmExperts"),
    SeedRow("vLLM", "cutlass_fp4", (), "Y", "CutlassExpertsFp4",
            "vLLM's CUTLASS nvfp4 grouped GEMM (cutlass_fp4_group_mm, in its CUDA build) needs SM100's nvfp4 MMA: "
            "the lent GPUs are sm90"),
    SeedRow("vLLM", "cutlass_fp8", ("vllm-cutlass-experts", "vllm-cutlass-batched-experts"), "Y",
            "CutlassExpertsFp8, CutlassBatchedExpertsFp8",
            "vLLM's CUTLASS grouped fp8 GEMMs are CUDA ops of its extensions (bash scripts/vllm_cuda.sh): they run "
            "only on a GPU (sm90, sm100), never on the CPU; sm90 verdicts come from the lent GPU"),
    SeedRow("vLLM", "flashinfer", ("flashinfer-cutlass-experts",), "Y", "FlashInferExperts",
            "FlashInfer 0.7.2.post1's sm90 CUTLASS MoE module is 248 translation units; narrowed to the bf16 cells "
            "(scripts/flashinfer.sh --build --only bf16 --fast: 58 units), 17 compiled in 409 s with 15 jobs on the "
            "lent H200's 16 cores, four mixed-input MoE GEMM units taking 397-409 s each, before a failed unit "
            "stopped the call: the rest (about 20-40 min) does not fit a session's 30 minutes of device time (the "
            "adapter runs wherever FlashInfer is installed)"),
    SeedRow("vLLM", "gpt oss triton", ("vllm-oai-triton-experts",), "Y",
            "triton_kernel_fused_experts, OAITritonExperts",
            "OpenAI's triton_kernels (vendored by vLLM's CUDA wheel) launches its GEMMs (matmul_ogs) only on a GPU: "
            "it asks the GPU target for its tiles and weight layouts, which Triton's CPU interpreter has not; sm90 "
            "verdicts come from the lent GPU (docs/SEED_TABLE.md)"),
    SeedRow("vLLM", "marlin", ("vllm-marlin-experts",), "Y", "fused_marlin_moe, MarlinExperts, BatchedMarlinExperts",
            "Marlin's MoE GEMM is a CUDA op of vLLM's CUDA build (moe_wna16_marlin_gemm in _moe_C), loaded from the "
            "wheel's stable-ABI extensions only on a GPU machine (scripts/vllm_cuda.sh); no verdict recorded yet"),
    SeedRow("vLLM", "trtllm", (), "Y", "TrtLlmGenExperts", f"TensorRT-LLM-gen cubins (flashinfer-cubin); {_SM100}"),
    SeedRow("vLLM", "rocm aiter moe", (), "N", "rocm_aiter_fused_experts", "needs an AMD GPU (ROCm, aiter)"),
    SeedRow("vLLM", "cpu_fused_moe", ("vllm-cpu-experts",), "N", "CPUFusedMOE (torch.ops._C.cpu_fused_moe)"),
    SeedRow("vLLM", "naive batched", ("vllm-naive-batched",), "Y", "NaiveBatchedExperts"),
    SeedRow("SGLang", "FusedMoE (Triton)", ("sglang-triton-experts",), "-",
            "srt/layers/moe/moe_runner/triton_utils/fused_moe.py: fused_experts_impl"),
    SeedRow("SGLang", "FlashInferFusedMoE", (), "-", "trtllm_bf16_moe", f"FlashInfer's trtllm-gen kernels; {_SM100}"),
    SeedRow("SGLang", "FlashInferFP4MoE", (), "-", "trtllm_fp4_block_scale_moe",
            f"FlashInfer's trtllm-gen FP4 kernels; {_SM100}"),
    SeedRow("SGLang", "FlashInferCutlass", ("sglang-triton-experts",), "-",
            "routed to FusedMoE (the seed: 'possibly not yet supported')"),
    SeedRow("SGLang", "DeepEPMoE", (), "-", "DeepEP / Mooncake all-to-all",
            "needs DeepEP or Mooncake and several GPUs with NVSHMEM/RDMA (an all-to-all, not a single-GPU kernel)"),
)

#: the seed's columns -> the `experts` op axis each is generated from (None: not a verdict)
COLUMNS: tuple[tuple[str, str | None], ...] = (
    ("Input act. format", "format"), ("Quant. types", "quant_type"), ("Quant. format", "quant_format"),
    ("Activation function", "activation"), ("Apply Weight On Input", "apply_weight_on_input"), ("Modular", None))
#: values the seed writes otherwise
_SEED_VALUE = {"G128": "G(128)", "-": None, "none": None}


def _merge(rows: Sequence[Mapping[str, Any]], axis: str) -> dict[str, dict[str, tuple[int, int]]]:
    """value -> generation -> (passed, exercised) over the row's adapters (the best adapter's counts per
    generation), for values some case exercised."""
    found: dict[str, dict[str, tuple[int, int]]] = {}
    for a in rows:
        for ax in a["axes"]:
            if ax["name"] != axis:
                continue
            for v in ax["values"]:
                for g, (passed, total) in v.get("by_generation", {}).items():
                    old = found.setdefault(v["value"], {}).get(g)
                    if total and (old is None or passed / total > old[0] / old[1]):
                        found[v["value"]][g] = (passed, total)
    return found


def _gens_text(gens: Mapping[str, tuple[int, int]]) -> str:
    words = [g if p == t else (f"{g} partial" if p else f"~~{g}~~") for g, (p, t) in gens.items()]
    return "; ".join(words)


def _cell(values: Mapping[str, Mapping[str, tuple[int, int]]], axis: str) -> str:
    shown = []
    for value, gens in values.items():
        text = _SEED_VALUE.get(value, value)
        if text is None or not gens:
            continue
        if not any(p for p, _ in gens.values()):
            text = f"~~{text}~~"
        shown.append(f"{text} ({_gens_text(gens)})")
    if axis == "quant_type" and not shown and values:
        return "N/A (unquantized)"
    return ", ".join(shown) if shown else ("N/A" if values else "-")


def _verified(rows: Sequence[Mapping[str, Any]]) -> str:
    found = []
    for a in rows:
        for g, s in a["generations"].items():
            if s["status"] in ("pass", "partial"):
                found.append(f"{g} ({a['name']}: {s['passed']}/{s['exercised']})")
    return "; ".join(found)


def _failed_everywhere(rows: Sequence[Mapping[str, Any]]) -> str:
    """For rows that ran but passed nothing: where, and how many cases failed (the kernel rows' notes say why)."""
    found = [f"{g} ({a['name']}: 0/{s['exercised']})" for a in rows for g, s in a["generations"].items()
             if s.get("exercised")]
    return f"ran, every case failed or erred: {'; '.join(found)} (see the kernel rows' notes)" if found else ""


def build(adapters: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The seed table's rows from the matrix model's kernel rows (`render.build`'s `adapters`)."""
    by_name = {a["name"]: a for a in adapters if a.get("op") == "experts"}
    out = []
    for seed in SEED_ROWS:
        rows = [by_name[n] for n in seed.adapters if n in by_name]
        verified = _verified(rows)
        row: dict[str, Any] = {"system": seed.system, "kernel": seed.kernel, "adapters": [a["name"] for a in rows],
                               "source": seed.source, "modular": seed.modular}
        if not verified:
            why = seed.unverifiable or (_failed_everywhere(rows) or "not run here: its library was not installed "
                                        "where the matrix ran" if rows else "no adapter")
            row.update(verified="", unverifiable=why)
        else:
            row.update(verified=verified, cells={axis: _cell(_merge(rows, axis), axis)
                                                 for _, axis in COLUMNS if axis is not None})
        out.append(row)
    return out


def to_markdown(rows: Sequence[Mapping[str, Any]], table: Any) -> list[str]:
    """The section's lines; `table(headers, rows)` renders a markdown table (the renderer's). None when no verdict
    of the results rendered is of a seed system (a matrix of one's own kernels)."""
    if not any(r.get("adapters") for r in rows):
        return []
    headers = ["System", "Kernel", *(c for c, _ in COLUMNS), "Source", "Verified on (passed/exercised cases)"]
    body = []
    for r in rows:
        if r.get("unverifiable"):
            text = r["unverifiable"]
            first = text if text.startswith("ran, ") else f"not verifiable here: {text}"
            cells = [first] + [""] * (len(COLUMNS) - 2) + [r["modular"] + "ᵈ"]
        else:
            cells = [r["cells"][axis] if axis else r["modular"] + "ᵈ" for _, axis in COLUMNS]
        body.append([r["system"], r["kernel"], *cells, r["source"], r.get("verified") or "-"])
    intro = ("One row per system the seed tables name (vLLM's moe_kernel_features.md, SGLang's MoE implementations); "
             "each cell lists the values some case of the row's adapters exercised and the generations they were "
             "verified on (`partial`: some of those cases failed there, see the kernel sections below; ~~struck~~: "
             "all failed). ᵈ: copied from the seed (an API property, not a verdict). The hand-written seed beside "
             "this one, and every difference explained: docs/SEED_TABLE.md.")
    return ["## Seed table (vLLM's and SGLang's MoE kernels, generated from verdicts)", "", intro, "",
            table(headers, body), ""]
