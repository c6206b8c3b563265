"""`KnownFinding`: a documented divergence of a third-party kernel, declared by its adapter.

A library we did not write can be wrong in a region of the input space (SGLang's portable path at top-k 1): the
divergence is documented in docs/FINDINGS.md with a case file, and every case of the region fails the same way.
The adapter declares it so that the generic test does not spend minutes shrinking the same cause on every run:

- `region`: which cases it covers, as feature values (`features`: axis -> values), sizes (`shapes`: dim -> the
  sizes, a tuple of them or a range {"min": a, "max": b}) and integer parameters of the op (`params`: name -> values
  or a range, e.g. grouped routing's `num_groups`); a case is inside when every constraint holds;
- `checks`: the checks that fail there (a `fail` whose failed checks are all among them is the finding);
- `case`: one case inside the region, which every run judges and which must still fail that way (if it passes,
  the finding no longer reproduces and its declaration must go);
- `finding`: where it is documented (a docs/FINDINGS.md entry).

The property search skips the region; the fixed cases inside it are judged, and a failure there that the
declaration does not name still fails the test. The matrix ignores the declaration: it judges and records those
cases as they are. The coverage report shows each adapter's region (`python -m harness coverage`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.core.case import Case
from harness.core.causes import EXTRA_RUNS

#: the keys of a size range
RANGE_KEYS = ("min", "max")


@dataclass(frozen=True)
class KnownFinding:
    """A documented divergence of an adapter's kernel (module docstring). `features`: axis -> the values of the
    region; `shapes`: dim -> a tuple of sizes or {"min": a, "max": b} (either bound may be left out); `params`: an
    integer parameter of the op's cases -> values or a range, as `shapes`."""

    finding: str
    checks: tuple[str, ...]
    case: Case
    features: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    shapes: Mapping[str, Any] = field(default_factory=dict)
    params: Mapping[str, Any] = field(default_factory=dict)

    def contains(self, case: Case) -> bool:
        """Whether `case` lies in the region (a case of another op, or without one of its dims, does not)."""
        return case.op == self.case.op and self.holds(case.features, case.shapes, case.params)

    def holds(self, features: Mapping[str, str], shapes: Mapping[str, int],
              params: Mapping[str, Any] | None = None) -> bool:
        """Whether a case of the adapter's op with these features, sizes and parameters lies in the region (a case
        without a constrained parameter does not)."""
        if any(features.get(axis) not in values for axis, values in self.features.items()):
            return False
        if not all(dim in shapes and _size_in(int(shapes[dim]), want) for dim, want in self.shapes.items()):
            return False
        given = params or {}
        return all(isinstance(given.get(name), int) and _size_in(given[name], want)
                   for name, want in self.params.items())

    def expected(self, failed_checks: Sequence[str]) -> bool:
        """Whether a `fail` with these failed checks is this finding: some failed, each of them declared (a check of
        the extra runs a judging draws at random, `repeat:out`, counts as the check it repeats, `out`)."""
        plain = {c.split(":", 1)[1] if c.startswith(EXTRA_RUNS) else c for c in failed_checks}
        return bool(plain) and plain <= set(self.checks)

    def describe(self) -> str:
        """The region in words: `apply_weight_on_input in {Y}, k = 1, M >= 1`."""
        parts = [f"{axis} in {{{', '.join(values)}}}" for axis, values in self.features.items()]
        parts += [_describe_size(dim, want) for dim, want in {**self.shapes, **self.params}.items()]
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"finding": self.finding, "checks": list(self.checks), "case": self.case.to_dict(),
                "features": {a: list(v) for a, v in self.features.items()},
                "shapes": _sizes_dict(self.shapes), "params": _sizes_dict(self.params)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> KnownFinding:
        return cls(finding=d["finding"], checks=tuple(d["checks"]), case=Case.from_dict(d["case"]),
                   features={a: tuple(v) for a, v in d.get("features", {}).items()},
                   shapes=_sizes_from(d.get("shapes", {})), params=_sizes_from(d.get("params", {})))


def _sizes_dict(sizes: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (dict(w) if isinstance(w, Mapping) else list(w)) for k, w in sizes.items()}


def _sizes_from(sizes: Mapping[str, Any]) -> dict[str, Any]:
    return {k: dict(w) if isinstance(w, Mapping) else tuple(w) for k, w in sizes.items()}


def _size_in(size: int, want: Any) -> bool:
    if isinstance(want, Mapping):
        return want.get("min", size) <= size <= want.get("max", size)
    return size in want


def _describe_size(dim: str, want: Any) -> str:
    if not isinstance(want, Mapping):
        return f"{dim} = {want[0]}" if len(want) == 1 else f"{dim} in {{{', '.join(str(v) for v in want)}}}"
    if "min" in want and "max" in want:
        return f"{want['min']} <= {dim} <= {want['max']}"
    return f"{dim} >= {want['min']}" if "min" in want else f"{dim} <= {want['max']}"


