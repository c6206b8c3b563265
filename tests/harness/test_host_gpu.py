"""A kernel host sees only the GPU it judges on (`harness.engine.host_gpu`), and its judge still names that GPU as
it does."""

from __future__ import annotations

import pytest

from harness.core.case import Case
from harness.engine.host_gpu import ALL_ENV, confine, judge_name

SPEC = "tests.harness.fixtures.device_reporting_adapter:ADAPTER"


@pytest.mark.parametrize(("visible", "device", "physical"), [
    (None, "cuda:1", "1"),
    ("3,5", "cuda:1", "5"),
    ("GPU-aaaa,GPU-bbbb", "cuda:0", "GPU-aaaa"),
    (" 2 , 7", "cuda:1", "7"),
])
def test_a_gpu_host_is_given_only_its_own_gpu(visible: str | None, device: str, physical: str) -> None:
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert confine(env, device) == "cuda:0"
    assert env["CUDA_VISIBLE_DEVICES"] == physical


@pytest.mark.parametrize(("env", "device"), [
    ({}, "cpu"),
    ({}, "cuda"),  # no index: the host's default device, as before
    ({"CUDA_VISIBLE_DEVICES": "4"}, "cuda:1"),  # past the judge's list: CUDA's own error names it
    ({"CUDA_VISIBLE_DEVICES": "0,,1"}, "cuda:1"),  # CUDA stops reading at the empty entry
    ({ALL_ENV: "all"}, "cuda:1"),
])
def test_a_host_is_left_its_environment_where_there_is_no_gpu_to_name(env: dict[str, str], device: str) -> None:
    before = dict(env)
    assert confine(env, device) == device
    assert env == before


def test_a_tensor_on_the_hosts_gpu_is_named_as_its_judge_names_that_gpu() -> None:
    assert judge_name("cuda:0", "cuda:0", "cuda:1") == "cuda:1"
    assert judge_name("cpu", "cuda:0", "cuda:1") == "cpu"
    assert judge_name("cuda:0", "cuda:0", "cuda:0") == "cuda:0"


def test_a_host_on_the_last_gpu_sees_one_gpu_and_its_returned_output_is_on_the_cases_device() -> None:
    """On a machine of several GPUs the host judges on the last one: its kernel sees a single GPU, and the tensor it
    returns, on that GPU, passes the judge's device check for the case's device."""
    import torch

    from harness.core.device import detect
    from harness.engine import remote, runner

    if not torch.cuda.is_available():
        pytest.skip("needs a GPU: a CPU host sees none")
    device = f"cuda:{torch.cuda.device_count() - 1}"
    case = Case(op="activation", adapter="device-reporting", features={"activation": "silu_and_mul",
                "dtype": "float32"}, shapes={"T": 4, "N": 24}, dtypes={"x": "float32"}, seed=1)
    adapter = remote.open_adapter(SPEC, device)
    try:
        r = runner.judge(case, adapter, detect(device))
    finally:
        remote.close_adapter(SPEC, device)
    assert r.verdict == "pass", r.reason
