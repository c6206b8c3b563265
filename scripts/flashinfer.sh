#!/usr/bin/env bash
# FlashInfer's CUTLASS fused MoE (flashinfer.fused_moe.cutlass_fused_moe, what vLLM's FlashInferExperts calls) on
# sm90, from the pinned wheel, in a git-ignored folder (default third_party/flashinfer/). Nothing of it is committed.
#   scripts/flashinfer.sh --gather   (a machine with the package index) download the pinned wheels, keep of
#       flashinfer/data only the headers the sm90 fused-MoE sources reach (#include closure) and the whole
#       csrc/nv_internal, cccl and spdlog, into one archive, flashinfer-bundle.tar.xz (carry it)
#   scripts/flashinfer.sh --build [--only CELLS] [--fast] [--time-limit S] [--dry-run]   unpack the archive (once
#       per archive) into DIR/pkg, import flashinfer from it (PYTHONPATH), write the JIT spec of the sm90 fused-MoE
#       module (fused_moe_90) and compile it with ninja -j MAX_JOBS (default 16) and the local nvcc (CUDA_HOME);
#       prints the build time and the translation units compiled. Stops after S seconds (default 540): ninja keeps
#       what it finished, run --build again (same options) to go on. When the module is linked it is checked for
#       launchers it uses but lacks (nm) and installed where FlashInfer looks for prebuilt modules
#       (flashinfer/data/aot/), so no call rebuilds it. --dry-run: enumerate the sources and write build.ninja
#       only (no nvcc work; runs without a GPU). --fast: FlashInfer's FAST_BUILD (only the 128x128 tile, 1x1x1
#       cluster of the TMA warp-specialized grouped GEMMs; the other tactics throw), passed to nvcc and g++ through
#       FLASHINFER_EXTRA_CUDAFLAGS / FLASHINFER_EXTRA_CFLAGS. --only CELLS (comma-separated: bf16, fp8-block): only
#       what those cells need, by FlashInfer's ENABLE_* type switches (scripts/flashinfer_only.py says the rule),
#       built in DIR/ws-only-CELLS
#   scripts/flashinfer.sh --check    one tiny bf16 cutlass_fused_moe call against a torch reference (sm90 GPU)
#   --dir DIR   the folder (default third_party/flashinfer; MOE_FLASHINFER_DIR)
# The JIT cache (generated sources, objects, fused_moe_90.so) is DIR/ws (FLASHINFER_WORKSPACE_BASE), DIR/ws-only-CELLS
# with --only.
set -euo pipefail
cd "$(dirname "$0")/.."

# flashinfer-python 0.7.2.post1 and the wheels `import flashinfer` and its JIT need (cp312, x86_64)
FI_VERSION=0.7.2.post1
WHEELS_CP312="apache-tvm-ffi==0.1.15.post2"
WHEELS_LINUX="ninja==1.13.2"
WHEELS_PURE="packaging==26.4 requests==2.34.2 urllib3==2.8.0 idna==3.20 charset-normalizer==3.5.3
certifi==2026.10.19.post1 nvidia-ml-py==13.615.71 tqdm==4.70.1 einops==0.8.2 tabulate==0.10.0 click==8.5.1"

DIR=${MOE_FLASHINFER_DIR:-third_party/flashinfer}
STAGE= FAST=0 DRY=0 LIMIT=540 ONLY= GIVEN_ONLY=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --gather|--build|--check) STAGE=${1#--}; shift ;;
    --dir|--time-limit|--only) [[ $# -ge 2 ]] || { echo "flashinfer.sh: $1 needs a value" >&2; exit 2; }
      case $1 in --dir) DIR=$2 ;; --time-limit) LIMIT=$2 ;; --only) ONLY=$2 GIVEN_ONLY=1 ;; esac; shift 2 ;;
    --fast) FAST=1; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) sed -n 2,22p "$0"; exit 0 ;;
    *) echo "flashinfer.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -n $STAGE ]] || { echo "flashinfer.sh: give --gather, --build or --check" >&2; exit 2; }
