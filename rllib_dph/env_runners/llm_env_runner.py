"""The LLM env runner: prompts → groups of completions → scored rollout batch.

RLlib's stock ``SingleAgentEnvRunner`` steps gymnasium envs through connector pipelines that
split ``spaces.Text`` observations into characters. An LLM episode is one prompt and one whole
completion, and the expensive part is batched generation, so this runner generates all
completions of a call at once through a :class:`~rllib_dph.engines.base.RolloutEngine` and uses
the env only to show prompts and score completions (both in :func:`rllib_dph.rollout.rollout`).
"""

from __future__ import annotations

import time
import warnings
from typing import TYPE_CHECKING, Collection, Optional, Union

import gymnasium as gym
import numpy as np
import ray
from ray.rllib.core import COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.env import INPUT_ENV_SPACES
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.utils.annotations import override
from ray.rllib.utils.checkpoints import Checkpointable
from ray.rllib.utils.metrics import (
    EPISODE_RETURN_MEAN,
    NUM_ENV_STEPS_SAMPLED,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_EPISODES,
    NUM_EPISODES_LIFETIME,
    WEIGHTS_SEQ_NO,
)
from ray.rllib.utils.typing import ResultDict, StateDict

from rllib_dph import columns as C
from rllib_dph.rollout.batch import sequence_rows
from rllib_dph.engines import build_engine
from rllib_dph.engines.base import SamplingParams
from rllib_dph.evaluation.runner import EvalSettings, evaluate_engine
from rllib_dph.envs import make_env
from rllib_dph.rollout.episodes import encode_task, rollout

if TYPE_CHECKING:
    from rllib_dph.env_runners.async_sampling import PublishedWeights
    from rllib_dph.evaluation.results import EvalResult

# Metric keys logged under ``env_runners/``.
REWARD_MEAN = "reward_mean"
ACCURACY = "accuracy"
RESPONSE_LENGTH_MEAN = "response_length_mean"
TRUNCATION_RATE = "truncation_rate"
GENERATION_TOKENS_PER_S = "generation_tokens_per_s"
GENERATION_TIME_S = "generation_time_s"
SCORING_TIME_S = "scoring_time_s"
TURNS_PER_EPISODE = "turns_per_episode"  # policy turns per episode (1 for single-turn envs)
TOOL_USE_SHARE = "tool_use_share"  # share of episodes with at least one tool call

#: State key of an env runner's sampling position (:meth:`LLMEnvRunner.sampling_position`).
SAMPLING_POSITION = "sampling_position"


