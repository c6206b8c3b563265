"""`python -m harness`: verify MoE kernels against the reference oracle.

Commands:
  matrix   run the deterministic sweep on this device and record every verdict
  replay   re-run one case file and print its verdict (exit 0 pass, 1 fail, 125 cannot test here)
  diff     the cells whose verdict differs between two result sets
  bisect   git-bisect the first commit where a case fails (this repository or an external kernel's)
  bench    time the oracle (and, as they land, the kernels) on this device
  golden   check or regenerate the committed golden vectors
"""

from __future__ import annotations

import argparse
import os
import sys

from harness import __version__


def _prepare_device(device: str) -> None:
    """Choose the Triton interpreter before any kernel module imports triton, when no GPU will be used."""
    if os.environ.get("TRITON_INTERPRET") is not None:
        return
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        return
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def _unverifiable() -> set[str]:
    from harness.interpreter import unverifiable_here

    return unverifiable_here()


def _matrix_command(args: argparse.Namespace) -> str:
    """The command line that regenerates the output (shown in the rendered header)."""
    import shlex

    words = ["python", "-m", "harness", "matrix"]
    if args.sources:
        words += ["--from", *args.sources]
    else:
        if args.device != "auto":
            words += ["--device", args.device]
        words += ["--profile", args.profile]
        for a in args.adapter:
            words += ["--adapter", a]
    if args.out != "docs/SUPPORT_MATRIX.md":
        words += ["--out", args.out]
    return shlex.join(words)


def _cmd_matrix(args: argparse.Namespace) -> int:
    command = _matrix_command(args)
    if args.sources:
        from harness.render import render_files
        from harness.results import ResultsFileError

        try:
            md_path, json_path, n = render_files(args.sources, args.out, command=command)
        except (ResultsFileError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"rendered {n} verdicts from {len(args.sources)} source(s) into {md_path} and {json_path}")
        return 0

    _prepare_device(args.device)
    from harness import adapters
    from harness.device import detect
    from harness.sweep import run_sweep

    try:
        dev = detect(args.device)
        specs = list(args.adapter) or [a.name for a in adapters.all_adapters()]
        for spec in specs:
            adapters.resolve(spec)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from harness.results import new_run_id

    run_id = args.resume or f"matrix-{dev.generation}-{new_run_id()}"
    print(f"moe-harness {__version__}: sweeping {len(specs)} adapter(s) on {dev.generation} ({dev.device_name}), "
          f"profile {args.profile}", file=sys.stderr)
    try:
        totals = run_sweep(specs, dev, args.results_dir, profile=args.profile, run_id=run_id, jobs=args.jobs,
                           case_timeout=args.case_timeout, command=command, resume=bool(args.resume))
    except ValueError as e:  # --resume of a run that has no results here
        print(f"error: {e}", file=sys.stderr)
        return 2
    bad = sum(c["fail"] + c["error"] for c in totals.values())
    from pathlib import Path

    from harness.render import render_files

    run_files = sorted(Path(args.results_dir).glob(f"{run_id}-*.jsonl"))
    print(f"results: {len(run_files)} file(s) {args.results_dir}/{run_id}-*.jsonl "
          f"({sum(sum(c.values()) for c in totals.values())} verdicts)")
    if args.out and run_files:
        # The rendered matrix keeps the other generations' committed results (a CPU run must not drop sm90)
        others = [] if args.only_this_run else committed_other_generations(dev.generation, args.results_dir)
        folders = sorted({os.path.relpath(f.parent) for f in others})
        md_path, json_path, _ = render_files(run_files + others, args.out, command=command,
                                             shown_sources=[f"{args.results_dir}/{run_id}-*.jsonl", *folders])
        print(f"matrix: {md_path} and {json_path}" + (f" (with the committed results of {', '.join(folders)})"
                                                      if folders else ""))
    if bad:
        print(f"{bad} case(s) failed or errored: see the reasons in the matrix and in the results", file=sys.stderr)
    return 1 if bad else 0


