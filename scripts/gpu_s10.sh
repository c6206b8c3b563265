#!/usr/bin/env bash
# Session 10's GPU verification (#18, #20): the changed experts kernel (fp8 tiles, fast accumulation) and the
# changed judge (bounds, tie rows) - kernel tests and the generic tests of the experts adapters with the gpu
# profile, the quick experts matrix of our Triton experts - then the experts benchmark of the schemes given in
# BENCH_QUANT with vLLM's kernel beside ours (vLLM's fused_moe directory carried in .whl/vllm_fm).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/res; rm -rf "$R"; mkdir -p "$R"
T0=$(date +%s)
. scripts/_device_info.sh; device_info "$OUT/device.txt"
if [[ -z "${SKIP_TESTS:-}" ]]; then
  HYPOTHESIS_PROFILE=gpu timeout ${TESTS_S:-200} python -m pytest -n 8 -q -p no:cacheprovider --moe-results-dir "$R/pytest" \
    tests/kernels/test_experts_kernels.py harness/plugin/generic.py ${GENERIC_ADAPTERS:---moe-adapter triton-experts} \
    -rfE > "$OUT/tests.log" 2>&1
  echo "tests rc=$? $(( $(date +%s) - T0 ))s"; grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | cut -c1-250 | head
  tail -2 "$OUT/tests.log"
  timeout ${MATRIX_S:-150} python -m harness matrix --profile quick --adapter triton-experts \
    --adapter triton-experts-fp8-fast --results-dir "$R/matrix" --case-timeout 60 --only-this-run \
    --out "$OUT/matrix_experts.md" > "$OUT/matrix.log" 2>&1; echo "matrix rc=$? $(( $(date +%s) - T0 ))s"
  tail -3 "$OUT/matrix.log" | cut -c1-250
fi
if [[ -n "${BENCH_QUANT:-}" ]]; then
  args=(); for q in $BENCH_QUANT; do args+=(--quant "$q"); done
  for s in ${BENCH_SHAPES:-deepseek-v3}; do
    timeout ${BENCH_S:-200} python -m harness bench --op experts --shape "$s" "${args[@]}" ${BENCH_M:-} \
      --against-vllm .whl/vllm_fm > "$OUT/bench_$s.md" 2> "$OUT/bench_$s.log"
    echo "bench $s rc=$? $(( $(date +%s) - T0 ))s"
  done
fi
tar czf "$OUT/results.tgz" -C "$R" .  # one file: the machine returns a limited number
echo "done $(( $(date +%s) - T0 ))s"
