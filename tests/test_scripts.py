"""The shell scripts parse, and scripts/gpu_run.sh does what its --help says: every option is listed and
parsed, and a --dry-run prints each command the run would make and where its output would go (no GPU needed)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_run.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def gpu_run(*args: str, out: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OUT": str(out)}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def steps(stdout: str) -> dict[str, list[str]]:
    """The dry run's `[name] command > log [2> log]` lines: name -> the command's words, then its outputs (each
    `>` or `2>` with its file)."""
    return {m.group(1): shlex.split(m.group(2)) for m in re.finditer(r"^\[([^\]]+)\] (.*)$", stdout, re.M)}


def command(words: list[str]) -> list[str]:
    """The words before the output redirections."""
    return words[:words.index(">")] if ">" in words else words


def options_in_script() -> list[str]:
    """Every option the script's parser accepts (the valued ones it lists, and its flags)."""
    text = SCRIPT.read_text(encoding="utf-8")
    valued = re.search(r'VALUED="([^"]*)"', text)
    assert valued, "gpu_run.sh lists its valued options in VALUED"
    return [*valued.group(1).split(), "--dry-run", "--no-archive", "--help"]


@pytest.mark.parametrize("script", sorted((ROOT / "scripts").glob("*.sh")), ids=lambda p: p.name)
def test_every_shell_script_parses(script: Path) -> None:
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_help_lists_every_option(tmp_path: Path) -> None:
    proc = gpu_run("--help", out=tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    missing = [o for o in options_in_script() if not re.search(rf"(^|\s){re.escape(o)}(\s|$)", proc.stdout)]
    assert not missing, f"options the parser takes but --help does not list: {missing}"


def test_a_default_run_is_named_by_date_commit_and_sections(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = gpu_run("--dry-run", "--commit", "0123456789abcdef+dirty", "--generation", "sm90", out=out)
    assert proc.returncode == 0, proc.stderr
    run_id = re.search(r"^run (\S+):", proc.stdout, re.M)
    assert run_id and re.fullmatch(r"\d{4}-\d\d-\d\d-0123456-pytest-matrix-bench", run_id.group(1)), proc.stdout
    run = out / "results" / "sm90" / run_id.group(1)
    got = steps(proc.stdout)
    inherited = f":{os.environ['PYTHONPATH']}" if os.environ.get("PYTHONPATH") else ""
    assert got["env"] == [f"PYTHONPATH={ROOT}{inherited}", "MOE_HARNESS_COMMIT=0123456789abcdef+dirty"]
    assert sorted(got) == sorted(["env", "device", "pytest", "matrix", "archive"] + [
        f"bench {op}" for op in ("routing", "group_quant", "activation", "act_quant", "align", "reduce", "experts")])
    assert got["pytest"][:3] == ["timeout", "300", "env"] and "HYPOTHESIS_PROFILE=gpu" in got["pytest"]
    # one word: an uninstalled checkout's pytest takes a separate existing folder for a test path, misses its conftest
    assert f"--moe-results-dir={run / 'pytest'}" in got["pytest"]
    assert got["matrix"][got["matrix"].index("--results-dir") + 1] == str(run / "matrix-quick")
    bench = out / "results" / "sm90" / "bench" / run_id.group(1)
    assert got["bench experts"][-4:] == [">", str(bench / "bench_experts.md"), "2>", str(bench / "bench_experts.log")]
    assert not out.exists(), "a dry run wrote files"


def test_every_option_reaches_its_command(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = gpu_run(
        "--dry-run", "--sections", "pytest,matrix external bench,probe", "--generation", "sm90", "--run-id", "R",
        "--results", str(tmp_path / "res"), "--no-archive", "--profile", "thorough", "--workers", "3",
        "--tests", "tests/kernels", "--tests", "harness/plugin/generic.py", "--pytest-args", "-k 'fp8 and not w4'",
        "--adapter", "triton-experts", "--adapter", "pkg.mod:OBJ", "--matrix-profile", "full",
        "--matrix-args", "--shard 1/2", "--bench-op", "routing", "--bench", "--op experts --shape deepseek-v3 --m 64",
        "--against-vllm", "/w/vllm_fm", "--probe", "--shape mixtral-tp2 --tiles 64,128,128,4,3",
        "--wheels", "/w", "--replay", "c.json", "--pythonpath", "examples/fused_moe_style",
        "--pytest-timeout", "11", "--matrix-timeout", "12", "--external-timeout", "13", "--bench-timeout", "14",
        "--probe-timeout", "15", "--case-timeout", "16", out=out)
    assert proc.returncode == 0, proc.stderr
    run, bench = tmp_path / "res" / "sm90" / "R", tmp_path / "res" / "sm90" / "bench" / "R"
    got = steps(proc.stdout)
    assert "archive" not in got
    pytest_cmd = got["pytest"]
    assert pytest_cmd[:2] == ["timeout", "11"] and "HYPOTHESIS_PROFILE=thorough" in pytest_cmd
    assert pytest_cmd[pytest_cmd.index("-n") + 1] == "3"
    assert pytest_cmd[pytest_cmd.index("-k") + 1] == "fp8 and not w4"  # quoted words stay one argument
    assert ["--moe-adapter", "triton-experts", "--moe-adapter", "pkg.mod:OBJ"] == \
        [w for i, w in enumerate(pytest_cmd) if "--moe-adapter" in pytest_cmd[i - 1:i + 1]]
    assert "tests/kernels" in pytest_cmd and "harness/plugin/generic.py" in pytest_cmd
    matrix = got["matrix"]
    assert matrix[:2] == ["timeout", "12"] and matrix[matrix.index("--profile") + 1] == "full"
    assert matrix[matrix.index("--case-timeout") + 1] == "16" and matrix[matrix.index("--shard") + 1] == "1/2"
    assert matrix[matrix.index("--results-dir") + 1] == str(run / "matrix-full")
    assert ["--adapter", "triton-experts"] == matrix[matrix.index("--adapter"):matrix.index("--adapter") + 2]
    assert got["external tests"][:2] == ["timeout", "13"] and "tests/external" in got["external tests"]
    assert got["external matrix"][got["external matrix"].index("--adapter") + 1] == "external"
    assert any(w.startswith("/w/") for w in got["install"])
    assert got["bench routing"][:2] == ["timeout", "14"] and "--against-vllm" not in got["bench routing"]
    assert got["bench 1"][got["bench 1"].index("--against-vllm") + 1] == "/w/vllm_fm"  # an experts bench
    assert str(bench / "bench_1.md") in got["bench 1"]
    probe = got["probe 1"]
    assert probe[:2] == ["timeout", "15"] and probe[probe.index("--out") + 1] == str(bench / "probe_1.jsonl")
    assert probe[probe.index("--tiles") + 1] == "64,128,128,4,3"
    assert command(got["replay 1 on cuda"])[-3:] == ["c.json", "--device", "cuda"]
    assert command(got["replay 1 on cpu"])[-3:] == ["c.json", "--device", "cpu"]
    pythonpath = got["env"][0].removeprefix("PYTHONPATH=").split(":")
    assert pythonpath[:3] == [str(ROOT), "examples/fused_moe_style", pythonpath[2]] and "site" in pythonpath[2]
    assert not out.exists() and not (tmp_path / "res").exists(), "a dry run wrote files"


def test_a_label_names_the_run(tmp_path: Path) -> None:
    proc = gpu_run("--dry-run", "--sections", "bench", "--label", "nightly", "--commit", "fedcba9876",
                       "--generation", "sm100", out=tmp_path / "out")
    assert re.search(r"^run \d{4}-\d\d-\d\d-fedcba9-nightly: sections bench;", proc.stdout, re.M), proc.stdout
    assert "[pytest]" not in proc.stdout and "[matrix]" not in proc.stdout


@pytest.mark.parametrize("args, says", [
    (["--bogus"], "unknown option --bogus"),
    (["--workers"], "--workers needs a value"),
    (["--workers", "x"], "'x' is not a whole number"),
    (["--bench-timeout", "1m"], "'1m' is not a whole number"),
    (["--sections", "pytest,tune"], "unknown section 'tune'"),
    (["--matrix-profile", "huge"], "--matrix-profile is quick or full"),
])
def test_a_bad_option_is_refused_before_anything_runs(tmp_path: Path, args: list[str], says: str) -> None:
    proc = gpu_run("--dry-run", *args, out=tmp_path / "out")
    assert proc.returncode == 2 and says in proc.stderr, (proc.returncode, proc.stderr)
    assert not proc.stdout


@pytest.mark.skipif(shutil.which("c++") is None or shutil.which("readelf") is None,
                    reason="needs a C++ compiler (c++) and readelf")
def test_deepgemm_build_refuses_a_compiler_that_links_the_cpp_runtime_statically(tmp_path: Path) -> None:
    # a wrapper like the one that made DeepGEMM's std::regex segfault beside torch: -static-libstdc++ on every link
    static = tmp_path / "static-cxx"
    static.write_text('#!/usr/bin/env bash\nexec c++ -static-libstdc++ "$@"\n', encoding="utf-8")
    static.chmod(0o755)
    script = ROOT / "scripts" / "deepgemm.sh"
    run = [*("bash", str(script), "--compiler", "--dir", str(tmp_path / "dg"))]
    picked = subprocess.run(run, env={**os.environ, "CXX": str(static)}, capture_output=True, text=True, timeout=60)
    assert picked.returncode == 0, picked.stderr
    assert picked.stdout.strip() != str(static) and "links libstdc++ statically" in picked.stderr
    kept = subprocess.run(run, env={**os.environ, "CXX": "c++"}, capture_output=True, text=True, timeout=60)
    assert kept.returncode == 0 and kept.stdout.strip() == "c++" and not kept.stderr, kept.stderr


@pytest.mark.parametrize("name", ["deepgemm.sh", "flashinfer.sh"])
def test_library_build_scripts_print_their_whole_header_as_help(name: str) -> None:
    script = ROOT / "scripts" / name
    header = script.read_text(encoding="utf-8").splitlines()[1:]
    header = header[:next(i for i, line in enumerate(header) if not line.startswith("#"))]
    done = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.splitlines() == header, done.stdout


@pytest.mark.parametrize("args, says", [
    (["--build", "--only", "fp4"], "--only takes a comma-separated list of bf16, fp8-block; not 'fp4'"),
    (["--build", "--only", "bf16,nope"], "('nope' unknown)"),
    (["--build", "--only", ""], "--only takes a comma-separated list of bf16, fp8-block"),
    (["--build", "--only"], "--only needs a value"),
    (["--gather", "--only", "bf16"], "--only goes with --build"),
])
def test_flashinfer_build_refuses_a_bad_only_before_anything_runs(tmp_path: Path, args: list[str], says: str) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "flashinfer.sh"), "--dir", str(tmp_path / "fi"), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and says in done.stderr, (done.returncode, done.stderr)
    assert not done.stdout and not (tmp_path / "fi").exists()
