"""Sizes that change from call to call never make a new compile: they are neither constexpr nor specialized (Triton
specializes an integer argument on divisibility by 16 and on being 1). On a GPU each new variant is a compile of
seconds (the routing kernel unrolled over a constexpr k took 15-83 s per k); the property tests draw a new size
almost every case. The block shapes, flags and the bounds of vectorized loads stay specialized on purpose."""

from __future__ import annotations

import inspect

import pytest

from kernels import align, fused_experts, routing

#: (kernel, the arguments that vary per call with no effect on the code the compiler should emit)
PER_CALL = [
    (routing._route_kernel, ("M", "K", "TOPK_GROUP")),
    (align._hist_kernel, ("E",)),
    (align._scan_kernel, ("num_chunks",)),
    (align._scatter_kernel, ("E", "block_size", "capacity", "num_blocks_cap", "num_chunks")),
    (fused_experts._moe_gemm_kernel, ("num_valid", "rows_per_expert", "a_row_div", "num_pid_m", "num_pid_n")),
]


def _unspecialized(kernel: object) -> set[str]:
    """The kernel's do_not_specialize names, compiled (JITFunction) or interpreted (InterpretedFunction)."""
    names = getattr(kernel, "do_not_specialize", None)
    if names is None:
        names = getattr(kernel, "kwargs", {}).get("do_not_specialize")
    return set(names or ())


@pytest.mark.parametrize(("kernel", "names"), PER_CALL, ids=lambda v: getattr(getattr(v, "fn", v), "__name__", ""))
def test_per_call_sizes_are_neither_constexpr_nor_specialized(kernel: object, names: tuple[str, ...]) -> None:
    params = inspect.signature(kernel.fn).parameters  # type: ignore[attr-defined]
    constexpr = [n for n in names if "constexpr" in str(params[n].annotation)]
    assert not constexpr, f"constexpr (one compile per value): {constexpr}"
    missing = sorted(set(names) - _unspecialized(kernel))
    assert not missing, f"specialized (a compile per divisibility class): {missing}"
