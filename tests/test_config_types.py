"""Config values of the wrong type are refused by validate(), naming the field: strings for
booleans, lists for choices, strings for ints, and numbers too large for the waits and tensors
built from them."""

from __future__ import annotations

import pytest

from rllib_dph.algorithms.dph import DPHConfig
from rllib_dph.algorithms.grpo import GRPOConfig
from rllib_dph.algorithms.rules import MAX_INT, MAX_REAL, BoolRule, ChoiceRule, NumberRule


def _grpo() -> GRPOConfig:
    return GRPOConfig().environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/test"}).llm(model_name="tiny-random")


@pytest.mark.parametrize("setter, field, value, words", [
    ("training", "dynamic_sampling", "false", "dynamic_sampling='false' (str) is invalid: it must be True or False"),
    ("training", "normalize_advantage_std", 0, "normalize_advantage_std=0 (int) is invalid: it must be True or False"),
    ("llm", "gradient_checkpointing", "yes", "gradient_checkpointing='yes' (str)"),
    ("training", "loss_agg_mode", ["token-mean"], "loss_agg_mode=['token-mean'] (list) is not one of"),
    ("llm", "engine", {"hf": 1}, "engine={'hf': 1} (dict) is not one of"),
    ("training", "group_size", "8", "group_size='8' (str) is invalid: it must be an int >= 2"),
    ("training", "group_size", 10**30, f"it must be an int >= 2, at most {MAX_INT}"),
    ("env_runners", "weight_sync_timeout_s", 1e300, "weight_sync_timeout_s=1e+300 is invalid: it must be a finite number > 0, at most 9.22e+09"),
    ("learners", "learner_update_timeout_s", 10 * MAX_REAL, "learner_update_timeout_s="),
])
def test_a_value_of_the_wrong_type_or_size_is_refused_naming_the_field(setter, field, value, words):
    config = getattr(_grpo(), setter)(**{field: value})
    with pytest.raises(ValueError) as error:
        config.validate()
    assert words in str(error.value)


@pytest.mark.parametrize("presample, words", [
    ({"full_data": "false"}, "presample: full_data='false' (str) is invalid: it must be True or False"),
    ({"k": "8"}, "presample: k='8' (str) is invalid: it must be an int >= 1"),
    ({"k": 10**40}, f", at most {MAX_INT}"),
])
def test_presample_fields_of_the_wrong_type_are_refused(presample, words, tmp_path):
    config = DPHConfig().environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/test"}).llm(
        model_name="tiny-random").dph(presample={**presample, "out_dir": str(tmp_path)})
    with pytest.raises(ValueError) as error:
        config.validate()
    assert words in str(error.value)


def test_the_rules_take_right_values_at_their_limits():
    class Config:
        flag, choice, count, seconds = False, "a", MAX_INT, MAX_REAL

    config = Config()
    assert BoolRule("flag").violation(config) is None
    assert ChoiceRule("choice", ("a", "b")).violation(config) is None
    assert NumberRule("count", integer=True, low=1).violation(config) is None
    assert NumberRule("seconds", low=0).violation(config) is None
    assert NumberRule("seconds", low=0, allow_inf=True).holds(float("inf"))
    config.count, config.seconds = MAX_INT + 1, MAX_REAL * 2
    assert "at most" in NumberRule("count", integer=True, low=1).violation(config)
    assert "at most" in NumberRule("seconds", low=0).violation(config)
