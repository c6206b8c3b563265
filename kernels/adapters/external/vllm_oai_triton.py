"""OpenAI's triton_kernels MoE as vLLM 0.32.0 drives it (`OAITritonExperts` / `triton_kernel_fused_experts`, the seed
table's `gpt oss triton` row) for the `experts` op: mxfp4 weights, bf16 activations, gpt-oss's swiglu fused into
GEMM1.

vLLM's CUDA wheel vendors triton_kernels at `vllm/third_party/triton_kernels/` (40 files, 360 KB, no version of its
own). vLLM calls its API generation "3.5.1" (`vllm.utils.import_utils.get_triton_kernels_version`: `matmul_ogs`
present, `SparseMatrix` absent), the generation of Triton's `v3.5.x` tags; vLLM's build fetches it from
github.com/triton-lang/triton (`cmake/external_projects/triton_kernels.cmake`, `DEFAULT_TRITON_KERNELS_TAG`, not in
the wheel), so the wheel's version and a content hash of the files are its provenance (`LIBRARY`). Nothing of it is
kept here: `bash scripts/third_party.sh` unpacks it with vLLM's driver into the git-ignored `third_party/`.

What runs, unchanged, from the wheel's files:
  third_party/triton_kernels/            the package itself, imported under its own top-level name `triton_kernels`
                                         (as vLLM's import_triton_kernels registers it) from its files, never put on
                                         sys.path: routing (bitmatrix, sort), matmul_ogs (_matmul_ogs on Hopper with
                                         mxfp4 weights: dot with in-kernel mxfp4 -> bf16 upcast), swiglu, reduce;
  experts/gpt_oss_triton_kernels_moe.py  make_routing_data with its pack_bitmatrix kernel and vLLM's non-pow2 top-k
                                         routing patch, triton_kernel_fused_experts (both matmul_ogs calls);
  fused_moe/utils.py                     remap_topk_to_local (Triton) and _resize_cache;
  quantization/utils/mxfp4_utils.py      _swizzle_mxfp4 (the weight layouts and opt-flag constraints per device)
                                         and mx_scale_kwargs.
What stands in (the adapter's code, in vLLM's order):
  * OAITritonExperts.apply: remap the ids under an expert map, make_routing_data, triton_kernel_fused_experts with
    apply_router_weight_on_input=False (as vLLM passes it) and a workspace of (M * k, N);
  * the weight preparation of vLLM's mxfp4 oracle for its Triton backend: biases to fp32, `_swizzle_mxfp4` of each
    weight, `PrecisionConfig(weight_scale=..., flex_ctx=FlexCtx(rhs_data=...))`, read into a plain object with the
    FusedMoEQuantConfig attributes the driver reads (w1/w2 precision and bias);
  * vLLM's platform object (CUDA with this device's capability), logger, torch-version test, and the generation
    test (fixed to "3.5.1", checked against the files).
No empty batch reaches vLLM's experts (its modular kernel returns first): the adapter returns there too. The cells
vLLM's `_supports_*` methods refuse (other weight schemes, activations and dtypes, the batched format, the router
weight on the input, which OAITritonExperts.apply never passes on) are refused by `run` as well.

Conventions (read from the source): w13 rows interleaved gate/up, gate first (swiglu_fn splits adjacent columns);
gpt-oss swiglu alpha 1.702, limit 7.0, beta 1 (`s * (linear + 1)`, one fma), in fp32 on GEMM1's accumulator plus
bias, its output stored in bf16; mxfp4 weights upcast to bf16 in the kernel; the router weights rounded to bf16 by
make_routing_data (`router_weight_dtype`), multiplied on GEMM2's fp32 accumulator after its bias; each slot stored in
bf16, then the k slots summed in fp32 by reduce_grouped (`rounded_slots`).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from harness.core.case import Case
from harness.core.device import DeviceInfo
from harness.registry import Adapter, FilesLibrary, Unsupported, import_library, register, sourcefiles
from kernels.adapters.external._vllm import LOGGER

Tensors = dict[str, torch.Tensor]

VERSION = "0.32.0"
#: the triton_kernels API generation vLLM's driver takes for the vendored copy (module docstring)
TRITON_KERNELS = "3.5.1"
_TK = "third_party/triton_kernels"
_DRIVER = "model_executor/layers/fused_moe/experts/gpt_oss_triton_kernels_moe.py"
_UTILS = "model_executor/layers/fused_moe/utils.py"
_MXFP4 = "model_executor/layers/quantization/utils/mxfp4_utils.py"
LIBRARY = FilesLibrary(
    distribution="vllm", module="vllm", written_for=VERSION,
    install=f"bash scripts/third_party.sh (unpacks vllm/{_TK}/ and the files around it from `pip download "
            f"vllm=={VERSION} --no-deps` into third_party/)",
    needs=(_TK, _DRIVER, _UTILS, _MXFP4))

PARTS: dict[str, tuple[str, ...]] = {
    _UTILS: ("_remap_topk_to_local_kernel", "remap_topk_to_local", "_resize_cache"),
    _MXFP4: ("mx_scale_kwargs", "_swizzle_mxfp4"),
    _DRIVER: ("_is_sm12x", "_sm12x_block_m", "_constrain_sm12x_block_m", "_patch_legacy_routing_for_nonpow2_topk",
              "pack_bitmatrix", "triton_kernel_fused_experts", "make_routing_data"),
}

PRELUDE = '''
import enum
import functools
import logging
from math import prod
from typing import Any

import torch
import triton
import triton.language as tl
import triton_kernels.swiglu
from triton_kernels.matmul_ogs import FnSpecs, FusedActivation, GatherIndx, RoutingData, ScatterIndx, matmul_ogs
from triton_kernels.tensor import BIT, Bitmatrix

triton_kernels_version = {generation!r}
_SM12X_MAX_BLOCK_M = 32
FusedMoEQuantConfig = Any  # annotations only


class MoEActivation(enum.Enum):
    SWIGLUOAI = "swigluoai"

{logger}


class _Capability(tuple):
    major = property(lambda self: self[0])
    minor = property(lambda self: self[1])


class _Platform:
    def is_cuda(self):
        return torch.cuda.is_available()

    def is_rocm(self):
        return False

    def get_device_capability(self):
        return _Capability(torch.cuda.get_device_capability()) if torch.cuda.is_available() else None

    def is_device_capability(self, capability):
        cap = self.get_device_capability()
        return cap is not None and cap[0] * 10 + cap[1] == capability

    def is_device_capability_family(self, capability):
        cap = self.get_device_capability()
        return cap is not None and cap[0] * 10 == capability


current_platform = _Platform()


def has_triton_kernels():
    return True


def get_triton_kernels_version():
    return triton_kernels_version


def is_torch_equal_or_newer(target):
    from packaging.version import Version

    return Version(torch.__version__.split("+")[0]) >= Version(target)


def should_use_cdna4_mx_scale_swizzle():
    return False
'''

_BUILT: dict[str, Any] = {}


def triton_kernels_package() -> Path:
    """The vendored package's directory (the library must be found)."""
    found = LIBRARY.found()
    assert found is not None
    return found.package / _TK


