"""`bench/vs_trl.py`: `--setup` needs nothing in the launching environment beyond rllib_dph's own
requirements, and the TRL environment defaults to the user's cache; the benchmark itself is not run here."""

import importlib.metadata
import os
import pathlib
import sys

import pytest


def test_setup_commands_need_only_rllib_dph_requirements_here(monkeypatch, load_script):
    vs_trl = load_script("bench/vs_trl")
    real_version = importlib.metadata.version
    looked_up = []

    def version(name):  # the launching environment of a user: rllib_dph's requirements only
        looked_up.append(name)
        if name not in {"torch", "transformers", "gymnasium"}:
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    commands = vs_trl.setup_commands("/tmp/trl-venv")
    install = commands[-1]
    assert f"accelerate=={vs_trl.ACCELERATE_VERSION}" in install
    assert f"trl=={vs_trl.TRL_VERSION}" in install and f"datasets=={vs_trl.DATASETS_VERSION}" in install
    assert f"transformers=={real_version('transformers')}" in install
    assert set(looked_up) == {"torch", "transformers", "gymnasium"}
    assert commands[0][1:] == ["-m", "venv", "/tmp/trl-venv"]


def test_the_default_environment_is_in_the_users_cache_and_a_missing_one_names_the_fix(monkeypatch, load_script,
                                                                                     tmp_path):
    vs_trl = load_script("bench/vs_trl")
    assert vs_trl.DEFAULT_VENV.endswith("rllib_dph/trl-venv")
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    assert pathlib.Path(vs_trl.DEFAULT_VENV).parent.parent == cache
    missing = tmp_path / "no-venv"
    monkeypatch.setattr(sys, "argv", ["bench/vs_trl.py", "--venv", str(missing)])
    with pytest.raises(SystemExit, match=f"no TRL environment at --venv {missing} .*"
                                         f"`python bench/vs_trl.py --setup --venv {missing}` first"):
        vs_trl.main()
