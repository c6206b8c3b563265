"""The differential run behind `python -m harness differential`: a Triton kernel's case judged twice on the same
inputs, by Triton's interpreter on the CPU and compiled on a GPU, and the two outputs and verdicts compared.

A `Side` is one way to run the kernel: the device of its kernel host, what that host's environment sets or removes
(`TRITON_INTERPRET=1` for the interpreter: it must be on before the host imports triton, so each side has a host of
its own) and the device the case is judged as. The judge (a worker process of the run) builds the case's inputs
once from its seed, has each side judged by the normal runner on copies of them (`runner.judge(inputs=...,
keep=...)`), compares the two first runs' outputs bit for bit within each output's contract, and classifies the
case (`CLASSES`). Tests plug in two interpreter sides, one of them perturbed through its environment.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from harness import ops
from harness.core.case import Case
from harness.core.compare import bits
from harness.core.device import DeviceInfo
from harness.core.paths import public_record
from harness.core.result import Result, strict_json
from harness.engine import remote, runner
from harness.engine.host import Host

# every class a case gets, in report order; the verdicts that judged the outputs (any other: not comparable)
from harness.store.differential import CLASSES as CLASSES
from harness.store.differential import JUDGED as JUDGED

#: the classes where the CPU's verdict is not the GPU's (the run exits 1 when it finds one)
DISAGREEMENTS: tuple[str, ...] = ("interp_only_failure", "gpu_only_failure")
#: the two sides' keys in a record
SIDE_KEYS = ("interp", "gpu")


@dataclass(frozen=True)
class Side:
    """One way to run a kernel. host_device: where its kernel host runs it ("cpu": the interpreter; "cuda:N");
    device: what its cases are judged as; env: variables set (a string) or removed (None) in its hosts' environment;
    label: how reports name it (a generation, or what a test side stands for)."""

    key: str
    host_device: str
    device: DeviceInfo
    env: tuple[tuple[str, str | None], ...] = ()
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or self.device.generation


@contextlib.contextmanager
def environ(overlay: Mapping[str, str | None]) -> Iterator[None]:
    """`os.environ` with `overlay` applied (None removes a variable), restored after."""
    saved = {k: os.environ.get(k) for k in overlay}
    try:
        for k, v in overlay.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class SideHost(Host):
    """A kernel host that starts (and restarts, after a crash) with its side's environment."""

    def __init__(self, side: Side, *, threads: int | None = None):
        super().__init__(side.host_device, threads=threads)
        self.env = dict(side.env)

    def start(self) -> None:
        with environ(self.env):
            super().start()


@dataclass
class Opened:
    """An adapter loaded in its side's kernel host, and what that host's interpreter cannot verify."""

    side: Side
    adapter: remote.RemoteAdapter
    unverifiable: set[str] | None = None

    def close(self) -> None:
        if self.adapter.host is not None:
            self.adapter.host.close()


def open_side(spec: str, side: Side) -> Opened:
    """Adapter `spec` in a fresh host of `side` (ValueError or remote.HostError when it cannot be loaded)."""
    host = SideHost(side)
    try:
        adapter = remote.open_adapter(spec, side.host_device, host=host)
        unverifiable = None
        if side.device.generation == "interp":  # the host's own fidelity report, under its own environment
            reply = host.ask(("unverifiable",))
            if "error" in reply:
                raise remote.HostError(f"adapter {spec!r}: {reply['error']}")
            unverifiable = set(reply.get("ok") or [])
    except BaseException:
        host.close()
        raise
    return Opened(side, adapter, unverifiable)


# -- comparing two sides' outputs ---------------------------------------------------------------------------------

def _contract(check: Any, shape: torch.Size) -> torch.Tensor:
    """The elements of an output its contract judges: its mask, less what the kernel must leave untouched (both
    hold what each run's buffer held before, which differs between runs)."""
    sel = torch.ones(shape, dtype=torch.bool)
    if check is None:
        return sel
    if check.mask is not None:
        sel &= check.mask.detach().cpu().bool().expand(shape)
    if check.untouched is not None:
        sel &= ~check.untouched.detach().cpu().bool().expand(shape)
    return sel


