"""The draws follow an adapter's declarations: its limits (`<dim>_multiple`, `min_<dim>`, `max_<dim>`,
`expert_maps`) and its support rule for shapes steer the drawn cases, so that nearly every drawn case is judged
rather than turned away as unsupported; every limit key an op reads is in the one table (`harness.core.limits`),
listed by `python -m harness conventions`; an unknown key or a wrong value type is an error when the adapter is
made."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from harness import ops, registry
from harness.core import limits
from harness.core.case import Case
from harness.core.device import detect
from harness.engine import strategies as hs

CPU = detect("cpu")


def _reference(op: str) -> registry.Adapter:
    return registry.resolve(f"reference-{op.replace('_', '-')}")


def _drawn(adapter: registry.Adapter, n: int = 24, cells: list[dict[str, str]] | None = None) -> list[Case]:
    """`n` cases hypothesis draws for `adapter` (derandomized: the same ones every run)."""
    cells = cells if cells is not None else hs.declared_cells(adapter, CPU)
    found: list[Case] = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(case=hs.cases(adapter, cells))
    def draw(case: Case) -> None:
        found.append(case)

    draw()
    return list({c.case_id: c for c in found}.values())


def _judged(adapter: registry.Adapter, cases: list[Case]) -> float:
    """The share of `cases` the runner would judge: neither its limits nor its rule turn them away."""
    turned_away = [c for c in cases if adapter.shape_unsupported(c.shapes, c.params)
                   or adapter.case_unsupported(CPU, c.features, c.shapes)]
    return 1 - len(turned_away) / len(cases)


# ------------------------------------------------------------------------------------------- steered draws


@pytest.mark.parametrize("op", ["routing", "grouped_routing"])
def test_an_e_multiple_steers_the_routing_draws(op: str) -> None:
    """An adapter of an unseen library that needs E % 16 == 0: today most drawn cases came out unsupported."""
    adapter = dataclasses.replace(_reference(op), name="e-multiple-routing", limits={"E_multiple": 16})
    cases = _drawn(adapter)
    assert _judged(adapter, cases) >= 0.9, sorted({c.shapes["E"] for c in cases})


def _k_two_to_four(device: Any, features: Mapping[str, str], shapes: Mapping[str, int] | None) -> str | None:
    return "k in 2..4 only" if shapes is not None and not 2 <= shapes["k"] <= 4 else None


def _m_multiple_of_eight(device: Any, features: Mapping[str, str], shapes: Mapping[str, int] | None) -> str | None:
    return "M must be a multiple of 8" if shapes is not None and shapes["M"] % 8 else None


@pytest.mark.parametrize("rule", [_k_two_to_four, _m_multiple_of_eight])
def test_a_support_rule_for_shapes_steers_the_draws(rule: Callable[..., str | None]) -> None:
    """A rule the strategies cannot read (any function of the shapes): the draws ask it and draw again."""
    adapter = dataclasses.replace(_reference("routing"), name="ruled-routing", requires=rule)
    assert _judged(adapter, _drawn(adapter)) >= 0.85


def test_the_generic_tests_draw_for_their_device() -> None:
    """The rule is asked for the device the cases are judged on."""
    seen: set[Any] = set()

    def rule(device: Any, features: Mapping[str, str], shapes: Mapping[str, int] | None) -> str | None:
        if shapes is not None:
            seen.add(None if device is None else device.generation)
        return None

    adapter = dataclasses.replace(_reference("routing"), name="device-routing", requires=rule)

    @settings(max_examples=3, derandomize=True, database=None, deadline=None)
    @given(case=hs.cases(adapter, hs.declared_cells(adapter, CPU), CPU))
    def draw(case: Case) -> None:
        pass

    draw()
    assert seen == {CPU.generation}


def _dim_limits(op: str, dim: str) -> dict[str, int]:
    """A multiple, a min and a max of `dim` that leave several sizes in every cell (op-own multiples included)."""
    if dim == "k":
        return {"k_multiple": 2, "min_k": 2, "max_k": 4}
    if dim in ("K", "N") and op in ("experts", "group_quant", "act_quant"):
        return {f"{dim}_multiple": 8, f"min_{dim}": 16, f"max_{dim}": 512}
    return {f"{dim}_multiple": 4, f"min_{dim}": 8, f"max_{dim}": 32}


def _dims() -> list[tuple[str, str]]:
    return [(op, d.name) for op in ops.available() for d in limits.DIMS.get(op, ())]


def _dims_of(op: str, cell: Mapping[str, str]) -> set[str]:
    """The dims the cases of `cell` have (the batched experts format has max_tokens and no M or k)."""
    if op == "experts":
        return {"E", "K", "N", "max_tokens"} if cell["format"] == "batched" else {"M", "E", "k", "K", "N"}
    return {d.name for d in limits.DIMS[op]}


@pytest.mark.parametrize(("op", "dim"), _dims())
def test_every_dim_limit_of_every_op_steers_its_draws(op: str, dim: str) -> None:
    """For every dim of every op: its multiple always (a support rule), its min and max nearly always (budgets
    that per-expert counts may pass)."""
    lims = _dim_limits(op, dim)
    adapter = dataclasses.replace(_reference(op), name=f"limited-{op}", limits=lims)
    cells = [c for c in hs.declared_cells(adapter, CPU) if dim in _dims_of(op, c)]
    cases = [c for c in _drawn(adapter, 16, cells) if dim in c.shapes]
    assert cases, f"no drawn case of {op} has {dim}"
    sizes = [c.shapes[dim] for c in cases]
    assert all(s % lims[f"{dim}_multiple"] == 0 for s in sizes), sizes
    within = [s for s in sizes if lims[f"min_{dim}"] <= s <= lims[f"max_{dim}"]]
    assert len(within) >= 0.8 * len(sizes), sizes


# ------------------------------------------------------------------------------------------- expert maps


def _contiguous_only_reduce(case: Case, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    """A reduce kernel that reads an expert map as one contiguous range: from its first local expert, as many as it
    has local. Right for contiguous maps, wrong for others."""
    import torch

    from harness.core.inputs import contiguous_map
    from harness.ops.reference import _run_reduce

    emap = inputs.get("expert_map")
    if emap is not None:
        local = (emap >= 0).nonzero().flatten()
        start = int(local[0]) if local.numel() else 0
        inputs = {**inputs, "expert_map": contiguous_map(emap.numel(), local.numel(), "cpu", start=start).to(
            emap.device, torch.int32)}
    _run_reduce(case, inputs, outputs)


def _contiguous_adapter(lims: Mapping[str, Any]) -> registry.Adapter:
    base = _reference("reduce")
    support = {**base.support, "expert_map": ("Y",)}
    return dataclasses.replace(base, name="contiguous-only-reduce", run=_contiguous_only_reduce, support=support,
                               limits=dict(lims))


def _verdicts(adapter: registry.Adapter, cases: list[Case]) -> dict[str, int]:
    from harness.engine import runner

    found: dict[str, int] = {}
    for case in cases:
        verdict = runner.judge(case, adapter, CPU).verdict
        found[verdict] = found.get(verdict, 0) + 1
    return found


def test_a_contiguous_only_kernel_passes_once_it_declares_its_expert_maps(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.plugin.generic import explicit_examples

    # the CPU scale's draws, on any machine: the GPU scale's first eight happen to hold no map the kernel gets wrong
    monkeypatch.setenv("HARNESS_SCALE", "small")
    undeclared = _contiguous_adapter({})
    plan = _drawn(undeclared, 8) + explicit_examples(undeclared, hs.declared_cells(undeclared, CPU))
    assert _verdicts(undeclared, plan).get("fail", 0) > 0  # random maps: wrong (the generic test's plan finds it)
    declared = _contiguous_adapter({"expert_maps": ("contiguous",)})
    cells = hs.declared_cells(declared, CPU)
    drawn = _drawn(declared, 8, cells)
    assert {limits.map_shape(c.params, c.shapes["E"]) for c in drawn} <= {"contiguous", "identity"}
    mapped = drawn + [c for c in explicit_examples(declared, cells) if "local_experts" in c.params]
    assert _verdicts(declared, mapped) == {"pass": len(mapped)}


def test_an_expert_map_outside_the_declared_shapes_is_turned_away_unsupported() -> None:
    from harness.engine import runner

    declared = _contiguous_adapter({"expert_maps": ("contiguous",)})
    cell = hs.declared_cells(declared, CPU)[0]
    case = Case(op="reduce", adapter=declared.name, features=cell, seed=1, shapes={"M": 5, "E": 8, "k": 2, "K": 16},
                dtypes={"expert_out": cell["dtype"]}, params={"local_experts": 3, "routed_scaling_factor": 1.0})
    r = runner.judge(case, declared, CPU)
    assert r.verdict == "unsupported" and "random map" in r.reason, r.reason


def test_an_identity_declaration_draws_every_expert_local() -> None:
    adapter = _contiguous_adapter({"expert_maps": ("identity",)})
    drawn = _drawn(adapter, 8)
    assert drawn and all(c.params["local_experts"] == c.shapes["E"] for c in drawn)


def _needs_a_local_expert(case: Case, inputs: dict, outputs: dict) -> None:
    """reduce that sizes its work by the local experts, as triton_kernels' opt_flags do: none local divides by 0."""
    from harness.ops.reference import _run_reduce

    emap = inputs.get("expert_map")
    if emap is not None and not bool((emap >= 0).any()):
        raise ZeroDivisionError("integer division or modulo by zero")
    _run_reduce(case, inputs, outputs)


