"""Device and generation detection, and the provenance recorded with every result."""

from __future__ import annotations

import functools
import glob
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

#: Generation labels, in the order the matrix shows them.
GENERATIONS: tuple[str, ...] = ("interp", "cpu", "sm80", "sm89", "sm90", "sm100", "sm120")


#: the forms a device argument takes (whether it exists here is another question)
DEVICE_FORM = re.compile(r"auto|cpu|cuda(:\d+)?")
DEVICE_FORMS = "auto, cpu, cuda or cuda:N"

#: files a GPU driver leaves (NVIDIA's, ROCm's, WSL's, Jetson's): with none of them, torch sees no CUDA device
_GPU_FILES = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/kfd", "/dev/dxg", "/dev/nvmap", "/dev/nvhost-ctrl-gpu")
_GPU_GLOBS = ("/dev/nvidia[0-9]*",)


def cuda_absent() -> str:
    """Why torch would plainly see no CUDA device here, known without importing it; "" when one may be there
    (any trace of a driver, nvidia-smi on the PATH, a system other than Linux): then torch decides."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return "CUDA_VISIBLE_DEVICES hides every GPU"
    if not sys.platform.startswith("linux"):
        return ""
    if any(os.path.exists(f) for f in _GPU_FILES) or any(glob.glob(g) for g in _GPU_GLOBS) \
            or shutil.which("nvidia-smi"):
        return ""
    return "no GPU driver on this machine"


def generation_of(capability: tuple[int, int] | None, *, interpret: bool = False) -> str:
    """Label for a CUDA capability; `interp` for the Triton interpreter, `cpu` for plain CPU torch."""
    if capability is None:
        return "interp" if interpret else "cpu"
    major, minor = capability
    if major == 8:
        return "sm89" if minor >= 9 else "sm80"
    if major in (9, 10, 12):
        return {9: "sm90", 10: "sm100", 12: "sm120"}[major]
    return f"sm{major}{minor}"


#: the device of the hosts that list and plan the adapters: a CPU host, whatever the run's device (it imports the
#: adapter modules with the interpreter chosen, as probe children do, and runs no kernel)
LISTING_DEVICE = "cpu"
#: device files a GPU that torch.cuda can use opens (NVIDIA's driver; ROCm; CUDA under WSL2): with none of them,
#: torch.cuda.is_available() is False and asking torch (an import of seconds) can be skipped
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")


def prepare_interpreter(device: str, ask_torch: bool = True) -> None:
    """Choose Triton's interpreter (TRITON_INTERPRET=1) before any kernel module imports triton, when no GPU will be
    used: `device` is cpu, or no CUDA device is available. An explicit TRITON_INTERPRET is left as it is. torch is
    imported only when a GPU may be there to ask about; `ask_torch=False` leaves that case undecided (for the
    processes that import torch anyway, such as an xdist controller's workers)."""
    if os.environ.get("TRITON_INTERPRET") is not None:
        return
    if device == "cpu" or not any(os.path.exists(f) for f in GPU_DEVICE_FILES):
        os.environ["TRITON_INTERPRET"] = "1"
        return
    if not ask_torch:
        return
    import torch  # here, not at import: commands that never judge (replay's parent, bisect, render) skip it

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def git_state(repo: str = str(REPO_ROOT)) -> tuple[str, bool]:
    """(commit, dirty) of `repo`; ("unknown", False) outside a git checkout.

    MOE_HARNESS_COMMIT overrides it (commit[+dirty]): for machines that receive a copy of the tree whose .git is
    absent or stale, the sender states what it sent."""
    override = os.environ.get("MOE_HARNESS_COMMIT", "").strip()
    if override:
        commit, _, flag = override.partition("+")
        return commit, flag == "dirty"
    return _git_state(repo)


@functools.cache
def _git_state(repo: str) -> tuple[str, bool]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=repo, capture_output=True, text=True, timeout=10, check=True,
            ).stdout.strip()
        )
        return commit, dirty
    except (OSError, subprocess.SubprocessError):
        return "unknown", False


def triton_version() -> str | None:
    try:
        import triton

        return str(triton.__version__)
    except ImportError:
        return None


@dataclass(frozen=True)
class DeviceInfo:
    """Where results were produced: the generation label plus everything needed to reproduce them."""

    generation: str
    device: str  # torch device string: "cpu" or "cuda:0"
    device_name: str
    capability: tuple[int, int] | None
    torch_version: str
    triton_version: str | None
    python_version: str
    commit: str
    dirty: bool

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["capability"] = list(self.capability) if self.capability else None
        return d


def detect(device: str = "auto") -> DeviceInfo:
    """Describe `device` ("auto", "cpu", "cuda" or "cuda:N"). "auto" picks CUDA when present."""
    import torch

    if not DEVICE_FORM.fullmatch(device):
        raise ValueError(f"device must be {DEVICE_FORMS}, got {device!r}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but torch sees no CUDA device")
        dev = torch.device(device)
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        cap = torch.cuda.get_device_capability(index)
        name = torch.cuda.get_device_name(index)
        device, generation = f"cuda:{index}", generation_of(cap)
    else:
        cap, name = None, platform.processor() or platform.machine() or "cpu"
        generation = generation_of(None, interpret=interpreter_enabled())
    commit, dirty = git_state()
    return DeviceInfo(
        generation=generation, device=device, device_name=name, capability=cap,
        torch_version=torch.__version__, triton_version=triton_version(),
        python_version=platform.python_version(), commit=commit, dirty=dirty,
    )


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


#: the most workers a sweep (matrix, differential) takes when --jobs is not given; the pytest plugin sets it in each
#: xdist worker, so that a sweep one of its tests starts takes that worker's share of the machine, not all of it
JOBS_ENV = "MOE_HARNESS_JOBS"


def sweep_jobs(wanted: int) -> int:
    """`wanted` sweep workers, at most MOE_HARNESS_JOBS where it is set (ValueError naming it if it is no count)."""
    text = os.environ.get(JOBS_ENV, "").strip()
    if not text:
        return max(1, wanted)
    cap = int(text) if text.isdigit() else 0
    if cap < 1:
        raise ValueError(f"{JOBS_ENV} must be a number of workers >= 1, got {text!r}")
    return max(1, min(wanted, cap))


def threads_for(processes: int) -> int:
    """Torch threads for each of `processes` busy processes: their share of the usable CPUs, never more than an
    OMP_NUM_THREADS the user or a parent process set (a pytest-xdist worker's share of the machine)."""
    share = max(1, usable_cpus() // max(1, processes))
    try:
        return max(1, min(share, int(os.environ.get("OMP_NUM_THREADS") or share)))
    except ValueError:
        return share


#: GPU memory a judging process or kernel host keeps cached between cases; past it the cache is returned to the device
CACHED_MEMORY_KEPT_MB = 1024


def release_cached_memory(device: str) -> None:
    """Return torch's cached GPU memory past CACHED_MEMORY_KEPT_MB to the device: a large case's blocks stay
    cached in the process that ran it, and many processes sharing one GPU (pytest workers, their kernel hosts)
    otherwise run it out of memory between them."""
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        return
    dev = torch.device(device)
    if torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev) > CACHED_MEMORY_KEPT_MB * 2**20:
        with torch.cuda.device(dev):  # empty_cache empties the current device's cache only
            torch.cuda.empty_cache()
