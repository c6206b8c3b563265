"""`python -m harness differential`: every Triton kernel's quick-matrix cases judged by Triton's interpreter on the
CPU and compiled on this machine's GPU, on the same inputs; the outputs compared bit for bit, the verdicts side by
side, every case classified (`harness.sweep.differential.CLASSES`). A CPU verdict means something about the GPU
only where the two agree: a case the interpreter fails and the GPU passes is a fidelity defect candidate, the
reverse a code path the CPU run never took (or a declaration that does not hold on the device)."""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.commands import positive
from harness.core.device import LISTING_DEVICE, cuda_absent
from harness.core.sweep_args import PROFILES

#: hidden test mode: JSON {"interp": {VAR: value|null}, "gpu": {...}}: both sides run on the interpreter, each host
#: with these variables set (null: removed); no GPU needed
TEST_SIDES_ENV = "MOE_HARNESS_DIFFERENTIAL_SIDES"
#: the cases of one adapter a worker is sent at a time, at most
CHUNK_MAX = 4


def _no_gpu(why: str) -> int:
    print(f"error: differential compares the interpreter with compiled kernels and needs a CUDA GPU: {why}",
          file=sys.stderr)
    return 2


def _test_overlays() -> dict[str, dict[str, str | None]] | None:
    raw = os.environ.get(TEST_SIDES_ENV, "").strip()
    if not raw:
        return None
    found = json.loads(raw)
    if not isinstance(found, dict) or set(found) - {"interp", "gpu"}:
        raise ValueError(f"{TEST_SIDES_ENV}: expected a JSON object with the keys interp and gpu")
    return {k: dict(found.get(k) or {}) for k in ("interp", "gpu")}


#: the interpreter side's environment: GPUs hidden, so that a library that picks its code path by the device it sees
#: (a capability check, `torch.cuda.is_available()`) takes the path it takes on a CPU-only machine, whose verdicts
#: this run confirms
INTERP_ENV = (("TRITON_INTERPRET", "1"), ("CUDA_VISIBLE_DEVICES", ""))


def make_sides(overlays: Mapping[str, Mapping[str, str | None]] | None) -> tuple[Any, Any]:
    """(interpreter side, GPU side); with test `overlays`, two interpreter sides with those environments."""
    import dataclasses

    from harness.core.device import detect
    from harness.sweep.differential import Side

    interp_dev = dataclasses.replace(detect("cpu"), generation="interp")
    if overlays is None:
        gpu_dev = detect("cuda")
        return (Side("interp", "cpu", interp_dev, INTERP_ENV, "interp"),
                Side("gpu", gpu_dev.device, gpu_dev, (("TRITON_INTERPRET", None),), gpu_dev.generation))
    sides = []
    for key in ("interp", "gpu"):
        env = {"TRITON_INTERPRET": "1", **overlays[key]}
        sides.append(Side(key, "cpu", interp_dev, tuple(env.items()), f"{key} (test)"))
    return sides[0], sides[1]


def run(args: argparse.Namespace) -> int:
    try:
        overlays = _test_overlays()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if overlays is None and (why := cuda_absent()):
        return _no_gpu(why)
    import torch

    if overlays is None and not torch.cuda.is_available():
        return _no_gpu("torch sees no CUDA device")
    from harness.engine.host import Host

    sides = make_sides(overlays)
    planner = Host(LISTING_DEVICE)  # lists and plans the adapters: this process never imports an adapter module
    try:
        work, skipped = _plan(args, sides, planner)
    except (ValueError, RuntimeError) as e:  # an adapter name that names nothing; the listing host died
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        planner.close()
    if not work:
        print("error: no Triton adapter to compare" + "".join(f"\n  {n}: {w}" for n, w in skipped.items()),
              file=sys.stderr)
        return 2
    return _run_and_report(args, sides, work, skipped)


# -- which adapters and cases ---------------------------------------------------------------------------------------

def triton_kind(manifest: Mapping[str, Any], named: bool) -> str:
    """Why an adapter is not compared ("" when it is): a Triton kernel runs on `interp` and on a GPU generation;
    without --adapter, only this repository's kernels (kernels/adapters/, third-party ones in its external/) and no
    test aids."""
    gens = list(manifest.get("generations") or ())
    if "interp" not in gens or not any(g.startswith("sm") for g in gens):
        return f"not a Triton kernel (generations {', '.join(gens)})"
    if named:
        return ""
    if not str(manifest.get("module") or "").startswith("kernels.adapters."):
        return "not one of kernels/adapters/ (name it with --adapter)"
    if manifest.get("test_aid"):
        return "a test aid, not a production kernel"
    return ""