def _max_abs(x: torch.Tensor, y: torch.Tensor) -> float | int | None:
    if x.dtype.is_floating_point:
        a, b = x.double(), y.double()
        both = a.isfinite() & b.isfinite()
        return float((a[both] - b[both]).abs().max()) if bool(both.any()) else None
    return int((x.long() - y.long()).abs().max())


def compare_tensors(x: torch.Tensor, y: torch.Tensor, sel: torch.Tensor, mode: str = "") -> dict[str, Any]:
    """Bit for bit, within `sel`: equal, or how many elements differ, the first of them and the largest difference
    between finite values (`nonfinite`: elements where only one side is NaN/Inf, or both but not the same)."""
    if tuple(x.shape) != tuple(y.shape) or x.dtype != y.dtype:
        return {"mode": mode, "equal": False, "elements": int(sel.sum()),
                "why": f"shape/dtype {list(x.shape)} {x.dtype} against {list(y.shape)} {y.dtype}"}
    diff = (bits(x) != bits(y)) & sel
    n = int(diff.sum())
    found: dict[str, Any] = {"mode": mode, "equal": n == 0, "elements": int(sel.sum()), "differing": n}
    if n:
        found["first_index"] = diff.nonzero()[0].tolist()
        xs, ys = x[diff], y[diff]
        found["max_abs_diff"] = _max_abs(xs, ys)
        if x.dtype.is_floating_point:
            found["nonfinite"] = int((~(xs.double().isfinite() & ys.double().isfinite())).sum())
    return found


def compare_outputs(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each contract output the two sides' first runs wrote (`runner.judge`'s keep), compared bit for bit within
    both sides' contracts; {} when a side kept none (its kernel failed before it returned)."""
    outs_a, outs_b = a.get("outputs") or {}, b.get("outputs") or {}
    checks_a, checks_b = a.get("expected") or {}, b.get("expected") or {}
    found = {}
    for name, check in checks_a.items():
        x, y = outs_a.get(name), outs_b.get(name)
        if x is None or y is None:
            continue
        sel = _contract(check, x.shape)
        if tuple(y.shape) == tuple(x.shape):
            sel &= _contract(checks_b.get(name), x.shape)
        found[name] = compare_tensors(x, y, sel, check.mode)
    return found


# -- classes ------------------------------------------------------------------------------------------------------

def classify(interp: str, gpu: str, identical: bool, unstable: bool = False) -> str:
    """The class of a case from the two verdicts and whether the outputs are bit-identical. `unstable`: the failing
    side's two runs on the same inputs differed (the kernel reads memory it never wrote, or races): a one-sided
    failure is then the kernel's own nondeterminism, which either side may show or hide by luck, not a fidelity
    defect or a device-dependent path."""
    if interp not in JUDGED or gpu not in JUDGED:
        return "not_comparable"
    if interp == gpu == "pass":
        return "agree" if identical else "agree_within_contract"
    if interp == gpu == "fail":
        return "both_fail"
    if unstable:
        return "nondeterministic"
    return "interp_only_failure" if interp == "fail" else "gpu_only_failure"


def unstable(result: Result) -> bool:
    """Whether `result` failed its determinism check (two runs on the same inputs differ bitwise)."""
    return any(str(c).startswith("deterministic:") for c in result.metrics.get("failed_checks", []))


#: conventions under which a kernel's results are approximate on the GPU, and what each makes differ
_APPROXIMATE = {
    ("division", "approximate"): "approximate division (fp32 '/' as div.full.f32)",
    ("log2", "approximate"): "approximate log2 (lg2.approx.f32)",
    ("matmul_precision", "tf32"): "tf32 GEMM operands",
    ("matmul_precision", "fp8_mma_promoted"): "fp8 fast accumulation (tensor-core partial sums promoted late)",
}
#: what a bounded difference comes from, per op, where no convention says
_BOUNDED_BY_OP = {"experts": "GEMM accumulation order (tensor cores against the interpreter's fp32 dot)",
                  "reduce": "summation order"}
