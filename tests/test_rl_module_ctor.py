"""LLMRLModule is built through RLModule's keyword constructor, never `RLModule(config=RLModuleConfig)`.

Ray 2.60 logs "`RLModule(config=[RLModuleConfig object])` has been deprecated" for every RLModule,
RLlib's own PPO module included: ``RLModule.__init__`` builds an ``RLModuleConfig`` for its
``self.config`` attribute. The deprecated *call* would take ``RLModuleSpec.build``'s fallback,
``module_class(spec.get_rl_module_config())`` (which raises in Ray 2.60); this test shows ours never
takes it.
"""

from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from rllib_dph.algorithms.grpo import GRPOConfig
from rllib_dph.policy.rl_module import LLMRLModule


def test_the_spec_builds_the_module_with_keyword_arguments(monkeypatch):
    def fallback(self):
        raise AssertionError("RLModuleSpec.build fell back to RLModule(config=RLModuleConfig)")

    monkeypatch.setattr(RLModuleSpec, "get_rl_module_config", fallback)
    config = GRPOConfig().llm(model_name="tiny-random", max_response_length=8)
    spec = config.get_default_rl_module_spec()
    spec.observation_space, spec.action_space, spec.inference_only = *_spaces(), True
    module = spec.build()
    assert isinstance(module, LLMRLModule) and module.model_config["model"] == "tiny-random"
    assert module.inference_only and not module.model.training


def _spaces():
    import gymnasium as gym

    return gym.spaces.Text(8), gym.spaces.Text(8)
