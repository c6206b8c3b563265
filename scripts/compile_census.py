"""Which Triton variants judged cases compile, and what compiling them costs, on a machine without a GPU.

    python scripts/compile_census.py VERDICTS.jsonl[.gz] ... [--adapter NAME ...] [--compile N] [--arch 90]
    python scripts/compile_census.py --variants SAVED.jsonl --compile N [--processes P]

Replays the judged cases (pass and fail verdicts) of a results or verdict log with every Triton launch intercepted:
inputs are built on the CPU, the adapter runs as on a GPU (no interpreter: the GPU's tile choices), and each launch
records its variant key instead of running: the kernel, its constexprs, each tensor's dtype and each integer's
specialization as Triton makes it (== 1, divisible by 16, neither; `do_not_specialize` honoured; past int32, its
own type). Outputs are left as allocated, so code that reads a kernel's output to choose the next launch sees
garbage: a census of what such code launches is approximate. Tensors are assumed 16-byte aligned (the harness's
buffers are).

Prints the distinct variants per kernel and, for every axis that varies, how many variants would remain if that
axis did not split them (what making it a runtime value would save). `--compile N` compiles N variants of each
kernel for the target (`triton.compile` on this machine's CPU, with the Triton wheel's ptxas) and sums the seconds
by compiler stage. `--save FILE` writes the variants as JSON lines; `--variants FILE` compiles such a file's variants
instead of a census. `--processes P` runs P copies of the compiles at once, each in a Triton cache of its own, and
says how long each took: whether this machine's cores compile side by side as fast as one alone.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

Key = tuple[tuple[str, Any], ...]
_TRITON_TYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "int8": "i8", "uint8": "u8",
                 "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5", "int16": "i16", "int32": "i32",
                 "int64": "i64", "bool": "i1", "uint16": "u16", "uint32": "u32"}
_OPTIONS = ("num_warps", "num_stages", "num_ctas")


def variant_key(fn: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Key:
    """A launch's compile key: constexpr values, tensor dtypes, integer specialization ('1', 'd16' or 'i')."""
    import torch

    names = list(fn.arg_names)
    skip = {names[i] if isinstance(i, int) else i for i in (fn.do_not_specialize or ())}
    values = dict(zip(names, args))
    values.update(kwargs)
    key = []
    for name in names + sorted(n for n in kwargs if n not in names):
        if name not in values:
            continue
        v = values[name]
        if isinstance(v, torch.Tensor):
            key.append((name, str(v.dtype).removeprefix("torch.")))
        elif isinstance(v, bool) or name in _OPTIONS or name not in names or fn.params[names.index(name)].is_constexpr:
            key.append((name, v))
        elif isinstance(v, int):
            kind = "i" if name in skip else "1" if v == 1 else "d16" if v % 16 == 0 else "i"
            key.append((name, kind if kind == "1" or -2**31 <= v < 2**31 else kind + ":i64"))  # Triton's i64 args
        elif isinstance(v, float):
            key.append((name, "f"))
        else:
            key.append((name, repr(v)))
    return tuple(key)


