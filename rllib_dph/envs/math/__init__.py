"""Math answers: extraction, equivalence with Math-Verify, and the math env ``rllib_dph/Math-v0``.

The modules, one concept each: :mod:`~rllib_dph.envs.math.extract` (the final answer of a
completion), :mod:`~rllib_dph.envs.math.compare` (when two answers are equal, Math-Verify
included) and :mod:`~rllib_dph.envs.math.env` (the verifier, its limits in the verifier
isolation, and ``MathEnv``). The checker pool is the isolation's: :func:`set_checker_pool`.
"""

from rllib_dph.envs.isolation import CHECKER_KILL_GRACE_S, CheckerPoolTimeout, set_checker_pool
from rllib_dph.envs.math.env import (
    CHECKER_WALL_FACTOR,
    DEFAULT_TIMEOUT_S,
    MathEnv,
    math_reward,
    start_checker,
    verify_math,
)
from rllib_dph.envs.math.extract import extract_answer, extract_boxed

__all__ = [
    "CHECKER_KILL_GRACE_S",
    "CHECKER_WALL_FACTOR",
    "CheckerPoolTimeout",
    "DEFAULT_TIMEOUT_S",
    "MathEnv",
    "extract_answer",
    "extract_boxed",
    "math_reward",
    "set_checker_pool",
    "start_checker",
    "verify_math",
]
