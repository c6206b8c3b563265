"""A library read from its files (harness.registry.sourcefiles, FilesLibrary): found in a folder, its version and
content hash recorded, functions taken unchanged, the library's own imports answered by stand-ins, and
`not-installed` with the way to get the files where they are missing."""

from __future__ import annotations

import linecache
import sys
from pathlib import Path

import pytest

from harness import registry
from harness.registry import FilesLibrary, sourcefiles

SOURCE = '''
import functools


def helper(x):
    return x + 1


@functools.lru_cache
def decorated(x):
    return helper(x) * 2


def overridden():
    from fakepkg.config import get_config
    return get_config()


def unrelated():
    raise AssertionError("not taken")
'''


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pkg = tmp_path / "fakepkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "sub" / "mod.py").write_text(SOURCE)
    (tmp_path / "fakepkg-1.2.3.dist-info").mkdir()
    (tmp_path / "fakepkg-1.2.3.dist-info" / "METADATA").write_text("Name: fakepkg\nVersion: 1.2.3\n")
    monkeypatch.setenv(sourcefiles.FOLDERS_ENV, str(tmp_path))
    sourcefiles.locate.cache_clear()
    yield tmp_path
    sourcefiles.locate.cache_clear()


def _library(**kw: object) -> FilesLibrary:
    return FilesLibrary(distribution="fakepkg", module="fakepkg", written_for="1.2.3",
                        install="bash scripts/third_party.sh", **kw)  # type: ignore[arg-type]


def test_found_with_version_and_content_hash(folder: Path) -> None:
    lib = _library(needs=("sub/mod.py",))
    assert lib.missing() is None and lib.version() == "1.2.3"
    label = lib.label()
    # the folder MOE_THIRD_PARTY names is <third_party> wherever it lies (no path of this machine in a verdict)
    assert label.startswith("fakepkg 1.2.3 (source <third_party>/fakepkg, content sha256 "), label
    assert str(folder) not in label
    assert registry.import_library(lib) == ""


def test_missing_files_are_not_installed_with_the_way_to_get_them(folder: Path) -> None:
    lib = _library(needs=("sub/absent.py",))
    why = lib.missing()
    assert why is not None and "bash scripts/third_party.sh" in why and "1.2.3" in why
    assert "bash scripts/third_party.sh" in registry.import_library(lib)  # never usable: no kernel of it runs


def test_take_copies_named_functions_unchanged_and_names_missing_ones() -> None:
    text = sourcefiles.take(SOURCE, ("helper", "decorated"), "mod.py")
    assert "@functools.lru_cache\ndef decorated(x):" in text and "unrelated" not in text
    with pytest.raises(ValueError, match="absent"):
        sourcefiles.take(SOURCE, ("helper", "absent"), "mod.py")


def test_build_answers_the_library_imports_with_stand_ins(folder: Path) -> None:
    found = sourcefiles.locate("fakepkg", "fakepkg", ("sub/mod.py",))
    assert found is not None and found.version == "1.2.3"

    class Config:
        @staticmethod
        def get_config() -> str:
            return "stand-in"

    m = sourcefiles.build(found, "fake", "import functools\n", {"sub/mod.py": ("helper", "decorated", "overridden")},
                          {"fakepkg.config": Config})
    assert m.decorated(1) == 4 and m.overridden() == "stand-in"
    assert not hasattr(m, "unrelated")
    again = sourcefiles.build(found, "fake", "import functools\n", {"sub/mod.py": ("helper", "decorated",
                                                                                  "overridden")},
                              {"fakepkg.config": Config})
    assert again is m  # one module per content


def test_a_changed_file_of_a_taken_module_is_not_what_runs(folder: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The taken modules' cache folder is writable to kernels: a file (or its cached bytecode) another process
    rewrote must not be the code that runs, nor the source that inspect (Triton's jit) reads."""
    import inspect

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    found = sourcefiles.locate("fakepkg", "fakepkg", ("sub/mod.py",))
    assert found is not None
    parts = {"sub/mod.py": ("helper",)}
    first = sourcefiles.build(found, "planted", "", parts)
    file = Path(first.__file__)
    planted = file.read_text().replace("return x + 1", "return x - 1")
    file.write_text(planted)
    del sys.modules[first.__name__]
    linecache.clearcache()
    again = sourcefiles.build(found, "planted", "", parts)
    assert again.helper(1) == 2
    assert "return x + 1" in inspect.getsource(again.helper)
    assert file.read_text() != planted  # the file is written again as well
