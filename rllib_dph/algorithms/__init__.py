"""Algorithms of rllib_dph, by the name ``rllib train --algo NAME`` accepts."""

from rllib_dph.algorithms.dph import DPH, DPHConfig
from rllib_dph.algorithms.grpo import GRPO, GRPOConfig

#: ``--algo`` names → config classes.
ALGORITHMS = {"GRPO": GRPOConfig, "DPH": DPHConfig}

__all__ = ["ALGORITHMS", "DPH", "DPHConfig", "GRPO", "GRPOConfig"]
