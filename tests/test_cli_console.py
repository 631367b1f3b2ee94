"""The `rllib train` console line, experiment names and tracker set-up (no Ray cluster)."""

import os
import re

import pytest

from rllib_dph.algorithms.grpo import GRPOConfig
from rllib_dph.cli.experiments import default_experiment_name
from rllib_dph.cli.console import best_pass_at_k, error_summary, iteration_line
from rllib_dph.cli.tracking import logger_callbacks, mlflow_uri, tracking_problems

RESULT = {
    "training_iteration": 7,
    "time_this_iter_s": 4.56,
    "env_runners": {"reward_mean": 0.4123, "accuracy": 0.3981, "generation_tokens_per_s": 1534.4},
    "learners": {"default_policy": {"policy_loss": -0.012345}, "__all_modules__": {}},
}


def test_iteration_line_shows_reward_accuracy_loss_speed_and_time():
    assert iteration_line(RESULT) == "iter    7  reward 0.412  acc 0.398  policy_loss -0.01235  1534 tok/s  4.6 s"


def test_iteration_line_shows_validation_pass_at_k_when_measured():
    result = {**RESULT, "evaluation": {"pass@1": 0.3, "pass@16": 0.71, "pass@4": 0.5, "greedy_accuracy": 0.6}}
    assert "  pass@16 0.710  " in iteration_line(result)
    assert best_pass_at_k({"greedy_accuracy": 0.6}) is None


def test_iteration_line_leaves_out_missing_metrics():
    assert iteration_line({"training_iteration": 1}) == "iter    1"


def test_error_summary_is_the_users_exception_line():
    wrapped = RuntimeError("The actor died ...\n  File \"x.py\", line 8, in __init__\n    raise\nValueError: data file x.parquet does not exist.\n")
    assert error_summary(wrapped) == "ValueError: data file x.parquet does not exist."
    assert error_summary(RuntimeError()) == "RuntimeError"


def test_error_summary_of_a_dead_learner_names_its_index_actor_and_pid():
    """A trial's error as Tune reports it (Ray's task error around the traceback): the learner's
    error spans lines (its worker log, what to do), and its first line names the learner."""
    import traceback

    from ray.exceptions import RayTaskError

    from rllib_dph.learners.remote_calls import LearnerActor, _failure

    actor = LearnerActor(index=0, actor_id="ab12", pid=4242)
    try:
        raise _failure(actor, 1, RuntimeError("The actor died unexpectedly"), "the learner update")
    except Exception as e:
        error = RayTaskError("GRPO.train", traceback.format_exc(), e)
    summary = error_summary(error)
    assert summary.startswith("rllib_dph.learners.remote_calls.LearnerFailed: learner 0 (actor ab12, pid 4242) "
                              "failed during the learner update: RuntimeError: The actor died unexpectedly"), summary


def test_experiment_folders_are_unique_per_run():
    name = default_experiment_name(GRPOConfig().environment("rllib_dph/SQL-v0"))
    assert re.fullmatch(r"GRPO_rllib_dph_SQL-v0_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d", name), name


def test_mlflow_folder_becomes_a_file_store_uri(tmp_path):
    assert mlflow_uri("mlruns", str(tmp_path)) == (tmp_path / "mlruns").as_uri()
    assert mlflow_uri("http://localhost:5000") == "http://localhost:5000"
    assert mlflow_uri("file:///x/mlruns") == "file:///x/mlruns"


def test_missing_tracker_packages_are_named(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    problems = tracking_problems(wandb_project="p", mlflow_tracking_uri="mlruns")
    assert len(problems) == 2 and all('pip install "rllib_dph[tracking]"' in p for p in problems)
    assert tracking_problems(wandb_project=None, mlflow_tracking_uri=None) == []


def test_logger_callbacks(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from ray.air.integrations.mlflow import MLflowLoggerCallback
    from ray.air.integrations.wandb import WandbLoggerCallback

    monkeypatch.delenv("WANDB_MODE", raising=False)
    wandb_cb, mlflow_cb = logger_callbacks(
        "exp1", wandb_project="proj", wandb_offline=True, mlflow_tracking_uri="mlruns", launch_dir=str(tmp_path)
    )
    assert isinstance(wandb_cb, WandbLoggerCallback) and wandb_cb.project == "proj" and wandb_cb.group == "exp1"
    assert isinstance(mlflow_cb, MLflowLoggerCallback) and mlflow_cb.tracking_uri == (tmp_path / "mlruns").as_uri()
    assert os.environ["WANDB_MODE"] == "offline"
    assert logger_callbacks("exp1") == []


class _Trial:
    def __init__(self, path, eta, metrics):
        self.path, self.config, self.metrics = path, {"pef_coeff": eta, "lr": 3e-4}, metrics
        self.checkpoint = None


def test_a_sweep_picks_its_best_trial_by_validation_pass_at_the_largest_k_and_reports_ties(capsys):
    from rllib_dph.cli.experiments import _print_summary

    def metrics(reward, pass_at_8):
        return {"training_iteration": 20, "env_runners": {"episode_return_mean": reward},
                "evaluation": {"pass@1": 0.3, "pass@4": 0.6, "pass@8": pass_at_8}}

    _print_summary([
        _Trial("t0", 0.01, metrics(0.9, 0.70)),  # the best training reward, not the best validation
        _Trial("t1", 0.05, metrics(0.5, 0.76)),
        _Trial("t2", 0.2, metrics(0.4, 0.76)),
    ])
    out = capsys.readouterr().out
    assert "best trial by evaluation/pass@8: t1" in out and '{"pef_coeff": 0.05}' in out
    assert "tie: t2" in out and "evaluation/pass@8=0.76" in out
    assert "style_entropy" not in out  # no styles were evaluated: nothing shown
    styled = metrics(0.5, 0.76)
    styled["evaluation"]["style_entropy_bits"] = 2.1384
    _print_summary([_Trial("s0", 10.0, styled)])
    assert "trial s0: training_iteration=20 evaluation/pass@8=0.76 evaluation/style_entropy_bits=2.14" in capsys.readouterr().out
    _print_summary([_Trial("a", 0.01, {"env_runners": {"episode_return_mean": 0.2}}),
                    _Trial("b", 0.2, {"env_runners": {"episode_return_mean": 0.4}})])
    out = capsys.readouterr().out
    assert "best trial by env_runners/episode_return_mean: b" in out and "tie" not in out
