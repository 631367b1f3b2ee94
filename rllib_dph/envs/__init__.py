"""Verifier text environments for RL with verifiable rewards.

Importing this package registers the bundled envs with Gymnasium (lazily: their modules load on
first ``gym.make``):

- ``rllib_dph/SQL-v0``: text-to-SQL, reward from executing the last ```sql block (``rllib_dph.envs.sql``);
- ``rllib_dph/Math-v0``: math word problems, reward from the last ``\\boxed{}`` (``rllib_dph.envs.math``);
- ``rllib_dph/SQLMultiTurn-v0``: text-to-SQL with exploratory queries before the answer
  (``rllib_dph.envs.sql.multiturn``);
- ``rllib_dph/ReasoningGym-v0``: any reasoning-gym data set, scored by its own scorer
  (``rllib_dph.envs.reasoning_gym``; needs ``pip install -e ".[reasoning-gym]"``);
- ``rllib_dph/Verifiers-v0``: an environment written for ``verifiers``, unchanged
  (``rllib_dph.envs.adapters.verifiers``; needs ``pip install -e ".[verifiers]"``).

New tasks: :func:`register_verifier_env`, :func:`register_multiturn_env`. Building an env from
an id, class or Tune name: :func:`make_env`. Ray Tune names: :func:`register_tune_envs`
(automatic when ``ray.tune`` (e.g. via RLlib) was imported before ``rllib_dph.envs``).
"""

from rllib_dph.envs.base import Task, Verdict, VerifierEnv
from rllib_dph.envs.data import load_tasks
from rllib_dph.envs.registry import (
    FunctionVerifierEnv,
    make_env,
    register,
    register_tune_envs,
    register_multiturn_env,
    register_verifier_env,
    registered_env_ids,
)

register("rllib_dph/SQL-v0", entry_point="rllib_dph.envs.sql.env:SQLEnv")
register("rllib_dph/Math-v0", entry_point="rllib_dph.envs.math.env:MathEnv")
register("rllib_dph/SQLMultiTurn-v0", entry_point="rllib_dph.envs.sql.multiturn:SQLMultiTurnEnv")
register("rllib_dph/ReasoningGym-v0", entry_point="rllib_dph.envs.reasoning_gym:ReasoningGymEnv")
register("rllib_dph/Verifiers-v0", entry_point="rllib_dph.envs.adapters.verifiers:VerifiersEnv")

__all__ = [
    "FunctionVerifierEnv",
    "Task",
    "Verdict",
    "VerifierEnv",
    "load_tasks",
    "make_env",
    "register",
    "register_multiturn_env",
    "register_tune_envs",
    "register_verifier_env",
    "registered_env_ids",
]
