"""The rollout-engine interface shared by the HF ``transformers`` and vLLM engines.

An engine turns token-id prompts into groups of sampled completions and reports, for every
sampled token, its log-prob μ under the rollout policy softmax(logits / temperature): the
behaviour policy that DPPO's trust region and importance ratios are anchored on, and (in
pre-sampling) the stored π_ref of DPH's reference responses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence, runtime_checkable

import numpy as np
import torch


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
    """What the env runner and the pre-sampling stage need from an engine."""

    tokenizer: object  # a Hugging Face tokenizer (``decode``, ``eos_token_id``, chat template)

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[list[Completion]]:
        """Samples ``params.n`` completions for each prompt (token ids, no padding).

        Returns one list of ``n`` completions per prompt, in prompt order.
        """
        ...

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Loads new policy weights: a full state dict of the HF causal LM (tied weights
        included), or a LoRA policy's adapter state (``rllib_dph.policy.lora.adapter_state``), which the
        engine serves on its base model from then on; ``from_pretrained(..., lora=settings)``
        starts an engine ready for it."""
        ...
