"""vLLM's CUDA build as a library of kernels under test: its two stable-libtorch-ABI extension libraries, loaded with
`torch.ops.load_library` from the wheel's files (shared by the adapters of vLLM's CUDA ops).

vLLM 0.32.0's CUDA wheel pins torch 2.13, but these two extensions use only torch's stable C ABI (`aoti_torch_*`,
`torch_*`), so they load under another torch that exports those symbols (2.11 on the lent H200 does):
  vllm/_moe_C_stable_libtorch.abi3.so  namespace `_moe_C`: topk_softmax, topk_sigmoid, grouped_topk,
                                       moe_align_block_size, moe_sum, moe_wna16_marlin_gemm, moe_permute, ...
  vllm/_C_stable_libtorch.abi3.so      namespace `_C`: gptq_marlin_repack, cutlass_moe_mm, get_cutlass_moe_mm_data,
                                       silu_and_mul, per_token_group_fp8_quant, scaled fp8 quantizers, ...
Nothing of them is kept here: `bash scripts/vllm_cuda.sh` takes them out of the pinned wheel into the git-ignored
`third_party/vllm/` (keeping the device code of one GPU generation, so both fit one carry to a GPU machine) and
unpacks them there. The provenance label carries the wheel's version and a content hash of the files loaded.

Adapters reach the ops through `ops(namespace)` only, so a CPU test can put a stand-in of an op's contract in its
place (`monkeypatch.setattr(_vllm_cuda, "ops", ...)`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.registry import FilesLibrary, import_library

VERSION = "0.32.0"
#: namespace -> the extension library (relative to the vllm package directory) that registers it
EXTENSIONS = {"_moe_C": "_moe_C_stable_libtorch.abi3.so", "_C": "_C_stable_libtorch.abi3.so"}


@dataclass(frozen=True)
class ExtensionLibrary(FilesLibrary):
    """A FilesLibrary whose files are compiled extensions: present when the files are there and a CUDA device is,
    loaded (registered with torch's dispatcher) once per process."""

    def missing(self) -> str | None:
        why = super().missing()
        if why is not None:
            return why
        import torch

        if not torch.cuda.is_available():
            return f"{self.distribution}'s CUDA extensions need a CUDA device (none is visible here)"
        return None

    def load(self) -> None:
        why = self.missing()
        if why is not None:
            raise ImportError(why)
        import torch

        found = self.found()
        assert found is not None
        for name in self.needs:
            torch.ops.load_library(str(found.package / name))


LIBRARY = ExtensionLibrary(
    distribution="vllm", module="vllm", written_for=VERSION,
    install=f"bash scripts/vllm_cuda.sh (takes vLLM's two CUDA extension libraries out of `pip download "
            f"vllm=={VERSION} --no-deps` into third_party/vllm/; on a GPU machine: bash scripts/vllm_cuda.sh "
            f"--unpack)",
    needs=tuple(EXTENSIONS.values()))


def ops(namespace: str) -> Any:
    """`torch.ops.<namespace>` (`_moe_C` or `_C`) once vLLM's extensions are loaded; RuntimeError with the reason
    when they cannot be."""
    if namespace not in EXTENSIONS:
        raise ValueError(f"namespace: {namespace!r} is not one of vLLM's extensions ({', '.join(EXTENSIONS)})")
    broken = import_library(LIBRARY)
    if broken:
        raise RuntimeError(broken)
    import torch

    return getattr(torch.ops, namespace)
