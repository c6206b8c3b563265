#!/usr/bin/env bash
# DeepGEMM from source, built against the local torch (its prebuilt extensions load only under the torch they were
# built with), in a git-ignored folder (default third_party/deepgemm/) that the external adapters load it from
# (kernels/adapters/external/deepgemm_experts.py). Nothing of it is committed.
#   scripts/deepgemm.sh --gather [--deepgemm-git URL|DIR] [--cutlass-include DIR] [--fmt-git URL|DIR]
#       (a machine with network, or local clones) DeepGEMM's source at the pinned commit with its two submodules'
#       headers (CUTLASS include/, fmt include/) into one archive, deepgemm-src.tar.xz (about 4 MB: carry it).
#       --cutlass-include takes CUTLASS's headers from a folder holding cutlass/ and cute/ (the pinned CUTLASS
#       release, checked), e.g. the include/ of the DeepGEMM that vLLM's CUDA wheel vendors, instead of a clone.
#   scripts/deepgemm.sh --build     unpack the archive, compile the extension (deep_gemm._C) with the local torch,
#       g++ and nvcc (MAX_JOBS, default 16), lay out the importable package in pkg/; prints the build time
#   scripts/deepgemm.sh --check     import it and run one tiny grouped GEMM (needs an sm90 GPU)
#   scripts/deepgemm.sh --compiler  print the host compiler --build takes: CXX (else c++) unless it links libstdc++
#       statically (a second C++ runtime beside torch's crashes std::regex), then the first of c++, g++ that does not
#   --dir DIR   the folder (default third_party/deepgemm; the adapters read MOE_DEEPGEMM_DIR)
#   DG_EXTRA_CXXFLAGS / DG_EXTRA_LDFLAGS (environment): more compiler / linker flags for the extension (build variants)
# The kernels themselves are JIT-compiled by DeepGEMM at first use (nvcc from CUDA_HOME) into the user's cache,
# ${XDG_CACHE_HOME:-~/.cache}/moe-harness/deepgemm-jit, unless DG_JIT_CACHE_DIR says otherwise: never into the
# checkout, which is read-only to sandboxed kernel hosts.
set -euo pipefail
cd "$(dirname "$0")/.."

# DeepGEMM main of 2026-06-23 (version 2.6.1) and its submodule pins: CUTLASS 4.2.1, fmt 11.2.0+57
DG_COMMIT=54e22612409371d6364144b69086735beb54e98b
DG_VERSION=2.6.1
CUTLASS_COMMIT=f3fde58372d33e9a5650ba7b80fc48b3b49d40c8
CUTLASS_RELEASE=4.2.1
FMT_COMMIT=553ec11ec06fbe0beebfbb45f9dc3c9eabd83d28

DIR=${MOE_DEEPGEMM_DIR:-third_party/deepgemm}
DG_GIT=https://github.com/deepseek-ai/DeepGEMM.git
FMT_GIT=https://github.com/fmtlib/fmt.git
CUTLASS_GIT=https://github.com/NVIDIA/cutlass.git
CUTLASS_INCLUDE=
STAGE=
while [[ $# -gt 0 ]]; do
  case $1 in
    --gather|--build|--check|--compiler) STAGE=${1#--}; shift ;;
    --dir) DIR=$2; shift 2 ;;
    --deepgemm-git) DG_GIT=$2; shift 2 ;;
    --fmt-git) FMT_GIT=$2; shift 2 ;;
    --cutlass-include) CUTLASS_INCLUDE=$2; shift 2 ;;
    -h|--help) sed -n 2,19p "$0"; exit 0 ;;
    *) echo "deepgemm.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -n $STAGE ]] || { echo "deepgemm.sh: give --gather, --build, --check or --compiler" >&2; exit 2; }
PY=${PYTHON:-python}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
ARCHIVE=$DIR/deepgemm-src.tar.xz

checkout() {  # checkout URL|DIR COMMIT DEST: that commit's tree, without history
  local repo=$1 tmp=
  if [[ ! -d $repo ]]; then
    tmp=$(mktemp -d)
    git -C "$tmp" init -q && git -C "$tmp" fetch -q --depth 1 "$1" "$2"
    repo=$tmp
  fi
  mkdir -p "$3"
  git -C "$repo" archive "$2" | tar -x -C "$3"
  [[ -z $tmp ]] || rm -rf "$tmp"
}