def import_triton_kernels() -> types.ModuleType:
    """The vendored package under its own name `triton_kernels`, imported from its files (once per process). A
    `triton_kernels` already imported from elsewhere is not replaced: RuntimeError."""
    pkg = triton_kernels_package()
    have = sys.modules.get("triton_kernels")
    if have is not None:
        where = Path(getattr(have, "__file__", "") or "").parent
        if where.resolve() != pkg.resolve():
            raise RuntimeError(f"another triton_kernels is imported in this process ({where}), not vLLM's ({pkg})")
        return have
    spec = importlib.util.spec_from_file_location("triton_kernels", pkg / "__init__.py",
                                                  submodule_search_locations=[str(pkg)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["triton_kernels"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop("triton_kernels", None)
        raise
    return module


def module() -> Any:
    """vLLM's taken functions as one module over the vendored triton_kernels (built once per process)."""
    if "m" not in _BUILT:
        broken = import_library(LIBRARY)
        if broken:
            raise RuntimeError(broken)
        import_triton_kernels()
        generation = _generation()
        if generation != TRITON_KERNELS:
            raise RuntimeError(f"vLLM's triton_kernels here is API generation {generation}, the adapter was "
                               f"written for {TRITON_KERNELS}")
        found = LIBRARY.found()
        assert found is not None
        m = sourcefiles.build(found, "vllm_oai", PRELUDE.format(generation=generation, logger=LOGGER), PARTS)
        m._patch_legacy_routing_for_nonpow2_topk()  # as vLLM's module does when it is imported
        _BUILT["m"] = m
    return _BUILT["m"]


def _generation() -> str:
    """vLLM's get_triton_kernels_version test, on the imported package."""
    try:
        importlib.import_module("triton_kernels.matmul_ogs")
    except ImportError:
        return "3.8"
    tensor = importlib.import_module("triton_kernels.tensor")
    return "3.6" if hasattr(tensor, "SparseMatrix") else "3.5.1"


SUPPORT: dict[str, tuple[str, ...]] = {
    "format": ("standard",), "quant_type": ("mxfp4_a16",), "quant_format": ("G32",), "activation": ("swigluoai",),
    "apply_weight_on_input": ("N",), "expert_map": ("N", "Y"), "dtype": ("bfloat16",), "bias": ("N", "Y")}

CONVENTIONS: dict[str, Any] = {
    "gate_order": "gate_first", "layout": "interleaved", "alpha": 1.702, "beta": 1.0, "limit": 7.0,
    "rounding": "round_once", "intermediate_rounding": "activation_output", "bias_placement": "accumulator",
    "weight_placement": "accumulator", "accumulation": "rounded_slots", "router_weight_dtype": "bfloat16",
    "weight_dequant_dtype": "bfloat16"}

#: vLLM's _triton_kernel_moe_supports_current_device on CUDA: sm90 up to sm12x; the interpreter as well
GENERATIONS = ("interp", "sm90", "sm100", "sm120")


def requires(device: DeviceInfo | None, features: Mapping[str, str]) -> str | None:
    for axis, values in SUPPORT.items():
        if features.get(axis, values[0]) not in values:
            return f"vLLM's OAITritonExperts has no {axis}={features.get(axis)} path"
    return None


def interp_features(features: Mapping[str, str]) -> set[str]:
    """matmul_ogs asks the GPU target for its tiles and weight layouts (`gpu_target`: never on the interpreter);
    routing passes wrapped tensors to its kernels and vLLM's routing patch defines nested kernels."""
    return {"gpu_target", "tensor_wrappers", "closures", "bf16_dot", "bf16_cast", "bf16_arith", "load_store"}


class _QuantConfig:
    """The FusedMoEQuantConfig attributes triton_kernel_fused_experts reads."""

    def __init__(self, w1_precision: Any, w2_precision: Any, w1_bias: torch.Tensor | None,
                 w2_bias: torch.Tensor | None) -> None:
        self.w1_precision, self.w2_precision = w1_precision, w2_precision
        self.w1_bias, self.w2_bias = w1_bias, w2_bias


def _prepare(m: Any, inputs: Tensors) -> _QuantConfig:
    """vLLM's mxfp4 oracle, Triton backend: the weights swizzled, their scales in precision configs, fp32 biases."""
    from triton_kernels.matmul_ogs import FlexCtx, PrecisionConfig

    precision = []
    weights = []
    for which in ("w13", "w2"):
        w, flex, scale = m._swizzle_mxfp4(inputs[which], inputs[f"{which}_scale"])
        weights.append(w)
        precision.append(PrecisionConfig(**m.mx_scale_kwargs(scale), flex_ctx=FlexCtx(rhs_data=flex)))
    bias = [inputs[b].to(torch.float32) if b in inputs else None for b in ("w13_bias", "w2_bias")]
    qc = _QuantConfig(precision[0], precision[1], bias[0], bias[1])
    qc.weights = tuple(weights)  # type: ignore[attr-defined]
    return qc


def run(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    why = requires(None, case.features)
    if why:
        raise Unsupported(why)
    m = module()
    x, topk_ids, topk_weights = inputs["x"], inputs["topk_ids"], inputs["topk_weights"]
    tokens, k = topk_ids.shape
    if tokens == 0:
        return
    qc = _prepare(m, inputs)
    w1, w2 = qc.weights  # type: ignore[attr-defined]
    expert_map = inputs.get("expert_map")
    if expert_map is not None:
        topk_ids = m.remap_topk_to_local(topk_ids.contiguous(), expert_map)
    e_local = inputs["w13"].shape[0]
    routing_data, gather, scatter = m.make_routing_data(topk_ids, topk_weights, e_local)
    n = inputs["w2"].shape[2] * 2
    workspace = torch.empty(tokens * k, n, dtype=x.dtype, device=x.device)
    m.triton_kernel_fused_experts(outputs["out"], x, w1, w2, routing_data, gather, scatter, topk=k,
                                  activation=m.MoEActivation.SWIGLUOAI, quant_config=qc,
                                  apply_router_weight_on_input=False, global_num_experts=e_local, expert_map=None,
                                  intermediate_cache=workspace, a1q_scale=None)


ADAPTER = register(Adapter(
    name="vllm-oai-triton-experts", op="experts", run=run, support=SUPPORT, generations=GENERATIONS,
    source=f"vllm/{_DRIVER}:triton_kernel_fused_experts", conventions=CONVENTIONS, requires=requires,
    properties=frozenset({"deterministic"}), library=LIBRARY, interp_features=interp_features,
    # matmul_ogs' mxfp4 weight swizzles assert at compile time: BLOCK_N % 128 == 0 (seen on sm90 at hidden or
    # intermediate sizes of 32 to 96; vLLM pads gpt-oss' 2880 to multiples of 128 or more) and, with vLLM's Hopper
    # scale layout of 8 warps, BLOCK_N % 256 == 0, which opt_flags' compute_block_n picks only for a GEMM's output
    # width above 128: GEMM2's is K (GEMM1's, 2N, is 256 at least). With no local expert its opt_flags divide by
    # zero: vLLM never builds an EP rank without experts.
    limits={"K_multiple": 128, "N_multiple": 128, "min_K": 256, "min_local_experts": 1},
    description=f"OpenAI triton_kernels (API {TRITON_KERNELS}, vendored by vLLM {VERSION}): routing, matmul_ogs with "
                "the fused gpt-oss swiglu, mxfp4 weights swizzled by vLLM's _swizzle_mxfp4, driven by vLLM's "
                "make_routing_data and triton_kernel_fused_experts; OAITritonExperts.apply and the weight "
                "preparation stand in",
), replace=True)
