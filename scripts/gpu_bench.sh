#!/usr/bin/env bash
# Experts benchmarks on the GPU (issue 20): the experts kernel tests first (unless SKIP_TESTS), then each line of
# $BENCHES (arguments of `python -m harness bench --op experts`, vLLM's kernel beside ours from .whl/vllm_fm) under
# its own limit (BENCH_S, default 200 s). Everything lands in $OUT/results.tgz (the machine returns few files).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
L=/tmp/bench-logs; rm -rf "$L"; mkdir -p "$L"
T0=$(date +%s)
. scripts/_device_info.sh; device_info "$L/device.txt"
if [[ -z "${SKIP_TESTS:-}" ]]; then
  HYPOTHESIS_PROFILE=gpu timeout ${TESTS_S:-150} python -m pytest -n 8 -q -p no:cacheprovider \
    tests/kernels/test_experts_kernels.py -rfE > "$L/kernel_tests.log" 2>&1
  echo "kernel tests rc=$? $(( $(date +%s) - T0 ))s: $(tail -1 "$L/kernel_tests.log")"
  grep -E "^(FAILED|ERROR)" "$L/kernel_tests.log" | cut -c1-250 | head
fi
i=0
while IFS= read -r line; do
  [[ -z "${line// }" ]] && continue
  i=$((i + 1))
  # shellcheck disable=SC2086
  timeout ${BENCH_S:-200} python -m harness bench --op experts $line --against-vllm .whl/vllm_fm \
    > "$L/bench_$i.md" 2> "$L/bench_$i.log"
  echo "[$i] bench rc=$? $(( $(date +%s) - T0 ))s: $line"
  grep -E "^\|" "$L/bench_$i.md" | cut -c1-400
done <<< "${BENCHES:-}"
tar czf "$OUT/results.tgz" -C "$L" .
echo "done $(( $(date +%s) - T0 ))s"
