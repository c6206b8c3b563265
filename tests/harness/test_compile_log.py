"""The compile log: the hooks it puts into Triton write one line per variant with its constexprs and seconds, and the
summary counts variants, compiles and what tells them apart, per kernel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("triton")

from harness.engine import compile_log


@pytest.fixture
def hooks(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    from triton import knobs

    if not hasattr(knobs.runtime, "jit_post_compile_hook"):
        pytest.skip("this Triton has no JIT compile hooks")
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", None)
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
    monkeypatch.setattr(compile_log, "_installed", [])
    return knobs.runtime


class _Jit:
    arg_names = ("a_ptr", "BLOCK")


class _Fn:
    module, name, jit_function = "kernels.k", "_gemm", _Jit()


def _compile(runtime, block: int, spec: str, wait: float = 0.0) -> None:  # type: ignore[no-untyped-def]
    import time

    info = {"constants": {(1,): block}, "num_warps": 4, "num_stages": 3}  # keyed by index, as Triton 3.6 does
    assert runtime.jit_cache_hook(key="k", repr=f"_gemm[num_warps=4](a: {spec})", fn=_Fn(), compile=info,
                                  is_manual_warmup=False, already_compiled=False) is None  # never skips a compile
    time.sleep(wait)
    runtime.jit_post_compile_hook(key="k", repr=f"_gemm[num_warps=4](a: {spec})", fn=_Fn(), compile=info,
                                  is_manual_warmup=False, already_compiled=False)


def test_nothing_is_installed_without_a_path(hooks, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv(compile_log.ENV, raising=False)
    assert not compile_log.install()
    assert hooks.jit_cache_hook is None and hooks.jit_post_compile_hook is None


def test_each_variant_is_a_line_and_the_summary_tells_them_apart(hooks, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "compiles.jsonl"
    monkeypatch.setenv(compile_log.ENV, str(log))
    monkeypatch.delenv("TRITON_CACHE_MANAGER", raising=False)  # Triton's own cache: how a variant came is unknown
    assert compile_log.install()
    _compile(hooks, 64, "*bf16D", wait=compile_log.COMPILED_S)  # a compile (by its time)
    _compile(hooks, 128, "*bf16D", wait=compile_log.COMPILED_S)
    _compile(hooks, 64, "*bf16", wait=0.0)  # a load from the disk cache
    _compile(hooks, 64, "*bf16D")  # the same variant again (another process): not a new one
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == 4 and rows[0]["constants"] == {"BLOCK": "64"} and rows[0]["seconds"] >= compile_log.COMPILED_S
    (k,) = compile_log.summarize(rows)
    assert k["kernel"] == "kernels.k._gemm" and k["variants"] == 3 and k["compiles"] == 2
    assert k["distinct"] == {"BLOCK": 2, "(specialization)": 2}
    assert k["compile_s"] >= 2 * compile_log.COMPILED_S


def test_a_log_it_cannot_write_fails_no_compile(hooks, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "missing-folder" / "compiles.jsonl"
    monkeypatch.setenv(compile_log.ENV, str(log))
    assert compile_log.install()
    _compile(hooks, 64, "*bf16D")  # raises nothing
    assert not log.exists()


def test_a_sandboxed_host_may_append_to_the_log(tmp_path: Path) -> None:
    import os

    from harness.engine import sandbox

    log = tmp_path / "compiles.jsonl"
    assert os.path.realpath(log) in sandbox.writable_paths({compile_log.ENV: str(log), "HOME": str(tmp_path)})


def test_the_arguments_specialization_and_types_tell_variants_apart(hooks, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton compiles a variant per specialization of its arguments (an int divisible by 16, an aligned pointer) and
    per their types: lines with the same constexprs and other attributes or dtypes are variants of their own."""
    log = tmp_path / "compiles.jsonl"
    monkeypatch.setenv(compile_log.ENV, str(log))
    assert compile_log.install()
    for attrs, dtype in (({(0,): [["tt.divisibility", 16]]}, "*bf16"), ({}, "*bf16"), ({}, "*fp16")):
        kw = {"key": "k", "repr": "_gemm(a)", "fn": _Fn(), "is_manual_warmup": False, "already_compiled": False,
              "compile": {"constants": {(1,): 64}, "num_warps": 4, "num_stages": 3, "configs": [attrs],
                          "signature": {"a_ptr": dtype, "BLOCK": "constexpr"}}}
        hooks.jit_cache_hook(**kw)
        hooks.jit_post_compile_hook(**kw)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert "tt.divisibility" in rows[0]["attrs"]["a_ptr"] and rows[1]["attrs"] == {}
    assert rows[2]["signature"] == {"a_ptr": "*fp16", "BLOCK": "constexpr"}
    (k,) = compile_log.summarize(rows)
    assert k["variants"] == 3 and k["distinct"] == {"(specialization)": 2, "(types)": 2}


def test_how_a_variant_came_is_told_by_the_compile_once_manager(hooks, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """With the compile-once manager, a line says whether this process compiled the variant, waited for another's
    compile, or loaded it; only compiles count, however long a wait took."""
    from harness.engine import compile_once

    log = tmp_path / "compiles.jsonl"
    monkeypatch.setenv(compile_log.ENV, str(log))
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "harness.engine.compile_once:CompileOnceCacheManager")
    monkeypatch.setattr(compile_once, "STATS", {"compiled": 0, "waited": 0, "wait_s": 0.0, "gave_up": 0})
    assert compile_log.install()
    for block, counter in ((32, "compiled"), (64, "waited"), (128, None)):
        info = {"constants": {(1,): block}, "num_warps": 4, "num_stages": 3}
        kw = {"key": "k", "repr": "_gemm(a)", "fn": _Fn(), "compile": info, "is_manual_warmup": False,
              "already_compiled": False}
        hooks.jit_cache_hook(**kw)
        if counter:
            compile_once.STATS[counter] += 1
        hooks.jit_post_compile_hook(**kw)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["how"] for r in rows] == ["compiled", "waited", "loaded"]
    (k,) = compile_log.summarize(rows)
    assert k["compiles"] == 1 and k["variants"] == 3