def _plan(args: argparse.Namespace, sides: Sequence[Any], planner: Any) -> tuple[list[tuple[str, list]], dict]:
    """[(spec, cases)] of the adapters compared, and {name: why} of those that are not."""
    from harness.engine import remote, runner
    from harness.sweep import plan

    catalog = remote.expand(list(args.adapter or []), probe=True, host=planner)
    work, skipped = [], {}
    for spec, name in zip(catalog.specs, catalog.names):
        if why := triton_kind(catalog.manifests.get(name, {}), bool(args.adapter)):
            if args.adapter:  # without it, the other kernels are simply not Triton ones
                skipped[name] = why
            continue
        try:
            adapter = remote.open_adapter(spec, "cpu", host=planner)
            planned = plan(adapter, args.profile).cases
        except (ValueError, remote.HostError) as e:  # an op without a spec, a boundary() that raises
            skipped[name] = f"cannot plan its cases: {e}"
            continue
        away = {s.name: w[1] for s in sides if (w := runner.turned_away_whole(adapter, s.device))}
        if away:  # not installed (one reason for both sides), or not for one side's generation
            reasons = set(away.values())
            one = len(away) == len(sides) and len(reasons) == 1
            skipped[name] = reasons.pop() if one else "; ".join(f"{k}: {v}" for k, v in away.items())
            continue
        cases = [c for c in planned if adapter.claims(c.features)]
        if args.max_cases and len(cases) > args.max_cases:
            step = len(cases) / args.max_cases  # spread over the cells, the same ones every run
            cases = [cases[int(i * step)] for i in range(args.max_cases)]
        if cases:
            work.append((spec, cases))
        else:
            skipped[name] = "no declared cell in this profile"
    return work, skipped


# -- running and reporting ----------------------------------------------------------------------------------------

def _out_dir(args: argparse.Namespace, gpu: Any) -> tuple[str, Path]:
    from harness.store.results import new_run_id

    run_id = f"differential-{gpu.device.generation}-{new_run_id()}"
    out = Path(args.out) if args.out else Path("results") / gpu.device.generation / "differential" / run_id
    out.mkdir(parents=True, exist_ok=True)
    return run_id, out


def _chunks(work: Sequence[tuple[str, list]], jobs: int) -> list[tuple[str, list]]:
    """Each adapter's cases cut into chunks, so that every worker gets a share of each adapter in turn."""
    found = []
    for spec, cases in work:
        size = max(1, min(CHUNK_MAX, math.ceil(len(cases) / jobs)))
        found += [(spec, cases[i:i + size]) for i in range(0, len(cases), size)]
    return found


class _Report:
    """The run's records as they come: the JSONL and its manifest (as a results file's: a reader uses only the lines
    it vouches for), the counts, the progress lines."""

    def __init__(self, out: Path, total: int, run_id: str):
        from harness.store import manifest
        from harness.store.differential import RUN_FILE

        self.path = out / RUN_FILE
        self.fh = open(self.path, "w", encoding="utf-8")  # a folder used again holds the last run only
        self.manifest = manifest.ManifestWriter(self.path, run_id, manifest.load_key(create=True))
        self.manifest.write()
        self.records: list[dict[str, Any]] = []
        self.total, self.started, self.checkpoint = total, time.monotonic(), time.monotonic()

    def add(self, record: Mapping[str, Any]) -> None:
        from harness.store.results import CHECKPOINT_S

        line = json.dumps(record) + "\n"
        self.fh.write(line)
        self.fh.flush()
        self.manifest.add(line.encode("utf-8"))
        if time.monotonic() - self.checkpoint >= CHECKPOINT_S:
            self.manifest.write()
            self.checkpoint = time.monotonic()
        self.records.append(dict(record))
        cls = record["class"]
        line = f"[{len(self.records)}/{self.total} {time.monotonic() - self.started:.0f}s] {record['adapter']} " \
               f"{record['case_id']}: {cls} ({record['interp']['verdict']} / {record['gpu']['verdict']})"
        if cls not in ("agree", "agree_within_contract"):
            line += f": {record['why'][:160]}"
        print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        self.fh.close()
        self.manifest.write(final=True)


