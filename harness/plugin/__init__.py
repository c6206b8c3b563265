"""The moe-harness pytest plugin (entry point `pytest11`: `moe_harness`), installed with the package.

In any repository: `pytest --moe-adapter pkg.mod:OBJ` (repeatable; a registered name also works, `all` means every
registered adapter) runs the generic tests of `harness.plugin.generic` for those adapters: the declared cells pass
under property-based fuzzing (hypothesis), the undeclared cells are rejected cleanly, every case goes through the
integrity checks. Without `--moe-adapter`, the adapters come from the ini option `moe_adapters`, else from the
installed packages' `moe_harness.adapters` entry points; with none of the three the plugin adds nothing and
touches nothing (disable it outright with `-p no:moe_harness`).

The generic tests join the collection when pytest collects its default paths (no path arguments), or whenever
`--moe-adapter` is given. Options: `--moe-device`, `--moe-gpus` (which GPUs xdist workers spread over),
`--moe-profile` (the hypothesis profile of the generic tests only: ci, dev, gpu, thorough), `--moe-shards`,
`--moe-results-dir`. Fixtures for a repository's own tests: `moe_device` (the `DeviceInfo` this worker verifies
on), `moe_results` (its `ResultStore`), `moe_unverifiable` (interpreter features that could not be made faithful).
A session says at once what it is doing before its first test and, once collected, how long its tests are expected
to take (`harness.plugin.progress`); Triton's interpreter's own numerical RuntimeWarnings are filtered, in the test
process and in the kernel hosts.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from harness.core.probe_cache import ENTRY_POINT_GROUP  # torch-free: the plugin loads before any test imports torch
from harness.plugin import listing

pytest.register_assert_rewrite("harness.plugin.generic")

GENERIC = Path(__file__).resolve().parent / "generic.py"
_ADAPTER_ARGS = ("moe_adapter_name", "moe_shard", "moe_known_adapter")
#: the generic test of known findings: collected only for adapters that declare one
KNOWN_TEST = "test_known_findings_reproduce"
DEFAULT_CASE_TIMEOUT_S = 300.0


class _BadNumber(str):
    """An option value (or its environment variable's) that is not a number: a usage error at configure time."""


def _number(kind: type, option: str) -> Any:
    def parse(text: str) -> Any:
        try:
            return kind(text)
        except (TypeError, ValueError):
            return _BadNumber(f"{option} (or its environment variable) must be a number, got {text!r}")

    return parse


def _shards(text: str) -> Any:
    return "auto" if text == "auto" else _number(int, "--moe-shards")(text)


def xdist_workers(config: pytest.Config) -> int:
    """The xdist workers of this session (1 without xdist): from the session itself, never from the environment,
    which a pytest run started by a test inherits from the worker that started it."""
    worker = getattr(config, "workerinput", None)
    if worker is not None:
        return int(worker.get("workercount", 1))
    return max(1, int(getattr(config.option, "numprocesses", 0) or 0))


def shard_count(config: pytest.Config) -> int:
    """The --moe-shards value; `auto`: on a GPU the property tests of the kernels that compile the most are the
    longest items, so they are split over the workers (a quarter of the workers, at most 4 shards each)."""
    shards = config.getoption("moe_shards")
    if shards != "auto":
        return int(shards)
    workers = xdist_workers(config)
    if workers < 4 or not worker_device(config).startswith("cuda"):
        return 1
    return 4 if workers >= 8 else 2


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("moe-harness", "moe-harness: generic tests of MoE kernel adapters")
    group.addoption("--moe-adapter", action="append", default=[], metavar="SPEC",
                    help="verify this adapter: module:object, a registered name, 'all', or 'external' (the "
                         "third-party libraries' adapters) (repeatable)")
    group.addoption("--moe-device", default=os.environ.get("MOE_HARNESS_DEVICE", "auto"),
                    help="auto (default; xdist workers spread over the GPUs), cpu, cuda, or cuda:N (pinned)")
    group.addoption("--moe-gpus", default=os.environ.get("MOE_HARNESS_GPUS", ""), metavar="LIST",
                    help="GPU indices the xdist workers take round robin (default: every visible GPU)")
    group.addoption("--moe-profile", default=None, metavar="NAME",
                    help="hypothesis profile of the generic tests: ci (default), dev, gpu, thorough "
                         "(also MOE_HARNESS_PROFILE, or HYPOTHESIS_PROFILE when it names one of these)")
    group.addoption("--moe-shards", type=_shards, default=os.environ.get("MOE_HARNESS_SHARDS", "auto"),
                    help="split each adapter's property test into N items, so xdist runs one adapter on several "
                         "workers (default auto: 4 on a GPU with 8 or more xdist workers, 2 with 4 or more, else 1; "
                         "more for an adapter whose property test --moe-durations records as long)")
    group.addoption("--moe-case-timeout", type=_number(float, "--moe-case-timeout"),
                    default=os.environ.get("HARNESS_CASE_TIMEOUT") or str(DEFAULT_CASE_TIMEOUT_S), metavar="S",
                    help="seconds one judged case may take (every runner.judge call of the session); past it the case "
                         f"is an error verdict, and a hang inside C code ends the process after a grace period "
                         f"(default {DEFAULT_CASE_TIMEOUT_S:g}, also HARNESS_CASE_TIMEOUT; 0: none)")
    group.addoption("--moe-results-dir", default=None,
                    help="where verdicts are written, one JSONL file per run and worker (default: ini "
                         "moe_results_dir, else results/local)")
    group.addoption("--moe-durations", default=None, metavar="FILE",
                    help="measured test durations (JSON: node id -> seconds) to hand tests out longest first and "
                         "split long property tests further "
                         "(default: ini moe_durations, where {kind} is cpu or cuda; without one the generic "
                         "property tests go first)")
    group.addoption("--moe-record-durations", default=None, metavar="FILE",
                    help="write every test's duration to FILE at the end (the input of --moe-durations), and its "
                         "CPU seconds (its own and its waited-for child processes') beside it, in FILE's name "
                         "with .cpu before the suffix")
    group.addoption("--moe-no-supervise", action="store_true", default=False,
                    help="do not watch a one-process session from a parent process (by default a session that a "
                         "kernel ends from C code exits 1 with the test it was in, instead of the kernel's status)")
    parser.addini("moe_adapters", type="linelist", default=[],
                  help="adapters whose generic tests run when --moe-adapter is not given ('all': every one)")
    parser.addini("moe_durations", default="", help="default of --moe-durations ({kind}: cpu or cuda)")
    parser.addini("moe_results_dir", default="results/local", help="default of --moe-results-dir")


def _option(config: pytest.Config, name: str) -> Any:
    # before pytest_configure the parsed command line is only in known_args_namespace
    early = getattr(config, "known_args_namespace", None)
    return getattr(early, name) if early is not None and hasattr(early, name) else config.getoption(name)


def adapter_specs(config: pytest.Config) -> list[str]:
    """What the user asked for: --moe-adapter, else the ini option (empty: the entry points decide)."""
    return list(_option(config, "moe_adapter") or []) or list(config.getini("moe_adapters"))


def is_active(config: pytest.Config) -> bool:
    """Whether this session runs generic tests: asked for, or some installed package publishes adapters. Decided
    without importing torch or the harness, since the plugin loads in every pytest run of the environment."""
    return bool(adapter_specs(config)) or has_entry_points()


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Name the selected adapters whose third-party library is missing here, with how to install it: their cases
    are recorded `not-installed` and their generic tests skip with that reason."""
    if not is_active(config):
        return []
    from harness.engine import sandbox
    from harness.engine.interpreter import version_notice

    notice = version_notice()  # None unless Triton's interpreter is in use and its release is not verified
    # an xdist controller's listing may still be running: said when it ends (pytest_collection)
    later = _listing_pending(config)
    return [f"moe-harness: {sandbox.describe()}"] + [notice] * (notice is not None) + (
        [] if later else _not_installed_lines(config))


def _not_installed_lines(config: pytest.Config) -> list[str]:
    """The selected adapters whose third-party library is missing here, with how to install it."""
    missing: dict[str, list[str]] = {}
    catalog = _catalog(config)
    for name in selected_adapters(config):
        lib = catalog.manifests.get(name, {}).get("library")
        if lib is not None and lib.get("missing") is not None:
            missing.setdefault(f"{lib['distribution']} {lib['written_for']}: {lib['install']}", []).append(name)
    return [f"moe-harness: not installed here, recorded as not-installed: {', '.join(names)} ({how})"
            for how, names in sorted(missing.items())]


def is_installed() -> bool:
    """Whether this plugin is registered through its pytest11 entry point (else a checkout loads it with -p or
    pytest_plugins)."""
    from importlib import metadata

    return any(ep.name == "moe_harness" for ep in metadata.entry_points(group="pytest11"))


def load_args() -> list[str]:
    """What a pytest command started from here needs to load this plugin: nothing where the plugin is installed,
    `-p harness.plugin` in a checkout that was not pip-installed (its conftest.py is not found when an option's value
    is an existing folder outside the checkout, so it cannot be relied on)."""
    return [] if is_installed() else ["-p", "harness.plugin"]


def has_entry_points() -> bool:
    from importlib import metadata

    return any(True for _ in metadata.entry_points(group=ENTRY_POINT_GROUP))


#: the adapters' listing, once per process: made in a kernel host, so that the judging process (this one) never
#: imports an adapter module
_CATALOGS: dict[tuple[str, ...], Any] = {}
#: the groups a host expands: `@entry-points` for the adapters that installed packages publish
ENTRY_POINTS = "@entry-points"


#: the key of xdist's workerinput under which the controller hands its workers the adapters' listing
_CATALOG_INPUT = "moe_harness_catalog"


#: the xdist controller's listings in progress, by specs (harness.plugin.listing)
_LISTINGS: dict[tuple[str, ...], Any] = {}


def _specs(config: pytest.Config) -> tuple[str, ...]:
    return tuple(adapter_specs(config)) or (ENTRY_POINTS,)


def _list(specs: tuple[str, ...]) -> Any:
    from harness.engine import remote

    try:
        return remote.expand(list(specs))
    except (ValueError, remote.HostError) as e:
        raise pytest.UsageError(f"--moe-adapter: {e}") from None


def _as_input(specs: tuple[str, ...], catalog: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return {"specs_asked": list(specs), **asdict(catalog)}


def _catalog(config: pytest.Config) -> Any:
    from harness.engine import remote

    specs = _specs(config)
    workerinput = getattr(config, "workerinput", {})
    given = json.loads(workerinput.get(_CATALOG_INPUT) or "{}")
    if specs not in _CATALOGS and not given and (path := workerinput.get(listing.FILE_INPUT)):
        given = listing.read(path, workerinput.get(listing.TOKEN_INPUT, ""))  # made while this worker started
    if specs not in _CATALOGS and given.pop("specs_asked", None) == list(specs):
        _CATALOGS[specs] = remote.Catalog(**given)  # the controller's listing: no kernel host of our own for it
    if specs not in _CATALOGS:
        pending = _LISTINGS.get(specs)
        _CATALOGS[specs] = pending.result() if pending is not None else _list(specs)
    return _CATALOGS[specs]


def _start_listing(config: pytest.Config) -> None:
    """In the xdist controller: list the adapters in a thread, while the workers start (harness.plugin.listing)."""
    specs = _specs(config)
    if specs not in _CATALOGS and specs not in _LISTINGS:
        _LISTINGS[specs] = listing.Listing(lambda: _list(specs), lambda catalog: _as_input(specs, catalog))


def _listing_pending(config: pytest.Config) -> bool:
    specs = _specs(config)
    return specs not in _CATALOGS and specs in _LISTINGS


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """On the xdist controller, for each worker it starts: the adapters' listing it made, so that the worker does not
    start a kernel host to list them again (seconds of importing before its first test, on every worker); while that
    listing is still being made, the file it will be in (a worker on this machine)."""
    config = node.config
    if not is_active(config):
        return
    specs = _specs(config)
    spec = getattr(getattr(node, "gateway", None), "spec", None)
    local = bool(getattr(spec, "popen", False)) and not getattr(spec, "ssh", None) and not getattr(spec, "socket", None)
    if local and _listing_pending(config):
        node.workerinput[listing.FILE_INPUT] = _LISTINGS[specs].path
        node.workerinput[listing.TOKEN_INPUT] = _LISTINGS[specs].token
        return
    node.workerinput[_CATALOG_INPUT] = json.dumps(_as_input(specs, _catalog(config)))


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session: pytest.Session) -> None:
    """In the xdist controller, its workers started: the listing's end. A listing that failed ends the session now
    (a usage error, as it would have before the workers started); the adapters not installed here are said."""
    config = session.config
    if not is_active(config) or not _listing_pending(config):
        return
    _catalog(config)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and reporter.showheader and not reporter.no_header:  # where the header would have said
        for line in _not_installed_lines(config):
            reporter.write_line(line)


def selected_adapters(config: pytest.Config) -> list[str]:
    """Names of the adapters whose generic tests run (a spec that does not resolve is a usage error)."""
    return list(dict.fromkeys(_catalog(config).names))


def adapter_spec(config: pytest.Config, name: str) -> str:
    """The spec that loads adapter `name` in a kernel host (its `module:object[#name]`, or the name itself). An
    adapter the session did not select but a test registered in this process is found by the module that holds it."""
    catalog = _catalog(config)
    if name in catalog.names:
        return catalog.spec_of(name)
    from harness import registry
    from harness.store.casefiles import adapter_reference

    local = getattr(registry, "_REGISTRY", {}).get(name)
    return (adapter_reference(local) if local is not None else None) or name


def listed_manifest(config: pytest.Config, name: str) -> dict[str, Any] | None:
    """What the session's listing says of adapter `name` (`remote.Catalog.manifests`), or None."""
    return _catalog(config).manifests.get(name)


def local_only(config: pytest.Config, name: str) -> Any:
    """The adapter object a test built and registered in this process under `name` (no module holds it, so no kernel
    host can load it; it is judged here, with the in-process checks), else None."""
    from harness import registry

    local = getattr(registry, "_REGISTRY", {}).get(name)
    if local is None or name in _catalog(config).names or adapter_spec(config, name) != name:
        return None
    return local


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    if not is_active(early_config):
        return
    from harness.plugin import supervise

    if supervise.wanted(early_config):
        supervise.start(early_config)  # this process only waits for the same session run as its child
    from harness.plugin import progress

    progress.say_starting(early_config)  # before the seconds of imports, listing and collecting
    _keep_bytecode(early_config)
    # The interpreter must be chosen before a conftest or test module imports triton.
    _prepare(early_config)


def _keep_bytecode(config: pytest.Config) -> None:
    """Before the imports the session's workers and child processes would compile again (harness.core.bytecode)."""
    if owns_process(config):
        from harness.core import bytecode

        bytecode.keep_for_run()


def _prepare(config: pytest.Config) -> None:
    """Triton's interpreter or not, decided before anything imports triton; by each xdist worker alone where the
    GPU is a question for torch (the controller, which runs no test, would import it for nothing)."""
    from harness.core.device import prepare_interpreter

    prepare_interpreter(_option(config, "moe_device"), ask_torch=not _hands_tests_to_xdist(config))


def _hands_tests_to_xdist(config: pytest.Config) -> bool:
    """A session run from the command line that hands its tests to xdist workers; also in the early hook, where a
    worker has no workerinput yet and the controller's options (it is told apart by its command line: execnet's)."""
    if hasattr(config, "workerinput"):
        return False
    early = config.known_args_namespace
    xdist = getattr(early, "numprocesses", None) not in (None, 0) or getattr(early, "dist", "no") != "no"
    return xdist and owns_process(config)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "moe_generic: a generic test of an MoE kernel adapter (moe-harness)")
    if not is_active(config):
        return
    if owns_process(config):
        _own_process(config)
    _keep_bytecode(config)  # again, for a plugin loaded by a conftest (after the early hook)
    _prepare(config)
    from harness.engine.interpreter import QUIET_NUMERICS

    config.addinivalue_line("filterwarnings", QUIET_NUMERICS)  # kernel hosts filter the same (harness.engine.host)
    _check_options(config)
    if not hasattr(config, "workerinput"):
        _hand_out_one_at_a_time(config)
        config.pluginmanager.register(_VerifiedCount(), "moe-harness-verified")
        _expect_time(config)
        if record := config.getoption("moe_record_durations"):
            from harness.plugin.schedule import DurationRecorder

            config.pluginmanager.register(DurationRecorder(record), "moe-harness-durations")
        if getattr(config.option, "testrunuid", "absent") is None:
            # the xdist controller chooses the run's uid now, so that it knows its workers' results files
            config.option.testrunuid = uuid.uuid4().hex
    if config.getoption("moe_record_durations"):
        from harness.plugin.schedule import CpuMeter

        config.pluginmanager.register(CpuMeter(), "moe-harness-cpu")  # where the tests run (inert in a controller)
    os.environ["HARNESS_CASE_TIMEOUT"] = f"{config.getoption('moe_case_timeout'):g}"  # xdist workers inherit it
    from harness.engine import sandbox

    # the results folder is read-only to every kernel host of the session (xdist workers inherit the setting)
    sandbox.protect(config.getoption("moe_results_dir") or config.getini("moe_results_dir"))
    # workers and kernel hosts that need one new kernel variant at once compile it once (harness.engine.compile_once)
    from harness.engine import compile_once_env

    compile_once_env.install()
    if hasattr(config, "workerinput"):
        _share_cores(xdist_workers(config))
    if is_xdist_controller(config):
        # workers start with their share: numpy's and torch's thread pools spin every CPU as they load (2 CPU-s
        # of a worker's start on a GPU machine)
        if not os.environ.get("OMP_NUM_THREADS"):
            from harness.core.device import threads_for

            os.environ["OMP_NUM_THREADS"] = str(threads_for(xdist_workers(config)))
        return  # it runs no test: no torch import, no CUDA context of its own (seconds in every child pytest)
    device = worker_device(config)
    if device.startswith("cuda:"):
        import torch

        torch.cuda.set_device(int(device.split(":")[1]))  # kernels that allocate on "cuda" follow the worker


