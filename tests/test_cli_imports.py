"""`--import` of user modules, and a user's own `envs/` folder not shadowing the package's envs."""

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from rllib_dph.imports import ensure_package_envs, import_user_modules

REPO = Path(__file__).resolve().parents[1]

USER_MODULE = textwrap.dedent(
    """
    import rllib_dph.envs

    def exact_match(completion, answer):
        return completion.strip() == answer

    rllib_dph.envs.register_verifier_env(
        "myorg/Reverse-v0",
        verifier=exact_match,
        data=[{"question": w, "answer": w[::-1]} for w in ["abc", "hello", "rllib", "ray"]],
        prompt_format="Reverse the string: {question}",
    )
    """
)


@pytest.fixture
def user_project(tmp_path):
    """A user's project folder: its own `envs/` package (which must not shadow ours) and a module
    registering an env."""
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "__init__.py").write_text("raise ImportError('the user envs package was imported')\n")
    (tmp_path / "reverse_env.py").write_text(USER_MODULE)
    return tmp_path


def test_ensure_package_envs_returns_ours():
    envs = ensure_package_envs()
    assert Path(envs.__file__).parent == REPO / "rllib_dph" / "envs"
    assert "rllib_dph/SQL-v0" in envs.registered_env_ids()


def test_import_errors_name_the_module(tmp_path):
    with pytest.raises(SystemExit, match="--import no_such_module_xyz: ModuleNotFoundError"):
        import_user_modules(["no_such_module_xyz"], str(tmp_path))


def test_rllib_train_with_a_user_env_from_a_project_with_its_own_envs_folder(user_project):
    """The issue's `--env myorg/Reverse-v0` case, run from a folder whose `envs/` would shadow ours
    (in the driver and in Ray workers, which put the launch folder first on sys.path)."""
    cmd = [
        sys.executable, "-m", "rllib_dph.cli", "train", "--algo", "GRPO", "--env", "myorg/Reverse-v0",
        "--import", "reverse_env",
        "--config", json.dumps({"model_name": "tiny-random", "max_response_length": 8, "group_size": 2,
                                "prompts_per_step": 2, "num_env_runners": 1}),
        "--stop", json.dumps({"training_iteration": 2}), "--storage-path", "runs", "--name", "reverse",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=user_project,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    lines = out.stdout.splitlines()
    assert [line.split()[:2] for line in lines if line.startswith("iter")] == [["iter", "1"], ["iter", "2"]]
    assert all("reward" in line and "tok/s" in line for line in lines if line.startswith("iter"))
    assert "Configuration for experiment" not in out.stdout and "Trial status" not in out.stdout
    assert (user_project / "runs" / "reverse").is_dir()  # the relative storage path, from the launch folder
