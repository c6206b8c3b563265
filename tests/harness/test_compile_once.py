"""The compile-once Triton cache manager: a miss that another process (here: thread, each with its own lock file
description) is compiling waits for that compile and uses it; a compile that raised, or one that never ends, does not
keep its waiters forever; and the environment names it only where the user has not chosen otherwise."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from harness.engine import compile_once, compile_once_env

KEY = "VARIANTKEY"
GROUP = "kernel.json"


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    for k in compile_once.STATS:
        monkeypatch.setitem(compile_once.STATS, k, type(compile_once.STATS[k])())
    return tmp_path


def _compile(manager: compile_once.CompileOnceCacheManager) -> dict[str, str]:
    """What Triton's compile does after a miss: write the files, then their group."""
    group = {GROUP: manager.put('{"name": "kernel"}', GROUP, binary=False)}
    manager.put_group(GROUP, group)
    return group


def _lookup_in_thread(found: list) -> threading.Thread:
    t = threading.Thread(target=lambda: found.append(compile_once.CompileOnceCacheManager(KEY).get_group(GROUP)))
    t.start()
    return t


def test_a_second_lookup_waits_for_the_first_compile_and_uses_its_files() -> None:
    first = compile_once.CompileOnceCacheManager(KEY)
    assert first.get_group(GROUP) is None  # a miss: this one compiles, holding the variant's lock
    found: list = []
    waiter = _lookup_in_thread(found)
    time.sleep(0.3)
    assert waiter.is_alive() and not found, "the second lookup did not wait for the compile in progress"
    group = _compile(first)
    waiter.join(5)
    assert found == [group], "the waiter did not take the finished compile's files"
    assert compile_once.STATS["compiled"] == 1 and compile_once.STATS["waited"] == 1


def test_a_compile_that_raised_lets_its_waiter_compile_at_the_holders_next_lookup() -> None:
    first = compile_once.CompileOnceCacheManager(KEY)
    assert first.get_group(GROUP) is None  # then the compile raises: no put_group
    found: list = []
    waiter = _lookup_in_thread(found)
    time.sleep(0.2)
    assert waiter.is_alive()
    # the same thread's next lookup, of any variant, lets go of the lock of the compile that never finished
    assert compile_once.CompileOnceCacheManager("OTHERKEY").get_group(GROUP) is None
    waiter.join(5)
    assert found == [None], "the waiter should compile the variant itself"
    assert compile_once.STATS["compiled"] == 3


def test_a_compile_that_raised_lets_go_when_triton_drops_its_manager() -> None:
    """Triton makes one cache manager per compile; a compile that raises drops it without put_group, and the
    waiters go on at once (not at the holder's next lookup, which may come minutes later, or never)."""
    first = compile_once.CompileOnceCacheManager(KEY)
    assert first.get_group(GROUP) is None
    found: list = []
    waiter = _lookup_in_thread(found)
    time.sleep(0.2)
    assert waiter.is_alive()
    del first  # the compile raised: its frame, and the manager with it, are gone
    waiter.join(5)
    assert not waiter.is_alive() and found == [None], "the waiter should compile the variant itself, now"


def test_a_wait_never_outlasts_its_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compile_once, "WAIT_S", 0.5)
    holder = compile_once.CompileOnceCacheManager(KEY)
    assert holder.get_group(GROUP) is None  # held, still compiling
    found: list = []
    t0 = time.monotonic()
    _lookup_in_thread(found).join(10)
    assert found == [None] and time.monotonic() - t0 < 5
    assert compile_once.STATS["gave_up"] == 1
    holder.put_group(GROUP, {})


def test_a_hit_takes_no_lock(tmp_path: Path) -> None:
    manager = compile_once.CompileOnceCacheManager(KEY)
    assert manager.get_group(GROUP) is None
    group = _compile(manager)
    assert compile_once.CompileOnceCacheManager(KEY).get_group(GROUP) == group
    assert compile_once.STATS == {"compiled": 1, "waited": 0, "wait_s": 0.0, "gave_up": 0}


