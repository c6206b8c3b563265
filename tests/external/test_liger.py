"""Liger's SwiGLU/GeGLU adapters (kernels/adapters/external/liger.py): registered without Liger, judged with it."""

from __future__ import annotations

import dataclasses

import pytest

from harness import registry
from harness.core.case import Case
from harness.engine import runner
from kernels.adapters.external import liger


def _case(adapter: registry.Adapter, dtype: str, seed: int = 3) -> Case:
    act = adapter.support["activation"][0]
    return Case(op="activation", adapter=adapter.name, features={"activation": act, "dtype": dtype},
                shapes={"T": 9, "N": 200}, dtypes={"x": dtype}, seed=seed)


def test_registered_whether_or_not_liger_is_installed() -> None:
    for name in ("liger-swiglu", "liger-geglu"):
        a = registry.resolve(name)
        assert a.library is liger.LIBRARY and a.library.written_for == "0.8.5"
    missing = liger.LIBRARY.missing()
    installed = liger.LIBRARY.version() is not None
    assert (missing is None) == installed
    if missing:
        assert "pip install liger-kernel==0.8.5" in missing


@pytest.mark.parametrize("adapter", [liger.SWIGLU, liger.GEGLU], ids=lambda a: a.name)
def test_liger_passes_and_planted_bugs_fail(adapter, device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("liger_kernel")
    case = _case(adapter, "bfloat16")
    assert runner.judge(case, adapter, device_info, unverifiable=unverifiable).verdict == "pass"

    def off_by_one_ulp(c, inputs, outputs):  # type: ignore[no-untyped-def]
        out = adapter.run(c, inputs, outputs)["out"]
        return {"out": (out.float() * (1 + 2.0**-7)).to(out.dtype)}

    planted = dataclasses.replace(adapter, name=adapter.name + "-planted", run=off_by_one_ulp)
    assert runner.judge(case.replace(adapter=planted.name), planted, device_info,
                        unverifiable=unverifiable).verdict == "fail"
    # Liger rounds the activation before the multiply: judged as one rounding, it fails (the convention matters)
    once = dataclasses.replace(adapter, name=adapter.name + "-once",
                               conventions={**adapter.conventions, "rounding": "round_once"})
    verdicts = {runner.judge(_case(once, "bfloat16", seed).replace(adapter=once.name), once, device_info,
                             unverifiable=unverifiable).verdict for seed in range(4)}
    assert "fail" in verdicts


def test_unsupported_activation_is_rejected(device_info) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("liger_kernel")
    case = Case(op="activation", adapter="liger-swiglu", features={"activation": "gelu_and_mul", "dtype": "float32"},
                shapes={"T": 2, "N": 8}, dtypes={"x": "float32"})
    r = runner.judge(case, liger.SWIGLU, device_info)
    assert r.verdict == "unsupported" and "gelu_and_mul" in r.reason
