#!/usr/bin/env bash
# One GPU verification session, for the lent device machine (or any CUDA box): the test suite with the `gpu`
# hypothesis profile, the benchmarks and the matrix sweep. SECTIONS picks what runs (default: all three).
# Logs and results go under $OUT (default ./gpu-out); results as one tarball, so few files travel back.
#   SECTIONS="pytest bench"  PYTEST_ARGS="-k triton"  BENCH_OPS="group_quant reduce"  bash scripts/gpu_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
RES=/tmp/moe-harness-results
rm -rf "$RES"; mkdir -p "$RES"
SECTIONS=${SECTIONS:-"pytest bench matrix"}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), torch.cuda.get_device_capability())"
  echo "commit: ${MOE_HARNESS_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
} > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"
T0=$(date +%s)

if [[ " $SECTIONS " == *" pytest "* ]]; then
  echo "== pytest (${HYPOTHESIS_PROFILE:-gpu} profile)"
  HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-gpu} timeout "${PYTEST_TIMEOUT:-300}" \
    python -m pytest -n "${WORKERS:-8}" -q -p no:cacheprovider --moe-results-dir "$RES/pytest" ${PYTEST_ARGS:-} \
    > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$? after $(( $(date +%s) - T0 ))s"; grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | cut -c1-300 | head -40
  tail -3 "$OUT/pytest.log"
fi

if [[ " $SECTIONS " == *" bench "* ]]; then
  echo "== bench"
  for op in ${BENCH_OPS:-routing group_quant activation act_quant align reduce experts}; do
    timeout "${BENCH_TIMEOUT:-60}" python -m harness bench --op "$op" > "$OUT/bench_$op.log" 2>"$OUT/bench_$op.err"
    echo "bench $op rc=$? after $(( $(date +%s) - T0 ))s"; cat "$OUT/bench_$op.log" | cut -c1-260
  done
fi

if [[ " $SECTIONS " == *" matrix "* ]]; then
  echo "== matrix sweep"
  timeout "${MATRIX_TIMEOUT:-200}" python -m harness matrix --results-dir "$RES/matrix" --case-timeout 60 \
    --out "$OUT/SUPPORT_MATRIX_gpu.md" ${MATRIX_ARGS:-} > "$OUT/matrix.log" 2>&1
  echo "matrix rc=$? after $(( $(date +%s) - T0 ))s"; tail -15 "$OUT/matrix.log" | cut -c1-300
fi

# one archive: the device tool brings back only a few files per call
cp -r "$RES" "$OUT/results"
tar czf /tmp/session.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/session.tgz "$OUT/session.tgz"
echo "done after $(( $(date +%s) - T0 ))s"
