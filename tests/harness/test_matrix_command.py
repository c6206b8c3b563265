"""`python -m harness matrix` as a new user meets it: a sweep leaves a clean checkout clean (its matrix goes to the
git-ignored results/local/, with every committed verdict merged in), its end says how long it took, and the workers'
Python warnings do not cut the progress lines; `python -m harness --help` lists the commands once."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from harness import registry
from harness.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
_reference = registry.resolve("reference-activation")


def _warns(case, inputs, outputs):  # type: ignore[no-untyped-def]
    warnings.warn("planted overflow in a kernel", RuntimeWarning, stacklevel=1)
    _reference.run(case, inputs, outputs)


#: resolvable as tests.harness.test_matrix_command:WARNS in the sweep's workers
WARNS = registry.Adapter(name="warns", op="activation", source="tests.harness.test_matrix_command", run=_warns,
                         support={"activation": ("silu_and_mul",), "dtype": ("float32",)},
                         conventions=_reference.conventions)


def _harness(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    # the repository too where the package is not installed (the GPU machines' copy)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys([str(cwd), str(ROOT)]))}
    for key in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_TESTRUNUID", "PYTEST_XDIST_WORKER_COUNT"):
        env.pop(key, None)
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_help_lists_the_commands_once() -> None:
    text = build_parser().format_help()
    for command in ("matrix", "replay", "diff", "bisect", "bench", "golden", "conventions"):
        assert len(re.findall(rf"^ {{1,8}}{command}\b", text, re.MULTILINE)) == 1, (command, text)


def test_worker_warnings_go_to_a_log_and_the_end_says_how_long_it_took(tmp_path: Path) -> None:
    done = _harness(["matrix", "--device", "cpu", "--adapter", "tests.harness.test_matrix_command:WARNS",
                     "--results-dir", str(tmp_path / "r"), "--out", str(tmp_path / "M.md"), "--only-this-run",
                     "--jobs", "1"], ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "planted overflow" not in done.stderr and "RuntimeWarning" not in done.stderr, done.stderr
    [log] = (tmp_path / "r").glob("*-warnings.log")
    assert "RuntimeWarning: planted overflow in a kernel" in log.read_text()
    assert re.search(r"^\d+ warning\(s\) from the worker processes \(Python, Triton\): .*-warnings\.log$",
                     done.stderr, re.MULTILINE), done.stderr
    assert re.search(r"^judged \d+ cases in \d+s \([\d.]+s planning and judging, [\d.]+s listing the adapters, "
                     r"[\d.]+s rendering, ", done.stdout.splitlines()[-1]), done.stdout
    # where the judging time went, a kernel host's start included (the worker waited for one before its first case)
    assert re.search(r"^time summed over the workers: .*kernel runs .*, kernel host starts \d+s \([1-9]", done.stderr,
                     re.MULTILINE), done.stderr[-2000:]


def _clean_checkout(tmp: Path) -> Path:
    """The working tree's files (tracked and new ones git does not ignore) committed in a repository of their own."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    tree = tmp / "checkout"
    for rel in filter(None, listed):
        if (ROOT / rel).is_file():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, tree / rel)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "checkout"]):
        subprocess.run([*git, *args], cwd=tree, check=True, capture_output=True)
    return tree


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_sweep_leaves_a_clean_checkout_clean_and_keeps_every_committed_verdict(tmp_path: Path) -> None:
    """A first sweep once rewrote docs/SUPPORT_MATRIX.md/.json and added and deleted committed case files."""
    tree = _clean_checkout(tmp_path)
    done = _harness(["matrix", "--device", "cpu", "--adapter", "reference-activation", "--adapter",
                     "triton-activation", "--jobs", "2"], tree)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    status = subprocess.run(["git", "status", "--porcelain"], cwd=tree, capture_output=True, text=True, check=True)
    assert status.stdout == ""
    model = json.loads((tree / "results" / "local" / "SUPPORT_MATRIX.json").read_text(encoding="utf-8"))
    committed = json.loads((tree / "docs" / "SUPPORT_MATRIX.json").read_text(encoding="utf-8"))
    gens = {g["generation"]: g["verdicts"] for g in model["generations"]}
    # the other generations' verdicts are the committed matrix's, all of them
    for g in committed["generations"]:
        if g["generation"] != "interp":
            assert gens[g["generation"]] == g["verdicts"], g["generation"]


