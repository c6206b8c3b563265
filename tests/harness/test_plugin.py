"""The pytest plugin: which GPU an xdist worker takes, when the plugin is active, which profile the generic tests
use, that a test which verified nothing does not pass, and that bad options are usage errors. (That it runs the
generic tests from an outside repository is tests/test_examples.py.)"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import plugin, registry
from harness.core.case import Case
from harness.core.device import detect
from harness.core.result import Result
from harness.engine.profiles import PROFILES, choose
from harness.plugin.generic import nothing_verified
from harness.plugin.gpus import device_for_worker, parse_gpus, worker_number
from tests.harness.signals import NO_GPU


def test_workers_spread_round_robin_over_the_gpus() -> None:
    got = [device_for_worker("auto", f"gw{i}", 2) for i in range(5)]
    assert got == ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"]
    assert [device_for_worker("cuda", f"gw{i}", 4, [1, 3]) for i in range(3)] == ["cuda:1", "cuda:3", "cuda:1"]
    assert device_for_worker("auto", None, 3) == "cuda:0"  # no xdist: the first GPU
    assert device_for_worker("cuda:2", "gw5", 4) == "cuda:2"  # pinned
    assert device_for_worker("cpu", "gw1", 4) == "cpu"
    assert device_for_worker("auto", "gw1", 0) == "auto"  # no GPU: the CPU path decides
    assert worker_number("gw12") == 12 and worker_number("master") is None


def test_bad_gpu_choices_are_named() -> None:
    with pytest.raises(ValueError, match="--moe-gpus names GPU"):
        device_for_worker("auto", "gw0", 2, [0, 2])
    with pytest.raises(ValueError, match="--moe-device must be"):
        device_for_worker("tpu", "gw0", 2)
    with pytest.raises(ValueError, match="--moe-gpus must be comma-separated"):
        parse_gpus("0,x")
    assert parse_gpus("") is None and parse_gpus("2, 0") == [2, 0]


def test_this_worker_verifies_on_its_own_device(moe_device, pytestconfig) -> None:  # type: ignore[no-untyped-def]
    """Under xdist on a machine with several GPUs, worker gwK is on GPU K mod N, and torch's current device follows
    (kernels that allocate on "cuda" land there too)."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    want = device_for_worker(pytestconfig.getoption("moe_device"), os.environ.get("PYTEST_XDIST_WORKER"), count,
                             parse_gpus(pytestconfig.getoption("moe_gpus")))
    if want.startswith("cuda:"):
        assert moe_device.device == want
        assert torch.cuda.current_device() == int(want.split(":")[1])
    else:
        assert moe_device.device == "cpu" and moe_device.generation in ("interp", "cpu")


def test_the_plugin_is_inert_where_nothing_is_selected(monkeypatch: pytest.MonkeyPatch, pytestconfig) -> None:  # type: ignore[no-untyped-def]
    assert plugin.is_active(pytestconfig)  # this repository: ini moe_adapters = all
    monkeypatch.setattr(plugin, "adapter_specs", lambda config: [])
    monkeypatch.setattr(plugin, "has_entry_points", lambda: False)
    assert not plugin.is_active(pytestconfig)
    monkeypatch.setattr(plugin, "has_entry_points", lambda: True)
    assert plugin.is_active(pytestconfig)
    assert plugin.ENTRY_POINT_GROUP == registry.ENTRY_POINT_GROUP


def test_the_generic_tests_get_their_own_profile() -> None:
    assert choose(None, None, None, None) == "ci"
    assert choose(None, "my-repos-profile", None, "gpu") == "gpu"  # a repository's own profile is passed over
    assert choose("thorough", "dev") == "thorough"
    assert PROFILES["gpu"].max_examples > PROFILES["ci"].max_examples