def validate(known: KnownFinding, adapter: str, op: str, support: Mapping[str, Sequence[str]],
             limits: Mapping[str, Any]) -> None:
    """Refuse a declaration that cannot mean what it says (ValueError naming the adapter and what is wrong): no
    documentation or checks, an empty region (a value the adapter does not declare, no size, a case outside it),
    or a region that covers every case of the adapter (nothing left for the search)."""
    if not isinstance(known, KnownFinding):
        raise TypeError(f"adapter {adapter!r}: known findings must be KnownFinding objects, got {type(known).__name__}")
    where = f"adapter {adapter!r}: known finding {known.finding!r}"
    if not known.finding.strip():
        raise ValueError(f"adapter {adapter!r}: a known finding must name where it is documented (finding='...')")
    if not known.checks or not all(isinstance(c, str) and c for c in known.checks):
        raise ValueError(f"{where}: checks must name the checks that fail in its region (e.g. ('out',)), "
                         f"got {known.checks!r}")
    if (known.case.adapter, known.case.op) != (adapter, op):
        raise ValueError(f"{where}: its case must be a case of adapter {adapter!r} (op {op}), got adapter "
                         f"{known.case.adapter!r} (op {known.case.op})")
    if not known.features and not known.shapes and not known.params:
        raise ValueError(f"{where}: its region has no constraint, so it covers every case of the adapter; name the "
                         "feature values (features={axis: values}) or sizes (shapes={dim: sizes}) where it occurs")
    _check_features(known, where, support)
    _check_shapes(known, where)
    _check_params(known, where)
    if not known.contains(known.case):
        raise ValueError(f"{where}: its case (features {dict(known.case.features)}, shapes {dict(known.case.shapes)}) "
                         f"lies outside its region ({known.describe()}); the region must contain it")
    if not known.params and all(set(v) >= set(support.get(a, ())) for a, v in known.features.items()) \
            and all(_all_sizes(dim, want, limits) for dim, want in known.shapes.items()):
        raise ValueError(f"{where}: its region ({known.describe()}) covers every case the adapter declares; a "
                         "known finding excludes part of the input space, never all of it")


def _check_features(known: KnownFinding, where: str, support: Mapping[str, Sequence[str]]) -> None:
    for axis, values in known.features.items():
        if axis not in support:
            raise ValueError(f"{where}: features names axis {axis!r}, which the adapter does not declare; its axes: "
                             f"{', '.join(support)}")
        if isinstance(values, str) or not values:
            raise ValueError(f"{where}: features[{axis!r}] must be a non-empty tuple of values, got {values!r}")
        if undeclared := [v for v in values if v not in support[axis]]:
            raise ValueError(f"{where}: features[{axis!r}] holds {', '.join(map(str, undeclared))}, which the adapter "
                             f"does not declare (no case has it); declared: {', '.join(support[axis])}")


def _check_shapes(known: KnownFinding, where: str) -> None:
    for dim, want in known.shapes.items():
        if dim not in known.case.shapes:
            raise ValueError(f"{where}: shapes names dim {dim!r}, which its op's cases do not have; dims: "
                             f"{', '.join(known.case.shapes)}")
        if isinstance(want, Mapping):
            if not _valid_range(want):
                raise ValueError(f"{where}: shapes[{dim!r}] as a range must be {{'min': int, 'max': int}} (either "
                                 f"may be left out) with min <= max, got {dict(want)!r}")
        elif not _valid_values(want, least=0):
            raise ValueError(f"{where}: shapes[{dim!r}] must be a non-empty tuple of sizes (ints >= 0) or a range "
                             f"{{'min': a, 'max': b}}, got {want!r}")


def _check_params(known: KnownFinding, where: str) -> None:
    for name, want in known.params.items():
        if not isinstance(known.case.params.get(name), int):
            raise ValueError(f"{where}: params names {name!r}, which its case does not have as an integer; its "
                             f"params: {', '.join(known.case.params) or 'none'}")
        if not (_valid_range(want) if isinstance(want, Mapping) else _valid_values(want)):
            raise ValueError(f"{where}: params[{name!r}] must be a non-empty tuple of ints or a range "
                             f"{{'min': a, 'max': b}}, got {want!r}")


def _valid_range(want: Mapping[str, Any]) -> bool:
    """{"min": a, "max": b} (either left out, not both) of ints with a <= b."""
    return (bool(want) and set(want) <= set(RANGE_KEYS) and all(isinstance(v, int) for v in want.values())
            and want.get("min", 0) <= want.get("max", want.get("min", 0)))


def _valid_values(want: Any, least: int | None = None) -> bool:
    """A non-empty sequence of ints (each at least `least`, when given)."""
    return (not isinstance(want, (str, bytes)) and bool(want)
            and all(isinstance(v, int) and (least is None or v >= least) for v in want))


def _all_sizes(dim: str, want: Any, limits: Mapping[str, Any]) -> bool:
    """Whether the sizes `want` take in every size of `dim` the adapter's limits allow (a range from 0 with no top,
    or every size between its `min_<dim>` and `max_<dim>`)."""
    low, high = int(limits.get(f"min_{dim}", 0) or 0), limits.get(f"max_{dim}")
    if isinstance(want, Mapping):
        return want.get("min", 0) <= low and ("max" not in want or (high is not None and want["max"] >= high))
    return high is not None and all(v in want for v in range(low, int(high) + 1))


def finding_of(known: Sequence[KnownFinding], case: Case) -> KnownFinding | None:
    """The first of `known` whose region holds `case` (None: outside every region)."""
    return next((k for k in known if k.contains(case)), None)
