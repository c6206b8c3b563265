"""kernels/group_quant.py beyond the generic adapter test: launcher errors, int64 offsets, the conventions the
adapter does not declare (int8 truncation, DeepGEMM's eps), the per-tensor two-level amax, tiling overrides, and the
op spec's 1-ulp judging of adapters that do not state their scale formula."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from harness.core.case import Case  # noqa: E402
from harness.core.device import detect  # noqa: E402
from harness.engine import runner  # noqa: E402
from harness.engine.interpreter import unverifiable_here  # noqa: E402
from harness.ops import group_quant as spec  # noqa: E402
from harness.registry import Adapter  # noqa: E402
from kernels import group_quant as gq  # noqa: E402
from reference.quant import QuantRecipe, quantize  # noqa: E402

unverifiable_here()  # under the interpreter (conftest chose it): its fp8 cast needs the fidelity fix

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _x(m: int, k: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn((m, k), generator=g) * 3).to(dtype).to(DEV)


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int32)


def _features(**kw: str) -> dict[str, str]:
    f = {"quant_dtype": "fp8_e4m3fn", "unit": "group", "group_size": "128", "scale_rule": "float",
         "scale_layout": "row_major", "input_dtype": "bfloat16"}
    f.update(kw)
    return f


# ---------------------------------------------------------------------------------------------- launcher errors


@pytest.mark.parametrize(("kwargs", "x_shape", "word"), [
    ({"group_size": 96}, (4, 256), "group_size"),  # does not divide K
    ({"group_size": 0}, (4, 256), "group_size"),
    ({"group_size": 16384}, (4, 16384), "group_size"),  # wider than one register tile
    ({"dtype": "fp8_e5m2"}, (4, 256), "dtype"),
    ({"unit": "block"}, (4, 256), "unit"),
    ({"scale_rule": "ocp_floor"}, (4, 256), "scale_rule"),
    ({"layout": "swizzle_128x4"}, (4, 256), "layout"),
    ({"layout": "packed_ue8m0"}, (4, 256), "packed_ue8m0"),  # float scales cannot be packed
    ({"layout": "packed_ue8m0", "scale_rule": "ue8m0", "dtype": "int8"}, (4, 256), "packed_ue8m0"),
    ({"unit": "token", "layout": "column_major"}, (4, 256), "layout"),
    ({"int8_rounding": "half_away"}, (4, 256), "int8_rounding"),
    ({"eps": -1.0}, (4, 256), "eps"),
    ({"block_m": 3}, (4, 256), "block_m"),
    ({"groups_per_program": 2, "layout": "packed_ue8m0", "scale_rule": "ue8m0"}, (4, 256), "groups_per_program"),
    ({}, (4, 0), "K"),
])
def test_launcher_rejects_bad_arguments_by_name(kwargs: dict, x_shape: tuple[int, int], word: str) -> None:
    with pytest.raises(ValueError, match=word):
        gq.group_quant(_x(*x_shape), **kwargs)


def test_launcher_rejects_bad_inputs_and_destinations_by_name() -> None:
    x = _x(4, 256)
    with pytest.raises(ValueError, match="x must be a 2-D"):
        gq.group_quant(x[None])
    with pytest.raises(ValueError, match="x must be a 2-D"):
        gq.group_quant(x.to(torch.float64))
    with pytest.raises(ValueError, match="out must be"):
        gq.group_quant(x, out=torch.empty((4, 256), dtype=torch.int8, device=DEV))
    with pytest.raises(ValueError, match="scales must be"):
        gq.group_quant(x, scales=torch.empty((4, 3), device=DEV))
    with pytest.raises(ValueError, match="scales must have strides"):  # row-major where column-major is asked
        gq.group_quant(x, layout="column_major", scales=torch.empty((4, 2), device=DEV))


# ------------------------------------------------------------------------------------------------- int64 offsets


@triton.jit
def _offsets_probe(out_ptr, row, stride):
    tl.store(out_ptr + tl.arange(0, 1), gq._row_offsets(tl.full([1], row, tl.int32), stride))


def test_row_offsets_are_int64() -> None:
    # the offset helper every kernel uses for rows: 70000 rows of 40000 elements lie past 2**31
    out = torch.zeros(1, dtype=torch.int64, device=DEV)
    _offsets_probe[(1,)](out, 70000, 40000)
    assert int(out.item()) == 70000 * 40000


# --------------------------------------------------------------------------------- conventions not declared


def _ties(m: int, k: int) -> torch.Tensor:
    """int8 ties: every group has amax 127 (scale exactly 1) and values n + 0.5."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-127, 127, (m, k), generator=g).float() + 0.5
    x[:, ::16] = 127.0
    return x.to(torch.bfloat16).to(DEV)


