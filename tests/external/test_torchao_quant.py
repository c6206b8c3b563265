"""torchao's Triton quantizers (kernels/adapters/external/torchao_quant.py): registered without torchao, judged with
it (fp8 blockwise 1 x 128, mxfp8 floor/rceil), and the group_quant op's MX cells."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from harness import registry
from harness.core.case import Case
from harness.engine import runner
from harness.ops import group_quant as gq
from kernels.adapters.external import torchao_quant as tq
from tests.external._where import nominal, running

ADAPTERS = (tq.BLOCKWISE, tq.MX, tq.MX_TORCH, tq.NVFP4)
BLOCKWISE_CELL = {"quant_dtype": "fp8_e4m3fn", "unit": "group", "group_size": "128", "scale_rule": "float",
                  "scale_layout": "column_major", "input_dtype": "bfloat16"}
MX_CELL = {"quant_dtype": "mxfp8", "unit": "group", "group_size": "32", "scale_rule": "ocp_floor",
           "scale_layout": "row_major", "input_dtype": "bfloat16"}
NVFP4_CELL = {"quant_dtype": "nvfp4", "unit": "group", "group_size": "16", "scale_rule": "float",
              "scale_layout": "row_major", "input_dtype": "bfloat16"}


def _case(adapter: registry.Adapter, cell: dict[str, str], m: int = 9, k: int = 256, pattern: str = "random",
          exponent: int = 0, seed: int = 3, **over: str) -> Case:
    features = {**cell, **over}
    return Case(op="group_quant", adapter=adapter.name, features=features, shapes={"M": m, "K": k},
                dtypes={"x": features["input_dtype"]}, params={"pattern": pattern, "exponent": exponent}, seed=seed)


def test_registered_whether_or_not_torchao_is_installed(device_info) -> None:  # type: ignore[no-untyped-def]
    for a in ADAPTERS:
        assert registry.resolve(a.name) is a and a.library is tq.LIBRARY and a.library.written_for == "0.18.0"
    gone = dataclasses.replace(tq.LIBRARY, distribution="no-such-dist-xyz",
                               module="no_such_module_xyz")
    for a, cell in ((tq.BLOCKWISE, BLOCKWISE_CELL), (tq.MX, MX_CELL), (tq.MX_TORCH, MX_CELL), (tq.NVFP4, NVFP4_CELL)):
        missing = dataclasses.replace(a, name=a.name + "-missing", library=gone)
        r = runner.judge(_case(missing, cell), missing, nominal(missing, device_info))
        assert r.verdict == "not-installed" and "no-such-dist-xyz" in r.reason


# ---------------------------------------------------------------------------------------------- the op's MX cells


def test_mx_cells_and_their_inapplicable_combinations() -> None:
    ok = {**MX_CELL}
    assert gq.inapplicable(ok) is None
    assert gq.inapplicable({**ok, "quant_dtype": "mxfp4", "scale_rule": "ue8m0"}) is None
    for bad in ({"group_size": "128"}, {"scale_rule": "float"}, {"scale_layout": "packed_ue8m0"},
                {"unit": "token", "group_size": "-"}):
        assert gq.inapplicable({**ok, **bad}) is not None, bad
        assert gq.inapplicable({**NVFP4_CELL, **bad, "group_size": "32" if "group_size" in bad else "16",
                                "scale_rule": "ue8m0" if "scale_rule" in bad else "float"}) is not None, bad
    assert gq.inapplicable({**NVFP4_CELL, "scale_layout": "swizzle_128x4"}) is None
    assert gq.inapplicable({**BLOCKWISE_CELL, "scale_layout": "swizzle_128x4"}) is not None
    assert gq.inapplicable({**BLOCKWISE_CELL, "scale_rule": "ocp_floor"}) is not None  # the MX formats' rule only
    assert gq.inapplicable(BLOCKWISE_CELL) is None


@pytest.mark.parametrize("qd", ["mxfp8", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("layout", ["row_major", "swizzle_128x4"])
def test_reference_adapter_passes_the_new_cells(qd: str, layout: str, device_info) -> None:  # type: ignore[no-untyped-def]
    ref = registry.resolve("reference-group-quant")
    cell = NVFP4_CELL if qd == "nvfp4" else MX_CELL
    for rule in ("float",) if qd == "nvfp4" else ("ocp_floor", "ue8m0"):
        case = _case(ref, cell, quant_dtype=qd, scale_rule=rule, scale_layout=layout, pattern="special", seed=5)
        assert runner.judge(case, ref, device_info).verdict == "pass"
        outs = gq.outputs(case, {})
        assert outs["codes"].shape == ((9, 256) if qd == "mxfp8" else (9, 128))
        assert outs["scales"].dtype == torch.uint8
        g = 256 // int(cell["group_size"])
        assert outs["scales"].shape == ((128, -(-g // 4) * 4) if layout == "swizzle_128x4" else (9, g))


def test_nvfp4_global_scale_is_an_input_read_by_the_convention() -> None:
    x = torch.randn(4, 32)
    g = gq.nvfp4_global_scale(x)
    assert g.dtype == torch.float32 and float(g) == float((x.abs().amax().double() / 2688).float())
    assert float(gq.nvfp4_global_scale(torch.zeros(2, 16))) == 1.0
    # the oracle takes g as given: another g gives other block scales
    _, s1 = gq.oracle(x, NVFP4_CELL, {"global_scale": "dequant_side"}, global_scale=g)
    _, s2 = gq.oracle(x, NVFP4_CELL, {"global_scale": "dequant_side"}, global_scale=g * 2)
    assert not torch.equal(s1, s2)


def test_our_triton_quantizer_rejects_the_mx_cells(device_info) -> None:  # type: ignore[no-untyped-def]
    ours = registry.resolve("triton-group-quant")
    assert "mxfp8" not in ours.support["quant_dtype"] and "ocp_floor" not in ours.support["scale_rule"]
    r = runner.judge(_case(ours, MX_CELL), ours, device_info)
    assert r.verdict == "unsupported" and "mxfp8" in r.reason


# ------------------------------------------------------------------------------------------------- with torchao


def _perturbed(adapter: registry.Adapter, what: str) -> registry.Adapter:
    def run(case: Case, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> Any:
        out = dict(adapter.run(case, inputs, outputs))
        if what == "scales":
            s = out["scales"]
            out["scales"] = (torch.nextafter(s, torch.full_like(s, 1.0)) if s.dtype == torch.float32
                             else (s + 1).to(s.dtype))
        else:
            c = out["codes"].view(torch.uint8).clone()
            c.view(-1)[3] ^= 1
            out["codes"] = c.view(out["codes"].dtype)
        return out

    return dataclasses.replace(adapter, name=f"{adapter.name}-planted-{what}", run=run)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_blockwise_passes_and_planted_bugs_fail(dtype: str, device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torchao")
    a = tq.BLOCKWISE
    for pattern in ("random", "special"):
        case = _case(a, BLOCKWISE_CELL, m=17, k=384, pattern=pattern, input_dtype=dtype)
        assert runner.judge(case, a, device_info, unverifiable=unverifiable).verdict == "pass", pattern
    case = _case(a, BLOCKWISE_CELL, m=5, k=256, input_dtype=dtype)
    for what in ("scales", "codes"):
        bad = _perturbed(a, what)
        assert runner.judge(case.replace(adapter=bad.name), bad, device_info,
                            unverifiable=unverifiable).verdict == "fail", what


def test_blockwise_conventions_matter(device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torchao")
    # the default (amax / 448 stored, x divided by it) is off in the scales' last bit on many groups
    plain = dataclasses.replace(tq.BLOCKWISE, name="torchao-blockwise-as-divide",
                                conventions={**tq.BLOCKWISE.conventions, "scale_formula": "divide",
                                             "application": "divide"})
    case = _case(plain, BLOCKWISE_CELL, m=33, k=1024, input_dtype="float32")
    assert runner.judge(case, plain, device_info, unverifiable=unverifiable).verdict == "fail"


def test_mx_floor_passes_and_planted_bugs_fail(device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torchao")
    a = tq.MX
    device_info = running(a, device_info)
    case = _case(a, MX_CELL, m=17, k=320)
    assert runner.judge(case, a, device_info, unverifiable=unverifiable).verdict == "pass"
    for what in ("scales", "codes"):
        bad = _perturbed(a, what)
        assert runner.judge(case.replace(adapter=bad.name), bad, device_info,
                            unverifiable=unverifiable).verdict == "fail", what


def test_mx_finding_scale_code_zero_is_applied_as_one(device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    """torchao 0.18's Triton mxfp8 quantizer multiplies a group whose e8m0 scale code is 0 (2^-127: amax below
    2^-119) by 1.0 instead of 2^127, so its elements all quantize to zero where the OCP rule gives codes of up to
    448. A finding, kept as a failing verdict: the adapter declares the OCP rule torchao documents."""
    pytest.importorskip("torchao")
    device_info = running(tq.MX, device_info)
    case = _case(tq.MX, MX_CELL, m=2, k=64, exponent=-124)  # |x| ~ 2^-124: floor exponent -132, code 0
    r = runner.judge(case, tq.MX, device_info, unverifiable=unverifiable)
    assert r.verdict == "fail" and "codes" in r.reason, r.reason
    assert runner.judge(_case(tq.MX, MX_CELL, m=2, k=64, exponent=-100), tq.MX, device_info,
                        unverifiable=unverifiable).verdict == "pass"  # the same shape, scale codes above 0


@pytest.mark.parametrize("qd", ["mxfp8", "mxfp4"])
def test_mx_torch_passes_and_shares_the_finding(qd: str, device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    """torchao's eager to_mx (floor) passes ordinary groups; a group with scale code 0 is divided by 2^-126 (its fp32
    scale clamped to the smallest normal) while 2^-127 is stored: every element comes out half its OCP value."""
    pytest.importorskip("torchao")
    a = tq.MX_TORCH
    dev = a.device_for(device_info)
    for dtype in ("bfloat16", "float32"):
        case = _case(a, MX_CELL, m=17, k=320, quant_dtype=qd, input_dtype=dtype)
        assert runner.judge(case, a, dev, unverifiable=unverifiable).verdict == "pass", dtype
    bad = _perturbed(a, "codes")
    case = _case(bad, MX_CELL, m=17, k=320, quant_dtype=qd)
    assert runner.judge(case, bad, dev, unverifiable=unverifiable).verdict == "fail"
    tiny = _case(a, MX_CELL, m=2, k=64, quant_dtype=qd, exponent=-128)
    r = runner.judge(tiny, a, dev, unverifiable=unverifiable)
    assert r.verdict == "fail" and "codes" in r.reason, r.reason


@pytest.mark.parametrize("layout", ["row_major", "swizzle_128x4"])
def test_nvfp4_passes_and_planted_bugs_fail(layout: str, device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torchao")
    a = tq.NVFP4
    dev = a.device_for(device_info)
    for dtype in ("bfloat16", "float32"):
        for pattern in ("random", "special"):
            case = _case(a, NVFP4_CELL, m=17, k=320, pattern=pattern, input_dtype=dtype, scale_layout=layout)
            assert runner.judge(case, a, dev, unverifiable=unverifiable).verdict == "pass", (dtype, pattern)
    for what in ("scales", "codes"):
        bad = _perturbed(a, what)
        case = _case(bad, NVFP4_CELL, m=5, k=64, scale_layout=layout)
        assert runner.judge(case, bad, dev, unverifiable=unverifiable).verdict == "fail", what
    # torchao floors block scales at 2^-6 and scales x by (1 / g) / s_blk: without those conventions it fails
    plain = dataclasses.replace(a, name="torchao-nvfp4-plain", conventions={"global_scale": "dequant_side"})
    verdicts = {runner.judge(_case(plain, NVFP4_CELL, m=17, k=320, pattern="special", seed=s, scale_layout=layout),
                             plain, dev, unverifiable=unverifiable).verdict for s in range(3)}
    assert "fail" in verdicts


def test_nvfp4_finding_empty_input_raises(device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    """torchao 0.18's nvfp4_quantize cannot quantize an empty batch (M = 0, a valid call of the op): its
    reshape(M, -1, 16) raises. A finding, kept as an error verdict."""
    pytest.importorskip("torchao")
    r = runner.judge(_case(tq.NVFP4, NVFP4_CELL, m=0, k=32), tq.NVFP4, tq.NVFP4.device_for(device_info),
                     unverifiable=unverifiable)
    assert r.verdict == "error" and "reshape" in r.reason, r.reason
