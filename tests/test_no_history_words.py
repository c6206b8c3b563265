"""The tree is a record, not a diary: no file of it, nor its name, refers to a round of work (a numbered session,
an issue number, a session-named results folder or script). What a comment or a result means is said directly
("measured on the H100 on 2026-11-24", a commit, a folder named by date and commit).

Every file git knows here (committed or new, not ignored) under the checked folders is read, gzipped results
decompressed, and its path checked too.
"""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("results", "scripts", "docs", "harness", "kernels", "reference", "tests", "README.md")
HISTORY = re.compile(r"session [0-9]|sessions? of|issue #?[0-9]+|#[0-9]{2}\b|h100-s[0-9]|gpu_s[0-9]", re.IGNORECASE)
#: the same words, searched in lowered text: a case-insensitive search over the results' 400 MB took 13 s
LOWERED = re.compile(HISTORY.pattern)


def tree_files(root: Path = ROOT) -> list[str]:
    """The files git tracks or would add under CHECKED (relative paths), those deleted from the work tree left out."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *CHECKED],
                            cwd=root, capture_output=True, check=True).stdout.decode("utf-8").split("\0")
    return sorted({f for f in listed if f and (root / f).is_file()})


def text_of(path: Path) -> str:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")


def history_words(root: Path, files: list[str]) -> list[str]:
    """`path: name` for a path that matches, `path:line: text` for each matching line."""
    found = []
    for rel in files:
        if HISTORY.search(rel):
            found.append(f"{rel}: name")
        text = text_of(root / rel)
        if not LOWERED.search(text.lower()):  # one pass over the file; its lines only where something matched
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            if HISTORY.search(line):
                found.append(f"{rel}:{lineno}: {line.strip()[:160]}")
    return found


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_no_history_words_in_the_tree() -> None:
    found = history_words(ROOT, tree_files())
    assert not found, "history words (say what it is, not which round of work made it):\n" + "\n".join(found)


def test_a_history_word_is_caught(tmp_path: Path) -> None:
    # built from parts so that this file does not hold the words it plants
    session, issue, folder = "sess" + "ion 10", "iss" + "ue 18", "h100" + "-s7"
    planted = {
        "docs/notes.md": f"Measured in {session}, fixed for {issue}.\n",
        "kernels/k.py": "# the fast path (#" + "20)\n",
        "scripts/run.sh": "# every sess" + "ion of the GPU\n",
        f"results/sm90/{folder}/device.txt": "NVIDIA H100\n",
        "results/sm90/run/m.jsonl.gz": None,
        "tests/test_clean.py": '"""A pytest session fixture; the 2026-11-24 run on the H100 (#1a, # 20)."""\n',
    }
    for rel, text in planted.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            (tmp_path / rel).write_bytes(gzip.compress(f'{{"command": "--results-dir results/{folder}"}}\n'.encode()))
        else:
            (tmp_path / rel).write_text(text, encoding="utf-8")
    found = history_words(tmp_path, sorted(planted))
    assert [f.split(": ")[0] for f in found] == [
        "docs/notes.md:1", "kernels/k.py:1", f"results/sm90/{folder}/device.txt", "results/sm90/run/m.jsonl.gz:1",
        "scripts/run.sh:1"], found