PY=${PYTHON:-python}
if [[ $GIVEN_ONLY == 1 ]]; then
  [[ $STAGE == build ]] || { echo "flashinfer.sh: --only goes with --build" >&2; exit 2; }
  ONLY=$("$PY" scripts/flashinfer_only.py "$ONLY") || exit 2  # the canonical list, or why it is not one
fi
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
ARCHIVE=$DIR/flashinfer-bundle.tar.xz
SITE=$DIR/pkg/site

gather() {
  local work=$DIR/gather.tmp pip="${PIP:-$PY -m pip}" w
  rm -rf "$work"; mkdir -p "$work/wheels" "$work/site"
  $pip download -q --no-deps -d "$work/wheels" "flashinfer-python==$FI_VERSION"
  $pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
    -d "$work/wheels" $WHEELS_CP312
  $pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
    -d "$work/wheels" $WHEELS_LINUX
  # shellcheck disable=SC2086
  $pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform any -d "$work/wheels" $WHEELS_PURE
  for w in "$work"/wheels/*.whl; do "$PY" -m zipfile -e "$w" "$work/site"; done
  mkdir -p "$work/site/bin"
  mv "$work"/site/ninja-*.data/scripts/ninja "$work/site/bin/ninja"; chmod +x "$work/site/bin/ninja"
  rm -rf "$work"/site/*.data "$work/site/b12x"
  # flashinfer/data: what the sm90 fused-MoE sources (and the DeepGEMM JIT in csrc/nv_internal) include
  WORK=$work "$PY" - <<'EOF'
import os, re, shutil
site = os.path.join(os.environ["WORK"], "site")
data, keep = os.path.join(site, "flashinfer", "data"), os.path.join(os.environ["WORK"], "data.keep")
csrc = f"{data}/csrc"
whole = ["csrc/nv_internal", "cccl/cub", "cccl/libcudacxx/include", "cccl/thrust", "spdlog/include"]
# the include path of flashinfer/jit/fused_moe.py gen_cutlass_fused_moe_module + jit/cpp_ext.py build_common_cflags
idirs = [f"{csrc}/nv_internal", f"{csrc}/nv_internal/include", f"{csrc}/nv_internal/tensorrt_llm/cutlass_extensions/include",
         f"{csrc}/nv_internal/tensorrt_llm/kernels/cutlass_kernels/include",
         f"{csrc}/nv_internal/tensorrt_llm/kernels/cutlass_kernels", f"{csrc}/nv_internal/tensorrt_llm",
         f"{data}/cccl/cub", f"{data}/cccl/libcudacxx/include", f"{data}/cccl/thrust", f"{site}/tvm_ffi/include",
         f"{data}/include", csrc, f"{data}/cutlass/include", f"{data}/cutlass/tools/util/include", f"{data}/spdlog/include"]
roots = [os.path.join(r, f) for d in ("csrc/nv_internal", "csrc/fused_moe/cutlass_backend")
         for r, _, fs in os.walk(f"{data}/{d}") for f in fs]
inc = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
seen, todo = set(), roots
while todo:  # every #include, conditions ignored: a superset of what nvcc opens
    f = todo.pop()
    if f in seen:
        continue
    seen.add(f)
    for kind, name in inc.findall(open(f, errors="replace").read()):
        for d in ([os.path.dirname(f)] if kind == '"' else []) + idirs:
            p = os.path.normpath(os.path.join(d, name))
            if os.path.isfile(p):
                todo.append(p)
                break
rel = {os.path.relpath(f, data) for f in seen if f.startswith(data + os.sep)}
for d in whole:
    rel |= {os.path.relpath(os.path.join(r, f), data) for r, _, fs in os.walk(f"{data}/{d}") for f in fs}
for r in sorted(rel):
    os.makedirs(os.path.dirname(os.path.join(keep, r)), exist_ok=True)
    shutil.copy2(os.path.join(data, r), os.path.join(keep, r))
shutil.rmtree(data)
os.rename(keep, data)
print(f"flashinfer: kept {len(rel)} files of flashinfer/data")
EOF
  cat > "$work/site/SOURCE" <<EOF
flashinfer-python==$FI_VERSION $WHEELS_CP312 (cp312 manylinux_2_28_x86_64) $WHEELS_LINUX
$(echo $WHEELS_PURE)
EOF
  tar -C "$work" -cJf "$ARCHIVE" site
  rm -rf "$work"
  echo "flashinfer: $(du -h "$ARCHIVE" | cut -f1) $ARCHIVE (flashinfer-python $FI_VERSION)"
}

unpack() {  # once per archive: a fresh unpack changes the sources' times and ninja would compile everything again
  [[ -f $ARCHIVE ]] || { echo "flashinfer.sh: no $ARCHIVE: run --gather where there is network, carry it" >&2; exit 1; }
  local sum
  sum=$(sha256sum "$ARCHIVE" | cut -d' ' -f1)
  if [[ ! -f $DIR/pkg/.archive-sha256 || $(cat "$DIR/pkg/.archive-sha256") != "$sum" ]]; then
    rm -rf "$DIR/pkg"; mkdir -p "$DIR/pkg"
    tar -C "$DIR/pkg" -xJf "$ARCHIVE"
    echo "$sum" > "$DIR/pkg/.archive-sha256"
  fi
}

setenv() {
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
  export PATH=$SITE/bin:$PATH
  export FLASHINFER_WORKSPACE_BASE=$DIR/ws${ONLY:+-only-${ONLY//,/+}} FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a}
  export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} MAX_JOBS=${MAX_JOBS:-16}
  [[ ! -f $DIR/build.env ]] || . "$DIR/build.env"
}

math_lib_flags() {  # headers / libraries the toolkit may lack (cuBLAS, cuRAND, NVRTC headers, unversioned
  # libnvrtc.so): those of the nvidia-* wheels torch depends on
  "$PY" - "$DIR/lib" <<'EOF'
import glob, os, sys
import torch
lib = sys.argv[1]
home = os.environ["CUDA_HOME"]
nv = os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia")
inc, ld = [], []
for header in ("cublasLt.h", "curand_kernel.h", "nvrtc.h"):  # included by nv_internal, not in every toolkit
    if not os.path.exists(f"{home}/include/{header}"):
        hits = sorted(glob.glob(f"{nv}/**/include/{header}", recursive=True))
        inc += [f"-isystem {os.path.dirname(h)}" for h in hits[:1]]
inc = list(dict.fromkeys(inc))
for name in ("nvrtc", "cudart"):
    if os.path.exists(f"{home}/lib64/lib{name}.so"):
        continue
    hits = sorted(glob.glob(f"{home}/lib64/lib{name}.so.*") + glob.glob(f"{nv}/**/lib/lib{name}.so.*", recursive=True))
    if hits:
        os.makedirs(lib, exist_ok=True)
        dst = os.path.join(lib, f"lib{name}.so")
        if os.path.lexists(dst):
            os.remove(dst)
        os.symlink(hits[0], dst)
        ld += [f"-L{lib}", f"-Wl,-rpath,{os.path.dirname(hits[0])}"]
print(" ".join(inc)); print(" ".join(dict.fromkeys(ld)))
EOF
}

