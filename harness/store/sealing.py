"""`scripts/seal_results.py`: check the manifests of results files (differential runs' `cases.jsonl` included),
give manifests to the committed results that predate them, and accept results another machine's judge wrote.

    python scripts/seal_results.py --check results              # exit 1 when a results file would be left out
    python scripts/seal_results.py --committed results          # manifests for committed files that have none
    python scripts/seal_results.py --accept results/sm90/<run>  # sign another machine's intact files with this key

`--committed` writes unsigned manifests (checked by their hashes) for files git holds as committed, exactly as
committed: what was reviewed, never a file dropped into the checkout since. `--accept` is the user vouching for files
copied from another machine (a GPU machine's run): each must match its manifest's hashes; its manifest is then
signed with this machine's key. See docs/RESULTS_TRUST.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

from harness.core import files
from harness.store import differential, manifest
from harness.store.results import ResultsFileError, not_a_results_file, result_files


def _results_files(paths: Iterable[str]) -> list[tuple[Path, bytes]]:
    """(path, content) of the files under `paths` that hold results or differential runs (not tuning data)."""
    found = []
    for path in result_files(paths):
        data = files.read_bytes(path)
        if not differential.is_run_file(path) and not_a_results_file(data.decode("utf-8", "replace").split("\n")):
            continue
        found.append((path, data))
    return found


def check(paths: Iterable[str]) -> int:
    gate = manifest.Gate()
    n = 0
    for path, data in _results_files(paths):
        gate.admit(path, data)
        n += 1
    for note in gate.notes:
        print(note)
    print(f"{n} results file(s) checked, {len(gate.notes)} left out (or in part)")
    return 1 if gate.notes else 0


def seal_committed(paths: Iterable[str]) -> int:
    gate = manifest.Gate(use_key=False)
    sealed = refused = 0
    for path, _ in _results_files(paths):
        if manifest.manifest_path(path).exists():
            continue
        if not gate.committed(path):
            print(f"not sealed: {path} (git does not hold it as committed)")
            refused += 1
            continue
        manifest.seal(path, None)
        sealed += 1
    print(f"sealed {sealed} committed results file(s)" + (f", refused {refused}" if refused else ""))
    return 1 if refused else 0


def accept(paths: Iterable[str]) -> int:
    key = manifest.load_key(create=True)
    if key is None:
        print(f"error: no key at {manifest.key_path()} and none can be made", file=sys.stderr)
        return 2
    bad = 0
    for path, data in _results_files(paths):
        found = manifest.inspect(path, data, None)
        if not found.matches or found.tail:
            print(f"not accepted: {path} ({found.why() if not found.matches else 'its run did not end'})")
            bad += 1
            continue
        manifest.seal(path, key, run_id=str(manifest.read_manifest(path).get("run_id", "")))
        print(f"accepted: {path}")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Check, add or accept the manifests of results files.")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="name every results file a render would leave out")
    mode.add_argument("--committed", action="store_true",
                      help="write unsigned manifests for results files git holds as committed that have none")
    mode.add_argument("--accept", action="store_true",
                      help="sign with this machine's key the files whose content matches their manifest (results "
                           "copied from another machine)")
    p.add_argument("paths", nargs="+", help="results files or folders")
    args = p.parse_args(argv)
    try:
        if args.check:
            return check(args.paths)
        return seal_committed(args.paths) if args.committed else accept(args.paths)
    except (ResultsFileError, files.UnreadableFile) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
