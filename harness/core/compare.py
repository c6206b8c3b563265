"""Comparison modes (ARCHITECTURE.md): exact, set, codes(k) and bounded.

Each comparison returns a `Comparison` with a pass flag, metrics (max error, margin, mismatch count, first
indices) and a human-readable reason. `mask` arguments select the elements that are part of the contract
(padding rows, for example, are not).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

MAX_INDICES = 5


@dataclass
class Comparison:
    name: str
    mode: str
    passed: bool
    reason: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "mode": self.mode, "passed": self.passed, "reason": self.reason,
                "metrics": self.metrics}


def _first_indices(bad: torch.Tensor) -> list[list[int]]:
    return bad.nonzero()[:MAX_INDICES].tolist()


def _shape_problem(name: str, mode: str, actual: torch.Tensor, expected: torch.Tensor) -> Comparison | None:
    if actual.shape != expected.shape:
        return Comparison(name, mode, False, f"{name}: shape {list(actual.shape)} != expected {list(expected.shape)}")
    return None


def bits(t: torch.Tensor) -> torch.Tensor:
    """Integer view of a tensor's bits, one integer per element (for bitwise equality)."""
    import torch

    t = t.contiguous()
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    if not t.dtype.is_floating_point:
        return t
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(width)


def run_bits(t: torch.Tensor) -> torch.Tensor:
    """`bits`, with every NaN as one canonical NaN: what two runs of a kernel must agree on (determinism, batch
    invariance). A NaN's payload and sign are not a result (vectorized and scalar paths of one kernel differ in
    them); a NaN where the other run has a number still differs. fp8 NaN codes are kept as they are."""
    import torch

    t = t.detach()
    if t.dtype.is_floating_point and t.element_size() > 1:
        t = torch.where(t.isnan(), torch.tensor(float("nan"), dtype=t.dtype, device=t.device), t)
    return bits(t)


def compare_exact(
    name: str, actual: torch.Tensor, expected: torch.Tensor, *, mask: torch.Tensor | None = None,
    nan_equal: bool = True,
) -> Comparison:
    """Bitwise equality. Float NaNs compare equal to any NaN (NaN payloads differ between kernels); -0 != +0."""
    if (p := _shape_problem(name, "exact", actual, expected)) is not None:
        return p
    if actual.dtype != expected.dtype:
        return Comparison(name, "exact", False, f"{name}: dtype {actual.dtype} != expected {expected.dtype}")
    a, e = actual.detach().cpu(), expected.detach().cpu()
    diff = bits(a) != bits(e)
    if nan_equal and a.dtype.is_floating_point and a.dtype.itemsize > 1:
        diff &= ~(a.isnan() & e.isnan())
    if mask is not None:
        diff &= mask.cpu().expand_as(diff)
    n = int(diff.sum())
    metrics: dict[str, Any] = {"mismatches": n, "numel": a.numel(), "first_indices": _first_indices(diff)}
    if n == 0:
        return Comparison(name, "exact", True, "", metrics)
    idx = tuple(metrics["first_indices"][0])
    reason = (f"{name}: {n} of {a.numel()} elements differ bitwise; first at {list(idx)}: "
              f"got {a[idx].item()!r}, expected {e[idx].item()!r}")
    return Comparison(name, "exact", False, reason, metrics)


def compare_set(
    name: str, actual: torch.Tensor, expected: torch.Tensor, *, mask: torch.Tensor | None = None
) -> Comparison:
    """Per-row multiset equality of the last dimension (e.g. top-k ids in any order)."""
    import torch

    if (p := _shape_problem(name, "set", actual, expected)) is not None:
        return p
    a = actual.detach().cpu().to(torch.int64).sort(dim=-1).values
    e = expected.detach().cpu().to(torch.int64).sort(dim=-1).values
    bad_rows = (a != e).any(dim=-1)
    if mask is not None:
        bad_rows &= mask.cpu()
    n = int(bad_rows.sum())
    metrics = {"mismatched_rows": n, "rows": int(bad_rows.numel()), "first_indices": _first_indices(bad_rows)}
    if n == 0:
        return Comparison(name, "set", True, "", metrics)
    r = tuple(metrics["first_indices"][0])
    reason = (f"{name}: {n} of {bad_rows.numel()} rows hold a different set; first row {list(r)}: "
              f"got {actual[r].tolist()}, expected {expected[r].tolist()}")
    return Comparison(name, "set", False, reason, metrics)


