"""`python -m harness matrix`: sweep the adapters on this device, record every verdict, render the support matrix
(or, with --from, render recorded results without running anything)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from harness import __version__
from harness.commands import note_skipped, positive
from harness.core.device import prepare_interpreter

# -- command line -------------------------------------------------------------------------------------------------

DEFAULT_OUT = "docs/SUPPORT_MATRIX.md"


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
        if args.shard:
            words += ["--shard", args.shard]
    if args.out not in (None, DEFAULT_OUT):
        words += ["--out", args.out]
    return shlex.join(words)


def run(args: argparse.Namespace) -> int:
    if args.sources:
        return _render_only(args)
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


def _render_only(args: argparse.Namespace) -> int:
    from harness.store.render import render_files
    from harness.store.results import ResultsFileError

    out = args.out if args.out is not None else DEFAULT_OUT
    try:
        md_path, json_path, n = render_files(args.sources, out, command=_matrix_command(args), on_skip=note_skipped)
    except (ResultsFileError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"rendered {n} verdicts from {len(args.sources)} source(s) into {md_path} and {json_path}")
    return 0


def _sweep_and_render(args: argparse.Namespace, shard: Any, out: str) -> int:
    prepare_interpreter(args.device)
    from harness import registry
    from harness.core.device import detect
    from harness.store.results import new_run_id
    from harness.sweep import VerdictsLost, run_sweep

    try:
        dev = detect(args.device)
        registry.probe_imports(args.adapter)  # an import that ends the process from C code must not end this one
        specs = registry.expand(args.adapter) if args.adapter else [a.name for a in registry.all_adapters()]
        for spec in specs:
            registry.resolve(spec)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    suffix = f"-shard{shard.index}of{shard.count}" if shard else ""
    run_id = args.resume or f"matrix-{dev.generation}-{new_run_id()}{suffix}"
    print(f"moe-harness {__version__}: sweeping {len(specs)} adapter(s) on {dev.generation} ({dev.device_name}), "
          f"profile {args.profile}" + (f", shard {shard}" if shard else ""), file=sys.stderr)
    command = _matrix_command(args)
    try:
        totals = run_sweep(specs, dev, args.results_dir, profile=args.profile, run_id=run_id, jobs=args.jobs,
                           case_timeout=args.case_timeout, command=command, resume=bool(args.resume), shard=shard)
    except ValueError as e:  # --resume of a run that has no results here
        print(f"error: {e}", file=sys.stderr)
        return 2
    except VerdictsLost as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    bad = sum(c["fail"] + c["error"] for c in totals.values())
    run_files = sorted(Path(args.results_dir).glob(f"{run_id}-*.jsonl"))
    print(f"results: {len(run_files)} file(s) {args.results_dir}/{run_id}-*.jsonl "
          f"({sum(sum(c.values()) for c in totals.values())} verdicts)")
    if out and run_files:
        _render_run(args, dev.generation, run_id, run_files, out, command)
    elif shard:
        print(f"shard {shard}: merge the shards' result folders with `python -m harness matrix --from DIR ...`")
    if bad:
        print(f"{bad} case(s) failed or errored: see the reasons in the matrix and in the results", file=sys.stderr)
    return 1 if bad else 0


def _render_run(args: argparse.Namespace, generation: str, run_id: str, run_files: list[Path], out: str,
                command: str) -> None:
    """Render this run, with the other generations' committed results (a CPU run must not drop sm90)."""
    from harness.store.render import render_files

    others = [] if args.only_this_run else committed_other_generations(generation, args.results_dir)
    supplement, extra = ((), ()), []
    if not args.only_this_run:
        supplement, extra = committed_of_missing_libraries(run_files, generation, args.results_dir)
    folders = sorted({os.path.relpath(f.parent) for f in others + extra})
    md_path, json_path, _ = render_files(run_files + others, out, command=command, supplement=supplement,
                                         shown_sources=[f"{args.results_dir}/{run_id}-*.jsonl", *folders])
    print(f"matrix: {md_path} and {json_path}" + (f" (with the committed results of {', '.join(folders)})"
                                                  if folders else ""))