_BOUNDED_OTHERWISE = "approximate GPU math (exp/log/sigmoid, fp32 '/', fused multiply-add)"
_MODE_WHY = {"codes": "quantized codes a step apart at a rounding boundary", "set": "the same set in another order",
             "custom": "another valid answer under the op's own rule (ties)"}


def contract_why(op: str, outputs: Mapping[str, Mapping[str, Any]], conventions: Mapping[str, Any]) -> str:
    """Why two passing sides may differ: per differing output its comparison mode, and the conventions (or the op's
    arithmetic) that make the contract approximate there."""
    causes = [text for (key, value), text in _APPROXIMATE.items() if conventions.get(key) == value]
    parts = []
    for name, found in outputs.items():
        if found.get("equal"):
            continue
        mode = found.get("mode", "")
        if mode == "bounded":
            said = causes or [_BOUNDED_BY_OP.get(op, _BOUNDED_OTHERWISE)]
            parts.append(f"{name}: bounded ({'; '.join(said)})")
        else:
            parts.append(f"{name}: {mode} ({_MODE_WHY.get(mode, 'within its contract')})")
    return "; ".join(parts) or "outputs differ outside the compared contract"


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def explain(cls: str, results: Sequence[Result], sides: Sequence[Opened], op: str,
            outputs: Mapping[str, Mapping[str, Any]], conventions: Mapping[str, Any]) -> str:
    """One line on why the case got its class."""
    if cls == "agree":
        return ""
    if cls == "agree_within_contract":
        return contract_why(op, outputs, conventions)
    if cls == "not_comparable":
        return "; ".join(f"{o.side.name}: {r.verdict}: {_short(r.reason)}" for r, o in zip(results, sides)
                         if r.verdict not in JUDGED)
    return "; ".join(f"{o.side.name} fails: {_short(r.reason)}" for r, o in zip(results, sides) if r.verdict == "fail")


# -- one case -----------------------------------------------------------------------------------------------------

def side_summary(r: Result) -> dict[str, Any]:
    """What a record keeps of one side's verdict."""
    m = r.metrics
    found = {"generation": r.generation, "verdict": r.verdict, "reason": _short(r.reason, 2000),
             "declared": r.declared, "duration_s": r.duration_s}
    found.update({k: m[k] for k in ("failed_checks", "max_error", "margin", "library") if k in m})
    return found


def _judge(case: Case, opened: Opened, inputs: Mapping[str, Any] | None,
           timeout: float | None) -> tuple[Result, dict[str, Any]]:
    keep: dict[str, Any] = {}
    device = opened.side.device
    try:
        r = runner.judge(case, opened.adapter, device, unverifiable=opened.unverifiable, timeout=timeout,
                         inputs=inputs, keep=keep)
    except Exception as e:  # runner.judge should not raise; if it does, the side still has a verdict
        r = Result(case=case, verdict="error", reason=f"harness error: {type(e).__name__}: {e}",
                   generation=device.generation, device=device.to_dict())
    return r, keep


def _conventions(case: Case, opened: Opened) -> dict[str, Any]:
    try:
        return opened.adapter.conventions_of(case, opened.side.device)
    except Exception:  # the verdicts say what is wrong with them; the explanation does without
        return dict(opened.adapter.conventions)


