"""Provenance of a library loaded from a source tree (harness.registry.provenance): a verdict names the tree and
the code's version (git commit, dirty or not; a content hash without git), not only the distribution's version."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from harness import ops
from harness.core.case import Case
from harness.engine import runner
from harness.registry import Library, provenance
from tests.harness.fixtures import library_adapters as fx


def _git(tree: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@example.com",
                           "-c", "commit.gpgsign=false", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def _package(root: Path) -> str:
    """A fresh package under `root` (a unique name: imports and lookups are cached per process)."""
    name = f"moe_prov_{uuid.uuid4().hex[:10]}"
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("VALUE = 1\n")
    (root / name / "kernel.py").write_text("def run():\n    return 2\n")
    return name


def _named(tree: Path) -> str:
    """How a verdict names a checkout under the temporary directory: never by this machine's absolute path."""
    return "<tmp>/" + tree.relative_to(tempfile.gettempdir()).as_posix()


def _library(module: str, distribution: str | None = None) -> Library:
    return Library(distribution=distribution or f"moe-prov-dist-{uuid.uuid4().hex[:8]}", module=module,
                   written_for="0.1", install="pip install it")


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str, str]:
    """A git checkout holding a package, on sys.path: (tree, package, commit)."""
    tree = tmp_path / "checkout"
    name = _package(tree)
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-q", "-m", "first")
    monkeypatch.syspath_prepend(str(tree))
    provenance.source_of.cache_clear()
    return tree, name, _git(tree, "rev-parse", "HEAD")


def test_a_library_from_a_git_checkout_is_labelled_with_its_commit(checkout) -> None:  # type: ignore[no-untyped-def]
    tree, name, commit = checkout
    lib = _library(name)
    assert lib.missing() is None  # importable from the checkout, no distribution installed: it runs
    assert lib.label() == f"{lib.distribution} (source {_named(tree)}, git {commit})"


def test_uncommitted_changes_make_it_dirty(checkout) -> None:  # type: ignore[no-untyped-def]
    tree, name, commit = checkout
    (tree / "notes.txt").write_text("an untracked file beside the package changes no code\n")
    (tree / name / "__pycache__").mkdir(exist_ok=True)  # nor does bytecode Python cached (no .gitignore here)
    (tree / name / "__pycache__" / "extra.cpython-311.pyc").write_bytes(b"\0")
    assert provenance.source_of(name, "x") == provenance.Source(str(tree), commit, dirty=False)
    (tree / name / "extra.py").write_text("X = 3\n")  # an added module of the package does
    provenance.source_of.cache_clear()
    assert provenance.source_of(name, "x") == provenance.Source(str(tree), commit, dirty=True)
    (tree / name / "extra.py").unlink()
    (tree / name / "kernel.py").write_text("def run():\n    return 3\n")  # so does a changed tracked file
    provenance.source_of.cache_clear()
    lib = _library(name)
    assert lib.label() == f"{lib.distribution} (source {_named(tree)}, git {commit}, dirty)"


def test_without_git_the_label_carries_a_content_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = _package(tmp_path / "plain")
    monkeypatch.syspath_prepend(str(tmp_path / "plain"))
    provenance.source_of.cache_clear()
    pkg = tmp_path / "plain" / name
    first = provenance.content_hash(pkg)
    lib = _library(name)
    assert lib.label() == f"{lib.distribution} (source {name}, content sha256 {first})"
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "kernel.cpython-313.pyc").write_bytes(b"bytecode")
    assert provenance.content_hash(pkg) == first  # bytecode caches are not the code
    (pkg / "kernel.py").write_text("def run():\n    return 3\n")
    assert provenance.content_hash(pkg) != first


def test_a_package_git_does_not_track_is_hashed(checkout, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """A package lying untracked inside some repository: that repository's commit says nothing of it."""
    tree, _, _ = checkout
    name = _package(tree / "vendored")
    monkeypatch.syspath_prepend(str(tree / "vendored"))
    pkg = tree / "vendored" / name
    lib = _library(name)
    assert lib.label() == f"{lib.distribution} (source {name}, content sha256 {provenance.content_hash(pkg)})"


def _dist_info(site: Path, dist: str, module_file: str | None, editable_from: Path | None = None) -> None:
    """An installed distribution's metadata in `site` (RECORD listing `module_file`; PEP 610 for editable)."""
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "RECORD").write_text(f"{module_file},,\n" if module_file else "")
    if editable_from is not None:
        (info / "direct_url.json").write_text(json.dumps({"url": editable_from.as_uri(),
                                                          "dir_info": {"editable": True}}))


def test_an_installed_copy_is_the_version_alone_and_a_shadowing_checkout_is_not(
        checkout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    tree, name, commit = checkout
    site = tmp_path / "site"
    installed = _package(site)
    dist = f"moe-prov-{uuid.uuid4().hex[:8]}"
    _dist_info(site, dist, f"{installed}/__init__.py")
    monkeypatch.syspath_prepend(str(site))
    assert _library(installed, dist).label() == f"{dist} 1.0"
    assert _library("torch", "torch").source() is None  # this environment's torch: the installed wheel
    # the same distribution installed, but the module imported from a checkout earlier on the path
    shadowed = f"moe-prov-{uuid.uuid4().hex[:8]}"
    _dist_info(site, shadowed, f"{name}/__init__.py")
    assert _library(name, shadowed).label() == f"{shadowed} 1.0 (source {_named(tree)}, git {commit})"


def test_an_editable_install_is_labelled_with_its_checkout(checkout, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    tree, name, commit = checkout
    dist = f"moe-prov-{uuid.uuid4().hex[:8]}"
    _dist_info(tmp_path / "site", dist, None, editable_from=tree)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert _library(name, dist).label() == f"{dist} 1.0 (source {_named(tree)}, git {commit})"


def test_a_development_install_in_the_checkout_is_labelled_with_its_commit(checkout) -> None:  # type: ignore[no-untyped-def]
    """`setup.py develop`: the egg-info lies in the tree and lists the tree's files (SOURCES.txt), no install
    record."""
    tree, name, commit = checkout
    dist = f"moe-prov-{uuid.uuid4().hex[:8]}"
    info = tree / f"{dist.replace('-', '_')}.egg-info"
    info.mkdir()
    (info / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "SOURCES.txt").write_text(f"{name}/__init__.py\n{name}/kernel.py\n")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-q", "-m", "egg-info")
    commit = _git(tree, "rev-parse", "HEAD")
    assert _library(name, dist).label() == f"{dist} 1.0 (source {_named(tree)}, git {commit})"


def test_the_verdict_records_the_checkout(checkout) -> None:  # type: ignore[no-untyped-def]
    tree, name, commit = checkout
    from harness.core.device import detect

    adapter = dataclasses.replace(fx.NATIVE, name=f"fixture-{name}", library=_library(name))
    cell = {"activation": "silu_and_mul", "dtype": "float32"}
    case = Case(op="activation", adapter=adapter.name, features=cell,
                **ops.get("activation").boundary(adapter, cell)[2])
    r = runner.judge(case, adapter, detect("cpu"))
    assert r.verdict in ("pass", "unsupported"), r.reason  # unsupported: not a CPU machine
    assert r.metrics["library"] == f"{adapter.library.distribution} (source {_named(tree)}, git {commit})"
