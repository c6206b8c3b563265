"""An installed package's entry point runs its import-time code in its own kernel hosts only.

A package that publishes adapters under the entry-point group is another body of code: its adapters get kernel hosts
of their own (`remote.host_family`). Its module's import is code of that package too, so it must not run in a host
that judges another adapter: the fixture package below changes the Triton reduce in every process that imports
it, which would make the reference adapter's output wrong, and its verdicts fail, wherever it was imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

HOSTILE = '''
import os

import kernels.reduce as _reduce
from harness.adapters import Adapter, Unsupported

_original = _reduce.unpermute_reduce


def _off_by_one(*args, out, **kwargs):
    _original(*args, out=out, **kwargs)
    out += 1


_reduce.unpermute_reduce = _off_by_one  # in every process that imports this package
with open(os.environ["HOSTILE_MARKS"], "a") as marks:
    marks.write(f"{os.getpid()}\\n")


def _run(case, inputs, outputs):
    raise Unsupported("hostile-reduce judges nothing")


ADAPTER = Adapter(name="hostile-reduce", op="reduce", source="hostile_pkg", run=_run, support={"dtype": ("float32",)},
                  generations=("interp", "cpu", "sm80", "sm89", "sm90", "sm100", "sm120"),
                  description="changes the Triton reduce as it is imported")
'''


@pytest.fixture
def hostile_site(tmp_path: Path) -> Path:
    """A folder holding an installed package `hostile_pkg` (its dist-info publishes `hostile-reduce`)."""
    site = tmp_path / "site"
    (site / "hostile_pkg").mkdir(parents=True)
    (site / "hostile_pkg" / "__init__.py").write_text(HOSTILE)
    info = site / "hostile_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hostile-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[moe_harness.adapters]\nhostile = hostile_pkg:ADAPTER\n")
    return site


def _matrix(site: Path, tmp_path: Path, *adapters: str) -> tuple[Counter, list[int]]:
    run = tmp_path / "run"  # read-only to kernel hosts (the results and the matrix are written there)
    run.mkdir()
    marks = tmp_path / "marks"
    marks.write_text("")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "HOSTILE_MARKS": str(marks),
           "MOE_HARNESS_JOBS": "1"}
    words = [w for a in adapters for w in ("--adapter", a)]
    done = subprocess.run([sys.executable, "-m", "harness", "matrix", "--device", "cpu", *words, "--results-dir",
                           str(run / "r"), "--out", str(run / "m.md"), "--jobs", "1"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    verdicts: Counter = Counter()
    for path in (run / "r").glob("*-main.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if "verdict" in record:
                verdicts[(record["case"]["adapter"], record["verdict"])] += 1
    return verdicts, [int(p) for p in marks.read_text().split()]


def test_an_entry_points_import_never_runs_where_another_adapter_is_judged(hostile_site: Path,
                                                                           tmp_path: Path) -> None:
    verdicts, marks = _matrix(hostile_site, tmp_path, "triton-reduce")
    judged = {v: n for (a, v), n in verdicts.items() if a == "triton-reduce"}
    assert judged.get("pass", 0) > 0 and set(judged) <= {"pass", "unsupported"}, (verdicts, marks)
    print("MARKS", marks)


def test_the_entry_points_own_adapter_is_still_judged_in_a_host_of_its_own(hostile_site: Path,
                                                                          tmp_path: Path) -> None:
    verdicts, marks = _matrix(hostile_site, tmp_path, "triton-reduce", "hostile-reduce")
    assert {v for (a, v) in verdicts if a == "triton-reduce"} == {"pass", "unsupported"}, verdicts
    assert {v for (a, v) in verdicts if a == "hostile-reduce"} == {"unsupported"}, verdicts
    assert marks  # it was imported: by the listing, and by the host that judged it


def test_the_pytest_plugins_kernel_hosts_import_no_other_package(hostile_site: Path, tmp_path: Path) -> None:
    """The same through the pytest plugin: the generic test of the built-in Triton reduce, with the hostile package
    installed and named too, passes."""
    from harness import plugin

    marks = tmp_path / "marks"
    marks.write_text("")
    run = tmp_path / "run"
    run.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(hostile_site)]), "HOSTILE_MARKS": str(marks),
           "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin.load_args(),
                           "harness/plugin/generic.py", "-k", "test_declared_cases_pass", "--moe-results-dir",
                           str(run / "results"), "--moe-device", "cpu", "--moe-profile", "ci", "--moe-adapter",
                           "triton-reduce", "--moe-adapter", "hostile-reduce"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "test_declared_cases_pass[triton-reduce" in done.stdout or " passed" in done.stdout, done.stdout[-2000:]
    assert marks.read_text().split(), "the hostile package was never imported: the test did not test anything"


def test_an_entry_point_spec_that_names_nothing_says_so() -> None:
    from harness import registry

    with pytest.raises(ValueError, match="no installed package publishes an entry point 'no-such-package'"):
        registry.resolve(f"{registry.ENTRY_SPEC}no-such-package{registry.SELECT}anything")
