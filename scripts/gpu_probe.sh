#!/usr/bin/env bash
# Tile probes on the GPU (issue 20): runs each line of $PROBES (arguments of scripts/probe_experts.py, one probe a
# line; "TESTS <pytest -k expression>" runs that subset of the experts kernel tests instead), each under its own
# time limit (PROBE_S, default 240 s), logs and JSON lines under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s)
. scripts/_device_info.sh; device_info "$OUT/device.txt"
i=0
while IFS= read -r line; do
  [[ -z "${line// }" ]] && continue
  i=$((i + 1))
  if [[ "$line" == TESTS* ]]; then
    HYPOTHESIS_PROFILE=gpu timeout ${PROBE_S:-240} python -m pytest -n 4 -q -p no:cacheprovider \
      tests/kernels/test_experts_kernels.py -k "${line#TESTS }" -rfE > "$OUT/tests_$i.log" 2>&1
    echo "[$i] tests rc=$? $(( $(date +%s) - T0 ))s: $(tail -1 "$OUT/tests_$i.log")"
    grep -E "^(FAILED|ERROR)" "$OUT/tests_$i.log" | cut -c1-300 | head
    continue
  fi
  # shellcheck disable=SC2086
  timeout ${PROBE_S:-240} python scripts/probe_experts.py --out "$OUT/probe_$i.jsonl" $line > "$OUT/probe_$i.log" 2>&1
  echo "[$i] probe rc=$? $(( $(date +%s) - T0 ))s: $line"
  python - "$OUT/probe_$i.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    if "us" in d:
        g1, g2 = d.get("gemm1"), d.get("gemm2")
        t = lambda g: "x".join(str(g[k]) for k in ("block_m", "block_n", "block_k", "num_warps", "num_stages")) + ("j" if g.get("joint_gate_up") else "") if isinstance(g, dict) else g
        print(f"  {d['shape']} M={d['M']} {d['which']:<8} fast={d.get('fast')} {d['us']:>9} us {d['pct_floor']:>5}% {t(g1)} {t(g2)} {d.get('config', '')}")
    elif "verify" in d and d["verify"] != "pass" or "error" in d:
        print("  !!", json.dumps(d)[:300])
PY
done <<< "${PROBES:-}"
echo "done $(( $(date +%s) - T0 ))s"
