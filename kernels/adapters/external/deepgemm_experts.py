"""DeepGEMM's fp8 grouped GEMMs (`m_grouped_fp8_gemm_nt_contiguous`, `m_grouped_fp8_gemm_nt_masked`) driven as vLLM
0.32's `DeepGemmExperts` and `BatchedDeepGemmExperts` drive them (the seed table's `deep gemm` row), for the
`experts` op on sm90: fp8 e4m3 weights with 128x128 block scales, activations with 1x128 group scales, float32
scales. Two scale formats, as vLLM picks them on sm90 (`DeepGemmQuantScaleFMT`): FLOAT32 (`VLLM_USE_DEEP_GEMM_E8M0=0`,
`disable_ue8m0_cast=True`) and, vLLM's default, FLOAT32_CEIL_UE8M0 (the `-ue8m0` adapters): every scale rounded up
to a power of two, the activations' by vLLM's quantizers with `use_ue8m0`, the weights' by its
`requant_weight_ue8m0_inplace` (amax clamped to 1e-4, / 448, rounded up), and `disable_ue8m0_cast=False`.

DeepGEMM is built from its source against the local torch by `scripts/deepgemm.sh` into a git-ignored folder
(`third_party/deepgemm/pkg`, or MOE_DEEPGEMM_DIR); where the built extension is absent every case is
`not-installed` with that command. The source is upstream DeepGEMM (LIBRARY: version and commit); vLLM 0.32.0's
wheel vendors a later fork of it whose extension cannot load under another torch.

Both GEMMs are DeepGEMM's; the stages between them are vLLM's Triton/CUDA kernels and STAND IN here, in vLLM's order:
  * the activation quantizers (vLLM's `per_token_group_quant_fp8` before GEMM1, its fused
    `silu_mul_per_token_group_quant_fp8_colmajor` / `persistent_masked_m_silu_mul_quant` between the GEMMs): the
    oracle's, with vLLM's conventions (`vllm_experts.FP8_GROUP_ACT`: eps 1e-10 on the amax, scale
    amax * fp32(1/448), x / scale);
  * the activation (silu, gate first): the oracle's, fp32 inside, rounded once to bf16;
  * the contiguous layout (vLLM's Triton `deepgemm_moe_permute`): `contiguous_layout` below, vLLM's sm90 silu path:
    the per-expert row blocks padded to DeepGEMM's M alignment (`get_mk_alignment_for_contiguous_layout`, capped
    by its theoretical alignment for the call as `compute_aligned_M_and_alignment` does), the grouped layout
    given as each expert's end row (`use_psum_layout=True`), the GEMMs run inside vLLM's `mk_alignment_scope`;
  * the unpermute and reduce (vLLM's Triton `deepgemm_unpermute_and_reduce`): each slot's bf16 GEMM2 row times
    its router weight, summed in fp32, rounded once;
  * the masked layout's `expected_m`: vLLM's `estimate_expected_m` without data-parallel metadata (the batch's
    rows per expert).
So these rows verify DeepGEMM's two grouped GEMMs as vLLM lays out and scales their operands; every other stage
is the oracle's.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.core.case import Case
from harness.core.device import DeviceInfo
from harness.registry import Adapter, Library, import_library, provenance, register
from kernels.adapters.external import vllm_experts as ve
from reference import activations as ref_act
from reference.quant import QuantRecipe
from reference.quant import quantize as ref_quantize

Tensors = dict[str, torch.Tensor]

VERSION = "2.6.1"
COMMIT = "54e22612409371d6364144b69086735beb54e98b"
BUILD = "bash scripts/deepgemm.sh --gather (where there is network), then bash scripts/deepgemm.sh --build"
GROUP = 128
#: the largest block M of DeepGEMM's sm90 masked kernel (its heuristics pick 64 or 128): the kernel stores whole
#: blocks with no bound at a group's capacity, so a capacity that is not a multiple of it overwrites the next group's
#: first rows (docs/FINDINGS.md 13); the adapter rounds each group's capacity up to a multiple of it
MASKED_BLOCK_M = 128


def folder() -> Path:
    """The built package's folder (holding deep_gemm/)."""
    root = Path(os.environ.get("MOE_DEEPGEMM_DIR", Path(__file__).resolve().parents[3] / "third_party" / "deepgemm"))
    return root / "pkg"