def _pool_run(args: argparse.Namespace, sides: Sequence[Any], work: Sequence[tuple[str, list]],
              report: _Report) -> None:
    """Judge every chunk in worker processes (a fork server's, never a fork of this process); a chunk whose worker
    died gets records that say so."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from harness.core.device import sweep_jobs, usable_cpus
    from harness.sweep.differential import init_worker, judge_chunk, unjudged_record

    jobs = args.jobs or sweep_jobs(min(usable_cpus(), 16))
    if jobs == 1:
        return _serial_run(args, sides, work, report)
    ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
    threads = max(1, usable_cpus() // jobs)
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=init_worker,
                               initargs=(sides, args.case_timeout, threads, dict(os.environ)))
    try:
        futures = {pool.submit(judge_chunk, spec, [c.to_dict() for c in chunk]): chunk
                   for spec, chunk in _chunks(work, jobs)}
        for fut in as_completed(futures):
            try:
                records = fut.result()
            except Exception as e:  # the worker died (BrokenProcessPool) or the chunk raised
                why = f"its differential worker failed: {type(e).__name__}: {e}"
                records = [unjudged_record(c, sides, why) for c in futures[fut]]
            for r in records:
                report.add(r)
    except KeyboardInterrupt:
        _stop(pool)
        raise
    pool.shutdown()


def _stop(pool: Any) -> None:
    """Ctrl-C or SIGTERM: the cases in flight get no record; the workers end now (their kernel hosts with them)."""
    import contextlib

    workers = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in workers:
        with contextlib.suppress(Exception):
            proc.kill()


def _serial_run(args: argparse.Namespace, sides: Sequence[Any], work: Sequence[tuple[str, list]],
                report: _Report) -> None:
    """--jobs 1: judged in this process (its kernel hosts fork from the server the planner's came from)."""
    from harness.sweep.differential import judging

    with judging(sides, args.case_timeout) as judge_chunk:
        for spec, cases in work:
            for case in cases:  # one at a time: the progress line comes as each is judged
                for r in judge_chunk(spec, [case.to_dict()]):
                    report.add(r)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _run_and_report(args: argparse.Namespace, sides: Sequence[Any], work: Sequence[tuple[str, list]],
                    skipped: Mapping[str, str]) -> int:
    from harness import __version__
    from harness.sweep.differential import DISAGREEMENTS

    run_id, out = _out_dir(args, sides[1])
    total = sum(len(c) for _, c in work)
    print(f"moe-harness {__version__}: differential {run_id}: {len(work)} adapter(s), {total} cases, "
          f"{sides[0].name} against {sides[1].name} ({sides[1].device.device_name}), profile {args.profile}; "
          f"writing {out}", file=sys.stderr)
    for name, why in skipped.items():
        print(f"  skipped {name}: {why}", file=sys.stderr)
    report = _Report(out, total, run_id)
    # the Python warnings of the workers and kernel hosts (the interpreter's numpy ones) go to a file, not stderr
    os.environ.setdefault("MOE_HARNESS_WARNINGS_LOG", str((out / "warnings.log").resolve()))
    interrupted = False
    old = signal.signal(signal.SIGTERM, _interrupt)  # a time limit's SIGTERM still leaves a summary
    try:
        _pool_run(args, sides, work, report)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        signal.signal(signal.SIGTERM, old)
        report.close()
    summary = out / "summary.md"
    from harness.core.paths import public_text  # committed and read elsewhere: no path of this machine

    summary.write_text(public_text(render_summary(report.records, sides, run_id, args, skipped, interrupted)),
                       encoding="utf-8")
    counts = Counter(r["class"] for r in report.records)
    print(f"{len(report.records)} cases: " + ", ".join(f"{counts[c]} {c}" for c in counts) +
          f"; {summary} and {report.path}")
    if interrupted:
        return 130
    return 1 if any(counts[c] for c in DISAGREEMENTS) else 0


# -- the summary --------------------------------------------------------------------------------------------------

#: examples listed per class and adapter in the summary
EXAMPLES = 5


def _header(sides: Sequence[Any], run_id: str, args: argparse.Namespace, interrupted: bool) -> list[str]:
    from harness.core.device import git_state

    commit, dirty = git_state()
    gpu = sides[1].device
    lines = [f"# Differential run {run_id}", "",
             f"Each case judged by Triton's interpreter on the CPU (`{sides[0].name}`) and compiled on "
             f"`{sides[1].name}` ({gpu.device_name}), on the same inputs. Profile {args.profile}; commit "
             f"{commit[:12]}{' (dirty)' if dirty else ''}; torch {gpu.torch_version}, Triton {gpu.triton_version}.",
             "", "Classes: `agree` (bit-identical outputs), `agree_within_contract` (outputs differ, both pass), "
             "`interp_only_failure` (a fidelity defect candidate), `gpu_only_failure` (a device-dependent code path "
             "or a declaration), `nondeterministic` (one side fails, and its two runs on the same inputs differ: the "
             "kernel reads memory it never wrote, or races; which side shows it is luck), `both_fail`, "
             "`not_comparable` (a side did not judge the outputs).", ""]
    for side in sides:  # what a test side's hosts were given
        if env := ", ".join(f"{k}={v}" for k, v in side.env if k != "TRITON_INTERPRET"):
            lines += [f"`{side.name}` kernel hosts' environment: {env}", ""]
    if interrupted:
        lines += ["**Interrupted**: the cases below are the ones judged before the run was stopped.", ""]
    return lines


def _table(records: Sequence[Mapping[str, Any]]) -> list[str]:
    from harness.sweep.differential import CLASSES

    by: dict[str, Counter] = {}
    for r in records:
        by.setdefault(r["adapter"], Counter())[r["class"]] += 1
    lines = ["## Cases compared per adapter", "", "| adapter | cases | " + " | ".join(CLASSES) + " |",
             "|---|---:|" + "---:|" * len(CLASSES)]
    for name in sorted(by):
        c = by[name]
        lines.append(f"| {name} | {sum(c.values())} | " + " | ".join(str(c[k] or "") for k in CLASSES) + " |")
    return [*lines, ""]


def _by_class(records: Sequence[Mapping[str, Any]]) -> list[str]:
    from harness.sweep.differential import CLASSES

    lines = ["## Disagreements by class", ""]
    for cls in CLASSES[1:]:
        found = [r for r in records if r["class"] == cls]
        if not found:
            continue
        lines += [f"### {cls} ({len(found)})", ""]
        groups: dict[tuple[str, str], list] = {}
        for r in found:
            key = (r["adapter"], r["why"] if cls == "agree_within_contract" else "")
            groups.setdefault(key, []).append(r)
        for (adapter, why), rs in sorted(groups.items()):
            if cls == "agree_within_contract":
                lines.append(f"- {adapter}: {len(rs)} case(s): {why}")
                continue
            lines.append(f"- {adapter}: {len(rs)} case(s)")
            lines += [f"  - `{r['case_id']}` {_cell(r)}: {r['why'][:400]}" for r in rs[:EXAMPLES]]
            if len(rs) > EXAMPLES:
                lines.append(f"  - and {len(rs) - EXAMPLES} more (cases.jsonl)")
        lines.append("")
    return lines if len(lines) > 2 else [*lines, "None: every case agrees bit for bit.", ""]


def _cell(r: Mapping[str, Any]) -> str:
    cell = ",".join(f"{k}={v}" for k, v in r["cell"].items())
    shapes = ",".join(f"{k}={v}" for k, v in r["shapes"].items())
    return f"[{cell}] seed {r['seed']} ({shapes})"


def render_summary(records: Sequence[Mapping[str, Any]], sides: Sequence[Any], run_id: str,
                   args: argparse.Namespace, skipped: Mapping[str, str], interrupted: bool = False) -> str:
    """The run's markdown summary: cases compared per adapter, the disagreements by class, what was skipped."""
    lines = _header(sides, run_id, args, interrupted) + _table(records) + _by_class(records)
    if skipped:
        lines += ["## Not compared", ""] + [f"- {name}: {why}" for name, why in sorted(skipped.items())] + [""]
    return "\n".join(lines)


def add_parser(sub: Any) -> None:
    """Add the command to the `python -m harness` subparsers."""
    d = sub.add_parser("differential", help="judge the Triton kernels on the interpreter and on this GPU, compare",
                       description="On a GPU machine: judge every Triton adapter's quick-matrix cases (its declared "
                       "cells) twice on the same inputs, by Triton's interpreter on the CPU and compiled on the GPU; "
                       "compare the outputs bit for bit and the verdicts, and classify every case. Writes "
                       "cases.jsonl and summary.md. Exit 0 when no case fails on one side only, 1 otherwise, 2 "
                       "without a CUDA GPU.")
    d.add_argument("--adapter", action="append", default=[],
                   help="only this adapter (repeatable; module:object ok; 'external': the third-party libraries' "
                   "adapters); default: every Triton adapter of kernels/adapters/ whose library is present")
    d.add_argument("--profile", default="quick", choices=PROFILES,
                   help="which matrix plan's cases (default quick)")
    d.add_argument("--out", default=None,
                   help="output folder (default results/<generation>/differential/<run-id>/)")
    d.add_argument("--jobs", type=positive(int), default=None,
                   help="worker processes, each with an interpreter host and a GPU host (default: the CPU count, "
                   "at most 16 and at most MOE_HARNESS_JOBS where it is set)")
    d.add_argument("--case-timeout", type=positive(float), default=300.0,
                   help="seconds one side of a case may run before it is an error (default 300)")
    d.add_argument("--max-cases", type=positive(int), default=None,
                   help="at most this many cases per adapter, spread over its cells (default: all)")
    d.set_defaults(func=run)