def committed_other_generations(generation: str, results_dir: str, root: str | None = None) -> list:
    """Matrix result files committed under `root` (default: the repository's results/) for generations other
    than `generation`, outside `results_dir` and results/local: what a fresh sweep's rendering merges in."""
    import re
    from pathlib import Path

    base = Path(root) if root is not None else Path(__file__).resolve().parent.parent / "results"
    skip = {Path(results_dir).resolve(), (base / "local").resolve()}
    found = []
    for f in sorted(base.rglob("matrix-*.jsonl")) if base.is_dir() else []:
        if any(f.resolve().is_relative_to(d) for d in skip):
            continue
        m = re.match(r"matrix-([a-z0-9]+)-", f.name)
        if m and m.group(1) != generation:
            found.append(f)
    return found


def _cmd_replay(args: argparse.Namespace) -> int:
    from harness.replay import EXIT_BAD_FILE, describe, read_case_file, replay

    try:
        case_file = read_case_file(args.case, validate=False)  # the child validates it (keeps torch out of here)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_FILE
    # the case runs in a child process: a crash or hang of the kernel becomes a fail, never this process's death
    outcome = replay(case_file, adapter=args.adapter, device=args.device, timeout=args.timeout)
    print(describe(outcome, case_file), flush=True)
    return outcome.exit_code


