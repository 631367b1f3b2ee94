"""`rllib evaluate` on a policy it cannot load says so in one line naming the path and what it
expected (exit 2). No model is loaded here."""

import pytest

from rllib_dph.cli import main
from rllib_dph.experiments import PREFLIGHT_EXIT_CODE

EXPECTED = "expected an Algorithm checkpoint folder (a trial's checkpoint_00000N, holding rllib_checkpoint.json)"


def _refusal(capsys, policy: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["evaluate", policy, "--n", "2", "--limit", "1"])
    assert exit_info.value.code == PREFLIGHT_EXIT_CODE
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err  # one line
    return captured.err


@pytest.fixture
def trial(tmp_path, monkeypatch):
    """A user's folder with a Tune trial folder holding one checkpoint."""
    monkeypatch.chdir(tmp_path)
    checkpoint = tmp_path / "runs" / "exp1" / "GRPO_trial_0" / "checkpoint_000001"
    checkpoint.mkdir(parents=True)
    (checkpoint / "rllib_checkpoint.json").write_text("{}")
    return checkpoint


def test_a_missing_checkpoint_path_is_named_with_what_was_expected(trial, capsys):
    err = _refusal(capsys, "runs/exp1/GRPO_trial_0/checkpoint_00001")
    assert err.startswith(f"rllib evaluate: no such folder: {trial.parent / 'checkpoint_00001'} "
                          "(did you mean 'checkpoint_000001'?); " + EXPECTED)


def test_a_name_that_is_no_folder_model_or_cached_hub_id_is_named(trial, capsys):
    err = _refusal(capsys, "tiny-sql-mat")
    assert f"rllib evaluate: 'tiny-sql-mat' is no folder here ({trial.parents[3] / 'tiny-sql-mat'})" in err
    assert "(did you mean 'tiny-sql-math'?)" in err and "not in the local Hugging Face cache" in err and EXPECTED in err


def test_folders_that_are_not_checkpoints_point_at_one(trial, capsys):
    err = _refusal(capsys, "runs/exp1/GRPO_trial_0")
    assert "is a Tune trial folder, not a checkpoint; give one of its checkpoints, e.g. " + str(trial) in err
    err = _refusal(capsys, "runs/exp1")
    assert f"{trial.parents[1]} holds neither rllib_checkpoint.json nor config.json; {EXPECTED}" in err
    assert f"(e.g. {trial})" in err
