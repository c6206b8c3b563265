"""The diagnostics of a suite's time: scripts/pytest_timeline.py (each test's start and end per worker) and
scripts/proc_cpu.py (CPU by kind of process)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


proc_cpu = _script("proc_cpu")
pytest_timeline = _script("pytest_timeline")


def test_the_timeline_plugin_records_each_tests_start_and_end_per_worker(tmp_path: Path) -> None:
    (tmp_path / "test_probe.py").write_text(
        "import time\n\ndef test_a():\n    time.sleep(0.2)\n\ndef test_b():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    env.update(PYTHONPATH=str(ROOT / "scripts"), MOE_TIMELINE_DIR=str(tmp_path / "tl"))
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:moe_harness",
                        "-p", "pytest_timeline", "test_probe.py", "--rootdir", str(tmp_path)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    done, running = pytest_timeline.spans(tmp_path / "tl")
    assert sorted((w, i) for _, _, w, i in done) == [("main", "test_probe.py::test_a"),
                                                     ("main", "test_probe.py::test_b")]
    a = next(d for d in done if d[3].endswith("test_a"))
    assert a[1] - a[0] >= 0.2 and running == []


def test_the_timeline_counts_busy_workers_and_names_unfinished_tests(tmp_path: Path) -> None:
    lines = {"gw0": [(0, "s", "t1"), (10, "f", "t1"), (10, "s", "t2")], "gw1": [(0, "s", "t3"), (20, "f", "t3")],
             "gw2": [(5, "s", "t4"), (15, "f", "t4")]}
    for worker, events in lines.items():
        (tmp_path / f"{worker}.jsonl").write_text(
            "".join(json.dumps({"t": 1000.0 + t, "e": e, "id": i}) + "\n" for t, e, i in events))
    done, running = pytest_timeline.spans(tmp_path)
    assert pytest_timeline.busy(done) == [2.5, 1.5]  # t1 + t3 + half of t4, then t3 + half of t4
    assert running == [(1010.0, "gw0", "t2")]


def test_processes_are_told_apart_by_command_line_and_parent() -> None:
    fork = "python -c from multiprocessing.forkserver import main; main(3, 4, ['torch'])"
    records = [
        {"pid": 1, "ppid": 0, "cmd": "python -m pytest -n 2 tests", "cpu": 6.0},
        {"pid": 2, "ppid": 1, "cmd": "python -u -c import sys;exec(eval(sys.stdin.readline()))", "cpu": 9.0},
        {"pid": 3, "ppid": 2, "cmd": fork, "cpu": 5.0},
        {"pid": 4, "ppid": 3, "cmd": fork, "cpu": 0.5},
        {"pid": 5, "ppid": 3, "cmd": fork, "cpu": 1.5},
        {"pid": 6, "ppid": 1, "cmd": "python -c from multiprocessing.resource_tracker import main;main(9)", "cpu": 0.1},
        {"pid": 7, "ppid": 2, "cmd": "python3 -m harness matrix --adapter x", "cpu": 3.0},
    ]
    assert proc_cpu.summary(records) == [
        ("xdist worker", 1, 9.0), ("pytest (a session's main process)", 1, 6.0), ("fork server", 1, 5.0),
        ("python -m harness", 1, 3.0), ("forked from a fork server", 2, 2.0), ("resource tracker", 1, 0.1)]


def test_the_sampler_sees_a_busy_child(tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 2.5: pass"])
    try:
        subprocess.run([sys.executable, str(ROOT / "scripts" / "proc_cpu.py"), "sample", str(out), "1.5"], check=True,
                       timeout=60)
    finally:
        busy.wait(timeout=30)
    seen = [r for r in json.loads(out.read_text()) if r["pid"] == busy.pid]
    assert seen and seen[0]["cpu"] > 0.3, seen


compile_census = _script("compile_census")
COMMITTED_LOG = ROOT / "results/sm90/2026-11-30-a8f8668-schedule-ab-suite/matrix/new2-main-verdicts.log.gz"


def test_a_variant_key_follows_tritons_integer_specialization_and_constexprs() -> None:
    import torch
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    def probe(x_ptr, n, m, scale, B: tl.constexpr):
        pass

    kernel = JITFunction(probe, do_not_specialize=["m"])  # a JIT kernel whether or not this process interprets
    x = torch.zeros(4, dtype=torch.bfloat16)

    def key(n: int, m: int, b: int) -> dict:
        return dict(compile_census.variant_key(kernel, (x, n, m, 0.5), {"B": b, "num_warps": 4}))

    assert key(32, 32, 8) == {"x_ptr": "bfloat16", "n": "d16", "m": "i", "scale": "f", "B": 8, "num_warps": 4}
    assert key(1, 1, 8)["n"] == "1" and key(17, 1, 8)["n"] == "i"
    assert key(1, 1, 8)["m"] == "i"  # do_not_specialize: never a variant of its own
    assert key(2**32, 2**31, 8)["n"] == "d16:i64" and key(1, 2**31, 8)["m"] == "i:i64"  # an int64 argument


def _census(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}  # the script leaves the interpreter off itself
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "compile_census.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_census_replays_committed_cases_without_running_a_kernel(tmp_path: Path) -> None:
    saved = tmp_path / "variants.jsonl"
    p = _census(str(COMMITTED_LOG), "--adapter", "triton-reduce", "--save", str(saved))
    assert p.returncode == 0 and "not run" not in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    variants = [json.loads(line) for line in saved.read_text().splitlines()]
    assert {v["kernel"] for v in variants} == {"kernels.reduce._reduce_kernel"} and len(variants) > 1
    # a saved census compiles in several processes at once, each in a cache of its own (so each compiles)
    p = _census("--variants", str(saved), "--compile", "1", "--processes", "2")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    found = re.search(r"^2 processes at once.*per process: ([0-9.]+) \(least\)", p.stdout, re.M)
    assert found and float(found.group(1)) > 0, p.stdout


@pytest.mark.parametrize("args", [["--variants", "v.jsonl", "x.log"], [], ["x.log", "--processes", "2"],
                                  ["--variants", "v.jsonl", "--compile", "1", "--processes", "-1"]])
def test_the_census_refuses_what_it_cannot_do(args: list[str]) -> None:
    p = _census(*args)
    assert p.returncode == 2 and "error:" in p.stderr, p.stderr


def test_importing_the_census_leaves_the_process_as_it_was(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # a test worker on a CPU interprets its kernels
    _script("compile_census")
    assert os.environ.get("TRITON_INTERPRET") == "1"


def test_the_census_refuses_an_interpreting_process(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import pytest

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match="without TRITON_INTERPRET"):
        compile_census.census([])


def test_the_axis_report_says_what_each_axis_costs_in_variants() -> None:
    keys = {(("A", a), ("B", b)) for a in (1, 2) for b in (1, 2, 3)} | {(("A", 3), ("B", 1))}
    report = {axis: (left, counts) for axis, left, counts in compile_census.axis_report(keys)}
    assert report["A"] == (3, {1: 3, 2: 3, 3: 1})
    assert report["B"] == (3, {1: 3, 2: 2, 3: 2})
    assert compile_census.without(keys, "C") == 7
