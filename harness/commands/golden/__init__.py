"""Golden vectors: small committed inputs and outputs of the reference ops.

Each golden case is a function registered with `@golden("name")` in a module of `harness.commands.golden`; it builds
its inputs from fixed seeds on the CPU and returns a dict of named tensors (inputs and outputs). The dicts
are committed under `golden/<name>.pt`. `tests/test_golden.py` recomputes every case and requires it to be
bitwise equal to the stored file, so any change of the oracle's numbers (ours or a new torch's) is caught and
must be regenerated on purpose with `python -m harness golden --regenerate [NAME ...]`.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from harness.core.compare import bits

GOLDEN_DIR = Path(__file__).resolve().parents[3] / "golden"

GoldenFn = Callable[[], "dict[str, torch.Tensor]"]
_REGISTRY: dict[str, GoldenFn] = {}
_ULPS: dict[str, int] = {}


def golden(name: str, *, ulps: int = 0) -> Callable[[GoldenFn], GoldenFn]:
    """Register a golden case under `name` (also the file stem).

    `ulps`: float entries may differ from the stored ones by this many units in the last place. Only for cases
    whose numbers come from fp32 transcendentals (exp, erf), whose last bits differ between CPUs (vector units);
    everything else is compared bitwise (ulps=0).
    """

    def register(fn: GoldenFn) -> GoldenFn:
        if name in _REGISTRY:
            raise ValueError(f"golden case {name!r} registered twice")
        _REGISTRY[name] = fn
        _ULPS[name] = ulps
        return fn

    return register


def cases() -> dict[str, GoldenFn]:
    """All registered golden cases (imports every module of `harness.commands.golden`)."""
    import harness.commands.golden as pkg

    for mod in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"{pkg.__name__}.{mod.name}")
    return dict(sorted(_REGISTRY.items()))


def stored() -> list[str]:
    """The names of the stored golden files (`golden/<name>.pt`), sorted: known without importing a case."""
    return sorted(p.stem for p in GOLDEN_DIR.glob("*.pt"))


def path_of(name: str) -> Path:
    return GOLDEN_DIR / f"{name}.pt"


def compute(name: str) -> dict[str, torch.Tensor]:
    import torch

    all_cases = cases()
    if name not in all_cases:
        raise KeyError(f"unknown golden case {name!r}; known: {', '.join(all_cases)}")
    out = all_cases[name]()
    for key, value in out.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"golden case {name!r}: entry {key!r} is {type(value).__name__}, not a tensor")
    return {k: v.detach().cpu().contiguous() for k, v in out.items()}


def write(name: str) -> Path:
    import torch

    p = path_of(name)
    p.parent.mkdir(parents=True, exist_ok=True)
    torch.save(compute(name), p)
    return p


def load(name: str) -> dict[str, torch.Tensor]:
    import torch

    p = path_of(name)
    if not p.exists():
        raise FileNotFoundError(f"{p} is missing: run `python -m harness golden --regenerate {name}`")
    return torch.load(p, map_location="cpu", weights_only=True)


def _ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in units in the last place between two float tensors (same dtype); NaN vs NaN is 0."""
    import torch

    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    bits = a.element_size() * 8

    def ordinal(t: torch.Tensor) -> torch.Tensor:
        i = t.contiguous().view(width).to(torch.int64)
        return torch.where(i < 0, -(i & ((1 << (bits - 1)) - 1)), i)  # monotone in the float value

    d = (ordinal(a) - ordinal(b)).abs()
    return torch.where(a.isnan() & b.isnan(), torch.zeros_like(d), d)


def mismatches(name: str) -> list[str]:
    """Differences between the stored golden file and a fresh computation (empty when equal: bitwise, or within
    the case's declared ulps for float entries)."""
    import torch

    cases()
    stored, fresh = load(name), compute(name)
    ulps = _ULPS.get(name, 0)
    problems = []
    for key in sorted(set(stored) | set(fresh)):
        if key not in fresh:
            problems.append(f"{key}: stored but no longer computed")
        elif key not in stored:
            problems.append(f"{key}: computed but not stored")
        else:
            a, b = stored[key], fresh[key]
            if a.dtype != b.dtype or a.shape != b.shape:
                problems.append(f"{key}: stored {a.dtype}{list(a.shape)} vs computed {b.dtype}{list(b.shape)}")
            elif ulps and a.dtype.is_floating_point and a.element_size() > 1:
                d = _ulp_distance(a, b)
                if (d > ulps).any():
                    problems.append(f"{key}: {int((d > ulps).sum())} elements more than {ulps} ulps apart "
                                    f"(max {int(d.max())})")
            elif not torch.equal(bits(a), bits(b)):
                n = int((bits(a) != bits(b)).sum())
                problems.append(f"{key}: {n} elements differ bitwise")
    return problems


# -- command line -------------------------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> int:

    known = cases()
    names = args.names or list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"error: unknown golden case(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    bad = 0
    for name in names:
        if args.regenerate:
            print(f"wrote {write(name)}")
            continue
        try:
            problems = mismatches(name)
        except FileNotFoundError as e:
            problems = [str(e)]
        bad += bool(problems)
        print(f"{'ok  ' if not problems else 'DIFF'} {name}" + (f": {'; '.join(problems)}" if problems else ""))
    return 1 if bad else 0


def add_parser(sub: Any) -> None:
    """Add the command to the `python -m harness` subparsers."""
    g = sub.add_parser("golden", help="check or regenerate the committed golden vectors")
    g.add_argument("names", nargs="*", help="golden case names (default: all)")
    g.add_argument("--regenerate", action="store_true", help="recompute and overwrite the stored files")
    g.set_defaults(func=run)
