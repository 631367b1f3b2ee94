"""The one rollout path: prompt indices → chat-encoded prompts → engine → decoded turns → env.

Everything that samples a policy on an env's tasks goes through :func:`rollout`: the env runner
(training batches), evaluation (pass@k & co.), DPH's pre-sampling stage and the tiny model's
quality check. It runs episodes of the env contract (``rllib_dph.envs.base``): each episode resets the env
to its task (``options={"index": i}``); then, turn by turn, one ``engine.generate`` call samples
the next turn of every episode still running (the first turn: ``n`` per prompt, sharing the
prompt), each turn is decoded with ``skip_special_tokens=True`` and stepped; an episode that is
not over gets the env's observation appended with the chat template
(:func:`rllib_dph.chat.encode_observation`) and goes on. Finished episodes leave the batch. A
single-turn env ends every episode at its first step: one ``generate`` call.

An episode is one :class:`~rllib_dph.engines.base.Completion`: its turns and observations in
order, observation tokens with NaN log-probs (holes in the batch's ``RESPONSE_MASK``, see
``rllib_dph.rollout.batch.sequence_rows``). The rollout knows nothing of tools or answer formats: the env owns
the protocol. ``rllib_dph.envs.make_env`` builds the env named in a config.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from rllib_dph.chat import encode_observation, encode_prompt
from rllib_dph.engines.base import Completion, RolloutEngine, SamplingParams


def encode_task(tokenizer, task) -> list[int]:
    """Token ids of a task's prompt (``rllib_dph.envs.base.Task.messages``) with the chat template."""
    return encode_prompt(tokenizer, [dict(m) for m in task.messages])


@dataclass
class ScoredGroup:
    """The episodes of one prompt and the env's verdict on each.

    Attributes:
        index: The task's index in the env.
        prompt_ids: The prompt's token ids.
        completions: The n episodes, each one completion (token ids, μ log-probs, NaN on env
            observation tokens, finish reason of its last turn).
        texts: Each episode's last policy turn (the one the verifier scored), decoded with
            ``skip_special_tokens=True``; for a single-turn env, the whole completion.
        rewards: (n,) float32 reward of each episode (sum of its step rewards).
        correct: (n,) bool, whether each episode solves the task.
        turns: (n,) int64 policy turns of each episode.
        tool_calls: (n,) int64 tool calls (e.g. exploratory queries) of each episode.
        reasons: Why each episode ended without a checked answer (the env's ``info["error"]``,
            or the token budget), None when it did not.
    """

    index: int
    prompt_ids: list[int]
    completions: list[Completion]
    texts: list[str]
    rewards: np.ndarray
    correct: np.ndarray
    turns: np.ndarray
    tool_calls: np.ndarray
    reasons: list[Optional[str]]


@dataclass
class Rollout:
    """The scored groups of one :func:`rollout` call, in prompt order, and its timings."""

    groups: list[ScoredGroup]
    generation_time_s: float
    scoring_time_s: float


@dataclass
class Episode:
    """One episode in flight: its own shallow copy of the env and its response so far."""

    env: Any
    index: int
    prompt_ids: list[int]
    parts: list[Completion] = field(default_factory=list)
    response_length: int = 0
    turns: int = 0
    tool_calls: int = 0
    reward: float = 0.0
    correct: bool = False
    reason: Optional[str] = None
    text: str = ""
    finish_reason: str = "stop"
    done: bool = False

    def sequence(self) -> list[int]:
        """Prompt and response so far: the next turn's prompt."""
        return list(self.prompt_ids) + [int(t) for p in self.parts for t in p.token_ids]

    def completion(self) -> Completion:
        """The whole response as one completion (a single turn's completion is returned as is)."""
        if len(self.parts) == 1:
            return self.parts[0]
        with_topk = self.parts[0].topk_ids is not None
        return Completion(
            token_ids=np.concatenate([p.token_ids for p in self.parts]).astype(np.int64),
            logprobs=np.concatenate([p.logprobs for p in self.parts]).astype(np.float32),
            topk_ids=np.concatenate([p.topk_ids for p in self.parts]) if with_topk else None,
            topk_logprobs=np.concatenate([p.topk_logprobs for p in self.parts]) if with_topk else None,
            finish_reason=self.finish_reason,
        )