def test_loading_the_plugin_imports_no_torch() -> None:
    """The plugin loads in every pytest run of an environment that has moe-harness installed."""
    import subprocess
    import sys

    code = ("import sys, harness.plugin as p; from types import SimpleNamespace as N\n"
            "cfg = N(known_args_namespace=N(moe_adapter=[]), getini=lambda name: [])\n"
            "p.is_active(cfg); print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stdout + done.stderr


def test_an_xdist_controller_lists_the_adapters_without_importing_torch(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller of a child pytest (most of the suite's process tests start one) runs no test: importing torch
    there (seconds of CPU on a GPU machine, in every such session) bought nothing. Its listing's kernel host has it.
    As on a GPU machine, a GPU's device file is there: whether to use Triton's interpreter is each worker's question."""
    report = tmp_path / "controller.txt"
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # undecided, as a session started by hand finds it
    code, out, err = _pytest(tmp_path, "-n", "2", "-p", "tests.harness.fixtures.controller_modules", "--moe-adapter",
                             "reference-activation", CONTROLLER_REPORT=str(report), CONTROLLER_FAKE_GPU="1")
    assert code == 0, out[-2000:] + err[-2000:]
    assert report.read_text() == "torch imported: False"


# ------------------------------------------------------------------------------------- nothing verified, bad options

ROOT = Path(__file__).resolve().parents[2]
_reference = registry.resolve("reference-activation")
_SUPPORT = {"activation": ("silu_and_mul",), "dtype": ("float32", "bfloat16")}
#: resolvable as tests.harness.test_plugin:NOTHING_VERIFIABLE: on the interpreter every case of it depends on inline
#: PTX, which no fix makes faithful there, so each verdict is not-verifiable
NOTHING_VERIFIABLE = dataclasses.replace(_reference, name="nothing-verifiable", support=_SUPPORT,
                                         interp_features=lambda features: {"inline_asm"})
#: its bfloat16 cases only are not-verifiable
PARTLY_VERIFIABLE = dataclasses.replace(_reference, name="partly-verifiable", support=_SUPPORT,
                                        interp_features=lambda f: {"inline_asm"} if f["dtype"] == "bfloat16" else set())
#: an adapter of a library that is installed nowhere
NOT_INSTALLED = dataclasses.replace(_reference, name="library-missing", support=_SUPPORT, library=registry.Library(
    distribution="moe-harness-absent-library", module="moe_harness_absent_library", written_for="1.0",
    install="pip install moe-harness-absent-library"))


def _pytest(tmp_path: Path, *args: str, **env: str) -> tuple[int, str, str]:
    """A child pytest run of the generic tests with the plugin's options `args`."""
    plugin_arg = plugin.load_args()
    cmd = [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", *plugin_arg,
           "harness/plugin/generic.py", "--moe-results-dir", str(tmp_path / "results"), *args]
    p = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]),
                                                **env), capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


def test_a_generic_test_that_verified_nothing_is_skipped_and_one_that_verified_part_says_so(tmp_path: Path) -> None:
    code, out, err = _pytest(tmp_path, "--moe-device", "cpu", "--moe-adapter", f"{__name__}:NOTHING_VERIFIABLE",
                             "--moe-adapter", f"{__name__}:PARTLY_VERIFIABLE", TRITON_INTERPRET="1")
    assert code == 0 and "2 passed, 2 skipped" in out, out[-3000:] + err[-2000:]
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 2 and all("nothing-verifiable: could not verify any of its" in line and "inline_asm" in line
                                     for line in skipped), out[-3000:]
    partly = [line for line in out.splitlines() if line.startswith("PARTLY VERIFIED")]
    assert len(partly) == 2 and all("partly-verifiable" in line and " of " in line and "inline_asm" in line
                                    for line in partly), out[-3000:]


def _result(verdict: str) -> Result:
    case = Case(op="activation", adapter="a", features={"activation": "x", "dtype": "bfloat16"}, shapes={"T": 1},
                seed=1)
    return Result(case=case, verdict=verdict, reason=f"why {verdict}")


def test_only_a_run_that_verified_nothing_reads_as_such() -> None:
    assert nothing_verified([_result("not-verifiable"), _result("not-installed")]).startswith(
        "could not verify any of its 2 cases here: not-verifiable: why not-verifiable; not-installed: why")
    for other in ("pass", "fail", "error", "unsupported"):  # a real fail is never turned into a skip
        assert nothing_verified([_result("not-verifiable"), _result(other)]) is None
    assert nothing_verified([]) is None


def test_a_mutant_none_of_whose_cases_could_be_verified_is_not_called_a_survivor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.mutants import test_mutants
    from tests.mutants.catalog import MUTANTS

    mutant = next(m for m in MUTANTS if m.base == "triton-activation")
    built = test_mutants.build(mutant)
    monkeypatch.setattr(test_mutants, "build", lambda m: dataclasses.replace(
        built, interp_features=lambda features: {"inline_asm"}))
    interp = dataclasses.replace(detect("cpu"), generation="interp")  # the gate answers before any kernel runs
    with pytest.raises(pytest.skip.Exception, match=f"mutant {mutant.name}: could not verify any of its"):
        test_mutants.test_mutant_is_caught(mutant, interp, {"inline_asm"})


