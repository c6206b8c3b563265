"""`python -m harness perf-table RUN_DIR... [--out FILE]`: the fused-experts timing tables, rendered from committed
bench runs.

A bench run folder (`results/<generation>/bench/<run id>/`, what `scripts/gpu_run.sh --sections bench` leaves) holds
the bench's own tables (`*.md`, one row per case and kernel) and `device.txt`. This command reads the experts rows of
every table in each folder named and renders, per folder, one table: each (shape, scheme, M) point with its roofline
floor, every kernel's time and its share of the floor, and each of this project's kernels (`triton-*`) over the
anchor (vLLM's kernel) timed in the same run. A point timed in several tables of one folder (a run repeated after a
fix) takes the last table's time, by file name. Rows without a positive time (a kernel that failed its
verification) are left out. Numbers are never typed into the docs: `--out FILE` renders every block between
`<!-- perf-table: DIR ... -->` and `<!-- /perf-table -->` in FILE from the folders its marker names (relative to the
working directory), and a test fails when a committed block is stale.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: a case cell of the experts bench: "<shape> <scheme words> M=<m> floor=<us>us (<bound>)"
CASE = re.compile(r"^(?P<shape>\S+) (?P<scheme>.+?) M=(?P<m>\d+) floor=(?P<floor>[\d.]+)us \((?P<bound>\w+)\)$")
BEGIN = re.compile(r"<!-- perf-table: (?P<dirs>[^>]*?) -->")
END = "<!-- /perf-table -->"
#: the kernels this project ships (their ratios to the anchor are shown) and the anchor's name prefix
OURS, ANCHOR = "triton-", "vllm-"


@dataclass(frozen=True)
class Timed:
    """One kernel timed at one point of a bench run."""

    shape: str
    scheme: str
    m: int
    floor_us: float
    bound: str
    adapter: str
    kernel_us: float


@dataclass(frozen=True)
class BenchRun:
    folder: str
    device: str
    commit: str
    rows: tuple[Timed, ...]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_table(text: str) -> list[Timed]:
    """The experts rows of one bench table (github markdown, header first); rows of other ops are skipped."""
    lines = [line for line in text.splitlines() if line.strip().startswith("|")]
    if len(lines) < 2:
        return []
    header = _cells(lines[0])
    if not {"case", "adapter", "kernel_us"} <= set(header):
        return []
    found = []
    for line in lines[2:]:
        row = dict(zip(header, _cells(line)))
        case, us = CASE.match(row["case"]), _positive(row["kernel_us"])
        if case is None or us is None:
            continue
        found.append(Timed(case["shape"], case["scheme"], int(case["m"]), float(case["floor"]), case["bound"],
                           row["adapter"], us))
    return found


def _positive(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value < float("inf") else None


def _device(text: str) -> str:
    """The GPU's name from a run's device.txt (nvidia-smi's csv line, or torch's line ending in its capability)."""
    for line in text.splitlines():
        if line.startswith("name,"):  # nvidia-smi's header
            continue
        named = re.search(r"NVIDIA [^,(\n]+", line)
        if named:
            return named.group(0).strip()
    return "unknown device"


def read_run(folder: str | Path) -> BenchRun:
    """Every experts row of the tables in `folder`, with the device and commit it ran on."""
    path = Path(folder)
    if not path.is_dir():
        raise ValueError(f"{folder}: not a folder (a bench run's folder, e.g. results/sm90/bench/<run id>)")
    rows = [r for table in sorted(path.glob("*.md")) if table.name != "README.md"
            for r in parse_table(table.read_text(encoding="utf-8"))]
    if not rows:
        raise ValueError(f"{folder}: no experts bench table (*.md with case, adapter and kernel_us columns) in it")
    device_txt = path / "device.txt"
    about = device_txt.read_text(encoding="utf-8") if device_txt.exists() else ""
    # the commit gpu_run.sh recorded, else the one in the run id (<date>-<commit>-<label>)
    commit = re.search(r"^commit: (\w+)", about, re.MULTILINE) or re.match(r"\d{4}-\d\d-\d\d-([0-9a-f]{7,})-",
                                                                          path.name)
    return BenchRun(path.as_posix(), _device(about) if about else "unknown device",
                    commit.group(1) if commit else "unknown", tuple(rows))


def _kernels(rows: Sequence[Timed]) -> list[str]:
    """The kernels in a stable order: ours, the anchor, the others; each group by name."""
    names = sorted({r.adapter for r in rows})
    return sorted(names, key=lambda n: (0 if n.startswith(OURS) else 1 if n.startswith(ANCHOR) else 2, n))


def render_run(run: BenchRun, name: str | None = None) -> list[str]:
    kernels = _kernels(run.rows)
    anchor = next((k for k in kernels if k.startswith(ANCHOR)), None)
    ours = [k for k in kernels if k.startswith(OURS)] if anchor else []
    points: dict[tuple[str, str, int], dict[str, Timed]] = {}
    for r in run.rows:
        points.setdefault((r.shape, r.scheme, r.m), {})[r.adapter] = r
    head = ["shape", "scheme", "M", "floor us"] + [f"{k} us (% of floor)" for k in kernels]
    head += [f"{k} / anchor" for k in ours]
    anchor_is = f"; the anchor: {anchor}" if anchor else ""
    lines = [f"`{name or run.folder}`: {run.device}, commit {run.commit}. Kernel time in us{anchor_is}.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (shape, scheme, m), by in sorted(points.items(), key=lambda p: (p[0][0], p[0][1], p[0][2])):
        floor = next(iter(by.values())).floor_us
        cells = [shape, scheme, str(m), f"{floor:.0f}"]
        cells += [f"{by[k].kernel_us:.0f} ({100 * floor / by[k].kernel_us:.0f}%)" if k in by else "-" for k in kernels]
        cells += [f"{by[k].kernel_us / by[anchor].kernel_us:.2f}" if k in by and anchor in by else "-" for k in ours]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render(folders: Sequence[str], names: Sequence[str] | None = None) -> str:
    """The tables of the bench runs in `folders`, one after another (each titled by its entry in `names`, default
    the folder as given)."""
    out: list[str] = []
    for folder, name in zip(folders, names or folders):
        out += [*render_run(read_run(folder), name), ""]
    return "\n".join(out).rstrip() + "\n"


def blocks(text: str) -> list[tuple[int, int, list[str]]]:
    """Each perf-table block of `text`: where its body starts and ends, and the folders its marker names."""
    found = []
    for begin in BEGIN.finditer(text):
        end = text.find(END, begin.end())
        if end < 0:
            raise ValueError(f"the block at '{begin.group(0)}' has no '{END}' after it")
        found.append((begin.end(), end, begin["dirs"].split()))
    return found


def rendered_again(text: str, root: Path = Path(".")) -> str:
    """`text` with every perf-table block rendered again from the folders (relative to `root`) its marker names."""
    found = blocks(text)
    if not found:
        raise ValueError("no block between '<!-- perf-table: DIR ... -->' and '<!-- /perf-table -->' to render")
    out, at = [], 0
    for start, end, folders in found:
        if not folders:
            raise ValueError(f"a perf-table block names no bench run folder (at character {start})")
        out += [text[at:start], "\n", render([str(root / f) for f in folders], names=folders)]
        at = end
    return "".join([*out, text[at:]])


def run(args: argparse.Namespace) -> int:
    try:
        if args.out and args.folders:
            raise ValueError("give bench run folders (printed) or --out FILE (its blocks name their folders), not both")
        if args.out:
            path = Path(args.out)
            path.write_text(rendered_again(path.read_text(encoding="utf-8")), encoding="utf-8")
            print(f"rendered the perf-table blocks of {args.out}")
        elif args.folders:
            sys.stdout.write(render(args.folders))
        else:
            raise ValueError("give bench run folders, or --out FILE")
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("perf-table", help="the fused-experts timing tables, rendered from committed bench runs")
    p.add_argument("folders", nargs="*", metavar="RUN_DIR", help="bench run folders (results/<gen>/bench/<run id>)")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="render every perf-table block of FILE (e.g. docs/PERFORMANCE.md) from the folders its "
                        "marker names, instead of printing")
    p.set_defaults(func=run)
