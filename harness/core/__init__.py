"""The vocabulary every layer shares: case, result, device, error model, comparisons, inputs, size strategies.
Imports torch, hypothesis and the oracle (reference) only."""
