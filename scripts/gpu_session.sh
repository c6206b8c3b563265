#!/usr/bin/env bash
# One full GPU verification session, for the lent device machine (or any CUDA box): the test suite with the `gpu`
# hypothesis profile, the matrix sweep, and the benchmarks. Logs and results go under $OUT (default ./gpu-out),
# results as one tarball, so few files travel back.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
RES=/tmp/moe-harness-results
rm -rf "$RES"; mkdir -p "$RES"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), torch.cuda.get_device_capability())"
  git rev-parse HEAD 2>/dev/null || echo "commit: (not a git checkout)"
} > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

echo "== pytest (gpu profile)"
HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-gpu} timeout "${PYTEST_TIMEOUT:-330}" \
  python -m pytest -n "${WORKERS:-8}" -q -p no:cacheprovider --results-dir "$RES/pytest" ${PYTEST_ARGS:-} \
  > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; tail -25 "$OUT/pytest.log"

echo "== matrix sweep"
timeout "${MATRIX_TIMEOUT:-150}" python -m harness matrix --results-dir "$RES/matrix" > "$OUT/matrix.log" 2>&1
echo "matrix rc=$?"; tail -12 "$OUT/matrix.log"

echo "== bench"
timeout "${BENCH_TIMEOUT:-90}" python -m harness bench --op reference-experts --shape deepseek-v3 --shape qwen3-30b-a3b \
  --shape mixtral-tp2 > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; cat "$OUT/bench.log"

tar czf "$OUT/results.tgz" -C "$RES" .
