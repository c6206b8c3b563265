"""Which Triton releases the interpreter fidelity layer supports, and what a run does on any other release.

The fixes themselves are checked by tests/harness/test_interpreter.py under whatever Triton is installed; CI runs
it (with the kernel and planted-bug tests) under two releases. Here: the declared range matches the package
metadata, and an unverified release is named in one line, its Triton kernels are not verifiable (never pass), and
a crash of its interpreter is never recorded as the kernel's error.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.engine import interpreter

ROOT = Path(__file__).resolve().parents[2]


def _requirement(name: str) -> str:
    text = (ROOT / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M)
    assert deps, "pyproject.toml has no dependencies list"
    found = [d for d in re.findall(r'"([^"]+)"', deps.group(1)) if re.match(rf"{name}\b", d)]
    assert len(found) == 1, found
    return found[0].split(";")[0].replace(" ", "")


def test_declared_range_is_the_verified_releases() -> None:
    from packaging.specifiers import SpecifierSet

    spec = _requirement("triton")
    assert spec == interpreter.SUPPORTED_SPEC.replace(" ", ""), (spec, interpreter.SUPPORTED_SPEC)
    allowed = SpecifierSet(spec.removeprefix("triton"))
    assert all(v in allowed for v in interpreter.VERIFIED_VERSIONS)
    # every minor release in the range has a verified release (the ones the supported torch builds pin)
    minors = {v.rsplit(".", 1)[0] for v in interpreter.VERIFIED_VERSIONS}
    assert minors == {"3.6", "3.7", "3.8", "3.9"}
    assert not any(v in allowed for v in ("3.5.1", "3.10.0"))


def test_notice_names_installed_and_verified_releases_and_the_fix() -> None:
    ok = interpreter.FidelityReport("3.9.0", True, True, [])
    assert interpreter.version_notice(ok) is None
    assert interpreter.version_notice(interpreter.FidelityReport("3.5.1", False, False, [])) is None  # compiled
    line = interpreter.version_notice(interpreter.FidelityReport("3.5.1", True, False, []))
    assert line is not None and "\n" not in line
    assert "Triton 3.5.1" in line and interpreter.SUPPORTED_SPEC in line and "3.6.0" in line and "3.9.0" in line


# The child forces the report of an unverified release before anything imports a kernel, then judges: a declared
# Triton kernel (not-verifiable with the release named), and an adapter without interp_features whose kernel the
# interpreter cannot run (inline PTX): not-verifiable there with the release named, and on a verified release
# not-verifiable too, with the interpreter's own message (harness.engine.interpreter_faults).
_CHILD = textwrap.dedent(
    """
    import sys
    from harness.engine import interpreter
    rep = interpreter.install(triton_version=sys.argv[1])
    import torch, triton, triton.language as tl
    from harness import registry
    from harness.core.case import Case
    from harness.core.device import detect
    from harness.engine import runner
    from harness.registry import Adapter

    @triton.jit
    def _asm(x_ptr, y_ptr):
        o = tl.arange(0, 4)
        y = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [tl.load(x_ptr + o)], dtype=tl.float32,
                                      is_pure=True, pack=1)
        tl.store(y_ptr + o, y)

    def run(case, inputs, outputs):
        x = torch.zeros(4)
        _asm[(1,)](x, torch.empty(4))
        outputs["out"].copy_(torch.zeros_like(outputs["out"]))

    dev, unv = detect("cpu"), interpreter.unverifiable_here()
    triton_act = registry.resolve("triton-activation")
    feats = {"activation": "silu_and_mul", "dtype": "float32"}
    asm = Adapter(name="asm-activation", op="activation", source="test", run=run, support={k: (v,) for k, v in
                  feats.items()})
    for a in (triton_act, asm):
        case = Case(op="activation", adapter=a.name, features=feats, shapes={"T": 3, "N": 8},
                    dtypes={"x": "float32"}, seed=1)
        r = runner.judge(case, a, dev, unverifiable=unv)
        print(a.name, r.verdict, "|", r.reason)
    """
)


def _judge_under(version: str) -> dict[str, tuple[str, str]]:
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-c", _CHILD, version], env=env, capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    out = {}
    for line in res.stdout.splitlines():
        name, rest = line.split(" ", 1)
        verdict, reason = rest.split(" | ", 1)
        out[name] = (verdict, reason)
    return out


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), reason="the interpreter's gating")
def test_unverified_release_is_never_a_pass_nor_a_kernel_error() -> None:
    import triton

    verdicts = _judge_under("3.5.1")
    assert verdicts["triton-activation"][0] == "not-verifiable", verdicts
    assert "Triton 3.5.1" in verdicts["triton-activation"][1]
    assert verdicts["asm-activation"][0] == "not-verifiable", verdicts
    assert "Triton 3.5.1" in verdicts["asm-activation"][1]
    if triton.__version__ in interpreter.VERIFIED_VERSIONS:  # the control: the same crash is the kernel's error
        verified = _judge_under(triton.__version__)
        assert verified["triton-activation"][0] == "pass", verified
        assert verified["asm-activation"][0] == "not-verifiable", verified
        assert "inline_asm not supported" in verified["asm-activation"][1], verified
        assert "is not verified" not in verified["asm-activation"][1], verified
