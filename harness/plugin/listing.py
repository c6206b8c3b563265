"""The adapters' listing of an xdist session, made by the controller while its workers start.

The controller lists the adapters in a kernel host (seconds: a fork server imports torch, the host imports every
adapter module). Its workers need the listing only when they collect; handed to them as they started, it had kept
them from starting until it was done (8 of the 23 s before a cold GPU suite's first test on an H200). The controller
now lists in a thread from its configuration on and tells each worker the file the listing will be written to; a
worker that collects before it is there waits for it. A listing that fails (an adapter spec that names nothing, a
host that cannot start) ends the session in the controller, with the same one-line usage error as before.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

#: the workerinput keys of the file the controller writes the listing to, and of the token its record carries
FILE_INPUT = "moe_harness_catalog_file"
TOKEN_INPUT = "moe_harness_catalog_token"
#: how long a worker waits for it (the controller's own listing gives up on a host well before)
WAIT_S = 900.0


class Listing:
    """One listing made in a thread of this process. `result()` waits for it: the catalog, or the usage error that
    listing raised. The file (`path`) holds it for the workers: {"catalog": ...} or {"usage_error": message}, with
    `token`. The listing host imports every adapter module (code the judge does not trust) while the file is still
    to be written: its folder is read-only to kernel hosts (`sandbox.protect`, before the listing host starts), and
    a worker takes only a record that carries the token, which it is handed by xdist and no kernel host sees."""

    def __init__(self, make: Callable[[], Any], as_json: Callable[[Any], dict[str, Any]]) -> None:
        from harness.engine import sandbox

        self.folder = tempfile.mkdtemp(prefix="moe-harness-listing-")
        self.path = os.path.join(self.folder, "catalog.json")
        self.token = secrets.token_hex(16)
        sandbox.protect(self.folder)
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(make, as_json), name="moe-harness-listing",
                                        daemon=True)
        self._thread.start()

    def _run(self, make: Callable[[], Any], as_json: Callable[[Any], dict[str, Any]]) -> None:
        try:
            self._value = make()
            record: dict[str, Any] = {"catalog": as_json(self._value)}
        except BaseException as e:  # said by result() in the controller, and by the file to the workers
            self._error = e
            record = {"usage_error": str(e)}
        record["token"] = self.token
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with contextlib.suppress(OSError):
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(record, f)
            os.replace(tmp, self.path)

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def read(path: str, token: str, wait_s: float = WAIT_S) -> dict[str, Any]:
    """In a worker: the listing the controller writes to `path`, once it is there (its catalog's fields). A record
    without the controller's `token` is refused: something else wrote it."""
    deadline = time.monotonic() + wait_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise pytest.UsageError(f"the xdist controller's listing of the adapters did not come in {wait_s:g} s")
        time.sleep(0.02)
    with open(path, encoding="utf-8") as f:
        record = json.load(f)
    if not isinstance(record, dict) or not hmac.compare_digest(str(record.get("token", "")), token):
        raise pytest.UsageError(f"the listing of the adapters in {path} was not written by this session's xdist "
                                "controller (a kernel of the session may have written it): nothing is judged")
    if "usage_error" in record:
        raise pytest.UsageError(record["usage_error"])
    return record["catalog"]
