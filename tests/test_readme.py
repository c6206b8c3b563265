"""Every command of the README (and of the example's README) runs as written.

The commands are the lines of the ```bash blocks. Each is checked as a user would meet it: the `python -m harness`
commands are parsed by the real argument parser and the cheap ones run in full (rendering, diff, golden, replay, a
sweep narrowed by --adapter), in order, in a scratch copy of the tree (so nothing committed is rewritten); `pytest`
commands collect (`--co`, in one process) with their arguments; `pip install` lines must name installable folders;
`tox -e NAME` must name an environment of tox.ini and `bash SCRIPT.sh` a script that parses (both install libraries
for minutes). A bisect runs in full on the repository its README describes, built here (`example_repository`).
Sweeps of every adapter and benchmarks are only parsed: they take minutes to hours or a GPU.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "examples" / "my_kernel" / "README.md"]
#: exit codes a command may end with as documented (diff: 1 when cells differ)
ALLOWED_EXIT = {"diff": (0, 1)}


@dataclass
class Step:
    argv: list[str]
    cwd: str = "."  # relative to the tree
    env: dict[str, str] = field(default_factory=dict)


def commands(doc: Path) -> list[str]:
    """The command lines of the ```bash blocks (continuation lines joined, comments dropped)."""
    found, block, pending = [], False, ""
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("```"):
            block = line.strip() == "```bash" if not block else False
            continue
        if not block or not line.strip() or line.strip().startswith("#"):
            continue
        pending += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            found.append(pending.strip())
            pending = ""
    return found


def steps(command: str) -> list[Step]:
    """`(cd DIR && A && B)` -> the steps A and B run in DIR; leading VAR=value words become the environment."""
    text = command.strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    cwd, out = ".", []
    for part in text.split("&&"):
        words = shlex.split(part)
        env = {}
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        if words[:1] == ["cd"]:
            cwd = os.path.normpath(os.path.join(cwd, words[1]))
            continue
        out.append(Step(words, cwd, env))
    return out


def kind(step: Step) -> str:
    argv = step.argv
    if argv[:2] == ["pip", "install"]:
        return "install"
    if argv[:3] == ["python", "-m", "harness"]:
        return "harness"
    if argv[:1] == ["pytest"]:
        return "pytest"
    if argv[:2] == ["tox", "-e"]:
        return "tox"
    if argv[:1] == ["bash"] and len(argv) == 2 and argv[1].endswith(".sh"):
        return "script"
    return "unknown"


def is_cheap(args: list[str]) -> bool:
    """Which `python -m harness` commands run in full here."""
    command = args[0] if args else ""
    if command == "matrix":
        return "--from" in args or "--adapter" in args  # a render, or a sweep of named adapters
    if command == "golden":
        return "--regenerate" not in args
    return command in ("diff", "replay", "bisect")


#: the example README's kernel repository: its tag `v1.2` passes the committed case, its HEAD swaps gate and up
EXAMPLE_GOOD_TAG = "v1.2"
_GATE_UP = ("        gate = tl.load(x_row + cols, mask=keep, other=0.0).to(tl.float32)\n"
            "        up = tl.load(x_row + n_cols + cols, mask=keep, other=0.0).to(tl.float32)\n")


def example_repository(repo: Path) -> None:
    """`repo` as examples/my_kernel/README.md describes `../my-kernel`: a git repository of the example package,
    tagged v1.2 as it is, then a commit that loads the up half as the gate and the gate half as up."""
    shutil.copytree(ROOT / "examples" / "my_kernel", repo, ignore=shutil.ignore_patterns("__pycache__", "results"))

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false",
                        *args], cwd=repo, check=True, capture_output=True)

    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "correct kernel")
    git("tag", EXAMPLE_GOOD_TAG)
    kernel = repo / "my_moe_kernel" / "swiglu.py"
    text = kernel.read_text(encoding="utf-8")
    assert _GATE_UP in text, "the example kernel changed: update _GATE_UP"
    swapped = _GATE_UP.replace("gate = ", "GATE = ").replace("up = ", "gate = ").replace("GATE = ", "up = ")
    kernel.write_text(text.replace(_GATE_UP, swapped), encoding="utf-8")
    git("commit", "-q", "-am", "swap gate and up")


def prepare(args: list[str], cwd: Path) -> None:
    """What a command's prose says exists: a bisect's `--repo` that is not there is the example's repository."""
    if args[:1] == ["bisect"] and "--repo" in args:
        repo = cwd / args[args.index("--repo") + 1]
        if not repo.exists():
            example_repository(repo)


def scratch_tree(tmp: Path) -> Path:
    """The tree as commands see it: docs, examples and results/local are private copies, the rest is linked."""
    tree = tmp / "tree"
    tree.mkdir()
    for entry in ROOT.iterdir():
        if entry.name in ("docs", "examples"):
            shutil.copytree(entry, tree / entry.name, ignore=shutil.ignore_patterns("__pycache__", "results"))
        elif entry.name == "results":
            (tree / "results").mkdir()
            for child in entry.iterdir():
                if child.name != "local":
                    (tree / "results" / child.name).symlink_to(child)
        else:
            (tree / entry.name).symlink_to(entry)
    return tree


