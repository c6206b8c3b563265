"""Adapter registry: resolution by name and by module:object, declared cells, clear errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness import cli, registry
from harness.core.device import detect

# a module-level adapter, resolvable as "tests.harness.test_registry:EXTERNAL"
EXTERNAL = registry.Adapter(name="external-example", op="activation", source="tests",
                            run=registry.resolve("reference-activation").run,
                            support={"activation": ("silu_and_mul",), "dtype": ("float32",)})


def test_resolve_module_object_registers_the_adapter() -> None:
    a = registry.resolve("tests.harness.test_registry:EXTERNAL")
    assert a is EXTERNAL and registry.resolve("external-example") is EXTERNAL


@pytest.mark.parametrize(("spec", "message"), [
    ("no-such-adapter", "unknown adapter 'no-such-adapter'"),
    ("no_such_module_xyz:thing", "cannot import module"),
    ("tests.harness.test_registry:MISSING", "has no attribute"),
    ("tests.harness.test_registry:pytest", "is not an Adapter"),
])
def test_bad_adapter_specs_get_clear_errors(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        registry.resolve(spec)


def test_declares_names_the_undeclared_feature() -> None:
    ok, why = EXTERNAL.declares({"activation": "silu_and_mul", "dtype": "bfloat16"}, detect("cpu"))
    assert not ok and "dtype=bfloat16" in why
    assert EXTERNAL.declares({"activation": "silu_and_mul", "dtype": "float32"}, detect("cpu"))[0]


def test_adapter_validates_its_declaration() -> None:
    with pytest.raises(ValueError, match="op must be one of"):
        registry.Adapter(name="x", op="gemm", source="", run=EXTERNAL.run, support={})
    with pytest.raises(ValueError, match="unknown generation"):
        registry.Adapter(name="x", op="reduce", source="", run=EXTERNAL.run, support={}, generations=("sm75x",))


#: an outside adapter that takes a built-in's name
IMPOSTOR = None


def test_an_outside_adapter_cannot_take_a_builtin_name(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    builtin = registry.resolve("reference-routing")
    impostor = dataclasses.replace(registry.resolve("reference-activation"), name="reference-routing",
                                   source="elsewhere")
    monkeypatch.setattr(sys.modules[__name__], "IMPOSTOR", impostor)
    with pytest.raises(ValueError, match="'reference-routing', a name already registered"):
        registry.resolve(f"{__name__}:IMPOSTOR")
    assert registry.resolve("reference-routing") is builtin


@registry.adapter_factory
def make_external() -> registry.Adapter:
    return EXTERNAL


def unmarked_factory() -> registry.Adapter:
    raise AssertionError("a module:object spec called an unmarked callable")


def test_module_object_calls_only_marked_factories() -> None:
    """A case file names its adapter as module:object and may come from anywhere: `os:abort` must not be called."""
    assert registry.resolve(f"{__name__}:make_external") is EXTERNAL
    for spec in (f"{__name__}:unmarked_factory", "os:abort", "builtins:print"):
        with pytest.raises(ValueError, match=r"not marked with harness\.adapters\.adapter_factory"):
            registry.resolve(spec)


@pytest.mark.parametrize(("module", "source", "error"), [
    ("moe_broken_syntax", "x = (\n", "SyntaxError: '(' was never closed"),
    ("moe_broken_name", "ADAPTER = undefined_name\n", "NameError: name 'undefined_name' is not defined"),
    ("moe_broken_runtime", "raise RuntimeError('needs a GPU\\nto import')\n", "RuntimeError: needs a GPU to import"),
])
def test_a_module_that_raises_anything_on_import_is_one_line_naming_it(
        module: str, source: str, error: str, tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """Not only an ImportError: whatever the module raises becomes a bad-input error of the front ends."""
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(registry.AdapterImportError) as raised:  # a ValueError
        registry.resolve(f"{module}:ADAPTER")
    assert f"adapter '{module}:ADAPTER': cannot import module '{module}' ({error}" in str(raised.value)
    assert "\n" not in str(raised.value)
    code = cli.main(["matrix", "--device", "cpu", "--adapter", f"{module}:ADAPTER", "--out", ""])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err, err
    assert f"module '{module}'" in err and error in err, err


ROOT = Path(__file__).resolve().parents[2]
LIST_SPEC = "tests.harness.fixtures.adapter_list:ADAPTERS"
LISTED = [f"listed-activation-{i}" for i in range(3)]


def test_a_list_under_module_object_expands_to_every_adapter_and_each_resolves_alone() -> None:
    specs = registry.expand([LIST_SPEC])
    assert [registry.resolve(s).name for s in specs] == LISTED
    assert specs == [f"{LIST_SPEC}#{n}" for n in LISTED]
    with pytest.raises(ValueError, match="names 3 adapters"):  # never silently the first one
        registry.resolve(LIST_SPEC)
    with pytest.raises(ValueError, match="no adapter named 'nope'"):
        registry.resolve(LIST_SPEC + "#nope")
    from harness.store.casefiles import adapter_reference

    # a case file of the second adapter names the spec that finds it again (replay resolves it alone)
    assert adapter_reference(registry.resolve(LISTED[1])) == f"{LIST_SPEC}#{LISTED[1]}"


def test_a_list_under_module_object_gives_every_adapter_its_generic_tests() -> None:
    import subprocess

    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
                          "-m", "moe_generic", "--moe-adapter", LIST_SPEC], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    for name in LISTED:
        assert f"test_undeclared_cells_rejected_cleanly[{name}]" in res.stdout, res.stdout[-2000:]


def test_a_list_under_module_object_is_swept_whole(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from harness.core.device import detect
    from harness.sweep import run_sweep

    totals = run_sweep(registry.expand([LIST_SPEC]), detect("cpu"), str(tmp_path), profile="quick", jobs=2)
    assert sorted(totals) == LISTED and all(t.get("pass") for t in totals.values()), totals
