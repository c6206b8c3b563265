"""A kernel host sealed by the operating system (harness.engine.sandbox): a process a kernel starts in a new session
dies with its run and its host, the checkout and the results folders are read-only to kernels, a host's
output goes to its log, not the judge's console. Where the OS refuses namespaces the tests that need them skip, after
checking that the refusal is said once and the hosts run as before.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from harness.core.case import Case
from harness.core.device import detect
from harness.engine import arena as arena_mod
from harness.engine import host as host_mod
from harness.engine import remote, runner, sandbox
from harness.engine.host import Host, HostDied
from tests.harness.fixtures.escaping_adapters import ESCAPE_SLEEP_S, LINGER_S

FIXTURE = "tests.harness.fixtures.escaping_adapters"
ROOT = Path(__file__).resolve().parents[2]
CASE = Case(op="activation", adapter="x", features={"activation": "silu_and_mul", "dtype": "float32"},
            shapes={"T": 4, "N": 24}, dtypes={"x": "float32"}, seed=1)
#: how long the escaped processes of the test that turns the judge's kill off wait before they write
LONG_SLEEP_S = 3.0
#: starts two hosts in a new judge process and says whether both answered
TWO_HOSTS = ("from harness.engine.host import Host\n"
             "if __name__ == '__main__':\n"
             "    hosts = [Host('cpu'), Host('cpu')]\n"
             "    for h in hosts: h.ready()\n"
             "    print('answered', sum(h.alive() for h in hosts))\n"
             "    for h in hosts: h.close()\n")


_FALLBACK_SEEN: list[bool] = []


def _judge_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (sandbox.PROBED_ENV, sandbox.ENV)}
    return {**env, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])}


def _require_sandbox() -> None:
    """Skip where the OS refuses namespaces, once it is seen that the refusal is said once and hosts still run."""
    if sandbox.availability().ok:
        return
    if not _FALLBACK_SEEN:
        done = subprocess.run([sys.executable, "-c", TWO_HOSTS], cwd=ROOT, env=_judge_env(), capture_output=True,
                              text=True, timeout=300)
        said = [line for line in done.stderr.splitlines() if "kernel hosts: not sandboxed" in line]
        assert len(said) == 1 and "answered 2" in done.stdout, (done.stdout, done.stderr)
        _FALLBACK_SEEN.append(True)
    pytest.skip(f"the OS refuses the kernel host's namespaces: {sandbox.availability().reason}")


@pytest.fixture
def targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A results folder holding a verdict, a lock folder, a would-be mark in the checkout; the hosts started in the
    test see them (and the results folder is protected, as a sweep or the pytest plugin protects theirs)."""
    results, locks = tmp_path / "results", tmp_path / "locks"
    locks.mkdir()
    mark = ROOT / f".hostile-mark-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("HOSTILE_RESULTS", str(results))
    monkeypatch.setenv("HOSTILE_LOCKS", str(locks))
    monkeypatch.setenv("HOSTILE_CHECKOUT_MARK", str(mark))
    monkeypatch.setenv(sandbox.READONLY_ENV, os.environ.get(sandbox.READONLY_ENV, ""))
    sandbox.protect(results)
    verdicts = results / "run-main.jsonl"
    verdicts.write_text('{"verdict": "fail"}\n')
    try:
        yield results, locks, mark
    finally:  # a test that failed may have left its escaped processes running: let them end before the cleanup
        deadline = time.monotonic() + LONG_SLEEP_S + LINGER_S + 1.0
        while time.monotonic() < deadline and [f for f in locks.iterdir() if _held(f)]:
            time.sleep(0.1)
        mark.unlink(missing_ok=True)


def _held(lock: Path) -> bool:
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _untouched(results: Path, mark: Path) -> None:
    assert sorted(p.name for p in results.iterdir()) == ["run-main.jsonl"], sorted(results.iterdir())
    assert (results / "run-main.jsonl").read_text() == '{"verdict": "fail"}\n'
    assert not mark.exists(), f"a kernel wrote {mark}"