class LLMEnvRunner(EnvRunner, Checkpointable):
    """Samples groups of completions for GRPO-family algorithms.

    Each :meth:`sample` call takes the next ``num_prompts`` prompts of this runner's shard of
    the env's tasks (reshuffled every pass), generates ``group_size`` completions per prompt,
    scores each with the env, and returns one rollout batch (see ``rllib_dph.columns``).
    The rollout engine holds the only copy of the weights on this runner; ``set_state`` with
    an ``rl_module`` component loads new weights into it.
    """

    def __init__(self, *, config, **kwargs):
        super().__init__(config=config, **kwargs)
        self.worker_index = kwargs.get("worker_index") or 0
        self.num_workers = max(1, self.config.num_env_runners)
        # The weight version the engine holds (RLlib's WEIGHTS_SEQ_NO); None until weights arrive,
        # which tells a restarted runner (Ray re-ran this constructor) from one in service.
        self.weights_version: Optional[int] = None
        self._weights_id: Optional[str] = None  # object id of the last published weights loaded
        self._num_calls = 0
        self.make_env()
        self.make_module()
        shard = np.arange(len(self.env))[max(0, self.worker_index - 1) :: self.num_workers]
        if len(shard) == 0:
            raise ValueError(
                f"env runner {self.worker_index} got no tasks: the env has {len(self.env)} tasks "
                f"for {self.num_workers} env runners; use fewer env runners."
            )
        self._shard = shard
        # The sampling position: prompts taken and sample calls made so far. The prompt order
        # and the sampling seeds are functions of it, so a checkpoint that keeps it
        # (:meth:`sampling_position`) resumes exactly where the run stopped.
        self._prompts_taken = 0
        self._order_pass, self._order = -1, shard
        self._prompt_ids: dict[int, list[int]] = {}
        self._eval_envs: dict[str, gym.Env] = {}

    # ------------------------------------------------------------------ building
    @override(EnvRunner)
    def make_env(self) -> None:
        self.env = make_env(self.config.env, self.config.sampling_env_config)
        if not hasattr(self.env, "tasks"):
            raise TypeError(
                f"env {self.config.env!r} is a {type(self.env).__name__}, not a verifier text env; "
                "LLMEnvRunner needs an env built on rllib_dph.envs.base.VerifierEnv."
            )

    @override(EnvRunner)
    def make_module(self) -> None:
        self.engine = build_engine(self.config)
        self.tokenizer = self.engine.tokenizer

    @override(EnvRunner)
    def assert_healthy(self):
        assert self.env is not None and self.engine is not None

    @override(EnvRunner)
    def get_spaces(self):
        spaces = (self.env.observation_space, self.env.action_space)
        return {INPUT_ENV_SPACES: spaces, DEFAULT_MODULE_ID: spaces}

    # ------------------------------------------------------------------ sampling
    def _next_prompts(self, num_prompts: int) -> list[int]:
        """The next ``num_prompts`` task indices of this runner's shard: pass ``p`` over the shard
        is its permutation by ``default_rng([seed, worker_index, p])``."""
        chosen: list[int] = []
        while len(chosen) < num_prompts:
            num_pass, at = divmod(self._prompts_taken, len(self._shard))
            if num_pass != self._order_pass:
                rng = np.random.default_rng([self.config.seed or 0, self.worker_index, num_pass])
                self._order_pass, self._order = num_pass, rng.permutation(self._shard)
            take = self._order[at : at + num_prompts - len(chosen)].tolist()
            chosen += take
            self._prompts_taken += len(take)
        return chosen

    def _encode(self, index: int) -> list[int]:
        if index not in self._prompt_ids:
            self._prompt_ids[index] = encode_task(self.tokenizer, self.env.tasks[index])
        return self._prompt_ids[index]

    def sampling_params(self) -> SamplingParams:
        """The config's sampling (``GRPOConfig.sampling_params``) with this runner's seed of this call."""
        cfg = self.config
        return cfg.sampling_params(seed=(cfg.seed or 0) * 7919 + 104729 * self.worker_index + self._num_calls)

    @override(EnvRunner)
    def sample(self, *, num_prompts: Optional[int] = None, **kwargs) -> dict[str, np.ndarray]:
        """Generates and scores ``group_size`` completions for each of ``num_prompts`` prompts.

        Returns:
            A rollout batch with ``num_prompts * group_size`` rows, one per episode (a GRPO
            group is a prompt's episodes): per-token columns ``INPUT_IDS``, ``ATTENTION_MASK``,
            ``RESPONSE_MASK`` (0 on a multi-turn episode's observations), ``BEHAVIOR_LOGP``
            (and top-K columns when ``rollout_top_k > 0``), per-row ``REWARDS``, ``CORRECT``, ``TRUNCATED``,
            ``GROUP_IDS`` (unique across runners and calls), ``ROW_TYPE`` (exploration).
        """
        if num_prompts is None:
            num_prompts = self.config.prompts_per_step
        indices = self._next_prompts(num_prompts)
        prompts = [self._encode(i) for i in indices]
        params = self.sampling_params()
        self._num_calls += 1
        sampled = rollout(self.engine, self.env, indices, params, prompt_ids=prompts)

        rows = [(group, c) for group in sampled.groups for c in group.completions]
        completions = [c for _, c in rows]
        batch = sequence_rows(
            [group.prompt_ids for group, _ in rows],
            [c.token_ids for c in completions],
            [c.logprobs for c in completions],
            topk_ids=[c.topk_ids for c in completions] if params.top_k_logprobs else None,
            topk_logp=[c.topk_logprobs for c in completions] if params.top_k_logprobs else None,
        )
        # Group ids unique across env runners and calls: (call, runner, prompt slot).
        base = (self._num_calls * 4096 + self.worker_index) * 65536
        batch[C.GROUP_IDS] = base + np.repeat(np.arange(num_prompts), params.n)
        batch[C.REWARDS] = np.concatenate([group.rewards for group in sampled.groups])
        batch[C.CORRECT] = np.concatenate([group.correct for group in sampled.groups])
        batch[C.TRUNCATED] = np.array([c.finish_reason == "length" for c in completions])
        batch[C.ROW_TYPE] = np.full(len(rows), C.ROW_TYPE_EXP, dtype=np.int64)

        num_tokens = int(batch[C.RESPONSE_MASK].sum())  # sampled tokens, not env observations
        self._log_sample_metrics(batch, num_tokens, sampled.generation_time_s, sampled.scoring_time_s)
        turns = np.concatenate([group.turns for group in sampled.groups])  # (B,)
        tool_calls = np.concatenate([group.tool_calls for group in sampled.groups])  # (B,)
        self.metrics.log_value(TURNS_PER_EPISODE, float(turns.mean()), window=1)
        self.metrics.log_value(TOOL_USE_SHARE, float((tool_calls > 0).mean()), window=1)
        return batch

    def _log_sample_metrics(self, batch, num_tokens: int, gen_time: float, score_time: float):
        n = len(batch[C.REWARDS])
        self.num_env_steps_sampled_lifetime += n
        m = self.metrics
        m.log_value(NUM_ENV_STEPS_SAMPLED, n, reduce="sum")
        m.log_value(NUM_ENV_STEPS_SAMPLED_LIFETIME, n, reduce="lifetime_sum")
        m.log_value(NUM_EPISODES, n, reduce="sum")
        m.log_value(NUM_EPISODES_LIFETIME, n, reduce="lifetime_sum")
        m.log_value(EPISODE_RETURN_MEAN, float(batch[C.REWARDS].mean()), window=1)
        m.log_value(REWARD_MEAN, float(batch[C.REWARDS].mean()), window=1)
        m.log_value(ACCURACY, float(batch[C.CORRECT].mean()), window=1)
        m.log_value(RESPONSE_LENGTH_MEAN, float(batch[C.RESPONSE_LENGTH].mean()), window=1)
        m.log_value(TRUNCATION_RATE, float(batch[C.TRUNCATED].mean()), window=1)
        m.log_value(GENERATION_TOKENS_PER_S, num_tokens / max(gen_time, 1e-9), window=1)
        m.log_value(GENERATION_TIME_S, gen_time, reduce="sum")
        m.log_value(SCORING_TIME_S, score_time, reduce="sum")

    @override(EnvRunner)
    def get_metrics(self) -> ResultDict:
        return self.metrics.reduce()

    def load_weights(self, weights: "PublishedWeights") -> bool:
        """Loads published weights unless this runner holds that very publication already
        (compared by object id, not version: a restored checkpoint may reuse a version number).

        Returns:
            Whether this runner held no weights at all: Ray restarted it (re-ran the
            constructor) since the driver last synced it.
        """
        held_none = self.weights_version is None
        if weights.state.hex() != self._weights_id:
            self._load_module_state(ray.get(weights.state)[COMPONENT_RL_MODULE])
            self.weights_version, self._weights_id = weights.version, weights.state.hex()
        return held_none

    def sample_round(
        self, *, num_prompts: int, weights: "PublishedWeights", position: Optional[dict[str, int]] = None
    ) -> tuple[dict, ResultDict, dict]:
        """One env runner's share of a sampling round (``rllib_dph.env_runners.async_sampling``).

        Loads ``weights`` first when this runner holds another version: a runner that Ray
        restarted after a crash holds the model's initial weights, and in asynchronous mode the
        driver sends no separate weight sync (the runner is busy sampling; the request carries
        the weights instead). RLlib's own restart path would push weights without their version.

        Args:
            num_prompts: Prompts to sample ``group_size`` completions for.
            weights: The published weights (version and object ref) this share is sampled with.
            position: The sampling position to sample from (:meth:`sampling_position`); None
                continues from this runner's own. The driver sends it with every request, so a
                runner that Ray restarted (its position back at the start) continues where the
                driver knows it stood.

        Returns:
            ``(batch, metrics, info)``: :meth:`sample`'s batch plus a ``WEIGHT_VERSION`` column
            (B,), this runner's metrics, and ``info = {"restarted": bool}`` (True when this
            runner held no weights at all: Ray restarted it since the last weight sync).
        """
        restarted = self.load_weights(weights)
        if position is not None:
            self.set_sampling_position(position)
        batch = self.sample(num_prompts=num_prompts)
        batch[C.WEIGHT_VERSION] = np.full(len(batch[C.REWARDS]), self.weights_version, dtype=np.int64)
        return batch, self.get_metrics(), {"restarted": restarted}

    def evaluate_split(self, env_config: dict, *, n: int, limit: Optional[int] = None, seed: int = 0) -> "EvalResult":
        """pass@k, greedy accuracy, mean@n, style shares of the current weights on an env split,
        with the record of every prompt.

        Samples with the config's sampling settings (``GRPOConfig.sampling_params``), ``n`` per prompt.

        Args:
            env_config: The env's keyword arguments for the split (the env is built once per split).
            n: Samples per prompt.
            limit: Evaluate only the first ``limit`` tasks; None evaluates all.
            seed: Sampling seed (see :class:`~rllib_dph.evaluation.runner.EvalSettings`).

        Returns:
            The :class:`~rllib_dph.evaluation.results.EvalResult` of
            :func:`rllib_dph.evaluation.runner.evaluate_engine` (``flat_metrics()``: the numbers).
        """
        key = repr(sorted(env_config.items()))
        if key not in self._eval_envs:
            self._eval_envs[key] = make_env(self.config.env, env_config)
        sampling = self.config.sampling_params(n=n, seed=seed, top_k_logprobs=0)
        settings = EvalSettings(sampling=sampling, limit=limit)
        return evaluate_engine(self.engine, self._eval_envs[key], settings)

    # ------------------------------------------------------------------ state
    @override(Checkpointable)
    def get_state(
        self,
        components: Optional[Union[str, Collection[str]]] = None,
        *,
        not_components: Optional[Union[str, Collection[str]]] = None,
        **kwargs,
    ) -> StateDict:
        """Counters only (the weights always come from the learner group): the env steps sampled
        and the sampling position (:meth:`sampling_position`)."""
        return {NUM_ENV_STEPS_SAMPLED_LIFETIME: self.num_env_steps_sampled_lifetime,
                SAMPLING_POSITION: self.sampling_position()}

    @override(Checkpointable)
    def set_state(self, state: StateDict) -> None:
        """Loads policy weights into the rollout engine (``rl_module`` component).

        The weights are loaded unless this runner already holds their version
        (``WEIGHTS_SEQ_NO``; 0 or missing always loads), and that version becomes this runner's,
        also when it is lower: a restored checkpoint starts an older lineage, whose rows must
        never pass for newer ones. Calls from the driver arrive in the order they were sent.
        """
        if COMPONENT_RL_MODULE in state:
            seq_no = state.get(WEIGHTS_SEQ_NO, 0)
            if seq_no == 0 or seq_no != self.weights_version:
                self._load_module_state(state[COMPONENT_RL_MODULE])
                self._weights_id = None
            self.weights_version = seq_no
        if NUM_ENV_STEPS_SAMPLED_LIFETIME in state:
            self.num_env_steps_sampled_lifetime = state[NUM_ENV_STEPS_SAMPLED_LIFETIME]
        if SAMPLING_POSITION in state:
            self.set_sampling_position(state[SAMPLING_POSITION])

    def sampling_position(self) -> dict[str, int]:
        """Where this runner's sampling stands: ``{"prompts_taken": int, "num_calls": int}``.
        Its next prompts, sampling seeds and group ids follow from it alone."""
        return {"prompts_taken": self._prompts_taken, "num_calls": self._num_calls}

    def set_sampling_position(self, position: dict[str, int]) -> None:
        """Continues sampling from a :meth:`sampling_position` (a restored checkpoint's)."""
        self._prompts_taken, self._num_calls = int(position["prompts_taken"]), int(position["num_calls"])

    def _load_module_state(self, weights) -> None:
        """Loads an ``rl_module`` state (or an object ref of one) into the rollout engine."""
        if isinstance(weights, ray.ObjectRef):
            weights = ray.get(weights)
        weights = weights.get(DEFAULT_MODULE_ID, weights)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            # Arrays mapped from Ray's object store are read-only; the engines copy them into their
            # own parameters and never write them.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            self.engine.update_weights(weights)
        self.metrics.log_value("weight_sync_time_s", time.perf_counter() - t0, window=1)

    @override(Checkpointable)
    def get_ctor_args_and_kwargs(self):
        return (), {"config": self.config}

    @override(Checkpointable)
    def get_checkpointable_components(self):
        return []

    @override(EnvRunner)
    def stop(self) -> None:
        self.env.close()