def test_the_end_of_a_sweep_says_where_the_judging_time_went_and_the_progress_line_names_compiles() -> None:
    import io

    from harness.sweep.progress import Progress

    out = io.StringIO()
    progress = Progress(3, {0: ("a", 1), 1: ("a", 2), 2: ("a", 3)}, out)
    progress.record(0, "pass", True, {"inputs": 1.0, "oracle": 2.0, "first_run": 30.0, "second_run": 1.0,
                                      "in_host": 29.0, "checks": 1.0, "host_start": 5.0})
    assert "compiling" in progress.line()  # 29 s of the first run's 30 beyond the second, of 40 s
    progress.record(1, "pass", True, {"inputs": 1.0, "oracle": 50.0, "first_run": 1.0, "second_run": 1.0})
    assert "compiling" not in progress.line()  # 29 of 93 s
    progress.record(2, "unsupported", False)  # a gated case: no time spent
    account = progress.account()
    assert account.startswith("time summed over the workers: 1m33s: ")  # 40 + 53 s
    assert "kernel runs 33s (35%)" in account and "compiles and first calls: 29s" in account
    assert "oracle 52s (56%)" in account and "kernel host starts 5s (5%)" in account
    progress.finish()
    assert out.getvalue().splitlines()[-1] == account


def test_the_adapters_are_listed_and_planned_in_one_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Listing the adapters and planning their cases both import every adapter module in a CPU host: one host does
    both (a second one was a second import of torch and of every adapter, seconds before any case ran). It starts
    before the device is looked at, so that its start overlaps the device's (a CUDA context on a GPU)."""
    from harness.cli import main
    from harness.core import device
    from harness.engine import host

    started: list[str] = []
    real_start, real_detect = host.Host.start, device.detect

    def counting_start(self: host.Host) -> None:
        started.append(self.device)
        real_start(self)

    def detect(*args: object, **kw: object) -> object:
        started.append("detect")
        return real_detect(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(host.Host, "start", counting_start)
    monkeypatch.setattr(device, "detect", detect)
    code = main(["matrix", "--device", "cpu", "--adapter", "tests.harness.test_matrix_command:WARNS", "--results-dir",
                 str(tmp_path / "r"), "--out", "", "--jobs", "1"])
    assert code == 0
    # the sweep's workers start their kernel hosts in their own processes
    assert [s for s in started if s != "detect"] == ["cpu"], started
    assert started.index("cpu") < started.index("detect"), started


def test_the_whole_matrix_starts_its_workers_before_it_lists_the_adapters(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --adapter (every adapter: the main job), the workers start first, so that their start (torch, a CUDA
    context, a kernel host each) overlaps the listing and the planning; every case still gets its verdict."""
    from harness.cli import main
    from harness.engine import remote
    from harness.sweep import plan, workers

    events: list[str] = []
    real_start, real_expand = workers.WorkerPool.start, remote.expand

    def start(self: workers.WorkerPool, slot: workers._Slot) -> None:
        events.append("worker")
        real_start(self, slot)

    def expand(specs: list[str], **kw: object) -> remote.Catalog:
        events.append("list")
        return real_expand(specs or ["tests.harness.test_matrix_command:WARNS"], **kw)  # one adapter stands for all

    monkeypatch.setattr(workers.WorkerPool, "start", start)
    monkeypatch.setattr(remote, "expand", expand)
    code = main(["matrix", "--device", "cpu", "--results-dir", str(tmp_path / "r"), "--out", "", "--jobs", "2"])
    assert code == 0
    assert events == ["worker", "worker", "list"], events
    results = [json.loads(line) for f in (tmp_path / "r").glob("*.jsonl") for line in f.read_text().splitlines()]
    planned = plan(registry.resolve("tests.harness.test_matrix_command:WARNS"), "quick").cases
    assert sorted(r["case"]["seed"] for r in results if r.get("kind") is None) == sorted(c.seed for c in planned)


_KILLS_ITS_PLANNER = '''
import os
from harness import registry
_ref = registry.resolve("reference-activation")
def _rule(device, features):
    os._exit(3)  # in the planning host, which reads the support rule
ADAPTER = registry.Adapter(name="kills-its-planner", op="activation", source="kills_its_planner", run=_ref.run,
                           support=dict(_ref.support), requires=_rule, test_aid=True, description="ends its planner")
'''


def test_an_adapter_that_cannot_be_planned_fails_the_run_and_the_others_are_judged(tmp_path: Path) -> None:
    """Its planning host dies in its support rule: no case of it is judged, so the run must not exit 0 as though
    it had passed; the other adapter is planned and judged all the same."""
    (tmp_path / "kills_its_planner.py").write_text(_KILLS_ITS_PLANNER, encoding="utf-8")
    p = _harness(["matrix", "--device", "cpu", "--jobs", "1", "--adapter", "kills_its_planner:ADAPTER", "--adapter",
                  "reference-activation", "--results-dir", str(tmp_path / "r"), "--out", ""], tmp_path)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-3000:]
    assert "1 adapter(s) could not be planned" in p.stderr and "kills-its-planner" in p.stderr, p.stderr[-3000:]
    assert "reference-activation: 54 pass" in p.stderr + p.stdout, p.stderr[-3000:]
