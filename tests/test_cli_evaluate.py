"""`rllib evaluate` on a policy it cannot load says so in one line naming the path and what it
expected (exit 2), and its default output folder is a readable name (no leading `-`). No model
is loaded here."""

import os

import pytest

from rllib_dph.cli.main import _default_eval_out, main
from rllib_dph.cli.experiments import PREFLIGHT_EXIT_CODE, slug

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


def test_the_default_output_folder_of_a_checkpoint_is_its_trial_and_checkpoint():
    policy = ("/home/me/ray_results/GRPO_rllib_dph_SQL-v0_2025-05-01_10-00-00/"
              "GRPO_rllib_dph_SQL-v0_3b1c2_00000_0_2025-05-01_10-00-01/checkpoint_000001")
    out = _default_eval_out(policy, "rllib_dph/SQL-v0", {"data": "sql_synth/test"})
    assert out == os.path.join("eval_results", "GRPO_rllib_dph_SQL-v0_3b1c2_00000_0_2025-05-01_10-00-01_"
                                               "checkpoint_000001__rllib_dph_SQL-v0_sql_synth_test")
    assert _default_eval_out("Qwen/Qwen2.5-0.5B", "rllib_dph/Math-v0", {}) == os.path.join(
        "eval_results", "Qwen_Qwen2.5-0.5B__rllib_dph_Math-v0")


def test_a_slug_never_starts_with_a_dash():
    # The last 80 characters of this Tune path started with "-00-00_GRPO...".
    path = ("/home/user/ray_results/GRPO_rllib_dph_SQL-v0_2025-05-01_10-00-00/"
            "GRPO_rllib_dph_SQL-v0_3b1c2_00000_0_2025-05-01_10-00-01/checkpoint_000001")
    assert slug(path) == "00-00_GRPO_rllib_dph_SQL-v0_3b1c2_00000_0_2025-05-01_10-00-01_checkpoint_000001"
    assert slug("ab" * 40 + "-" + "c" * 79) == "c" * 79
