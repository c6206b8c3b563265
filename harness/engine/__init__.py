"""Judging: one case against the oracle (runner), cases drawn within declared support (strategies), the Triton
interpreter fidelity layer and the hypothesis profiles. Imports ops, registry, core."""
