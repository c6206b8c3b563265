"""The matrix's seed table (harness/store/seed_table.py): a row for every system the seed tables name, cells
generated from the verdicts with the generations they were verified on, and a reason where none covers a row."""

from __future__ import annotations

from typing import Any

from harness.store import render, seed_table

#: every kernel the seed tables name (vLLM's moe_kernel_features.md v0.15.0, SGLang's MoE implementations)
SEED_SYSTEMS = {
    "vLLM": {"triton", "triton (batched)", "deep gemm", "cutlass_fp4", "cutlass_fp8", "flashinfer", "gpt oss triton",
             "marlin", "trtllm", "rocm aiter moe", "cpu_fused_moe", "naive batched"},
    "SGLang": {"FusedMoE (Triton)", "FlashInferFusedMoE", "FlashInferFP4MoE", "FlashInferCutlass", "DeepEPMoE"},
}


def _value(v: str, by_gen: dict[str, list[int]]) -> dict[str, Any]:
    return {"value": v, "by_generation": by_gen}


def _kernel(name: str, activation: list[dict[str, Any]], gens: dict[str, dict[str, Any]]) -> dict[str, Any]:
    axes = [{"name": "format", "values": [_value("standard", {"interp": [3, 4]})]},
            {"name": "quant_type", "values": [_value("none", {"interp": [3, 4]})]},
            {"name": "quant_format", "values": [_value("-", {"interp": [3, 4]})]},
            {"name": "activation", "values": activation},
            {"name": "apply_weight_on_input", "values": [_value("N", {"interp": [3, 4]})]}]
    return {"name": name, "op": "experts", "axes": axes, "generations": gens}


def test_every_seed_system_has_a_row() -> None:
    rows = seed_table.build([])
    got: dict[str, set[str]] = {}
    for r in rows:
        got.setdefault(r["system"], set()).add(r["kernel"])
        assert r["unverifiable"], r  # no verdicts at all: every row says why
    assert got == SEED_SYSTEMS


def test_cells_come_from_verdicts_with_their_generations() -> None:
    act = [_value("silu", {"interp": [2, 2], "sm90": [1, 2]}), _value("gelu", {"interp": [0, 2]}),
           _value("swigluoai", {})]
    kernel = _kernel("sglang-triton-experts", act, {"interp": {"status": "partial", "passed": 3, "exercised": 4}})
    rows = {r["kernel"]: r for r in seed_table.build([kernel])}
    row = rows["FusedMoE (Triton)"]
    assert "unverifiable" not in row and "sglang-triton-experts: 3/4" in row["verified"]
    assert row["cells"]["activation"] == "silu (interp; sm90 partial), ~~gelu~~ (~~interp~~)"
    assert row["cells"]["quant_type"] == "N/A (unquantized)" and row["cells"]["quant_format"] == "N/A"
    assert rows["flashinfer"]["unverifiable"].startswith("FlashInfer")
    lines = seed_table.to_markdown(seed_table.build([kernel]), render._table)
    assert lines[0].startswith("## Seed table") and "not verifiable here: FlashInfer" in "\n".join(lines)


def test_a_row_whose_library_never_ran_says_so() -> None:
    kernel = _kernel("vllm-naive-batched", [], {"cpu": {"status": "not installed", "passed": 0, "exercised": 0}})
    row = {r["kernel"]: r for r in seed_table.build([kernel])}["naive batched"]
    assert "not installed" in row["unverifiable"]


def test_no_section_without_a_seed_system_in_the_results() -> None:
    assert seed_table.to_markdown(seed_table.build([]), render._table) == []
    other = _kernel("my-kernel", [_value("silu", {"sm90": [1, 1]})], {"sm90": {"status": "pass", "passed": 1,
                                                                               "exercised": 1}})
    assert seed_table.to_markdown(seed_table.build([other]), render._table) == []


def test_a_row_that_ran_and_failed_everywhere_says_so_not_that_it_was_not_installed() -> None:
    rows = seed_table.build([{"name": "deepgemm-contiguous-experts", "op": "experts",
                              "generations": {"sm90": {"status": "fail", "passed": 0, "exercised": 4}}}])
    row = next(r for r in rows if "deepgemm-contiguous-experts" in r["adapters"])
    assert row["unverifiable"].startswith("ran, every case failed") and "0/4" in row["unverifiable"], row
