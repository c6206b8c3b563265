"""Triton's interpreter warns of its numpy arithmetic (overflow in exp or a cast, all-NaN reductions) on the inputs
cases draw on purpose; under pytest those warnings are filtered, in the test process and in the kernel hosts (whose
stderr would cut the progress dots), while any other warning still shows."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

from harness import plugin
from harness.engine.interpreter import quiet_numerics

ROOT = Path(__file__).resolve().parents[2]
NOISY = "tests.harness.fixtures.noisy_adapter:NOISY"
OVERFLOW = "overflow encountered in exp"
OWN = "planted warning of a noisy kernel"


def test_only_the_interpreters_numerical_warnings_are_filtered() -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_numerics()
        for module, category in (("triton.runtime.interpreter", RuntimeWarning), ("triton.runtime.jit", RuntimeWarning),
                                 ("my_kernel", RuntimeWarning), ("triton.runtime.interpreter", UserWarning)):
            warnings.warn_explicit(f"{module} {category.__name__}", category, "f.py", 1, module=module)
    assert sorted(str(w.message) for w in seen) == [
        "my_kernel RuntimeWarning", "triton.runtime.interpreter UserWarning", "triton.runtime.jit RuntimeWarning"]


def test_under_pytest_the_interpreters_overflow_is_quiet_and_a_kernels_own_warning_shows(tmp_path: Path) -> None:
    """A child session runs the noisy kernel in its kernel host (the generic test) and in the test process."""
    (tmp_path / "test_in_process.py").write_text(
        "from tests.harness.fixtures.noisy_adapter import make_noise\n\n\n"
        "def test_in_process():\n    make_noise()\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    plugin_arg = plugin.load_args()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin_arg, "-n", "0",
         str(tmp_path / "test_in_process.py"), "--moe-adapter", NOISY, "--moe-device", "cpu", "-k",
         "in_process or test_declared", "--rootdir", str(tmp_path), "--moe-results-dir", str(tmp_path / "results")],
        cwd=tmp_path, env=dict(env, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "2 passed" in done.stdout, out[-3000:]
    assert OVERFLOW not in out, out[-3000:]
    # the test process's own warning is in pytest's summary; a kernel host's output goes to its own log, never
    # between the dots (harness.engine.sandbox), so neither of its warnings reaches the session's console
    assert f"UserWarning: {OWN}" in done.stdout, out[-3000:]
    assert f"UserWarning: {OWN}" not in done.stderr, out[-3000:]
