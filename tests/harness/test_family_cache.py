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


def test_without_a_cache_folder_named_it_is_tritons_default(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path / "home")}
    assert family_cache.root(env) == str(tmp_path / "home" / ".triton" / "cache")
    elsewhere = str(tmp_path / "elsewhere")
    assert family_cache.root({**env, "TRITON_HOME": elsewhere}) == str(Path(elsewhere) / ".triton" / "cache")


def test_every_other_family_reads_this_repositorys_folder_before_it_compiles(tmp_path: Path) -> None:
    env = {"TRITON_CACHE_DIR": str(tmp_path / "cache")}
    other, own = dict(env), dict(env)
    family_cache.assign(other, "library:vllm")
    family_cache.assign(own, family_cache.OWN)
    assert other[family_cache.TRUSTED_ENV] == own["TRITON_CACHE_DIR"] == family_cache.folder(env, family_cache.OWN)
    assert family_cache.TRUSTED_ENV not in own


def test_a_cache_folder_that_cannot_be_made_leaves_the_environment_as_it_was(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    env = {"TRITON_CACHE_DIR": str(blocked / "cache")}
    assert family_cache.assign(env, "own") is None and env == {"TRITON_CACHE_DIR": str(blocked / "cache")}