def test_a_kernel_needing_a_local_expert_passes_once_it_declares_min_local_experts() -> None:
    from harness.engine import runner
    from harness.plugin.generic import explicit_examples

    base = _reference("reduce")
    support = {**base.support, "expert_map": ("Y",)}
    undeclared = dataclasses.replace(base, name="needs-a-local-expert", run=_needs_a_local_expert, support=support)
    cells = hs.declared_cells(undeclared, CPU)
    fixed = [c for c in explicit_examples(undeclared, cells) if "local_experts" in c.params]
    assert "error" in _verdicts(undeclared, fixed)  # the boundary case with no local expert
    declared = dataclasses.replace(undeclared, limits={"min_local_experts": 1})
    mapped = _drawn(declared, 8, cells) + [c for c in explicit_examples(declared, cells) if "local_experts" in c.params]
    assert mapped and min(c.params.get("local_experts", 1) for c in mapped) >= 1
    assert _verdicts(declared, mapped) == {"pass": len(mapped)}
    empty = dataclasses.replace(fixed[0], params={**fixed[0].params, "local_experts": 0})
    r = runner.judge(empty, declared, CPU)
    assert r.verdict == "unsupported" and "min_local_experts" in r.reason, r.reason
    two = dataclasses.replace(undeclared, limits={"min_local_experts": 2})
    mapped = _drawn(two, 24, cells) + [c for c in explicit_examples(two, cells) if "local_experts" in c.params]
    assert _judged(two, mapped) == 1.0, sorted(c.params.get("local_experts") for c in mapped)