def owns_process(config: pytest.Config) -> bool:
    """Whether this session is the whole of its process: an xdist worker, or pytest run from the command line (not
    a `pytest.main()` call inside another program, whose processes are not this session's to end)."""
    if hasattr(config, "workerinput"):
        return True
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    from_command_line = argv0.name in ("pytest", "py.test") or argv0.parts[-2:] == ("pytest", "__main__.py")
    return from_command_line and tuple(sys.argv[1:]) == tuple(config.invocation_params.args)


def _own_process(config: pytest.Config) -> None:
    """The session ends what it started: its kernel hosts, all together and within a deadline, then every process
    left that descends from it or carries its mark (fork servers, resource trackers, what a kernel started). SIGTERM
    interrupts it as Ctrl-C does (but for a supervised session, whose parent relays the signal and ends what is left);
    a worker, once its tests are over, ignores the SIGINT that xdist sends a worker slow to finish (a traceback from
    wherever it lands, a hypothesis gc callback)."""
    import atexit

    from harness.core import stopping
    from harness.engine import remote
    from harness.plugin import supervise

    stopping.own_tree()
    if not hasattr(config, "workerinput") and not supervise.supervised():  # a supervised one dies by the signal
        stopping.interrupt_on_signals()

    def end() -> None:
        with stopping.uninterrupted():
            remote.close_all()
            stopping.end_tree()

    atexit.register(end)  # after remote's own (atexit runs last registered first): this one closes the hosts


