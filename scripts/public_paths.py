"""Rewrite result files, case files and logs so that they name no absolute path of the machine that made them.

The harness writes results this way already (`harness.core.paths`); this brings files of an older run to the same
form before they are committed, with the same naming function. JSON (`.json`) and JSONL (`.jsonl`, `.jsonl.gz`)
files have every string rewritten (a line that changes nothing is kept byte for byte); any other text file (a log)
is rewritten as text. `--root PREFIX=NAME` names a folder of the machine that ran it, which this machine cannot
know: its checkout (`NAME` empty: paths become relative to the repository), its unpacked libraries
(`<third_party>`), its output folder (`$OUT`). `--check` changes nothing and exits 1 when a file would change.

    python scripts/public_paths.py --root /path/of/that/checkout= --root '/its/out=$OUT' results/sm90/<run>/
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.core.paths import public_record, public_text

TEXT_SUFFIXES = (".json", ".jsonl", ".log", ".md", ".txt", ".gz")


def _json_line(line: str, roots: Mapping[str, str]) -> str:
    """One JSONL line rewritten in the store's own form (`harness.store.results`), unchanged when nothing moves."""
    if not line.strip():
        return line
    data = json.loads(line)
    new = public_record(data, roots)
    return line if new == data else json.dumps(new, sort_keys=True, allow_nan=False) + "\n"


def rewrite(text: str, suffix: str, roots: Mapping[str, str]) -> str:
    """`text` of a file with suffix `suffix` (of the decompressed name for `.gz`) with its paths named."""
    if suffix == ".jsonl":
        return "".join(_json_line(line, roots) for line in text.splitlines(keepends=True))
    if suffix == ".json":
        data = json.loads(text)
        new = public_record(data, roots)
        indent = 1 if text.startswith("{\n ") and not text.startswith("{\n  ") else 2
        return text if new == data else json.dumps(new, indent=indent, sort_keys=True) + "\n"
    return public_text(text, roots)


def rewrite_file(path: Path, roots: Mapping[str, str], check: bool) -> bool:
    """Rewrite one file in place (not with `check`); whether it changes."""
    raw = path.read_bytes()
    packed = path.suffix == ".gz"
    data = gzip.decompress(raw) if packed else raw
    if b"\0" in data:
        return False  # binary
    text = data.decode("utf-8")
    new = rewrite(text, Path(path.stem).suffix if packed else path.suffix, roots)
    if new == text:
        return False
    if not check:
        body = new.encode("utf-8")
        path.write_bytes(gzip.compress(body, mtime=0) if packed else body)
    return True


def _files(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for p in map(Path, paths):
        inside = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(TEXT_SUFFIXES))
        found += inside if p.is_dir() else [p]
    return found


def _root(spec: str) -> tuple[str, str]:
    prefix, sep, name = spec.partition("=")
    if not sep or not prefix.startswith("/"):
        raise argparse.ArgumentTypeError(f"--root takes ABSOLUTE_PREFIX=NAME (NAME may be empty), got {spec!r}")
    return prefix, name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", help="files or folders (folders: their .json/.jsonl/.log/.md/.txt/.gz files)")
    ap.add_argument("--root", action="append", type=_root, default=[], metavar="PREFIX=NAME",
                    help="a folder of the machine that made the files, and the name to give it (repeatable)")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when a file would change")
    args = ap.parse_args(argv)
    roots = dict(args.root)
    changed = [f for f in _files(args.paths) if rewrite_file(f, roots, args.check)]
    for f in changed:
        print(f"{'would rewrite' if args.check else 'rewrote'} {f}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