def parse_problem(step: Step, tree: Path) -> str | None:
    """What is wrong with a step that can be told without running it (None: nothing): an install names a folder to
    install, a tox environment exists, a script parses, a `python -m harness` command passes its argument parser.
    `pytest` commands are checked by collecting them (run_step)."""
    what = kind(step)
    if what == "install":
        targets = [a for a in step.argv[2:] if not a.startswith("-")]
        missing = [t for t in targets if not (tree / step.cwd / t / "pyproject.toml").exists()]
        return f"nothing installable at {missing}" if missing else None
    if what == "tox":  # installs libraries for many minutes: the environment must exist and its script parse
        ini = (tree / step.cwd / "tox.ini").read_text(encoding="utf-8")
        return None if f"[testenv:{step.argv[2]}]" in ini else f"tox.ini has no [testenv:{step.argv[2]}]"
    if what == "script":
        script = tree / step.cwd / step.argv[1]
        if not script.is_file():
            return f"no script {step.argv[1]}"
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=60)
        return None if done.returncode == 0 else f"bash -n: {done.stderr[-1000:]}"
    if what == "harness":
        try:
            build_parser().parse_args(step.argv[3:])
        except SystemExit as e:
            return f"the argument parser refuses it (exit {e.code})"
        return None
    return None if what == "pytest" else "not a command this test knows how to check (add it to kind())"


def parse_problems(doc: Path, tree: Path) -> list[str]:
    return [f"`{command}`: {why}" for command in commands(doc) for step in steps(command)
            if (why := parse_problem(step, tree))]


def run_step(step: Step, tree: Path) -> str | None:
    """None when the step works as written, else what went wrong."""
    what = kind(step)
    if (why := parse_problem(step, tree)) is not None or what in ("install", "tox", "script"):
        return why
    env = {**os.environ, **step.env, "PYTHONPATH": os.pathsep.join(
        [str(tree), str(tree / "examples" / "my_kernel"), os.environ.get("PYTHONPATH", "")])}
    for key in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_TESTRUNUID", "PYTEST_XDIST_WORKER_COUNT"):
        env.pop(key, None)  # the commands run as the user's own sessions, not as our workers
    if what == "harness":
        args = step.argv[3:]
        if not is_cheap(args):
            return None
        prepare(args, tree / step.cwd)
        argv = [sys.executable, "-m", "harness", *args]
        allowed = ALLOWED_EXIT.get(args[0], (0,))
    else:  # pytest: collected in one process (`-n 0` after the command's own `-n`, still parsed: no xdist workers)
        argv = [sys.executable, "-m", "pytest", *step.argv[1:], "--co", "-q", "-p", "no:cacheprovider", "-n", "0"]
        allowed = (0,)
    done = subprocess.run(argv, cwd=tree / step.cwd, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode not in allowed:
        return f"exit {done.returncode}:\n{(done.stdout + done.stderr)[-2000:]}"
    return None


def test_the_readmes_have_commands_this_test_knows() -> None:
    for doc in DOCS:
        found = [s for c in commands(doc) for s in steps(c)]
        assert found, f"no command found in {doc}"
        unknown = [" ".join(s.argv) for s in found if kind(s) == "unknown"]
        assert not unknown, f"{doc.name}: commands of unknown kind: {unknown}"
    # the README's two quick-start commands and its test command are among them
    readme = commands(DOCS[0])
    assert readme[:2] == ["pip install -e . && python -m harness matrix", "pip install -e . && pytest -n auto"]


def test_a_broken_command_is_caught(tmp_path: Path) -> None:
    tree = scratch_tree(tmp_path)
    assert "parser refuses" in run_step(Step(["python", "-m", "harness", "matrix", "--no-such-flag"]), tree)
    assert "exit 2" in run_step(Step(["python", "-m", "harness", "matrix", "--from", "results/none"]), tree)
    assert "nothing installable" in run_step(Step(["pip", "install", "-e", "examples/none"]), tree)


def test_every_command_parses() -> None:
    """The quick form of the next test: nothing runs, every command that can be checked without running passes."""
    problems = [f"{doc.relative_to(ROOT)}: {why}" for doc in DOCS for why in parse_problems(doc, ROOT)]
    assert not problems, "\n".join(problems)


def test_a_command_that_does_not_parse_is_caught(tmp_path: Path) -> None:
    doc = tmp_path / "README.md"
    doc.write_text("```bash\npython -m harness matrix --adapter triton-routing\n"
                   "python -m harness matrix --no-such-flag\ntox -e no-such-env\n```\n", encoding="utf-8")
    problems = parse_problems(doc, ROOT)
    assert len(problems) == 2, problems
    assert "--no-such-flag`: the argument parser refuses it" in problems[0]
    assert "tox.ini has no [testenv:no-such-env]" in problems[1]


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_command_runs_as_written(doc: Path, tmp_path: Path) -> None:
    tree = scratch_tree(tmp_path)
    problems = []
    # a command the main README also gives (from the same folder) is run by its own test, in the same scratch tree
    shown_before = set(commands(DOCS[0])) if doc != DOCS[0] else set()
    for command in [c for c in commands(doc) if c not in shown_before]:
        for step in steps(command):
            why = run_step(step, tree)
            if why:
                problems.append(f"`{command}`: {why}")
    assert not problems, "\n\n".join(problems)
