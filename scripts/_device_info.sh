# Sourced by the GPU scripts: device_info FILE writes the device, versions and commit of record to FILE and prints
# it (the device copy's .git is stale, so the commit comes from MOE_HARNESS_COMMIT).
device_info() {
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
    echo "commit: ${MOE_HARNESS_COMMIT:-unknown}"; } > "$1" 2>&1
  cat "$1"
}
