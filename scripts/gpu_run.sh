#!/usr/bin/env bash
# One GPU run, for the lent device machine or any CUDA box: the sections asked for, each under its own time limit,
# and everything the run produced in one folder per kind, named by its run id (results/README.md describes the
# layout). `--help` lists the options; `--dry-run` prints what would run, and where, without running it.
set -uo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'EOF'
Usage: scripts/gpu_run.sh [options]

Sections (they run in this order; default: pytest matrix bench):
  --sections LIST        comma- or space-separated, of:
    pytest     python -m pytest (--tests, default: the suite) with the hypothesis --profile; the harness plugin's
               verdicts go to <run>/pytest/
    matrix     python -m harness matrix --profile <--matrix-profile> [--adapter ...]; verdicts to
               <run>/matrix-<profile>/, its own matrix rendered to <run>/logs/matrix-<profile>.md
    external   the third-party libraries carried as wheels (--wheels) into a private folder, and those read from
               their files (--third-party, scripts/third_party.sh): their quick matrix (<run>/matrix-external/),
               their tests and their adapters' generic tests (<run>/pytest-external/)
    bench      python -m harness bench: --op OP for each --bench-op, then each --bench line as given; tables
               (.md) and logs in <bench>
    probe      scripts/probe_experts.py once per --probe line: JSON lines, logs and summary.log in <bench>

Where it goes (<run> = <results>/<generation>/<run id>, <bench> = <results>/<generation>/bench/<run id>):
  --out DIR              the console logs and the archive (default: $OUT, else ./gpu-out)
  --results DIR          the results root (default: <out>/results; `results` writes into this checkout's)
  --generation GEN       the generation folder (default: the device's, e.g. sm90)
  --run-id ID            the run's folder name (default: <UTC date>-<commit>-<label>)
  --label WORDS          the run id's last part (default: the sections joined by '-')
  --commit SHA[+dirty]   the commit of record, for a copy whose .git is stale (exported as MOE_HARNESS_COMMIT)
  --no-archive           keep the files (default: pack the run's folders into <out>/results.tgz and, when the
                         results root is <out>/results, keep only the archive: a device machine returns few files)

What runs:
  --tests PATH           a pytest path or node id (repeatable; default: the suite's testpaths)
  --pytest-args ARGS     more pytest arguments, e.g. "-k triton --durations=15"
  --profile NAME         the hypothesis profile of the pytest and external sections (default: gpu)
  --workers N            pytest workers, -n (default: 8)
  --adapter NAME         only this adapter (repeatable; module:object ok): matrix --adapter, pytest --moe-adapter
  --matrix-profile P     quick (default) or full
  --matrix-args ARGS     more matrix arguments, e.g. "--shard 1/2" or "--resume RUN_ID" (with the same --run-id)
  --bench-op OP          time this op (repeatable; default: every stage op and experts, unless --bench is given)
  --bench ARGS           one `python -m harness bench` call (repeatable), e.g. "--op experts --shape deepseek-v3
                         --quant fp8_w8a8:G128 --m 1024"
  --against-vllm PATH    vLLM's fused_moe folder: its kernel is timed beside ours in every experts bench
  --probe ARGS           one scripts/probe_experts.py call (repeatable), e.g. "--shape mixtral-tp2 --quant
                         fp8_w8a8:A --m 4096 --tiles 64,128,128,4,3"
  --wheels DIR           the external section's wheels (default: .whl; none there: nothing is installed)
  --third-party DIR      the folder of unpacked library files (default: third_party/, exported as MOE_THIRD_PARTY)
  --replay CASE          replay this case file on cuda and on cpu after the tests (repeatable)
  --pythonpath DIR       put DIR on PYTHONPATH (repeatable), e.g. examples/fused_moe_style for its adapters

Time limits, in seconds:
  --pytest-timeout S (300)  --matrix-timeout S (300)  --external-timeout S (330)
  --bench-timeout S (200)   --probe-timeout S (240)   --case-timeout S (60: one matrix case)

  --dry-run              print the commands and where their output would go; run nothing (no GPU needed)
  -h, --help             this text

The exit status is the first failing step's (124: it ran past its time limit), 0 when every step passed.
EOF
}

die() { echo "gpu_run.sh: $*" >&2; echo "try: scripts/gpu_run.sh --help" >&2; exit 2; }

SECTIONS="pytest matrix bench"; OUT_DIR=${OUT:-$PWD/gpu-out}; RESULTS=""; GENERATION=""; RUN_ID=""; LABEL=""
ARCHIVE=1; DRY=""; PROFILE=gpu; WORKERS=8; PYTEST_ARGS=""; MATRIX_PROFILE=quick; MATRIX_ARGS=""
AGAINST_VLLM=""; WHEELS=.whl
TESTS=(); ADAPTERS=(); BENCH_OPS=(); BENCHES=(); PROBES=(); REPLAYS=(); PATHS=()
PYTEST_TIMEOUT=300; MATRIX_TIMEOUT=300; EXTERNAL_TIMEOUT=330; BENCH_TIMEOUT=200; PROBE_TIMEOUT=240; CASE_TIMEOUT=60
VALUED="--sections --out --results --generation --run-id --label --commit --tests --pytest-args --profile --workers
  --adapter --matrix-profile --matrix-args --bench-op --bench --against-vllm --probe --wheels --third-party --replay
  --pythonpath
  --pytest-timeout --matrix-timeout --external-timeout --bench-timeout --probe-timeout --case-timeout"
VALUED=$(echo $VALUED)  # one line, single spaces

while [[ $# -gt 0 ]]; do
  opt=$1
  case $opt in
    -h|--help) usage; exit 0 ;;
    --dry-run) DRY=1; shift; continue ;;
    --no-archive) ARCHIVE=""; shift; continue ;;
  esac
  [[ " $VALUED " == *" $opt "* ]] || die "unknown option $opt"
  [[ $# -ge 2 ]] || die "$opt needs a value"
  val=$2; shift 2
  case $opt in
    --sections) SECTIONS=${val//,/ } ;;
    --out) OUT_DIR=$val ;;
    --results) RESULTS=$val ;;
    --generation) GENERATION=$val ;;
    --run-id) RUN_ID=$val ;;
    --label) LABEL=$val ;;
    --commit) export MOE_HARNESS_COMMIT=$val ;;
    --tests) TESTS+=("$val") ;;
    --pytest-args) PYTEST_ARGS=$val ;;
    --profile) PROFILE=$val ;;
    --workers) WORKERS=$val ;;
    --adapter) ADAPTERS+=("$val") ;;
    --matrix-profile) MATRIX_PROFILE=$val ;;
    --matrix-args) MATRIX_ARGS=$val ;;
    --bench-op) BENCH_OPS+=("$val") ;;
    --bench) BENCHES+=("$val") ;;
    --against-vllm) AGAINST_VLLM=$val ;;
    --probe) PROBES+=("$val") ;;
    --wheels) WHEELS=$val ;;
    --third-party) export MOE_THIRD_PARTY=$val ;;
    --replay) REPLAYS+=("$val") ;;
    --pythonpath) PATHS+=("$val") ;;
    --pytest-timeout) PYTEST_TIMEOUT=$val ;;
    --matrix-timeout) MATRIX_TIMEOUT=$val ;;
    --external-timeout) EXTERNAL_TIMEOUT=$val ;;
    --bench-timeout) BENCH_TIMEOUT=$val ;;
    --probe-timeout) PROBE_TIMEOUT=$val ;;
    --case-timeout) CASE_TIMEOUT=$val ;;
  esac
