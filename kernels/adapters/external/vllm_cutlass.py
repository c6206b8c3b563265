"""vLLM 0.32.0's CUTLASS fp8 MoE (`CutlassExpertsFp8`, `CutlassBatchedExpertsFp8`: the seed table's `cutlass_fp8`
row) for the `experts` op: fp8 e4m3 weights with per-expert (T) or per-channel (A) scales, activations quantized
dynamically per tensor (T) or per token (A), grouped GEMMs by CUTLASS on sm90 / sm100.

What runs, unchanged, from vLLM's CUDA extensions (`_vllm_cuda`: the wheel's two stable-ABI libraries, loaded with
`torch.ops.load_library`; every op is reached through `_vllm_cuda.ops(namespace)`), in run_cutlass_moe_fp8's order:
  _C.dynamic_scaled_fp8_quant /          the activation quantizers (vLLM's `scaled_fp8_quant` with no static scale:
  _C.dynamic_per_token_scaled_fp8_quant  per tensor, or per token for A), before GEMM1 and between the GEMMs;
  _moe_C.moe_permute_with_scratch        the expansion of x's rows into expert order (`moe_permute`; its scratch-free
    (or _moe_C.moe_permute)              form where `moe_permute_unpermute_supported()` is false, as vLLM picks);
  _C.get_cutlass_moe_mm_problem_sizes_from_expert_offsets / _C.get_cutlass_batched_moe_mm_data   the problem sizes;
  _C.cutlass_moe_mm                      both grouped GEMMs (sm90: FP8FastAccum mainloops, scales in the epilogue);
  _C.silu_and_mul / gelu_and_mul / swigluoai_and_mul   the activation (`apply_moe_activation`);
  _moe_C.moe_unpermute                   the weighted k-slot reduce back to token order;
  _C.cutlass_group_gemm_supported        vLLM's device test (`_supports_current_device`), with its Python wrapper's
                                         capability range (9.0 to 10.x).
What stands in (the adapter's code, in vLLM's order): the Python around those ops, i.e.
  * the prepare step (`MoEPrepareAndFinalizeNoDPEPModular.prepare`): x times the router weight in x's dtype where
    apply_router_weight_on_input (top-k 1), then quantized (`moe_kernel_quantize_input` -> `scaled_fp8_quant`);
    the batched format's prepare (x already laid out per expert here) quantizes every row per token;
  * `CutlassExpertsFp8Base.__init__`'s strides (int64 per expert: K for GEMM1's operands and GEMM2's output, N for
    GEMM2's operands, 2N for GEMM1's output) and `run_cutlass_moe_fp8`: its workspaces (fresh buffers in place of
    vLLM's aliased workspace views, never zeroed but where vLLM zeroes GEMM1's output: per-tensor scales under an
    expert map or in the batched format), the per-token scale gathered into expert order (`moe_permute`'s
    `a1q_scale[permuted_idx.clamp(max=M*k-1) // k]`), swap_ab for at most 64 routed rows, expert_offsets as the
    permute's first-token offsets less the last;
  * the modular kernel's early return with no token (M = 0): nothing runs.

Declared (from the source's `_supports_*`): quant schemes (per-channel weights, dynamic per-token activations) = A
and (per-tensor weights, dynamic per-tensor activations) = T; the third, static per-tensor activation scales, has no
cell in this op (its activation scales are dynamic). Gated activations that `apply_moe_activation` runs and the op
has: silu, gelu, swigluoai (its CUDA op's defaults alpha 1.702, limit 7.0, interleaved). bf16 and fp16 (the GEMMs'
output types), no bias (run_cutlass_moe_fp8 takes none), expert maps in the standard format. The batched format
declares A only: its prepare quantizes per expert, while the kernel quantizes GEMM2's input over the whole batch
with one per-tensor scale, a scope the op has no convention for. apply_weight_on_input Y is declared as vLLM
accepts it, but CutlassExpertsFp8.apply passes the router weights to moe_unpermute regardless of the flag after
the prepare step has already weighted the input: as the source reads, the weight is applied twice and these
cells are expected to fail (the fp4 path, run_cutlass_moe_fp4, does skip the output weight).

Conventions (read from the source): gate first (silu/gelu: halves; swigluoai: interleaved); GEMM1's output stored
in x's dtype, the activation output stored in x's dtype and then re-quantized (`gemm1_and_activation_output`);
silu/gelu round act(gate) to x's dtype before the multiply (`round_activation_first`), swigluoai rounds once;
fp8 MMAs accumulate without fp32 promotion (`FP8FastAccum` schedules: `fp8_mma_promoted`); moe_unpermute reads
each slot's GEMM2 output in x's dtype, multiplies by its fp32 router weight and sums in fp32, one rounding
(`rounded_expert_output`, `fp32`). Activation quantizers: vLLM's CUDA conventions as `vllm_experts` states them
(per tensor: amax / 448, no guard, x times fp32(1 / scale); per token: max(amax / 448, 1 / (448 * 512)), x / scale).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from harness.core.case import Case
from harness.core.device import DeviceInfo
from harness.core.known import KnownFinding
from harness.registry import Adapter, Unsupported, register
from kernels.adapters.external import _vllm_cuda
from kernels.adapters.external import vllm_experts as ve

Tensors = dict[str, torch.Tensor]

_DRIVER = "vllm/model_executor/layers/fused_moe/experts/cutlass_moe.py"
#: the op's activation axis -> vLLM's CUDA op (`apply_moe_activation`, no clamp limit configured)
ACTIVATIONS = {"silu": "silu_and_mul", "gelu": "gelu_and_mul", "swigluoai": "swigluoai_and_mul"}
DTYPES = ("bfloat16", "float16")
SUPPORT: dict[str, tuple[str, ...]] = {
    "format": ("standard",), "quant_type": ("fp8_w8a8",), "quant_format": ("T", "A"),
    "activation": tuple(ACTIVATIONS), "apply_weight_on_input": ("N", "Y"), "expert_map": ("N", "Y"),
    "dtype": DTYPES, "bias": ("N",)}
BATCHED_SUPPORT: dict[str, tuple[str, ...]] = {
    **SUPPORT, "format": ("batched",), "quant_format": ("A",), "apply_weight_on_input": ("N",), "expert_map": ("N",)}
#: vLLM's `cutlass_group_gemm_supported` wrapper: capability 9.0 up to (not including) 11.0, then the op's answer
GENERATIONS = ("sm90", "sm100")
CAPABILITY_RANGE = (90, 110)
#: at most this many routed rows: problem sizes with M and N swapped (the kernel's small-M configs expect them so)
SWAP_AB_ROWS = 64

CONVENTIONS: dict[str, Any] = {
    "gate_order": "gate_first", "alpha": 1.702, "beta": 1.0, "limit": 7.0,
    "intermediate_rounding": "gemm1_and_activation_output", "matmul_precision": "fp8_mma_promoted",
    "weight_placement": "rounded_expert_output", "accumulation": "fp32", "router_weight_dtype": "float32"}
BATCHED_CONVENTIONS: dict[str, Any] = {
    k: v for k, v in CONVENTIONS.items() if k not in ("weight_placement", "accumulation", "router_weight_dtype")}
ACT_QUANT = {"T": ve.FP8_TENSOR_ACT, "A": ve.FP8_TOKEN_ACT}
#: CUTLASS's TMA needs 16-byte rows of the fp8 operands (K and N) and moe_permute asserts them
ALIGN = 16


def conventions_for(case: Case, device: DeviceInfo) -> dict[str, Any]:
    f = case.features
    found: dict[str, Any] = {"rounding": "round_once" if f.get("activation") == "swigluoai"
                             else "round_activation_first"}
    if f.get("quant_format") in ACT_QUANT:
        found["act_quant"] = dict(ACT_QUANT[f["quant_format"]])
    return found


def requires(device: DeviceInfo | None, features: Mapping[str, str]) -> str | None:
    if device is not None and device.generation not in GENERATIONS:
        return f"vLLM's CUTLASS grouped fp8 GEMMs run on {', '.join(GENERATIONS)}, not on {device.generation}"
    return None


def _check_cell(name: str, cls: str, support: Mapping[str, tuple[str, ...]], features: Mapping[str, str]) -> None:
    """Cells vLLM's CUTLASS path cannot take at all (other schemes, dtypes, a bias, the other format)."""
    for axis in ("format", "quant_type", "quant_format", "activation", "dtype", "bias"):
        if features.get(axis) not in support[axis]:
            raise Unsupported(f"{name}: vLLM's {cls} has no {axis}={features.get(axis)} path (valid: "
                              f"{', '.join(support[axis])})")