gather() {
  local work=$DIR/gather.tmp
  rm -rf "$work"; mkdir -p "$work"
  checkout "$DG_GIT" "$DG_COMMIT" "$work/DeepGEMM"
  local inc=$work/DeepGEMM/third-party/cutlass/include
  rm -rf "$work/DeepGEMM/third-party/cutlass" "$work/DeepGEMM/third-party/fmt"
  mkdir -p "$inc" "$work/DeepGEMM/third-party/fmt"
  if [[ -n $CUTLASS_INCLUDE ]]; then
    cp -r "$CUTLASS_INCLUDE/cutlass" "$CUTLASS_INCLUDE/cute" "$inc/"
  else
    checkout "$CUTLASS_GIT" "$CUTLASS_COMMIT" "$work/cutlass"
    cp -r "$work/cutlass/include/cutlass" "$work/cutlass/include/cute" "$inc/"
  fi
  local got
  got=$(awk '/define CUTLASS_(MAJOR|MINOR|PATCH) /{printf "%s%s", sep, $3; sep="."}' "$inc/cutlass/version.h")
  [[ $got == "$CUTLASS_RELEASE" ]] || { echo "deepgemm.sh: CUTLASS $got, DeepGEMM pins $CUTLASS_RELEASE" >&2; exit 1; }
  checkout "$FMT_GIT" "$FMT_COMMIT" "$work/fmt"
  cp -r "$work/fmt/include" "$work/DeepGEMM/third-party/fmt/"
  cat > "$work/DeepGEMM/SOURCE" <<EOF
deepgemm $DG_GIT $DG_COMMIT $DG_VERSION
cutlass ${CUTLASS_INCLUDE:-$CUTLASS_GIT} $CUTLASS_COMMIT $CUTLASS_RELEASE
fmt $FMT_GIT $FMT_COMMIT
EOF
  tar -C "$work" -cJf "$ARCHIVE" \
    DeepGEMM/SOURCE DeepGEMM/csrc DeepGEMM/deep_gemm DeepGEMM/LICENSE \
    DeepGEMM/third-party/cutlass/include DeepGEMM/third-party/fmt/include
  rm -rf "$work"
  echo "deepgemm: $(du -h "$ARCHIVE" | cut -f1) $ARCHIVE (DeepGEMM $DG_VERSION $DG_COMMIT)"
}

links_shared_libstdcxx() {  # CXX: do its shared objects take the C++ runtime from libstdc++.so?
  local t rc=1
  t=$(mktemp -d)
  printf '#include <string>\nstd::string f(int i) { return std::to_string(i); }\n' > "$t/a.cpp"
  if "$1" -shared -fPIC -o "$t/a.so" "$t/a.cpp" 2>/dev/null && readelf -d "$t/a.so" | grep -q 'NEEDED.*libstdc++'; then
    rc=0
  fi
  rm -rf "$t"
  return $rc
}

pick_cxx() {
  # A compiler that links the C++ runtime statically (some toolchain wrappers add -static-libstdc++) gives the
  # extension a second copy of it beside the libstdc++.so torch loads; their locale state clashes and std::regex
  # (DeepGEMM's JIT include scan) segfaults on first use. Take the first compiler whose shared objects link it.
  local cxx
  for cxx in ${CXX:-} c++ g++ /usr/bin/c++ /usr/bin/g++; do
    command -v "$cxx" >/dev/null || continue
    if links_shared_libstdcxx "$cxx"; then
      [[ $cxx == "${CXX:-c++}" ]] || echo "deepgemm.sh: ${CXX:-c++} links libstdc++ statically (a crash beside torch's); using $cxx" >&2
      export CXX=$cxx
      return
    fi
  done
  echo "deepgemm.sh: no C++ compiler here links libstdc++ as a shared library (tried ${CXX:-} c++ g++); set CXX" >&2
  exit 1
}

compiler() {
  pick_cxx
  echo "$CXX"
}

