"""The quick subset of this suite (`pytest -m quick`): a verdict in about a minute on 2 CPU cores.

One list, by area, of node-id prefixes; `conftest.py` marks the matching tests `quick`. A prefix takes a whole folder
(ending in `/`), a file, a test function (every parameter of it) or one parametrized test. The generic tests' shards
(`-shardN]`) count as their `-shard0]` item. What each area proves:

- reference: the oracle's own tests (formulas against float64 emulations, errors, layouts) and the golden outputs.
- kernels: our Triton kernels' generic tests (ci profile: 8 drawn cases after the explicit ones) and a few of their
  unit tests, in Triton's interpreter.
- harness: the judge catches planted bugs (wrong adapters, one mutant of every op family) and passes correct kernels.
- docs: the README's commands parse.

Chosen by measured durations (`tests/durations/cpu.json`); `tests/test_quick.py` keeps every area non-empty, every
prefix matching a test, and the measured total within QUICK_BUDGET_S.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

#: summed measured seconds of the quick tests (one core); on 2 xdist workers about half, plus ~20 s of startup
QUICK_BUDGET_S = 90.0

_GENERIC = "harness/plugin/generic.py::"
#: our kernels whose generic tests are quick (the fused experts kernel is the longest, at about 11 s)
_KERNELS = ("triton-activation", "triton-routing", "triton-reduce", "triton-group-quant", "triton-act-quant",
            "triton-experts")
#: one planted bug per op family, each caught in well under a second
_MUTANTS = ("act-gate-up-swapped", "aq-amax-signed", "experts-gate-up-swapped", "experts-router-weight-twice",
            "experts-expert-map-ignored", "gq-group-scale-2pct", "grouped-score-by-max", "reduce-weight-ignored",
            "routing-renormalize-skipped", "align-count-unpadded")

QUICK: dict[str, tuple[str, ...]] = {
    "reference": (
        "tests/reference/",
        "tests/test_golden.py",
    ),
    "kernels": (
        *(f"{_GENERIC}test_declared_cases_pass[{name}-shard0]" for name in _KERNELS),
        *(f"{_GENERIC}test_undeclared_cells_rejected_cleanly[{name}]" for name in _KERNELS),
        "tests/kernels/test_routing.py",
        "tests/kernels/test_reduce_kernels.py",
        "tests/kernels/test_group_quant.py",
        "tests/kernels/test_activation_kernels.py::test_every_activation_cell",
        "tests/kernels/test_align_kernels.py::test_block_sizes_and_tiny_shapes",
    ),
    "harness": (
        "tests/harness/test_integrity.py",
        "tests/harness/test_core.py",
        "tests/harness/test_judging_rules.py::test_the_search_goes_past_its_first_failure",
        "tests/harness/test_judging_rules.py::test_what_rejects_an_undeclared_cell_cleanly",
        "tests/harness/test_vacuous.py::test_a_cell_backed_only_by_vacuous_cases_fails_the_generic_test",
        "tests/harness/test_conventions.py::test_the_committed_conventions_reference_is_current",
        "tests/harness/test_conventions.py::test_every_registered_adapter_states_valid_conventions",
        "tests/mutants/test_mutants.py::test_mutant_changes_the_source",
        *(f"tests/mutants/test_mutants.py::test_mutant_is_caught[{name}]" for name in _MUTANTS),
        *(f"tests/test_quick.py::{name}" for name in (
            "test_every_area_has_quick_tests", "test_every_entry_names_a_test", "test_the_quick_set_fits_its_budget",
            "test_prefixes_name_folders_files_functions_and_shards")),
    ),
    "docs": (
        "tests/test_readme.py::test_every_command_parses",
        "tests/test_readme.py::test_a_command_that_does_not_parse_is_caught",
        "tests/test_readme.py::test_the_docs_have_commands_this_test_knows",
    ),
}

_SHARD = re.compile(r"-shard\d+\]$")


def matches(prefix: str, nodeid: str) -> bool:
    """Whether `prefix` names `nodeid`: the same id, or a folder, file or function of it."""
    nodeid = _SHARD.sub("-shard0]", nodeid)
    if nodeid == prefix or (prefix.endswith("/") and nodeid.startswith(prefix)):
        return True
    return nodeid.startswith(prefix) and nodeid[len(prefix):][:1] in (":", "[")


def area_of(nodeid: str, quick: Mapping[str, Iterable[str]] = QUICK) -> str | None:
    """The area whose list names `nodeid`, or None when it is not a quick test."""
    return next((area for area, prefixes in quick.items() if any(matches(p, nodeid) for p in prefixes)), None)
