"""Which GPU a pytest-xdist worker takes: round robin over the visible GPUs (or a chosen subset), unless pinned."""

from __future__ import annotations

import re


def worker_number(worker_id: str | None) -> int | None:
    """0 for xdist's "gw0", 3 for "gw3"; None outside xdist (or for the controller, "master")."""
    m = re.fullmatch(r"gw(\d+)", worker_id or "")
    return int(m.group(1)) if m else None


def parse_gpus(text: str | None) -> list[int] | None:
    """`--moe-gpus 0,2,3` -> [0, 2, 3]; None or "" -> None (every visible GPU)."""
    if not text:
        return None
    try:
        found = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--moe-gpus must be comma-separated GPU indices, got {text!r}") from None
    if not found or any(i < 0 for i in found):
        raise ValueError(f"--moe-gpus must list GPU indices >= 0, got {text!r}")
    return found


def device_for_worker(requested: str, worker_id: str | None, gpu_count: int, gpus: list[int] | None = None) -> str:
    """The device a worker verifies on.

    requested: the `--moe-device` value. `cpu` and a pinned `cuda:N` are kept as they are; `auto` and `cuda` become
    `cuda:<i>` with i taken round robin by worker number over `gpus` (default: all `gpu_count` visible ones), so
    worker gwK of an `-n` run lands on GPU K mod len(gpus). Without a GPU, `auto` stays `auto` (the CPU path).
    """
    if requested == "cpu" or re.fullmatch(r"cuda:\d+", requested):
        return requested
    if requested not in ("auto", "cuda"):
        raise ValueError(f"--moe-device must be auto, cpu, cuda or cuda:N, got {requested!r}")
    if gpu_count <= 0:
        return requested
    pool = gpus if gpus is not None else list(range(gpu_count))
    missing = [i for i in pool if i >= gpu_count]
    if missing:
        raise ValueError(f"--moe-gpus names GPU(s) {missing}, but only {gpu_count} are visible")
    n = worker_number(worker_id)
    return f"cuda:{pool[(n or 0) % len(pool)]}"
