"""FlashInfer's CUTLASS fused MoE (`flashinfer.fused_moe.cutlass_fused_moe`, flashinfer-python 0.7.2.post1) driven as
vLLM 0.32's `FlashInferExperts` drives it (the seed table's `flashinfer` row), for the `experts` op on sm90:
  * bf16: `quant_scales=[]`, no input scale factors;
  * fp8 with 1x128 activation / 128x128 weight block scales (DeepSeek's recipe): the bf16 input as is (the kernel
    quantizes it), `use_deepseek_fp8_block_scale=True`, `quant_scales=[w13_scale, w2_scale]` (float32);
  * W13 handed over as vLLM's `swap_w13_to_w31` leaves it: [up; gate] along its output rows (the harness's
    layout is gate first, in halves), the block scales likewise; `activation_type=Swiglu` (silu(gate) * up);
  * `token_selected_experts` = topk_ids as int32, `token_final_scales` = the fp32 router weights, one rank.
Everything is FlashInfer's: the permute, both GEMMs, the activation, the fp8 quantizers and the finalize (the
weighted reduce). Nothing stands in.

Where it runs: an installed `flashinfer` (pip install flashinfer-python), or the bundle `scripts/flashinfer.sh`
unpacks into third_party/flashinfer/ (MOE_FLASHINFER_DIR) and builds, there narrowed to these cells
(`--only bf16,fp8-block`: 124 translation units of the module's 248, docs/THIRD_PARTY.md) and installed as FlashInfer's
prebuilt module. On the lent H100 10 units took 400 s with 8 jobs, so the whole build (an hour or more) did not fit
the device machine's calls and this adapter has not yet been judged on a GPU (docs/SEED_TABLE.md). The conventions below
are read from FlashInfer's and vLLM's Python sources (GEMM results in the output dtype between the stages, the
router weight and the slot sum in the fp32 finalize epilogue); the first sm90 run confirms or corrects them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.core.case import Case
from harness.core.device import DeviceInfo
from harness.registry import Adapter, Library, Unsupported, import_library, register
from kernels.adapters.external import vllm_experts as ve

Tensors = dict[str, torch.Tensor]

VERSION = "0.7.2.post1"
INSTALL = (f"pip install flashinfer-python=={VERSION} (its sm90 MoE module JIT-compiles for an hour or more on first "
           "use), or bash scripts/flashinfer.sh --gather where there is network, then --build (resumable) here")


def folder() -> Path:
    """The bundle's site folder `scripts/flashinfer.sh --build` unpacks (holding flashinfer/)."""
    default = Path(__file__).resolve().parents[3] / "third_party" / "flashinfer"
    root = Path(os.environ.get("MOE_FLASHINFER_DIR", default))
    return root / "pkg" / "site"


@dataclass(frozen=True)
class BundledLibrary(Library):
    """FlashInfer installed, else the bundle unpacked by scripts/flashinfer.sh (put on the path when imported)."""

    def unpacked(self) -> bool:
        return (folder() / "flashinfer" / "__init__.py").exists()

    def missing(self) -> str | None:
        if super().missing() is None or self.unpacked():
            return None
        return (f"FlashInfer is neither installed nor unpacked in {folder()} (the adapter was written for "
                f"flashinfer-python {self.written_for}; {self.install})")

    def version(self) -> str | None:
        return super().version() or (self.written_for if self.unpacked() else None)

    def load(self) -> None:
        if super().missing() is not None and self.unpacked() and str(folder()) not in sys.path:
            sys.path.insert(0, str(folder()))
        __import__("flashinfer.fused_moe")


LIBRARY = BundledLibrary(distribution="flashinfer-python", module="flashinfer", written_for=VERSION, install=INSTALL)

SUPPORT: dict[str, tuple[str, ...]] = {
    "format": ("standard",), "quant_type": ("none", "fp8_w8a8"), "quant_format": ("-", "G128"),
    "activation": ("silu",), "apply_weight_on_input": ("N",), "expert_map": ("N",), "dtype": ("bfloat16",),
    "bias": ("N",)}
CONVENTIONS: dict[str, Any] = {
    "gate_order": "gate_first", "rounding": "round_once", "intermediate_rounding": "gemm1_and_activation_output",
    "weight_placement": "accumulator", "accumulation": "fp32"}


def requires(device: DeviceInfo | None, features: Mapping[str, str]) -> str | None:
    qt, qf = features.get("quant_type", "none"), features.get("quant_format", "-")
    if (qt, qf) not in (("none", "-"), ("fp8_w8a8", "G128")):
        return f"FlashInferExperts' sm90 paths here are bf16 and fp8 with 128x128 block scales, not {qt} {qf}"
    if device is not None and device.generation != "sm90":
        return f"the fp8 block-scale CUTLASS MoE is sm90's (written for the H100), not {device.generation}'s"
    return None


def conventions_for(case: Case, device: DeviceInfo) -> dict[str, Any]:
    if case.features.get("quant_type") != "fp8_w8a8":
        return {}
    # DeepSeek's recipe: 1x128 activation groups, float scales amax / 448 (as vLLM's FP8_GROUP_ACT), the fp8
    # MMAs promoted to fp32 every few steps (CUTLASS's block-scaled mainloop)
    return {"act_quant": dict(ve.FP8_GROUP_ACT), "matmul_precision": "fp8_mma_promoted"}


def w31(w: torch.Tensor) -> torch.Tensor:
    """vLLM's swap_w13_to_w31 along dim 1: [gate; up] halves -> [up; gate] (weights and their block scales)."""
    e, rows = w.shape[:2]
    return w.reshape(e, 2, rows // 2, *w.shape[2:]).flip(1).reshape(w.shape).contiguous()


def fused_moe() -> Any:
    broken = import_library(LIBRARY)
    if broken:
        raise RuntimeError(broken)
    return sys.modules["flashinfer.fused_moe"]


def run(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    ve._check("flashinfer-cutlass-experts", SUPPORT, case.features)
    why = requires(None, case.features)
    if why:
        raise Unsupported(why)
    out, x = outputs["out"], inputs["x"]
    if x.shape[0] == 0:
        return
    fm = fused_moe()
    fp8 = case.features["quant_type"] == "fp8_w8a8"
    scales = [w31(inputs["w13_scale"]), inputs["w2_scale"].contiguous()] if fp8 else []
    fm.cutlass_fused_moe(
        input=x.contiguous(), token_selected_experts=inputs["topk_ids"].to(torch.int32).contiguous(),
        token_final_scales=inputs["topk_weights"].float().contiguous(), fc1_expert_weights=w31(inputs["w13"]),
        fc2_expert_weights=inputs["w2"].contiguous(), output_dtype=x.dtype, quant_scales=scales, output=out,
        use_deepseek_fp8_block_scale=fp8, activation_type=fm.ActivationType.Swiglu)


EXPERTS = register(Adapter(
    name="flashinfer-cutlass-experts", op="experts", source="flashinfer.fused_moe:cutlass_fused_moe", run=run,
    support=SUPPORT, generations=("sm90",), conventions=CONVENTIONS, conventions_for=conventions_for,
    requires=requires, limits={"K_multiple": 128, "N_multiple": 128, "max_E": 256}, library=LIBRARY,
    description="FlashInfer cutlass_fused_moe (sm90: bf16, fp8 128x128 block scales), driven as vLLM 0.32's "
                "FlashInferExperts (W13 as [up; gate]); everything between input and output is FlashInfer's",
), replace=True)