build() {
  [[ -f $ARCHIVE ]] || { echo "deepgemm.sh: no $ARCHIVE: run --gather where there is network, carry it" >&2; exit 1; }
  local start=$SECONDS src=$DIR/src pkg=$DIR/pkg
  pick_cxx
  rm -rf "$src" "$pkg" "$DIR/build.tmp"; mkdir -p "$src" "$pkg"
  tar -C "$src" -xJf "$ARCHIVE"
  local root=$src/DeepGEMM
  # the Python package, with the headers its JIT compiles against (as DeepGEMM's setup.py lays them out)
  cp -r "$root/deep_gemm" "$pkg/"
  cp -r "$root/third-party/cutlass/include/cute" "$root/third-party/cutlass/include/cutlass" "$pkg/deep_gemm/include/"
  cat > "$pkg/deep_gemm/envs.py" <<'PY'
# Pre-installed environment variables: the JIT cache in the user's cache folder (the checkout is read-only to
# sandboxed kernel hosts)
import os

persistent_envs = dict()
persistent_envs['DG_JIT_CACHE_DIR'] = os.path.join(
    os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache'), 'moe-harness', 'deepgemm-jit')
PY
  # the extension: DeepGEMM's setup.py's one CUDAExtension (csrc/python_api.cpp, a host-compiler source)
  MAX_JOBS=${MAX_JOBS:-16} DG_ROOT=$root DG_PKG=$pkg DG_TMP=$DIR/build.tmp "$PY" - <<'EOF'
import glob
import os

import torch
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension, include_paths

root, pkg, tmp = os.environ["DG_ROOT"], os.environ["DG_PKG"], os.environ["DG_TMP"]
# torch's headers decide the language standard (newer releases refuse C++17)
aten = next(p for p in (os.path.join(d, "ATen", "ATen.h") for d in include_paths()) if os.path.exists(p))
std = "c++20" if "C++20 or later" in open(aten).read() else "c++17"
flags = [f"-std={std}", "-O3", "-fPIC", "-Wno-psabi", "-Wno-deprecated-declarations",
         f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}", *os.environ.get("DG_EXTRA_CXXFLAGS", "").split()]
# CUDA's headers and libraries: the toolkit's, then those of the nvidia-* wheels torch depends on (a toolkit
# without the math libraries' headers or the unversioned libnvrtc.so)
wheels = sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia", "*")))
cuda_inc = [f"{CUDA_HOME}/include", f"{CUDA_HOME}/include/cccl"] + [f"{w}/include" for w in wheels]
lib_dirs = [d for d in [f"{CUDA_HOME}/lib64", *(f"{w}/lib" for w in wheels)] if os.path.isdir(d)]
libs, link = ["cudart"], os.environ.get("DG_EXTRA_LDFLAGS", "").split()
for name in ("nvrtc",):
    found = [(d, f) for d in lib_dirs for f in sorted(os.listdir(d)) if f.startswith(f"lib{name}.so")]
    if any(f == f"lib{name}.so" for _, f in found):
        libs.append(name)
    elif found:
        d, f = found[0]
        link += [f"-L{d}", f"-l:{f}", f"-Wl,-rpath,{d}"]
    else:
        raise SystemExit(f"deepgemm.sh: no lib{name}.so in {lib_dirs}")
includes = [*(d for d in cuda_inc if os.path.isdir(d)),
            *(os.path.join(root, d) for d in ("deep_gemm/include", "third-party/cutlass/include", "third-party/fmt/include"))]
os.chdir(root)
print(f"deepgemm: compiling csrc/python_api.cpp (-std={std}, {os.environ['CXX']}) against torch {torch.__version__}, "
      f"CUDA {CUDA_HOME}")
setup(name="deep_gemm", script_args=["-q", "build_ext", "--build-lib", pkg, "--build-temp", tmp],
      ext_modules=[CUDAExtension(name="deep_gemm._C", sources=["csrc/python_api.cpp"], include_dirs=includes,
                                 libraries=libs, library_dirs=lib_dirs, extra_compile_args=flags,
                                 extra_link_args=link)],
      cmdclass={"build_ext": BuildExtension})
EOF
  rm -rf "$DIR/build.tmp"
  cp "$root/SOURCE" "$pkg/SOURCE"
  "$PY" -c "import torch; print(torch.__version__)" > "$pkg/BUILT_WITH_TORCH"
  ls "$pkg"/deep_gemm/_C*.so >/dev/null
  echo "deepgemm: built $(ls "$pkg"/deep_gemm/_C*.so) against torch $(cat "$pkg/BUILT_WITH_TORCH") in $((SECONDS - start)) s"
}

check() {
  PYTHONPATH=$DIR/pkg${PYTHONPATH:+:$PYTHONPATH} "$PY" - <<'EOF'
import torch

import deep_gemm

assert torch.cuda.is_available(), "no GPU"
dev = "cuda"
e, m, n, k = 2, 128, 256, 128  # m: a capacity of whole 128-row blocks (the masked kernel stores whole blocks)
a = torch.randn(e, m, k, device=dev).to(torch.float8_e4m3fn)
b = torch.randn(e, n, k, device=dev).to(torch.float8_e4m3fn)
sa = torch.ones(e, m, k // 128, device=dev)
sb = torch.ones(e, n // 128, k // 128, device=dev)
d = torch.empty(e, m, n, device=dev, dtype=torch.bfloat16)
masked = torch.tensor([5, 1], device=dev, dtype=torch.int32)
deep_gemm.m_grouped_fp8_gemm_nt_masked((a, sa), (b, sb), d, masked, m, disable_ue8m0_cast=True)
ref = torch.einsum("emk,enk->emn", a.float(), b.float())
for g, rows in enumerate(masked.tolist()):
    torch.testing.assert_close(d[g, :rows].float(), ref[g, :rows], rtol=2e-2, atol=1e-1)
print(f"deepgemm: {deep_gemm.__file__} masked grouped GEMM matches on {torch.cuda.get_device_name()}")
EOF
}

"$STAGE"
