"""`python -m harness matrix`: sweep the adapters on this device, record every verdict, render the support matrix
(or, with --from, render recorded results without running anything)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

from harness import __version__
from harness.commands import SkippedFiles, positive
from harness.core.device import LISTING_DEVICE, prepare_interpreter
from harness.core.sweep_args import PROFILES

# -- command line -------------------------------------------------------------------------------------------------

#: git-ignored: a run never rewrites the committed matrix (docs/SUPPORT_MATRIX.md is rendered on purpose, with --out)
DEFAULT_OUT = "results/local/SUPPORT_MATRIX.md"


def _matrix_command(args: argparse.Namespace) -> str:
    """The command line that regenerates the content (shown in the rendered header). Where it is written is left
    out: the same results rendered anywhere give the same files."""
    import shlex

    words = ["python", "-m", "harness", "matrix"]
    if args.sources:
        words += ["--from", *args.sources]
        if args.history:
            words += ["--history"]
    else:
        if args.device != "auto":
            words += ["--device", args.device]
        words += ["--profile", args.profile]
        for a in args.adapter:
            words += ["--adapter", a]
        if args.shard:
            words += ["--shard", args.shard]
        if args.only_this_run:
            words += ["--only-this-run"]
        if args.history:
            words += ["--history"]
    return shlex.join(words)


def _left_out(note: str) -> None:
    print(note, file=sys.stderr)


def _results_dir_problem(path: str) -> str | None:
    """Why `--results-dir` cannot hold results (None when it can: a folder, or one that can be made)."""
    if os.path.isdir(path):
        return None
    if os.path.lexists(path):
        return f"--results-dir {path!r} is not a folder (a file or a dangling link is there): name a folder"
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        return f"--results-dir {path!r} cannot be made: {e.strerror or e}"
    return None


def _resume_problem(args: argparse.Namespace) -> str | None:
    from harness.sweep import check_run_id, judged_before

    try:
        check_run_id(args.resume)
        judged_before(args.results_dir, args.resume, args.drop_bad_lines)
    except ValueError as e:
        return str(e)
    return None


def run(args: argparse.Namespace) -> int:
    if args.sources:
        return _render_only(args)
    if (problem := _results_dir_problem(args.results_dir)) is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.drop_bad_lines and not args.resume:
        print("error: --drop-bad-lines is an option of --resume RUN_ID", file=sys.stderr)
        return 2
    if args.resume and (problem := _resume_problem(args)) is not None:  # before any worker or host is started
        print(f"error: {problem}", file=sys.stderr)
        return 2
    shard = None
    if args.shard:
        from harness.sweep import Shard

        try:
            shard = Shard.parse(args.shard)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    out = args.out if args.out is not None else ("" if shard else DEFAULT_OUT)
    return _sweep_and_render(args, shard, out)


def _note_kept(kept: list[Path]) -> None:
    folder = os.path.relpath(kept[0].parent)
    print(f"note: kept {len(kept)} case file(s) in {folder} that an earlier render wrote and this one does not list: "
          "they are committed, or git could not tell (`git rm` them if this matrix is to be committed)",
          file=sys.stderr)


def _render_only(args: argparse.Namespace) -> int:
    from harness.store.render import render_files
    from harness.store.results import ResultsFileError

    out = args.out if args.out is not None else DEFAULT_OUT
    skipped = SkippedFiles(args.verbose)
    try:
        md_path, json_path, n = render_files(args.sources, out, command=_matrix_command(args), on_skip=skipped,
                                             on_kept=_note_kept, history=args.history, on_left_out=_left_out)
    except (ResultsFileError, ValueError) as e:
        skipped.report()
        print(f"error: {e}", file=sys.stderr)
        return 2
    skipped.report()
    print(f"rendered {n} verdicts from {len(args.sources)} source(s) into {md_path} and {json_path}")
    return 0


def _sweep_and_render(args: argparse.Namespace, shard: Any, out: str) -> int:
    started = time.monotonic()
    from harness.engine import fork_server

    fork_server.start_early()  # its torch import beside this process's (prepare_interpreter), not after it
    from harness.engine import early_probe

    early = early_probe.start(list(args.adapter or []))  # the import probe, beside them too
    prepare_interpreter(args.device)
    from harness.engine import sandbox
    from harness.engine.host import Host, HostDied

    # read-only to every kernel host of the run, the planner's included (started before the sweep)
    sandbox.protect(args.results_dir, *([os.path.dirname(os.path.abspath(out))] if out else []))

    # listed in a host (which probes the imports first: one that ends the process from C code is named), so that
    # this process, which renders the verdicts, never imports an adapter module; the sweep plans in the same host
    planner = Host(LISTING_DEVICE)
    # the run id and device, once chosen (what an interrupt's message needs), and what each part of the start took
    begun: dict[str, Any] = {"startup": {"preparing": time.monotonic() - started}}
    t0 = time.monotonic()
    with contextlib.suppress(HostDied):  # its start (torch) overlaps the device's; a failed one is reported when asked
        planner.start()
    begun["startup"]["the planner's start"] = time.monotonic() - t0
    try:
        return _sweep_with(args, shard, out, started, planner, begun, early)
    except KeyboardInterrupt as e:
        from harness.sweep import SweepInterrupted

        if isinstance(e, SweepInterrupted) or "run_id" not in begun:
            raise
        raise SweepInterrupted(_stopped_early(args, shard, begun, str(e) or "SIGINT")) from None
    finally:
        planner.close()
        if early is not None:
            early.cancel()


def _stopped_early(args: argparse.Namespace, shard: Any, begun: dict[str, Any], how: str) -> str:
    """What an interrupt before the judging says: how many cases were judged, and the command that continues the run
    (its results file is made now when it was stopped before its planning, so that the command works)."""
    from harness.sweep import open_run

    run_id = begun["run_id"]
    judged = open_run(args.results_dir, run_id, begun["device"], args.profile, _matrix_command(args), shard)
    what = f"{judged} case(s) judged so far" if judged else "nothing was judged"
    return (f"the sweep was stopped ({how}) before its judging began; {what}; the same command with --resume {run_id} "
            "continues it")


def _sweep_with(args: argparse.Namespace, shard: Any, out: str, started: float, planner: Any,
                begun: dict[str, Any], early: Any) -> int:
    from harness.core.device import detect
    from harness.engine import remote
    from harness.store.results import new_run_id
    from harness.sweep import UNPLANNED, VerdictsLost, default_jobs, run_sweep, worker_pool
    from harness.sweep import run_files as sweep_files
    from harness.sweep.progress import duration

    pool = None
    startup = begun["startup"]
    try:
        t0 = time.monotonic()
        dev = detect(args.device)
        startup["the device"] = time.monotonic() - t0
        suffix = f"-shard{shard.index}of{shard.count}" if shard else ""
        run_id = args.resume or f"matrix-{dev.generation}-{new_run_id()}{suffix}"
        begun.update(run_id=run_id, device=dev)
        if not args.adapter:  # every adapter: a worker per job, started now so that their start overlaps the listing
            t0 = time.monotonic()
            pool = worker_pool(dev, args.results_dir, run_id, args.jobs, args.case_timeout,
                               start=args.jobs or default_jobs(dev))
            startup["starting the workers"] = time.monotonic() - t0
        listed = time.monotonic()
        probed = early.output() if early is not None else None
        specs = remote.expand(list(args.adapter or []), probe=True, host=planner, early=probed).specs
        listed = time.monotonic() - listed
    except (ValueError, remote.HostError, KeyboardInterrupt) as e:
        if pool is not None:
            pool.stop(kill=True)
        if isinstance(e, KeyboardInterrupt):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"moe-harness {__version__}: sweeping {len(specs)} adapter(s) on {dev.generation} ({dev.device_name}), "
          f"profile {args.profile}" + (f", shard {shard}" if shard else ""), file=sys.stderr)
    if dev.generation == "interp":
        from harness.engine.interpreter import version_notice

        if notice := version_notice():
            print(notice, file=sys.stderr)
    command = _matrix_command(args)
    ahead = _committed_ahead(args) if out else None
    sweep_started = time.monotonic()
    try:
        totals = run_sweep(specs, dev, args.results_dir, profile=args.profile, run_id=run_id, jobs=args.jobs,
                           case_timeout=args.case_timeout, command=command, resume=bool(args.resume), shard=shard,
                           planner=planner, pool=pool, drop_bad_lines=args.drop_bad_lines,
                           on_planned=ahead.start if ahead is not None else None)
    except ValueError as e:  # --resume of a run that has no results here
        print(f"error: {e}", file=sys.stderr)
        return 2
    except VerdictsLost as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    bad = sum(c["fail"] + c["error"] for c in totals.values())
    unplanned = sorted(name for name, c in totals.items() if c[UNPLANNED])
    judged = sum(n for c in totals.values() for k, n in c.items() if k != UNPLANNED)
    swept = time.monotonic() - sweep_started
    run_files = sweep_files(args.results_dir, run_id)
    print(f"results: {len(run_files)} file(s) {args.results_dir}/{run_id}-*.jsonl ({judged} verdicts)")
    rendered = time.monotonic()
    if out and run_files:
        _render_run(args, run_id, run_files, out, command, ahead)
    elif shard:
        print(f"shard {shard}: merge the shards' result folders with `python -m harness matrix --from DIR ...`")
    rendered = time.monotonic() - rendered
    if bad:
        print(f"{bad} case(s) failed or errored: see the reasons in the matrix and in the results", file=sys.stderr)
    if unplanned:
        print(f"{len(unplanned)} adapter(s) could not be planned, so none of their cases was judged: "
              f"{', '.join(unplanned)} (why: above, and in the results)", file=sys.stderr)
    wall = time.monotonic() - started
    other = wall - swept - listed - rendered
    parts = [f"{s:.1f}s {what}" for what, s in startup.items() if s >= 0.05]
    print(f"judged {judged} cases in {duration(wall)} ({swept:.1f}s planning and judging, {listed:.1f}s listing the "
          f"adapters, {rendered:.1f}s rendering, {other:.1f}s other" + (f": {', '.join(parts)}" if parts else "")
          + ")")
    return 1 if bad or unplanned else 0


def _committed_ahead(args: argparse.Namespace) -> Any:
    """A read of the committed results the render will add, to start once the sweep is planned (None: none)."""
    from harness.store.read_ahead import ReadAhead

    others = [] if args.only_this_run else committed_results(args.results_dir)
    return ReadAhead(others, history=args.history) if others else None


def _render_run(args: argparse.Namespace, run_id: str, run_files: list[Path], out: str, command: str,
                ahead: Any = None) -> None:
    """Render this run with every committed result (the same files `--from` reads in the committed matrix's
    command): a run on one device never drops another's columns, and on its own generation it is the latest run of
    the kernels it swept, so their cells show it (a verdict judged on another Triton interpreter is shown apart).
    `ahead`: those files read while the sweep judged (`harness.store.read_ahead`), used while they are unchanged."""
    from harness.store.render import render_files

    others = [] if args.only_this_run else committed_results(args.results_dir)
    skipped = SkippedFiles(args.verbose)
    folders = committed_folders(others)
    md_path, json_path, _ = render_files(run_files + others, out, command=command, on_skip=skipped,
                                         on_kept=_note_kept, history=args.history, on_left_out=_left_out,
                                         shown_sources=[f"{args.results_dir}/{run_id}-*.jsonl", *folders],
                                         ahead=ahead)
    skipped.report()
    print(f"matrix: {md_path} and {json_path}" + (f" (with the committed results of {', '.join(folders)})"
                                                  if folders else ""))


def _results_root(root: str | os.PathLike | None) -> Path:
    return Path(root) if root is not None else Path(__file__).resolve().parents[2] / "results"


def committed_results(results_dir: str, root: str | os.PathLike | None = None) -> list[Path]:
    """Every result file committed under `root` (default: the repository's results/), of every generation and
    kind (sweeps, the pytest plugin's verdicts; .jsonl and .jsonl.gz), outside `results_dir` and outside folders
    named `local` (git-ignored: runs of this machine)."""
    from harness.store.results import result_files

    base = _results_root(root)
    if not base.is_dir():
        return []
    mine = Path(results_dir).resolve()
    return [f for f in result_files([base]) if "local" not in f.relative_to(base).parts[:-1]
            and not f.resolve().is_relative_to(mine)]


def committed_folders(files: list[Path], root: str | os.PathLike | None = None) -> list[str]:
    """The top folders under results/ that hold `files` (results/interp, results/sm90), as a user would name them."""
    base = _results_root(root)
    return sorted({os.path.relpath(base / f.relative_to(base).parts[0]) for f in files})


def add_parser(sub: Any) -> None:
    """Add the command to the `python -m harness` subparsers."""
    m = sub.add_parser("matrix", help="run the sweep on this device, record every verdict, render the matrix",
                       description="Sweep every adapter over its feature cells on this device (worker processes, "
                       "a per-case timeout), record every verdict, and render the support matrix (markdown and "
                       "JSON). With --from, render from existing result files without running anything.")
    m.add_argument("--device", default="auto", help="auto (default), cpu, cuda or cuda:N")
    m.add_argument("--profile", default="quick", choices=PROFILES,
                   help="quick: all cells of small ops, a pairwise covering set of large ones, 2 cases per cell; "
                   "full: every cell, up to 6 cases per cell")
    m.add_argument("--adapter", action="append", default=[],
                   help="only this adapter (repeatable; module:object ok; 'external': the third-party libraries' "
                   "adapters)")
    m.add_argument("--from", dest="sources", nargs="+", metavar="RESULTS",
                   help="render from these result files/folders (several generations merge); runs nothing")
    m.add_argument("--out", default=None,
                   help=f"markdown output (the JSON goes next to it, .json, the failing cases' files in "
                        f"<name>.cases/; default {DEFAULT_OUT}, none for a --shard run; docs/SUPPORT_MATRIX.md is the "
                        "committed one); '' to skip rendering")
    m.add_argument("--shard", metavar="K/N",
                   help="run shard K of N (1 <= K <= N): a deterministic 1/N of the cells, the same on every machine; "
                        "merge the shards' results with --from")
    m.add_argument("--results-dir", default="results/local", help="where the JSONL results are written")
    m.add_argument("--resume", metavar="RUN_ID",
                   help="continue an interrupted sweep (e.g. matrix-sm90-20261121T074027-fa1972, the prefix of its "
                        "result files in --results-dir): cases it already judged are not run again")
    m.add_argument("--drop-bad-lines", action="store_true",
                   help="with --resume: lines of the run's file that do not match its manifest (edited, corrupt, "
                        "added by someone else) are left out (kept in the file, excluded by its manifest) and their "
                        "cases judged again; without it such a file is refused (exit 2)")
    m.add_argument("--only-this-run", action="store_true",
                   help="render only this sweep's results (default: also every committed result under results/, "
                        "so a CPU run keeps the GPU columns)")
    m.add_argument("--history", action="store_true",
                   help="render every run of the results, not only each kernel's latest complete run per generation "
                        "(a cell that mixes runs says so)")
    m.add_argument("--verbose", action="store_true", help="list the files of result folders that hold no verdicts")
    m.add_argument("--jobs", type=positive(int), default=None,
                   help="worker processes (default: the CPU count; on CUDA at most 16 per GPU; at most "
                   "MOE_HARNESS_JOBS where it is set, as the pytest plugin does for the sweeps its tests start)")
    m.add_argument("--case-timeout", type=positive(float), default=300.0,
                   help="seconds one case may run before its worker is killed and the case marked (default 300)")
    m.set_defaults(func=run)