def _hand_out_one_at_a_time(config: pytest.Config) -> None:
    """xdist's `load` mode hands each worker a quarter of its share of the tests at once and refills in large
    chunks, so at the end one worker can hold minutes of queued tests while the others have nothing left to take.
    Unless the user chose a chunk size, tests go out one at a time (in the longest-first order): whichever worker is
    free takes the next."""
    if getattr(config.option, "numprocesses", None) and getattr(config.option, "maxschedchunk", 0) is None:
        config.option.maxschedchunk = 1


def _expect_time(config: pytest.Config) -> None:
    """Say, once the tests are collected, how long they are expected to take (harness.plugin.progress)."""
    from harness.plugin import progress
    from harness.plugin.schedule import read_durations

    if progress.wanted(config) and (path := durations_file(config)) is not None:
        shown = Path(path).relative_to(config.rootpath) if Path(path).is_relative_to(config.rootpath) else path
        expected = progress.ExpectedTime(read_durations(path), shown, xdist_workers(config))
        config.pluginmanager.register(expected, "moe-harness-expected-time")


#: the fewest workers a sweep started by a test in an xdist worker may take by default (`_share_cores`)
CHILD_SWEEP_JOBS = 4


def _share_cores(workers: int) -> None:
    """Each xdist worker (and the kernel hosts it starts, which take its thread count) gets its share of the CPUs:
    torch's default of one thread per CPU in every worker oversubscribes the machine and slows the small ops the
    judging is made of. The share is also left in OMP_NUM_THREADS for the processes a test starts (a child pytest
    or sweep takes it as its whole machine). An OMP_NUM_THREADS the user set is kept. A sweep a test starts (a
    README command, a matrix of a fixture adapter) takes at most CHILD_SWEEP_JOBS workers or the worker's share of the
    CPUs, whichever is more: on a 16-core GPU machine each of 16 workers' child matrices had taken 16 sweep workers,
    each with a kernel host and a CUDA context, for a few dozen cases."""
    from harness.core.device import JOBS_ENV, threads_for, usable_cpus

    os.environ.setdefault(JOBS_ENV, str(max(CHILD_SWEEP_JOBS, usable_cpus() // max(1, workers))))
    if os.environ.get("OMP_NUM_THREADS"):
        return
    import torch

    share = threads_for(workers)
    os.environ["OMP_NUM_THREADS"] = str(share)
    torch.set_num_threads(share)


def _check_options(config: pytest.Config) -> None:
    """Bad option values end the session now, as usage errors (one line, exit 4), instead of erroring each generic
    test later."""
    from harness.engine.profiles import PROFILES

    profile = config.getoption("moe_profile")
    if profile is not None and profile not in PROFILES:
        raise pytest.UsageError(f"--moe-profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    for name in ("moe_shards", "moe_case_timeout"):
        if isinstance(value := config.getoption(name), _BadNumber):
            raise pytest.UsageError(str(value))
    shards = config.getoption("moe_shards")
    if shards != "auto" and shards < 1:
        raise pytest.UsageError(f"--moe-shards must be >= 1, got {shards}")
    timeout = config.getoption("moe_case_timeout")
    if timeout < 0:
        raise pytest.UsageError(f"--moe-case-timeout must be >= 0, got {timeout:g}")
    _check_device(config)
    if not hasattr(config, "workerinput") and not getattr(config.option, "help", False):
        if is_xdist_controller(config):
            _start_listing(config)  # beside the workers' start; xdist workers take the controller's word for it
        else:
            selected_adapters(config)


def is_xdist_controller(config: pytest.Config) -> bool:
    """Whether this session hands its tests to xdist workers and runs none itself."""
    return not hasattr(config, "workerinput") and getattr(config.option, "dist", "no") != "no"


def _check_device(config: pytest.Config) -> None:
    """`--moe-device cuda[:N]` names a GPU this machine has (`auto` falls back to the CPU by itself)."""
    requested = config.getoption("moe_device")
    if requested in ("auto", "cpu") and not config.getoption("moe_gpus"):  # nothing to check: no torch import
        return
    device = worker_device(config)  # a malformed value or --moe-gpus is a usage error there
    if not device.startswith("cuda"):
        return
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise pytest.UsageError(f"--moe-device {requested}: torch sees no CUDA device here (use auto or cpu)")
    index = int(device.partition(":")[2] or 0)
    if index >= count:
        raise pytest.UsageError(f"--moe-device {requested}: GPU {index} does not exist here ({count} visible)")


#: the user property in which a generic test that verified only some of its cases reports the count
VERIFIED_PROPERTY = "moe_verified"


class _VerifiedCount:
    """On the controller: the passed generic tests that verified only part of their cases (the others were
    not-verifiable or not-installed here), listed in the terminal summary: a pass must not hide what went unchecked."""

    def __init__(self) -> None:
        self.partly: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" and report.passed:
            self.partly.update((report.nodeid, str(v)) for k, v in report.user_properties if k == VERIFIED_PROPERTY)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.partly:
            return
        terminalreporter.write_sep("=", "moe-harness: passed, but not every case was verified here")
        for nodeid, what in self.partly.items():
            terminalreporter.write_line(f"PARTLY VERIFIED {nodeid}: {what}")


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    from harness.plugin import supervise

    supervise.tell(f"test {nodeid}")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    from harness.plugin import supervise

    supervise.tell("closed")
    for made in _LISTINGS.values():  # the workers have read it (a worker started later is handed the catalog)
        made.remove()
    _LISTINGS.clear()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After a test whose kernel lost the CUDA context (a sticky error: illegal address, device assert), no later
    test can run on it. Under xdist the worker ends now (xdist reports this test as crashed and a fresh worker takes
    the rest); in one process the session stops with the reason, instead of failing every test after."""
    runner = sys.modules.get("harness.engine.runner")
    lost = runner.context_lost() if runner is not None else ""
    if not lost:
        return
    why = f"moe-harness: {item.nodeid} lost the CUDA context of this process ({lost})"
    if os.environ.get("PYTEST_XDIST_WORKER"):
        sys.stderr.write(why + "; ending this xdist worker so that a fresh one runs the remaining tests\n")
        sys.stderr.flush()
        os._exit(3)
    item.session.shouldstop = why + "; the remaining tests cannot run in this process (run with -n to recycle)"


def worker_device(config: pytest.Config) -> str:
    """This process's device: `--moe-device`, with auto/cuda spread over the GPUs by xdist worker number."""
    from harness.plugin.gpus import device_for_worker, parse_gpus

    requested = config.getoption("moe_device")
    try:
        gpus = parse_gpus(config.getoption("moe_gpus"))
    except ValueError as e:
        raise pytest.UsageError(f"{e} (--moe-gpus or MOE_HARNESS_GPUS)") from None
    count = 0
    if requested != "cpu":
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    try:
        return device_for_worker(requested, os.environ.get("PYTEST_XDIST_WORKER"), count, gpus)
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Add the generic tests (before -k/-m deselection runs) when they are wanted and not collected already."""
    if not is_active(config) or any(item.path == GENERIC for item in items):
        return
    default_paths = config.args_source != pytest.Config.ArgsSource.ARGS
    if not (default_paths or config.getoption("moe_adapter")):
        return
    try:
        nodeid = str(GENERIC.relative_to(config.rootpath))
    except ValueError:
        nodeid = "moe-harness/generic.py"  # installed outside the repository under test
    module = pytest.Module.from_parent(session, path=GENERIC, nodeid=nodeid)
    items.extend(session.genitems(module))


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
def pytest_collection_modifyitems_longest_first(session: pytest.Session, config: pytest.Config,
                                                items: list[pytest.Item]) -> None:
    """Longest tests first (harness.plugin.schedule), once every item is collected and deselected."""
    if not is_active(config):
        return
    from harness.plugin import schedule

    _drop_unparametrized(items)
    path = durations_file(config)
    schedule.order_longest_first(items, schedule.read_durations(path) if path else {})


def durations_file(config: pytest.Config) -> str | Path | None:
    """The measured durations of this suite: --moe-durations, else the ini's file for this kind of device."""
    path = config.getoption("moe_durations")
    if path is None and (pattern := config.getini("moe_durations")):
        kind = "cuda" if worker_device(config).startswith("cuda") else "cpu"
        found = config.rootpath / pattern.replace("{kind}", kind)
        path = found if found.is_file() else None
    return path


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    names = metafunc.fixturenames
    if not any(arg in names for arg in _ADAPTER_ARGS):
        return
    config = metafunc.config
    if "moe_known_adapter" in names:  # none declared: the item is dropped at collection (`_drop_unparametrized`)
        catalog = _catalog(config)
        metafunc.parametrize("moe_known_adapter", [n for n in selected_adapters(config)
                                                   if catalog.manifests.get(n, {}).get("known")])
    if "moe_shard" in names:  # each adapter its own count: a long one is split further (schedule.shards_for)
        pairs = [(name, (i, count)) for name, count in _shard_plan(config) for i in range(count)]
        metafunc.parametrize(("moe_adapter_name", "moe_shard"), pairs,
                             ids=[f"{name}-shard{i}" for name, (i, _) in pairs])
    elif "moe_adapter_name" in names:
        metafunc.parametrize("moe_adapter_name", selected_adapters(config))


def _shard_plan(config: pytest.Config) -> list[tuple[str, int]]:
    """Each selected adapter with the shards its property test is split into: --moe-shards N as given; `auto`:
    the session's count (`shard_count`), more for an adapter whose recorded property test is long."""
    from harness.plugin import schedule

    base = shard_count(config)  # >= 1: checked at configure
    path = durations_file(config) if config.getoption("moe_shards") == "auto" else None
    durations = schedule.read_durations(path) if path else {}
    return [(name, schedule.shards_for(name, durations, base)) for name in selected_adapters(config)]


def _drop_unparametrized(items: list[pytest.Item]) -> None:
    """The known-findings test where no selected adapter declares one: pytest's empty-parameter-set item, which
    would read as a skip in every session."""
    items[:] = [item for item in items if getattr(item, "originalname", None) != KNOWN_TEST
                or isinstance(getattr(getattr(item, "callspec", None), "params", {}).get("moe_known_adapter"), str)]


@pytest.fixture(scope="session")
def moe_device(request: pytest.FixtureRequest) -> Any:
    """The `DeviceInfo` this process verifies on (its own GPU under xdist)."""
    from harness.core.device import detect

    try:
        return detect(worker_device(request.config))
    except ValueError as e:
        raise pytest.UsageError(f"--moe-device: {e}") from None


@pytest.fixture(scope="session")
def moe_unverifiable() -> set[str]:
    """Interpreter features that could not be made faithful (cells depending on them are not-verifiable)."""
    from harness.engine.interpreter import unverifiable_here

    return unverifiable_here()


@pytest.fixture(scope="session")
def moe_profile(request: pytest.FixtureRequest) -> Any:
    """The hypothesis settings of the generic tests (never loaded globally: the repository's own profiles stay)."""
    from harness.engine.profiles import PROFILES, choose

    name = request.config.getoption("moe_profile")  # a known one: checked at configure
    return PROFILES[choose(name, request.config.getoption("hypothesis_profile", default=None),
                           os.environ.get("MOE_HARNESS_PROFILE"), os.environ.get("HYPOTHESIS_PROFILE"))]


@pytest.fixture(scope="session")
def moe_results(request: pytest.FixtureRequest) -> Any:
    """The results store of this process: one JSONL file per run and xdist worker."""
    from harness.store.results import ResultStore, new_run_id

    folder = request.config.getoption("moe_results_dir") or request.config.getini("moe_results_dir")
    store = ResultStore(folder, run_id=f"pytest-{_run_id() or new_run_id()}",
                        worker=os.environ.get("PYTEST_XDIST_WORKER"))
    # a fatal signal in a kernel (segfault, abort) is written next to the results: the case left pending names it
    store.directory.mkdir(parents=True, exist_ok=True)
    faults = open(store.fault_path, "w")
    faulthandler.enable(file=faults)
    yield store
    store.close()
    if sys.__stderr__ is not None:
        faulthandler.enable(file=sys.__stderr__)
    faults.close()
    if store.fault_path.stat().st_size == 0:
        store.fault_path.unlink()


def _run_id() -> str:
    """This session's results run id when a parent chose it: xdist's test-run uid (workers), or the supervising
    parent's (harness.plugin.supervise); empty otherwise."""
    from harness.plugin import supervise

    return supervise.run_id() or os.environ.get("PYTEST_XDIST_TESTRUNUID", "")[:12]


@pytest.hookimpl(tryfirst=True, specname="pytest_sessionfinish")
def pytest_sessionfinish_first(session: pytest.Session, exitstatus: int) -> None:
    """In an xdist worker whose tests are over: SIGINT is ignored from now on (see `_own_process`). In a session
    interrupted by Ctrl-C or SIGTERM that owns its process: its xdist workers and everything it started end now,
    before xdist's grace periods (seconds for each worker still in a test)."""
    config = session.config
    if not is_active(config):
        return
    if hasattr(config, "workerinput"):
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)
    elif _interrupted(exitstatus) and owns_process(config):
        from harness.core import stopping

        with stopping.uninterrupted():
            stopping.end_tree()


def _interrupted(exitstatus: int) -> bool:
    """Whether the session was cut short by Ctrl-C or a stop signal: its exit status says so, or, where the signal
    landed inside a lock's wait and pytest ended with an internal error instead, the signal was seen
    (`stopping.stop_requested`)."""
    from harness.core import stopping

    return exitstatus == pytest.ExitCode.INTERRUPTED or stopping.stop_requested() is not None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """On the xdist controller: the cases its crashed workers were judging get their error verdicts and case
    files (each worker left a `pending` record before running one); not when the session was interrupted."""
    config = session.config
    uid = getattr(config.option, "testrunuid", None)
    if hasattr(config, "workerinput") or not uid or not is_active(config):
        return
    from harness.store.results import resolve_pending

    reporter = config.pluginmanager.getplugin("terminalreporter")
    if _interrupted(exitstatus):
        # Ctrl-C (or SIGTERM) reached the workers too: what they were running was cut short by the user, not by a
        # kernel, so it stays without a verdict (not run) instead of becoming an error blamed on the kernel
        if reporter is not None:
            reporter.write_line("moe-harness: session interrupted; the cases that were running have no verdict")
        return
    folder = config.getoption("moe_results_dir") or config.getini("moe_results_dir")
    dead = resolve_pending(folder, f"pytest-{uid[:12]}", "an xdist worker died")
    for r in dead:
        if reporter is not None:
            reporter.write_line(f"moe-harness: {r.case.case_id} ({r.adapter}) recorded as error: {r.reason}")
    if dead and session.exitstatus == 0:
        session.exitstatus = 1
