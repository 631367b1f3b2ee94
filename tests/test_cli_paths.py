"""Every `rllib` subcommand takes relative paths, as a new user types them.

One flow from a fresh folder: `rllib train file exp.py --storage-path runs` (which checkpoints at
the end by default), `--resume` with a larger stop (refused, naming `--from-checkpoint`),
`--from-checkpoint` (continues the iteration count), then `evaluate`, `export`, `build-model` and
`presample` on the relative paths that the earlier steps wrote.
"""

import json
import os
from pathlib import Path

import pytest

from rllib_dph.cli.main import main
from rllib_dph.models.hub import absolute_if_path

TUNED_EXAMPLE = """
from rllib_dph.algorithms.grpo import GRPOConfig

config = (
    GRPOConfig()
    .environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/test"})
    .llm(model_name="tiny-random", max_response_length=8)
    .training(group_size=2, prompts_per_step=2)
    .env_runners(num_env_runners=1)
)
stop = {"training_iteration": 1}
"""


def test_paths_are_made_absolute_and_names_are_left_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt").mkdir()
    assert absolute_if_path("ckpt") == str(tmp_path / "ckpt")  # an existing relative folder
    assert absolute_if_path("./missing") == str(tmp_path / "missing")
    assert absolute_if_path("~/m") == os.path.expanduser("~/m")
    assert absolute_if_path("tiny-random") == "tiny-random"  # a bundled name
    assert absolute_if_path("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"  # a Hugging Face id


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A user's folder after `rllib train file exp.py --storage-path runs --name exp1` (1 iteration).

    Ray is started by `rllib train` as for a user, and shut down after this module when it started
    here (tests/test_cli_prepare.py checks that preparation runs without Ray).
    """
    import ray

    started_here = not ray.is_initialized()
    folder = tmp_path_factory.mktemp("project")
    (folder / "exp.py").write_text(TUNED_EXAMPLE)
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        main(["train", "file", "exp.py", "--storage-path", "runs", "--name", "exp1"])
        yield folder
    finally:
        os.chdir(cwd)
        if started_here:
            ray.shutdown()


def _checkpoints(folder: Path, experiment: str) -> list[Path]:
    return sorted(folder.glob(f"runs/{experiment}/*/checkpoint_*"))


def _relative(path: Path, folder: Path) -> str:
    return str(path.relative_to(folder))


def test_train_checkpoints_at_the_end_by_default(project):
    checkpoints = _checkpoints(project, "exp1")
    assert len(checkpoints) == 1 and (checkpoints[0] / "rllib_checkpoint.json").is_file()


def test_resume_of_a_finished_run_with_a_larger_stop_says_what_to_do(project, monkeypatch, capsys):
    monkeypatch.chdir(project)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "file", "exp.py", "--storage-path", "runs", "--name", "exp1", "--resume",
              "--stop", json.dumps({"training_iteration": 2})])
    assert exit_info.value.code == 2  # refused before Ray starts
    message = capsys.readouterr().err
    assert 'is not the stop {"training_iteration": 1} that' in message
    assert f"--from-checkpoint {_checkpoints(project, 'exp1')[0]}" in message


def test_from_checkpoint_trains_a_finished_run_further(project, monkeypatch, capsys):
    monkeypatch.chdir(project)
    checkpoint = _relative(_checkpoints(project, "exp1")[0], project)
    main(["train", "file", "exp.py", "--storage-path", "runs", "--name", "exp2", "--from-checkpoint", checkpoint,
          "--stop", json.dumps({"training_iteration": 2})])
    out = capsys.readouterr().out
    iterations = [line.split()[1] for line in out.splitlines() if line.startswith("iter")]
    assert iterations == ["2"]  # one iteration trained, counted on from the checkpoint's
    (final,) = _checkpoints(project, "exp2")
    # The end of the run names its final checkpoint and the commands that evaluate it and train it further.
    assert f"rllib: final checkpoint {final}\n" in out
    assert f"  evaluate it:          rllib evaluate {final} --env rllib_dph/SQL-v0 --env-config " \
           "'{\"data\": \"sql_synth/test\"}'\n" in out
    assert ("  train it further, e.g. to iteration 4: rllib train file exp.py --storage-path runs "
            f"--from-checkpoint {final} --stop '{{\"training_iteration\": 4}}' --name exp2_more\n") in out


def test_a_from_checkpoint_that_is_not_a_checkpoint_is_refused(project, monkeypatch, capsys):
    monkeypatch.chdir(project)
    with pytest.raises(SystemExit):
        main(["train", "file", "exp.py", "--storage-path", "runs", "--name", "exp3", "--from-checkpoint", "runs"])
    assert "is not an Algorithm checkpoint (no rllib_checkpoint.json)" in capsys.readouterr().err


def test_evaluate_and_export_a_relative_checkpoint(project, monkeypatch):
    monkeypatch.chdir(project)
    checkpoint = _relative(_checkpoints(project, "exp1")[0], project)
    main(["evaluate", checkpoint, "--env-config", json.dumps({"data": "sql_synth/test"}), "--n", "2", "--limit", "2",
          "--max-new-tokens", "8", "--no-greedy", "--out", "eval"])
    settings = json.loads((project / "eval" / "results.json").read_text())["settings"]
    assert settings["policy"] == str(project / checkpoint) and settings["name"] == checkpoint  # label as typed
    main(["export", checkpoint, "my-policy"])
    assert (project / "my-policy" / "config.json").is_file()


def test_build_model_and_presample_take_a_relative_model_folder(project, monkeypatch, capsys):
    monkeypatch.chdir(project)
    if not (project / "my-policy").is_dir():
        main(["export", _relative(_checkpoints(project, "exp1")[0], project), "my-policy"])
    capsys.readouterr()
    main(["build-model", "my-policy"])
    assert capsys.readouterr().out.strip() == str(project / "my-policy")
    (project / "math.jsonl").write_text("\n".join(
        json.dumps({"data_source": "math", "prompt": [{"role": "user", "content": f"What is 2+{i}?"}],
                    "reward_model": {"ground_truth": str(2 + i)}, "id": i})
        for i in range(2)
    ))
    main(["presample", "--model", "my-policy", "--env", "rllib_dph/Math-v0", "--env-config",
          json.dumps({"data": "math.jsonl"}), "--out", "pre", "--k", "2", "--min-correct", "1",
          "--max-response-length", "8"])
    assert f"files in {project / 'pre'}" in capsys.readouterr().out
    assert any((project / "pre").iterdir())
