#!/usr/bin/env bash
# vLLM's CUDA extensions for the adapters of its CUDA ops (kernels/adapters/external/_vllm_cuda.py), taken from the
# pinned wheel into the git-ignored third_party/vllm/; nothing of them is committed.
#   scripts/vllm_cuda.sh [--arch 90] [--wheels DIR] [--out DIR]   pack: keep one GPU generation's device code
#                        (scripts/fatbin_keep.py) and compress, small enough to carry to a GPU machine with the rest
#                        of third_party/ (about 35 MB for sm90)
#   scripts/vllm_cuda.sh --unpack [--out DIR]                      on the GPU machine: decompress next to them
# The two libraries use only torch's stable C ABI, so they load under the GPU machine's own torch.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=wheels; OUT=third_party; ARCH=90; UNPACK=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --arch) ARCH=$2; shift 2 ;;
    --wheels) WHEELS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --unpack) UNPACK=1; shift ;;
    -h|--help) sed -n 2,8p "$0"; exit 0 ;;
    *) echo "vllm_cuda.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
LIBS=(_moe_C_stable_libtorch.abi3.so _C_stable_libtorch.abi3.so)

if [[ $UNPACK == 1 ]]; then
  for lib in "${LIBS[@]}"; do
    packed="$OUT/vllm/$lib.xz"
    [[ -f $packed ]] || { echo "vllm_cuda.sh: $packed is missing (run scripts/vllm_cuda.sh first)" >&2; exit 1; }
    [[ -f $OUT/vllm/$lib && $OUT/vllm/$lib -nt $packed ]] || xz -dc -T0 "$packed" > "$OUT/vllm/$lib"
  done
  ls -l "$OUT"/vllm/*.so | sed 's/^/vllm_cuda: /'
  exit 0
fi

VERSION=0.32.0
w=$(ls "$WHEELS"/vllm-$VERSION-*.whl 2>/dev/null | head -1 || true)
if [[ -z $w ]]; then
  mkdir -p "$WHEELS"
  python -m pip download -q --no-deps "vllm==$VERSION" -d "$WHEELS" >&2
  w=$(ls "$WHEELS"/vllm-$VERSION-*.whl | head -1)
fi
[[ -d $OUT/vllm ]] || bash scripts/third_party.sh --wheels "$WHEELS" --out "$OUT" >/dev/null
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
unzip -q -o "$w" "${LIBS[@]/#/vllm/}" -d "$tmp"
for lib in "${LIBS[@]}"; do
  python scripts/fatbin_keep.py "$tmp/vllm/$lib" "$tmp/$lib" --arch "$ARCH" | grep -c zeroed \
    | sed "s/^/vllm_cuda: $lib: entries of other architectures zeroed: /"
  xz -9 -T0 -c "$tmp/$lib" > "$OUT/vllm/$lib.xz"
  rm -f "$OUT/vllm/$lib"
done
du -sh "$OUT"/vllm/*.xz | sed 's/^/vllm_cuda: /'