_BAD_MODULE = "x = (\n"  # a syntax error: the adapter's module does not import


@pytest.mark.parametrize(("args", "words"), [
    (["--moe-profile", "bogus"], "--moe-profile must be one of ci, dev, gpu, thorough, got 'bogus'"),
    (["--moe-shards", "0"], "--moe-shards must be >= 1, got 0"),
    (["--moe-device", "cuda:99"], "--moe-device cuda:99: "),
    (["--moe-adapter", "no-such"], "--moe-adapter: unknown adapter 'no-such'"),
    # under xdist the controller lists beside its workers' start, and still ends the session with one line
    (["--moe-adapter", "no-such", "-n", "2"], "--moe-adapter: unknown adapter 'no-such'"),
    (["--moe-adapter", "moe_bad_module:ADAPTER"],
     "--moe-adapter: adapter 'moe_bad_module:ADAPTER': cannot import module 'moe_bad_module' (SyntaxError: "),
])
def test_bad_plugin_options_are_one_line_usage_errors(tmp_path: Path, args: list[str], words: str) -> None:
    (tmp_path / "moe_bad_module.py").write_text(_BAD_MODULE)
    adapter = [] if "--moe-adapter" in args else ["--moe-adapter", "reference-activation"]
    code, out, err = _pytest(tmp_path, *adapter, *args)
    errors = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert code == pytest.ExitCode.USAGE_ERROR, (code, out[-2000:], err[-2000:])
    assert len(errors) == 1 and words in errors[0], err[-2000:]
    assert "Traceback" not in out + err and "passed" not in out, out[-2000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: --moe-device cuda is valid")
def test_asking_for_cuda_without_a_gpu_is_a_usage_error(tmp_path: Path) -> None:
    code, out, err = _pytest(tmp_path, "--moe-adapter", "reference-activation", "--moe-device", "cuda")
    assert code == pytest.ExitCode.USAGE_ERROR and "ERROR: --moe-device cuda: torch sees no CUDA device" in err, \
        (code, out[-2000:], err[-2000:])


def test_xdist_workers_share_the_cpus_instead_of_each_taking_all(tmp_path: Path) -> None:
    """torch's default (a thread per CPU) in every worker oversubscribes the machine; each worker takes its share.
    The worker starts with it (numpy and torch spin a thread per CPU as they load). A sweep one of its tests starts
    takes at most that share or CHILD_SWEEP_JOBS workers, whichever is more."""
    (tmp_path / "test_threads_probe.py").write_text(
        "import os, torch\n"
        "from harness.core.device import detect\n"
        "from harness.sweep.workers import default_jobs\n"
        "def test_threads():\n"
        "    cpus = len(os.sched_getaffinity(0))\n"
        "    share = max(1, cpus // int(os.environ['PYTEST_XDIST_WORKER_COUNT']))\n"
        "    assert torch.get_num_threads() == share, (torch.get_num_threads(), share)\n"
        "    started = open('/proc/self/environ').read().split('\\0')  # what the worker was started with\n"
        "    assert f'OMP_NUM_THREADS={share}' in started, [v for v in started if 'OMP' in v]\n"
        f"    jobs = max({plugin.CHILD_SWEEP_JOBS}, share)\n"
        "    assert os.environ['MOE_HARNESS_JOBS'] == str(jobs)\n"
        "    assert default_jobs(detect('cpu')) == min(cpus, jobs)\n")
    plugin_arg = plugin.load_args()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin_arg, "-n", "2",
           str(tmp_path / "test_threads_probe.py"), "--moe-adapter", f"{__name__}:NOTHING_VERIFIABLE",
           "--moe-results-dir", str(tmp_path / "results"), "-k", "threads", "--rootdir", str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MOE_HARNESS_JOBS")}
    p = subprocess.run(cmd, cwd=ROOT, env=dict(env, PYTHONPATH=str(ROOT), **NO_GPU), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0 and "1 passed" in p.stdout, p.stdout[-3000:] + p.stderr[-2000:]


def test_a_sweeps_default_workers_stop_at_moe_harness_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.core.device import JOBS_ENV, sweep_jobs

    monkeypatch.delenv(JOBS_ENV, raising=False)
    assert sweep_jobs(16) == 16
    monkeypatch.setenv(JOBS_ENV, "4")
    assert (sweep_jobs(16), sweep_jobs(2)) == (4, 2)
    from harness.sweep.workers import default_jobs

    monkeypatch.setenv(JOBS_ENV, "1")
    assert default_jobs(detect("cpu")) == 1
    for bad in ("four", "0"):
        monkeypatch.setenv(JOBS_ENV, bad)
        with pytest.raises(ValueError, match=JOBS_ENV):
            sweep_jobs(16)


def test_tests_are_handed_out_longest_first_by_their_measured_durations(tmp_path: Path) -> None:
    """xdist deals the first items out round robin: the long ones must come first, or they end the run alone."""
    (tmp_path / "test_order_probe.py").write_text(
        "def test_short():\n    pass\n\ndef test_long():\n    pass\n\ndef test_unknown():\n    pass\n")
    probe = "test_order_probe.py"
    times = {f"{probe}::test_short": 0.1, f"{probe}::test_long": 30.0, "elsewhere::test_x": 5.0}
    (tmp_path / "times.json").write_text(json.dumps(times))
    plugin_arg = plugin.load_args()
    cmd = [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", *plugin_arg, probe,
           "--moe-adapter", f"{__name__}:NOTHING_VERIFIABLE", "-k", "probe", "--rootdir", str(tmp_path),
           "--moe-durations", str(tmp_path / "times.json")]
    p = subprocess.run(cmd, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT), **NO_GPU), capture_output=True,
                       text=True, timeout=300)
    order = [line.split("::")[-1] for line in p.stdout.splitlines() if line.startswith(probe)]
    # the unknown test counts as the median of the known durations (5 s): between the long and the short one
    assert order == ["test_long", "test_unknown", "test_short"], p.stdout[-2000:] + p.stderr[-2000:]
    (tmp_path / "bad.json").write_text("[1, 2]")
    p = subprocess.run([*cmd[:-1], str(tmp_path / "bad.json")], cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=str(ROOT), **NO_GPU), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 4 and "--moe-durations" in p.stderr, p.stdout[-2000:] + p.stderr[-2000:]