def test_a_grandchild_in_a_new_session_dies_with_the_run_and_writes_nothing(targets) -> None:  # type: ignore[no-untyped-def]
    _require_sandbox()
    results, locks, mark = targets
    spec = f"{FIXTURE}:ESCAPE"
    try:
        r = runner.judge(CASE, remote.open_adapter(spec, "cpu"), detect("cpu"))
        time.sleep(ESCAPE_SLEEP_S + 0.8)  # past the escaped processes' sleep: had one lived, it has written by now
        assert r.verdict == "pass", r.reason
        escaped = list(locks.iterdir())
        assert escaped, "the kernel started no process"
        assert not [f.name for f in escaped if _held(f)], "a process the kernel started outlived its run"
        _untouched(results, mark)
    finally:
        remote.close_adapter(spec, "cpu")


def test_every_process_of_the_namespace_dies_with_its_host(targets, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Not the judge's kill after each run, but the operating system's: with that kill turned off, the processes a
    kernel left behind end when their host is killed."""
    _require_sandbox()
    _, locks, _ = targets
    monkeypatch.setattr(Host, "sweep_children", lambda self: 0)
    monkeypatch.setenv("HOSTILE_SLEEP_S", str(LONG_SLEEP_S))
    spec = f"{FIXTURE}:ESCAPE"
    adapter = remote.open_adapter(spec, "cpu")
    try:
        assert runner.judge(CASE, adapter, detect("cpu")).verdict == "pass"
        assert [f for f in locks.iterdir() if _held(f)], "no process of the kernel's was left running"
        assert adapter.host is not None
        adapter.host.kill()
        time.sleep(0.5)
        assert not [f.name for f in locks.iterdir() if _held(f)], "a process of the kernel's outlived its host"
    finally:
        remote.close_adapter(spec, "cpu")


def test_a_kernel_cannot_write_into_the_results_or_the_checkout(targets) -> None:  # type: ignore[no-untyped-def]
    _require_sandbox()
    results, _, mark = targets
    _write_refused("WRITE")
    _untouched(results, mark)


def _write_refused(kernel: str) -> None:
    """Judge the fixture `kernel` in a kernel host of its own: its write is refused (an error verdict naming it)."""
    spec = f"{FIXTURE}:{kernel}"
    try:
        r = runner.judge(CASE, remote.open_adapter(spec, "cpu"), detect("cpu"))
    finally:
        remote.close_adapter(spec, "cpu")
    assert r.verdict == "error" and "Read-only file system" in r.reason, (r.verdict, r.reason)


def test_a_kernel_cannot_write_another_familys_compiled_kernels(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Each kind of host compiles into its family's folder of the Triton cache (`family_cache`); the root and the
    other families' folders are read-only to it, so a kernel cannot plant a compiled kernel another adapter loads."""
    _require_sandbox()
    from harness.engine import family_cache

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    other = Path(family_cache.assign(dict(os.environ), remote.OWN_FAMILY))
    report = tmp_path / "report"
    monkeypatch.setenv("HOSTILE_OTHER", str(other))
    monkeypatch.setenv("HOSTILE_REPORT", str(report))
    _write_refused("POISON_CACHE")
    own = Path(report.read_text())
    assert own.parent == tmp_path / "triton" and own != other and (own / "own-variant").read_text() == "compiled"
    assert not list(other.iterdir())


def test_a_kernel_cannot_have_the_fork_server_start_a_process_outside_its_host(  # type: ignore[no-untyped-def]
        targets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host is forked from a fork server and inherits its address: the server's children run in the judge's
    namespaces, where the results folder is writable. Its socket's folder is covered in the host's mount namespace."""
    _require_sandbox()
    results, _, mark = targets
    report = tmp_path / "report"
    monkeypatch.setenv("HOSTILE_REPORT", str(report))
    found = _spy("THROUGH_FORK_SERVER", report)
    assert found.startswith("refused: FileNotFoundError"), found
    _untouched(results, mark)


def test_a_kernel_cannot_plant_code_the_judges_later_processes_would_run(  # type: ignore[no-untyped-def]
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module written into site-packages or the Python prefix, or bytecode and remembered answers written into the
    caches only judges write, would be run or believed by a judge process started later in the run, outside the
    host: all are read-only inside it."""
    _require_sandbox()
    report = tmp_path / "report"
    monkeypatch.setenv("HOSTILE_REPORT", str(report))
    found = _spy("PLANT_CODE", report).splitlines()
    assert len(found) >= 3 and all(line.endswith("refused (OSError)") for line in found), found


def test_the_sandbox_check_proves_the_fork_servers_socket_is_out_of_reach() -> None:
    """`python -m harness.engine.sandbox_check` (what a user runs on a new machine, a GPU's included) says so too."""
    _require_sandbox()
    done = subprocess.run([sys.executable, "-m", "harness.engine.sandbox_check"], cwd=ROOT, env=_judge_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "the fork server's socket folder covered inside: yes" in done.stdout, \
        done.stdout[-2000:] + done.stderr[-2000:]


def test_a_kernels_output_goes_to_its_hosts_log_not_the_judges_console(tmp_path: Path) -> None:
    token = uuid.uuid4().hex
    script = ("from harness.core.device import detect\n"
              "from harness.engine import remote, runner\n"
              "from tests.harness.test_sandbox import CASE\n"
              "if __name__ == '__main__':\n"
              f"    a = remote.open_adapter('{FIXTURE}:LOUD', 'cpu')\n"
              "    r = runner.judge(CASE, a, detect('cpu'))\n"
              "    log = open(a.host.log).read()\n"
              f"    print('verdict', r.verdict, 'logged', log.count('{token} on std'))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={**_judge_env(), "HOSTILE_TOKEN": token},
                          capture_output=True, text=True, timeout=300)
    assert token not in done.stdout + done.stderr, (done.stdout, done.stderr)
    counts = [line for line in done.stdout.splitlines() if line.startswith("verdict")]
    assert counts and counts[0].startswith("verdict pass logged") and int(counts[0].split()[-1]) >= 2, done.stdout


def test_a_host_death_quotes_the_end_of_its_log(monkeypatch: pytest.MonkeyPatch) -> None:
    token = uuid.uuid4().hex
    monkeypatch.setenv("HOSTILE_TOKEN", token)
    spec = f"{FIXTURE}:LAST_WORDS"
    try:
        r = runner.judge(CASE, remote.open_adapter(spec, "cpu"), detect("cpu"))
    finally:
        remote.close_adapter(spec, "cpu")
    assert r.verdict == "error" and "killed by SIGKILL" in r.reason, r.reason
    assert f"{token} last words" in r.reason, r.reason


def test_the_host_runs_in_namespaces_of_its_own() -> None:
    """Seen from outside, as the self-test shows it: another pid namespace, the checkout mounted read-only."""
    _require_sandbox()
    host = Host("cpu")
    try:
        host.ready()
        pid = host.worker_pid()
        assert pid is not None and pid != host.proc.pid
        assert os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
        mounts = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
        checkout = [m.split() for m in mounts if m.split()[4] == str(ROOT)]
        assert checkout and "ro" in checkout[-1][5].split(","), checkout
        ours = Path("/proc/self/mountinfo").read_text().splitlines()
        shm = [[m.split()[2] for m in lines if m.split()[4] == "/dev/shm"] for lines in (mounts, ours)]
        assert shm[0] == shm[1]  # the arena's file system is the judge's
    finally:
        host.close()


def _refused(monkeypatch: pytest.MonkeyPatch, setting: str) -> None:
    monkeypatch.setenv(sandbox.ENV, setting)
    monkeypatch.delenv(sandbox.PROBED_ENV, raising=False)
    monkeypatch.setattr(sandbox, "_FOUND", None)
    monkeypatch.setattr(sandbox, "_probe", lambda: sandbox.Availability("", "refused for the test"))


def test_where_namespaces_are_refused_it_is_said_once_and_hosts_run_as_before(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _refused(monkeypatch, "auto")
    hosts = [Host("cpu"), Host("cpu")]
    try:
        for h in hosts:
            h.ready()
            assert h.alive() and not h.sandboxed and h.worker_pid() == h.proc.pid
    finally:
        for h in hosts:
            h.close()
    said = [line for line in capsys.readouterr().err.splitlines() if "not sandboxed" in line]
    assert said == [f"moe-harness: kernel hosts: not sandboxed: refused for the test ({sandbox.ENV}=off: run so "
                    "without this note; =on: refuse to)"], said
    assert sandbox.describe() == "kernel hosts: not sandboxed: refused for the test"


def test_on_refuses_to_start_an_unsandboxed_host(monkeypatch: pytest.MonkeyPatch) -> None:
    _refused(monkeypatch, "on")
    with pytest.raises(HostDied, match=f"{sandbox.ENV}=on: kernel hosts cannot be sandboxed here: refused for the"):
        Host("cpu").ready()


def test_a_setting_that_is_not_one_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sandbox.ENV, "yes")
    with pytest.raises(ValueError, match=f"{sandbox.ENV}='yes': expected one of auto, on, off"):
        host_mod.Host("cpu").start()


def _spy(name: str, report: Path) -> str:
    """Judges the spying kernel `name` of the fixture; what it reported."""
    spec = f"{FIXTURE}:{name}"
    try:
        r = runner.judge(CASE, remote.open_adapter(spec, "cpu"), detect("cpu"))
    finally:
        remote.close_adapter(spec, "cpu")
    assert r.verdict == "pass", r.reason
    assert report.exists(), "the kernel reported nothing"
    return report.read_text()


@pytest.mark.parametrize("where", ["named", "default-made-later", "in-the-temporary-folder"])
def test_a_kernel_cannot_read_the_manifest_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """The key signs results: a kernel that read it could sign the ones it forges. Named by MOE_HARNESS_KEY_FILE and
    made before the host starts, at its default place (under XDG_CONFIG_HOME) and made once the host runs, or named
    in a folder the host writes (the temporary folder: the key file alone is covered)."""
    report, secret = tmp_path / "report", "a1" * 32
    if where != "default-made-later":
        folder = tmp_path / "keys" if where == "named" else Path(tempfile.gettempdir())
        key = folder / f"key-{uuid.uuid4().hex[:8]}"
        folder.mkdir(mode=0o700, exist_ok=True)
        key.write_text(secret)
        monkeypatch.setenv("MOE_HARNESS_KEY_FILE", str(key))
    else:
        key = tmp_path / "config" / "moe-harness" / "key"
        monkeypatch.delenv("MOE_HARNESS_KEY_FILE", raising=False)
        monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("HOSTILE_REPORT", str(report))
    spec = f"{FIXTURE}:READ_KEY"
    adapter = remote.open_adapter(spec, "cpu")
    try:
        if not key.exists():
            key.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            key.write_text(secret)
        assert runner.judge(CASE, adapter, detect("cpu")).verdict == "pass"
    finally:
        remote.close_adapter(spec, "cpu")
        found, kept = report.read_text(), key.read_text()
        if where == "in-the-temporary-folder":
            key.unlink()
    assert kept == secret  # the judge still reads it
    _require_sandbox()
    assert secret not in found and (found == "" or found.startswith("unreadable")), found


@pytest.mark.parametrize("arena_file", ["memfd", "shared-memory-file"])
def test_no_mapping_of_a_kernels_host_names_the_harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         arena_file: str) -> None:
    """A kernel that looks for a sign of being judged in its memory map (its arena's name) finds none, whether the
    arena is a memfd or (where memfds cannot be sealed) an unlinked file in shared memory; the files of the checkout
    itself (an extension a kernel loads from it) and of the user's Python environment (a venv named after the tool)
    are no sign the judge adds."""
    if arena_file != "memfd":
        monkeypatch.setattr(arena_mod, "_sealable", lambda: False)
    monkeypatch.setenv("HOSTILE_REPORT", str(tmp_path / "report"))
    theirs = {str(ROOT), sys.prefix, sys.base_prefix, sys.exec_prefix}
    found = [line for line in _spy("READ_MAPS", tmp_path / "report").splitlines()
             if not any(f" {where}/" in line or line.endswith(f" {where}") for where in theirs)]
    assert not found, found
