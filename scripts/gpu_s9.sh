#!/usr/bin/env bash
# Session 9's GPU verification (#19): the third-party libraries that can travel to the GPU machine (torchao and
# Liger, carried as wheels in .whl/) - their tests, their generic tests (gpu profile) and their quick matrix on this
# GPU - plus the interpreter and library tests of the harness, compiled. vLLM's CPU build cannot run there: its
# adapters report their cells unsupported on this generation.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > "$OUT/install.log" 2>&1 || { echo "wheel install failed"; cat "$OUT/install.log"; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/site
R=/tmp/res; rm -rf "$R"; mkdir -p "$R"
T0=$(date +%s)
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
  python -c "import torchao, liger_kernel; print('torchao', torchao.__version__)"
  echo "commit: ${MOE_HARNESS_COMMIT:-unknown}"; } > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"
HYPOTHESIS_PROFILE=gpu timeout 150 python -m pytest -n 8 -q -p no:cacheprovider --moe-results-dir "$R/pytest" \
  tests/external tests/harness/test_libraries.py tests/harness/test_interpreter.py \
  tests/harness/test_routing_score_dtype.py -rfE > "$OUT/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - T0 ))s"; grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | cut -c1-250 | head; tail -2 "$OUT/tests.log"
for c in .whl/*_case.json; do  # a case that failed on the GPU, replayed on the GPU and on its CPU
  [ -e "$c" ] || continue
  for d in cuda cpu; do echo "== $c on $d"; timeout 60 python -m harness replay "$c" --device $d 2>&1 | grep -E "^(pass|fail|error)|reason" | cut -c1-250; done
done
timeout ${MATRIX_S:-330} python -m harness matrix --profile quick --adapter external --results-dir "$R/matrix" --case-timeout 60 \
  --only-this-run --out "$OUT/matrix_external.md" > "$OUT/matrix.log" 2>&1; echo "matrix rc=$? $(( $(date +%s) - T0 ))s"
tail -4 "$OUT/matrix.log" | cut -c1-250
if [[ -n "${GENERIC_S:-}" ]]; then
  timeout "$GENERIC_S" python -m pytest -n 8 -q -p no:cacheprovider --moe-results-dir "$R/generic" \
    harness/plugin/generic.py --moe-adapter external -rfE > "$OUT/generic.log" 2>&1
  echo "generic rc=$? $(( $(date +%s) - T0 ))s"; grep -E "^(FAILED|ERROR)" "$OUT/generic.log" | cut -c1-250 | head
  tail -2 "$OUT/generic.log"
fi
cp -r "$R" "$OUT/results"
tar czf /tmp/s.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/s.tgz "$OUT/session.tgz"
echo "done $(( $(date +%s) - T0 ))s"
