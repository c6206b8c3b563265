"""Bytecode kept for a run's processes where PYTHONDONTWRITEBYTECODE turns its writing off (harness.core.bytecode)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.core import bytecode

ROOT = Path(__file__).resolve().parents[2]


def _env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX", bytecode.ENV)}
    return {**env, "PYTHONDONTWRITEBYTECODE": "1", "XDG_CACHE_HOME": str(cache), **extra}


def _compiled(cache: Path, module: str) -> list[Path]:
    """The bytecode of the repository's `module` (a path under the checkout, no suffix) kept under `cache`."""
    mirror = cache / "moe-harness" / "pycache" / ROOT.relative_to(ROOT.anchor) / Path(module).parent
    return sorted(mirror.glob(f"{Path(module).name}.*.pyc"))


@pytest.mark.parametrize(("given", "kept"), [
    ({"PYTHONDONTWRITEBYTECODE": "1"}, True),
    ({"PYTHONDONTWRITEBYTECODE": ""}, False),
    ({}, False),
    ({"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/elsewhere"}, False),
    ({"PYTHONDONTWRITEBYTECODE": "1", bytecode.ENV: "off"}, False),
])
def test_bytecode_is_kept_apart_only_where_its_writing_is_off_and_no_prefix_was_chosen(
        given: dict[str, str], kept: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(bytecode.ENV, raising=False)
    if bytecode.ENV in given:
        monkeypatch.setenv(bytecode.ENV, given[bytecode.ENV])
    environ = {k: v for k, v in given.items() if k != bytecode.ENV}
    where = bytecode.keep_for_run(environ)
    if kept:
        assert where == str(tmp_path / "moe-harness" / "pycache")
        assert environ == {"PYTHONPYCACHEPREFIX": where}  # the processes it starts write there
    else:
        assert where is None and environ == {k: v for k, v in given.items() if k != bytecode.ENV}


def test_the_command_line_writes_its_bytecode_apart_when_the_environment_turns_writing_off(tmp_path: Path) -> None:
    """`python -m harness` under PYTHONDONTWRITEBYTECODE compiles its later imports once for the run's processes,
    into the user's cache folder; with the switch off it writes nothing, as before."""
    for switch, expected in (("on", True), ("off", False)):
        cache = tmp_path / switch
        done = subprocess.run([sys.executable, "-m", "harness", "--version"], cwd=ROOT, capture_output=True, text=True,
                              env=_env(cache, **{bytecode.ENV: switch}), timeout=120)
        assert done.returncode == 0, done.stderr
        assert bool(_compiled(cache, "harness/cli")) == expected, (switch, sorted(cache.rglob("*.pyc"))[:5])
        assert not list(cache.rglob("*.pyc")) or expected


def test_a_pytest_session_writes_its_bytecode_apart_when_the_environment_turns_writing_off(tmp_path: Path) -> None:
    """The plugin does the same for a session run from the command line (its xdist workers inherit it)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--co",
                           "tests/test_diagnostic_scripts.py", "--moe-adapter", "reference-activation"],
                          cwd=ROOT, capture_output=True, text=True, env=_env(tmp_path), timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert _compiled(tmp_path, "tests/test_diagnostic_scripts"), sorted(tmp_path.rglob("*.pyc"))[:5]
