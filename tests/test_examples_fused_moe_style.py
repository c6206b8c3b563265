"""The second worked example, examples/fused_moe_style: one adapter for a fused-experts kernel computed as vLLM's
Triton path computes (TF32 for fp32, moe_sum's reduce), one for a Triton quantizer with approximate division.

Both pass the generic tests in the interpreter; the support rule's exclusion (bias with weight on input) is reported
unsupported, never failing; the case-dependent conventions matter (planted bugs in them fail, on the cases where
they are wrong only); a quantizer whose scales are off fails while the honest approximate-division adapter passes.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

from harness import registry
from harness.core.case import Case
from harness.engine import runner
from harness.engine import strategies as hs
from harness.engine.profiles import PROFILES
from harness.plugin import generic
from harness.store.results import ResultStore, load_results
from harness.sweep import plan

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "fused_moe_style"
MODULE = "fused_moe_style.harness_adapters"
SPECS = {"style-fused-moe": f"{MODULE}:STYLE_FUSED_MOE", "style-group-quant-div": f"{MODULE}:STYLE_GROUP_QUANT_DIV"}
_CELL = {"format": "standard", "quant_type": "none", "quant_format": "-", "activation": "silu",
         "apply_weight_on_input": "N", "expert_map": "N", "dtype": "bfloat16", "bias": "N"}
_K3 = {"M": 33, "E": 8, "k": 3, "K": 64, "N": 32}


@pytest.fixture
def style(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(EXAMPLE))  # as `pip install -e examples/fused_moe_style` would
    return importlib.import_module(MODULE)


def _judge(adapter: registry.Adapter, device_info, unverifiable, features: dict, shapes: dict,  # type: ignore[no-untyped-def]
           seed: int = 0) -> runner.Result:
    f = {**_CELL, **features}
    case = Case(op="experts", adapter=adapter.name, features=f, seed=seed, shapes=shapes, dtypes={"x": f["dtype"]})
    return runner.judge(case, adapter, device_info, unverifiable=unverifiable)


@pytest.mark.parametrize("name", list(SPECS))
def test_generic_tests_pass_on_both_adapters(name: str, style, device_info, unverifiable, tmp_path,  # type: ignore[no-untyped-def]
                                             monkeypatch, request) -> None:
    """The plugin's generic tests. In the interpreter, the experts adapter's fp8 G128 cells are judged on a pinned
    case instead of drawn ones: the strategies draw one to three K and N groups of 128, and an fp8 case at K = N = 384
    takes 20 s to 2 min in the interpreter (every cell, fp8 included, is drawn on a GPU: same test, same adapter)."""
    adapter = registry.resolve(SPECS[name])
    assert adapter.name == name
    drawn = name
    if name == "style-fused-moe" and device_info.generation == "interp":
        unquantized = dataclasses.replace(adapter, name=f"{name}-unquantized",
                                          support={**adapter.support, "quant_type": ("none",), "quant_format": ("-",)})
        monkeypatch.setitem(registry._REGISTRY, unquantized.name, unquantized)
        drawn = unquantized.name
    with ResultStore(tmp_path, run_id="style") as store:
        generic.test_declared_cases_pass(drawn, (0, 1), device_info, store, unverifiable, PROFILES["ci"], request)
        generic.test_undeclared_cells_rejected_cleanly(name, device_info, store, unverifiable, request)
        if drawn != name:
            for k in (3, 1):  # moe_sum's sequential rule, and the fp32 sum
                fp8 = {"quant_type": "fp8_w8a8", "quant_format": "G128", "dtype": "float16", "expert_map": "Y"}
                case = Case(op="experts", adapter=name, features={**_CELL, **fp8}, seed=k, routing="skewed",
                            shapes={"M": 9, "E": 6, "k": k, "K": 128, "N": 128}, dtypes={"x": "float16"},
                            params={"local_experts": 4, "act_quant": dict(adapter.conventions["act_quant"])})
                store.append(runner.judge(case, adapter, device_info, unverifiable=unverifiable))
    verdicts = Counter(r.verdict for r in load_results([tmp_path]))
    assert set(verdicts) <= {"pass", "unsupported", "not-verifiable"} and verdicts["pass"] >= 4, verdicts


def test_bias_with_weight_on_input_is_unsupported_not_failing(style, device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    a = style.STYLE_FUSED_MOE
    both = {**_CELL, "bias": "Y", "apply_weight_on_input": "Y"}
    declared, why = a.declares(both)
    assert not declared and "bias" in why
    assert a.declares({**_CELL, "bias": "Y"})[0] and a.declares({**_CELL, "apply_weight_on_input": "Y"})[0]
    assert not [c for c in hs.declared_cells(a, device_info) if c["bias"] == c["apply_weight_on_input"] == "Y"]
    # the full matrix's cases of the cells the rule alone excludes: judged as undeclared. This kernel computes them
    # right, so they are "works but not claimed" (declared False); one that scaled the bias by the router weight,
    # as vLLM's does, is a failing undeclared cell: a finding, not hidden by the exclusion
    excluded = [c for c in plan(a, "full").cases if c.features["bias"] == c.features["apply_weight_on_input"] == "Y"
                and a.declares({**c.features, "bias": "N"})[0]]
    picked: dict[tuple[str, str], Case] = {}
    for c in excluded:
        picked.setdefault((c.features["dtype"], c.features["quant_type"]), c)
    assert set(picked) == {("bfloat16", "none"), ("float16", "none"), ("float32", "none"), ("bfloat16", "fp8_w8a8"),
                           ("float16", "fp8_w8a8")}
    case = picked[("bfloat16", "none")]
    r = runner.judge(case, a, device_info, unverifiable=unverifiable)
    assert r.verdict == "pass" and not r.declared, (r.verdict, r.reason)

    def bias_dropped(case, inputs, outputs) -> None:  # type: ignore[no-untyped-def]
        style.run_experts(case, {**inputs, "w13_bias": inputs["w13_bias"] * 0}, outputs)

    vllm_like = dataclasses.replace(a, name="style-fused-moe-bias-dropped", run=bias_dropped)
    r = runner.judge(dataclasses.replace(case, adapter=vllm_like.name), vllm_like, device_info,
                     unverifiable=unverifiable)
    assert r.verdict == "fail" and not r.declared, (r.verdict, r.reason)
    # each feature alone is declared and passes
    for features in ({"bias": "Y", "dtype": "float16"}, {"apply_weight_on_input": "Y", "dtype": "float32"}):
        r = _judge(a, device_info, unverifiable, features, {"M": 9, "E": 6, "k": 1, "K": 40, "N": 24})
        assert r.verdict == "pass", (features, r.reason)


def test_case_dependent_conventions_matter(style, device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    """Planted bugs in conventions_for: each fails where its declaration is wrong, and only there."""
    honest = style.STYLE_FUSED_MOE

    def without(key: str):  # type: ignore[no-untyped-def]
        return lambda case, device: {k: v for k, v in style.experts_conventions_for(case, device).items() if k != key}

    declares_ieee = dataclasses.replace(honest, name="style-fused-moe-declares-ieee",
                                        conventions_for=without("matmul_precision"))
    no_moe_sum_rule = dataclasses.replace(honest, name="style-fused-moe-no-moe-sum-rule",
                                          conventions_for=without("accumulation"))
    # the kernel side of the same bug: an fp32 sum run where moe_sum's sequential rule is declared (caught by the
    # step-by-step judgement of sequential_out_dtype)
    fp32_reduce = dataclasses.replace(honest, name="style-fused-moe-fp32-reduce",
                                      run=lambda case, i, o: style.run_experts(case, i, o, reduce="fp32"))
    fp32 = {"dtype": "float32"}
    k8 = {**_K3, "k": 8}
    expected = [
        (honest, fp32, _K3, "pass"), (declares_ieee, fp32, _K3, "fail"),  # TF32 products judged as IEEE
        (declares_ieee, {}, _K3, "pass"),  # bf16 products are exact: "ieee" is right there
        (honest, {}, _K3, "pass"), (no_moe_sum_rule, {}, _K3, "fail"),  # k = 3: partial sums rounded to bf16
        (no_moe_sum_rule, {}, k8, "pass"),  # k = 8: moe_sum is the fp32 sum, so rounded_slots is right
        (fp32_reduce, {}, _K3, "fail"), (fp32_reduce, {}, k8, "pass"),
    ]
    for adapter, features, shapes, verdict in expected:
        r = _judge(adapter, device_info, unverifiable, features, shapes)
        assert r.verdict == verdict, (adapter.name, features, shapes, r.verdict, r.reason)
        if verdict == "fail":
            assert "outside the error bound" in r.reason, r.reason


def test_quantizer_scale_bug_fails_and_the_honest_adapter_passes(style, device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    honest = style.STYLE_GROUP_QUANT_DIV
    assert honest.conventions["division"] == "approximate"

    def run_wrong_scale(case, inputs, outputs) -> None:  # type: ignore[no-untyped-def]
        style.run_group_quant(case, inputs, outputs)
        outputs["scales"].mul_(1 + 2**-10)

    wrong = dataclasses.replace(honest, name="style-group-quant-div-wrong-scale", run=run_wrong_scale)
    for cell, m, k in ((("fp8_e4m3fn", "group", "128", "column_major_tma", "bfloat16"), 7, 384),
                       (("int8", "token", "-", "row_major", "float32"), 5, 96)):
        features = dict(zip(("quant_dtype", "unit", "group_size", "scale_layout", "input_dtype"), cell),
                        scale_rule="float")
        for adapter, verdict in ((honest, "pass"), (wrong, "fail")):
            case = Case(op="group_quant", adapter=adapter.name, features=features, seed=1, shapes={"M": m, "K": k},
                        dtypes={"x": features["input_dtype"]})
            r = runner.judge(case, adapter, device_info, unverifiable=unverifiable)
            assert r.verdict == verdict, (adapter.name, features, r.verdict, r.reason)
            if verdict == "fail":
                assert "scales" in r.reason, r.reason


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLE), str(ROOT)])}
    for key in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_TESTRUNUID", "PYTEST_XDIST_WORKER_COUNT"):
        env.pop(key, None)  # the inner runs are their own sessions, not our workers
    return env


def test_the_quantizer_matrix_through_the_cli(device_info, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`python -m harness matrix --adapter module:object`: every declared cell passes, no bug is listed."""
    out = tmp_path / "matrix.md"
    done = subprocess.run([sys.executable, "-m", "harness", "matrix", "--device", device_info.device, "--profile",
                           "quick", "--adapter", SPECS["style-group-quant-div"], "--results-dir", str(tmp_path),
                           "--out", str(out), "--only-this-run", "--jobs", "2"],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    rendered = json.loads(out.with_suffix(".json").read_text())
    assert not any(rendered["declared_vs_verified"][k] for k in ("claimed_but_failing", "undeclared_not_rejected"))
    counts = rendered["generations"][0]["counts"]
    assert set(counts) <= {"pass", "unsupported"} and counts["pass"] > 0, counts


def test_the_example_runs_its_own_unit_tests(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """From its own folder, not installed: `pythonpath` finds the package, ini `moe_adapters` selects both adapters
    (their generic tests are collected, deselected here: the tests above run them)."""
    from harness.plugin import load_args

    plugin = load_args()
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin, "-v",
                           "-m", "not moe_generic", f"--moe-results-dir={tmp_path / 'res'}"],
                          cwd=EXAMPLE, env=_env(), capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "3 passed, 5 deselected" in out, out[-3000:]  # the generic test items


def test_entry_points_of_the_example_resolve(style) -> None:  # type: ignore[no-untyped-def]
    if sys.version_info < (3, 11):
        pytest.skip("tomllib needs Python 3.11")
    import tomllib

    pyproject = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"][registry.ENTRY_POINT_GROUP] == SPECS
    for name, target in SPECS.items():
        assert registry.resolve(target).name == name
    assert pyproject["tool"]["pytest"]["ini_options"]["moe_adapters"] == list(SPECS.values())


def test_the_readme_commands_parse() -> None:
    from harness.cli import build_parser
    from tests.test_readme import commands, kind, steps

    found = [s for c in commands(EXAMPLE / "README.md") for s in steps(c)]
    assert {kind(s) for s in found} == {"install", "pytest", "harness"}
    for s in found:
        if kind(s) == "install":
            assert all((ROOT / s.cwd / t / "pyproject.toml").exists() for t in s.argv[2:] if not t.startswith("-"))
        elif kind(s) == "harness":
            build_parser().parse_args(s.argv[3:])
        else:
            assert (ROOT / s.cwd / "pyproject.toml").exists(), s
