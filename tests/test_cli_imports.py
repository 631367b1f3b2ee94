"""`--import` of user modules, and a user's own `envs/` folder beside `rllib_dph.envs`."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rllib_dph.cli.imports import import_user_modules

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


SHADOW_CHECK = textwrap.dedent(
    """
    import envs  # the user's own package, first on sys.path (the working directory)
    assert envs.OWNER == "user", envs.__file__
    import gymnasium as gym
    import rllib_dph.envs

    env = gym.make("rllib_dph/SQL-v0", data="sql_synth/test[:1]")
    env.reset(options={"index": 0})
    gold = env.unwrapped.tasks[0].ground_truth["gold_sql"]
    rllib_dph.envs.register_verifier_env(
        "user/Echo-v0", verifier=lambda completion, answer: completion == answer,
        data=[{"question": "echo", "answer": "echo"}], prompt_format="{question}",
    )
    echo = gym.make("user/Echo-v0")
    echo.reset(options={"index": 0})
    print(rllib_dph.envs.__name__, env.step("```sql\\n" + gold + "\\n```")[1], echo.step("echo")[1])
    """
)


def test_a_user_envs_package_does_not_shadow_rllib_dph_envs(tmp_path):
    """The cause of the old shadowing is gone: with the user's `envs/` first on sys.path (a
    package that is not ours), `rllib_dph.envs` still imports, its SQL env scores a step and a
    verifier env registers."""
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "__init__.py").write_text("OWNER = 'user'\nregister_verifier_env = None\n")
    out = subprocess.run([sys.executable, "-c", SHADOW_CHECK], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["rllib_dph.envs", "1.0", "1.0"]


def test_import_errors_name_the_module(tmp_path):
    with pytest.raises(SystemExit, match="--import no_such_module_xyz: ModuleNotFoundError"):
        import_user_modules(["no_such_module_xyz"], str(tmp_path))


@pytest.mark.slow
def test_rllib_train_with_a_user_env_from_a_project_with_its_own_envs_folder(user_project):
    """The issue's `--env myorg/Reverse-v0` case, run from a folder with an `envs/` package of its
    own (first on sys.path in the driver and in Ray workers; it is never imported)."""
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
