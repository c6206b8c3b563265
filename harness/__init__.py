"""moe-harness: verification engine for fused Mixture-of-Experts kernels."""

__version__ = "0.1.0"
