"""Third-party libraries (`harness.registry.Library`): a missing library is reported `not-installed` with its install
command on every path (judge, generic test, matrix sweep and rendering), never as an error and never dropped; an
installed library whose import fails is an error; a kernel that runs natively on the CPU is judged on the `cpu`
generation, apart from `interp`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from harness import ops, sweep
from harness.commands import matrix as matrix_cmd
from harness.core.case import Case
from harness.core.device import detect
from harness.engine import runner
from harness.store.render import build, render_files, to_markdown
from harness.store.results import load_results
from tests.harness.fixtures import library_adapters as fx

FIXTURES = "tests.harness.fixtures.library_adapters"


def _case(adapter, shapes=None) -> Case:  # type: ignore[no-untyped-def]
    fields = ops.get(adapter.op).boundary(adapter, {"activation": "silu_and_mul", "dtype": "float32"})[2]
    return Case(op=adapter.op, adapter=adapter.name, features={"activation": "silu_and_mul", "dtype": "float32"},
                **fields)


def test_missing_library_is_not_installed_with_its_install_command(device_info) -> None:  # type: ignore[no-untyped-def]
    r = runner.judge(_case(fx.MISSING), fx.MISSING, device_info)
    assert r.verdict == "not-installed", (r.verdict, r.reason)
    assert "pip install moe-harness-no-such-library==1.2.3" in r.reason and "1.2.3" in r.reason
    assert fx.MISSING.not_installed() is not None


def test_installed_library_whose_import_fails_is_an_error(device_info) -> None:  # type: ignore[no-untyped-def]
    r = runner.judge(_case(fx.BROKEN), fx.BROKEN, device_info)
    assert r.verdict == "error" and "GPU driver it cannot find" in r.reason, (r.verdict, r.reason)
    assert r.metrics["library"].startswith("torch ")  # the installed version is recorded


def test_a_cpu_native_kernel_is_judged_on_the_cpu_generation(device_info, unverifiable) -> None:  # type: ignore[no-untyped-def]
    r = runner.judge(_case(fx.NATIVE), fx.NATIVE, device_info, unverifiable=unverifiable)
    if device_info.is_cuda:  # not a CPU machine: the kernel does not run on this GPU generation
        assert r.verdict == "unsupported" and r.generation == device_info.generation
        return
    assert r.verdict == "pass", r.reason
    assert r.generation == "cpu" and r.device["generation"] == "cpu"
    # the same case of a Triton kernel stays on interp
    triton_like = dataclasses.replace(fx.NATIVE, name="fixture-interp", generations=("interp",))
    assert triton_like.device_for(device_info).generation == device_info.generation


def test_sweep_records_every_case_and_renders_not_installed(tmp_path: Path) -> None:
    names = [f"{FIXTURES}:MISSING", f"{FIXTURES}:NATIVE"]
    sweep.run_sweep(names, detect("cpu"), str(tmp_path), profile="quick", run_id="t", jobs=1)
    results = load_results([tmp_path])
    missing = [r for r in results if r.adapter == fx.MISSING.name]
    planned = sweep.plan(fx.MISSING, "quick").cases
    assert len(missing) == len(planned) and {r.verdict for r in missing} == {"not-installed"}
    native = [r for r in results if r.adapter == fx.NATIVE.name]
    assert {r.generation for r in native} == {"cpu"}
    assert {r.verdict for r in native if r.declared} == {"pass"}
    assert {r.verdict for r in native if not r.declared} == {"unsupported"}
    md, js, _ = render_files([tmp_path], tmp_path / "M.md")
    text = md.read_text()
    assert "### Not installed here" in text and "pip install moe-harness-no-such-library==1.2.3" in text
    model = json.loads(js.read_text())
    row = next(a for a in model["adapters"] if a["name"] == fx.MISSING.name)
    assert {s["status"] for s in row["generations"].values() if s["status"] != "not run"} == {"not installed"}
    assert "| cpu " in text  # the cpu generation's column and provenance row


def test_a_real_verdict_outranks_not_installed_and_library_versions_are_shown(device_info) -> None:  # type: ignore[no-untyped-def]
    case = _case(fx.NATIVE)
    ran = runner.judge(case, fx.NATIVE, device_info)
    ran = dataclasses.replace(ran, metrics={**ran.metrics, "library": "somelib 9.9"}, verdict="pass")
    later = dataclasses.replace(ran, verdict="not-installed", reason="somelib is not installed",
                                timestamp=ran.timestamp + 10)
    model = build([ran, later])
    row = model["adapters"][0]
    assert row["generations"][ran.generation]["status"] == "pass"
    assert "somelib 9.9" in to_markdown(model)


def test_matrix_keeps_committed_rows_of_a_library_missing_here(tmp_path: Path) -> None:
    case = _case(fx.MISSING)
    dev = detect("cpu")
    committed = tmp_path / "results" / "external"
    committed.mkdir(parents=True)
    real = runner.Result(case=case, verdict="pass", generation=dev.generation, device=dev.to_dict(),
                         metrics={"library": "moe-harness-no-such-library 1.2.3"})
    (committed / f"matrix-{dev.generation}-x-main.jsonl").write_text(json.dumps(real.to_dict()) + "\n")
    here = tmp_path / "run"
    here.mkdir()
    missing = runner.judge(case, fx.MISSING, dev)
    (here / f"matrix-{dev.generation}-y-main.jsonl").write_text(json.dumps(missing.to_dict()) + "\n")
    files = sorted(here.glob("*.jsonl")) + matrix_cmd.committed_results(str(here), root=str(tmp_path / "results"))
    model = build(load_results(files))
    assert model["adapters"][0]["generations"][dev.generation]["status"] == "pass"
    assert not model["declared_vs_verified"]["not_installed"]


def test_pytest_names_the_missing_libraries_in_its_header(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "pytest", "--co", "-p", "no:cacheprovider",
                           "harness/plugin/generic.py", "--moe-adapter", f"{FIXTURES}:MISSING",
                           "--moe-adapter", f"{FIXTURES}:NATIVE",
                           "--moe-results-dir", str(tmp_path)], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    header = [line for line in done.stdout.splitlines() if line.startswith("moe-harness: not installed")]
    assert len(header) == 1 and fx.MISSING.name in header[0] and fx.NATIVE.name not in header[0]
    assert "pip install moe-harness-no-such-library==1.2.3" in header[0]


def test_the_generic_test_of_a_missing_library_fits_one_case_per_cell(device_info, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Its cells are recorded not-installed with their first boundary case that fits, the same case as fitting every
    boundary case gives first, and only that one is fitted (a moved case costs its inputs and oracle)."""
    from harness.engine import fitting
    from harness.engine import strategies as hs
    from harness.plugin import generic

    cells = hs.declared_cells(fx.MISSING, device_info)[:3]
    want = [fitting.boundary(fx.MISSING, cell)[0] for cell in cells]
    fitted: list[object] = []
    real = fitting.fitted
    monkeypatch.setattr(fitting, "fitted", lambda *a, **k: fitted.append(a[1]) or real(*a, **k))
    results: list = []  # type: ignore[type-arg]
    generic._record_not_installed(fx.MISSING, cells, device_info, results)
    assert [r.verdict for r in results] == ["not-installed"] * len(cells), [r.reason for r in results]
    assert [{k: getattr(r.case, k) for k in ("shapes", "seed")} for r in results] == \
        [{"shapes": w["shapes"], "seed": w.get("seed", 0)} for w in want]
    assert len(fitted) == len(cells), len(fitted)
