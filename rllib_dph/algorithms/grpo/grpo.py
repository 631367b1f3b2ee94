"""GRPO (Shao et al. 2024) and its usual variants on RLlib's new API stack.

Variants are config choices, not separate algorithms: DAPO's clip-higher
(``trust_region={"kind": "ppo", "high": 0.28}``), dynamic sampling and overlong reward shaping
(Yu et al. 2025); Dr. GRPO's unnormalised
advantages and constant-length aggregation (Liu et al. 2025); a reverse-KL penalty to a frozen
reference model (``kl_coeff > 0``, the "RKL" baseline of the DPH-RL paper); and DPPO's trust
regions (``trust_region="dppo_*"``, Qi et al. 2025) in place of ratio clipping.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from typing import TYPE_CHECKING, Optional, Type, Union

import numpy as np
import torch
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.core import COMPONENT_LEARNER_GROUP, DEFAULT_MODULE_ID
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    EVALUATION_RESULTS,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TIMERS,
)

from rllib_dph import columns as C
from rllib_dph.env_runners.async_sampling import SamplingRounds
from rllib_dph.algorithms.rules import BoolRule, ChoiceRule, CrossRule, NumberRule, first_violation
from rllib_dph.algorithms.grpo.grpo_torch_learner import GRPOTorchLearner
from rllib_dph.algorithms.grpo.trust_region import TrustRegion, TrustRegionRule
from rllib_dph.engines import DEFAULT_ENGINE, ENGINES, SamplingParams
from rllib_dph.algorithms.setters import setter
from rllib_dph.algorithms.checkpoints import intact_checkpoint, refuse_damaged
from rllib_dph.files import atomic_dir, write_manifest
from rllib_dph.learners.remote_calls import BoundedLearnerGroup, read_learner_weights, update_remote_learners
from rllib_dph.policy.lora import lora_problem
from rllib_dph.rollout.batch import concat_batches, select_rows
from rllib_dph.learners.splits import num_minibatches, shard_groups
from rllib_dph.learners.finite import CONSECUTIVE_SKIPPED_UPDATES
from rllib_dph.learners.sharding import SHARDINGS, ShardedLearnerGroup
from rllib_dph.losses.advantages import group_advantages, has_reward_variance, overlong_penalty
from rllib_dph.losses.divergences import KL_ESTIMATORS
from rllib_dph.losses.tokens import AGGREGATIONS

if TYPE_CHECKING:
    from rllib_dph.evaluation.results import EvalResult


def _free_space(path: str) -> str:
    """``"<n> MiB free on <path>"`` (of its nearest existing folder), or why it is unknown."""
    folder = path
    while folder and not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        return f"{shutil.disk_usage(folder or '.').free / 2**20:.1f} MiB free on {folder or '.'}"
    except OSError as e:
        return f"the free space of {path} is unknown ({e})"


#: Algorithm state key: each remote env runner's sampling position (``LLMEnvRunner.sampling_position``)
#: by env runner id; the local env runner's is in its own state.
SAMPLING_POSITIONS = "env_runner_sampling_positions"
#: Algorithm state key: the rounds sampled ahead with ``max_staleness > 0`` (``SamplingRounds.rounds_ahead``).
ROUNDS_AHEAD = "sampling_rounds_ahead"
#: Result key of the per-step phase times (seconds of this iteration, not smoothed).
STEP_TIMES = "step_times"

#: Learner compute dtypes (``float16`` is refused: see ``GRPOConfig.llm_rules``).
DTYPES = ("float32", "bfloat16")
#: What ``lora`` asks of itself and of the other fields (``GRPOConfig.llm_rules``).
LORA_RULES = (
    CrossRule("lora: None or valid LoRA settings", lambda c: lora_problem(c.lora) is not None, lambda c: lora_problem(c.lora)),
    CrossRule(
        "a LoRA policy's reference is its own base",
        lambda c: c.lora is not None and c.reference_model not in ("initial", None),
        lambda c: (
            f"reference_model={c.reference_model!r} with lora={c.lora}: with LoRA, π_ref is the "
            "policy's base model with its adapters disabled (no second model is loaded); set "
            "reference_model='initial', or lora=None to load another reference model."
        ),
    ),
)


class GRPOConfig(AlgorithmConfig):
    """Configuration of :class:`GRPO`.

    Example:
        .. code-block:: python

            config = (
                GRPOConfig()
                .environment("rllib_dph/SQL-v0", env_config={"data": "sql_synth/train"})
                .llm(model_name="tiny-sql-math")
                .training(group_size=8, prompts_per_step=16, lr=1e-5)
            )
            algo = config.build_algo()
            algo.train()
    """

    def __init__(self, algo_class=None):
        super().__init__(algo_class=algo_class or GRPO)
        # LLM and rollout engine.
        self.model_name = "tiny-sql-math"
        self.dtype = "float32"
        self.engine = DEFAULT_ENGINE
        self.engine_kwargs = {}
        self.temperature = 1.0
        self.top_p = 1.0
        self.max_response_length = 128
        self.gradient_checkpointing = False
        self.reference_model = "initial"
        self.lora = None
        # Sampling.
        self.group_size = 8
        self.prompts_per_step = 16
        self.dynamic_sampling = False
        self.max_dynamic_sampling_rounds = 4
        self._init_sampling_limits()
        # Advantages and reward shaping.
        self.normalize_advantage_std = True
        self.overlong_buffer_length = 0
        # Policy loss.
        self.trust_region = "ppo"
        self.clip_ratio_c = 3.0
        self.rollout_top_k = 0
        self.loss_agg_mode = "token-mean"
        self.kl_coeff = 0.0
        self.kl_estimator = "k3"
        self.entropy_coeff = 0.0
        self.max_consecutive_skipped_updates = 5
        self.max_tokens_per_microbatch = None
        # RLlib settings that fit an LLM policy.
        self.lr = 1e-5
        self.grad_clip = 1.0
        self.grad_clip_by = "global_norm"
        self.num_epochs = 1
        self.minibatch_size = None
        self.shuffle_batch_per_epoch = True
        self.num_env_runners = 0
        self.sharding = "ddp"
        # The learner skips a whole non-finite step itself (`learners.finite.SkipNonFiniteSteps`);
        # RLlib's per-tensor check would only repeat it (one device sync per parameter tensor).
        self.torch_skip_nan_gradients = True
        # Validation during training.
        self.val_interval = 0
        self.val_env_config = None
        self.val_n = 8
        self.val_limit = None
        self._init_env_runners()

    def _init_env_runners(self) -> None:
        """Env runners are ``LLMEnvRunner``s; weights reach them through ``sync_weights``, and
        there are no connector states to merge or broadcast."""
        from rllib_dph.env_runners.llm_env_runner import LLMEnvRunner

        self.merge_env_runner_states = False
        self.broadcast_env_runner_states = False
        self.env_runner_cls = LLMEnvRunner

    def _init_sampling_limits(self) -> None:
        """Defaults of asynchronous sampling and of the timeouts of every blocking wait
        (docs/faults.md: ``rllib_dph.env_runners.async_sampling``, ``learners.remote_calls``, ``learners.collectives``)."""
        self.max_staleness = 0
        self.sample_timeout_s = 1800.0  # RLlib's field; its default (60 s) is short for LLM rollouts
        self.weight_sync_timeout_s = 600.0
        self.learner_update_timeout_s = 1800.0
        self.collective_timeout_s = 1800.0

    @override(AlgorithmConfig)
    def get_default_learner_class(self) -> Union[Type, str]:
        return GRPOTorchLearner

    @override(AlgorithmConfig)
    def get_default_rl_module_spec(self) -> RLModuleSpec:
        from rllib_dph.policy.rl_module import LLMRLModule

        return RLModuleSpec(module_class=LLMRLModule, model_config=self.llm_model_config)

    @property
    def llm_model_config(self) -> dict:
        """The ``model_config`` of the learner's :class:`~rllib_dph.policy.rl_module.LLMRLModule`."""
        return {
            "model": self.model_name,
            "dtype": self.dtype,
            "temperature": self.temperature,
            "gradient_checkpointing": self.gradient_checkpointing,
            "lora": self.lora,
            "entropy_with_grad": self.entropy_coeff != 0,
        }

    def sampling_params(self, **changes) -> SamplingParams:
        """The config's sampling settings as one ``SamplingParams``, with ``changes`` (e.g. ``n=1``)
        set: the one place that maps them (``max_response_length`` → ``max_new_tokens``,
        ``group_size`` → ``n``, ``rollout_top_k`` → ``top_k_logprobs``, seed None → 0). The env
        runners, validation and DPH's pre-sampling sample with it."""
        settings = dict(n=self.group_size, temperature=self.temperature, top_p=self.top_p,
                        max_new_tokens=self.max_response_length, seed=self.seed or 0, top_k_logprobs=self.rollout_top_k)
        return SamplingParams(**{**settings, **changes})

    def reference_model_users(self) -> list[str]:
        """The settings that need a live reference model (here: the KL penalty)."""
        return [f"kl_coeff={self.kl_coeff}"] if self.kl_coeff > 0 else []

    @property
    def needs_reference_model(self) -> bool:
        """Whether the learner loads the frozen reference model π_ref."""
        return bool(self.reference_model_users())

    @property
    def reference_model_name(self) -> Optional[str]:
        """Name or path of π_ref (``model_name`` for ``reference_model="initial"``)."""
        return self.model_name if self.reference_model == "initial" else self.reference_model

    @property
    def sampling_env_config(self) -> dict:
        """The env kwargs the env runners sample prompts from."""
        return dict(self.env_config)

    @property
    def trust_region_setting(self) -> TrustRegion:
        """``trust_region`` with the spec's defaults in place of None (``TrustRegion.resolved``):
        the kind, thresholds, truncation and anchor the learner uses."""
        return TrustRegion.of(self.trust_region).resolved()

    #: The rules of ``llm()``'s fields (``validate``).
    llm_rules = (
        NumberRule("temperature", low=0, low_open=True, fix="e.g. 1.0 (0 would be greedy: equal completions, no advantages)"),
        NumberRule("top_p", low=0, high=1, low_open=True, fix="1.0 disables nucleus sampling"),
        NumberRule("max_response_length", integer=True, low=1, fix="e.g. 128"),
        CrossRule(  # before the dtype choice: it says why float16 is not one
            "no float16 training",
            lambda c: c.dtype == "float16",
            lambda c: (
                "dtype='float16' would train the learner under fp16 autocast, which needs loss "
                "scaling (a GradScaler) against gradient underflow, and this learner has none; "
                "set dtype='bfloat16' (fp32's exponent range: no scaling needed) or 'float32'. "
                "For an fp16 rollout engine only, set engine_kwargs={'dtype': 'float16'}."
            ),
        ),
        ChoiceRule("engine", ENGINES),
        ChoiceRule("dtype", DTYPES),
        CrossRule(
            "nucleus log-probs need top_p = 1",
            lambda c: c.engine in ENGINES and not ENGINES[c.engine].full_softmax_logprobs and c.top_p < 1,
            lambda c: (
                f"engine={c.engine!r} with top_p={c.top_p}: that engine reports log-probs of the top-p-"
                "renormalised nucleus, not of the full tempered softmax the learner's π_θ is "
                "(engines.base.SamplingParams), so π_θ/μ would start at the nucleus mass instead "
                f"of 1; set top_p=1.0 (as DAPO and DPH-RL do) or engine={DEFAULT_ENGINE!r}."
            ),
        ),
        CrossRule(
            "a reference model may be loaded when a term needs one",
            lambda c: c.needs_reference_model and c.reference_model is None,
            lambda c: (
                f"this config needs a live reference model ({', '.join(c.reference_model_users())}), "
                "but reference_model=None forbids loading one; set reference_model='initial' "
                "(or a model path), or drop the term that needs it."
            ),
        ),
        *LORA_RULES,
    )

    @setter
    def llm(self, given: dict) -> None:
        """Sets the policy model and how rollouts are generated.

        Args:
            model_name: The policy: a bundled model name (``"tiny-sql-math"``; the run's preparation
                step builds one not built yet), a local directory, or a Hugging Face id
                (``"Qwen/Qwen2.5-3B"``, loaded from the local HF cache). Default ``"tiny-sql-math"``.
            dtype: Compute dtype: ``"float32"`` (default) or ``"bfloat16"``. With
                ``"bfloat16"`` the learner trains in mixed precision (as FSDP, verl and TRL do):
                parameters and Adam state stay float32 (master weights; checkpoints hold them)
                and the forward pass runs under ``torch.autocast(dtype=torch.bfloat16)``;
                log-probs, entropies and losses are computed in float32. The frozen reference
                model (``kl_coeff > 0``) runs the same way, so the KL starts at exactly 0. The
                rollout engine holds its weights in this dtype unless ``engine_kwargs`` names
                one. ``"float16"`` is refused: fp16 training needs loss scaling, which this
                learner does not do; an fp16 rollout engine is ``engine_kwargs={"dtype":
                "float16"}``.
            engine: Rollout engine, a key of ``rllib_dph.engines.ENGINES``: ``"hf"`` (transformers,
                CPU or GPU; default) or ``"vllm"``.
            engine_kwargs: Passed to the engine (e.g. ``{"dtype": "bfloat16",
                "gpu_memory_utilization": 0.5}`` for vLLM, ``{"max_batch_size": 128}`` or
                ``{"compile_decode": True}`` (static KV cache, CUDA graphs) for HF).
            temperature: Sampling temperature > 0 (default 1.0). The learner computes π_θ at the
                same temperature, so μ and π_θ are the same distribution family.
            top_p: Nucleus sampling mass in (0, 1] (default 1.0).
            max_response_length: Maximum generated tokens per completion (default 128).
            gradient_checkpointing: Recompute activations in the backward pass (default False).
            reference_model: The frozen π_ref that terms needing a live reference model use
                (the KL penalty, DPH's JS-definition variant): ``"initial"`` (default, a copy of
                ``model_name``), another model name or path, or None to forbid loading one.
            lora: None (default): full fine-tuning; LoRA settings such as ``{"r": 16, "alpha": 32,
                "target_modules": "all-linear", "dropout": 0.0}`` train adapters on the frozen
                base instead (HF engine; π_ref is the base, no second model): ``docs/lora.md``.
        """

    #: The rules of ``training()``'s fields, RLlib's among them (``validate``).
    training_rules = (
        NumberRule("lr", low=0, low_open=True, fix="a learning rate such as 3e-4 (tiny model) or 1e-6 (7B)"),
        NumberRule("grad_clip", low=0, low_open=True, optional=True, fix="e.g. 1.0, or None to disable clipping"),
        NumberRule("num_epochs", integer=True, low=1, fix="1 for one pass over each batch"),
        NumberRule("minibatch_size", integer=True, low=1, optional=True, fix="e.g. 32 rows, or None for one step per batch"),
        NumberRule("group_size", integer=True, low=2, fix="GRPO needs >= 2 completions per prompt, e.g. 8"),
        NumberRule("prompts_per_step", integer=True, low=1, fix="e.g. 16"),
        NumberRule("max_dynamic_sampling_rounds", integer=True, low=1, fix="e.g. 4"),
        NumberRule("overlong_buffer_length", integer=True, low=0, fix="0 disables DAPO's overlong shaping"),
        NumberRule("clip_ratio_c", low=1, low_open=True, optional=True, fix="dual clip: 3.0 as in verl, or None to disable"),
        NumberRule("rollout_top_k", integer=True, low=0, high=20, fix="0 for none, 20 for the top-K DPPO masks"),
        NumberRule("kl_coeff", low=0, fix="0 disables the KL penalty (RKL baseline: 0.01)"),
        NumberRule("entropy_coeff", low=0, fix="0 disables the entropy bonus"),
        NumberRule("max_consecutive_skipped_updates", integer=True, low=1, fix="default 5"),
        NumberRule("max_tokens_per_microbatch", integer=True, low=1, optional=True, fix="e.g. 16384, or None for one pass per mini-batch"),
        NumberRule("max_staleness", integer=True, low=0, fix="0 for synchronous sampling, 1 to overlap sampling and update"),
        ChoiceRule("loss_agg_mode", AGGREGATIONS),
        ChoiceRule("kl_estimator", KL_ESTIMATORS),
        TrustRegionRule(),
        CrossRule(
            "asynchronous sampling needs remote env runners",
            # RLlib validates an evaluation copy too, whose env runners are the evaluation ones.
            lambda c: c.max_staleness > 0 and c.num_env_runners < 1 and not c.in_evaluation,
            lambda c: (
                f"max_staleness={c.max_staleness} samples on remote env runners while the learners "
                f"update, but num_env_runners={c.num_env_runners} samples in the driver; set "
                ".env_runners(num_env_runners=1) or more, or max_staleness=0."
            ),
        ),
        CrossRule(
            "a prompt per env runner and per learner",
            lambda c: c.prompts_per_step < max(1, c.num_env_runners, c.num_learners),
            lambda c: (
                f"prompts_per_step={c.prompts_per_step} must be >= num_env_runners="
                f"{c.num_env_runners} and >= num_learners={c.num_learners} (every env runner "
                "samples, and every learner trains on, at least one prompt per step)."
            ),
        ),
        CrossRule(
            "overlong buffer shorter than the response",
            lambda c: c.overlong_buffer_length >= c.max_response_length,
            lambda c: (
                f"overlong_buffer_length={c.overlong_buffer_length} must be < "
                f"max_response_length={c.max_response_length}; 0 disables it."
            ),
        ),
        CrossRule(
            "mini-batches of whole groups",
            lambda c: c.minibatch_size is not None
            and not (c.minibatch_size <= c.train_rows_per_step and c.minibatch_size % c.group_size == 0),
            lambda c: (
                f"minibatch_size={c.minibatch_size} must be a multiple of group_size="
                f"{c.group_size} (groups stay whole) and <= prompts_per_step * group_size = "
                f"{c.train_rows_per_step} (it counts exploration rows over all learners); or None for one "
                "optimizer step per epoch."
            ),
        ),
    )

    @override(AlgorithmConfig)
    @setter
    def training(self, given: dict) -> None:
        """Sets the training related configuration.

        Args:
            group_size: Completions per prompt, n >= 2 (GRPO's group; default 8).
            prompts_per_step: Prompts per training iteration (default 16); the train batch has
                ``prompts_per_step * group_size`` rows.
            dynamic_sampling: DAPO dynamic sampling: drop groups whose rewards are all equal
                (zero advantage) and sample more prompts until ``prompts_per_step`` groups with
                signal are collected or ``max_dynamic_sampling_rounds`` rounds were drawn.
            max_dynamic_sampling_rounds: Upper bound on sampling rounds per step (default 4).
            normalize_advantage_std: Divide group-centred rewards by the group std (GRPO);
                False gives Dr. GRPO's mean-only advantages.
            overlong_buffer_length: DAPO soft overlong punishment: responses longer than
                ``max_response_length - overlong_buffer_length`` get a linear penalty reaching
                -1 at the limit. 0 (default) disables it.
            trust_region: The trust region or off-policy correction, one grouped setting
                (``trust_region.TrustRegion``; table in ``docs/trust_regions.md``): a name of
                ``losses.TRUST_REGIONS`` or a dict of ``kind``, ``low``, ``high``,
                ``truncation``, ``anchor``, e.g. ``{"kind": "ppo", "high": 0.28}`` (DAPO
                clip-higher). A dict replaces the whole setting; a key left out or None takes
                the spec's default. Default ``"ppo"`` (ε 0.2 each side). ``"ppo"`` clips the
                ratio; DPPO's ``"dppo_binary_tv"``, ``"dppo_binary_kl"``, ``"dppo_topk_tv"``,
                ``"dppo_topk_kl"`` mask by the divergence between μ and π_θ; ``"ipo"``,
                ``"icepop"`` and ``"opsm"`` mask whatever the advantage's sign; ``"tis"`` and
                ``"cispo"`` mask nothing and truncate the weight at C (2 and 3); ``"none"``
                masks nothing.
            rollout_top_k: K log-probs per generated token returned by the engine (0..20);
                the top-K DPPO masks need K >= 1.
            loss_agg_mode: ``"token-mean"`` (DAPO; default), ``"seq-mean-token-mean"`` (GRPO),
                or ``"seq-mean-token-sum-norm"`` (Dr. GRPO, normalised by max_response_length).
            kl_coeff: β of the KL(π_θ‖π_ref) penalty to the frozen initial model (the RKL
                baseline). 0 (default) loads no reference model.
            kl_estimator: ``"k1"``, ``"k2"`` or ``"k3"`` (default) per-token KL estimator.
            entropy_coeff: Weight of an entropy bonus (default 0).
            clip_ratio_c: Dual clip (Ye et al. 2020; verl's ``clip_ratio_c``): a token with a
                negative advantage whose ratio π_θ/μ exceeds c loses its gradient
                (``losses.dual_clip_mask``); applies with every trust region. Default 3.0 as in
                verl and the original DPH-RL code; None turns it off. Must be > 1.
            max_consecutive_skipped_updates: An optimizer step whose loss or gradient norm is
                NaN/inf is skipped on all learners together and counted (``skipped_updates``);
                after this many skipped steps in a row (default 5) training stops with an error
                naming the iteration and the last finite learner metrics.
            max_tokens_per_microbatch: Split each optimizer step's rows (per learner) into
                micro-batches of at most this many padded tokens (rows of similar length
                together, each micro-batch cut to its longest row) and accumulate their
                gradients: the step and its loss normalisation are exactly the whole
                mini-batch's. Bounds activation memory; None (default) runs each mini-batch in
                one pass.
            minibatch_size: (RLlib's field) Exploration rows per optimizer step, **global**:
                summed over all learners (each learner takes its share of every mini-batch).
                Rows of one GRPO group stay in one mini-batch, so it must be a multiple of
                ``group_size``; every mini-batch of DPH also carries its share of D_pef rows.
                None (default) means one optimizer step on the whole batch per epoch. With
                ``num_epochs > 1`` and ``shuffle_batch_per_epoch`` the groups are reshuffled
                into new mini-batches every epoch.
            max_staleness: Asynchronous sampling (``rllib_dph.env_runners.async_sampling``; docs/async.md).
                0 (default): sample, update, then sync the weights (synchronous). k >= 1: the
                env runners sample up to k steps ahead of the learners with the weights they had
                when asked, so sampling overlaps the update; every row carries the weight
                version (learner updates so far) it was sampled with, and rows more than k
                versions old are dropped (``num_stale_rows_dropped``). Needs
                ``num_env_runners >= 1``. DPH's D_pef rows are added by the learner and never stale.
        """

    #: The rules of ``env_runners()``'s fields (``validate``).
    env_runner_rules = (
        NumberRule("sample_timeout_s", low=0, low_open=True, fix="seconds, generous (default 1800)"),
        NumberRule("weight_sync_timeout_s", low=0, low_open=True, fix="seconds, generous (default 600)"),
    )

    @override(AlgorithmConfig)
    @setter
    def env_runners(self, given: dict) -> None:
        """RLlib's env runner settings, plus how long a weight sync may take.

        Args:
            weight_sync_timeout_s: Seconds every env runner may take to load new weights
                (default 600) before the run stops with an error naming the runner, the weight
                version and this timeout. Synchronous mode only; asynchronous requests carry
                their weights, so ``sample_timeout_s`` bounds loading and sampling together.
            **kwargs: ``AlgorithmConfig.env_runners`` arguments. Here ``sample_timeout_s``
                (default 1800, RLlib's is 60) is how long one sampling request may take before
                the run stops with an error naming the env runner, the weight version and the
                timeout (RLlib would drop the runner's samples silently).
        """

    #: The rules of ``learners()``'s fields (``validate``).
    learner_rules = (
        NumberRule("num_learners", integer=True, low=0, fix="0 for a local learner, N for N Ray learners"),
        ChoiceRule("sharding", SHARDINGS),
        NumberRule("learner_update_timeout_s", low=0, low_open=True, fix="seconds, generous (default 1800)"),
        NumberRule("collective_timeout_s", low=0, low_open=True, high=31_536_000, fix="seconds, generous (default 1800)"),
        CrossRule(
            "fsdp2 needs two learners",
            lambda c: c.sharding == "fsdp2" and c.num_learners < 2,
            lambda c: (
                f"sharding='fsdp2' shards the model over the Ray learners, but num_learners="
                f"{c.num_learners}; set .learners(num_learners=N) with N >= 2 (e.g. one per "
                "GPU), or sharding='ddp' for a single learner."
            ),
        ),
        CrossRule(
            "learners do not share a GPU",
            lambda c: c.num_learners >= 2 and 0 < c.num_gpus_per_learner < 1,
            lambda c: (
                f"num_gpus_per_learner={c.num_gpus_per_learner} with num_learners={c.num_learners} puts "
                "two learners on one GPU, and NCCL (the learners' collectives on GPUs) refuses that "
                "('Duplicate GPU detected', measured on an H200: docs/gpu.md); give each learner a "
                "whole GPU (num_gpus_per_learner=1), or use num_learners=1 on one GPU."
            ),
        ),
        CrossRule(
            "fsdp2 clips by a global norm or by value",
            lambda c: c.sharding == "fsdp2" and c.grad_clip is not None and c.grad_clip_by == "norm",
            lambda c: (
                "grad_clip_by='norm' clips each gradient tensor by its own norm, which an FSDP2 "
                "learner only holds a shard of; with sharding='fsdp2' use grad_clip_by="
                "'global_norm' (default) or 'value'."
            ),
        ),
    )

    @override(AlgorithmConfig)
    @setter
    def learners(self, given: dict) -> None:
        """RLlib's learner settings, plus how the policy is spread over the learners and how long
        their waits may take (docs/faults.md).

        Args:
            sharding: ``"ddp"`` (default): every learner holds the whole model, fp32 weights and
                Adam state (16 bytes per parameter) and gradients are all-reduced (RLlib's DDP).
                ``"fsdp2"``: parameters, gradients and optimizer state are sharded over the
                ``num_learners >= 2`` learners with PyTorch FSDP2 (one unit per decoder layer;
                with ``dtype="bfloat16"`` layers compute in bf16, gradients reduce in fp32), so
                each learner holds 1/N of them; checkpoints and the weight sync gather the full
                state into the first learner's host memory (``rllib_dph.learners.sharding``).
            learner_update_timeout_s: Seconds one update of the remote learners
                (``num_learners >= 1``) may take (default 1800) before the run stops with a
                ``TimeoutError`` naming the learners still updating and this timeout. A learner
                that dies or raises stops the run at once, named with its worker log's last lines
                (``rllib_dph.learners.remote_calls``). The same bound applies to reading the learners'
                state for a checkpoint. A local learner runs in the driver: no timeout.
            collective_timeout_s: Seconds a collective between learners (gradient all-reduce,
                the step's token counts, FSDP2 gathers) may wait for the other learners (default
                1800): the timeout of the torch.distributed process group
                (``collectives.set_timeout``). Past it the waiting learner's update fails
                (``collectives.all_reduce`` names the collective; DDP's gradient all-reduce
                raises torch's own timeout error) and the driver names that learner.
            **kwargs: ``AlgorithmConfig.learners`` arguments (``num_learners``,
                ``num_gpus_per_learner``, ...).
        """

    @override(AlgorithmConfig)
    def build_learner_group(self, *, env=None, spaces=None, rl_module_spec=None, placement_group=None):
        """RLlib's learner group with its state reads bounded by ``learner_update_timeout_s``
        (:class:`~rllib_dph.learners.remote_calls.BoundedLearnerGroup`); with ``sharding="fsdp2"`` a
        :class:`~rllib_dph.learners.sharding.ShardedLearnerGroup` (full states gathered from every shard)."""
        if rl_module_spec is None:
            rl_module_spec = self.get_multi_rl_module_spec(env=env, spaces=spaces)
        group_class = ShardedLearnerGroup if self.sharding == "fsdp2" else BoundedLearnerGroup
        return group_class(config=self.copy(), module_spec=rl_module_spec, placement_group=placement_group)

    #: The rules of ``held_out()``'s fields (``validate``).
    held_out_rules = (
        NumberRule("val_interval", integer=True, low=0, fix="0 disables validation"),
        NumberRule("val_n", integer=True, low=1, fix="e.g. 8 samples per validation prompt"),
        NumberRule("val_limit", integer=True, low=1, optional=True, fix="None evaluates every validation prompt"),
        CrossRule(
            "validation needs a validation split",
            lambda c: bool(c.val_interval) and c.val_env_config is None,
            lambda c: (
                f"val_interval={c.val_interval} but no validation split: set "
                ".held_out(val_env_config={'data': 'sql_synth/test'}) (or val_interval=0)."
            ),
        ),
    )

    @setter
    def held_out(self, given: dict) -> None:
        """Sets the pass@k evaluation on a validation split during training.

        Every ``val_interval`` iterations (after the weight sync) one env runner samples
        ``val_n`` completions per validation prompt at the training temperature / top-p, plus
        one greedy completion, and the results land under ``evaluation/`` in the iteration's
        results (``evaluation/pass@1``, ``evaluation/pass@<n>``, ``evaluation/greedy_accuracy``,
        ``evaluation/mean@<n>``, ``evaluation/style_entropy_bits``, ...), so Tune and TensorBoard
        show pass@k curves over training.

        ``val_interval`` is the concept of RLlib's ``evaluation(evaluation_interval=...)``, but not
        its machinery: with ``evaluation_interval`` set, RLlib's ``Algorithm.setup`` builds a
        separate evaluation EnvRunnerGroup (more ``LLMEnvRunner``s, each loading another rollout
        engine and copy of the model) and ``Algorithm.evaluate`` samples episodes on it. Here one
        training env runner, which holds the current weights already, samples ``val_n``
        completions per validation prompt; so leave RLlib's ``evaluation_interval`` unset.

        Args:
            val_interval: Evaluate every N training iterations; 0 (default) disables it.
            val_env_config: Env kwargs of the validation split, e.g.
                ``{"data": "sql_synth/test"}``; merged over the training ``env_config``.
            val_n: Samples per validation prompt (default 8); pass@k for k = 1, 2, 4, ... ≤ n.
            val_limit: Evaluate only the first N validation prompts (None: all).
        """

    @property
    def train_rows_per_step(self) -> int:
        """Rows (completions) per training iteration."""
        return self.prompts_per_step * self.group_size

    #: The fields that are True or False (RLlib's shuffle_batch_per_epoch and
    #: torch_skip_nan_gradients among them).
    bool_rules = tuple(BoolRule(field) for field in (
        "gradient_checkpointing", "dynamic_sampling", "normalize_advantage_std", "shuffle_batch_per_epoch",
        "torch_skip_nan_gradients"))
    #: Every field rule, each table beside its setter (``rules.py``: the kinds of rule).
    rules = (*llm_rules, *training_rules, *env_runner_rules, *learner_rules, *held_out_rules, *bool_rules)

    @override(AlgorithmConfig)
    def validate(self) -> None:
        """Refuses bad values: the first broken number rule of ``rules``, else the first broken
        other rule (each message states the value, the rule and the fix).

        Only checks fields: never loads, builds or trains anything.
        """
        super().validate()
        problem = first_violation(self, [rule for rule in self.rules if isinstance(rule, NumberRule)])
        problem = problem or first_violation(self, [rule for rule in self.rules if not isinstance(rule, NumberRule)])
        if problem:
            self._value_error(problem)


