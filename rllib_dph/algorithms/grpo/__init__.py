from rllib_dph.algorithms.grpo.grpo import GRPO, GRPOConfig

__all__ = ["GRPO", "GRPOConfig"]