def _fit_budget(episode: Episode, turn: Completion) -> Completion:
    """``turn`` cut to the episode's remaining token budget (``env.max_episode_tokens``).

    A prefix of a sampled turn is what sampling with that many ``max_new_tokens`` would have
    given, so the cut turn keeps its μ.
    """
    budget = episode.env.max_episode_tokens
    if budget is None or episode.response_length + len(turn.token_ids) <= budget:
        return turn
    keep = max(0, budget - episode.response_length)
    cut = (lambda x: None if x is None else x[:keep])
    return Completion(turn.token_ids[:keep], turn.logprobs[:keep], cut(turn.topk_ids),
                      cut(turn.topk_logprobs), finish_reason="length")


def _observation(tokenizer, episode: Episode, text: str, like: Completion) -> Completion:
    """The env's observation as a completion part the policy did not sample (NaN log-probs)."""
    ids = np.asarray(
        encode_observation(tokenizer, text, role=episode.env.observation_role,
                           turn_closed=episode.finish_reason == "stop"),
        dtype=np.int64,
    )  # (T,)
    nan = np.full(len(ids), np.nan, dtype=np.float32)  # (T,)
    k = None if like.topk_ids is None else like.topk_ids.shape[1]
    return Completion(
        ids, nan,
        None if k is None else np.zeros((len(ids), k), dtype=np.int64),
        None if k is None else np.full((len(ids), k), np.nan, dtype=np.float32),
    )


def take_turn(tokenizer, episode: Episode, turn: Completion, max_prompt_tokens: Optional[int] = None) -> None:
    """Appends a sampled turn to the episode, steps its env, and appends the observation or ends it.

    The episode ends when the env terminates or truncates it, when the observation would leave
    no token of the budget for another turn, or when the next turn's prompt would be longer than
    ``max_prompt_tokens`` (None: no limit); then it is not correct, gets no final reward (only
    the step rewards so far) and keeps the reason. Never raises because of the model's output
    (the env's ``step`` must not either).
    """
    turn = _fit_budget(episode, turn)
    episode.parts.append(turn)
    episode.response_length += len(turn.token_ids)
    episode.finish_reason = turn.finish_reason
    episode.text = tokenizer.decode(turn.token_ids, skip_special_tokens=True)
    observation, reward, terminated, truncated, info = episode.env.step(episode.text)
    episode.turns += 1
    reward = float(reward)
    if not math.isfinite(reward):  # a NaN or infinity never reaches training
        info = {**info, "correct": False, "error": f"the env's step returned reward {reward!r}; counted 0"}
        reward = 0.0
    episode.reward += reward
    episode.tool_calls = int(info.get("tool_calls", 0))
    if terminated or truncated:
        episode.done, episode.correct, episode.reason = True, bool(info.get("correct")), info.get("error")
        return
    part = _observation(tokenizer, episode, str(observation), turn)
    length = episode.response_length + len(part.token_ids)
    budget = episode.env.max_episode_tokens
    if budget is not None and length >= budget:
        episode.done = True
        episode.reason = f"max_episode_tokens={budget} reached without a final answer"
        return
    if max_prompt_tokens is not None and len(episode.prompt_ids) + length > max_prompt_tokens:
        episode.done = True
        episode.reason = (
            f"the next turn's prompt would pass the engine's context ({max_prompt_tokens} tokens)"
        )
        return
    episode.parts.append(part)
    episode.response_length += len(part.token_ids)


def _turn_params(params: SamplingParams, turn: int) -> SamplingParams:
    """Sampling parameters of turn ``turn`` >= 1 (0-based): one sample per episode, its own seed."""
    seed = None if params.seed is None else params.seed + 1_000_003 * turn
    return dataclasses.replace(params, n=1, seed=seed)