def _committed_matrix_files(results_dir: str, root: str | None) -> list[tuple[Path, str]]:
    """(file, generation in its name) of the matrix result files committed under `root` (default: the repository's
    results/), outside `results_dir` and results/local."""
    import re

    base = Path(root) if root is not None else Path(__file__).resolve().parents[2] / "results"
    if not base.is_dir():
        return []
    skip = {Path(results_dir).resolve(), (base / "local").resolve()}
    found = []
    for f in sorted([*base.rglob("matrix-*.jsonl"), *base.rglob("matrix-*.jsonl.gz")]):
        m = re.match(r"matrix-([a-z0-9]+)-", f.name)
        if m and not any(f.resolve().is_relative_to(d) for d in skip):
            found.append((f, m.group(1)))
    return found


def committed_of_missing_libraries(run_files: list[Path], generation: str, results_dir: str,
                                   root: str | None = None) -> tuple[tuple[list, list], list[Path]]:
    """The committed results of this generation for the adapters whose library this run did not have (every case
    `not-installed`): a machine without vLLM keeps the committed vLLM rows. ((results, metadata), files read)."""
    from harness.store.results import load

    mine, _ = load(run_files, strict=False)
    adapters = {r.adapter for r in mine if r.verdict == "not-installed"}
    adapters -= {r.adapter for r in mine if r.verdict != "not-installed"}
    if not adapters:
        return ((), ()), []
    files = [f for f, g in _committed_matrix_files(results_dir, root) if g == generation]
    results, meta = load(files, strict=False)
    results = [r for r in results if r.adapter in adapters]
    meta = [m for m in meta if m.get("kind") != "adapter" or m.get("adapter") in adapters]
    return (results, meta), (files if results else [])


def committed_other_generations(generation: str, results_dir: str, root: str | None = None) -> list:
    """Matrix result files committed under `root` (default: the repository's results/) for generations other
    than `generation`, outside `results_dir` and results/local: what a fresh sweep's rendering merges in."""
    return [f for f, g in _committed_matrix_files(results_dir, root) if g != generation]


def add_parser(sub: Any) -> None:
    """Add the command to the `python -m harness` subparsers."""
    m = sub.add_parser("matrix", help="run the sweep on this device, record every verdict, render the matrix",
                       description="Sweep every adapter over its feature cells on this device (worker processes, "
                       "a per-case timeout), record every verdict, and render the support matrix (markdown and "
                       "JSON). With --from, render from existing result files without running anything.")
    m.add_argument("--device", default="auto", help="auto (default), cpu, cuda or cuda:N")
    m.add_argument("--profile", default="quick", choices=["quick", "full"],
                   help="quick: all cells of small ops, a pairwise covering set of large ones, 2 cases per cell; "
                   "full: every cell, up to 6 cases per cell")
    m.add_argument("--adapter", action="append", default=[],
                   help="only this adapter (repeatable; module:object ok; 'external': the third-party libraries' "
                   "adapters)")
    m.add_argument("--from", dest="sources", nargs="+", metavar="RESULTS",
                   help="render from these result files/folders (several generations merge); runs nothing")
    m.add_argument("--out", default=None,
                   help=f"markdown output (the JSON goes next to it, .json; default {DEFAULT_OUT}, none for a "
                        "--shard run); '' to skip rendering")
    m.add_argument("--shard", metavar="K/N",
                   help="run shard K of N (1 <= K <= N): a deterministic 1/N of the cells, the same on every machine; "
                        "merge the shards' results with --from")
    m.add_argument("--results-dir", default="results/local", help="where the JSONL results are written")
    m.add_argument("--resume", metavar="RUN_ID",
                   help="continue an interrupted sweep (e.g. matrix-sm90-20261121T074027-fa1972, the prefix of its "
                        "result files in --results-dir): cases it already judged are not run again")
    m.add_argument("--only-this-run", action="store_true",
                   help="render only this sweep's results (default: also the committed results under results/ of "
                        "the other generations, so a CPU run keeps the GPU columns)")
    m.add_argument("--jobs", type=positive(int), default=None,
                   help="worker processes (default: the CPU count; on CUDA six per GPU, at most the CPU count)")
    m.add_argument("--case-timeout", type=positive(float), default=300.0,
                   help="seconds one case may run before its worker is killed and the case marked (default 300)")
    m.set_defaults(func=run)
