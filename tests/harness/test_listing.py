"""The xdist controller's listing made in a thread, and the file its workers read it from (harness.plugin.listing)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from harness.plugin import listing


def test_a_listing_is_read_by_the_workers_once_written() -> None:
    release = threading.Event()
    made = listing.Listing(lambda: release.wait(10) and {"names": ["a"]}, lambda value: {"catalog_of": value})
    try:
        found: list[dict] = []
        reader = threading.Thread(target=lambda: found.append(listing.read(made.path, made.token, wait_s=10)))
        reader.start()
        time.sleep(0.2)
        assert not found and not Path(made.path).exists()  # a worker waits for it
        release.set()
        reader.join(10)
        assert found == [{"catalog_of": {"names": ["a"]}}]
        assert made.result() == {"names": ["a"]}
    finally:
        made.remove()
    assert not Path(made.folder).exists()


def test_a_listing_that_fails_is_a_usage_error_in_the_controller_and_its_workers() -> None:
    def fail() -> None:
        raise pytest.UsageError("--moe-adapter: unknown adapter 'x'")

    made = listing.Listing(fail, lambda value: {})
    try:
        with pytest.raises(pytest.UsageError, match="unknown adapter 'x'"):
            made.result()
        assert json.loads(Path(made.path).read_text()) == {"usage_error": "--moe-adapter: unknown adapter 'x'",
                                                           "token": made.token}
        with pytest.raises(pytest.UsageError, match="unknown adapter 'x'"):
            listing.read(made.path, made.token)
    finally:
        made.remove()


def test_a_worker_does_not_wait_for_ever(tmp_path: Path) -> None:
    with pytest.raises(pytest.UsageError, match=r"did not come in 0\.2 s"):
        listing.read(str(tmp_path / "never.json"), "t", wait_s=0.2)


def test_a_record_without_the_controllers_token_is_refused(tmp_path: Path) -> None:
    made = listing.Listing(lambda: {"names": ["a"]}, lambda value: value)
    try:
        made.result()
        forged = tmp_path / "catalog.json"
        forged.write_text(json.dumps({"catalog": {"names": []}, "token": "guessed"}))
        with pytest.raises(pytest.UsageError, match="not written by this session's xdist controller"):
            listing.read(str(forged), made.token)
        forged.write_text(json.dumps({"catalog": {"names": []}}))
        with pytest.raises(pytest.UsageError, match="not written by this session's xdist controller"):
            listing.read(str(forged), made.token)
        assert listing.read(made.path, made.token) == {"names": ["a"]}
    finally:
        made.remove()


def test_the_listing_folder_is_read_only_to_kernel_hosts_started_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.engine import sandbox

    monkeypatch.delenv(sandbox.READONLY_ENV, raising=False)
    made = listing.Listing(lambda: {}, lambda value: value)
    try:
        assert os.path.realpath(made.folder) in os.environ[sandbox.READONLY_ENV].split(os.pathsep)
    finally:
        made.result()
        made.remove()