@dataclass(frozen=True)
class BuiltLibrary(Library):
    """DeepGEMM as `scripts/deepgemm.sh --build` leaves it in `folder()`, else an installed `deep_gemm` (a user's own
    build, e.g. `pip install` of DeepGEMM's source against their torch): the built folder wins where both are."""

    def built(self) -> bool:
        return any((folder() / "deep_gemm").glob("_C*.so"))

    def version(self) -> str | None:
        return self.written_for if self.built() else super().version()

    def missing(self) -> str | None:
        if self.built() or super().missing() is None:
            return None
        return (f"DeepGEMM is neither built in {folder()} nor installed (the adapter was written for DeepGEMM "
                f"{self.written_for}, git {COMMIT}; build it against this torch with: {self.install})")

    def source(self) -> provenance.Source | None:
        if self.built():
            return provenance.Source(path=str(folder()), commit=COMMIT)
        return super().source()

    def load(self) -> None:
        if self.built():
            path = str(folder())
            if path not in sys.path:
                sys.path.insert(0, path)
        elif super().missing() is not None:
            raise ImportError(self.missing())
        __import__(self.module)


LIBRARY = BuiltLibrary(distribution="deep_gemm", module="deep_gemm", written_for=VERSION, install=BUILD)


def deep_gemm() -> Any:
    broken = import_library(LIBRARY)
    if broken:
        raise RuntimeError(broken)
    return sys.modules["deep_gemm"]


# ------------------------------------------------------------------------------------------------ layouts

