"""Torch learner of DPH-RL: GRPO's loss on exploration rows plus η · f-divergence on D_pef rows."""

from __future__ import annotations

import math
from typing import Any, Dict

import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from ray.rllib.core.learner.training_data import TrainingData
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.annotations import override

from rllib_dph import columns as C
from rllib_dph.algorithms.grpo.grpo_torch_learner import GRPOTorchLearner
from rllib_dph.connectors.pef import AddPefRows
from rllib_dph.losses import (
    f_divergence,
    js_mixture_policy_term,
    js_mixture_ref_term,
    masked_aggregate,
    masked_mean,
)
from rllib_dph.rl_module import LOGP

# Metric keys under ``learners/<module_id>/``.
PEF_LOSS = "pef_loss"
NUM_PEF_TOKENS = "num_pef_tokens"
PEF_LOG_RATIO_MEAN = "pef_log_ratio_mean"
PEF_U_MEAN = "pef_u_mean"
JS_EXPLORATION_LOSS = "js_exploration_loss"


class DPHTorchLearner(GRPOTorchLearner):
    """Adds DPH-RL's D_pef term (paper Eq. 7) to GRPO's loss:

        loss = L_GRPO(exploration rows)  +  η · token-mean_{D_pef tokens}( f(π_θ/π_ref) )

    with the stored log π_ref of the reference responses. In the JS "divergence definition"
    variant (Appendix F) the D_pef term is KL(π_ref‖M) and the exploration rows get
    β₁·KL(π_θ‖M), β₁ = η·|D_pef|/|D_exp|, from a live reference model.

    Each learner mixes its own shard of D_pef into its share of every batch with the
    :class:`~rllib_dph.connectors.AddPefRows` connector piece before the mini-batch loop.
    """

    @override(GRPOTorchLearner)
    def build(self) -> None:
        super().build()
        cfg = self.config
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.pef_connector = AddPefRows(
            path=cfg.resolved_pef_path,
            ratio=cfg.pef_ratio,
            shard_index=rank,
            num_shards=max(1, cfg.num_learners),
            seed=cfg.seed or 0,
        )
        self.js_beta1 = None
        if cfg.js_definition:
            num_pef = pq.read_metadata(cfg.resolved_pef_path).num_rows
            num_exp = pq.read_metadata(cfg.resolved_exp_path).num_rows
            self.js_beta1 = cfg.pef_coeff * num_pef / max(1, num_exp)

    @override(GRPOTorchLearner)
    def update(self, *args, training_data: TrainingData = None, batch: MultiAgentBatch = None, **kwargs):
        """Mixes D_pef rows into the batch, then runs RLlib's epoch and mini-batch loop.

        A given ``minibatch_size`` (exploration rows) grows by the same factor as the batch, so
        an epoch takes as many optimizer steps as GRPO's would on the exploration rows alone.
        """
        if training_data is None:
            training_data = TrainingData(batch=batch)
        if training_data.batch is not None:
            columns = {
                mid: dict(sample_batch)
                for mid, sample_batch in training_data.batch.policy_batches.items()
            }
            exp_rows = max(len(c[C.INPUT_IDS]) for c in columns.values())
            mixed = self.pef_connector(batch=columns)
            rows = max(len(c[C.INPUT_IDS]) for c in mixed.values())
            training_data.batch = MultiAgentBatch(
                {mid: SampleBatch(c) for mid, c in mixed.items()}, env_steps=rows
            )
            if kwargs.get("minibatch_size"):
                kwargs["minibatch_size"] = math.ceil(kwargs["minibatch_size"] * rows / exp_rows)
        return super().update(*args, training_data=training_data, **kwargs)

    def pef_mask(self, batch: Dict[str, Any]) -> torch.Tensor:
        """(B, L) bool: reference-response tokens of D_pef rows."""
        is_pef = batch[C.ROW_TYPE] == C.ROW_TYPE_PEF  # (B,)
        return batch[C.RESPONSE_MASK].bool() & is_pef[:, None]

    @override(GRPOTorchLearner)
    def auxiliary_loss(self, config, batch, fwd_out, metrics: Dict[str, Any]) -> torch.Tensor:
        loss = super().auxiliary_loss(config, batch, fwd_out, metrics)
        logp = fwd_out[LOGP]  # (B, L)
        ref_logp = batch[C.REF_LOGP].float()  # (B, L), stored π_ref on D_pef rows
        pef = self.pef_mask(batch)  # (B, L)
        if config.js_definition:
            pef_terms = js_mixture_ref_term(logp, ref_logp)  # (B, L)
            valid = self.exploration_mask(batch)  # (B, L)
            exp_terms = js_mixture_policy_term(logp, self.reference_logp(batch))  # (B, L)
            exp_loss = masked_aggregate(exp_terms, valid, mode="token-mean")
            loss = loss + self.js_beta1 * exp_loss
            metrics[JS_EXPLORATION_LOSS] = exp_loss
        else:
            pef_terms = f_divergence(logp, ref_logp, kind=config.divergence, alpha=config.alpha)
        pef_loss = masked_aggregate(pef_terms, pef, mode="token-mean")
        log_ratio = (logp - ref_logp).detach()  # (B, L)
        metrics[PEF_LOSS] = pef_loss
        metrics[NUM_PEF_TOKENS] = pef.sum().float()
        metrics[PEF_LOG_RATIO_MEAN] = masked_mean(log_ratio, pef)
        metrics[PEF_U_MEAN] = masked_mean(log_ratio.clamp(-20, 20).exp(), pef)
        return loss + config.pef_coeff * pef_loss

