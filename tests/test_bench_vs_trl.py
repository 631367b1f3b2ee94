"""`bench/vs_trl.py --setup` needs nothing in the launching environment beyond rllib_dph's own
requirements (it failed there without `accelerate`); the benchmark itself is not run here."""

import importlib.metadata


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
