"""The fixed cases follow the adapter's declarations, as the draws do.

An op's boundary cases and value-class cases are written once for every adapter (E = 8, K = 48, M = 0...). A case
whose shapes break one of the adapter's declared size limits (`<dim>_multiple`, `min_<dim>`, `max_<dim>`) or that
its `requires` rule turns away by its shapes would be reported unsupported: budget spent on a case the adapter
rejects by declaration. `fitted` moves each such dim to the nearest allowed size (up to the multiple; within the
min and max, which a multiple or per-expert counts may pass), repairs what the sizes link (k at most E, groups
dividing E, per-expert counts as long as E and filling M * k slots, local experts at most E), and keeps the result
only when the declarations accept it and the op's code takes it on the CPU as far as the original (its inputs,
its expected outputs, the value class it holds). A case that follows the declarations already is returned
unchanged: an adapter without size limits plans what it did.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from harness import ops
from harness.core import inputs as gen
from harness.core import limits as limit_table
from harness.core.case import Case
from harness.core.device import DeviceInfo
from harness.core.limits import Span
from harness.registry import Adapter, SupportRuleError

#: dims that per-expert counts fix (their sizes may pass the max, a budget: `Span.fit_up`)
COUNTED = ("M", "E", "max_tokens")

#: is the value class still present in a case's inputs (`ValueClass.present`)
Holds = Callable[[Case, Mapping[str, torch.Tensor]], bool]


def accepted(adapter: Adapter, device: DeviceInfo | None, cell: Mapping[str, str], fields: Mapping[str, Any]) -> bool:
    """Whether the runner would judge a case of `cell` with these fields rather than turn it away by the adapter's
    declarations (its shape limits, expert maps, the support rule for the shapes of a declared cell). A rule that
    raises accepts: the runner reports its error."""
    shapes = fields["shapes"]
    if adapter.shape_unsupported(shapes, fields.get("params")) is not None:
        return False
    try:  # device None: the rule answers for no device in particular, as when cells are planned
        return not (adapter.declares(cell, device)[0]
                    and adapter.case_unsupported(device, cell, shapes))  # type: ignore[arg-type]
    except SupportRuleError:
        return True


# ------------------------------------------------------------------------------------------------ sizes


def _dims(adapter: Adapter, shapes: Mapping[str, int]) -> list[str]:
    return [d.name for d in limit_table.DIMS.get(adapter.op, ()) if d.name in shapes]


def _span(adapter: Adapter, dim: str, v: int, counted: bool, align: int = 1) -> Span | None:
    """The sizes of `dim` the adapter declares for a case whose size is `v` (None: it declares none): a multiple of
    its `<dim>_multiple` (and of `align`), within its min and max; above 0 where `v` is (0 is a deliberate empty
    case); past the max where per-expert counts (`counted`) need it."""
    lims = adapter.limits
    mult, low, high = (lims.get(f"{dim}_multiple"), lims.get(f"min_{dim}"), lims.get(f"max_{dim}"))
    if mult is None and low is None and high is None:
        return None
    lo = 1 if v > 0 else 0
    return Span(lo=lo, hi=None, multiple=math.lcm(int(mult or 1), align), low=max(lo, int(low or 0)),
                high=None if high is None or (counted and dim in COUNTED) else int(high))


def follows(adapter: Adapter, fields: Mapping[str, Any]) -> bool:
    """Whether every dim of the case lies where the adapter's size limits put it (`Span.fit` leaves it)."""
    shapes, counted = fields["shapes"], "counts" in fields.get("params", {})
    for dim in _dims(adapter, shapes):
        sp = _span(adapter, dim, int(shapes[dim]), counted)
        if sp is not None and sp.fit(int(shapes[dim])) != int(shapes[dim]):
            return False
    return True


def _fit_dims(adapter: Adapter, shapes: dict[str, int], counted: bool, align: bool) -> None:
    """Each dim moved to the nearest size its limits allow; `align`: keeping the power-of-two alignment of the
    size (a K of groups of 128 stays a multiple of 128)."""
    for dim in _dims(adapter, shapes):
        v = int(shapes[dim])
        sp = _span(adapter, dim, v, counted, (v & -v) if align and v > 0 else 1)
        if sp is not None:
            shapes[dim] = sp.fit(v)


# ------------------------------------------------------------------------------------------- linked sizes