@pytest.mark.parametrize("rounding", ["half_even", "truncate"])
def test_int8_rounding_rules_match_the_oracle_bitwise(rounding: str) -> None:
    x = _ties(9, 256)
    codes, scales = gq.group_quant(x, dtype="int8", group_size=16, int8_rounding=rounding)
    want = quantize(x.cpu(), QuantRecipe(dtype="int8", group_size=16, int8_rounding=rounding))
    assert torch.equal(codes.cpu(), want.codes)
    assert torch.equal(_bits(scales), _bits(want.scales))
    other = quantize(x.cpu(), QuantRecipe(dtype="int8", group_size=16,
                                          int8_rounding="truncate" if rounding == "half_even" else "half_even"))
    assert not torch.equal(codes.cpu(), other.codes)  # the input tells the two rules apart


@pytest.mark.parametrize("scale_rule", ["float", "ue8m0"])
def test_deepgemm_eps_matches_the_oracle(scale_rule: str) -> None:
    # DeepGEMM's helpers clamp amax at 1e-4: tiny groups get that scale, not amax / qmax
    x = _x(5, 256) * torch.tensor([1e-6, 1.0], device=DEV).repeat_interleave(128)
    codes, scales = gq.group_quant(x, eps=1e-4, scale_rule=scale_rule)
    want = quantize(x.cpu(), QuantRecipe(eps=1e-4, scale_rule=scale_rule))
    assert torch.equal(_bits(codes), want.codes)
    assert torch.equal(_bits(scales), _bits(want.scales))
    assert not torch.equal(_bits(scales), _bits(quantize(x.cpu(), QuantRecipe(scale_rule=scale_rule)).scales))


# ------------------------------------------------------------------------------------------------ per tensor


def test_per_tensor_amax_reduces_every_partial_deterministically() -> None:
    x = _x(301, 96, torch.float32)
    x[297, 5] = 1000.0  # the amax sits in one partial of many (4-row programs: the 75th of 76)
    runs = [gq.group_quant(x, unit="tensor") for _ in range(2)]
    want = quantize(x.cpu(), QuantRecipe(unit="tensor"))
    for codes, scales in runs:
        assert torch.equal(_bits(codes), want.codes)
        assert torch.equal(_bits(scales), _bits(want.scales.reshape(1)))
    assert torch.equal(_bits(runs[0][0]), _bits(runs[1][0]))


def test_per_tensor_scale_of_an_empty_batch_is_the_scale_of_zero() -> None:
    codes, scales = gq.group_quant(_x(0, 64), unit="tensor", scale_rule="ue8m0")
    assert codes.shape == (0, 64)
    want = quantize(torch.zeros(1, 64), QuantRecipe(unit="tensor", scale_rule="ue8m0")).scales.reshape(1)
    assert torch.equal(_bits(scales), _bits(want))


# ------------------------------------------------------------------------------------------------ tiling


@pytest.mark.parametrize(("layout", "rule"), [("row_major", "float"), ("column_major_tma", "float"),
                                              ("packed_ue8m0", "ue8m0")])
@pytest.mark.parametrize(("block_m", "groups"), [(1, 4), (8, 8), (2, 16)])
def test_tiling_overrides_do_not_change_results(layout: str, rule: str, block_m: int, groups: int) -> None:
    x = _x(13, 5 * 32)  # 5 groups: the last packed word holds one group and three zero bytes
    f = _features(group_size="32", scale_layout=layout, scale_rule=rule)
    want_codes, want_scales = spec.oracle(x, f)
    codes, scales = gq.group_quant(x, group_size=32, layout=layout, scale_rule=rule, block_m=block_m,
                                   groups_per_program=groups)
    assert torch.equal(_bits(codes), _bits(want_codes))
    assert torch.equal(_bits(scales), _bits(want_scales))