def compare_case(case: Case, pair: Sequence[Opened], timeout: float | None = None) -> dict[str, Any]:
    """Judge `case` on both sides of `pair` (interpreter first) on the same inputs; its record."""
    try:
        inputs: Mapping[str, Any] | None = ops.get(case.op).make_inputs(case, "cpu")
    except Exception:  # each side's judge says why (a harness or case problem, an error verdict)
        inputs = None
    judged = [_judge(case, opened, inputs, timeout) for opened in pair]
    results = [r for r, _ in judged]
    outputs = compare_outputs(judged[0][1], judged[1][1])
    identical = all(o.get("equal") for o in outputs.values())
    cls = classify(results[0].verdict, results[1].verdict, identical,
                   any(r.verdict == "fail" and unstable(r) for r in results))
    why = explain(cls, results, pair, case.op, outputs,
                  _conventions(case, pair[1]) if cls == "agree_within_contract" else {})
    return case_record(case, cls, why, {k: side_summary(r) for k, r in zip(SIDE_KEYS, results)}, outputs)


def case_record(case: Case, cls: str, why: str, sides: Mapping[str, Any],
                outputs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One line of the run's JSONL; the whole case under `replay` (a "case" key would make results readers take
    the file for verdicts: committed runs lie under results/, which the matrix renders)."""
    record = {"case_id": case.case_id, "adapter": case.adapter, "op": case.op, "cell": dict(case.features),
              "seed": case.seed, "shapes": dict(case.shapes), "class": cls, "why": why, **sides,
              "outputs": dict(outputs or {}), "replay": case.to_dict()}
    return public_record(strict_json(record))  # committed and read elsewhere: no path of this machine


def unjudged_record(case: Case, sides: Sequence[Side], why: str) -> dict[str, Any]:
    """The record of a case neither side judged (its adapter could not be loaded, its worker died)."""
    return case_record(case, "not_comparable", why, {k: {"generation": s.device.generation, "verdict": "error",
                                                         "reason": why} for k, s in zip(SIDE_KEYS, sides)})


# -- in a worker process ------------------------------------------------------------------------------------------

@dataclass
class _Worker:
    sides: tuple[Side, ...] = ()
    timeout: float | None = None
    spec: str = ""
    pair: list[Opened] = field(default_factory=list)
    failed: str = ""  # why the current adapter could not be loaded on a side

    def close(self) -> None:
        for opened in self.pair:
            opened.close()
        self.pair, self.spec, self.failed = [], "", ""

    def open(self, spec: str) -> None:
        """The pair of hosts for `spec` (one adapter at a time: the previous one's hosts are closed)."""
        if spec == self.spec:
            return
        self.close()
        self.spec = spec
        for side in self.sides:
            try:
                self.pair.append(open_side(spec, side))
            except Exception as e:
                self.failed = f"{side.name}: cannot load adapter {spec!r}: {type(e).__name__}: {e}"
                return


_WORKER = _Worker()


def init_worker(sides: Sequence[Side], timeout: float | None, threads: int, env: Mapping[str, str]) -> None:
    """A worker's start: the run's environment (a fork server's is as old as the server), its share of threads."""
    import multiprocessing.util

    os.environ.clear()
    os.environ.update(env)
    if env.get("MOE_HARNESS_WARNINGS_LOG"):
        from harness.engine.host import log_warnings_to

        log_warnings_to(env["MOE_HARNESS_WARNINGS_LOG"])
    torch.set_num_threads(max(1, threads))
    _WORKER.sides, _WORKER.timeout = tuple(sides), timeout
    multiprocessing.util.Finalize(None, _WORKER.close, exitpriority=10)  # hosts and their shared memory, at exit


@contextlib.contextmanager
def judging(sides: Sequence[Side], timeout: float | None) -> Iterator[Any]:
    """`judge_chunk` in this process, its hosts closed at the end."""
    _WORKER.sides, _WORKER.timeout = tuple(sides), timeout
    try:
        yield judge_chunk
    finally:
        _WORKER.close()


def judge_chunk(spec: str, cases: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """In a worker: the records of `cases` (dicts) of adapter `spec`."""
    _WORKER.open(spec)
    found = []
    for d in cases:
        case = Case.from_dict(dict(d))
        if _WORKER.failed:
            found.append(unjudged_record(case, _WORKER.sides, _WORKER.failed))
        else:
            found.append(compare_case(case, _WORKER.pair, _WORKER.timeout))
    return found