def census(records: Iterable[dict[str, Any]], adapters: set[str] | None = None) -> tuple[list[tuple[str, str, Key]],
                                                                                         collections.Counter]:
    """(adapter, kernel, key) of every launch the judged cases make, and the errors of cases that did not run. In a
    process without Triton's interpreter only (`main` makes sure): the interpreter's kernels are not JIT launches."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("the census needs a process without TRITON_INTERPRET (run scripts/compile_census.py)")
    import triton.runtime.jit as jit

    from harness import ops, registry
    from harness.core.case import Case
    from harness.engine.runner import banded

    launches: list[tuple[str, str, Key]] = []
    errors: collections.Counter = collections.Counter()
    current = {"adapter": ""}

    def record(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        launches.append((current["adapter"], f"{self.fn.__module__}.{self.fn.__name__}",
                         variant_key(self, args, kwargs)))

    run, jit.JITFunction.run = jit.JITFunction.run, record
    try:
        resolved: dict[str, Any] = {}
        for rec in records:
            case = Case.from_dict(rec["case"])
            if adapters and case.adapter not in adapters:
                continue
            current["adapter"] = case.adapter
            try:
                adapter = resolved.get(case.adapter) or resolved.setdefault(case.adapter,
                                                                            registry.resolve(case.adapter))
                op = ops.get(case.op)
                inputs = op.make_inputs(case, "cpu")
                outputs = {n: banded(s, "cpu", 0)[0] for n, s in op.outputs(case, inputs).items()}
                adapter.run(case, dict(inputs), outputs)
            except Exception as e:  # a case that cannot run here is counted, not fatal
                errors[f"{case.adapter}: {type(e).__name__}: {str(e)[:120]}"] += 1
    finally:
        jit.JITFunction.run = run
    return launches, errors


def judged(paths: Sequence[str]) -> list[dict[str, Any]]:
    """The pass and fail verdict records of verdict or results logs (JSON lines, gzipped or not)."""
    out = []
    for path in paths:
        with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
            for line in f:
                rec = json.loads(line)
                if rec.get("verdict") in ("pass", "fail") and isinstance(rec.get("case"), dict):
                    out.append(rec)
    return out


def without(keys: set[Key], axis: str) -> int:
    """How many of `keys` remain distinct when `axis` does not split them."""
    return len({tuple(item for item in key if item[0] != axis) for key in keys})


def axis_report(keys: set[Key]) -> list[tuple[str, int, dict[Any, int]]]:
    """(axis, variants left without it, how many variants take each value) for every axis that varies."""
    values: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for key in keys:
        for name, v in key:
            values[name][v] += 1
    return sorted(((name, without(keys, name), dict(c)) for name, c in values.items() if len(c) > 1),
                  key=lambda row: row[1])


def compile_variant(kernel: str, key: Key, arch: int) -> dict[str, float]:
    """Compile one variant for sm`arch` on this machine; seconds by stage ('total' included)."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, name = kernel.rsplit(".", 1)
    fn = getattr(importlib.import_module(module), name)
    signature, constexprs, attrs, options = {}, {}, {}, {}
    for arg, v in key:
        if arg in _OPTIONS:
            options[arg] = v
            continue
        i = fn.arg_names.index(arg)
        if fn.params[i].is_constexpr or v == "1":
            signature[arg], constexprs[arg] = "constexpr", 1 if v == "1" else v
        elif v in _TRITON_TYPES:
            signature[arg], attrs[(i,)] = "*" + _TRITON_TYPES[v], [["tt.divisibility", 16]]
        elif v.partition(":")[0] in ("d16", "i"):
            signature[arg] = "i64" if v.endswith(":i64") else "i32"
            if v.startswith("d16"):
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[arg] = "fp32"
    for p in fn.params:  # constexprs left at their defaults
        if p.name not in signature:
            signature[p.name], constexprs[p.name] = "constexpr", p.default
    stages: dict[str, float] = {}
    start = time.perf_counter()
    src = ASTSource(fn, signature, constexprs, attrs)
    cls = type(triton.compiler.make_backend(GPUTarget("cuda", arch, 32)))
    add = cls.add_stages

    def timed(self: Any, stages_dict: dict, *a: Any, **k: Any) -> None:
        add(self, stages_dict, *a, **k)
        for stage, f in list(stages_dict.items()):
            def wrap(src: Any, metadata: Any, f: Any = f, stage: str = stage) -> Any:
                t = time.perf_counter()
                try:
                    return f(src, metadata)
                finally:
                    stages[stage] = stages.get(stage, 0.0) + time.perf_counter() - t
            stages_dict[stage] = wrap

    cls.add_stages = timed  # triton.compile makes its own backend: its stages are timed through the class
    try:
        triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    finally:
        cls.add_stages = add
    stages["total"] = time.perf_counter() - start
    return stages


def _census_of(logs: Sequence[str], adapters: set[str] | None) -> dict[str, set[Key]]:
    records = judged(logs)
    launches, errors = census(records, adapters)
    by_kernel: dict[str, set[Key]] = collections.defaultdict(set)
    for _, kernel, key in launches:
        by_kernel[kernel].add(key)
    print(f"{len(records)} judged cases, {len(launches)} launches, "
          f"{sum(len(k) for k in by_kernel.values())} distinct variants")
    for message, n in errors.most_common(10):
        print(f"  not run ({n}): {message}")
    return by_kernel


def saved(path: str) -> dict[str, set[Key]]:
    """The variants of a `--save` file, by kernel."""
    by_kernel: dict[str, set[Key]] = collections.defaultdict(set)
    with open(path) as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                by_kernel[rec["kernel"]].add(tuple((name, v) for name, v in rec["key"]))
    return by_kernel


