#!/usr/bin/env bash
# Session 8's GPU verification, step 1: the quick matrix of every adapter and of the fused_moe_style example's two
# adapters, then the tests of what changed (kernels, example, new checks) with the gpu profile.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/examples/fused_moe_style
R=/tmp/res; rm -rf "$R"; mkdir -p "$R"
T0=$(date +%s)
. scripts/_device_info.sh; device_info "$OUT/device.txt" > /dev/null
if [[ " ${STEPS:-matrix tests} " == *" matrix "* ]]; then
  timeout 300 python -m harness matrix --profile quick --results-dir "$R/matrix" --case-timeout 60 \
    --out "$OUT/matrix_all.md" > "$OUT/matrix.log" 2>&1; echo "matrix rc=$? $(( $(date +%s) - T0 ))s"
  timeout 120 python -m harness matrix --profile quick --adapter fused_moe_style.harness_adapters:STYLE_FUSED_MOE \
    --adapter fused_moe_style.harness_adapters:STYLE_GROUP_QUANT_DIV --results-dir "$R/matrix" --case-timeout 60 \
    --only-this-run --out "$OUT/matrix_style.md" > "$OUT/matrix_style.log" 2>&1; echo "style matrix rc=$? $(( $(date +%s) - T0 ))s"
fi
if [[ " ${STEPS:-matrix tests} " == *" tests "* ]]; then
  HYPOTHESIS_PROFILE=gpu timeout 240 python -m pytest -n 12 -q -p no:cacheprovider --moe-results-dir "$R/pytest" \
    tests/kernels/test_experts_kernels.py tests/test_examples_fused_moe_style.py tests/harness/test_sequential_sum.py \
    tests/harness/test_vacuous.py tests/harness/test_robustness.py tests/harness/test_approximate_division.py \
    tests/reference/test_library_conventions.py -rfE > "$OUT/tests.log" 2>&1
  echo "tests rc=$? $(( $(date +%s) - T0 ))s"; grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | cut -c1-250 | head; tail -2 "$OUT/tests.log"
fi
if [[ " ${STEPS:-} " == *" recheck "* ]]; then
  HYPOTHESIS_PROFILE=gpu timeout 120 python -m pytest -n 8 -q -p no:cacheprovider --moe-results-dir "$R/pytest" \
    tests/harness/test_vacuous.py tests/harness/test_draw_coverage.py -rfE > "$OUT/recheck.log" 2>&1
  echo "recheck rc=$?"; tail -2 "$OUT/recheck.log"
fi
if [[ " ${STEPS:-} " == *" generic "* ]]; then
  HYPOTHESIS_PROFILE=gpu timeout 300 python -m pytest -n 14 -q -p no:cacheprovider --moe-results-dir "$R/generic" \
    harness/plugin/generic.py -rfE --durations=15 ${GENERIC_ARGS:-} > "$OUT/generic.log" 2>&1
  echo "generic rc=$? $(( $(date +%s) - T0 ))s"; grep -E "^(FAILED|ERROR)" "$OUT/generic.log" | cut -c1-250 | head; tail -2 "$OUT/generic.log"
  if [[ -z "${GENERIC_ARGS:-}" ]]; then
    (cd examples/fused_moe_style && HYPOTHESIS_PROFILE=gpu timeout 200 python -m pytest -n 4 -q -p no:cacheprovider \
      -p harness.plugin --moe-results-dir="$R/style-own" > "$OUT/style_own.log" 2>&1; echo "style own rc=$?"
      tail -2 "$OUT/style_own.log")
  fi
fi
tail -5 "$OUT/matrix.log" 2>/dev/null | cut -c1-200
cp -r "$R" "$OUT/results"
tar czf /tmp/s.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/s.tgz "$OUT/session.tgz"
echo "done $(( $(date +%s) - T0 ))s"
