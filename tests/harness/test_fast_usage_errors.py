"""A mistyped command line is answered at once: one line naming the argument, exit 2, before torch loads.

Each bad command line runs as `python -X importtime -m harness ...` in a subprocess: the test asserts its exit
status, that stderr holds one `error:` line naming the argument, that it took well under the LIMIT_S seconds a
torch import and a sweep's start-up cost on a busy machine, and, from the import-time trace, that torch was never
imported. The names the checks accept come from the code that owns them; the last tests assert they agree.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import cli
from harness.commands import usage
from harness.core import device

ROOT = Path(__file__).resolve().parents[2]
CASE = "examples/my_kernel/cases/wrong-gate-order.json"
RESULTS = "tests/harness/fixtures/matrix_results.jsonl"
#: seconds a usage error may take (it takes a fraction of one; a torch import alone takes about 2 on an idle core)
LIMIT_S = 5.0
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}  # the same answer on a machine with a GPU

#: (command line, words the one line holds, exit status, environment); {tmp}: a folder, {file}: a text file there
BAD: list[tuple[str, str, int, dict[str, str]]] = [
    ("matrix --device cuda", "--device cuda: no CUDA device here", 2, NO_GPU),
    ("matrix --device tpu", "--device must be auto, cpu, cuda or cuda:N, got 'tpu'", 2, {}),
    ("matrix --shard a/b", "--shard must be K/N", 2, {}),
    ("matrix --shard 5/4", "--shard must be K/N with 1 <= K <= N", 2, {}),
    ("matrix --resume no-such-id --results-dir {tmp}", "--resume 'no-such-id': no results", 2, {}),
    ("matrix --from {tmp}/missing", "--from: ", 2, {}),
    ("matrix --adapter mod:", "--adapter 'mod:' is not module:object", 2, {}),
    ("matrix --adapter pkg.mod:OBJ#", "--adapter 'pkg.mod:OBJ#' is not module:object", 2, {}),
    ("matrix --results-dir {file}", "--results-dir: ", 2, {}),
    ("matrix --out {file}/m.md", "--out: ", 2, {}),
    ("replay {tmp}/missing.json", "CASE: cannot read case file", 2, {}),
    ("replay {file}", "CASE: cannot read case file", 2, {}),
    ("replay {tmp}", "CASE: cannot read case file", 2, {}),
    ("replay {case} --adapter :x", "--adapter ':x' is not module:object", 2, {}),
    ("replay {case} --device gpu", "--device must be", 2, {}),
    ("replay {case} --device cuda", "--device cuda: no CUDA device here", 125, NO_GPU),  # replay's "not here"
    ("explain {tmp}/missing.json", "CASE: cannot read case file", 2, {}),
    ("explain {case} --out {file}/x.pt", "--out: ", 2, {}),
    ("diff {tmp}/missing {results}", "A: ", 2, {}),
    ("diff {results} {results} --cases-dir {file}", "--cases-dir: ", 2, {}),
    ("bisect {case} --good HEAD --bad HEAD --repo {tmp}/missing", "--repo: ", 2, {}),
    ("bisect {case} --good HEAD --bad HEAD --device cuda:1", "--device cuda:1: no CUDA device here", 2, NO_GPU),
    ("differential", "needs a CUDA GPU", 2, NO_GPU),
    ("differential --out {file}", "--out: ", 2, {}),
    ("conventions --op x", "--op must be one of routing, ", 2, {}),
    ("conventions --out {file}/c.md", "--out: ", 2, {}),
    ("bench --op nope", "--op must be one of reference-experts, ", 2, {}),
    ("bench --op routing --shape nope", "--shape must be among deepseek-v3, ", 2, {}),
    ("bench --op routing --quant none", "--quant: for --op experts only", 2, {}),
    ("bench --op experts --quant bogus", "--quant: unknown scheme(s) ['bogus']; known: all, none, ", 2, {}),
    ("bench --op experts --against-vllm {tmp}/missing", "--against-vllm: ", 2, {}),
    ("bench --op experts --m 0", "--m must be token counts >= 1", 2, {}),
    ("bench --op routing --device cuda", "--device cuda: no CUDA device here", 2, NO_GPU),
    ("golden nope", "NAME must be among the stored golden cases (", 2, {}),
]

_TORCH = re.compile(r"^import time:.*\|\s*torch$")


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("usage")
    (tmp / "notes.txt").write_text("not JSON, not a folder\n")
    return {"tmp": str(tmp), "file": str(tmp / "notes.txt"), "case": CASE, "results": RESULTS}


@pytest.mark.parametrize(("line", "words", "code", "env"), BAD, ids=[b[0].replace(" ", "_") for b in BAD])
def test_a_bad_command_line_is_one_line_at_once_without_torch(line: str, words: str, code: int, env: dict[str, str],
                                                               places: dict[str, str]) -> None:
    argv = [w.format(**places) for w in line.split()]
    environ = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "harness", *argv], cwd=ROOT, env=environ,
                       capture_output=True, text=True, timeout=600)
    took = time.monotonic() - t0
    trace = [s for s in p.stderr.splitlines() if s.startswith("import time:")]
    said = [s for s in p.stderr.splitlines() if s.strip() and not s.startswith("import time:")]
    assert p.returncode == code, p.stderr[-3000:]
    assert len(said) == 1 and said[0].startswith("error: ") and words in said[0], said
    assert not any(_TORCH.match(s) for s in trace), f"torch was imported before the usage error: {said}"
    assert took < LIMIT_S, f"{took:.1f} s for a usage error"


# -- the GPU test without torch ------------------------------------------------------------------------------------

def _machine(monkeypatch: pytest.MonkeyPatch, root: Path, evidence: str = "") -> None:
    """This process looks for GPU drivers under `root` instead of `/` (and for nvidia-smi in root/bin only): a
    machine that holds only `evidence` ("" for none)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(device, "_GPU_FILES", tuple(str(root / f.lstrip("/")) for f in device._GPU_FILES))
    monkeypatch.setattr(device, "_GPU_GLOBS", tuple(str(root / g.lstrip("/")) for g in device._GPU_GLOBS))
    (root / "bin").mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("PATH", str(root / "bin"))
    if evidence:
        made = root / evidence.lstrip("/")
        made.parent.mkdir(parents=True, exist_ok=True)
        made.write_text("")
        made.chmod(0o755)