def _link_groups(shapes: dict[str, int], params: dict[str, Any]) -> None:
    """Groups that divide E (the largest divisor at most the old count), at most that many kept, and enough kept
    for k experts."""
    g, e = params.get("num_groups"), shapes.get("E")
    if g is None or e is None:
        return
    if e % g:
        g = params["num_groups"] = max(d for d in range(1, min(g, e) + 1) if e % d == 0)
    if "topk_group" in params:
        params["topk_group"] = min(max(params["topk_group"], -(-shapes.get("k", 1) // (e // g))), g)


def _centred_shift(e: int, aligned: int, n: int) -> int:
    """How far counts written for a contiguous map of `n` local experts among `aligned` experts move when there
    are `e` (the map is centred: `inputs.contiguous_map`)."""
    return max(0, (e - n) // 2 - (aligned - n) // 2)


def _link_counts(old: Mapping[str, int], shapes: dict[str, int], params: dict[str, Any]) -> None:
    """Per-expert counts as long as E (or the local experts they were as long as), filling M * k slots with each
    count at most M (`inputs.counts_to_rows`: the designed counts kept, filler experts after them), moved with a
    contiguous map's range as E grows."""
    counts = params.get("counts")
    if counts is None:
        return
    base = list(counts)
    while base and base[-1] == 0:
        base.pop()
    if "M" in shapes and "k" in shapes and (sum(base) != shapes["M"] * shapes["k"] or max(base, default=0)
                                            > shapes["M"]):
        shapes["M"], base = gen.counts_to_rows(base, shapes["k"], rows=shapes["M"])
    by_local = len(counts) == old.get("local_experts") != old.get("E")
    if by_local:
        params["local_experts"] = max(params["local_experts"], len(base))
        shapes["E"] = max(shapes["E"], params["local_experts"])
    elif "E" in shapes:
        shift = 0
        if params.get("map") == "contiguous":
            n = params["local_experts"]
            while len(base) + (shift := _centred_shift(shapes["E"], len(counts), n)) > shapes["E"]:
                shapes["E"] += 1
        shapes["E"] = max(shapes["E"], len(base))
        base = [0] * shift + base
    n = params["local_experts"] if by_local else shapes.get("E", len(base))
    params["counts"] = base + [0] * (n - len(base))


def _link(old: Mapping[str, int], shapes: dict[str, int], params: dict[str, Any]) -> None:
    """Repair what the moved sizes link: k at most E (E grown to k), the expert map's local experts (all of them
    stay all of them), groups dividing E, per-expert counts."""
    if "k" in shapes and "E" in shapes and shapes["k"] > shapes["E"]:
        shapes["E"] = shapes["k"]
    if "local_experts" in params and "E" in shapes:
        everyone = params["local_experts"] == old["E"]
        params["local_experts"] = shapes["E"] if everyone else min(params["local_experts"], shapes["E"])
    _link_groups(shapes, params)
    _link_counts(old, shapes, params)


def _moved(adapter: Adapter, fields: Mapping[str, Any], align: bool) -> dict[str, Any]:
    """The case with its dims at allowed sizes and what they link repaired, until both hold (a few rounds)."""
    shapes, params = dict(fields["shapes"]), dict(fields.get("params", {}))
    old = {**shapes, **({"local_experts": params["local_experts"]} if "local_experts" in params else {})}
    for _ in range(4):
        before = (dict(shapes), json.dumps(params, sort_keys=True))
        _fit_dims(adapter, shapes, "counts" in params, align)
        _link(old, shapes, params)
        if before == (shapes, json.dumps(params, sort_keys=True)):
            break
    moved = {**fields, "shapes": shapes}
    if "params" in fields or params:
        moved["params"] = params
    return moved


# ------------------------------------------------------------------------------------------------ checks


def reach(adapter: Adapter, cell: Mapping[str, str], fields: Mapping[str, Any], holds: Holds | None = None) -> int:
    """How far the op's own code takes the case on the CPU (its validation: a k above E, groups that do not divide
    E, counts that do not fill the slots raise there): 0 its inputs or outputs cannot be built, 1 they can, 2 its
    expected outputs too, 3 its inputs hold the value class `holds` as well."""
    spec = ops.get(adapter.op)
    case = Case(op=adapter.op, adapter=adapter.name, features=dict(cell), seed=0, **fields)
    try:
        inputs = spec.make_inputs(case, "cpu")
        spec.outputs(case, inputs)
    except Exception:  # any failure of the op's own code: not a case of the op
        return 0
    try:  # the oracle may refuse the cell itself (an undeclared, contradictory one): that is no fault of the sizes
        spec.expected(case, inputs, dict(adapter.conventions))
    except Exception:
        return 1
    return 3 if holds is not None and holds(case, inputs) else 2


def fitted(adapter: Adapter, cell: Mapping[str, str], fields: Mapping[str, Any], device: DeviceInfo | None = None,
           holds: Holds | None = None, *, reached: bool = True) -> Mapping[str, Any] | None:
    """`fields` itself where the adapter's size limits and declarations accept it; else the case moved to the
    nearest sizes they allow (`_moved`, plain, then keeping the sizes' power-of-two alignment) that they accept and
    that the op's code takes as far as `fields` (`reach`: built, its expected outputs, the value class `holds`;
    not asked with `reached` False, for a cell the adapter does not declare); None where no such case can be made."""
    judged = accepted(adapter, device, cell, fields)
    if judged and follows(adapter, fields):
        return fields
    need: int | None = None  # how far the original goes: asked only when a moved case falls short of the most
    most = 3 if holds is not None else 2
    for align in (False, True):
        moved = _moved(adapter, fields, align)
        if not (follows(adapter, moved) and accepted(adapter, device, cell, moved)):
            continue
        if not reached:
            return moved
        got = reach(adapter, cell, moved, holds)
        if got < most and need is None:
            need = max(1, reach(adapter, cell, fields, holds))
        if got >= (most if need is None else need):
            return moved
    return fields if judged else None  # past a min or max only (budgets): judged as it is


def _key(fields: Mapping[str, Any]) -> str:
    return json.dumps(fields, sort_keys=True, default=str)


def ask_rules_at_once(adapter: Adapter, device: DeviceInfo | None, cells: Sequence[Mapping[str, str]],
                      shapes: Sequence[Mapping[str, int]] | None = None) -> None:
    """An adapter in a kernel host answers its support rule for `cells` (each with its `shapes`, where given) in one
    request, not one round trip each (`RemoteAdapter.prefetch_rules`); `device` as the asking will name it. Nothing
    for an adapter in this process; a request that fails leaves them to be asked one at a time."""
    prefetch = getattr(adapter, "prefetch_rules", None)
    if prefetch is None or not cells:
        return
    with contextlib.suppress(Exception):
        prefetch(device, cells, shapes)


def _ask_rules_at_once(adapter: Adapter, device: DeviceInfo | None, cell: Mapping[str, str],
                       cases: Sequence[Mapping[str, Any]]) -> None:
    """The shape rule for a cell's cases at once: planning asked hundreds. Only for a hosted adapter: asking
    `declares` here would raise an in-process adapter's rule error outside the judging that records it."""
    if cases and hasattr(adapter, "prefetch_rules") and adapter.declares(cell, device)[0]:
        ask_rules_at_once(adapter, device, [cell] * len(cases), [c["shapes"] for c in cases])


def fitted_all(adapter: Adapter, cell: Mapping[str, str], cases: Sequence[Mapping[str, Any]],
               device: DeviceInfo | None = None, most: int | None = None,
               reached: bool = True) -> list[dict[str, Any]]:
    """`fitted` of each of a cell's fixed cases, those that cannot be fitted left out, a moved case that repeats
    an earlier one too (the first `most` found, where given; `reached`: as `fitted`); all of them as they were
    where none is left (the cell is then visibly unsupported)."""
    found: list[dict[str, Any]] = []
    seen: set[str] = set()
    _ask_rules_at_once(adapter, device, cell, cases[: most or len(cases)])
    for fields in cases:
        if most is not None and len(found) >= most:
            break
        fit = fitted(adapter, cell, fields, device, reached=reached)
        if fit is None or (fit is not fields and _key(fit) in seen):
            continue
        seen.add(_key(fit))
        found.append(dict(fit))
    return found or [dict(f) for f in cases[: most or len(cases)]]


def boundary(adapter: Adapter, cell: Mapping[str, str], device: DeviceInfo | None = None, *, start: int = 0,
             most: int | None = None, reached: bool = True) -> list[dict[str, Any]]:
    """The op's boundary cases of `cell` (`OpSpec.boundary`) fitted to the adapter's declarations (`fitted_all`);
    `start`, `most`: the first `most` that fit, taken in turn from the `start`-th on (moving a case costs its
    inputs and oracle on the CPU, so a plan that needs one case fits one); `reached`: as `fitted`."""
    cases = ops.get(adapter.op).boundary(adapter, cell)
    if cases and start:
        cases = cases[start % len(cases):] + cases[: start % len(cases)]
    return fitted_all(adapter, cell, cases, device, most, reached)
