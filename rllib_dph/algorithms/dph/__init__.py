from rllib_dph.algorithms.dph.dph import DPH, DPHConfig

__all__ = ["DPH", "DPHConfig"]