def test_a_machine_without_any_gpu_driver_is_told_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _machine(monkeypatch, tmp_path)
    assert device.cuda_absent() == "no GPU driver on this machine"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert "CUDA_VISIBLE_DEVICES" in device.cuda_absent()


@pytest.mark.parametrize("evidence", ["/dev/nvidia0", "/dev/nvidiactl", "/proc/driver/nvidia", "/dev/kfd",
                                      "/dev/dxg", "/dev/nvmap", "/bin/nvidia-smi"])
def test_any_trace_of_a_gpu_leaves_the_answer_to_torch(evidence: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _machine(monkeypatch, tmp_path, evidence)
    assert device.cuda_absent() == ""
    for line in (["matrix", "--device", "cuda:3"], ["bench", "--op", "routing", "--device", "cuda"],
                 ["differential", "--adapter", "triton-experts"]):
        usage.check(cli.build_parser().parse_args(line))  # torch decides later


def test_another_system_than_linux_is_left_to_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _machine(monkeypatch, tmp_path)
    monkeypatch.setattr(device.sys, "platform", "win32")
    assert device.cuda_absent() == ""


def test_a_machine_whose_torch_sees_a_gpu_is_never_refused() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device here: nothing to compare with")
    assert device.cuda_absent() == ""


# -- good command lines pass -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("line", [
    "matrix --device cpu --shard 2/3 --adapter pkg.mod:OBJ#some-name --adapter triton-experts --adapter external",
    "matrix --from {results} --out {tmp}/new/m.md --device cuda",  # renders only: no GPU needed
    "matrix --resume r --results-dir {tmp}",
    "replay {case} --device auto --adapter my_moe_kernel.harness_adapter:ADAPTER",
    "explain {case} --out {tmp}/new/x.pt",
    "diff {results} {tmp}",
    "bisect {case} --good HEAD --bad HEAD --repo {tmp} --log {tmp}/b.log",

    "conventions --op experts --out {tmp}/c.md",
    "bench --op experts --quant fp8_w8a8:G128,none --m 1,16 --shape deepseek-v3",
    "bench --op reference-experts",
    "golden routing_softmax_topk experts_batched",
    "golden --regenerate a_new_case",
])
def test_a_good_command_line_passes(line: str, places: dict[str, str], tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _machine(monkeypatch, tmp_path)  # no GPU: the lines that need one are above
    (Path(places["tmp"]) / "r-main.jsonl").write_text("")
    usage.check(cli.build_parser().parse_args([w.format(**places) for w in line.split()]))


def test_resume_lists_the_runs_there(tmp_path: Path) -> None:
    (tmp_path / "matrix-interp-1-main.jsonl").write_text("")
    args = cli.build_parser().parse_args(["matrix", "--resume", "matrix-interp-2", "--results-dir", str(tmp_path)])
    with pytest.raises(usage.UsageError, match="runs there, newest first: matrix-interp-1"):
        usage.check(args)


# -- every command is checked, with names from the code -----------------------------------------------------------

def test_every_command_has_its_rules() -> None:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(usage.RULES)


def test_the_ops_conventions_takes_are_the_ops_with_a_spec() -> None:
    from harness import ops
    from harness.commands.conventions import OP_ORDER

    assert sorted(OP_ORDER) == sorted(ops.available())


def test_the_profiles_offered_are_the_ones_the_sweep_plans() -> None:
    from harness.core.sweep_args import PROFILES
    from harness.sweep.selection import CASES_PER_CELL

    assert PROFILES == tuple(CASES_PER_CELL)


def test_the_stored_golden_names_are_the_registered_cases() -> None:
    from harness.commands import golden

    assert golden.stored() == sorted(golden.cases())
