"""Adapters of the kernels this project ships (one per kernel). None yet: the Triton stage kernels land with issue 5."""
