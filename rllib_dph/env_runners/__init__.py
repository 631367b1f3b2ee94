"""Sampling the policy on the envs: the env runner and the rounds the algorithm runs on them.

- :mod:`.llm_env_runner` — :class:`~.llm_env_runner.LLMEnvRunner`: prompts → groups of
  completions → a scored rollout batch, through a rollout engine;
- :mod:`.async_sampling` — :class:`~.async_sampling.SamplingRounds`: synchronous rounds or rounds
  up to ``max_staleness`` weight versions ahead of the learner, with timeouts and restarts.
"""