def aligned_rows(tokens: int, top_k: int, experts: int, alignment: int) -> int:
    """vLLM's `compute_aligned_M_and_alignment` M_sum (no per-expert counts on the host): every routed row plus
    the worst padding of the experts that can be active, rounded up to the alignment."""
    slots = tokens * top_k
    rows = slots + min(slots, experts) * (alignment - 1)
    return -(-rows // alignment) * alignment


@dataclass(frozen=True)
class Contiguous:
    """The contiguous layout: `rows[i]` the permuted row of flat slot i (-1 for a non-local slot), `ends[e]` expert
    e's end row (its rows are [ends[e] - counts[e], ends[e])), `m_indices[r]` the expert of row r, -1 on padding
    rows (the layout without `use_psum_layout`), `total` the permuted buffer's rows."""

    rows: torch.Tensor
    ends: torch.Tensor
    m_indices: torch.Tensor
    total: int


def contiguous_layout(local_ids: torch.Tensor, experts: int, alignment: int) -> Contiguous:
    """vLLM's `deepgemm_moe_permute` layout for flat local expert ids (-1: not local): experts in order, each
    expert's block starting at a multiple of `alignment`, slots of one expert in flat order."""
    ids = local_ids.reshape(-1).long()
    tokens_k = ids.numel()
    counts = torch.bincount(ids[ids >= 0], minlength=experts)[:experts]
    padded = (counts + alignment - 1) // alignment * alignment
    starts = torch.cumsum(padded, 0) - padded
    rows = torch.full((tokens_k,), -1, dtype=torch.long, device=ids.device)
    m_indices = torch.full((max(int(padded.sum()), 0),), -1, dtype=torch.int32, device=ids.device)
    for e in range(experts):
        slots = torch.nonzero(ids == e).flatten()
        start = int(starts[e])
        rows[slots] = torch.arange(start, start + slots.numel(), device=ids.device)
        m_indices[start:start + slots.numel()] = e
    return Contiguous(rows=rows, ends=(starts + counts).to(torch.int32), m_indices=m_indices,
                      total=int(padded.sum()))


def expected_m(counts: torch.Tensor, rows: int) -> int:
    """vLLM's `estimate_expected_m` with no data-parallel metadata: the batch's rows per expert (at least 1)."""
    return max(1, min(rows, int(counts.max()) if counts.numel() else 1))


# ------------------------------------------------------------------------------------------------ stages

#: vLLM's 1x128 activation quantizers with `use_ue8m0` (FLOAT32_CEIL_UE8M0): the scale rounded up to a power of two
UE8M0_ACT = {**ve.FP8_GROUP_ACT, "scale_rule": "ue8m0"}
#: vLLM's `requant_weight_ue8m0_inplace` (through its `per_block_cast_to_fp8`): amax clamped to 1e-4, / 448, rounded
#: up to a power of two, the weight times its reciprocal
UE8M0_WEIGHTS = {"scale_rule": "ue8m0", "eps": 1e-4, "eps_placement": "amax", "scale_formula": "divide",
                 "application": "multiply_reciprocal"}


def quantize(a: torch.Tensor, ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Stand-in for vLLM's 1x128 fp8 activation quantizers: the oracle's, vLLM's conventions (float32 scales,
    rounded up to powers of two with `ue8m0`)."""
    recipe = UE8M0_ACT if ue8m0 else ve.FP8_GROUP_ACT
    q = ref_quantize(a.float(), QuantRecipe(dtype="fp8_e4m3fn", unit="group", group_size=GROUP, **recipe))
    return q.codes.view(torch.float8_e4m3fn), q.scales.float().reshape(*a.shape[:-1], -1)


def quantize_rows(a: torch.Tensor, counts: torch.Tensor, ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize` on each expert's valid rows of a batched [E, T, K] tensor (vLLM quantizes those only); the
    other rows' codes and scales are zero."""
    e, t, kd = a.shape
    q = torch.zeros(a.shape, dtype=torch.float8_e4m3fn, device=a.device)
    s = torch.zeros(e, t, kd // GROUP, dtype=torch.float32, device=a.device)
    for i, n in enumerate(counts.tolist()):
        if n:
            q[i, :n], s[i, :n] = quantize(a[i, :n], ue8m0)
    return q, s


def silu(h: torch.Tensor) -> torch.Tensor:
    """Stand-in for vLLM's silu-and-mul: the oracle's, fp32 inside, rounded once to bf16."""
    return ref_act.silu_and_mul(h.float(), out_dtype=torch.bfloat16)


@contextlib.contextmanager
def alignment_scope(dg: Any, value: int) -> Iterator[None]:
    """vLLM's `mk_alignment_scope`: DeepGEMM's BLOCK_M cap set to the workspace's alignment, restored after."""
    before = int(dg.get_mk_alignment_for_contiguous_layout())
    dg.set_mk_alignment_for_contiguous_layout(value)
    try:
        yield
    finally:
        dg.set_mk_alignment_for_contiguous_layout(before)


# ------------------------------------------------------------------------------------------------ support

SUPPORT: dict[str, tuple[str, ...]] = {
    "format": ("standard",), "quant_type": ("fp8_w8a8",), "quant_format": ("G128",), "activation": ("silu",),
    "apply_weight_on_input": ("N",), "expert_map": ("N", "Y"), "dtype": ("bfloat16",), "bias": ("N",)}
MASKED_SUPPORT: dict[str, tuple[str, ...]] = {**SUPPORT, "format": ("batched",), "expert_map": ("N",)}
CONVENTIONS: dict[str, Any] = {
    "gate_order": "gate_first", "rounding": "round_once", "intermediate_rounding": "gemm1_and_activation_output",
    "weight_placement": "accumulator", "matmul_precision": "fp8_mma_promoted",
    "act_quant": dict(ve.FP8_GROUP_ACT), "accumulation": "rounded_slots"}
MASKED_CONVENTIONS: dict[str, Any] = {k: v for k, v in CONVENTIONS.items() if k != "accumulation"}
MASKED_CONVENTIONS["act_quant_scope"] = "expert"
UE8M0_CONVENTIONS = {**CONVENTIONS, "act_quant": dict(UE8M0_ACT), "weight_quant": dict(UE8M0_WEIGHTS)}
MASKED_UE8M0_CONVENTIONS = {**MASKED_CONVENTIONS, "act_quant": dict(UE8M0_ACT), "weight_quant": dict(UE8M0_WEIGHTS)}


def requires(device: DeviceInfo | None, features: Mapping[str, str]) -> str | None:
    if device is not None and device.generation != "sm90":
        return (f"DeepGEMM's fp8 grouped GEMMs with float32 scales run on sm90 only (sm100 takes UE8M0 scales), "
                f"not on {device.generation}")
    return None


@dataclass
class ContiguousCall:
    """One `DeepGemmExperts` call laid out: GEMM1's permuted, quantized input, the buffers, and the two grouped
    GEMMs (`gemms`, the part the bench times beside whole pipelines)."""

    dg: Any
    align: int
    lay: Contiguous
    live: torch.Tensor  # flat slots with a local expert
    rows: torch.Tensor  # their permuted rows
    a1: torch.Tensor
    s1: torch.Tensor
    h: torch.Tensor
    a2: torch.Tensor
    s2: torch.Tensor
    y: torch.Tensor
    ue8m0: bool = False

    def gemm(self, a: tuple[torch.Tensor, torch.Tensor], w: tuple[torch.Tensor, torch.Tensor],
             out: torch.Tensor) -> None:
        with alignment_scope(self.dg, self.align):
            self.dg.m_grouped_fp8_gemm_nt_contiguous(a, w, out, self.lay.ends, disable_ue8m0_cast=not self.ue8m0,
                                                     use_psum_layout=True)

    def quantize_h(self) -> None:
        """The stand-in activation and quantizer on the rows GEMM1 wrote: the padding rows of h are never written
        (torch.empty, as vLLM's workspace) and vLLM's quantizer output for them is never read."""
        self.a2[self.rows], self.s2[self.rows] = quantize(silu(self.h[self.rows]), self.ue8m0)

    def gemms(self, inputs: Tensors, *, requantize: bool = False) -> torch.Tensor:
        """GEMM1 and GEMM2 on this call's operands; between them, with `requantize`, GEMM2's input made from GEMM1's
        output (`quantize_h`), else left as the last call made it."""
        self.gemm((self.a1, self.s1), (inputs["w13"], inputs["w13_scale"]), self.h)
        if requantize:
            self.quantize_h()
        self.gemm((self.a2, self.s2), (inputs["w2"], inputs["w2_scale"]), self.y)
        return self.y


def contiguous_call(inputs: Tensors, ue8m0: bool = False) -> ContiguousCall | None:
    """Lay out one call as vLLM's sm90 path does (None: no token or no local expert)."""
    dg = deep_gemm()
    x, topk_ids = inputs["x"], inputs["topk_ids"]
    tokens, k = topk_ids.shape
    e_local, n2, hidden = inputs["w13"].shape
    if tokens == 0 or e_local == 0:
        return None
    expert_map = inputs.get("expert_map")
    local = expert_map[topk_ids.long()] if expert_map is not None else topk_ids
    align = int(dg.get_mk_alignment_for_contiguous_layout())
    per_call = int(dg.get_theoretical_mk_alignment_for_contiguous_layout(-(-tokens * k // e_local)))
    align = per_call if 0 < per_call <= align else align
    lay = contiguous_layout(local, e_local, align)
    total = max(aligned_rows(tokens, k, e_local, align), lay.total)
    live = lay.rows >= 0
    qx, sx = quantize(x, ue8m0)
    a1 = torch.zeros(total, hidden, dtype=torch.float8_e4m3fn, device=x.device)
    s1 = torch.zeros(total, hidden // GROUP, dtype=torch.float32, device=x.device)
    src = torch.arange(tokens * k, device=x.device)[live] // k
    rows = lay.rows[live]
    a1[rows] = qx[src]
    s1[rows] = sx[src]
    n = n2 // 2
    return ContiguousCall(
        dg=dg, align=align, lay=lay, live=live, rows=rows, a1=a1, s1=s1,
        h=torch.empty(total, n2, dtype=torch.bfloat16, device=x.device),
        a2=torch.zeros(total, n, dtype=torch.float8_e4m3fn, device=x.device),
        s2=torch.zeros(total, n // GROUP, dtype=torch.float32, device=x.device),
        y=torch.empty(total, hidden, dtype=torch.bfloat16, device=x.device), ue8m0=ue8m0)


def run_contiguous(case: Case, inputs: Tensors, outputs: Tensors, ue8m0: bool = False) -> None:
    ve._check("deepgemm-contiguous-experts", SUPPORT, case.features)
    out = outputs["out"]
    call = contiguous_call(inputs, ue8m0)
    if call is None:  # no local expert: nothing routed here, the output stays zero
        out.zero_()
        return
    call.gemms(inputs, requantize=True)
    tokens, k = inputs["topk_ids"].shape
    slots = torch.zeros(tokens * k, call.y.shape[1], dtype=torch.float32, device=out.device)
    slots[call.live] = call.y[call.rows].float() * inputs["topk_weights"].reshape(-1)[call.live, None].float()
    out.copy_(slots.view(tokens, k, -1).sum(dim=1))


def run_masked(case: Case, inputs: Tensors, outputs: Tensors, ue8m0: bool = False) -> None:
    ve._check("deepgemm-masked-experts", MASKED_SUPPORT, case.features)
    dg = deep_gemm()
    x, counts, w1, w2 = inputs["x"], inputs["expert_num_tokens"], inputs["w13"], inputs["w2"]
    e, t, _ = x.shape
    if e == 0 or t == 0:
        return
    masked = counts.to(torch.int32).contiguous()
    em = expected_m(masked, t)
    # each group's capacity padded to the largest block M (vLLM's capacities are: DeepEP's per-rank maxima)
    tp = -(-t // MASKED_BLOCK_M) * MASKED_BLOCK_M
    qx, sx = quantize_rows(_pad_rows(x, tp), masked, ue8m0)
    h = torch.zeros(e, tp, w1.shape[1], dtype=torch.bfloat16, device=x.device)
    dg.m_grouped_fp8_gemm_nt_masked((qx, sx), (w1, inputs["w13_scale"]), h, masked, em, disable_ue8m0_cast=not ue8m0)
    a2, s2 = quantize_rows(silu(h.view(e * tp, -1)).view(e, tp, -1), masked, ue8m0)
    out = outputs["out"] if tp == t else torch.empty(e, tp, w2.shape[1], dtype=torch.bfloat16, device=x.device)
    dg.m_grouped_fp8_gemm_nt_masked((a2, s2), (w2, inputs["w2_scale"]), out, masked, em,
                                    disable_ue8m0_cast=not ue8m0)
    if tp != t:
        outputs["out"].copy_(out[:, :t])


def _pad_rows(a: torch.Tensor, rows: int) -> torch.Tensor:
    """a [E, T, ...] with T grown to `rows` by zero rows."""
    if a.shape[1] == rows:
        return a
    padded = torch.zeros(a.shape[0], rows, *a.shape[2:], dtype=a.dtype, device=a.device)
    padded[:, : a.shape[1]] = a
    return padded


_DESCRIPTION = ("DeepGEMM {fn} (sm90, fp8 1x128 x 128x128 float32 scales), built from source by "
                "scripts/deepgemm.sh, driven as vLLM 0.32's {cls}; stand-ins: the activation quantizers, silu, {more}")

CONTIGUOUS = register(Adapter(
    name="deepgemm-contiguous-experts", op="experts", source="deep_gemm:m_grouped_fp8_gemm_nt_contiguous",
    run=run_contiguous, support=SUPPORT, generations=("sm90",), conventions=CONVENTIONS, requires=requires,
    properties=frozenset({"deterministic"}), limits={"max_E": 256}, library=LIBRARY,
    description=_DESCRIPTION.format(fn="m_grouped_fp8_gemm_nt_contiguous", cls="DeepGemmExperts",
                                    more="the permute (psum layout) and the unpermute-reduce"),
), replace=True)

MASKED = register(Adapter(
    name="deepgemm-masked-experts", op="experts", source="deep_gemm:m_grouped_fp8_gemm_nt_masked",
    run=run_masked, support=MASKED_SUPPORT, generations=("sm90",), conventions=MASKED_CONVENTIONS,
    requires=requires, properties=frozenset({"deterministic"}), limits={"max_E": 256}, library=LIBRARY,
    description=_DESCRIPTION.format(fn="m_grouped_fp8_gemm_nt_masked", cls="BatchedDeepGemmExperts",
                                    more="expected_m"),
), replace=True)


def run_contiguous_ue8m0(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    run_contiguous(case, inputs, outputs, ue8m0=True)


def run_masked_ue8m0(case: Case, inputs: Tensors, outputs: Tensors) -> None:
    run_masked(case, inputs, outputs, ue8m0=True)


_UE8M0 = " with vLLM's default FLOAT32_CEIL_UE8M0 scales (powers of two, disable_ue8m0_cast=False)"

CONTIGUOUS_UE8M0 = register(Adapter(
    name="deepgemm-contiguous-experts-ue8m0", op="experts", source="deep_gemm:m_grouped_fp8_gemm_nt_contiguous",
    run=run_contiguous_ue8m0, support=SUPPORT, generations=("sm90",), conventions=UE8M0_CONVENTIONS,
    requires=requires, properties=frozenset({"deterministic"}), limits={"max_E": 256}, library=LIBRARY,
    description=CONTIGUOUS.description + _UE8M0,
), replace=True)

MASKED_UE8M0 = register(Adapter(
    name="deepgemm-masked-experts-ue8m0", op="experts", source="deep_gemm:m_grouped_fp8_gemm_nt_masked",
    run=run_masked_ue8m0, support=MASKED_SUPPORT, generations=("sm90",), conventions=MASKED_UE8M0_CONVENTIONS,
    requires=requires, properties=frozenset({"deterministic"}), limits={"max_E": 256}, library=LIBRARY,
    description=MASKED.description + _UE8M0,
), replace=True)
