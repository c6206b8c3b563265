"""An example MoE kernel package that verifies itself with moe-harness (see ../README.md)."""

from my_moe_kernel.swiglu import silu_mul

__all__ = ["silu_mul"]