@pytest.mark.parametrize(("device", "workers", "asked", "want"), [
    ("cuda:0", 16, "auto", 4), ("cuda:0", 4, "auto", 2), ("cuda:0", 2, "auto", 1), ("cuda:0", 0, "auto", 1),
    ("cpu", 16, "auto", 1), ("cpu", 16, 3, 3)])
@pytest.mark.parametrize("role", ["controller", "worker"])
def test_property_tests_are_split_over_the_workers_of_a_gpu_run(monkeypatch: pytest.MonkeyPatch, device: str,
                                                                workers: int, asked: object, want: int,
                                                                role: str) -> None:
    """The worker count comes from the session (xdist's option in the controller, its worker input in a worker),
    never from PYTEST_XDIST_WORKER_COUNT: a pytest that a test starts without xdist inherits that variable from the
    worker running the test (it split its generic tests into 4 on a GPU and failed 4 times where 1 was due)."""
    class Option:
        numprocesses = workers if role == "controller" else None

    class Config:
        option = Option()

        def getoption(self, name: str) -> object:
            return asked

    config = Config()
    if role == "worker" and workers:
        config.workerinput = {"workercount": workers}  # type: ignore[attr-defined]
    monkeypatch.setattr(plugin, "worker_device", lambda config: device)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "16")
    assert plugin.shard_count(config) == want  # type: ignore[arg-type]


def test_xdist_hands_tests_out_one_at_a_time_unless_the_user_chose_a_chunk() -> None:
    """With xdist's default chunks one worker ended a CPU run with minutes of queued tests while the other idled."""
    import argparse

    class Config:
        def __init__(self, **option: object) -> None:
            self.option = argparse.Namespace(**option)

    default, chosen, serial = Config(numprocesses=2, maxschedchunk=None), Config(numprocesses=2, maxschedchunk=8), \
        Config(numprocesses=None, maxschedchunk=None)
    for config in (default, chosen, serial):
        plugin._hand_out_one_at_a_time(config)  # type: ignore[arg-type]
    assert (default.option.maxschedchunk, chosen.option.maxschedchunk, serial.option.maxschedchunk) == (1, 8, None)