def _cmd_diff(args: argparse.Namespace) -> int:
    from harness.diff import diff, load_side, to_markdown
    from harness.results import ResultsFileError

    try:
        a, b = load_side(args.a), load_side(args.b)
        for side, path in ((a, args.a), (b, args.b)):
            if not side.results:  # an empty or wholly unreadable side would make "no cell differs" a lie
                raise ResultsFileError(f"no results in {path}")
    except (ResultsFileError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    d = diff(a, b)
    text = to_markdown(d, cases_dir=args.cases_dir, list_all=args.all)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(f"wrote {args.out}: {len(d.differing)} cell(s) differ")
    else:
        print(text, end="")
    return 1 if d.differing else 0


def _cmd_bisect(args: argparse.Namespace) -> int:
    from harness.bisect import BisectError, bisect

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


def _cmd_bench(args: argparse.Namespace) -> int:
    _prepare_device(args.device)
    from harness.bench import SHAPES, main_bench

    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.op not in ("reference-experts",) and args.shape == []:
        return main_bench(args.op, device, [])
    unknown = [s for s in args.shape if s not in SHAPES]
    if unknown:
        print(f"error: unknown shape(s) {unknown}; known: {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    return main_bench(args.op, device, args.shape or ["deepseek-v3"])


def _cmd_golden(args: argparse.Namespace) -> int:
    from harness import golden

    known = golden.cases()
    names = args.names or list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"error: unknown golden case(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    bad = 0
    for name in names:
        if args.regenerate:
            print(f"wrote {golden.write(name)}")
            continue
        try:
            problems = golden.mismatches(name)
        except FileNotFoundError as e:
            problems = [str(e)]
        bad += bool(problems)
        print(f"{'ok  ' if not problems else 'DIFF'} {name}" + (f": {'; '.join(problems)}" if problems else ""))
    return 1 if bad else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"moe-harness {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    m = sub.add_parser("matrix", help="run the sweep on this device, record every verdict, render the matrix",
                       description="Sweep every adapter over its feature cells on this device (worker processes, "
                       "a per-case timeout), record every verdict, and render the support matrix (markdown and "
                       "JSON). With --from, render from existing result files without running anything.")
    m.add_argument("--device", default="auto", help="auto (default), cpu, cuda or cuda:N")
    m.add_argument("--profile", default="quick", choices=["quick", "full"],
                   help="quick: all cells of small ops, a pairwise covering set of large ones, 2 cases per cell; "
                   "full: every cell, up to 6 cases per cell")
    m.add_argument("--adapter", action="append", default=[], help="only this adapter (repeatable; module:object ok)")
    m.add_argument("--from", dest="sources", nargs="+", metavar="RESULTS",
                   help="render from these result files/folders (several generations merge); runs nothing")
    m.add_argument("--out", default="docs/SUPPORT_MATRIX.md",
                   help="markdown output (the JSON goes next to it, .json); '' to skip rendering")
    m.add_argument("--results-dir", default="results/local", help="where the JSONL results are written")
    m.add_argument("--resume", metavar="RUN_ID",
                   help="continue an interrupted sweep (e.g. matrix-sm90-20261121T074027-fa1972, the prefix of its "
                        "result files in --results-dir): cases it already judged are not run again")
    m.add_argument("--only-this-run", action="store_true",
                   help="render only this sweep's results (default: also the committed results under results/ of "
                        "the other generations, so a CPU run keeps the GPU columns)")
    m.add_argument("--jobs", type=int, default=None,
                   help="worker processes (default: the CPU count; on CUDA six per GPU, at most the CPU count)")
    m.add_argument("--case-timeout", type=float, default=300.0,
                   help="seconds one case may run before its worker is killed and the case marked (default 300)")
    m.set_defaults(func=_cmd_matrix)

    r = sub.add_parser("replay", help="re-run one case file; exit 0 pass, 1 fail, 125 cannot test here")
    r.add_argument("case", help="a case JSON file (a Case, or a result record holding one)")
    r.add_argument("--adapter", help="run this adapter (name or module:object) instead of the case file's")
    r.add_argument("--device", default="auto")
    r.add_argument("--timeout", type=float, default=300.0,
                   help="seconds before a hanging kernel is killed and the case failed (default 300)")
    r.set_defaults(func=_cmd_replay)

    d = sub.add_parser("diff", help="cells whose verdict differs between two result sets (markdown)",
                       description="Compare two result sets (files or folders: two generations, two commits) "
                       "cell by cell; print the differing cells as a markdown table with the case files to replay. "
                       "Exit 0 when none differ, 1 when some do, 2 for an unreadable input.")
    d.add_argument("a", help="results A (a JSONL file or a folder)")
    d.add_argument("b", help="results B (a JSONL file or a folder)")
    d.add_argument("--cases-dir", default="results/local/diff-cases",
                   help="where case files are written for failing cases that have none next to their results")
    d.add_argument("--all", action="store_true", help="also list cells run on one side only")
    d.add_argument("--out", help="write the markdown here instead of printing it")
    d.set_defaults(func=_cmd_diff)

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
    bi.add_argument("--timeout", type=float, default=300.0, help="per-replay timeout in seconds (default 300)")
    bi.add_argument("--log", help="log file (default results/local/bisect/<case-id>-<time>.log)")
    bi.add_argument("--no-check", action="store_true",
                    help="do not replay at --good and --bad first (they are trusted as given)")
    bi.add_argument("--keep", action="store_true", help="keep the temporary clone and harness copy")
    bi.add_argument("--quiet", action="store_true", help="do not echo the bisect's output (it is still logged)")
    bi.set_defaults(func=_cmd_bisect)

    b = sub.add_parser("bench", help="time kernels (or the oracle) on this device")
    b.add_argument("--op", required=True, help="what to time: an op (routing, group_quant, ...) or reference-experts")
    b.add_argument("--device", default="auto")
    b.add_argument("--shape", action="append", default=[], help="model shape(s): deepseek-v3, mixtral-tp2, ...")
    b.set_defaults(func=_cmd_bench)

    g = sub.add_parser("golden", help="check or regenerate the committed golden vectors")
    g.add_argument("names", nargs="*", help="golden case names (default: all)")
    g.add_argument("--regenerate", action="store_true", help="recompute and overwrite the stored files")
    g.set_defaults(func=_cmd_golden)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    return int(args.func(args))
