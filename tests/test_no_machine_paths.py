"""No file of the tree names an absolute path of the machine that made it (a checkout, a venv, an output folder).

Results, rendered matrices, case files and logs are read on other machines, where such a path means nothing and
says who ran what where; the harness names files by what they are instead (`harness.core.paths`). Every file git
tracks or would add is read (gzipped results decompressed; binary files skipped). A few absolute paths are the
same on every machine or are the point of the file; they are listed here, per file, by prefix.
"""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MACHINE = re.compile(r"/(?:work|tmp|home|root|Users|opt|usr|var)/")
#: (file, or "*" for every file) -> allowed path prefixes
ALLOWED: dict[str, tuple[str, ...]] = {
    "*": ("/usr/bin/env",),  # shebangs
    ".ci/run": ("/tmp/moe-harness-ci-",),  # the CI's own throw-away venvs and results
    "scripts/deepgemm.sh": ("/usr/bin/c++", "/usr/bin/g++"),  # compilers tried in order
    "scripts/flashinfer.sh": ("/usr/local/cuda",),  # CUDA_HOME's usual default
    "scripts/shard_check.sh": ("/usr/bin/time",),
    "tests/harness/test_bisect.py": ("/usr/bin", "/usr/local/bin"),  # a PATH for git
    "tests/harness/test_results_index.py": ("/root/out", "/tmp/r"),  # a command whose paths the index must drop
    "harness/core/paths.py": ("/usr/bin/",),  # system places left as they are
}
ALLOWED["tests/test_no_machine_paths.py"] = tuple(p for prefixes in ALLOWED.values() for p in prefixes)  # this list


def tree_files(root: Path = ROOT) -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout.decode("utf-8").split("\0")
    return sorted({f for f in listed if f and (root / f).is_file()})


def machine_paths(root: Path, files: list[str]) -> list[str]:
    """`path:line: text` for each line naming an absolute machine path not allowed for its file."""
    found = []
    for rel in files:
        data = (root / rel).read_bytes()
        if rel.endswith(".gz"):
            data = gzip.decompress(data)
        if b"\0" in data:
            continue  # binary (torch tensors)
        allowed = ALLOWED["*"] + ALLOWED.get(rel, ())
        for lineno, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            for m in MACHINE.finditer(line):
                if not line.startswith(allowed, m.start()):
                    found.append(f"{rel}:{lineno}: {line.strip()[:200]}")
                    break
    return found


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_no_machine_path_in_the_tree() -> None:
    found = machine_paths(ROOT, tree_files())
    assert not found, ("absolute paths of a machine (name them with harness.core.paths, or rewrite old files with "
                       "scripts/public_paths.py):\n" + "\n".join(found[:40]))


def test_a_machine_path_is_caught(tmp_path: Path) -> None:
    home = "/ho" + "me/someone/checkout"  # built from parts: this file must not hold one
    planted = {
        "docs/m.json": f'{{"reason": "kernel raised (at {home}/kernels/x.py:3)"}}\n',
        "results/r/log.txt": "ok\n" + "see /" + "tmp/run/out.md\n",
        "results/r/v.jsonl.gz": gzip.compress(f'{{"library": "vllm (source {home}/third_party/vllm)"}}\n'.encode()),
        "scripts/ok.sh": "#!/usr/bin/env bash\nls /dev/shm\n",
        ".ci/run": "VENV=/" + "tmp/moe-harness-ci-venv\n",
    }
    for rel, text in planted.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        data = text if isinstance(text, bytes) else text.encode()
        (tmp_path / rel).write_bytes(data)
    found = machine_paths(tmp_path, sorted(planted))
    assert [f.split(":")[0] for f in found] == ["docs/m.json", "results/r/log.txt", "results/r/v.jsonl.gz"], found
