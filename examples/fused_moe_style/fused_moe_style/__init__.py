"""A second worked example: adapters for kernels written the way vLLM writes its Triton MoE kernels."""
