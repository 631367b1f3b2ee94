"""A checkpoint whose class_and_ctor_args.pkl (the first file RLlib unpickles) is damaged is refused
naming the file and the newest intact checkpoint of its trial, before RLlib reads it: by
``rllib train --from-checkpoint`` and by ``GRPO.from_checkpoint``."""

import json
import shutil

import pytest

from rllib_dph.algorithms.checkpoints import CheckpointError
from rllib_dph.algorithms.grpo import GRPO
from rllib_dph.cli.experiments import PREFLIGHT_EXIT_CODE
from rllib_dph.cli.main import main
from test_checkpoint_integrity import trial  # noqa: F401  (the module-scoped trial fixture)

CTOR_ARGS = "class_and_ctor_args.pkl"


def _truncated_ctor_args(trial_dir, tmp_path, *names):  # noqa: F811
    """A copy of the trial folder with the class_and_ctor_args.pkl of the checkpoints ``names`` cut in half."""
    copy = shutil.copytree(trial_dir, tmp_path / "trial")
    for name in names:
        pkl = copy / name / CTOR_ARGS
        pkl.write_bytes(pkl.read_bytes()[: pkl.stat().st_size // 2])
    return copy


def test_python_from_checkpoint_names_the_file_and_the_intact_checkpoint(trial, tmp_path):  # noqa: F811
    copy = _truncated_ctor_args(trial, tmp_path, "checkpoint_000002")
    bad, good = copy / "checkpoint_000002", copy / "checkpoint_000001"
    with pytest.raises(CheckpointError) as error:
        GRPO.from_checkpoint(str(bad))
    message = str(error.value)
    assert f"{bad} is incomplete or damaged" in message and CTOR_ARGS in message
    assert f"Restore the newest intact checkpoint of its trial instead: {good}" in message


def test_cli_from_checkpoint_refuses_naming_the_file(trial, tmp_path, capsys, without_ray):  # noqa: F811
    copy = _truncated_ctor_args(trial, tmp_path, "checkpoint_000001", "checkpoint_000002")
    bad = copy / "checkpoint_000002"
    config = {"model_name": "tiny-random", "max_response_length": 8, "env_config": {"data": "sql_synth/test"}}
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--algo", "GRPO", "--env", "rllib_dph/SQL-v0", "--config", json.dumps(config),
              "--storage-path", str(tmp_path / "runs"), "--from-checkpoint", str(bad)])
    assert exit_info.value.code == PREFLIGHT_EXIT_CODE
    err = capsys.readouterr().err
    assert f"--from-checkpoint: {bad} is incomplete or damaged" in err and CTOR_ARGS in err
    assert "Traceback" not in err