def test_the_drawn_and_fixed_maps_hold_the_declared_fewest_local_experts() -> None:
    from hypothesis import strategies as st

    from harness.ops.common import draw_map, map_fields

    adapter = dataclasses.replace(_reference("reduce"), limits={"min_local_experts": 3})
    found: list[int] = []

    @settings(max_examples=60, derandomize=True, database=None, deadline=None)
    @given(data=st.data())
    def draw(data: st.DataObject) -> None:
        found.append(data.draw(st.composite(lambda d: draw_map(d, adapter, 8))())["local_experts"])

    draw()
    assert min(found) == 3 and max(found) == 8
    assert [map_fields(adapter, 8, n)["local_experts"] for n in (0, 1, 5)] == [3, 3, 5]
    assert map_fields(adapter, 2, 0)["local_experts"] == 2  # every expert of two local: the identity


# ------------------------------------------------------------------------------- one table, listed, validated


class _Reads(Mapping[str, Any]):
    """Limits that hold nothing and remember every key read."""

    def __init__(self) -> None:
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return default

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return False

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


@pytest.mark.parametrize("op", ops.available())
def test_every_limit_key_an_op_reads_is_listed(op: str) -> None:
    """Its draws, boundary cases, value classes and explicit examples read only keys of the table."""
    from harness.plugin.generic import explicit_examples

    reads = _Reads()
    adapter = dataclasses.replace(_reference(op), limits=reads)
    cells = hs.declared_cells(adapter)
    _drawn(adapter, 12, cells)
    for cell in cells[:: max(1, len(cells) // 16)]:
        ops.get(op).boundary(adapter, cell)
    explicit_examples(adapter, cells)
    assert reads.read, "the op read no limit at all"
    assert reads.read <= set(limits.keys(op)), sorted(reads.read - set(limits.keys(op)))


@pytest.mark.parametrize("op", ops.available())
def test_the_conventions_reference_lists_every_limit_key_of_the_op(op: str) -> None:
    """docs/CONVENTIONS.md, the output of `python -m harness conventions` (tests/harness/test_conventions.py keeps it
    current), lists each key in the op's section."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "CONVENTIONS.md").read_text(encoding="utf-8")
    section = text.split(f"\n## `{op}`: ", 1)[1].split("\n## ", 1)[0]
    assert "### Limits" in section
    missing = [k for k in limits.keys(op) if f"| `{k}` |" not in section]
    assert not missing, missing


def test_an_unknown_limit_key_is_an_error_naming_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown limit 'E_multipel' for op routing; valid: .*E_multiple"):
        dataclasses.replace(_reference("routing"), limits={"E_multipel": 16})
    with pytest.raises(ValueError, match="unknown limit 'expert_maps' for op routing"):  # routing has no map
        dataclasses.replace(_reference("routing"), limits={"expert_maps": ("contiguous",)})


@pytest.mark.parametrize(("lims", "says"), [
    ({"E_multiple": "16"}, "E_multiple must be an integer >= 1"),
    ({"max_M": 0}, "max_M must be an integer >= 1"),
    ({"block_M": True}, "block_M must be an integer"),
    ({"expert_maps": "contiguous"}, "expert_maps must be a non-empty tuple"),
    ({"expert_maps": ("ranges",)}, "expert_maps must be a non-empty tuple of 'identity', 'contiguous', 'random'"),
    ({"cross_M": {"at": 65, "when": {}}}, "cross_M must be a size"),
    ({"min_E": 64, "max_E": 16}, "min_E=64 is above max_E=16"),
])
def test_a_limit_value_of_the_wrong_type_is_an_error(lims: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        dataclasses.replace(_reference("reduce"), limits=lims)


def test_every_registered_adapter_validates_and_its_limits_survive_a_kernel_host() -> None:
    """The built-in and third-party adapters (and the examples', made in their own tests) validate; the judge's
    copy of their declarations, read back from a host's JSON, validates too."""
    from harness.engine import hosted, remote

    assert not [f for f in registry.LOAD_FAILURES.values() if "limit" in f]
    for adapter in registry.all_adapters():
        if adapter.limits:
            back = remote.from_manifest(hosted.manifest(adapter), adapter.name, host=None)  # type: ignore[arg-type]
            assert json.dumps(hs.thresholds(back)) == json.dumps(hs.thresholds(adapter))
    mapped = _contiguous_adapter({"expert_maps": ("contiguous",)})
    assert remote.from_manifest(hosted.manifest(mapped), mapped.name, host=None).limits == {  # type: ignore[arg-type]
        "expert_maps": ("contiguous",)}
