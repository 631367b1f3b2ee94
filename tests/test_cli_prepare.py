"""`rllib train` builds missing tiny models and runs DPH pre-sampling in its own process, before
any trial starts (not inside the Tune trial, where progress bars came out as separate lines)."""

import json

import pytest

from rllib_dph.algorithms.dph import DPHConfig
from rllib_dph.algorithms.grpo import GRPOConfig
from rllib_dph.cli.experiments import PREFLIGHT_EXIT_CODE, prepare_run


def test_a_missing_bundled_model_is_built_here_and_says_so(tmp_path, monkeypatch, capsys, without_ray):
    import ray

    monkeypatch.setenv("RLLIB_DPH_HOME", str(tmp_path / "home"))
    prepare_run(GRPOConfig().environment("rllib_dph/SQL-v0").llm(model_name="tiny-random"))
    assert (tmp_path / "home" / "models" / "tiny-random" / "model.safetensors").is_file()
    assert "building model 'tiny-random' into " + str(tmp_path / "home" / "models" / "tiny-random") in capsys.readouterr().err
    prepare_run(GRPOConfig().environment("rllib_dph/SQL-v0").llm(model_name="tiny-random"))
    assert "building" not in capsys.readouterr().err  # built: nothing to do
    assert not ray.is_initialized()


def test_dph_presampling_runs_here_and_an_empty_d_pef_is_refused(tmp_path, capsys, without_ray):
    import ray

    data = tmp_path / "math.jsonl"
    data.write_text("\n".join(
        json.dumps({"data_source": "math", "prompt": [{"role": "user", "content": f"What is 2+{i}?"}],
                    "reward_model": {"ground_truth": "0"}, "id": i})  # wrong answers: nothing is correct
        for i in range(3)
    ))
    config = (
        DPHConfig()
        .environment("rllib_dph/Math-v0", env_config={"data": str(data)})
        .llm(model_name="tiny-sql-math", max_response_length=8)
        .dph(presample={"out_dir": str(tmp_path / "presample"), "k": 2, "min_correct": 1})
    )
    assert config.needs_presampling
    with pytest.raises(SystemExit) as exit_info:
        prepare_run(config)
    assert exit_info.value.code == PREFLIGHT_EXIT_CODE
    assert not config.needs_presampling  # D_pef and D_exp were written by this process
    assert "is empty: no training prompt reached 1 correct samples" in capsys.readouterr().err
    assert not ray.is_initialized()


def test_build_algo_builds_an_unbuilt_bundled_model_and_says_so(tmp_path, monkeypatch, capfd, ray_session):
    """A run made in Python has the same preparation step (``GRPO.setup``): no CLI needed."""
    from rllib_dph.models.hub import ModelNotFoundError, resolve_model

    monkeypatch.setenv("RLLIB_DPH_HOME", str(tmp_path / "home"))
    with pytest.raises(ModelNotFoundError, match="rllib build-model tiny-random"):
        resolve_model("tiny-random")  # resolving never builds
    algo = (
        GRPOConfig()
        .environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/test"})
        .llm(model_name="tiny-random", max_response_length=8)
        .training(group_size=2, prompts_per_step=2, minibatch_size=4)
        .env_runners(num_env_runners=0)
        .learners(num_learners=0)
        .build_algo()
    )
    try:
        assert f"building model 'tiny-random' into {tmp_path / 'home' / 'models' / 'tiny-random'}" in capfd.readouterr().err
        assert resolve_model("tiny-random") == str(tmp_path / "home" / "models" / "tiny-random")
    finally:
        algo.stop()