done

for s in $SECTIONS; do
  [[ " pytest matrix external bench probe " == *" $s "* ]] || die "unknown section '$s'"
done
for n in "$WORKERS" "$PYTEST_TIMEOUT" "$MATRIX_TIMEOUT" "$EXTERNAL_TIMEOUT" "$BENCH_TIMEOUT" "$PROBE_TIMEOUT" \
         "$CASE_TIMEOUT"; do
  [[ $n =~ ^[0-9]+$ ]] || die "'$n' is not a whole number"
done
[[ $MATRIX_PROFILE == quick || $MATRIX_PROFILE == full ]] || die "--matrix-profile is quick or full"
wants() { [[ " $SECTIONS " == *" $1 "* ]]; }
[[ ${#BENCH_OPS[@]} -gt 0 || ${#BENCHES[@]} -gt 0 ]] || BENCH_OPS=(routing group_quant activation act_quant align reduce experts)

RESULTS=${RESULTS:-$OUT_DIR/results}
SITE=${TMPDIR:-/tmp}/moe-harness-site  # the external section's wheels, outside the checkout
PP=$PWD; for p in "${PATHS[@]}"; do PP=$PP:$p; done
if wants external; then PP=$PP:$SITE; fi
export PYTHONUNBUFFERED=1 PYTHONPATH=$PP${PYTHONPATH:+:$PYTHONPATH}

if [[ -z $GENERATION ]]; then
  if [[ -n $DRY ]]; then GENERATION="<generation>"
  else GENERATION=$(python -c "from harness.core.device import detect; print(detect().generation)") \
    || die "could not detect the generation (pass --generation)"
  fi
fi
commit=${MOE_HARNESS_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
commit=${commit%%+*}
[[ -n $LABEL ]] || LABEL=$(echo $SECTIONS | tr ' ' '-')
RUN_ID=${RUN_ID:-$(date -u +%Y-%m-%d)-${commit:0:7}-$LABEL}
RUN=$RESULTS/$GENERATION/$RUN_ID
BENCH_DIR=$RESULTS/$GENERATION/bench/$RUN_ID
STATUS=0
T0=$(date +%s)

# step NAME LOG LIMIT CMD...: CMD under its time limit, stdout and stderr to LOG (LOG=OUT:ERR splits them)
step() {
  local name=$1 log=$2 limit=$3; shift 3
  local out=${log%%:*} err=${log#*:}
  if [[ -n $DRY ]]; then
    echo "[$name] timeout $limit $(printf '%q ' "$@")> $out$([[ $err != "$out" ]] && echo " 2> $err")"
    return 0
  fi
  mkdir -p "$(dirname "$out")"
  if [[ $err == "$out" ]]; then timeout "$limit" "$@" > "$out" 2>&1; else timeout "$limit" "$@" > "$out" 2> "$err"; fi
  local rc=$?
  echo "[$name] rc=$rc after $(( $(date +%s) - T0 ))s"
  local logs=("$out"); [[ $err == "$out" ]] || logs+=("$err")
  grep -hE "^(FAILED|ERROR)" "${logs[@]}" | cut -c1-300 | head -20
  tail -3 "$err" | cut -c1-300
  [[ $STATUS -ne 0 ]] || STATUS=$rc
}

adapter_args() {  # adapter_args FLAG: FLAG NAME for each --adapter
  local a; for a in "${ADAPTERS[@]}"; do printf '%s\0%s\0' "$1" "$a"; done
}
mapfile -d '' MATRIX_ADAPTERS < <(adapter_args --adapter)
mapfile -d '' PYTEST_ADAPTERS < <(adapter_args --moe-adapter)
# words STRING: its shell words (quotes respected, nothing expanded), NUL-separated
words() { printf '%s' "$1" | xargs -r printf '%s\0'; }
mapfile -d '' PYTEST_EXTRA < <(words "$PYTEST_ARGS")
mapfile -d '' MATRIX_EXTRA < <(words "$MATRIX_ARGS")
vllm=(); [[ -z $AGAINST_VLLM ]] || vllm=(--against-vllm "$AGAINST_VLLM")

echo "run $RUN_ID: sections $SECTIONS; verdicts in $RUN; timings in $BENCH_DIR"
if [[ -n $DRY ]]; then echo "[env] PYTHONPATH=$PYTHONPATH${MOE_HARNESS_COMMIT:+ MOE_HARNESS_COMMIT=$MOE_HARNESS_COMMIT}"; fi
if [[ -z $DRY ]]; then mkdir -p "$RUN/logs"; fi

if wants external && { [[ -n $DRY ]] || compgen -G "$WHEELS/*.whl" > /dev/null; }; then
  step install "$RUN/logs/install.log" 600 python -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl
fi
if [[ -n $DRY ]]; then
  echo "[device] nvidia-smi, torch, Triton and library versions, commit > $RUN/device.txt"
else
  . scripts/_device_info.sh
  device_info "$RUN/device.txt"
fi

if wants pytest; then
  step pytest "$RUN/logs/pytest.log" "$PYTEST_TIMEOUT" env HYPOTHESIS_PROFILE="$PROFILE" python -m pytest \
    -n "$WORKERS" -q -p no:cacheprovider -rfE --moe-results-dir="$RUN/pytest" "${PYTEST_ADAPTERS[@]}" \
    "${PYTEST_EXTRA[@]}" "${TESTS[@]}"
fi

for i in "${!REPLAYS[@]}"; do
  for d in cuda cpu; do
    step "replay $((i + 1)) on $d" "$RUN/logs/replay_$((i + 1))_$d.log" 120 python -m harness replay \
      "${REPLAYS[$i]}" --device "$d"
  done
done

if wants matrix; then
  step matrix "$RUN/logs/matrix-$MATRIX_PROFILE.log" "$MATRIX_TIMEOUT" python -m harness matrix \
    --profile "$MATRIX_PROFILE" --results-dir "$RUN/matrix-$MATRIX_PROFILE" --case-timeout "$CASE_TIMEOUT" \
    --only-this-run --out "$RUN/logs/matrix-$MATRIX_PROFILE.md" "${MATRIX_ADAPTERS[@]}" "${MATRIX_EXTRA[@]}"
fi

if wants external; then
  # the matrix first: its verdicts are the rows; the tests after it
  step "external matrix" "$RUN/logs/matrix-external.log" "$EXTERNAL_TIMEOUT" python -m harness matrix \
    --profile quick --adapter external --results-dir "$RUN/matrix-external" --case-timeout "$CASE_TIMEOUT" \
    --only-this-run --out "$RUN/logs/matrix-external.md"
  step "external tests" "$RUN/logs/external-tests.log" "$EXTERNAL_TIMEOUT" env HYPOTHESIS_PROFILE="$PROFILE" \
    python -m pytest -n "$WORKERS" -q -p no:cacheprovider -rfE --moe-results-dir="$RUN/pytest-external" \
    tests/external tests/harness/test_libraries.py harness/plugin/generic.py --moe-adapter external
fi

if wants bench; then
  for op in "${BENCH_OPS[@]}"; do
    extra=(); [[ $op != experts ]] || extra=("${vllm[@]}")
    step "bench $op" "$BENCH_DIR/bench_$op.md:$BENCH_DIR/bench_$op.log" "$BENCH_TIMEOUT" \
      python -m harness bench --op "$op" "${extra[@]}"
  done
  for i in "${!BENCHES[@]}"; do
    mapfile -d '' args < <(words "${BENCHES[$i]}")
    extra=(); [[ " ${BENCHES[$i]} " != *" experts "* ]] || extra=("${vllm[@]}")
    step "bench $((i + 1))" "$BENCH_DIR/bench_$((i + 1)).md:$BENCH_DIR/bench_$((i + 1)).log" "$BENCH_TIMEOUT" \
      python -m harness bench "${args[@]}" "${extra[@]}"
  done
fi

if wants probe; then
  for i in "${!PROBES[@]}"; do
    mapfile -d '' args < <(words "${PROBES[$i]}")
    step "probe $((i + 1))" "$BENCH_DIR/probe_$((i + 1)).log" "$PROBE_TIMEOUT" python scripts/probe_experts.py \
      --out "$BENCH_DIR/probe_$((i + 1)).jsonl" "${args[@]}"
  done
  if [[ -z $DRY && ${#PROBES[@]} -gt 0 ]]; then
    # one line per timed point: the tiles each probe tried, side by side
    jsonl=(); for i in "${!PROBES[@]}"; do jsonl+=("$BENCH_DIR/probe_$((i + 1)).jsonl"); done
    python - "${jsonl[@]}" <<'PY' | tee "$BENCH_DIR/summary.log"
import json, sys

def tile(g):
    keys = ("block_m", "block_n", "block_k", "num_warps", "num_stages")
    return "x".join(str(g[k]) for k in keys) + ("j" if g.get("joint_gate_up") else "") if isinstance(g, dict) else g

for path in sys.argv[1:]:
    print("==", path.rsplit("/", 1)[-1])
    try:
        lines = open(path).read().splitlines()
    except OSError as e:  # the probe died before writing
        print("  !!", e)
        continue
    for line in lines:
        d = json.loads(line)
        if "us" in d:
            print(f"  {d['shape']} M={d['M']} {d['which']:<8} fast={d.get('fast')} {d['us']:>9} us "
                  f"{d['pct_floor']:>5}% {tile(d.get('gemm1'))} {tile(d.get('gemm2'))} {d.get('config', '')}")
        elif "error" in d or d.get("verify", "pass") != "pass":
            print("  !!", json.dumps(d)[:300])
PY
  fi
fi

if [[ -z $DRY && -d $BENCH_DIR ]]; then cp "$RUN/device.txt" "$BENCH_DIR/device.txt"; fi

if [[ -n $ARCHIVE ]]; then
  parts=("$GENERATION/$RUN_ID"); [[ -n $DRY || ! -d $BENCH_DIR ]] || parts+=("$GENERATION/bench/$RUN_ID")
  if [[ -n $DRY ]]; then
    echo "[archive] tar czf $OUT_DIR/results.tgz -C $RESULTS ${parts[*]}  (unpack with: tar xzf results.tgz -C results)"
  else
    mkdir -p "$OUT_DIR"
    tar czf "$OUT_DIR/results.tgz" -C "$RESULTS" "${parts[@]}"
    # the device tool returns a few files per call: keep only the archive when the run was written under --out
    [[ $(realpath -m "$RESULTS") != $(realpath -m "$OUT_DIR/results") ]] || rm -rf "${OUT_DIR:?}/results"
    echo "archive: $OUT_DIR/results.tgz (unpack with: tar xzf results.tgz -C results)"
  fi
fi
echo "done after $(( $(date +%s) - T0 ))s, exit $STATUS"
exit $STATUS
