"""The rollout-engine contract: :class:`RolloutEngine`, its inputs and outputs, and its argument check.

An engine turns token-id prompts into groups of sampled completions and reports, for every
sampled token, its log-prob μ under the rollout policy softmax(logits / temperature): the
behaviour policy that DPPO's trust region and importance ratios are anchored on, and (in
pre-sampling) the stored π_ref of DPH's reference responses. ``rllib_dph.engines.check``
checks an engine against this contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Protocol, Sequence, runtime_checkable

import numpy as np
import torch

#: Most top log-probs an engine reports per token (``SamplingParams.top_k_logprobs``).
MAX_TOP_K_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: the one owner of the sampling settings, named as here everywhere.

    Pre-sampling and evaluation embed one each (``PresampleConfig.sampling``,
    ``EvalSettings.sampling``); a training config keeps its public ``max_response_length``,
    ``group_size`` and ``rollout_top_k``, mapped to ``max_new_tokens``, ``n`` and
    ``top_k_logprobs`` in one place, ``GRPOConfig.sampling_params()``.

    Attributes:
        n: Completions per prompt (the GRPO group size), >= 1.
        temperature: Softmax temperature, > 0; 0 means greedy decoding (μ is then the log-prob
            under the untempered distribution's argmax, i.e. 0.0 for every token).
        top_p: Nucleus mass in (0, 1]; 1.0 disables it. It filters which tokens can be drawn,
            but the reported log-probs (μ and the top-K) are those of the full tempered softmax,
            not of the renormalised nucleus. One definition for μ, π_θ and π_ref: the learner
            computes π_θ as the full tempered softmax (it must be differentiable and positive on
            every token; the nucleus set jumps as θ changes, and a token outside it would get
            probability 0, an infinite log-ratio and f-divergence), so reporting the nucleus
            distribution would make π_θ/μ the nucleus mass instead of 1 at step 0. TRL and verl
            compute the policy's log-probs the same way.
        max_new_tokens: Hard limit on response tokens.
        seed: Seed of the sampler; the same seed, prompts and weights give the same samples.
        top_k_logprobs: K >= 0. When K > 0 also return, per generated token, the K most likely
            token ids of μ and their log-probs, with the sampled token always among them
            (it replaces the K-th entry when it is not in the top K). K <= 20.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 128
    seed: int | None = None
    top_k_logprobs: int = 0


@dataclass
class Completion:
    """One sampled completion of one prompt.

    An engine's completion is one policy turn. A multi-turn episode (``rllib_dph.rollout``)
    is returned as one completion too: its turns with the env's observations between them,
    which the policy did not sample; their ``logprobs`` (and ``topk_logprobs``) are NaN, and
    :attr:`policy_mask` is False there.

    Attributes:
        token_ids: (T,) int64 response token ids, EOS included when it was produced.
        logprobs: (T,) float32 μ log-prob of each sampled token; NaN on observation tokens.
        topk_ids: (T, K) int64 or None.
        topk_logprobs: (T, K) float32 or None.
        finish_reason: ``"stop"`` (EOS) or ``"length"`` (hit ``max_new_tokens``; for an episode,
            of its last turn, or the episode's token budget).
    """

    token_ids: np.ndarray
    logprobs: np.ndarray
    topk_ids: np.ndarray | None = None
    topk_logprobs: np.ndarray | None = None
    finish_reason: str = "stop"

    @property
    def policy_mask(self) -> np.ndarray:
        """(T,) bool: the tokens the policy sampled (False on env observation tokens)."""
        return ~np.isnan(self.logprobs)


@runtime_checkable
class RolloutEngine(Protocol):
    """What the env runners, evaluation and pre-sampling need from an engine.

    Every engine in ``rllib_dph.engines.ENGINES`` has these members, and ``generate`` starts
    with :func:`check_generate_args`. Beyond the signatures, an engine promises (and
    ``rllib_dph.engines.check.check_engine`` checks):

    - ``generate`` returns one list of ``params.n`` :class:`Completion` per prompt, in prompt
      order; token ids are int64 in the tokenizer's vocabulary, μ float32, finite and <= 0;
    - μ is the log-prob of the sampled token under the full tempered softmax (a teacher-forced
      recompute on the same weights gives it), and greedy decoding (temperature 0) picks the
      argmax with μ = 0;
    - a completion ends at the first stop token (EOS of the tokenizer or of the model's
      generation config, kept in the output, ``finish_reason="stop"``) or after exactly
      ``max_new_tokens`` tokens (``"length"``);
    - the same ``seed``, prompts and weights give the same completions; the ``n`` completions
      of a prompt, and equal prompts of one call, are independent samples;
    - ``top_k_logprobs=K`` gives (T, K) top-K ids and log-probs of μ with the sampled token
      among them (see :class:`SamplingParams`);
    - ``top_p < 1`` either samples in the nucleus and reports μ of the full tempered softmax
      (``EngineSpec.full_softmax_logprobs``) or is refused with ``ValueError``;
    - ``update_weights`` changes what is sampled from the next ``generate`` on, and loading
      the old state back restores the old completions.
    """

    tokenizer: Any  # the model's Hugging Face tokenizer (``decode``, ``eos_token_id``, chat template)

    @classmethod
    def from_pretrained(
        cls,
        model: str,
        *,
        dtype: Any = None,
        device: str | torch.device = "cpu",
        lora: Optional[Mapping[str, Any]] = None,
        **engine_kwargs,
    ) -> "RolloutEngine":
        """Starts the engine on a model folder or Hugging Face id (``engines.make_engine``
        resolves bundled model names first).

        Args:
            model: A ``save_pretrained`` folder (weights, config, tokenizer) or a Hugging Face id.
            dtype: Weight dtype (``"float32"``, ``"bfloat16"``, ``"float16"`` or a torch.dtype);
                None keeps the checkpoint's.
            device: Where to run (``"cpu"``, ``"cuda"``).
            lora: The LoRA settings (``GRPOConfig.lora``) of the policy whose adapter states
                ``update_weights`` will get; None for full state dicts only.
            **engine_kwargs: The engine's own settings (``GRPOConfig.engine_kwargs``).
        """
        ...

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[list[Completion]]:
        """Samples ``params.n`` completions for each prompt (token ids, no padding).

        Returns one list of ``n`` completions per prompt, in prompt order.

        Raises:
            ValueError: :func:`check_generate_args` refuses the arguments, or the engine cannot
                honour them (its message names the value and the fix).
        """
        ...

    def update_weights(self, state_dict: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        """Loads new policy weights (torch tensors or numpy arrays, cast to the engine's dtype):
        a full state dict of the HF causal LM (tied weights included), or a LoRA policy's
        adapter state (``rllib_dph.policy.lora.adapter_state``), which the engine serves on its
        base model from then on; ``from_pretrained(..., lora=settings)`` starts an engine ready
        for it. Called between ``generate`` calls."""
        ...


def check_generate_args(prompts: Sequence[Sequence[int]], params: SamplingParams) -> None:
    """The argument check every engine's ``generate`` starts with: valid params, no empty prompt.

    Raises:
        ValueError: Naming the first field of ``params`` out of range, or the first empty prompt.
    """
    check_sampling_params(params)
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token.")


def check_sampling_params(params: SamplingParams) -> None:
    """Raises ``ValueError`` naming the first field of ``params`` outside its range."""
    rules = [
        (params.n >= 1, f"n={params.n} must be >= 1"),
        (params.temperature >= 0, f"temperature={params.temperature} must be >= 0 (0 = greedy)"),
        (0 < params.top_p <= 1, f"top_p={params.top_p} must be in (0, 1] (1 disables it)"),
        (params.max_new_tokens >= 1, f"max_new_tokens={params.max_new_tokens} must be >= 1"),
        (
            0 <= params.top_k_logprobs <= MAX_TOP_K_LOGPROBS,
            f"top_k_logprobs={params.top_k_logprobs} must be in [0, {MAX_TOP_K_LOGPROBS}]",
        ),
    ]
    for ok, message in rules:
        if not ok:
            raise ValueError(f"SamplingParams: {message}; fix the value passed to SamplingParams.")
