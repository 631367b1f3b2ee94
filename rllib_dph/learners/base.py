"""The base class of the GRPO-family learners: the machinery of :mod:`rllib_dph.learners` combined,
with the inputs the loss terms read besides the batch (π_ref, a recomputed anchor)."""

from __future__ import annotations

from typing import Any, Dict

import numpy as np
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.core.learner.training_data import TrainingData
from ray.rllib.utils.annotations import override

from rllib_dph import columns as C
from rllib_dph.learners.collectives import set_timeout as set_collective_timeout
from rllib_dph.policy.lora import adapters_disabled
from rllib_dph.learners.finite import SkipNonFiniteSteps
from rllib_dph.learners.microbatches import TokenBudgetSteps
from rllib_dph.learners.minibatches import GroupMinibatches
from rllib_dph.losses.tokens import token_logprobs
from rllib_dph.policy.rl_module import LOGP, TOPK_LOGP, ResponseLM, autocast, scatter_tokens
from rllib_dph.learners.sharding import ShardedModules, shard_response_lm


class LLMTorchLearner(ShardedModules, SkipNonFiniteSteps, TokenBudgetSteps, GroupMinibatches):
    """The base classes of :mod:`rllib_dph.learners` combined, plus what the loss terms read besides
    the batch: the frozen reference model π_ref (built only when ``config.needs_reference_model``)
    and, with ``trust_region={"anchor": "recompute"}``, π_old's log-probs recomputed before the update.

    Mixed precision: the policy's parameters and Adam state are float32 and its forward pass
    runs under autocast to ``config.dtype`` (inside ``LLMRLModule._forward_train``, so every
    caller gets it). The frozen reference model is loaded the same way (float32 weights, the
    same autocast), so π_ref computes exactly what the initial π_θ computes and the KL starts at
    0; a bf16 copy would differ by bf16 rounding (docs/results/gpu.md, "Learners").

    With LoRA (``config.lora``) the optimizer holds the adapters alone (the frozen base weights
    get neither gradients nor Adam state), and π_ref is the policy's own base model with its
    adapters switched off (``lora.adapters_disabled``): no second model is loaded.
    """

    @override(TorchLearner)
    def build(self) -> None:
        set_collective_timeout(self.config.collective_timeout_s)
        super().build()
        self._ref_lm = None
        if self.config.needs_reference_model and self.config.lora is None:
            from rllib_dph.models.hub import load_causal_lm

            self._ref_lm = ResponseLM(load_causal_lm(self.config.reference_model_name, dtype=torch.float32))
            self._ref_lm.to(self._device).eval().requires_grad_(False)
            if self.sharded:
                shard_response_lm(self._ref_lm, device=self._device, compute_dtype=self._compute_dtype)

    @override(TorchLearner)
    def get_parameters(self, module) -> list:
        """The parameters the optimizer steps: the trainable ones (all but a LoRA policy's base)."""
        return [param for param in module.parameters() if param.requires_grad]

    @property
    def ref_model(self):
        """The separately loaded frozen reference model π_ref (a HF causal LM), or None when no
        term needs it or when it is the LoRA policy's own base (:meth:`reference_logp`)."""
        return None if self._ref_lm is None else self._ref_lm.lm

    @torch.no_grad()
    def reference_logp(self, batch: Dict[str, Any]) -> torch.Tensor:
        """(B, L) log π_ref of every response token given its prefix, at the sampling temperature.

        π_ref is the loaded reference model, or with LoRA the policy with its adapters disabled.
        """
        if self._ref_lm is None:  # LoRA: the base model under the policy's adapters
            response_lm = self.module[DEFAULT_MODULE_ID].unwrapped().response_lm
            with adapters_disabled(response_lm.lm), autocast(self._device, self._compute_dtype):
                logits, where = response_lm.logits(batch)  # (N, V), (B, L-1)
        else:
            with autocast(self._device, self._compute_dtype):
                logits, where = self._ref_lm.logits(batch)  # (N, V), (B, L-1)
        targets = batch[C.INPUT_IDS][:, 1:][where]  # (N,)
        return scatter_tokens(token_logprobs(logits, targets, temperature=self.config.temperature), where)

    @override(TorchLearner)
    def update(self, *args, training_data: TrainingData = None, batch=None, **kwargs):
        """With ``trust_region={"anchor": "recompute"}``, adds π_old log-probs before the update."""
        if self.config.trust_region_setting.anchor == "recompute":
            training_data = training_data or TrainingData(batch=batch)
            batch = None
            for module_id, module_batch in training_data.batch.policy_batches.items():
                self._add_recomputed_anchor(module_id, module_batch)
        return super().update(*args, training_data=training_data, batch=batch, **kwargs)

    @torch.no_grad()
    def _add_recomputed_anchor(self, module_id, module_batch, chunk: int = 64) -> None:
        """Sets ``ANCHOR_LOGP`` (and ``TOPK_ANCHOR_LOGP``) to the current weights' log-probs."""
        module = self.module[module_id].unwrapped()
        keys = [C.INPUT_IDS, C.ATTENTION_MASK, C.RESPONSE_MASK] + ([C.TOPK_IDS] if C.TOPK_IDS in module_batch else [])
        rows = len(module_batch[C.INPUT_IDS])
        starts = list(range(0, rows, chunk))
        for _ in range(self.same_count_on_all_learners(len(starts)) - len(starts)):
            module._forward_train({k: torch.as_tensor(module_batch[k][:1], device=self._device) for k in keys})
        logps, topks = [], []
        for start in starts:
            part = {k: torch.as_tensor(module_batch[k][start : start + chunk], device=self._device) for k in keys}
            out = module._forward_train(part)
            logps.append(out[LOGP].float().cpu().numpy())
            if TOPK_LOGP in out:
                topks.append(out[TOPK_LOGP].float().cpu().numpy())
        module_batch[C.ANCHOR_LOGP] = np.concatenate(logps)
        if topks:
            module_batch[C.TOPK_ANCHOR_LOGP] = np.concatenate(topks)
