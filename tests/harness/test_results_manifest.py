"""Results are what the judge wrote: every results file carries a manifest written by the judge alone (line hashes
and counts, signed with this machine's key), and a render, `--from` or `--resume` reads only the files and lines
their manifest vouches for; anything else is left out and named in one line, never merged silently."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness import cli
from harness.core.case import Case
from harness.core.paths import public_record
from harness.core.result import Result
from harness.store import results as store_results
from harness.store.render import build, render_files, to_markdown
from harness.store.results import ResultStore, load, result_files

ROOT = Path(__file__).resolve().parents[2]
DEVICE = {"device_name": "NVIDIA H100", "capability": [9, 0], "torch_version": "2.11", "triton_version": "3.6.0",
          "commit": "aaaaaaa"}


@pytest.fixture(autouse=True)
def _key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This machine's key, kept outside the results folders."""
    key = tmp_path / "config" / "key"
    monkeypatch.setenv("MOE_HARNESS_KEY_FILE", str(key))
    return key


def _case(adapter: str, seed: int) -> Case:
    return Case(op="activation", adapter=adapter, features={"activation": "silu_and_mul", "dtype": "float32"},
                shapes={"T": 3, "N": 8}, seed=seed)


def _run(folder: Path, run_id: str, adapter: str, verdict: str, when: float, reason: str = "outputs differ",
         **metrics: object) -> Path:
    """A complete sweep of one case of `adapter`, as the judge writes it."""
    with ResultStore(folder, run_id=run_id, worker="main") as store:
        store.append_meta("run", {"generation": "sm90", "device": DEVICE, "profile": "quick", "commit": "aaaaaaa",
                                  "dirty": False, "shard": ""})
        store.append_meta("adapter", {"adapter": adapter, "op": "activation", "generation": "sm90", "cases": 1})
        store.append(Result(case=_case(adapter, 1), verdict=verdict, reason="" if verdict == "pass" else reason,
                            generation="sm90", device=DEVICE, timestamp=when, metrics=dict(metrics)))
    return store.path


def _forged_lines(tmp_path: Path) -> str:
    """Three lines that make a later, complete run in which the canary passes (what a kernel could write)."""
    elsewhere = _run(tmp_path / "forger", "matrix-sm90-later", "canary", "pass", 9000)
    return elsewhere.read_text(encoding="utf-8")


def _status(out: Path, adapter: str) -> tuple[int, int]:
    model = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
    g = next(a for a in model["adapters"] if a["name"] == adapter)["generations"]["sm90"]
    return g["exercised"], g["passed"]