def _scored_group(episodes: list[Episode]) -> ScoredGroup:
    """The scored group of one prompt's episodes."""
    first = episodes[0]
    return ScoredGroup(
        index=first.index,
        prompt_ids=first.prompt_ids,
        completions=[e.completion() for e in episodes],
        texts=[e.text for e in episodes],
        rewards=np.array([e.reward for e in episodes], dtype=np.float32),  # (n,)
        correct=np.array([e.correct for e in episodes], dtype=bool),  # (n,)
        turns=np.array([e.turns for e in episodes], dtype=np.int64),  # (n,)
        tool_calls=np.array([e.tool_calls for e in episodes], dtype=np.int64),  # (n,)
        reasons=[e.reason for e in episodes],
    )


def rollout(
    engine: RolloutEngine,
    env,
    indices: Sequence[int],
    params: SamplingParams,
    *,
    prompt_ids: Optional[Sequence[list[int]]] = None,
) -> Rollout:
    """Runs ``params.n`` episodes for each task of ``indices``, one ``generate`` call per turn.

    Args:
        engine: A rollout engine (``generate``, ``tokenizer``; an engine with a
            ``max_model_len`` ends the episodes whose next turn would not fit in it).
        env: A verifier env (``tasks``, ``reset``, ``step``; the contract of ``rllib_dph.envs.base``).
        indices: Task indices, in the order of the returned groups.
        params: How to sample each turn (``n`` episodes per prompt, temperature, top-p,
            ``max_new_tokens`` per turn, seed (turn t >= 1 uses ``seed + 1_000_003 * t``), top-K).
        prompt_ids: The prompts' token ids when the caller already encoded them (e.g. cached);
            None encodes them with :func:`encode_task`.

    Returns:
        One :class:`ScoredGroup` per index, and the generation and scoring times.
    """
    if prompt_ids is None:
        prompt_ids = [encode_task(engine.tokenizer, env.tasks[i]) for i in indices]
    groups = [
        [Episode(copy.copy(env), i, list(p)) for _ in range(params.n)] for i, p in zip(indices, prompt_ids)
    ]
    running = [e for group in groups for e in group]
    for episode in running:
        episode.env.reset(options={"index": episode.index})
    context = getattr(engine, "max_model_len", None)  # engines with a fixed context length
    max_prompt_tokens = None if context is None else context - params.max_new_tokens
    generation_s = scoring_s = 0.0
    turn = 0
    while running:
        start = time.perf_counter()
        if turn == 0:
            turns = [c for group in engine.generate(prompt_ids, params) for c in group]
        else:
            sequences = [e.sequence() for e in running]
            turns = [g[0] for g in engine.generate(sequences, _turn_params(params, turn))]
        generated = time.perf_counter()
        for episode, completion in zip(running, turns):
            take_turn(engine.tokenizer, episode, completion, max_prompt_tokens)
        running = [e for e in running if not e.done]
        turn += 1
        generation_s += generated - start
        scoring_s += time.perf_counter() - generated
    return Rollout([_scored_group(group) for group in groups], generation_s, scoring_s)


def rollout_chunks(
    engine: RolloutEngine,
    env,
    indices: Sequence[int],
    params: SamplingParams,
    *,
    chunk_size: int,
    skip: Callable[[int], bool] = lambda chunk: False,
) -> Iterator[tuple[int, list[int], Optional[Rollout]]]:
    """Rolls out ``indices`` ``chunk_size`` prompts at a time (:func:`rollout`); chunk j samples
    with seed ``params.seed + j``, so its samples depend only on the chunk (a resumed run or one
    over fewer chunks gives the same ones). Evaluation, pre-sampling and the tiny models'
    quality check call it.

    Yields:
        (j, the chunk's task indices, its :class:`Rollout`), lazily; the rollout is None for a
        chunk where ``skip(j)`` holds (e.g. one whose results a resumed run has already).
    """
    for j, start in enumerate(range(0, len(indices), chunk_size)):
        chunk = list(indices[start : start + chunk_size])
        result = None if skip(j) else rollout(engine, env, chunk, dataclasses.replace(params, seed=params.seed + j))
        yield j, chunk, result
