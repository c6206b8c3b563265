#!/usr/bin/env bash
# Two shards of the quick matrix merged must render what one unsharded sweep renders (on this device).
# Usage: OUT=dir bash scripts/shard_check.sh [matrix args, e.g. --adapter NAME]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/shard-check}
R=$(mktemp -d)
mkdir -p "$OUT"
for run in one "1/2" "2/2"; do
  dir=$R/${run//\//of}
  shard=(); [[ $run == one ]] || shard=(--shard "$run")
  /usr/bin/time -f "$run: %e s" python3 -m harness matrix "${shard[@]}" --results-dir "$dir" --out '' --case-timeout 60 "$@" \
    > "$OUT/shard_${run//\//of}.log" 2>&1
  echo "$run rc=$?"; tail -2 "$OUT/shard_${run//\//of}.log"
done
python3 -m harness matrix --from "$R/one" --out "$R/render-one/M.md"
python3 -m harness matrix --from "$R/1of2" "$R/2of2" --out "$R/render-merged/M.md"
python3 - "$R" <<'PY'
import json, sys
models = []
for name in ("one", "merged"):
    m = json.load(open(f"{sys.argv[1]}/render-{name}/M.json"))
    m.pop("command"); m.pop("sources")
    models.append(m)
print("shards merged == unsharded:", models[0] == models[1], "| verdicts", models[0]["verdicts"], models[1]["verdicts"])
PY
tar czf "$OUT/shard-results.tgz" -C "$R" one 1of2 2of2
