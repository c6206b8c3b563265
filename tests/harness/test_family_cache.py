"""Each kind of kernel host has its own folder of the Triton cache (harness.engine.family_cache)."""

from __future__ import annotations

import os
from pathlib import Path

from harness.engine import family_cache


def test_families_get_folders_of_their_own_under_the_machines_cache(tmp_path: Path) -> None:
    env = {"TRITON_CACHE_DIR": str(tmp_path / "cache")}
    own, lib = family_cache.folder(env, "own"), family_cache.folder(env, "library:vllm")
    assert own != lib and Path(own).parent == Path(lib).parent == tmp_path / "cache"
    assert family_cache.folder(env, "own") == own
    host_env = dict(env)
    assert family_cache.assign(host_env, "own") == own and os.path.isdir(own)
    assert host_env["TRITON_CACHE_DIR"] == own and host_env[family_cache.ROOT_ENV] == str(tmp_path / "cache")
    # a host's environment names the machine's cache as the root: a folder is never made inside another one
    assert family_cache.folder(host_env, "library:vllm") == lib


def test_without_a_cache_folder_named_it_is_tritons_default() -> None:
    env = {"HOME": "/home/someone"}
    assert family_cache.root(env) == "/home/someone/.triton/cache"
    assert family_cache.root({**env, "TRITON_HOME": "/elsewhere"}) == "/elsewhere/.triton/cache"
