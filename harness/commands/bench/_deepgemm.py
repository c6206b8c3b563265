"""DeepGEMM's two grouped GEMMs timed beside the fp8 G128 experts rows, where its extension is built
(`scripts/deepgemm.sh --build`) and the GPU is sm90: `m_grouped_fp8_gemm_nt_contiguous` twice, on the operands vLLM's
`DeepGemmExperts` lays out (kernels/adapters/external/deepgemm_experts.py). Only the two GEMMs are timed: the permute,
activation quantizers and reduce around them are the adapter's stand-ins, not DeepGEMM's, so the row is DeepGEMM's
GEMM time, a lower bound on a DeepGEMM pipeline's. It is verified first by judging the adapter's whole pipeline on
the same inputs (the GEMMs' outputs flow into it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from harness.commands.bench import BenchCase
from harness.core.case import Case

ADAPTER = "deepgemm-contiguous-experts"


def missing(device: str) -> str | None:
    """Why there are no DeepGEMM rows on `device` (None: there are)."""
    if not device.startswith("cuda") or torch.cuda.get_device_capability(device)[0] != 9:
        return "DeepGEMM's fp8 grouped GEMMs with float32 scales run on sm90 only"
    from kernels.adapters.external import deepgemm_experts as dge

    return dge.LIBRARY.missing()


def rows(p: Any, features: dict[str, str], verify_rows: Any, compare_to: tuple[str, ...]) -> Iterator[BenchCase]:
    """The DeepGEMM row of one fp8 G128 point `p` (an experts bench `_Point`)."""
    from kernels.adapters.external import deepgemm_experts as dge

    call = dge.contiguous_call(p.inp)
    if call is None:
        return
    call.gemms(p.inp, requantize=True)  # GEMM2's timed input: this batch's own activation
    case = Case(op="experts", adapter=ADAPTER, features=features, seed=0, shapes={}, dtypes={"x": "bfloat16"})
    out = torch.empty_like(p.inp["x"])

    def pipeline() -> torch.Tensor:
        dge.run_contiguous(case, p.inp, {"out": out})
        return out

    version = dge.LIBRARY.version() or "?"
    yield p.case(f"deepgemm-{version} grouped GEMMs", lambda: call.gemms(p.inp),
                 verify_rows(p.inp, pipeline, ADAPTER, scheme=p.scheme), columns={"timed": "GEMM1 + GEMM2 only"},
                 compare_to=compare_to)
