"""The oracle: pure-PyTorch reference implementations of every MoE pipeline stage.

Written for a reader, not for speed: each function states its contract in its docstring and takes every
convention on which production libraries differ as an explicit argument (see docs/SEMANTICS.md).
Nothing here imports Triton or the harness.
"""
