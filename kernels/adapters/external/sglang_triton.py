"""SGLang's Triton fused MoE (sglang 0.5.23: the seed table's `FusedMoE` with the Triton runner) for the `experts`
op, and its Triton per-token-group fp8 quantizer for `group_quant`, read from SGLang's files
(`harness.registry.sourcefiles`: the installed package, or `scripts/third_party.sh`'s unpacked wheel).

`import sglang` needs SGLang's server stack (transformers, msgspec, FlashInfer, sgl_kernel...), so the package is not
imported: its functions are taken by name, unchanged, from
  kernels/ops/moe/fused_moe_triton_kernels.py   fused_moe_kernel, fused_moe_kernel_gptq_awq, invoke_fused_moe_kernel,
                                                 moe_sum_reduce_triton and what they call,
  kernels/ops/quantization/fp8_kernel.py         the Triton per-token-group quantizer (_per_token_group_quant_8bit_raw),
  kernels/ops/quantization/int8_kernel.py        per_token_quant_int8 (Triton),
  srt/layers/moe/moe_runner/triton_utils/        fused_experts_impl and its sequence (fused_moe.py), the config choice
                                                 with SGLang's tuned configs (fused_moe_triton_config.py),
and run as SGLang runs them where its CUDA extension (sgl_kernel) is absent: the prelude sets `_is_cuda = False`,
SGLang's own portable path. So the row is SGLang's: the two GEMM kernels, their launch, config and buffers, the fp8
group / int8 token activation quantizers (Triton), the activation (torch in the activation dtype: F.silu(gate) * up,
or the torch.compile'd gpt-oss swiglu), the reduce (its Triton moe_sum_reduce). What stands in:
  * the block alignment (`moe_align_block_size`, an sgl_kernel CUDA op): the oracle's layout with SGLang's
    convention (non-local ids -1, binned as id + 1: pooled first, `ExpertMapConvention.POOL_INVALID_FIRST`);
  * the expert map: SGLang maps global ids to local ones (-1 for other ranks' experts) before its experts run; the
    adapter does that mapping (`expert_map[topk_ids]`);
  * the environment SGLang reads (server args: no deterministic inference, no fused all-reduce; no symmetric memory;
    PDL only on sm90+ as `is_arch_support_pdl` says).
SGLang's CUDA-only steps are not run (on CUDA SGLang uses its JIT silu_and_mul, sgl_kernel's moe_sum_reduce and its
CUDA per-token-group quantizer instead): the row says the portable path. Its per-tensor / per-token fp8 activation
quantizer (`scaled_fp8_quant`) is an sgl_kernel CUDA op with no source in the wheel, so fp8 T/A cells are excluded
(run raises) rather than supplied with conventions nobody read.

Conventions (read from the source): gate first in halves; swigluoai interleaved with gpt-oss constants, computed by
`swiglu_gpt_oss_sigmoid_alpha` under torch.compile (fp32 inside, one rounding); silu/gelu in the activation dtype:
act(gate) rounded, then the product rounded (`round_activation_first`); GEMM1's output and the activation output
stored in the activation dtype; the router weight on GEMM2's fp32 accumulator; each slot rounded, then summed in
fp32 by moe_sum_reduce (`rounded_slots`), top-k 1 written by GEMM2 directly; biases on the fp32 accumulator.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness.core.case import Case
from harness.core.device import DeviceInfo
from harness.core.known import KnownFinding
from harness.engine.interpreter import triton_gemm_features
from harness.registry import Adapter, FilesLibrary, Unsupported, import_library, register, sourcefiles
from reference import permute as ref_permute

Tensors = dict[str, torch.Tensor]

VERSION = "0.5.23"
_MOE = "kernels/ops/moe/fused_moe_triton_kernels.py"
_FP8 = "kernels/ops/quantization/fp8_kernel.py"
_INT8 = "kernels/ops/quantization/int8_kernel.py"
_UTILS = "srt/layers/moe/moe_runner/triton_utils"
_DRIVER = f"{_UTILS}/fused_moe.py"
_CONFIG = f"{_UTILS}/fused_moe_triton_config.py"
LIBRARY = FilesLibrary(
    distribution="sglang", module="sglang", written_for=VERSION,
    install=f"bash scripts/third_party.sh (unpacks the needed files of `pip download sglang=={VERSION} --no-deps` "
            "into third_party/), or pip install sglang",
    needs=(_MOE, _FP8, _INT8, _DRIVER, _CONFIG, f"{_UTILS}/configs"))

#: what is taken from each file, by name (file order is kept within a file)
PARTS: dict[str, tuple[str, ...]] = {
    _MOE: ("support_tensor_descriptor", "should_enable_swap_ab", "write_zeros_to_output", "fused_moe_kernel_gptq_awq",
           "fused_moe_kernel", "_set_triton_tma_allocator", "_get_b_tma_desc_cached", "invoke_fused_moe_kernel",
           "tanh", "_apply_activation", "act_and_mul_kernel", "act_and_mul_triton", "_moe_sum_reduce_kernel",
           "moe_sum_reduce_triton"),
    _FP8: ("_per_token_group_quant_8bit", "_per_token_group_quant_8bit_colmajor", "_per_token_group_quant_8bit_raw",
           "create_per_token_group_quant_fp8_output_scale"),
    _INT8: ("_per_token_quant_int8", "per_token_quant_int8"),
    _CONFIG: ("_get_cuda_shared_memory_per_block_optin", "_use_low_smem_fp8_default", "get_config_file_name",
              "get_moe_configs", "get_default_config", "try_get_optimal_moe_config", "get_config_dtype_str"),
    _DRIVER: ("_validate_fused_swiglu_interleaved", "_activation_row_filter", "_use_moe_sum_reduce_torch_compile",
              "moe_sum_reduce_torch_compile", "_swiglu_silu_clamp_mul", "swiglu_gpt_oss_sigmoid_alpha",
              "swiglu_no_interleaved_with_alpha_and_limit", "_moe_support_tma", "_prepare_fused_moe_run",
              "_fused_moe_kernel_sequence", "moe_combine_topk", "fused_experts_impl"),
}

#: stand-ins for what the taken functions import from SGLang's other modules (module docstring)
PRELUDE = '''
import contextlib
import functools
import json
import logging
import os
import types
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
    _support_tensor_descriptor = True
except ImportError:
    _support_tensor_descriptor = False

__file__ = {config_file!r}  # get_moe_configs reads the configs beside this file

_is_cuda = False  # SGLang's portable path: no sgl_kernel
_is_hip = _is_xpu = _is_musa = _use_aiter = _is_cpu_amx_available = _has_vllm_ops = False
_is_cpu = not torch.cuda.is_available()
padding_size = 0
_LOW_SMEM_FP8_DEFAULT_CUTOFF_BYTES = 128 * 1024
fp8_dtype = torch.float8_e4m3fn
fp8_max = torch.finfo(fp8_dtype).max
fp8_min = -fp8_max


class _Logger(logging.LoggerAdapter):
    def warning_once(self, *args, **kwargs):
        pass

    def info_once(self, *args, **kwargs):
        pass


_quiet = logging.getLogger("moe_harness.sglang")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False
logger = _Logger(_quiet, {{}})
_EXEC = types.SimpleNamespace(deterministic=types.SimpleNamespace(enable_deterministic_inference=False),
                              moe=types.SimpleNamespace(enable_fused_moe_sum_all_reduce=False))


def get_exec():
    return _EXEC


def get_parallel():
    return types.SimpleNamespace(tp_group=None)


def use_symmetric_memory(group, disabled=True):
    return contextlib.nullcontext()


def is_allocation_symmetric():
    return False


def is_batch_invariant_mode_enabled():
    return False


def is_arch_support_pdl():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def is_sm90_supported():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def get_device_name(device_id=0):
    return torch.cuda.get_device_name(device_id) if torch.cuda.is_available() else "cpu"


def ceil_align(x, y):
    return (x + y - 1) // y * y


def per_token_group_quant_fp8(*args, **kwargs):  # fp8_kernel's alias off CUDA
    return _per_token_group_quant_8bit_raw(*args, **kwargs)


moe_align_block_size = None  # set by the adapter: the oracle's layout (an sgl_kernel CUDA op in SGLang)
'''

#: the op's activation -> fused_experts_impl's (activation, is_gated, gemm1_alpha, gemm1_limit)
ACTIVATIONS: dict[str, tuple[str, bool, float | None, float | None]] = {
    "silu": ("silu", True, None, None), "gelu": ("gelu", True, None, None), "swigluoai": ("silu", True, 1.702, 7.0),
    "silu_no_mul": ("silu", False, None, None), "gelu_no_mul": ("gelu", False, None, None)}
DTYPES = ("bfloat16", "float16", "float32")
#: quant_type -> formats SGLang's Triton runner has (fp8 T/A need sgl_kernel's CUDA quantizer: excluded)
QUANT: dict[str, tuple[str, ...]] = {"fp8_w8a8": ("G128",), "int8_w8a8": ("A",), "w8a16": ("G128",),
                                     "w8a16_zp": ("G128",), "w4a16": ("G128",), "w4a16_zp": ("G128",)}
SUPPORT: dict[str, tuple[str, ...]] = {
    "format": ("standard",), "quant_type": ("none", *QUANT), "quant_format": ("-", "A", "G128"),
    "activation": tuple(ACTIVATIONS), "apply_weight_on_input": ("N", "Y"), "expert_map": ("N", "Y"),
    "dtype": DTYPES, "bias": ("N", "Y")}
CONVENTIONS: dict[str, Any] = {
    "gate_order": "gate_first", "rounding": "round_activation_first", "alpha": 1.702, "beta": 1.0, "limit": 7.0,
    "intermediate_rounding": "gemm1_and_activation_output", "weight_placement": "accumulator",
    "bias_placement": "accumulator", "accumulation": "rounded_slots", "matmul_precision": "ieee"}
#: SGLang's Triton per-token-group fp8 quantizer (row-major scales): max(amax, 1e-10) / 448, x * (1 / s)
FP8_GROUP_ACT = {"scale_rule": "float", "eps": 1e-10, "eps_placement": "amax", "scale_formula": "divide",
                 "application": "multiply_reciprocal"}
#: per_token_quant_int8: max(amax, 1e-10) / 127, codes round(x * (127 / max(amax, 1e-10))) half away from zero
INT8_TOKEN_ACT = {"scale_rule": "float", "eps": 1e-10, "eps_placement": "amax", "scale_formula": "divide",
                  "application": "qmax_over_amax_rn", "int8_rounding": "half_away"}
SCALED_FP8 = "SGLang's per-tensor / per-token fp8 activation quantizer is an sgl_kernel CUDA op (not in the wheel)"
WNA16_BIAS = "SGLang's wna16 kernel (fused_moe_kernel_gptq_awq) takes no bias (invoke_fused_moe_kernel asserts it)"
W8A16_ZERO = 128


def requires(device: DeviceInfo | None, features: Mapping[str, str]) -> str | None:
    qt, qf = features.get("quant_type", "none"), features.get("quant_format", "-")
    if qt == "none":
        return None if qf == "-" else f"quant_format {qf} needs a quant_type"
    if qt == "fp8_w8a8" and qf in ("T", "A"):
        return SCALED_FP8
    if qf not in QUANT.get(qt, ()):
        return f"SGLang's Triton MoE has no {qt} {qf} path"
    if qt.startswith(("w8a16", "w4a16")) and features.get("bias") == "Y":
        return WNA16_BIAS
    return None


def conventions_for(case: Case, device: DeviceInfo) -> dict[str, Any]:
    found: dict[str, Any] = {}
    f = case.features
    if f.get("dtype") == "float32":
        found["matmul_precision"] = "tf32"  # tl.dot's default precision
    if f.get("activation") == "swigluoai":
        found["rounding"] = "round_once"  # torch.compile'd: fp32 inside, one rounding
    qt = f.get("quant_type", "none")
    if qt == "fp8_w8a8":
        found["act_quant"] = dict(FP8_GROUP_ACT)
        if device.generation == "sm90":
            found["matmul_precision"] = "fp8_mma_promoted"  # Triton's default fp8 accumulation on sm90
    elif qt == "int8_w8a8":
        found["act_quant"] = dict(INT8_TOKEN_ACT)
    elif qt != "none":
        found["weight_dequant_dtype"] = f["dtype"]  # the wna16 kernel dequantizes to the activation dtype
    if qt in ("int8_w8a8", "fp8_w8a8") and device.is_cuda:
        # both activation quantizers divide with Triton's fp32 `/` (`127 / absmax`; `absmax / 448`, `1.0 / scale`):
        # div.full.f32 on NVIDIA GPUs, whose quotients break exact ties the other way on the H100 (docs/FINDINGS.md)
        found["division"] = "approximate"
    return found


def interp_features(features: Mapping[str, str]) -> set[str]:
    need = triton_gemm_features(features.get("dtype"))
    if features.get("dtype") == "float32":
        need.add("tf32_dot")
    qt = features.get("quant_type", "none")
    if qt == "fp8_w8a8":
        need |= {"fp8_cast", "fp8_dot"}
    elif qt == "int8_w8a8":
        need |= {"int8_dot", "fp_to_int_overflow", "libdevice_round"}
    return need


_BUILT: dict[str, Any] = {}


def module() -> Any:
    """SGLang's taken functions, as one module (built once per process)."""
    if "m" not in _BUILT:
        broken = import_library(LIBRARY)  # its files are here, else why not
        if broken:
            raise RuntimeError(broken)
        found = LIBRARY.found()
        assert found is not None
        prelude = PRELUDE.format(config_file=str(found.package / _CONFIG))
        stand_ins = {"sglang.srt.layers.moe.moe_runner.triton_utils": _Overrides()}
        m = sourcefiles.build(found, "sglang_moe", prelude, PARTS, stand_ins)
        m.moe_align_block_size = align_block_size
        _BUILT["m"] = m
    return _BUILT["m"]