def _saved(args: argparse.Namespace) -> str:
    """A census of the logs saved to a file (`--save`, else a temporary one) for the processes to read."""
    path = args.save or tempfile.mkstemp(prefix="compile-census-", suffix=".jsonl")[1]
    main([*args.logs, *(a for n in args.adapter for a in ("--adapter", n)), "--save", path])
    return path


def side_by_side(variants: str, n: int, arch: int, processes: int) -> int:
    """`processes` copies of `--variants variants --compile n` at once; the seconds each spent compiling (its
    imports left out) and when the last ended."""
    import re
    import subprocess
    import threading

    command = [sys.executable, __file__, "--variants", variants, "--compile", str(n), "--arch", str(arch)]
    start = time.perf_counter()
    ended: list[tuple[float, int, str]] = []

    def wait(proc: subprocess.Popen) -> None:
        out, _ = proc.communicate()
        ended.append((time.perf_counter() - start, proc.returncode, out))

    threads = [threading.Thread(target=wait, args=(subprocess.Popen(command, stdout=subprocess.PIPE,
                                                                    stderr=subprocess.STDOUT, text=True),))
               for _ in range(processes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [out for _, rc, out in ended if rc != 0]
    for out in failed:
        print(out[-2000:])
    compiling = sorted(sum(float(x) for x in re.findall(r"compiled in ([0-9.]+) s", out)) for _, _, out in ended)
    last = max(t for t, _, _ in ended)
    print(f"{processes} processes at once, each compiling up to {n} variants of each kernel of {variants}: the last "
          f"ended after {last:.1f} s; seconds compiling per process: {compiling[0]:.1f} (least), "
          f"{compiling[len(compiling) // 2]:.1f} (median), {compiling[-1]:.1f} (most)"
          + (f"; {len(failed)} failed" if failed else ""))
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("logs", nargs="*", help="verdict or results logs (JSON lines, .gz or not)")
    p.add_argument("--adapter", action="append", default=[], help="only these adapters' cases (repeatable)")
    p.add_argument("--compile", type=int, default=0, metavar="N", help="compile N variants of each kernel")
    p.add_argument("--arch", type=int, default=90, help="compile target, sm<ARCH> (default 90)")
    p.add_argument("--save", default="", help="write the variants here as JSON lines")
    p.add_argument("--variants", default="", help="the variants of a --save file instead of a census of logs")
    p.add_argument("--processes", type=int, default=0, metavar="P",
                   help="with --compile: P processes (1 or more) compile at once, each in a Triton cache of its "
                        "own (default: this process compiles)")
    args = p.parse_args(argv)
    if bool(args.logs) == bool(args.variants):
        p.error("give verdict logs or --variants FILE, not both")
    if args.processes < 0 or (args.processes and not args.compile):
        p.error("--processes P takes P >= 1, with --compile N")
    os.environ.pop("TRITON_INTERPRET", None)  # the GPU's code paths and tiles, before a kernel module is imported
    if args.processes:
        return side_by_side(args.variants or _saved(args), args.compile, args.arch, args.processes)
    by_kernel = saved(args.variants) if args.variants else _census_of(args.logs, set(args.adapter) or None)
    for kernel, keys in sorted(by_kernel.items(), key=lambda kv: -len(kv[1])):
        print(f"{len(keys):6d}  {kernel}")
        for axis, left, counts in axis_report(keys)[:6]:
            print(f"          without {axis}: {left}  {counts}")
    if args.save:
        with open(args.save, "w") as f:
            for kernel, keys in by_kernel.items():
                for key in sorted(keys, key=repr):
                    f.write(json.dumps({"kernel": kernel, "key": [[n, v] for n, v in key]}) + "\n")
    if args.compile:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="compile-census-")  # compiles, not cache hits
        for kernel, keys in sorted(by_kernel.items(), key=lambda kv: -len(kv[1])):
            sample = sorted(keys, key=repr)
            random.Random(0).shuffle(sample)
            sums: collections.Counter = collections.Counter()
            for key in sample[:args.compile]:
                sums.update(compile_variant(kernel, key, args.arch))
            n = min(args.compile, len(sample))
            stages = ", ".join(f"{s} {v:.1f}" for s, v in sums.items() if s != "total")
            print(f"{kernel}: {n} compiled in {sums['total']:.1f} s ({sums['total'] / n:.2f} s each; {stages})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
