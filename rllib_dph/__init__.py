"""rllib_dph: Ray RLlib algorithms for RL with verifiable rewards on language models (GRPO, DPH-RL, DPPO)."""

__version__ = "0.1.0"
