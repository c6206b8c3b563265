"""A kernel host sees only the GPU it judges on.

On a machine of several GPUs every process that starts CUDA sees all of them unless told otherwise, and a sweep
starts a kernel host per worker, spread over the GPUs. A host started for `cuda:N` is given
`CUDA_VISIBLE_DEVICES=<the N-th visible GPU>` and judges on its own `cuda:0`: its CUDA start touches one device, and
a kernel cannot reach a GPU that other hosts judge on. Outputs it describes to its judge name the judge's device
(`judge_name`), so the judge's device checks are unchanged. `MOE_HARNESS_HOST_GPUS=all` leaves every GPU visible.
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping

__all__ = ["ALL_ENV", "confine", "judge_name"]

#: set to "all" to leave a host every GPU its judge sees
ALL_ENV = "MOE_HARNESS_HOST_GPUS"
_VISIBLE = "CUDA_VISIBLE_DEVICES"


def confine(env: MutableMapping[str, str], device: str) -> str:
    """Restrict a host's environment `env` to the GPU that `device` ("cuda:N", numbered as the judge sees them)
    names; returns the device the host uses for it. Left as it is (and `device` returned): a CPU device, a device
    without an index, `MOE_HARNESS_HOST_GPUS=all`, or an index past the judge's visible list (CUDA's own error
    then names it, as it would have)."""
    found = re.fullmatch(r"cuda:(\d+)", device)
    if found is None or env.get(ALL_ENV, "").strip().lower() == "all":
        return device
    index = int(found.group(1))
    listed = env.get(_VISIBLE)
    if listed is None:
        physical = str(index)
    else:
        # CUDA reads the list up to its first empty entry; a host may not see more than its judge does
        entries = [e.strip() for e in listed.split(",")]
        if "" in entries:
            entries = entries[:entries.index("")]
        if index >= len(entries):
            return device
        physical = entries[index]
    env[_VISIBLE] = physical
    return "cuda:0"


def judge_name(device: str, local: str, judged: str) -> str:
    """`device` (a tensor's, inside the host) as the judge names it: the host's `local` device is the judge's
    `judged` one; any other name is kept."""
    return judged if device == local else device
