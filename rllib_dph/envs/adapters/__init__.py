"""Adapters: environments written for another environment standard, served as verifier envs.

- :mod:`rllib_dph.envs.adapters.verifiers`: environments of ``verifiers`` (its classic API:
  ``SingleTurnEnv``, ``MultiTurnEnv``, ``Rubric``), id ``rllib_dph/Verifiers-v0``; needs
  ``pip install -e ".[verifiers]"``.
"""