build() {
  local start=$SECONDS flags inc ld
  unpack
  rm -f "$DIR/build.env"
  setenv
  flags=$(math_lib_flags); inc=$(sed -n 1p <<<"$flags"); ld=$(sed -n 2p <<<"$flags")
  local fast=""; [[ $FAST == 0 ]] || fast=-DFAST_BUILD
  cat > "$DIR/build.env" <<EOF
export FLASHINFER_EXTRA_CUDAFLAGS="${inc:+$inc }$fast" FLASHINFER_EXTRA_CFLAGS="${inc:+$inc }$fast"
export FLASHINFER_EXTRA_LDFLAGS="$ld"
EOF
  . "$DIR/build.env"
  FI_DRY=$DRY FI_LIMIT=$LIMIT FI_ONLY=$ONLY FI_FAST=$FAST FI_SCRIPTS=$PWD/scripts "$PY" - <<'EOF'
import os, re, shutil, subprocess, sys, time

t0 = time.time()
sys.path.insert(0, os.environ["FI_SCRIPTS"])
import flashinfer
import flashinfer_only
from flashinfer.jit import env as jit_env
from flashinfer.jit.fused_moe import gen_cutlass_fused_moe_sm90_module

only = os.environ["FI_ONLY"]
if only:
    on = flashinfer_only.install(only.split(","))
    print(f"flashinfer: --only {only}: type switches {', '.join(sorted(on))} (not "
          f"{', '.join(s for s in flashinfer_only.SWITCHES if s not in on)})")
spec = gen_cutlass_fused_moe_sm90_module()  # also writes the generated CUTLASS instantiations
cu = [s for s in spec.sources if s.suffix == ".cu"]
gen = [s for s in cu if s.name.endswith(".generated.cu")]
insts = sum(len(re.findall(r"INSTANTIATE_TMA_WARP_SPECIALIZED_MOE_GEMM\(|^\s*template void", p.read_text(), re.M))
            for p in gen)
print(f"flashinfer {flashinfer.__version__} from {os.path.dirname(flashinfer.__file__)}: module {spec.name}, "
      f"{len(spec.sources)} translation units ({len(cu)} .cu of which {len(gen)} generated, holding {insts} "
      f"CUTLASS instantiations; {len(spec.sources) - len(cu)} .cpp); cache {jit_env.FLASHINFER_JIT_DIR}")
print("extra nvcc flags:", os.environ.get("FLASHINFER_EXTRA_CUDAFLAGS") or "-")
spec.write_ninja()
print(f"flashinfer: wrote {spec.ninja_path} in {time.time() - t0:.1f} s")
if os.environ["FI_DRY"] == "1":
    sys.exit(0)
ninja = ["ninja", "-C", str(spec.build_dir), "-f", str(spec.ninja_path), "-j", os.environ["MAX_JOBS"]]
def steps_left():  # ninja -n: the steps still to run (compilations and the link)
    out = subprocess.run(ninja + ["-n"], capture_output=True, text=True).stdout
    return sum(1 for line in out.splitlines() if line.startswith("["))
print(f"flashinfer: {steps_left()} build steps to run")
log = spec.build_dir / ".ninja_log"
seen = log.stat().st_size if log.exists() else 0
t1 = time.time()
r = subprocess.run(["timeout", os.environ["FI_LIMIT"]] + ninja, capture_output=True, text=True)
with open(log, errors="replace") if log.exists() else open(os.devnull) as f:  # start, end (ms), mtime, output
    f.seek(seen)
    took = sorted(((int(e) - int(b)) / 1000, os.path.basename(o)) for b, e, _, o, *_ in
                  (ln.split("\t") for ln in f if ln.count("\t") >= 3 and not ln.startswith("#")))
if took:
    print("flashinfer: slowest units this call:", ", ".join(f"{n} {t:.0f} s" for t, n in took[::-1][:5]))
done = [p for p in spec.build_dir.glob("*.o") if p.stat().st_mtime >= t1]
left_n = steps_left()
so = spec.jit_library_path
print(f"flashinfer: compiled {len(done)} translation units in {time.time() - t1:.0f} s with -j {os.environ['MAX_JOBS']}; "
      f"{'built ' + str(so) if so.exists() and r.returncode == 0 else str(left_n) + ' steps left'}")
if r.returncode == 124:
    print("flashinfer: stopped at the time limit; run --build again (same options) to go on")
    sys.exit(3)
if r.returncode != 0:  # the failed units and their messages first: ninja's command lines would bury them
    out = r.stdout.splitlines()
    failed = [i for i, line in enumerate(out) if line.startswith("FAILED:")]
    for i in failed:
        print("\n".join(line[:400] for line in out[i:i + 30] if not line.startswith("[")))
    if not failed:
        print(r.stdout[-4000:])
    print("ninja stderr:", r.stderr[-4000:] or "-")
    sys.exit(r.returncode)
missing = flashinfer_only.undefined_launchers(so)  # a narrowing that dropped what the dispatcher calls shows here
if missing is None:
    print("flashinfer: no nm here: the module's undefined launchers were not checked")
elif missing:
    print(f"flashinfer: {so.name} uses {len(missing)} launchers or runners it does not define, e.g.",
          *missing[:8], sep="\n  ")
    sys.exit(4)
aot = jit_env.FLASHINFER_AOT_DIR / spec.name / f"{spec.name}.so"  # FlashInfer loads it without building
aot.parent.mkdir(parents=True, exist_ok=True)
tmp = aot.with_suffix(".so.tmp")
tmp.unlink(missing_ok=True)
try:
    os.link(so, tmp)
except OSError:
    shutil.copy2(so, tmp)
os.replace(tmp, aot)
what = (f"only {only}" if only else "every type") + (", FAST_BUILD" if os.environ["FI_FAST"] == "1" else "")
(aot.parent / "BUILT").write_text(what + "\n")
print(f"flashinfer: installed {aot} ({what}; {so.stat().st_size / 2**20:.0f} MiB"
      f"{'' if missing is None else '; no launcher missing'})")
EOF
  echo "flashinfer: --build took $((SECONDS - start)) s"
}

