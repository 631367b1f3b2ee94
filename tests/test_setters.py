"""A config field takes three sites in one file: its default, its setter's Args entry, its rule
(``rllib_dph.algorithms.setters``)."""

import inspect

import pytest

from rllib_dph.algorithms.dph import DPHConfig
from rllib_dph.algorithms.grpo import GRPOConfig
from rllib_dph.algorithms.rules import NumberRule
from rllib_dph.algorithms.setters import documented_fields, setter


class WithANewField(GRPOConfig):
    """A config that adds one field the way the package's configs do."""

    def __init__(self):
        super().__init__()
        self.warmup_steps = 0  # site 1: the default

    @setter
    def schedule(self, given: dict) -> None:
        """Sets the learning-rate schedule.

        Args:
            warmup_steps: Optimizer steps of linear warm-up (default 0).
        """  # site 2: the docstring

    rules = (*GRPOConfig.rules, NumberRule("warmup_steps", integer=True, low=0, fix="e.g. 100"))  # site 3


def test_a_new_field_is_set_checked_and_named_with_three_sites():
    config = WithANewField().schedule(warmup_steps=100)
    assert config.warmup_steps == 100
    assert "warmup_steps" in inspect.signature(WithANewField.schedule).parameters
    with pytest.raises(ValueError, match="warmup_steps=-1 is invalid: it must be an int >= 0; e.g. 100"):
        WithANewField().schedule(warmup_steps=-1).validate()
    with pytest.raises(TypeError, match="got an unexpected keyword argument 'warmup_step' .*'warmup_steps'"):
        WithANewField().schedule(warmup_step=100)
    config = WithANewField()
    config.update_from_dict({"warmup_steps": 7})
    assert config.warmup_steps == 7


def test_every_documented_field_of_every_setter_has_a_default_and_is_set():
    config = DPHConfig()
    for name in ("llm", "training", "env_runners", "learners", "held_out", "dph"):
        method = getattr(DPHConfig, name)
        assert method.fields, name
        for field in method.fields:
            assert hasattr(config, field), (name, field)
    before = DPHConfig().training(group_size=4, lr=3e-4)  # an own field and one of RLlib's setter
    assert (before.group_size, before.lr) == (4, 3e-4)


def test_a_setter_leaves_fields_not_given_alone_and_may_rewrite_what_is_given():
    config = DPHConfig().dph(presample={"out_dir": "x", "k": 4})
    config.dph(presample={"min_correct": 8}, pef_coeff=1.0)
    assert (config.presample.out_dir, config.presample.k, config.presample.min_correct) == ("x", 4, 8)
    assert config.divergence == "js" and config.pef_coeff == 1.0


def test_a_setter_needs_an_args_section():
    def bare(self, given):
        """Sets nothing."""

    with pytest.raises(ValueError, match="documents no fields: its docstring needs an Args: section"):
        setter(bare)
    assert documented_fields(GRPOConfig.env_runners.__wrapped__) == ("weight_sync_timeout_s",)
