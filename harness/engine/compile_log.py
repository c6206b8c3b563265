"""Which Triton kernel variants a run's kernel hosts build, and how long each took: one JSON line per variant.

`MOE_HARNESS_COMPILE_LOG=FILE` makes every kernel host on a GPU append, for each variant it had not built in its
process yet, a line to FILE: the kernel, its constexprs, its arguments' types and specialization (divisibility), warps
and stages, the seconds from Triton's cache miss to the compiled kernel, and `how` it came: "compiled" here,
"waited" for another process's compile of it (`harness.engine.compile_once`), or "loaded" from the disk cache.
`python -m harness.engine.compile_log FILE` sums it by kernel: variants, compiles and their seconds, and the
constexprs and specializations that told the variants apart.

Where a cold run's time goes to compiles, this says which kernels and which of their parameters multiply the variants.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

__all__ = ["ENV", "install", "summarize"]

ENV = "MOE_HARNESS_COMPILE_LOG"
#: a variant that took this long or longer was compiled here; shorter: loaded from the disk cache
COMPILED_S = 0.3

#: thread -> (when its cache miss began, the compile-once counts then)
_started: dict[int, tuple[float, tuple[int, int] | None]] = {}
_lock = threading.Lock()
_installed: list[str] = []


def _line(path: str, row: dict[str, Any]) -> None:
    data = (json.dumps(row, sort_keys=True) + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        return  # a diagnostic: a log it cannot write never fails the compile it describes
    try:
        os.write(fd, data)  # one write of one line: lines of concurrent processes never interleave
    except OSError:
        pass
    finally:
        os.close(fd)


def _counts() -> tuple[int, int] | None:
    """(compiled, waited) of this process's compile-once cache manager; None where it is not Triton's manager."""
    if "compile_once" not in os.environ.get("TRITON_CACHE_MANAGER", ""):
        return None
    from harness.engine import compile_once

    return compile_once.STATS["compiled"], compile_once.STATS["waited"]


def _how(before: tuple[int, int] | None, after: tuple[int, int] | None) -> str | None:
    """compiled here, waited for another process's compile, or loaded from the disk cache (None: unknown)."""
    if before is None or after is None:
        return None
    return "compiled" if after[0] > before[0] else "waited" if after[1] > before[1] else "loaded"


def _signature(signature: Any) -> dict[str, str]:
    """The arguments' types (`*bf16`, `i32`, `constexpr`) by name: a dtype of its own is a variant of its own."""
    if not isinstance(signature, dict):
        return {}
    return {str(getattr(k, "name", k)): str(v) for k, v in signature.items()}


def _attrs(configs: Any, names: list[str]) -> dict[str, str]:
    """The arguments' specialization (divisibility by 16, ...) by argument name: Triton compiles a variant per set."""
    found: dict[str, str] = {}
    for attrs in (configs or [])[:1]:
        if isinstance(attrs, dict):
            for k, v in attrs.items():
                found[_named(k, names)] = repr(v)
    return dict(sorted(found.items()))


def _named(key: Any, names: list[str]) -> str:
    """A constexpr's name: Triton releases key them by name or by their argument's index path ((7,))."""
    if isinstance(key, tuple) and len(key) == 1 and isinstance(key[0], int) and key[0] < len(names):
        return names[key[0]]
    return str(key)