def compare_codes(
    name: str, actual: torch.Tensor, expected: torch.Tensor, *, k: int, step_of: Any = None,
    mask: torch.Tensor | None = None,
) -> Comparison:
    """Quantized codes at most `k` steps apart. `step_of(codes) -> int64 ordinal` maps codes to a monotone
    integer scale (default: the integer value of the codes)."""
    import torch

    if (p := _shape_problem(name, f"codes({k})", actual, expected)) is not None:
        return p
    to_ord = step_of or (lambda c: c.to(torch.int64))
    a, e = to_ord(actual.detach().cpu()), to_ord(expected.detach().cpu())
    dist = (a - e).abs()
    if mask is not None:
        dist = torch.where(mask.cpu().expand_as(dist), dist, torch.zeros_like(dist))
    bad = dist > k
    n = int(bad.sum())
    metrics = {"mismatches": n, "max_steps": int(dist.max()) if dist.numel() else 0,
               "off_by_some": int((dist > 0).sum()), "first_indices": _first_indices(bad)}
    if n == 0:
        return Comparison(name, f"codes({k})", True, "", metrics)
    idx = tuple(metrics["first_indices"][0])
    reason = f"{name}: {n} codes more than {k} step(s) apart; first at {list(idx)}: {int(a[idx])} vs {int(e[idx])}"
    return Comparison(name, f"codes({k})", False, reason, metrics)


def compare_bounded(
    name: str, actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor, *,
    mask: torch.Tensor | None = None,
) -> Comparison:
    """Elementwise |actual - expected| <= bound (NaN/Inf in `actual` where `expected` is finite always fails)."""
    import torch

    if (p := _shape_problem(name, "bounded", actual, expected)) is not None:
        return p
    a = actual.detach().cpu().to(torch.float64)
    e = expected.detach().cpu().to(torch.float64)
    b = bound.detach().cpu().to(torch.float64).expand_as(e)
    err = (a - e).abs()
    same_nonfinite = (~e.isfinite()) & ((a == e) | (a.isnan() & e.isnan()))
    err = torch.where(same_nonfinite, torch.zeros_like(err), err)
    err = torch.where(err.isnan(), torch.full_like(err, float("inf")), err)
    keep = torch.ones_like(err, dtype=torch.bool) if mask is None else mask.cpu().expand_as(err)
    bad = (err > b) & keep
    # error / bound; where the bound is exactly 0 (a step judged bit-exact) any error is an infinite margin
    ratio = torch.where(b > 0, err / b.clamp_min(1e-300), torch.where(err > 0, float("inf"), 0.0))
    ratio = torch.where(keep, ratio, torch.zeros_like(err))
    n = int(bad.sum())
    metrics: dict[str, Any] = {
        "max_error": float(err[keep].max()) if keep.any() else 0.0,
        "margin": float(ratio.max()) if ratio.numel() else 0.0,
        "mismatches": n, "numel": int(keep.sum()), "first_indices": _first_indices(bad),
    }
    if n == 0:
        return Comparison(name, "bounded", True, "", metrics)
    worst = tuple(int(i) for i in torch.unravel_index(ratio.argmax(), ratio.shape))
    reason = (f"{name}: {n} of {int(keep.sum())} elements outside the error bound (margin {metrics['margin']:.3g});"
              f" worst at {list(worst)}: got {a[worst].item():.6g}, expected {e[worst].item():.6g}, "
              f"bound {b[worst].item():.3g}" + (" (exact: the bound is 0 there)" if b[worst].item() == 0 else ""))
    return Comparison(name, "bounded", False, reason, metrics)
