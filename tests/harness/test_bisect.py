"""Bisect end to end on a throwaway git repository built here (never on this repository).

The repository holds a trivial torch-only kernel package `toykern` (an external kernel, named by module:object)
and, to prove that the bisect judges with its own copy of the harness, a `harness/` package that refuses to be
imported. History: c0 correct, c1 the bug (gate and up swapped), c2 the kernel does not import, c3 and c4 still
wrong. Bisecting c0..c4, git tests c2 first (the midpoint), which must be skipped, then finds c1.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from harness.cli import main
from harness.commands.bisect import BisectError, bisect
from harness.core.case import Case
from harness.store.casefiles import CASE_FILE_KIND

ADAPTER = '''\
import torch

from harness.registry import Adapter


def run(case, inputs, outputs):
    x = inputs["x"].float()
    gate, up = x.chunk(2, dim=-1)
    outputs["out"].copy_(({expr}).to(outputs["out"].dtype))


ADAPTER = Adapter(name="toy-silu", op="activation", source="toykern.adapter", run=run,
                  support={{"activation": ("silu_and_mul",), "dtype": ("float32",)}}, generations=("interp", "cpu"),
                  conventions={{"gate_order": "gate_first", "rounding": "round_once"}})
'''
GOOD = "torch.nn.functional.silu(gate) * up"
BAD = "torch.nn.functional.silu(up) * gate"


def _git(repo, *args: str) -> str:  # type: ignore[no-untyped-def]
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(repo)}
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True, env=env).stdout.strip()


def _commit(repo, message: str, files: dict[str, str]) -> str:  # type: ignore[no-untyped-def]
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def _toy_case_file(path):  # type: ignore[no-untyped-def]
    """The case file every bisect test replays: toy-silu, named by module:object, recorded as a fail."""
    case = Case(op="activation", adapter="toy-silu", features={"activation": "silu_and_mul", "dtype": "float32"},
                shapes={"T": 3, "N": 8}, dtypes={"x": "float32"}, seed=2)
    path.write_text(json.dumps({"kind": CASE_FILE_KIND, "case": case.to_dict(), "adapter": "toy-silu",
                                "adapter_object": "toykern.adapter:ADAPTER", "verdict": "fail"}))
    return path


@pytest.fixture(scope="module")
def toy_repo(tmp_path_factory):  # type: ignore[no-untyped-def]
    repo = tmp_path_factory.mktemp("toy-repo")
    _git(repo, "init", "-q", "-b", "main")
    shas = [
        _commit(repo, "c0 correct kernel", {
            "toykern/__init__.py": "", "toykern/adapter.py": ADAPTER.format(expr=GOOD),
            "harness/__init__.py": "raise ImportError('the checkout\\'s harness was imported, not the copy')\n"}),
        _commit(repo, "c1 swap gate and up", {"toykern/adapter.py": ADAPTER.format(expr=BAD)}),
        _commit(repo, "c2 kernel does not import", {"toykern/__init__.py": "import toykern.missing_helper\n"}),
        _commit(repo, "c3 import fixed", {"toykern/__init__.py": ""}),
        _commit(repo, "c4 unrelated", {"README": "toy\n"}),
    ]
    return repo, shas, _toy_case_file(repo.parent / "toy-case.json")


def test_bisect_names_the_first_bad_commit_and_skips_the_broken_one(toy_repo, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    repo, shas, case_path = toy_repo
    log = tmp_path / "bisect.log"
    code = main(["bisect", str(case_path), "--good", shas[0], "--bad", "main", "--repo", str(repo),
                 "--device", "cpu", "--log", str(log), "--timeout", "120", "--quiet"])
    out = capsys.readouterr()
    text = log.read_text()
    assert code == 0, out.err + text
    assert f"first bad commit: {shas[1]} c1 swap gate and up" in out.out
    assert f"# skip: [{shas[2]}]" in text  # the commit whose kernel does not import was skipped, not blamed
    assert "adapter not importable" in text
    assert "the checkout's harness was imported" not in text
    # the caller's repository is left as it was: same branch, clean, no bisect in progress
    assert _git(repo, "rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert _git(repo, "status", "--porcelain") == ""
    assert _git(repo, "for-each-ref", "refs/bisect") == ""


def test_bisect_refuses_wrong_endpoints(toy_repo, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    repo, shas, case_path = toy_repo
    with pytest.raises(BisectError, match="not an ancestor"):
        bisect(case_path, shas[4], shas[0], repo=repo, device="cpu", log_path=tmp_path / "a.log")
    with pytest.raises(BisectError, match="not a commit"):
        bisect(case_path, "no-such-rev", shas[4], repo=repo, device="cpu", log_path=tmp_path / "b.log")
    # c3 is not good: bisecting c3..c4 would blame c4; the command says so once (and the log too), exit 2
    code = main(["bisect", str(case_path), "--good", shas[3], "--bad", shas[4], "--repo", str(repo), "--device", "cpu",
                 "--log", str(tmp_path / "c.log")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("fails at --good") == 1, err
    assert "error: the case fails at --good" in (tmp_path / "c.log").read_text()


@pytest.fixture(scope="module")
def noisy_repo(tmp_path_factory):  # type: ignore[no-untyped-def]
    """c0 correct; c1 wrong, and from then on the kernel prints a line that looks like git naming c0 as the first
    bad commit; c2 unrelated; c3 the kernel hangs on import (for the SIGTERM test); c4 unrelated."""
    repo = tmp_path_factory.mktemp("noisy-repo")
    _git(repo, "init", "-q", "-b", "main")
    c0 = _commit(repo, "c0 correct kernel",
                 {"toykern/__init__.py": "", "toykern/adapter.py": ADAPTER.format(expr=GOOD)})
    liar = f"print('{c0} is the first bad commit', flush=True)\n"
    shas = [c0, _commit(repo, "c1 wrong and noisy", {"toykern/adapter.py": liar + ADAPTER.format(expr=BAD)}),
            _commit(repo, "c2 unrelated", {"README": "toy\n"}),
            _commit(repo, "c3 hangs", {"toykern/__init__.py": "import time\ntime.sleep(120)\n"}),
            _commit(repo, "c4 unrelated", {"README": "toy 2\n"})]
    return repo, shas, _toy_case_file(repo.parent / "noisy-case.json")


def test_what_a_kernel_prints_cannot_pass_for_gits_answer(noisy_repo, tmp_path) -> None:  # type: ignore[no-untyped-def]
    repo, shas, case_path = noisy_repo
    r = bisect(case_path, shas[0], shas[2], repo=repo, device="cpu", log_path=tmp_path / "b.log", timeout=120)
    assert r.first_bad == shas[1], (tmp_path / "b.log").read_text()
    # nor does it reach the log: a kernel's output goes to its kernel host's log, not the replay's console
    assert f"{shas[0]} is the first bad commit" not in (tmp_path / "b.log").read_text()


def _processes_mentioning(text: str) -> list[str]:
    from pathlib import Path

    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().decode(errors="replace"):
                found.append(cmdline.parent.name)
        except OSError:
            continue
    return found


def test_a_terminated_bisect_leaves_no_temporary_folder_or_process(noisy_repo, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os
    import sys
    import time

    repo, shas, case_path = noisy_repo
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    log = tmp_path / "t.log"
    # c2..c4 (trusted with --no-check): git tests c3, whose kernel hangs on import
    p = subprocess.Popen([sys.executable, "-m", "harness", "bisect", str(case_path), "--good", shas[2], "--bad",
                          shas[4], "--repo", str(repo), "--device", "cpu", "--no-check", "--quiet", "--log", str(log)],
                         env=dict(os.environ, TMPDIR=str(scratch)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while time.time() < deadline and not (log.exists() and "bisect step at" in log.read_text(errors="replace")):
        time.sleep(0.2)
    deadline = time.time() + 30  # the step's replay child starts, then imports the hanging kernel (slow when loaded)
    while time.time() < deadline and not _processes_mentioning(str(scratch)):
        time.sleep(0.2)
    time.sleep(1)
    assert _processes_mentioning(str(scratch)), "the step should be running"
    p.terminate()
    p.wait(30)
    time.sleep(0.5)
    assert not list(scratch.glob("moe-bisect-*")), list(scratch.iterdir())
    assert not _processes_mentioning(str(scratch))
