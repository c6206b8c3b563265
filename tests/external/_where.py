"""Where a third-party adapter's tests judge it: its own generation when it runs here, else nowhere."""

from __future__ import annotations

import dataclasses

import pytest

from harness.core.device import DeviceInfo
from harness.registry import Adapter


def nominal(adapter: Adapter, device: DeviceInfo) -> DeviceInfo:
    """`device` labelled with a generation the adapter runs on, for checks that never run its kernel (a missing
    library is reported before anything runs)."""
    here = adapter.device_for(device)
    return here if here.generation in adapter.generations else dataclasses.replace(
        device, generation=adapter.generations[0])


def running(adapter: Adapter, device: DeviceInfo) -> DeviceInfo:
    """The device as the adapter sees it; the test is skipped (with the reason the matrix records as unsupported)
    where its kernel does not run, e.g. vLLM's CPU build on a GPU machine or an sm100-only kernel on sm90."""
    here = adapter.device_for(device)
    if here.generation not in adapter.generations:
        pytest.skip(f"{adapter.name} does not run on {here.generation} (its cells are reported unsupported there)")
    return here
