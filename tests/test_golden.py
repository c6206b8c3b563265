"""Every committed golden file must be reproduced bitwise by the current oracle and torch."""

import pytest

from harness.commands import golden

CASES = sorted(golden.cases())


def test_there_are_golden_cases() -> None:
    assert CASES, "no golden cases registered"


@pytest.mark.parametrize("name", CASES)
def test_golden_reproduces(name: str) -> None:
    problems = golden.mismatches(name)
    assert not problems, (
        f"golden case {name!r} changed: {'; '.join(problems)}. If intended, regenerate it with "
        f"`python -m harness golden --regenerate {name}` and say why in the commit."
    )