def install(path: str | None = None) -> bool:
    """Log this process's Triton compiles to `path` (default: $MOE_HARNESS_COMPILE_LOG; neither: do nothing).
    Returns whether the log is on. Triton releases without the JIT hooks log nothing."""
    path = path or os.environ.get(ENV, "")
    if not path or _installed:
        return bool(_installed)
    try:
        from triton import knobs
    except ImportError:
        return False
    runtime = getattr(knobs, "runtime", None)
    if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
        return False

    def before(**kw: Any) -> None:
        with _lock:
            _started[threading.get_ident()] = (time.perf_counter(), _counts())
        return None  # anything true would tell Triton to skip the compile

    def after(**kw: Any) -> None:
        with _lock:
            t0, counts = _started.pop(threading.get_ident(), (None, None))
        comp = kw.get("compile") or {}
        fn = kw.get("fn")
        names = list(getattr(getattr(fn, "jit_function", None), "arg_names", None) or [])
        _line(path, {"pid": os.getpid(), "kernel": getattr(fn, "name", "?"), "module": getattr(fn, "module", "?"),
                     "constants": {_named(k, names): repr(v) for k, v in (comp.get("constants") or {}).items()},
                     "num_warps": comp.get("num_warps"), "num_stages": comp.get("num_stages"),
                     "repr": str(kw.get("repr", "")), "how": _how(counts, _counts()),
                     "attrs": _attrs(comp.get("configs"), names), "signature": _signature(comp.get("signature")),
                     "seconds": None if t0 is None else round(time.perf_counter() - t0, 3)})
        return None

    runtime.jit_cache_hook = before
    runtime.jit_post_compile_hook = after
    _installed.append(path)
    return True


def _args(text: str) -> str:
    """The argument part of Triton's repr: each argument's type and specialization."""
    return text[text.find("(") + 1:text.rfind(")")] if "(" in text else text


def summarize(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per kernel, most compile seconds first: variants (distinct constexprs, specialization, warps and stages),
    compiles (lines whose `how` is "compiled"; without a `how`, lines of COMPILED_S or more, which may be waits for
    another process's compile), their seconds, and for each constexpr and for the specialization the number of
    distinct values among the variants."""
    by: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    seconds: dict[str, float] = defaultdict(float)
    compiles: dict[str, int] = defaultdict(int)
    for r in rows:
        name = f"{r.get('module', '?')}.{r.get('kernel', '?')}"
        consts = r.get("constants") or {}
        key = json.dumps([consts, _args(r.get("repr", "")), r.get("attrs") or {}, r.get("signature") or {},
                          r.get("num_warps"), r.get("num_stages")], sort_keys=True)
        by[name][key] = r
        s = r.get("seconds") or 0.0
        how = r.get("how")
        if how == "compiled" or (how is None and s >= COMPILED_S):
            seconds[name] += s
            compiles[name] += 1
    out = []
    for name, variants in by.items():
        values: dict[str, set[str]] = defaultdict(set)
        for r in variants.values():
            for k, v in (r.get("constants") or {}).items():
                values[k].add(v)
            values["(specialization)"].add(_args(r.get("repr", "")) + json.dumps(r.get("attrs") or {}, sort_keys=True))
            values["(types)"].add(json.dumps(r.get("signature") or {}, sort_keys=True))
            values["(warps, stages)"].add(f"{r.get('num_warps')},{r.get('num_stages')}")
        spread = {k: len(v) for k, v in sorted(values.items(), key=lambda kv: -len(kv[1])) if len(v) > 1}
        out.append({"kernel": name, "variants": len(variants), "compiles": compiles[name],
                    "compile_s": round(seconds[name], 1), "distinct": spread})
    return sorted(out, key=lambda d: -d["compile_s"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.engine.compile_log",
                                 description="Sum a compile log ($MOE_HARNESS_COMPILE_LOG) by kernel.")
    ap.add_argument("log", nargs="+", help="compile log file(s)")
    args = ap.parse_args(argv)
    rows = []
    for path in args.log:
        with open(path, encoding="utf-8") as f:
            rows.extend(json.loads(line) for line in f if line.strip())
    table = summarize(rows)
    total = sum(d["compile_s"] for d in table)
    print(f"{len(rows)} variant loads, {sum(d['compiles'] for d in table)} compiles, {total:.0f} s compiling")
    for d in table:
        spread = ", ".join(f"{k} {n}" for k, n in d["distinct"].items())
        print(f"{d['compile_s']:8.1f} s {d['compiles']:5d} compiles {d['variants']:5d} variants  {d['kernel']}"
              f"{'  (' + spread + ')' if spread else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
