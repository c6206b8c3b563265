"""No function of the project runs past ~80 lines without a reason.

Length is counted from the first statement after the docstring to the end (a long docstring is documentation,
not length). Triton kernels (`@triton.jit`, and Gluon's `@gluon.jit`) are exempt: a kernel body is kept whole where
splitting it into device functions would cost registers or compile time; any other exception is listed in ALLOWED
with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 80
PARTS = ("harness", "kernels", "reference", "examples", "scripts")
#: "path::function" -> why it may be longer
ALLOWED: dict[str, str] = {}


def body_length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str) and len(body) > 1:
        body = body[1:]
    first = min(getattr(s, "lineno", node.lineno) for s in body) if body else node.lineno
    for s in body[:1]:  # decorators of a nested function start above it
        first = min([first, *(d.lineno for d in getattr(s, "decorator_list", []))])
    return (node.end_lineno or node.lineno) - first + 1


def is_triton_kernel(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if ast.unparse(target) in ("triton.jit", "gluon.jit", "jit"):
            return True
    return False


def long_functions(root: Path = ROOT, limit: int = LIMIT) -> list[tuple[str, int]]:
    found = []
    for part in PARTS:
        for path in sorted((root / part).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not is_triton_kernel(node):
                    n = body_length(node)
                    if n > limit:
                        found.append((f"{path.relative_to(root)}::{node.name}", n))
    return found


def test_no_function_past_the_limit_without_a_reason() -> None:
    bad = [f"{name}: {n} lines" for name, n in long_functions() if name not in ALLOWED]
    assert not bad, f"functions over {LIMIT} lines (split them into named steps, or say why in ALLOWED):\n" + \
        "\n".join(bad)


def test_every_allowance_is_still_needed() -> None:
    long = {name for name, _ in long_functions()}
    assert not set(ALLOWED) - long, f"ALLOWED lists functions that are short now: {sorted(set(ALLOWED) - long)}"


@pytest.mark.parametrize("lines, caught", [(LIMIT, False), (LIMIT + 1, True)])
def test_a_long_function_is_caught(tmp_path: Path, lines: int, caught: bool) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(lines))
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "m.py").write_text(f'def f():\n    """Doc."""\n{body}\n\n\n@triton.jit\ndef k():\n{body}\n'
                                               f'\n\n@gluon.jit\ndef g():\n{body}\n')
    assert bool(long_functions(tmp_path)) is caught
