"""harness.engine.interpreter_speed: the interpreter's skipped work changes no result and hides no check.

Each patch is checked where it could go wrong: the overflow check still fires when the builder's debug option is on;
a helper reaching a language module the launch did not patch is still patched; launches after a launch start from
unpatched modules; and a set of the project's kernels gives the same bits with and without the patches.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from harness.engine.interpreter import install

REPORT = install()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tests.harness.fixtures.core_helper import load_twice  # noqa: E402

INTERP = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
pytestmark = pytest.mark.skipif(not (INTERP and REPORT.verified),
                                reason="the patches apply to a verified Triton release's interpreter only")


@triton.jit
def _mul_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 65536, mask=mask)


@triton.jit
def _helper_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, load_twice(x_ptr, offs, mask) + 1, mask=mask)


def _debug(on: bool) -> None:
    from triton.runtime import interpreter as it

    it.interpreter_builder.options = dataclasses.replace(it.interpreter_builder.options, debug=on)


def test_the_overflow_check_still_fires_with_debug_on() -> None:
    x = torch.tensor([1, 65536, 3], dtype=torch.int32)
    y = torch.empty_like(x)
    _mul_kernel[(1,)](x, y, 3, BLOCK=4)  # debug off: wraps as the compiled kernel does
    assert y.tolist() == [65536, 0, 196608]
    _debug(True)
    try:
        with pytest.raises(Exception, match="overflow"):
            _mul_kernel[(1,)](x, y, 3, BLOCK=4)
    finally:
        _debug(False)


def test_a_helper_reaching_another_language_module_is_patched_and_launches_start_clean() -> None:
    x = torch.arange(5, dtype=torch.float32)
    for _ in range(2):  # the second launch must find the modules as the first found them
        y = torch.empty_like(x)
        _helper_kernel[(1,)](x, y, 5, BLOCK=8)
        assert torch.equal(y, x * 2 + 1)
        assert getattr(tl.load, "__triton_builtin__", False)  # the launch's own patches are undone


_KERNELS = textwrap.dedent("""
    import hashlib, torch
    from harness.engine.interpreter import install
    install()
    from kernels import fused_experts, group_quant, routing
    g = torch.Generator().manual_seed(7)
    m, k, n, e, top = 13, 96, 48, 6, 2
    x = torch.randn(m, k, generator=g, dtype=torch.float32).to(torch.bfloat16)
    w1 = (torch.randn(e, 2 * n, k, generator=g) / 8).to(torch.bfloat16)
    w2 = (torch.randn(e, k, n, generator=g) / 8).to(torch.bfloat16)
    logits = torch.randn(m, e, generator=g)
    w, ids = routing.topk_route(logits, top, renormalize=True)
    outs = [w, ids, fused_experts.fused_experts(x, w1, w2, w, ids)]
    outs += list(group_quant.group_quant(x, group_size=32))
    h = hashlib.sha256()
    for t in outs:
        h.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    print(h.hexdigest())
""")


def test_the_project_kernels_give_the_same_bits_with_and_without_the_patches() -> None:
    digests = []
    for disabled in ("", "speed_overflow_checks,speed_nested_patching"):
        env = {**os.environ, "HARNESS_INTERP_DISABLE": disabled, "TRITON_INTERPRET": "1"}
        done = subprocess.run([sys.executable, "-c", _KERNELS], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        digests.append(done.stdout.split()[-1])
    assert digests[0] == digests[1]
