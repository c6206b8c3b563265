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
    case = Case(op="activation", adapter="toy-silu", features={"activation": "silu_and_mul", "dtype": "float32"},
                shapes={"T": 3, "N": 8}, dtypes={"x": "float32"}, seed=2)
    case_path = repo.parent / "toy-case.json"
    case_path.write_text(json.dumps({"kind": CASE_FILE_KIND, "case": case.to_dict(), "adapter": "toy-silu",
                                     "adapter_object": "toykern.adapter:ADAPTER", "verdict": "fail"}))
    return repo, shas, case_path


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


def test_bisect_refuses_wrong_endpoints(toy_repo, tmp_path) -> None:  # type: ignore[no-untyped-def]
    repo, shas, case_path = toy_repo
    with pytest.raises(BisectError, match="not an ancestor"):
        bisect(case_path, shas[4], shas[0], repo=repo, device="cpu", log_path=tmp_path / "a.log")
    with pytest.raises(BisectError, match="not a commit"):
        bisect(case_path, "no-such-rev", shas[4], repo=repo, device="cpu", log_path=tmp_path / "b.log")
    with pytest.raises(BisectError, match="fails at --good"):  # c3 is not good: bisecting c3..c4 would blame c4
        bisect(case_path, shas[3], shas[4], repo=repo, device="cpu", log_path=tmp_path / "c.log")
