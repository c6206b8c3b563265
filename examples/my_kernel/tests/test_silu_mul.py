"""The kernel's own unit test, as any kernel repository has: it runs beside the generic tests of moe-harness."""

import torch
import torch.nn.functional as F
from my_moe_kernel.swiglu import silu_mul


def test_silu_mul_matches_torch() -> None:
    # on the GPU when there is one; on a CPU machine Triton's interpreter runs it (the moe-harness plugin sets it)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(0)).to(device)
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(silu_mul(x), F.silu(gate) * up)