# ------------------------------------------------------------------------------------------------ operands

@dataclass(frozen=True)
class Weights:
    """The expert weights and scales as vLLM's fp8 oracle hands them to the kernel: w1 [E, 2N, K], w2 [E, K, N]
    fp8 e4m3, contiguous; scales fp32, [E] per expert (T) or [E, rows, 1] per output channel (A)."""

    w1: torch.Tensor
    w2: torch.Tensor
    s1: torch.Tensor
    s2: torch.Tensor

    @property
    def experts(self) -> int:
        return self.w1.shape[0]

    @property
    def n(self) -> int:
        return self.w2.shape[2]

    @property
    def hidden(self) -> int:
        return self.w2.shape[1]


def weights(inputs: Tensors, per_channel: bool) -> Weights:
    """The fp8 weights and their scales, checked (ValueError naming the input)."""
    w1, w2 = inputs["w13"], inputs["w2"]
    for name, w in (("w13", w1), ("w2", w2)):
        if w.dtype != torch.float8_e4m3fn or w.dim() != 3:
            raise ValueError(f"{name} must be float8_e4m3fn [E, rows, cols], got {w.dtype} {list(w.shape)}")
    e, two_n, hidden = w1.shape
    if w2.shape != (e, hidden, two_n // 2) or two_n % 2:
        raise ValueError(f"w2 must be [E, K, N] = {[e, hidden, two_n // 2]} for w13 {list(w1.shape)} (gated: "
                         f"w13 has 2N rows), got {list(w2.shape)}")
    scales = []
    for name, rows in (("w13_scale", two_n), ("w2_scale", hidden)):
        s = inputs[name].to(torch.float32).contiguous()
        want = (e, rows, 1) if per_channel else (e,)
        if tuple(s.shape) != want:
            raise ValueError(f"{name} must be {list(want)} ({'per output channel' if per_channel else 'per expert'})"
                             f", got {list(s.shape)}")
        scales.append(s)
    return Weights(w1.contiguous(), w2.contiguous(), scales[0], scales[1])


def _check_dims(x: torch.Tensor, w: Weights) -> None:
    if x.shape[-1] != w.hidden:
        raise ValueError(f"x's last dim {x.shape[-1]} must be the weights' K = {w.hidden}")
    for name, size in (("K", w.hidden), ("N", w.n)):
        if size % ALIGN:
            raise Unsupported(f"vLLM's CUTLASS fp8 MoE needs {name} a multiple of {ALIGN} (16-byte fp8 rows), "
                              f"got {size}")


def _check_device(c: Any, x: torch.Tensor) -> None:
    """vLLM's `cutlass_group_gemm_supported()` on x's device (the real ops run on CUDA only: a CPU tensor can only
    meet a stand-in)."""
    if not x.is_cuda:
        return
    major, minor = torch.cuda.get_device_capability(x.device)
    cap = major * 10 + minor
    if not (CAPABILITY_RANGE[0] <= cap < CAPABILITY_RANGE[1]) or not c.cutlass_group_gemm_supported(cap):
        raise Unsupported(f"vLLM's cutlass_group_gemm_supported({cap}) is false: no CUTLASS grouped fp8 GEMM here")


@dataclass(frozen=True)
class Strides:
    """`CutlassExpertsFp8Base`'s int64 strides per expert: GEMM1's A and B rows (K), its C rows (2N); GEMM2's A and
    B rows (N), its C rows (K)."""

    ab1: torch.Tensor
    c1: torch.Tensor
    ab2: torch.Tensor
    c2: torch.Tensor


def strides(w: Weights, device: torch.device) -> Strides:
    def full(v: int) -> torch.Tensor:
        return torch.full((w.experts,), v, dtype=torch.int64, device=device)

    k_rows = full(w.hidden)
    return Strides(ab1=k_rows, c1=full(2 * w.n), ab2=full(w.n), c2=k_rows)


def quantize(c: Any, a: torch.Tensor, per_token: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's `scaled_fp8_quant` without a static scale: (fp8 codes [R, C], fp32 scales [R, 1] or [1])."""
    q = torch.empty(a.shape, dtype=torch.float8_e4m3fn, device=a.device)
    if per_token:
        scale = torch.empty(a.shape[0], 1, dtype=torch.float32, device=a.device)
        c.dynamic_per_token_scaled_fp8_quant(q, a, scale, None)
    else:
        scale = torch.zeros(1, dtype=torch.float32, device=a.device)  # the op's amax reduction starts from it
        c.dynamic_scaled_fp8_quant(q, a, scale)
    return q, scale


# ------------------------------------------------------------------------------------------------ the two GEMMs

@dataclass(frozen=True)
class Grouping:
    """Where each expert's rows are in the grouped operands: first rows (int64 [E]) and both GEMMs' problem sizes
    (int32 [E, 3], as the size ops wrote them)."""

    offsets: torch.Tensor
    sizes1: torch.Tensor
    sizes2: torch.Tensor


def grouped_mlp(c: Any, a1q: torch.Tensor, a1_scale: torch.Tensor, w: Weights, group: Grouping, activation: str,
                per_token: bool, *, zero_gemm1: bool, dtype: torch.dtype) -> torch.Tensor:
    """run_cutlass_moe_fp8 from GEMM1 to GEMM2 on grouped rows a1q [R, K]: GEMM1, the activation, the re-quantization,
    GEMM2. Returns GEMM2's output [R, K] in `dtype` (rows of no expert hold whatever the buffer held)."""
    rows, dev = a1q.shape[0], a1q.device
    st = strides(w, dev)
    h = torch.empty(rows, 2 * w.n, dtype=dtype, device=dev)
    if zero_gemm1:  # vLLM zeroes it there: rows no GEMM writes would enter the per-tensor amax
        h.fill_(0)
    c.cutlass_moe_mm(h, a1q, w.w1, a1_scale, w.s1, group.offsets, group.sizes1, st.ab1, st.ab1, st.c1,
                     per_token, per_token)
    a = torch.empty(rows, w.n, dtype=dtype, device=dev)
    getattr(c, ACTIVATIONS[activation])(a, h)
    a2q, a2_scale = quantize(c, a, per_token)
    y = torch.empty(rows, w.hidden, dtype=dtype, device=dev)
    c.cutlass_moe_mm(y, a2q, w.w2, a2_scale, w.s2, group.offsets, group.sizes2, st.ab2, st.ab2, st.c2,
                     per_token, per_token)
    return y


# ------------------------------------------------------------------------------------------------ standard format

@dataclass(frozen=True)
class Permuted:
    """moe_permute's results: x's rows in expert order [M*k, K], each expert's first row (int64 [E_local + 1]), the
    permuted row of each slot (int32 [M, k], for moe_unpermute) and the slot of each permuted row (int32 [M*k])."""

    rows: torch.Tensor
    first: torch.Tensor
    inverse: torch.Tensor
    source: torch.Tensor


def permute(moe: Any, a1q: torch.Tensor, topk_ids: torch.Tensor, expert_map: torch.Tensor | None, n_expert: int,
            e_local: int) -> Permuted:
    """vLLM's `moe_permute` wrapper with the buffers its `MoEPermuteScratch` (or, unsupported, its own) allocates."""
    m, k = topk_ids.shape
    dev = a1q.device

    def int32(*shape: int) -> torch.Tensor:
        return torch.empty(*shape, dtype=torch.int32, device=dev)

    rows = torch.empty(m * k, a1q.shape[1], dtype=a1q.dtype, device=dev)
    first = torch.empty(e_local + 1, dtype=torch.int64, device=dev)
    inverse, source = int32(m, k), torch.full((m * k,), m * k, dtype=torch.int32, device=dev)
    indices = torch.arange(m * k, dtype=torch.int32, device=dev).view(m, k)
    ids = topk_ids.to(torch.int32).contiguous()
    args = (a1q, ids, indices, expert_map, n_expert, e_local, k, rows, first, inverse, source)
    if bool(moe.moe_permute_unpermute_supported()):
        sort = torch.empty(int(moe.moe_permute_sort_workspace_size(m * k, n_expert)), dtype=torch.int8, device=dev)
        moe.moe_permute_with_scratch(*args, sort, int32(m, k), int32(m, k), int32(m, k))
    else:
        moe.moe_permute(*args)
    return Permuted(rows=rows, first=first, inverse=inverse, source=source)


def _prepared(c: Any, case: Case, inputs: Tensors, per_token: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The prepare step: x weighted on the input where the cell asks (top-k 1, in x's dtype), then quantized."""
    x = inputs["x"]
    if case.features["apply_weight_on_input"] == "Y":
        k = inputs["topk_ids"].shape[1]
        if k != 1:
            raise ValueError(f"apply_weight_on_input needs top-k 1 (vLLM's prepare asserts it), got top-k {k}")
        x = x * inputs["topk_weights"].to(x.dtype)
    return quantize(c, x.contiguous(), per_token)


def run_standard(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    _check_cell("vllm-cutlass-experts", "CutlassExpertsFp8", SUPPORT, case.features)
    per_token = case.features["quant_format"] == "A"
    x, topk_ids, out = inputs["x"], inputs["topk_ids"], outputs["out"]
    m, k = topk_ids.shape
    w = weights(inputs, per_token)
    _check_dims(x, w)
    if m == 0:  # the modular kernel returns before the experts
        return
    if w.experts == 0:  # vLLM builds no rank without experts (and its permute scratch asserts one)
        out.zero_()
        return
    moe, c = _vllm_cuda.ops("_moe_C"), _vllm_cuda.ops("_C")
    _check_device(c, x)
    a1q, a1_scale = _prepared(c, case, inputs, per_token)
    expert_map = inputs.get("expert_map")
    if expert_map is not None:
        expert_map = expert_map.to(torch.int32).contiguous()
    n_expert = expert_map.shape[0] if expert_map is not None else w.experts
    perm = permute(moe, a1q, topk_ids, expert_map, n_expert, w.experts)
    if per_token:  # each permuted row's token scale
        a1_scale = a1_scale[perm.source.long().clamp(max=m * k - 1) // k]
    sizes1, sizes2 = (torch.empty(w.experts, 3, dtype=torch.int32, device=x.device) for _ in range(2))
    c.get_cutlass_moe_mm_problem_sizes_from_expert_offsets(perm.first, sizes1, sizes2, w.n, w.hidden,
                                                           m * k <= SWAP_AB_ROWS)
    group = Grouping(offsets=perm.first[:-1], sizes1=sizes1, sizes2=sizes2)
    y = grouped_mlp(c, perm.rows, a1_scale, w, group, case.features["activation"], per_token,
                    zero_gemm1=not per_token and expert_map is not None, dtype=x.dtype)
    target = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
    moe.moe_unpermute(y, inputs["topk_weights"].to(torch.float32).contiguous(), perm.inverse.flatten(), perm.first,
                      k, target)
    if target is not out:
        out.copy_(target)


# ------------------------------------------------------------------------------------------------ batched format

def run_batched(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    _check_cell("vllm-cutlass-batched-experts", "CutlassBatchedExpertsFp8", BATCHED_SUPPORT, case.features)
    x, out = inputs["x"], outputs["out"]
    e, t, hidden = x.shape
    w = weights(inputs, per_channel=True)
    _check_dims(x, w)
    if e == 0 or t == 0:
        return
    if w.experts != e:
        raise ValueError(f"x must hold one batch per local expert: {w.experts} experts, x {list(x.shape)}")
    c = _vllm_cuda.ops("_C")
    _check_device(c, x)
    counts = inputs["expert_num_tokens"].to(torch.int32).contiguous()
    a1q, a1_scale = quantize(c, x.reshape(e * t, hidden).contiguous(), per_token=True)
    offsets = torch.empty(e, dtype=torch.int32, device=x.device)
    sizes1, sizes2 = (torch.empty(e, 3, dtype=torch.int32, device=x.device) for _ in range(2))
    c.get_cutlass_batched_moe_mm_data(offsets, sizes1, sizes2, counts, e, t, w.n, hidden)
    flat = Weights(w.w1, w.w2, w.s1.reshape(e, -1), w.s2.reshape(e, -1))  # as run_cutlass_moe_fp8 reshapes them
    group = Grouping(offsets=offsets.to(torch.int64), sizes1=sizes1, sizes2=sizes2)
    y = grouped_mlp(c, a1q, a1_scale, flat, group, case.features["activation"], True, zero_gemm1=False,
                    dtype=x.dtype)
    out.copy_(y.view(e, t, hidden))


_LIMITS = {"K_multiple": ALIGN, "N_multiple": ALIGN, "min_local_experts": 1, "block_M": 64, "max_E": 1024}
_DESCRIPTION = ("vLLM {v} {cls} on its CUDA extensions' ops, unchanged: dynamic fp8 quantizers, {layout}"
                "cutlass_moe_mm (both grouped GEMMs), silu/gelu/swigluoai_and_mul{reduce}; run_cutlass_moe_fp8's "
                "Python (buffers, strides, scale gathering) and the prepare step stand in")

WEIGHT_TWICE = KnownFinding(
    finding="docs/FINDINGS.md 14 (the router weight applied on the input is applied again by moe_unpermute)",
    checks=("out",), features={"apply_weight_on_input": ("Y",)},
    case=Case(op="experts", adapter="vllm-cutlass-experts", seed=0, routing="random", dtypes={"x": "bfloat16"},
              features={"activation": "gelu", "apply_weight_on_input": "Y", "bias": "N", "dtype": "bfloat16",
                        "expert_map": "Y", "format": "standard", "quant_format": "T", "quant_type": "fp8_w8a8"},
              shapes={"E": 1, "K": 16, "M": 1, "N": 16, "k": 1},
              params={"local_experts": 1, "map": "random", "values": "random"}))

STANDARD = register(Adapter(
    name="vllm-cutlass-experts", op="experts", source=f"{_DRIVER}:run_cutlass_moe_fp8 (torch.ops._C.cutlass_moe_mm)",
    run=run_standard, support=SUPPORT, generations=GENERATIONS, conventions=CONVENTIONS,
    conventions_for=conventions_for, requires=requires, properties=frozenset({"deterministic"}), limits=_LIMITS,
    library=_vllm_cuda.LIBRARY, known=(WEIGHT_TWICE,),
    description=_DESCRIPTION.format(v=_vllm_cuda.VERSION, cls="CutlassExpertsFp8", reduce=", moe_unpermute",
                                    layout="moe_permute, the problem sizes from its offsets, "),
), replace=True)

BATCHED = register(Adapter(
    name="vllm-cutlass-batched-experts", op="experts",
    source=f"{_DRIVER}:run_cutlass_moe_fp8 (torch.ops._C.cutlass_moe_mm, batched)", run=run_batched,
    support=BATCHED_SUPPORT, generations=GENERATIONS, conventions=BATCHED_CONVENTIONS,
    conventions_for=conventions_for, requires=requires, properties=frozenset({"deterministic"}),
    limits={k: v for k, v in _LIMITS.items() if k != "min_local_experts"}, library=_vllm_cuda.LIBRARY,
    description=_DESCRIPTION.format(v=_vllm_cuda.VERSION, cls="CutlassBatchedExpertsFp8", reduce="",
                                    layout="get_cutlass_batched_moe_mm_data, "),
), replace=True)
