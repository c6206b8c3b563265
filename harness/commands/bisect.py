"""`python -m harness bisect CASE.json --good REV --bad REV [--repo PATH]`: find the commit that broke a case.

How it works:
1. The harness in use (`harness/` and `reference/`) is copied to a temporary folder first, so the judge stays the
   same while the commits under test change (also when bisecting this repository, whose harness changes too).
2. The repository (this one by default, or `--repo`: an external kernel's) is cloned into the temporary folder
   (`git clone --shared`: no copy of the objects) and bisected there, so the caller's working tree is never
   touched and may even hold uncommitted work.
3. Unless `check_ends` is off, the case is replayed at BAD (must fail) and at GOOD (must pass) first, so that a
   wrong endpoint is reported instead of silently blaming the first commit.
4. `git bisect run <python> <copy>/bisect_step.py ...` replays the case at each commit with `harness replay`'s
   exit codes (0 good, 1 bad, 125 skip: the kernel does not import or build). The step script puts the harness
   copy first on `sys.path`, then the checkout (and its `src/` when present), so the kernels and any
   `module:object` adapter come from the commit under test. A crash of the kernel is contained by replay.
5. The first bad commit (or, when skipped commits hide it, the candidates) is reported; the whole output and
   `git bisect log` go to the log file. `git bisect reset` always runs at the end, and the temporary folder is
   removed (`keep=True` keeps it for inspection).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from harness.commands import positive
from harness.commands.replay import DEFAULT_TIMEOUT_S, EXIT_FAIL, EXIT_PASS, EXIT_UNTESTABLE
from harness.core.case import Case
from harness.store.casefiles import read_case_file

#: what is copied from the harness's own tree (the oracle and the engine; kernels come from the checkout)
HARNESS_PARTS = ("harness", "reference")

_STEP_SCRIPT = '''\
"""One `git bisect run` step: replay the case with the frozen harness copy against the checkout (the cwd)."""
import os
import subprocess
import sys
import tempfile

if __name__ == "__main__":  # spawned replay children re-import this file: only the step itself runs here
    checkout = os.getcwd()
    extra = [p for p in (checkout, os.path.join(checkout, "src")) if os.path.isdir(p)]
    sys.path[1:1] = extra  # sys.path[0] is this folder, holding the harness copy
    head = subprocess.run(["git", "log", "-1", "--format=%H %s"], capture_output=True, text=True).stdout.strip()
    print(f"--- bisect step at {head}", flush=True)
    # the kernel's own output (and the replay's) is captured and echoed indented: a line a kernel prints can never
    # pass for one of git's ("<sha> is the first bad commit")
    sys.stdout.flush()
    saved = os.dup(1)
    captured = tempfile.TemporaryFile()
    os.dup2(captured.fileno(), 1)
    os.dup2(captured.fileno(), 2)
    try:
        from harness.cli import main

        code = main(["replay", *sys.argv[1:]])
    except BaseException as e:  # the harness copy itself failed: stop the bisect (exit >= 128 aborts it)
        import traceback

        traceback.print_exc()
        print(f"harness failure during the bisect step: {e!r}", flush=True)
        code = 128
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(saved, 1)
    os.dup2(saved, 2)
    captured.seek(0)
    for line in captured:
        os.write(1, b"    | " + line)
    print(f"--- exit {code}", flush=True)
    sys.stdout.flush()
    os._exit(code)
'''


class BisectError(RuntimeError):
    """The bisect could not be set up or run (bad revision, wrong endpoints, not a git repository)."""


@dataclass
class BisectResult:
    first_bad: str | None  # full sha, when git could name it
    subject: str = ""
    candidates: list[str] = field(default_factory=list)  # when skipped commits leave several possible
    steps: list[tuple[str, str]] = field(default_factory=list)  # (good|bad|skip, sha) in the order git tested
    log_path: Path | None = None

    @property
    def exit_code(self) -> int:
        return 0 if self.first_bad else 1


def _git(repo: Path, *args: str, check: bool = True) -> str:
    p = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise BisectError(f"git {' '.join(args)} failed in {repo}: {p.stderr.strip() or p.stdout.strip()}")
    return p.stdout.strip()


def repo_root(path: str | os.PathLike | None) -> Path:
    """The top of the git repository holding `path` (default: the current directory, else the harness's)."""
    here = Path(path) if path else Path.cwd()
    if not here.is_dir():
        raise BisectError(f"repository {str(here)!r} is not a directory")
    try:
        return Path(_git(here, "rev-parse", "--show-toplevel"))
    except BisectError:
        if path:
            raise BisectError(f"{str(here)!r} is not inside a git repository") from None
        from harness.core.device import REPO_ROOT

        return Path(_git(REPO_ROOT, "rev-parse", "--show-toplevel"))


def copy_harness(dest: Path) -> Path:
    """Copy the running harness (`HARNESS_PARTS`) into `dest`; returns `dest`."""
    import harness

    root = Path(harness.__file__).resolve().parent.parent
    for part in HARNESS_PARTS:
        if (root / part).is_dir():
            shutil.copytree(root / part, dest / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (dest / "bisect_step.py").write_text(_STEP_SCRIPT, encoding="utf-8")
    return dest


def _replay_args(case_path: Path, adapter: str | None, device: str, timeout: float) -> list[str]:
    args = [str(case_path), "--device", device, "--timeout", str(timeout)]
    return args + (["--adapter", adapter] if adapter else [])


class _Tee:
    def __init__(self, *streams: IO[str] | None) -> None:
        self.streams = [s for s in streams if s is not None]

    def write(self, text: str) -> None:
        for s in self.streams:
            s.write(text)
            s.flush()


def _resolve_ends(source: Path, good: str, bad: str) -> tuple[str, str]:
    """The commits of --good and --bad; --good must be an ancestor of --bad."""
    good_sha = _git(source, "rev-parse", "--verify", "--quiet", f"{good}^{{commit}}", check=False)
    bad_sha = _git(source, "rev-parse", "--verify", "--quiet", f"{bad}^{{commit}}", check=False)
    for name, rev, sha in (("--good", good, good_sha), ("--bad", bad, bad_sha)):
        if not sha:
            raise BisectError(f"{name} {rev!r} is not a commit of {source}")
    if subprocess.run(["git", "merge-base", "--is-ancestor", good_sha, bad_sha], cwd=source).returncode != 0:
        raise BisectError(f"--good {good} is not an ancestor of --bad {bad}")
    return good_sha, bad_sha


def _step_command(case_path: str | os.PathLike, work: Path, checkout: Path, adapter: str | None, device: str,
                  timeout: float) -> tuple[list[str], dict[str, str], Path]:
    """The replay step `git bisect run` calls (a frozen copy of the harness and of the case), its environment, and
    the harness copy."""
    copy = copy_harness(work / "harness-copy")
    frozen_case = work / "case.json"
    shutil.copyfile(case_path, frozen_case)
    env = dict(os.environ)
    # the step script fixes sys.path itself; PYTHONPATH also reaches anything the kernel starts
    env["PYTHONPATH"] = os.pathsep.join([str(copy), str(checkout)] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop("PYTHONSAFEPATH", None)
    step = [sys.executable, str(copy / "bisect_step.py"), *_replay_args(frozen_case, adapter, device, timeout)]
    return step, env, copy


def _check_ends(source: Path, work: Path, checkout: Path, step: list[str], env: dict[str, str], tee: _Tee,
                ends: dict[str, tuple[str, str]]) -> None:
    """Replay at --bad (must fail) and --good (must pass), both at once, each in its own clone: half the wall time
    of checking them in turn."""
    where = {"bad": checkout, "good": work / "checkout-good"}
    _git(work, "clone", "--quiet", "--shared", "--no-checkout", str(source), str(where["good"]))
    running = {}
    for which, (_, sha) in ends.items():
        _git(where[which], "checkout", "--quiet", "--detach", sha)
        running[which] = subprocess.Popen(step, cwd=where[which], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
    codes = {}
    with _killed_on_abort(*running.values()):
        for which, p in running.items():
            tee.write(p.communicate()[0])
            codes[which] = p.returncode
    for which, want in (("bad", EXIT_FAIL), ("good", EXIT_PASS)):
        code = codes[which]
        if code != want:
            rev, sha = ends[which]
            what = {EXIT_PASS: "passes", EXIT_FAIL: "fails", EXIT_UNTESTABLE: "cannot be tested"}.get(
                code, f"gives exit {code}")
            raise BisectError(f"the case {what} at --{which} {rev} ({sha[:12]}); "
                              + ("nothing to bisect" if which == "bad" else "pick a good commit"))


@contextlib.contextmanager
def _killed_on_abort(*procs: subprocess.Popen) -> Iterator[None]:
    """Kill the processes (each leads its own session: the step, its replay child, the kernel's) when the bisect
    stops early (Ctrl-C, SIGTERM), before their folder is removed."""
    try:
        yield
    except BaseException:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        raise


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit while the bisect runs, so that its clean-up (the temporary folder, the child
    processes) still happens."""
    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _run_bisect(checkout: Path, step: list[str], env: dict[str, str], tee: _Tee, log: Path) -> BisectResult:
    """`git bisect run` with the replay step (started by the caller); its output is teed into the log."""
    proc = subprocess.Popen(["git", "bisect", "run", *step], cwd=checkout, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    output = []
    with _killed_on_abort(proc):
        for line in proc.stdout:
            output.append(line)
            tee.write(line)
        proc.wait()
    bisect_log = _git(checkout, "bisect", "log", check=False)
    tee.write("\n--- git bisect log\n" + bisect_log + "\n")
    result = _parse("".join(output), bisect_log)
    result.log_path = log
    if result.first_bad:
        result.subject = _git(checkout, "log", "-1", "--format=%s", result.first_bad, check=False)
        tee.write(f"first bad commit: {result.first_bad} {result.subject}\n")
    elif result.candidates:
        tee.write("the first bad commit is one of (skipped commits hide it): "
                  + ", ".join(c[:12] for c in result.candidates) + "\n")
    else:
        raise BisectError(f"git bisect run did not name a commit (exit {proc.returncode}); see {log}")
    return result


def bisect(case_path: str | os.PathLike, good: str, bad: str, *, repo: str | os.PathLike | None = None,
           device: str = "auto", adapter: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
           log_path: str | os.PathLike | None = None, check_ends: bool = True, keep: bool = False,
           out: IO[str] | None = None) -> BisectResult:
    """Bisect `repo` between `good` and `bad` for the first commit where the case fails (see the module doc)."""
    case_file = read_case_file(case_path)  # ValueError: not a case
    source = repo_root(repo)
    good_sha, bad_sha = _resolve_ends(source, good, bad)
    case_id = Case.from_dict(case_file.case).case_id
    log = Path(log_path) if log_path else Path("results/local/bisect") / (
        f"{case_id}-{time.strftime('%Y%m%dT%H%M%S')}.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with _terminate_as_exit():
        work = Path(tempfile.mkdtemp(prefix="moe-bisect-"))
        try:
            return _bisect_in(work, case_path, source, case_id, (good, good_sha), (bad, bad_sha), log,
                              adapter=adapter, device=device, timeout=timeout, check_ends=check_ends, out=out)
        finally:
            if keep:
                print(f"kept {work}", file=out or sys.stderr)
            else:
                shutil.rmtree(work, ignore_errors=True)


def _bisect_in(work: Path, case_path: str | os.PathLike, source: Path, case_id: str, good: tuple[str, str],
               bad: tuple[str, str], log: Path, *, adapter: str | None, device: str, timeout: float,
               check_ends: bool, out: IO[str] | None) -> BisectResult:
    checkout = work / "checkout"
    step, env, copy = _step_command(case_path, work, checkout, adapter, device, timeout)
    started = False
    with open(log, "w", encoding="utf-8") as log_fh:
        tee = _Tee(log_fh, out)
        tee.write(f"bisect {case_path} ({case_id}) in {source}: good {good[0]} ({good[1][:12]}), bad {bad[0]} "
                  f"({bad[1][:12]}); harness copy {copy}\n")
        try:
            _git(work, "clone", "--quiet", "--shared", "--no-checkout", str(source), str(checkout))
            _git(checkout, "checkout", "--quiet", "--detach", bad[1])  # a full tree, not a no-checkout index
            if check_ends:
                _check_ends(source, work, checkout, step, env, tee, {"bad": bad, "good": good})
            _git(checkout, "bisect", "start", bad[1], good[1])
            started = True
            return _run_bisect(checkout, step, env, tee, log)
        except BisectError as e:
            log_fh.write(f"error: {e}\n")  # to the log only: the caller reports it (once) to the user
            raise
        finally:
            if started:
                _git(checkout, "bisect", "reset", "--quiet", check=False)


def _parse(run_output: str, bisect_log: str) -> BisectResult:
    """The result from git's own lines: `git bisect log` names the first bad commit; the candidates hidden by skips
    come from git's output, where every line of the steps' own output is indented."""
    m = re.search(r"^# first bad commit: \[([0-9a-f]{40})\]", bisect_log, re.M)
    steps = [(kind, sha) for kind, sha in re.findall(r"^# (good|bad|skip): \[([0-9a-f]{40})\]", bisect_log, re.M)]
    if m:
        return BisectResult(m.group(1), steps=steps)
    m = re.search(r"^The first bad commit could be any of:\n((?:[0-9a-f]{40}\n?)+)", run_output, re.M)
    candidates = m.group(1).split() if m else []
    return BisectResult(None, candidates=candidates, steps=steps)


# -- command line -------------------------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> int:

    try:
        r = bisect(args.case, args.good, args.bad, repo=args.repo, device=args.device, adapter=args.adapter,
                   timeout=args.timeout, log_path=args.log, check_ends=not args.no_check, keep=args.keep,
                   out=None if args.quiet else sys.stderr)
    except (BisectError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if r.first_bad:
        print(f"first bad commit: {r.first_bad} {r.subject}")
    else:
        print("first bad commit is one of (skipped commits hide it): " + " ".join(r.candidates))
    print(f"log: {r.log_path}")
    return r.exit_code


def add_parser(sub: Any) -> None:
    """Add the command to the `python -m harness` subparsers."""
    bi = sub.add_parser("bisect", help="git-bisect the first commit where a case fails",
                        description="Bisect this repository (or --repo, an external kernel's) between --good and "
                        "--bad with `git bisect run` and replay, using a copy of this harness taken first; the "
                        "repository is bisected in a temporary clone, never in place. Exit 0 with the first bad "
                        "commit, 1 when skipped commits hide it, 2 when the bisect cannot be set up.")
    bi.add_argument("case", help="the case file to replay at each commit")
    bi.add_argument("--good", required=True, help="a commit where the case passes")
    bi.add_argument("--bad", required=True, help="a later commit where it fails")
    bi.add_argument("--repo", help="the git repository to bisect (default: the one holding the current directory)")
    bi.add_argument("--adapter", help="adapter to replay (name or module:object) instead of the case file's")
    bi.add_argument("--device", default="auto")
    bi.add_argument("--timeout", type=positive(float), default=300.0,
                    help="per-replay timeout in seconds (default 300)")
    bi.add_argument("--log", help="log file (default results/local/bisect/<case-id>-<time>.log)")
    bi.add_argument("--no-check", action="store_true",
                    help="do not replay at --good and --bad first (they are trusted as given)")
    bi.add_argument("--keep", action="store_true", help="keep the temporary clone and harness copy")
    bi.add_argument("--quiet", action="store_true", help="do not echo the bisect's output (it is still logged)")
    bi.set_defaults(func=run)
