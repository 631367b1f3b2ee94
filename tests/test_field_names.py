"""A config field name that is not one gets the field meant: by the paper's or another library's
name for it (η → pef_coeff, β → kl_coeff, ...), else by spelling; in `--config` (of `rllib train`
and of a tuned example run as a script) and in every setter of this package's configs."""

import json

import pytest

from rllib_dph.algorithms.dph import DPHConfig
from rllib_dph.algorithms.field_names import FIELD_ALIASES, field_suggestion, setter_of
from rllib_dph.algorithms.grpo import GRPOConfig
from rllib_dph.cli.main import main
from rllib_dph.cli.experiments import PREFLIGHT_EXIT_CODE, run_tuned_example
from rllib_dph.cli.preflight import config_key_problems


@pytest.mark.parametrize(
    "setter, name, meant",
    [
        ("training", "pef_weight", ".dph(pef_coeff=...)"),  # the README's old name of η
        ("dph", "eta", ".dph(pef_coeff=...)"),
        ("training", "beta", ".training(kl_coeff=...)"),
        ("training", "num_generations", ".training(group_size=...)"),
        ("llm", "max_completion_length", ".llm(max_response_length=...)"),
        ("llm", "model", ".llm(model_name=...)"),
        ("training", "group_sise", ".training(group_size=...)"),  # spelling
        ("env_runners", "num_env_runner", ".env_runners(num_env_runners=...)"),
        ("learners", "num_learner", ".learners(num_learners=...)"),
        ("held_out", "val_intervall", ".held_out(val_interval=...)"),
        ("training", "clip_ratio_high", ".training(trust_region=...)"),  # verl's ε_high
        ("training", "epsilon_high", ".training(trust_region=...)"),  # TRL's
    ],
)
def test_a_setter_refuses_an_unknown_keyword_naming_the_field_and_its_setter(setter, name, meant):
    with pytest.raises(TypeError) as error:
        getattr(DPHConfig(), setter)(**{name: 1})
    message = str(error.value)
    assert message.startswith(f"DPHConfig.{setter}() got an unexpected keyword argument {name!r} (did you mean")
    assert f"set it with {meant}" in message


def test_a_field_of_another_setter_is_named_with_its_setter():
    with pytest.raises(TypeError, match=r"'lr' is set with \.training\(lr=\.\.\.\)"):
        GRPOConfig().llm(lr=1e-4)


def test_known_keywords_keep_their_behaviour():
    config = DPHConfig().training(lr=1e-4, group_size=4, num_epochs=2).dph(pef_coeff=0.1).llm(model_name="tiny-random")
    assert (config.lr, config.group_size, config.num_epochs, config.pef_coeff) == (1e-4, 4, 2, 0.1)


def test_an_alias_is_suggested_only_where_its_field_exists():
    assert field_suggestion(GRPOConfig(), "eta") == ""  # η is DPH's
    assert "did you mean 'pef_coeff'?" in field_suggestion(DPHConfig(), "eta")
    assert field_suggestion(GRPOConfig(), "zzz_unrelated") == ""
    for alias, (field, _) in FIELD_ALIASES.items():
        assert alias not in vars(DPHConfig()) or alias == "model", alias  # an alias is no field itself
        assert setter_of(DPHConfig, field) is not None, field  # and its field has a setter


def test_config_keys_get_the_field_meant():
    problems = config_key_problems(DPHConfig(), {"pef_weight": 0.1, "beta": 0.01, "lr": 1e-4})
    assert [p.where for p in problems] == ["--config key 'pef_weight'", "--config key 'beta'"]
    assert "did you mean 'pef_coeff'?" in problems[0].message
    assert "did you mean 'kl_coeff'?" in problems[1].message


def test_rllib_train_config_json_names_the_field_meant(capsys, without_ray):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--algo", "DPH", "--env", "rllib_dph/SQL-v0", "--config", json.dumps({"pef_weight": 0.1})])
    assert exit_info.value.code == PREFLIGHT_EXIT_CODE
    assert "--config key 'pef_weight': DPHConfig has no such field (did you mean 'pef_coeff'?" in capsys.readouterr().err


def test_a_tuned_example_override_names_the_field_meant(capsys, without_ray):
    config = GRPOConfig().environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/test"})
    with pytest.raises(SystemExit) as exit_info:
        run_tuned_example(config, {"training_iteration": 1}, ["--config", json.dumps({"num_generations": 4})])
    assert exit_info.value.code == PREFLIGHT_EXIT_CODE
    assert "did you mean 'group_size'?" in capsys.readouterr().err