class GRPO(Algorithm):
    """Group Relative Policy Optimization with RLlib's learner group and LLM env runners.

    One ``training_step``: sample groups of completions (with DAPO dynamic sampling if enabled)
    → shape rewards and compute group-relative advantages → learner update over epochs and
    mini-batches → sync the new weights into the env runners' rollout engines.
    """

    @classmethod
    @override(Algorithm)
    def get_default_config(cls) -> GRPOConfig:
        return GRPOConfig()

    @override(Algorithm)
    def setup(self, config) -> None:
        import rllib_dph.envs
        from rllib_dph.models.build.prepare import prepare_models

        # The preparation step of a run made in Python (``build_algo()``): a bundled model not built
        # yet is built here, saying so on stderr, before the env runners and learners load it.
        prepare_models((config.model_name, config.reference_model_name))
        # Verifier envs registered in this (driver) process reach remote env runners through
        # Ray Tune's registry.
        rllib_dph.envs.register_tune_envs()
        super().setup(config)
        self._rounds = SamplingRounds(self.env_runner_group, self.config, self.metrics)
        # `setup` skipped RLlib's connector-state sync (there is none); push the learner's
        # initial weights so that env runners and learners start from the same policy.
        self._rounds.publish(self.learner_weights())
        self._rounds.push()
        self._continue_sampling()  # a checkpoint restored inside RLlib's setup (--from-checkpoint)

    @override(Algorithm)
    def save_to_path(self, path=None, *, state=None, filesystem=None, use_msgpack: bool = False) -> str:
        """Writes the checkpoint atomically when ``path`` is a local folder (``files.atomic_dir``).

        RLlib writes a checkpoint in place, ``rllib_checkpoint.json`` first, so a save killed
        midway (kill -9, OOM, a full disk) would leave a folder that looks like a checkpoint but
        lacks state, or a previous checkpoint at ``path`` half overwritten. Here the files go to a
        sibling folder that replaces ``path`` only when complete. Tune saves through this too
        (``Algorithm.save_checkpoint``). Remote file systems (a ``filesystem`` or a URI) and
        ``path=None`` (a fresh temporary folder) keep RLlib's own writing. A relative local
        ``path`` is taken from the working folder (RLlib's own would hand it to pyarrow, which
        refuses it: "URI has empty scheme"); the absolute path is returned.
        """
        if path is None or filesystem is not None or "://" in str(path):
            return super().save_to_path(path, state=state, filesystem=filesystem, use_msgpack=use_msgpack)
        path = os.path.abspath(path)
        with atomic_dir(path) as tmp:
            super().save_to_path(str(tmp), state=state, use_msgpack=use_msgpack)
            write_manifest(tmp)  # last: a copy cut short lacks it or a file it lists (algorithms.checkpoints)
        return str(path)

    @override(Algorithm)
    def save(self, *args, **kwargs):
        """Tune's save (a checkpoint into a temporary folder, then copied into the trial folder under
        ``--storage-path``). When the copy fails (a full disk: ``OSError``, or ``EOFError`` from
        pyarrow), the partial copy is deleted at once, which frees its space for what Tune writes
        next (the experiment state that ``--resume`` reads, the trial's error), and one error names
        the folder, its free space and how to continue."""
        try:
            return super().save(*args, **kwargs)
        except (OSError, EOFError) as e:
            storage = getattr(self, "_storage", None)
            where = getattr(storage, "trial_fs_path", None) or os.getcwd()
            partial = getattr(storage, "checkpoint_fs_path", None)
            local = getattr(getattr(storage, "storage_filesystem", None), "type_name", None) == "local"
            if partial and local and os.path.isdir(partial):
                shutil.rmtree(partial, ignore_errors=True)
            raise OSError(
                getattr(e, "errno", None) or errno.EIO,
                f"saving a checkpoint of iteration {self.iteration} into {where} failed ({type(e).__name__}: {e}); "
                f"{_free_space(where)} after deleting the partial copy. Free space there (or give another "
                "--storage-path) and continue the run with rllib train --resume, which starts from the newest "
                "intact checkpoint.",
            ) from e

    @override(Algorithm)
    def load_checkpoint(self, checkpoint_dir: str) -> None:
        """Tune's restore (``rllib train --resume``): the checkpoint, or, when it is incomplete or
        damaged, the newest intact earlier one of the trial (``checkpoints.intact_checkpoint``)."""
        super().load_checkpoint(intact_checkpoint(checkpoint_dir))

    # ------------------------------------------------------------------ sampling
    def _sample_round(self, num_prompts: int) -> dict[str, np.ndarray]:
        """One sampling round of ``num_prompts`` prompts over the env runners (requested now, or
        ahead with ``max_staleness > 0``), without rows older than ``max_staleness`` versions;
        rows keep their ``WEIGHT_VERSION`` until :meth:`sample_groups` chose the step's rows."""
        batches, runner_metrics = self._rounds.next_round(num_prompts)
        self.metrics.aggregate(runner_metrics, key=ENV_RUNNER_RESULTS)
        return concat_batches(batches)

    def sample_groups(self) -> dict[str, np.ndarray]:
        """Samples ``prompts_per_step`` groups; with dynamic sampling only groups with signal.
        Logs the staleness of exactly the returned rows, from however many rounds."""
        cfg = self.config
        if not cfg.dynamic_sampling:
            return self._rounds.strip_versions(self._sample_round(cfg.prompts_per_step))
        kept, num_groups, rounds = [], 0, 0
        while num_groups < cfg.prompts_per_step and rounds < cfg.max_dynamic_sampling_rounds:
            batch = self._sample_round(cfg.prompts_per_step)
            rounds += 1
            signal = has_reward_variance(
                torch.as_tensor(batch[C.REWARDS]), torch.as_tensor(batch[C.GROUP_IDS])
            ).numpy()
            kept.append(select_rows(batch, signal))
            num_groups += len(np.unique(batch[C.GROUP_IDS][signal]))
        batch = concat_batches(kept) if num_groups else batch
        first_groups = np.unique(batch[C.GROUP_IDS])[: cfg.prompts_per_step]
        batch = select_rows(batch, np.isin(batch[C.GROUP_IDS], first_groups))
        self.metrics.log_value("dynamic_sampling_rounds", rounds, window=1)
        self.metrics.log_value("dynamic_sampling_groups_kept", num_groups, window=1)
        return self._rounds.strip_versions(batch)

    # ------------------------------------------------------------------ advantages
    def compute_advantages(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Adds ``ADVANTAGES`` (B,) to the batch: overlong shaping, then group advantages."""
        cfg = self.config
        rewards = torch.as_tensor(batch[C.REWARDS], dtype=torch.float32)  # (B,)
        if cfg.overlong_buffer_length > 0:
            rewards = rewards + overlong_penalty(
                torch.as_tensor(batch[C.RESPONSE_LENGTH]),
                max_length=cfg.max_response_length,
                cache_length=cfg.overlong_buffer_length,
            )
        adv = group_advantages(
            rewards,
            torch.as_tensor(batch[C.GROUP_IDS]),
            normalize_std=cfg.normalize_advantage_std,
        )  # (B,)
        batch[C.ADVANTAGES] = adv.numpy().astype(np.float32)
        self.metrics.log_value("shaped_reward_mean", float(rewards.mean()), window=1)
        self.metrics.log_value("advantage_abs_mean", float(adv.abs().mean()), window=1)
        return batch

    def build_train_batch(self) -> dict[str, np.ndarray]:
        """The rows of one update: online exploration rows with advantages."""
        return self.compute_advantages(self.sample_groups())

    # ------------------------------------------------------------------ training step
    @override(Algorithm)
    def training_step(self) -> None:
        cfg = self.config
        t0 = time.perf_counter()
        with self.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
            batch = self.build_train_batch()
        t1 = time.perf_counter()

        with self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
            learner_results = self.update_learners(
                batch,
                timesteps={
                    NUM_ENV_STEPS_SAMPLED_LIFETIME: self.metrics.peek(
                        (ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0
                    )
                },
                num_epochs=cfg.num_epochs,
                minibatch_size=cfg.minibatch_size,
                num_minibatches=num_minibatches(len(batch[C.INPUT_IDS]), cfg.minibatch_size),
                shuffle_batch_per_epoch=cfg.shuffle_batch_per_epoch,
            )
            self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)
            self._check_skipped_updates()
        t2 = time.perf_counter()

        with self.metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
            self._sync_weights()
        t3 = time.perf_counter()
        # This step's own phase times (RLlib's timers above are smoothed over iterations).
        for name, seconds in (("sampling_s", t1 - t0), ("learner_update_s", t2 - t1), ("weight_sync_s", t3 - t2)):
            self.metrics.log_value((STEP_TIMES, name), seconds, window=1)
        if cfg.val_interval and (self.iteration + 1) % cfg.val_interval == 0:
            self.evaluate_held_out()

    def learner_weights(self) -> dict:
        """The learner's weights and version for the env runners (``read_learner_weights``), read
        from a remote learner within ``weight_sync_timeout_s``."""
        return read_learner_weights(self.learner_group, timeout_s=self.config.weight_sync_timeout_s,
                                    actors=self.learner_group.actors)

    def update_learners(self, batch: dict[str, np.ndarray], **kwargs) -> list[dict]:
        """``LearnerGroup.update`` on ``batch`` (``kwargs``: its epochs, mini-batches, timesteps).
        Remote learners are waited for at most ``learner_update_timeout_s``, and a learner that
        dies or raises is named with its log (``remote_calls.update_remote_learners``)."""
        data = self._learner_data(batch)
        if self.learner_group.is_local:
            return self.learner_group.update(**data, **kwargs)
        return update_remote_learners(
            self.learner_group,
            data.get("batches") or [data["batch"]],
            timeout_s=self.config.learner_update_timeout_s,
            actors=self.learner_group.actors,
            **kwargs,
        )

    def _learner_data(self, batch: dict[str, np.ndarray]) -> dict:
        """The ``LearnerGroup.update`` data argument: the whole batch for a local learner, else
        one shard of whole GRPO groups per learner (RLlib's own sharding cuts rows blindly)."""
        def wrap(columns):
            rows = len(columns[C.INPUT_IDS])
            return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, env_steps=rows)

        if self.config.num_learners <= 1:
            return {"batch": wrap(batch)}
        return {"batches": [wrap(shard) for shard in shard_groups(batch, self.config.num_learners)]}

    def _check_skipped_updates(self) -> None:
        """Raises once ``max_consecutive_skipped_updates`` optimizer steps in a row were
        non-finite; remembers the last finite learner metrics for that message."""
        results = self.metrics.peek((LEARNER_RESULTS, DEFAULT_MODULE_ID), default={})
        in_a_row = results.get(CONSECUTIVE_SKIPPED_UPDATES, 0)
        if not in_a_row:
            self._last_finite_learner_metrics = {k: v for k, v in results.items() if np.isscalar(v)}
        elif in_a_row >= self.config.max_consecutive_skipped_updates:
            last = getattr(self, "_last_finite_learner_metrics", None)
            raise RuntimeError(
                f"iteration {self.iteration + 1}: {int(in_a_row)} optimizer steps in a row had a "
                f"non-finite loss or gradient norm and were skipped (max_consecutive_skipped_updates="
                f"{self.config.max_consecutive_skipped_updates}). Last finite learner metrics: "
                f"{last if last else 'none (no finite update yet)'}. Lower lr, check the rewards "
                "and the data for NaN, or restore the last checkpoint."
            )

    def evaluate_held_out(self) -> dict[str, float]:
        """pass@k & co. of the current policy on the validation split (see ``held_out()``), logged
        under ``evaluation``; :meth:`evaluate_held_out_records` gives the same numbers per prompt."""
        metrics = self.evaluate_held_out_records().flat_metrics()
        for key, value in metrics.items():
            self.metrics.log_value((EVALUATION_RESULTS, key), value, window=1)
        return metrics

    def evaluate_held_out_records(self) -> "EvalResult":
        """The validation split's evaluation of the current policy with the record of every prompt
        (``val_env_config``, ``val_n`` samples of each of the first ``val_limit`` prompts, sampling
        seed = the iteration), on the first remote env runner when there is one."""
        cfg = self.config
        env_config = {**cfg.sampling_env_config, **cfg.val_env_config}
        seed = self.iteration
        weights = self._rounds.weights

        def evaluate(runner):
            runner.load_weights(weights)  # asynchronous mode sends no weight sync
            return runner.evaluate_split(env_config, n=cfg.val_n, limit=cfg.val_limit, seed=seed)

        group = self.env_runner_group
        if group.num_healthy_remote_workers():
            return group.foreach_env_runner(evaluate, local_env_runner=False, remote_worker_ids=[1])[0]
        return evaluate(self.env_runner)

    def _sync_weights(self) -> None:
        """Publishes the learner's new weights. Synchronous mode also loads them into every env
        runner now (``weight_sync_timeout_s``); asynchronous mode lets the next sampling requests
        carry them, as the env runners are busy sampling ahead."""
        self._rounds.publish(self.learner_weights())
        if self.config.max_staleness == 0:
            self._rounds.push()

    @override(Algorithm)
    def restore_env_runners(self, env_runner_group) -> list[int]:
        """RLlib's hook before every training step. A restarted LLM env runner needs the current
        weights *and their version*; RLlib's default sends the learner's weights without it,
        with connector states these runners do not have."""
        if env_runner_group is not self.env_runner_group:
            return super().restore_env_runners(env_runner_group)
        return self._rounds.restore()

    @classmethod
    @override(Algorithm)
    def from_checkpoint(cls, path, filesystem=None, **kwargs) -> "GRPO":
        """RLlib's ``from_checkpoint``, after the check of :meth:`restore_from_path`: RLlib unpickles
        the checkpoint's ``class_and_ctor_args.pkl`` before it restores anything, so a damaged
        local checkpoint is refused here first (``GRPO.from_checkpoint`` and ``DPH.from_checkpoint``;
        ``Algorithm.from_checkpoint`` runs RLlib's code alone until the restore)."""
        if _is_local(path, filesystem):
            refuse_damaged(path)
        return super().from_checkpoint(path, filesystem, **kwargs)

    @override(Algorithm)
    def restore_from_path(self, path, *args, **kwargs) -> None:
        """RLlib's restore, then a fresh start of the sampling rounds (see :meth:`_restart_rounds`).
        A whole local checkpoint that is incomplete or damaged (``checkpoints.checkpoint_problem``)
        is refused (:class:`~rllib_dph.algorithms.checkpoints.CheckpointError`, naming the file and the
        newest intact checkpoint of its trial) before anything is loaded."""
        if kwargs.get("component") is None and _is_local(path, kwargs.get("filesystem")):
            refuse_damaged(path)
        super().restore_from_path(path, *args, **kwargs)
        self._restart_rounds()

    @override(Algorithm)
    def get_state(self, components=None, *, not_components=None, **kwargs) -> dict:
        """RLlib's state plus where each remote env runner's sampling stands
        (``SAMPLING_POSITIONS``) and, with ``max_staleness > 0``, the rounds sampled ahead
        (``ROUNDS_AHEAD``: their rows and the runners' metrics; this waits for them, and the run
        keeps them for the steps they belong to). A resumed run samples the prompts, with the
        seeds, that the uninterrupted run would, and trains on the rows it would, so resuming is
        exact in synchronous and asynchronous mode alike."""
        state = super().get_state(components, not_components=not_components, **kwargs)
        if not hasattr(self, "_rounds"):
            return state
        if self._check_component(ROUNDS_AHEAD, components, not_components):
            state[ROUNDS_AHEAD] = self._rounds.rounds_ahead()
        if self._check_component(SAMPLING_POSITIONS, components, not_components):
            state[SAMPLING_POSITIONS] = {rid: dict(position) for rid, position in self._rounds.positions.items()}
        return state

    @override(Algorithm)
    def set_state(self, state) -> None:
        """RLlib's ``set_state``; the sampling positions and rounds ahead of ``state`` take effect
        when the sampling rounds restart (:meth:`_restart_rounds`)."""
        super().set_state(state)
        if SAMPLING_POSITIONS in state or ROUNDS_AHEAD in state:
            self._restored_sampling = (state.get(SAMPLING_POSITIONS), state.get(ROUNDS_AHEAD) or [])
        if COMPONENT_LEARNER_GROUP in state:
            self._restart_rounds()

    def _restart_rounds(self) -> None:
        """After restoring learner weights: rounds requested ahead are discarded (their rows come
        from weights the restored run never had), and the env runners get the restored weights
        with the restored version (the learner's checkpointed update count), so the staleness
        bound holds across a resume; sampling continues from the restored positions and rounds
        ahead (:meth:`_continue_sampling`). A restore inside RLlib's own ``setup`` (an
        ``on_algorithm_init`` callback, as ``--from-checkpoint`` does) comes before the rounds
        exist; ``setup`` then starts them from the restored weights itself."""
        if not hasattr(self, "_rounds"):
            return
        self._rounds.discard_pending()
        self._rounds.publish(self.learner_weights())
        self._rounds.push()
        self._continue_sampling()

    def _continue_sampling(self) -> None:
        """Hands the sampling positions and rounds ahead of a restored state to the sampling rounds."""
        restored = self.__dict__.pop("_restored_sampling", None)
        if restored is None:
            return
        positions, rounds_ahead = restored
        if positions is not None:
            self._rounds.positions = {int(rid): dict(position) for rid, position in positions.items()}
        self._rounds.keep_rounds_ahead(rounds_ahead)


def _is_local(path, filesystem) -> bool:
    """Whether a checkpoint ``path`` (with RLlib's ``filesystem`` argument) is a local folder."""
    local = filesystem is None or getattr(filesystem, "type_name", None) == "local"
    return local and isinstance(path, (str, os.PathLike)) and "://" not in str(path)
