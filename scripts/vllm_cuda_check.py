"""Whether vLLM's CUDA extensions load and run on this machine: loads both (kernels/adapters/external/_vllm_cuda.py),
names every op the adapters call that is missing, and runs one small op of each library against plain torch.

    python scripts/vllm_cuda_check.py      exit 0: usable; 1: not (the reason printed)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: namespace -> ops the adapters call
USED = {
    "_moe_C": ("topk_softmax", "topk_sigmoid", "grouped_topk", "moe_align_block_size", "moe_sum",
               "moe_wna16_marlin_gemm"),
    "_C": ("gptq_marlin_repack", "cutlass_moe_mm", "get_cutlass_moe_mm_data", "silu_and_mul",
           "per_token_group_fp8_quant", "dynamic_per_token_scaled_fp8_quant"),
}


def main() -> int:
    import torch

    from kernels.adapters.external import _vllm_cuda

    start = time.monotonic()
    try:
        namespaces = {name: _vllm_cuda.ops(name) for name in USED}
    except RuntimeError as exc:
        print(f"vllm_cuda_check: not usable: {exc}")
        return 1
    print(f"vllm_cuda_check: loaded {_vllm_cuda.LIBRARY.label()} in {time.monotonic() - start:.1f} s")
    missing = [f"{ns}::{op}" for ns, names in USED.items() for op in names if not hasattr(namespaces[ns], op)]
    if missing:
        print(f"vllm_cuda_check: missing ops: {', '.join(missing)}")
        return 1
    logits = torch.randn(7, 16, device="cuda")
    weights = torch.empty(7, 2, device="cuda")
    ids = torch.empty(7, 2, dtype=torch.int32, device="cuda")
    rows = torch.empty(7, 2, dtype=torch.int32, device="cuda")
    namespaces["_moe_C"].topk_softmax(weights, ids, rows, logits, False, None, None)
    want = torch.softmax(logits, -1).topk(2, -1)
    x = torch.randn(5, 64, device="cuda", dtype=torch.bfloat16)
    act = torch.empty(5, 32, device="cuda", dtype=torch.bfloat16)
    namespaces["_C"].silu_and_mul(act, x)
    ok = torch.equal(ids.long(), want.indices) and torch.allclose(weights, want.values, atol=1e-6)
    ok = ok and torch.allclose(act.float(), (torch.nn.functional.silu(x[:, :32].float()) * x[:, 32:].float()),
                               atol=2e-2, rtol=2e-2)
    print(f"vllm_cuda_check: topk_softmax and silu_and_mul {'agree with torch' if ok else 'DISAGREE with torch'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
