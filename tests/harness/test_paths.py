"""harness.core.paths: what results, case files and the rendered matrix call a file instead of its absolute path,
and that the places writing them use it (the runner's `(at file:line)`, a library's source, the result store, the
case files, the render)."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import pytest
import torch

from harness.core import paths
from harness.core.case import Case
from harness.core.paths import REPO, code_location, public_path, public_record, public_text
from harness.core.result import Result
from harness.engine.hosted import where
from harness.registry.provenance import Source
from harness.store.render import render_files
from harness.store.results import ResultStore

ELSEWHERE = "/srv/build-host-7"  # a machine's folder this machine knows nothing of


def test_an_installed_package_file_is_named_by_its_module_path() -> None:
    assert public_path(f"{ELSEWHERE}/venv/lib/python3.11/site-packages/vllm/model_executor/router.py") == \
        "vllm/model_executor/router.py"
    assert public_path(f"{ELSEWHERE}/py/lib/python3.12/dist-packages/torch/_ops.py") == "torch/_ops.py"
    assert public_path(f"{ELSEWHERE}/py/lib/python3.12/threading.py") == "<stdlib>/threading.py"


def test_a_repository_file_is_named_relative_to_it() -> None:
    assert public_path(str(REPO / "reference" / "quant.py")) == "reference/quant.py"
    assert public_path(str(REPO)) == "."


def test_an_unpacked_library_is_named_under_third_party(monkeypatch: pytest.MonkeyPatch) -> None:
    assert public_path(str(REPO / "third_party" / "vllm" / "a.py")) == "<third_party>/vllm/a.py"
    monkeypatch.setenv(paths.THIRD_PARTY_ENV, f"{ELSEWHERE}/unpacked")
    assert public_path(f"{ELSEWHERE}/unpacked/sglang/srt/x.py") == "<third_party>/sglang/srt/x.py"


def test_an_unknown_path_keeps_its_last_two_parts() -> None:
    assert public_path(f"{ELSEWHERE}/deepgemm/pkg") == "…/deepgemm/pkg"
    assert public_path("relative/x.py") == "relative/x.py"


def test_named_roots_of_another_machine() -> None:
    extra = {f"{ELSEWHERE}/checkout": "", f"{ELSEWHERE}/checkout/third_party": "<third_party>",
             f"{ELSEWHERE}/out": "$OUT"}
    assert public_path(f"{ELSEWHERE}/checkout/reference/quant.py", extra) == "reference/quant.py"
    assert public_path(f"{ELSEWHERE}/checkout/third_party/vllm", extra) == "<third_party>/vllm"
    assert public_path(f"{ELSEWHERE}/out/m.md", extra) == "$OUT/m.md"


def test_every_path_in_a_text_and_only_those() -> None:
    text = (f"kernel raised: X (at {ELSEWHERE}/v/lib/python3.11/site-packages/vllm/a.py:49); wrote {REPO}/results/x. "
            "see https://example.org/a/b, /dev/shm/x, w4a16/G128 and ../docs/x.md; "
            f"F.F..../v/lib/python3.12/site-packages/_pytest/main.py:365")
    expected = ("kernel raised: X (at vllm/a.py:49); wrote results/x. "
                "see https://example.org/a/b, /dev/shm/x, w4a16/G128 and ../docs/x.md; F.F.._pytest/main.py:365")
    assert public_text(text) == expected
    assert public_text(expected) == expected  # named paths are not named again
    record = {"reason": text, "libraries": [f"vllm (source {REPO}/third_party/vllm)"], "n": 3}
    assert public_record(record) == {"reason": expected, "libraries": ["vllm (source <third_party>/vllm)"], "n": 3}


def test_a_frame_of_an_installed_package_names_its_distribution() -> None:
    line = code_location(torch.__file__, 7)
    assert line == f"torch/__init__.py:7 in torch {metadata.version('torch')}"
    assert code_location(str(REPO / "reference" / "quant.py"), 443) == "reference/quant.py:443"


def test_where_a_kernel_raised_names_no_absolute_path(tmp_path: Path) -> None:
    module = tmp_path / "kernel_module.py"
    namespace: dict = {}
    exec(compile("def kernel():\n    raise ValueError('bad')\n", str(module), "exec"), namespace)
    with pytest.raises(ValueError) as info:
        namespace["kernel"]()
    at = where(info.value)
    assert at.endswith("/kernel_module.py:2") and not at.startswith("/") and str(tmp_path) not in at, at


def test_a_library_source_is_named_without_the_checkout() -> None:
    label = Source(path=str(REPO / "third_party" / "vllm"), content="abc").label()
    assert label == "source <third_party>/vllm, content sha256 abc"


def _failing(reason: str) -> Result:
    case = Case(op="activation", adapter="k", features={"activation": "silu_and_mul", "dtype": "float32"},
                shapes={"M": 1}, seed=1)
    return Result(case=case, verdict="error", reason=reason, generation="interp",
                  device={"generation": "interp", "torch_version": "2", "triton_version": "3", "commit": "abc"},
                  run_id="pytest-0123456789ab")


def test_results_case_files_and_the_render_name_no_absolute_path(tmp_path: Path) -> None:
    results = tmp_path / "results"
    with ResultStore(results, run_id="pytest-0123456789ab", worker="gw0") as store:
        store.append(_failing(f"kernel raised: X (at {REPO}/kernels/fused_experts.py:3)"))
        store.append_meta("run", {"command": f"python -m harness matrix --out {tmp_path}/m.md"})
    written = [store.path, *sorted((results / "cases").glob("*.json"))]
    assert len(written) == 2
    out = tmp_path / "rendered" / "M.md"
    render_files([results], out)
    written += [out, out.with_suffix(".json"), *sorted((out.parent / "M.cases").glob("*.json"))]
    for f in written:
        text = f.read_text(encoding="utf-8")
        assert str(tmp_path) not in text and str(REPO) not in text, f
    assert "kernels/fused_experts.py:3" in store.path.read_text(encoding="utf-8")
    assert json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))["sources"][0].endswith("/results")
