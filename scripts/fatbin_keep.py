"""Keep one GPU generation's device code in a CUDA shared library: in each of its embedded fat binaries, every entry
that a device of the named architecture would not load has its payload zeroed, in place, with the headers untouched
(the device loads its own cubin where there is one, else JIT-compiles the highest PTX it can). A zeroed payload
compresses to almost nothing, which is what lets a third-party library's extensions travel to a GPU machine in one
bounded carry; the CUDA runtime picks, per fat binary, the entry that matches the device, so the zeroed ones are
never read on it.

    python scripts/fatbin_keep.py LIBRARY.so OUT.so --arch 90
Prints per architecture the bytes kept and zeroed. Fails (exit 1) when nothing is left that the named architecture
can run, rather than writing a library that could only fail later.
"""

from __future__ import annotations

import argparse
import struct
import sys
from collections import Counter
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_CUBIN = 1, 2
_FATBIN_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries that follow
_ENTRY_HEADER = struct.Struct("<HHIQ")  # kind, version, entry header size, payload size
_ARCH_AT = 28  # offset of the entry's SM architecture (e.g. 90) within its header


def _fatbins(data: bytes | bytearray) -> list[tuple[int, int]]:
    """(start of the first entry, end) of every fat binary embedded in `data`."""
    found, at = [], 0
    magic = struct.pack("<I", FATBIN_MAGIC)
    while (at := data.find(magic, at)) >= 0:
        _, version, header, size = _FATBIN_HEADER.unpack_from(data, at)
        if version != 1 or header != _FATBIN_HEADER.size or at + header + size > len(data):
            at += 4
            continue
        found.append((at + header, at + header + size))
        at += header + size
    return found


def _chosen(entries: list[tuple[int, int, slice]], arch: int) -> set[int]:
    """Which entries of one fat binary a device of `arch` can load: its best cubin (same major architecture, the
    highest minor not above its own), else the highest PTX not above it (JIT-compiled on first use)."""
    cubins = [(a, i) for i, (kind, a, _) in enumerate(entries) if kind == KIND_CUBIN and a // 10 == arch // 10
              and a <= arch]
    if cubins:
        best = max(a for a, _ in cubins)
        return {i for a, i in cubins if a == best}
    ptx = [(a, i) for i, (kind, a, _) in enumerate(entries) if kind == KIND_PTX and a <= arch]
    if ptx:
        best = max(a for a, _ in ptx)
        return {i for a, i in ptx if a == best}
    return set()


def keep_arch(data: bytearray, arch: int) -> tuple[Counter, Counter]:
    """Zero the payload of every entry a device of `arch` would not load (`_chosen`), fat binary by fat binary;
    (bytes kept, bytes zeroed) per (kind, arch)."""
    kept: Counter = Counter()
    zeroed: Counter = Counter()
    for start, end in _fatbins(data):
        entries, at = [], start
        while at < end:
            kind, _, header, payload = _ENTRY_HEADER.unpack_from(data, at)
            entry_arch = struct.unpack_from("<I", data, at + _ARCH_AT)[0]
            entries.append((kind, entry_arch, slice(at + header, at + header + payload)))
            at += header + payload
        chosen = _chosen(entries, arch)
        for i, (kind, entry_arch, body) in enumerate(entries):
            size = body.stop - body.start
            if i in chosen:
                kept[(kind, entry_arch)] += size
            else:
                data[body] = bytes(size)
                zeroed[(kind, entry_arch)] += size
    return kept, zeroed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("library", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--arch", type=int, required=True, help="the SM architecture to keep, e.g. 90 for sm90")
    args = parser.parse_args(argv)
    data = bytearray(args.library.read_bytes())
    kept, zeroed = keep_arch(data, args.arch)
    names = {KIND_PTX: "ptx", KIND_CUBIN: "cubin"}
    for (kind, arch), size in sorted((kept + zeroed).items()):
        verb = "zeroed" if (kind, arch) in zeroed else "kept"
        print(f"{args.library.name}: {names.get(kind, kind)} sm{arch}: {size} bytes {verb}")
    if not kept:
        print(f"{args.library.name}: nothing left that sm{args.arch} can run", file=sys.stderr)
        return 1
    args.out.write_bytes(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