class _Overrides:
    """`sglang.srt.layers.moe.moe_runner.triton_utils` as try_get_optimal_moe_config imports it: no override."""

    @staticmethod
    def get_config() -> None:
        return None


def align_block_size(topk_ids: torch.Tensor, block_size: int, num_experts: int,
                     *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stand-in for SGLang's moe_align_block_size: ids in [-1, E) (-1: another rank's expert), binned as id + 1,
    so the -1 entries are pooled first (the oracle's POOL_INVALID_FIRST layout)."""
    shifted = topk_ids.to(torch.int64) + 1  # bucket 0: the -1 ids
    emap = torch.arange(-1, num_experts, dtype=torch.int32, device=topk_ids.device)
    lay = ref_permute.align_block_size(shifted, block_size, num_experts + 1, expert_map=emap,
                                       ep_convention=ref_permute.ExpertMapConvention.POOL_INVALID_FIRST)
    return lay.sorted_token_ids, lay.expert_ids, lay.num_tokens_post_padded


def _check(features: Mapping[str, str]) -> None:
    for axis, value in features.items():
        if value not in SUPPORT.get(axis, ()):
            raise Unsupported(f"sglang-triton-experts does not support {axis}={value}")
    qt, qf = features.get("quant_type", "none"), features.get("quant_format", "-")
    if (qt, qf) != ("none", "-") and qf not in QUANT.get(qt, ()):
        raise Unsupported(SCALED_FP8 if qt == "fp8_w8a8" else f"SGLang's Triton MoE has no {qt} {qf} path")


def _flags(features: Mapping[str, str]) -> dict[str, Any]:
    qt, qf = features.get("quant_type", "none"), features.get("quant_format", "-")
    weight_only = qt.startswith(("w8a16", "w4a16"))
    block = ([0, 128] if weight_only else [128, 128]) if qf == "G128" else None
    return {"use_fp8_w8a8": qt == "fp8_w8a8", "use_int8_w8a8": qt == "int8_w8a8",
            "use_int8_w8a16": qt.startswith("w8a16"), "use_int4_w4a16": qt.startswith("w4a16"),
            "per_channel_quant": qf == "A" and not weight_only, "block_shape": block}


def _local_ids(inputs: Tensors) -> torch.Tensor:
    ids = inputs["topk_ids"]
    emap = inputs.get("expert_map")
    return ids if emap is None else emap[ids.long()].to(torch.int32)


def run(case: Case, inputs: Tensors, outputs: Tensors) -> dict[str, torch.Tensor] | None:
    _check(case.features)
    m = module()
    f = case.features
    x = inputs["x"]
    if x.shape[0] == 0:
        return None
    act, gated, alpha, limit = ACTIVATIONS[f["activation"]]
    out = m.fused_experts_impl(
        x.contiguous(), inputs["w13"].contiguous(), inputs["w2"].contiguous(), inputs["topk_weights"],
        _local_ids(inputs), b1=inputs.get("w13_bias"), b2=inputs.get("w2_bias"), activation=act, is_gated=gated,
        apply_router_weight_on_input=f["apply_weight_on_input"] == "Y", w1_scale=inputs.get("w13_scale"),
        w2_scale=inputs.get("w2_scale"), w1_zp=inputs.get("w13_zp"), w2_zp=inputs.get("w2_zp"),
        gemm1_alpha=alpha, gemm1_limit=limit, **_flags(f))
    return {"out": out}


#: docs/FINDINGS.md 9: at top-k 1 the portable path's combine sums a never-written buffer over the output GEMM2 wrote
#: (only without routed scaling, which the adapter never passes): garbage, different on every run, in every case
#: with a token. Its case is the committed docs/findings/sglang-triton-topk1-unwritten-intermediate.json
TOPK1_UNWRITTEN = KnownFinding(
    finding="docs/FINDINGS.md 9 (top-k 1 on the portable path: the output is overwritten by the sum of a buffer "
            "never written)",
    checks=("out", "finite:out", "deterministic:out"), shapes={"k": (1,), "M": {"min": 1}},
    case=Case(op="experts", adapter="sglang-triton-experts", seed=0, routing="random", dtypes={"x": "bfloat16"},
              features={"activation": "silu", "apply_weight_on_input": "N", "bias": "N", "dtype": "bfloat16",
                        "expert_map": "N", "format": "standard", "quant_format": "-", "quant_type": "none"},
              shapes={"E": 4, "K": 32, "M": 3, "N": 16, "k": 1}))

EXPERTS = register(Adapter(
    name="sglang-triton-experts", op="experts", source=f"sglang/{_DRIVER}:fused_experts_impl", run=run,
    support=SUPPORT, generations=("interp", "sm80", "sm89", "sm90", "sm100", "sm120"), conventions=CONVENTIONS,
    conventions_for=conventions_for, requires=requires, properties=frozenset({"deterministic"}),
    limits={"block_M": 16, "max_E": 512}, interp_features=interp_features, library=LIBRARY, known=(TOPK1_UNWRITTEN,),
    description="SGLang fused_experts_impl (Triton fused_moe_kernel / gptq_awq, its config, torch activation, "
                "Triton moe_sum_reduce and fp8/int8 activation quantizers) on its portable path (no sgl_kernel), "
                "read from its files; stand-in: the block alignment (oracle layout, SGLang's -1-first convention) "
                "and the expert-map lookup SGLang does before its experts",
), replace=True)