def test_the_environment_names_it_unless_the_user_chose() -> None:
    env: dict[str, str] = {}
    assert compile_once_env.install(env) and env["TRITON_CACHE_MANAGER"] == compile_once_env.SPEC
    mine = {"TRITON_CACHE_MANAGER": "my.cache:Manager"}
    assert not compile_once_env.install(mine) and mine["TRITON_CACHE_MANAGER"] == "my.cache:Manager"
    off = {"MOE_HARNESS_COMPILE_ONCE": "0"}
    assert not compile_once_env.install(off) and "TRITON_CACHE_MANAGER" not in off


def test_without_flock_triton_keeps_its_own_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where there is no fcntl (Windows), naming the manager would break every compile: it is not named."""
    monkeypatch.setitem(sys.modules, "fcntl", None)  # its import fails, as on Windows
    env: dict[str, str] = {}
    assert not compile_once_env.install(env) and "TRITON_CACHE_MANAGER" not in env


def test_triton_takes_the_named_class() -> None:
    """Triton resolves the environment's name to this class (its knob, or its older environment lookup)."""
    code = textwrap.dedent(f"""
        import os
        os.environ["TRITON_CACHE_MANAGER"] = {compile_once_env.SPEC!r}
        from triton.runtime.cache import get_cache_manager
        print(type(get_cache_manager("ab" * 32)).__name__)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "CompileOnceCacheManager", out.stderr[-2000:]


_CONCURRENT = textwrap.dedent("""
    import json, os, sys, time, torch, triton, triton.language as tl
    from harness.engine import compile_once

    @triton.jit
    def _add(x_ptr, TOKEN: tl.constexpr):
        tl.store(x_ptr + tl.arange(0, 16), tl.load(x_ptr + tl.arange(0, 16)) + TOKEN)

    x = torch.zeros(16, device="cuda")
    print("ready", flush=True)
    while not os.path.exists(sys.argv[2]):  # all start compiling at once
        time.sleep(0.001)
    _add[(1,)](x, TOKEN=int(sys.argv[1]))
    torch.cuda.synchronize()
    print(json.dumps(compile_once.STATS))
""")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a real Triton compile needs a GPU")
def test_processes_compiling_one_new_variant_at_once_compile_it_once(tmp_path: Path) -> None:
    import json
    import os
    import random

    token = random.randrange(1, 2**30)  # a variant no cache has seen
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "cache"), "TRITON_CACHE_MANAGER": compile_once_env.SPEC,
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
    go, script = tmp_path / "go", tmp_path / "compile_one.py"
    script.write_text(_CONCURRENT)  # a file: triton.jit reads the kernel's source
    procs = [subprocess.Popen([sys.executable, str(script), str(token), str(go)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for p in procs:
        assert p.stdout is not None
        if p.stdout.readline().strip() != "ready":
            go.touch()
            raise AssertionError(p.communicate(timeout=60)[1][-3000:])
    go.touch()
    stats = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        stats.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(s["compiled"] for s in stats) == 1, stats


def test_a_variant_in_the_trusted_folder_is_loaded_from_there_not_compiled(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A host of another family (its own folder empty) finds a variant this repository's adapters' hosts compiled in
    their folder (`family_cache`) and takes no lock, compiles nothing, writes nothing there."""
    from harness.engine import family_cache

    trusted = tmp_path / "cache" / "family-own"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(trusted))
    group = _compile(compile_once.CompileOnceCacheManager(KEY))  # compiled by one of its hosts
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache" / "family-other"))
    assert compile_once.TRUSTED_ENV == family_cache.TRUSTED_ENV
    monkeypatch.delenv(compile_once.TRUSTED_ENV, raising=False)
    assert compile_once.CompileOnceCacheManager(KEY).get_group(GROUP) is None  # not trusted: compiled again
    compile_once._release(threading.get_ident())
    monkeypatch.setenv(compile_once.TRUSTED_ENV, str(trusted))
    before = sorted(p.name for p in (trusted / KEY).iterdir())
    assert compile_once.CompileOnceCacheManager(KEY).get_group(GROUP) == group
    assert sorted(p.name for p in (trusted / KEY).iterdir()) == before  # no lock file made there
    assert compile_once.STATS["compiled"] == 1 and compile_once.STATS["waited"] == 0  # the untrusted miss only
