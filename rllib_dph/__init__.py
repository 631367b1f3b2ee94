"""rllib_dph: Ray RLlib algorithms for RL with verifiable rewards on language models (GRPO, DPH-RL, DPPO).

The package's face: the algorithm configs and algorithms, verifier-env registration and
evaluation, importable from here::

    from rllib_dph import DPHConfig, GRPOConfig, evaluate_policy, register_verifier_env

Each name loads its module on first use, so ``import rllib_dph`` stays light (no Ray, no torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_EXPORTS = {
    "GRPO": "rllib_dph.algorithms.grpo",
    "GRPOConfig": "rllib_dph.algorithms.grpo",
    "DPH": "rllib_dph.algorithms.dph",
    "DPHConfig": "rllib_dph.algorithms.dph",
    "register_verifier_env": "rllib_dph.envs",
    "register_multiturn_env": "rllib_dph.envs",
    "make_env": "rllib_dph.envs",
    "Verdict": "rllib_dph.envs",
    "VerifierEnv": "rllib_dph.envs",
    "EvalSettings": "rllib_dph.evaluation",
    "evaluate_policy": "rllib_dph.evaluation",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ loads on demand
    from rllib_dph.algorithms.dph import DPH, DPHConfig
    from rllib_dph.algorithms.grpo import GRPO, GRPOConfig
    from rllib_dph.envs import Verdict, VerifierEnv, make_env, register_multiturn_env, register_verifier_env
    from rllib_dph.evaluation import EvalSettings, evaluate_policy


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rllib_dph' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