def test_recorded_durations_come_with_each_tests_cpu_seconds(tmp_path: Path) -> None:
    """The CPU a test spends (its own, and that of a process it waits for) goes beside its duration, over xdist too;
    a test that sleeps spends almost none."""
    (tmp_path / "test_cpu_probe.py").write_text(
        "import subprocess, sys, time\n\n"
        "def _spin(s):\n    t = time.process_time()\n    while time.process_time() - t < s:\n        pass\n\n"
        "def test_spins():\n    _spin(0.6)\n\n"
        "def test_sleeps():\n    time.sleep(0.6)\n\n"
        "def test_child_spins():\n"
        "    subprocess.run([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
        "while time.process_time() - t < 0.6: pass'], check=True)\n")
    record = tmp_path / "out" / "durations.json"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin.load_args(), "test_cpu_probe.py",
           "--moe-adapter", f"{__name__}:NOTHING_VERIFIABLE", "-k", "probe", "--rootdir", str(tmp_path), "-n", "2",
           "--moe-record-durations", str(record)]
    p = subprocess.run(cmd, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT), **NO_GPU), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    wall = json.loads(record.read_text())
    cpu = {k.split("::")[-1]: v for k, v in json.loads((tmp_path / "out" / "durations.cpu.json").read_text()).items()}
    assert set(cpu) == {"test_spins", "test_sleeps", "test_child_spins"} and len(wall) == 3, (cpu, wall)
    assert cpu["test_spins"] >= 0.5 and cpu["test_child_spins"] >= 0.5 and cpu["test_sleeps"] < 0.3, cpu


def test_xdist_workers_start_while_the_controller_lists_the_adapters(tmp_path: Path,
                                                                     tmp_path_factory: pytest.TempPathFactory) -> None:
    """The listing (a kernel host importing every adapter module) runs beside the workers' start: the adapter
    module's import waits for a worker to be configured, which a controller that listed first never lets happen.
    The workers then judge the adapter the listing found."""
    signals = tmp_path_factory.mktemp("signals")  # not on the module path: kernel hosts cannot write there
    go, saw = signals / "go", signals / "saw"
    code, out, err = _pytest(tmp_path, "-n", "2", "-p", "tests.harness.fixtures.worker_started", "--moe-adapter",
                             "tests.harness.fixtures.slow_listing:ADAPTER", "-k", "slow-listing-activation",
                             "--moe-device", "cpu", MOE_TEST_GO=str(go), MOE_TEST_SAW=str(saw))
    assert saw.read_text() == "a worker had started", out[-2000:] + err[-2000:]
    assert code == 0 and "passed" in out, out[-2000:] + err[-2000:]


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]])
def test_the_session_names_the_adapters_whose_library_is_not_installed(tmp_path: Path, xdist: list[str]) -> None:
    """In the header without xdist; under xdist once the controller's listing, made beside the workers' start, ends
    (on the CPU: no CUDA context is needed for this)."""
    code, out, err = _pytest(tmp_path, *xdist, "-v", "--moe-device", "cpu", "--moe-adapter",  # -q -v: a header
                             f"{__name__}:NOT_INSTALLED")
    said = [line for line in out.splitlines() if line.startswith("moe-harness: not installed here")]
    assert said == ["moe-harness: not installed here, recorded as not-installed: library-missing "
                    "(moe-harness-absent-library 1.0: pip install moe-harness-absent-library)"], out[-3000:]
    assert code == 0, out[-2000:] + err[-2000:]
    from harness.store.results import load_results

    recorded = [(r.adapter, r.verdict, r.case.features["dtype"]) for r in load_results([tmp_path / "results"])]
    assert sorted(recorded) == [("library-missing", "not-installed", "bfloat16"),
                                ("library-missing", "not-installed", "float32")], recorded  # one per declared cell
    code, out, err = _pytest(tmp_path, *xdist, "--moe-adapter", f"{__name__}:NOT_INSTALLED")
    assert code == 0 and "not installed here" not in out, out[-2000:]


def test_a_kernel_host_cannot_forge_the_listing_the_workers_read(tmp_path: Path,
                                                                 tmp_path_factory: pytest.TempPathFactory) -> None:
    """The listing's file is read-only to kernel hosts (the listing host imports every adapter module: untrusted
    code), and a worker takes only a record that carries its controller's token: a forged empty listing would have
    the workers test nothing."""
    forged = tmp_path_factory.mktemp("signals") / "forged"
    temporary = tmp_path_factory.mktemp("tmp")  # the session's listing folder alone there
    code, out, err = _pytest(tmp_path, "-n", "2", "--moe-adapter", "tests.harness.fixtures.forging_listing:ADAPTER",
                             "-k", "forging-listing-activation", "--moe-device", "cpu", MOE_TEST_FORGED=str(forged),
                             TMPDIR=str(temporary))
    assert forged.read_text() != "no listing folder found", forged.read_text()
    from harness.engine import sandbox

    if sandbox.availability().ok:
        assert forged.read_text().startswith("refused"), forged.read_text()
    assert code == 0 and " passed" in out, out[-2000:] + err[-2000:]