def _render(folder: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = cli.main(["matrix", "--from", str(folder), "--out", str(out)])
    return rc, capsys.readouterr().err


def test_a_forged_complete_run_dropped_into_a_results_folder_is_left_out_and_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "results"
    _run(folder, "matrix-sm90-real", "canary", "fail", 1000)
    forged = folder / "matrix-sm90-later-main.jsonl"
    forged.write_text(_forged_lines(tmp_path), encoding="utf-8")
    out = tmp_path / "out" / "M.md"
    rc, err = _render(folder, out, capsys)
    assert rc == 0, err
    assert _status(out, "canary") == (1, 0), "the forged pass was merged"
    assert f"left out: {forged} (no manifest)" in err, err


def test_a_forged_run_with_a_manifest_of_its_own_is_left_out(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel can write a manifest too (the format is public), but not sign it with this machine's key."""
    folder = tmp_path / "results"
    _run(folder, "matrix-sm90-real", "canary", "fail", 1000)
    monkeypatch.setenv("MOE_HARNESS_KEY_FILE", str(tmp_path / "forger-key"))  # the forger's own key
    forged = _run(tmp_path / "forger", "matrix-sm90-later", "canary", "pass", 9000)
    monkeypatch.setenv("MOE_HARNESS_KEY_FILE", str(tmp_path / "config" / "key"))
    for p in (forged, forged.with_name(forged.name + ".manifest")):
        shutil.copy(p, folder / p.name)
    out = tmp_path / "out" / "M.md"
    rc, err = _render(folder, out, capsys)
    assert rc == 0 and _status(out, "canary") == (1, 0), err
    assert re.search(r"left out: \S+matrix-sm90-later-main\.jsonl \(its manifest is not signed with this machine's "
                     r"key", err), err


def test_forged_lines_appended_to_a_finished_run_break_its_manifest(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "results"
    real = _run(folder, "matrix-sm90-real", "canary", "fail", 1000)
    _run(folder, "matrix-sm90-other", "other", "pass", 1000)
    real.write_text(real.read_text(encoding="utf-8") + _forged_lines(tmp_path), encoding="utf-8")
    out = tmp_path / "out" / "M.md"
    rc, err = _render(folder, out, capsys)
    assert rc == 0, err
    assert f"left out: {real} (does not match its manifest: 3 lines changed)" in err, err
    model = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
    assert [a["name"] for a in model["adapters"]] == ["other"]


def test_an_edited_verdict_line_breaks_the_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "results"
    real = _run(folder, "matrix-sm90-real", "canary", "fail", 1000)
    _run(folder, "matrix-sm90-other", "other", "pass", 1000)
    text = real.read_text(encoding="utf-8")
    assert text.count('"verdict": "fail"') == 1
    real.write_text(text.replace('"verdict": "fail"', '"verdict": "pass"'), encoding="utf-8")
    out = tmp_path / "out" / "M.md"
    rc, err = _render(folder, out, capsys)
    assert rc == 0, err
    assert f"left out: {real} (does not match its manifest: 1 line changed)" in err, err
    assert "canary" not in out.read_text(encoding="utf-8")


def test_a_legit_run_renders_as_it_did_without_manifests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "results"
    _run(folder, "matrix-sm90-real", "canary", "fail", 1000)
    _run(folder, "matrix-sm90-other", "other", "pass", 1000)
    out = tmp_path / "out" / "M.md"
    rc, err = _render(folder, out, capsys)
    assert rc == 0 and "left out" not in err, err
    results, meta = load([folder])
    command = f"python -m harness matrix --from {folder}"
    model = public_record(build(results, meta, command=command, sources=[str(folder)], cases_folder="M.cases"))
    assert out.read_text(encoding="utf-8") == to_markdown(model)
    assert _status(out, "canary") == (1, 0) and _status(out, "other") == (1, 1)


def test_a_crashed_run_keeps_what_its_last_checkpoint_vouched_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(store_results, "CHECKPOINT_S", 1e9)  # no checkpoint but the ones made here
    folder = tmp_path / "results"
    store = ResultStore(folder, run_id="matrix-sm90-crashed", worker="main")
    store.append_meta("run", {"generation": "sm90", "device": DEVICE, "profile": "quick", "commit": "aaaaaaa",
                              "dirty": False, "shard": ""})
    store.append_meta("adapter", {"adapter": "canary", "op": "activation", "generation": "sm90", "cases": 2})
    store.append(Result(case=_case("canary", 1), verdict="pass", generation="sm90", device=DEVICE, timestamp=5))
    store.checkpoint()
    store.append(Result(case=_case("canary", 2), verdict="pass", generation="sm90", device=DEVICE, timestamp=6))
    assert store._fh is not None
    store._fh.close()  # killed: never closed, its last line never vouched for
    out = tmp_path / "out" / "M.md"
    rc, err = _render(folder, out, capsys)
    assert rc == 0, err
    assert _status(out, "canary") == (1, 1)
    assert f"left out: {store.path}: line 4 (written after its manifest's last checkpoint" in err, err


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_committed_results_render_on_another_machine_and_uncommitted_forgeries_do_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A clone elsewhere has another key: the results git holds as committed are checked by their hashes; a file a
    kernel dropped into the checkout's results/ (with a manifest it made) is not committed and is left out."""
    repo = tmp_path / "clone"
    monkeypatch.setenv("MOE_HARNESS_KEY_FILE", str(tmp_path / "machine-that-ran-it"))
    run_dir = repo / "results" / "sm90" / "run"
    _run(run_dir, "matrix-sm90-real", "canary", "fail", 1000)
    for args in (["init", "-q"], ["add", "results"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                                                        "-m", "results"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    monkeypatch.setenv("MOE_HARNESS_KEY_FILE", str(tmp_path / "this-machine"))
    out = tmp_path / "out" / "M.md"
    rc, err = _render(repo / "results", out, capsys)
    assert rc == 0 and "left out" not in err and _status(out, "canary") == (1, 0), err
    monkeypatch.setenv("MOE_HARNESS_KEY_FILE", str(tmp_path / "kernel-key"))
    forged = _run(tmp_path / "forger", "matrix-sm90-later", "canary", "pass", 9000)
    monkeypatch.setenv("MOE_HARNESS_KEY_FILE", str(tmp_path / "this-machine"))
    for p in (forged, forged.with_name(forged.name + ".manifest")):
        shutil.copy(p, run_dir / p.name)
    rc, err = _render(repo / "results", out, capsys)
    assert rc == 0 and _status(out, "canary") == (1, 0), err
    assert "matrix-sm90-later-main.jsonl (its manifest is not signed with this machine's key and git does not hold" \
        in err, err


def test_every_committed_results_file_has_a_manifest_that_matches() -> None:
    import subprocess

    from harness.store import manifest
    from harness.store.differential import is_run_file

    tracked = set(subprocess.run(["git", "ls-files", "results", "tests/harness/fixtures"], cwd=ROOT, text=True,
                                 capture_output=True, check=True).stdout.split())
    checked = 0
    for path in result_files([ROOT / "results", ROOT / "tests" / "harness" / "fixtures"]):
        if path.relative_to(ROOT).as_posix() not in tracked:  # a local run's output (results/local is ignored)
            continue
        data = manifest.files.read_bytes(path)
        if store_results.not_a_results_file(data.decode("utf-8").split("\n")) and not is_run_file(path):
            continue  # other data; a differential run's file has a manifest too
        found = manifest.inspect(path, data, None)
        assert found.matches and not found.tail, f"{path}: {found.why()}"
        checked += 1
    assert checked > 100


def test_rendered_reasons_carry_no_raw_html(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    _run(folder, "matrix-sm90-real", "canary", "fail", 1000,
         reason="outputs differ <img src=x onerror=alert(1)> & <script>alert(2)</script>")
    out = tmp_path / "out" / "M.md"
    render_files([folder], out)
    text = " ".join(re.sub(r"`[^`]*`", "", out.read_text(encoding="utf-8")).split())  # a code span shows it as is
    assert "<img" not in text and "<script" not in text
    assert "&lt;img src=x onerror=alert(1)&gt; &amp; &lt;script&gt;" in text


def test_case_files_of_the_rendered_matrix_name_the_adapter_object(tmp_path: Path) -> None:
    """A case file says how a fresh process finds the adapter (`adapter_object`, `module:object`), as the judge's
    own case files do; the render's copies dropped it."""
    folder = tmp_path / "results"
    _run(folder, "matrix-sm90-real", "canary", "fail", 1000, adapter_object="tests.harness.fixtures.x:CANARY")
    _run(folder, "matrix-sm90-other", "other", "fail", 1000)
    out = tmp_path / "out" / "M.md"
    render_files([folder], out)
    found = {json.loads(p.read_text())["case"]["adapter"]: json.loads(p.read_text())
             for p in (out.parent / "M.cases").glob("*.json")}
    assert found["canary"]["adapter_object"] == "tests.harness.fixtures.x:CANARY"
    assert "adapter_object" in found["other"] and found["other"]["adapter_object"] is None


def test_a_file_the_judge_restored_from_its_record_still_matches_its_manifest(tmp_path: Path) -> None:
    from harness.store import manifest

    store = ResultStore(tmp_path, run_id="t")
    store.append(Result(case=_case("canary", 1), verdict="fail", reason="out: wrong", generation="sm90"))
    text = store.path.read_text(encoding="utf-8")
    store.path.write_text(text.replace('"verdict": "fail"', '"verdict": "pass"'), encoding="utf-8")
    store._seen = store._stamp()  # the rewrite fell in the same clock tick: found when the store closes
    store.close()
    gate = manifest.Gate()
    results, meta = load([tmp_path], gate=gate)
    assert [r.verdict for r in results] == ["fail"] and [m["kind"] for m in meta] == ["tampered"]
    assert gate.notes == []


def test_results_of_another_machine_are_read_once_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from harness.store import sealing

    monkeypatch.setenv("MOE_HARNESS_KEY_FILE", str(tmp_path / "gpu-machine-key"))
    folder = tmp_path / "copied"
    good = _run(folder, "matrix-sm90-real", "canary", "fail", 1000)
    edited = _run(folder, "matrix-sm90-other", "other", "fail", 1000)
    monkeypatch.setenv("MOE_HARNESS_KEY_FILE", str(tmp_path / "config" / "key"))
    edited.write_text(edited.read_text(encoding="utf-8").replace('"fail"', '"pass"'), encoding="utf-8")
    assert sealing.main(["--check", str(folder)]) == 1
    assert sealing.main(["--committed", str(folder)]) == 0  # both have manifests: nothing to add
    assert sealing.main(["--accept", str(folder)]) == 1
    out = capsys.readouterr().out
    assert f"accepted: {good}" in out and f"not accepted: {edited} (does not match its manifest: 1 line" in out
    rc, err = _render(folder, tmp_path / "out" / "M.md", capsys)
    assert rc == 0 and _status(tmp_path / "out" / "M.md", "canary") == (1, 0), err
    assert f"left out: {edited} (does not match its manifest" in err and str(good) not in err, err


def test_a_manifest_that_claims_this_machines_key_without_its_signature_is_left_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from harness.store import manifest

    folder = tmp_path / "results"
    real = _run(folder, "matrix-sm90-real", "canary", "fail", 1000)
    mine = json.loads(real.with_name(real.name + ".manifest").read_text())["key_id"]
    monkeypatch.setenv("MOE_HARNESS_KEY_FILE", str(tmp_path / "forger-key"))
    forged = _run(tmp_path / "forger", "matrix-sm90-later", "canary", "pass", 9000)
    monkeypatch.setenv("MOE_HARNESS_KEY_FILE", str(tmp_path / "config" / "key"))
    rec = json.loads(forged.with_name(forged.name + ".manifest").read_text())
    rec["key_id"] = mine  # copied from a real manifest; the HMAC is still the forger's
    shutil.copy(forged, folder / forged.name)
    (folder / (forged.name + ".manifest")).write_text(json.dumps(rec))
    rc, err = _render(folder, tmp_path / "out" / "M.md", capsys)
    assert rc == 0 and _status(tmp_path / "out" / "M.md", "canary") == (1, 0), err
    assert "matrix-sm90-later-main.jsonl (its manifest's signature does not match" in err, err
    assert manifest.inspect(folder / forged.name, forged.read_bytes(), manifest.load_key()).status == "forged"
