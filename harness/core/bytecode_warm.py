"""Compile the packages a run imports into its bytecode folder, once (started by `harness.core.bytecode`).

    python -m harness.core.bytecode_warm FOLDER PACKAGE_DIR ...

Each package folder is compiled into FOLDER (as PYTHONPYCACHEPREFIX places it), on a few processes and at a low
priority, skipping test suites a run never imports. A mark named by the Python and the packages (their paths and
`__init__.py` sizes and times) says it was done; another one, while it runs, keeps a second run from starting the
same work. Files that fail to compile are left to the import that needs them (it says why).
"""

from __future__ import annotations

import compileall
import contextlib
import hashlib
import importlib.util
import os
import re
import sys
import time

#: the packages a run's processes import (those installed here): torch and Triton in every one of them
PACKAGES = ("torch", "triton", "numpy", "sympy", "hypothesis", "_pytest", "harness", "reference", "kernels")
#: folders no run imports from (large test suites of the packages)
SKIP = re.compile(r"[/\\](testing[/\\]_internal|tests?)[/\\]")
#: a mark younger than this, of a warming that is still running, keeps another from starting
RUNNING_S = 300


def packages() -> list[str]:
    """The folders of PACKAGES installed here, found without importing them."""
    found = []
    for name in PACKAGES:
        with contextlib.suppress(ImportError, ValueError):
            spec = importlib.util.find_spec(name)
            if spec is not None and spec.submodule_search_locations:
                found.append(os.path.realpath(next(iter(spec.submodule_search_locations))))
    return found


def _mark(where: str, folders: list[str]) -> str:
    h = hashlib.sha256(f"{sys.version}\0{os.path.realpath(sys.executable)}".encode())
    for folder in folders:
        init = os.path.join(folder, "__init__.py")
        st = os.stat(init) if os.path.exists(init) else None
        h.update(f"\0{folder}\0{st.st_size if st else -1}\0{st.st_mtime_ns if st else -1}".encode())
    return os.path.join(where, f".warm-{h.hexdigest()[:16]}")


def done(where: str, folders: list[str]) -> bool:
    """Whether these folders were compiled into `where` already, or a warming of them is running."""
    mark = _mark(where, folders)
    if os.path.exists(mark):
        return True
    with contextlib.suppress(OSError):
        return time.time() - os.stat(mark + ".running").st_mtime < RUNNING_S
    return False


def warm(where: str, folders: list[str], workers: int) -> int:
    """Compile `folders` into `where`; the number of folders that compiled whole."""
    mark = _mark(where, folders)
    os.makedirs(where, exist_ok=True)
    with contextlib.suppress(OSError):  # the mark of a warming that died (killed with the run that started it)
        if time.time() - os.stat(mark + ".running").st_mtime >= RUNNING_S:
            os.unlink(mark + ".running")
    try:
        os.close(os.open(mark + ".running", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return 0  # another process is at it
    whole = 0
    try:
        for folder in folders:
            whole += bool(compileall.compile_dir(folder, quiet=2, workers=workers, rx=SKIP))
        with open(mark, "w", encoding="utf-8") as f:
            f.write("\n".join(folders) + "\n")
    finally:
        with contextlib.suppress(OSError):
            os.unlink(mark + ".running")
    return whole


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m harness.core.bytecode_warm FOLDER PACKAGE_DIR ...", file=sys.stderr)
        return 2
    with contextlib.suppress(OSError, AttributeError):
        os.nice(10)  # behind the run's own work
    sys.pycache_prefix = argv[0]  # compileall writes where imports will look (and its worker processes inherit it)
    os.environ["PYTHONPYCACHEPREFIX"] = argv[0]
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    from harness.core.device import usable_cpus

    warm(argv[0], argv[1:], min(8, usable_cpus()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
