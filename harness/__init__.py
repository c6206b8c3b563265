"""moe-harness: verification engine for fused Mixture-of-Experts kernels.

Layers, lowest first; a layer imports only those below it (tests/harness/test_layers.py checks it):
  core      the vocabulary: case, result, device, error model, comparisons, inputs, size strategies
  registry  the Adapter type and adapter discovery (built-ins, entry points, module:object)
  ops       one spec per op: axes, inputs, outputs, oracle call, checks (and the reference adapters)
  engine    judging one case (runner), drawing cases (strategies), interpreter fidelity, profiles
  store     results (JSONL), case files, the rendered matrix
  sweep     the fault-isolated matrix sweep (cell selection, shards, worker processes)
  front ends: cli + commands/ (one module per command), plugin/ (the pytest plugin)
Adapter authors import `harness.adapters` and `harness.case`; the flat layout's module paths (harness.device,
harness.results, ...) still import, with a DeprecationWarning (`harness._moved`).
"""

from harness import _moved

__version__ = "0.1.0"

_moved.install()
