"""The one rollout path: prompt indices → chat-encoded prompts → engine → decoded texts → env scores.

Everything that samples a policy on an env's tasks goes through :func:`rollout`: the env runner
(training batches), evaluation (pass@k & co.), DPH's pre-sampling stage and the tiny model's
quality check. The engine samples groups of completions (``engines.base.RolloutEngine``); each
completion is decoded with ``skip_special_tokens=True`` and scored by resetting the env to its
task (``options={"index": i}``) and stepping it with the text. :func:`make_env` builds the env
named in a config.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import gymnasium as gym
import numpy as np

import envs  # noqa: F401  (registers the bundled envs with gymnasium)
from rllib_dph.chat import encode_prompt
from rllib_dph.engines.base import Completion, RolloutEngine, SamplingParams


def make_env(env_id: Any, env_config: dict) -> gym.Env:
    """Creates the env named in ``config.environment(...)``.

    Args:
        env_id: An env class, a Ray Tune registered name, or a gymnasium id
            (``rllib_dph/SQL-v0``; importing ``envs`` registers the bundled ones).
        env_config: The env's keyword arguments.
    """
    from ray.tune.registry import ENV_CREATOR, _global_registry

    if isinstance(env_id, type):
        return env_id(**env_config)
    if _global_registry.contains(ENV_CREATOR, env_id):
        return _global_registry.get(ENV_CREATOR, env_id)(env_config)
    return gym.make(env_id, **env_config).unwrapped


def encode_task(tokenizer, task) -> list[int]:
    """Token ids of a task's prompt (``envs.base.Task.messages``) with the chat template."""
    return encode_prompt(tokenizer, [dict(m) for m in task.messages])


@dataclass
class ScoredGroup:
    """The completions of one prompt and the env's verdict on each.

    Attributes:
        index: The task's index in the env.
        prompt_ids: The prompt's token ids.
        completions: The n sampled completions (token ids, μ log-probs, finish reason).
        texts: Each completion decoded with ``skip_special_tokens=True``.
        rewards: (n,) float32 reward of each completion.
        correct: (n,) bool, whether each completion solves the task.
    """

    index: int
    prompt_ids: list[int]
    completions: list[Completion]
    texts: list[str]
    rewards: np.ndarray
    correct: np.ndarray


@dataclass
class Rollout:
    """The scored groups of one :func:`rollout` call, in prompt order, and its timings."""

    groups: list[ScoredGroup]
    generation_time_s: float
    scoring_time_s: float


def score_group(env, tokenizer, index: int, prompt_ids: list[int], completions: list[Completion]) -> ScoredGroup:
    """Decodes the completions of task ``index`` and scores each with ``env`` (reset, then step).

    Args:
        env: A verifier env (``envs.base.VerifierEnv``: ``reset``, ``step``).
        tokenizer: The engine's tokenizer.
        index: The task's index in the env.
        prompt_ids: The prompt's token ids.
        completions: The engine's completions of that prompt.
    """
    texts = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in completions]
    rewards = np.zeros(len(texts), dtype=np.float32)  # (n,)
    correct = np.zeros(len(texts), dtype=bool)  # (n,)
    for j, text in enumerate(texts):
        env.reset(options={"index": index})
        _, reward, _, _, info = env.step(text)
        rewards[j], correct[j] = reward, info["correct"]
    return ScoredGroup(index, prompt_ids, completions, texts, rewards, correct)


def rollout(
    engine: RolloutEngine,
    env,
    indices: Sequence[int],
    params: SamplingParams,
    *,
    prompt_ids: Optional[Sequence[list[int]]] = None,
) -> Rollout:
    """Samples ``params.n`` completions for each task of ``indices`` in one ``generate`` call and scores them.

    Args:
        engine: A rollout engine (``generate``, ``tokenizer``).
        env: A verifier env (``tasks``, ``reset``, ``step``).
        indices: Task indices, in the order of the returned groups.
        params: How to sample (``n``, temperature, top-p, ``max_new_tokens``, seed, top-K).
        prompt_ids: The prompts' token ids when the caller already encoded them (e.g. cached);
            None encodes them with :func:`encode_task`.

    Returns:
        One :class:`ScoredGroup` per index, and the generation and scoring times.
    """
    if prompt_ids is None:
        prompt_ids = [encode_task(engine.tokenizer, env.tasks[i]) for i in indices]
    start = time.perf_counter()
    completions = engine.generate(prompt_ids, params)
    generated = time.perf_counter()
    groups = [
        score_group(env, engine.tokenizer, i, p, group)
        for i, p, group in zip(indices, prompt_ids, completions)
    ]
    return Rollout(groups, generated - start, time.perf_counter() - generated)