@pytest.mark.parametrize(("group", "groups"), [(3, 7), (48, 5), (96, 2), (1000, 3)])
def test_group_sizes_that_are_not_powers_of_two_match_the_oracle(group: int, groups: int) -> None:
    # the op's axis declares powers of two only; the launcher takes any size dividing K (a runtime value in the
    # kernel), and every group past the first starts at a multiple of it
    x = _x(7, group * groups, seed=group)
    codes, scales = gq.group_quant(x, group_size=group)
    want = quantize(x.cpu(), QuantRecipe(group_size=group))
    assert torch.equal(_bits(codes), want.codes)
    assert torch.equal(_bits(scales), _bits(want.scales))


def test_non_unit_k_stride_and_wide_token_rows() -> None:
    base = _x(6, 2 * 9000, torch.float16)
    x = base[:, ::2]  # stride along K is 2
    for unit in ("token", "tensor"):
        codes, scales = gq.group_quant(x, unit=unit, dtype="int8")
        want_codes, want_scales = spec.oracle(x, _features(unit=unit, group_size="-", quant_dtype="int8"))
        assert torch.equal(codes.cpu(), want_codes)
        assert torch.equal(_bits(scales), _bits(want_scales))


# ---------------------------------------------------------------------------- the spec's 1-ulp judging


def _rcp_formula_adapter(conventions: dict) -> Adapter:
    """The oracle computing scales as amax * (1/qmax): one ulp off `amax / qmax` for many inputs."""

    def run(case: Case, inputs: dict, outputs: dict) -> None:
        codes, scales = spec.oracle(inputs["x"], case.features, {"scale_formula": "multiply_reciprocal"})
        outputs["codes"].copy_(codes)
        outputs["scales"].copy_(scales)

    return Adapter(name="rcp-formula", op="group_quant", source="tests", run=run,
                   support={a.name: a.values for a in spec.AXES}, conventions=conventions)


@pytest.mark.parametrize("layout", ["row_major", "column_major_tma"])
def test_unstated_scale_formula_is_judged_within_one_ulp(layout: str) -> None:
    case = Case(op="group_quant", adapter="rcp-formula", features=_features(group_size="16", scale_layout=layout),
                shapes={"M": 33, "K": 160}, dtypes={"x": "bfloat16"}, seed=5, params={"pattern": "random"})
    dev = detect("cpu")
    stated = runner.judge(case, _rcp_formula_adapter({"scale_formula": "divide"}), dev)
    assert stated.verdict == "fail" and "scales" in stated.reason  # exact when the formula is stated (and wrong)
    unstated = runner.judge(case, _rcp_formula_adapter({}), dev)
    assert unstated.verdict == "pass", unstated.reason
    honest = runner.judge(case, _rcp_formula_adapter({"scale_formula": "multiply_reciprocal"}), dev)
    assert honest.verdict == "pass", honest.reason


def test_one_ulp_judging_still_catches_wrong_scales_and_codes() -> None:
    def run(case: Case, inputs: dict, outputs: dict) -> None:
        codes, scales = spec.oracle(inputs["x"], case.features)
        outputs["codes"].copy_(codes)
        outputs["scales"].copy_(scales * 1.001)  # a few hundred ulps off; codes from the oracle's own scales

    bad = Adapter(name="scaled", op="group_quant", source="tests", run=run,
                  support={a.name: a.values for a in spec.AXES}, conventions={})
    case = Case(op="group_quant", adapter="scaled", features=_features(group_size="32"),
                shapes={"M": 7, "K": 96}, dtypes={"x": "bfloat16"}, seed=2, params={"pattern": "random"})
    r = runner.judge(case, bad, detect("cpu"))
    assert r.verdict == "fail"
    assert "outside 1 ulp" in r.reason and "codes:" in r.reason