check() {
  unpack
  setenv
  "$PY" - <<'EOF'
import torch
import torch.nn.functional as F

import flashinfer
from flashinfer.fused_moe import cutlass_fused_moe
from flashinfer.fused_moe.core import ActivationType
from flashinfer.jit import env as jit_env

assert torch.cuda.is_available(), "no GPU"
torch.manual_seed(0)
dev, dt = "cuda", torch.bfloat16
t, h, i, e, k = 16, 256, 256, 8, 2
x = torch.randn(t, h, device=dev, dtype=dt)
w13 = (torch.randn(e, 2 * i, h, device=dev) / h**0.5).to(dt)   # vLLM's layout: [gate; up] along dim 1
w2 = (torch.randn(e, h, i, device=dev) / i**0.5).to(dt)
logits = torch.randn(t, e, device=dev)
topk_w, topk_ids = torch.topk(logits.softmax(-1), k, dim=-1)
topk_w = topk_w / topk_w.sum(-1, keepdim=True)
# FlashInferExperts (vLLM) hands the kernel w31 = [up; gate] (swap_w13_to_w31) and no quant_scales for bf16
w31 = w13.reshape(e, 2, i, h).flip(1).reshape(e, 2 * i, h).contiguous()
out = torch.empty(t, h, device=dev, dtype=dt)
cutlass_fused_moe(input=x, token_selected_experts=topk_ids.to(torch.int32), token_final_scales=topk_w.float(),
                  fc1_expert_weights=w31, fc2_expert_weights=w2, output_dtype=dt, quant_scales=[], output=out,
                  activation_type=ActivationType.Swiglu)
ref = torch.zeros(t, h, device=dev, dtype=torch.float32)
for tok in range(t):
    for j in range(k):
        ex = int(topk_ids[tok, j])
        gu = w13[ex].float() @ x[tok].float()
        act = F.silu(gu[:i]) * gu[i:]
        ref[tok] += topk_w[tok, j] * (w2[ex].float() @ act.to(dt).float())
err = (out.float() - ref).abs().max().item() / ref.abs().max().item()
built = sorted(jit_env.FLASHINFER_AOT_DIR.glob("fused_moe_90*/BUILT"))  # what --build installed
print(f"flashinfer {flashinfer.__version__} cutlass_fused_moe bf16 on {torch.cuda.get_device_name()} (module: "
      f"{built[0].read_text().strip() if built else 'JIT-built on this call'}): max abs error / max |ref| = {err:.2e}")
assert err < 2e-2, "mismatch"
EOF
}

"$STAGE"
