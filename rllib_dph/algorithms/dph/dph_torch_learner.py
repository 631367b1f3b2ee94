"""Torch learner of DPH-RL: GRPO's loss on exploration rows plus η · f-divergence on D_pef rows."""

from __future__ import annotations

from typing import Any, Dict

import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from ray.rllib.core.learner.training_data import TrainingData
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.annotations import override

from rllib_dph import columns as C
from rllib_dph.algorithms.grpo.grpo_torch_learner import GRPOTorchLearner
from rllib_dph.algorithms.dph.pef_rows import AddPefRows
from rllib_dph.learners.collectives import all_reduce, distributed
from rllib_dph.learners.step import Step, row_mask
from rllib_dph.losses.divergences import f_divergence, pef_loss_weight
from rllib_dph.losses.tokens import masked_mean
from rllib_dph.policy.rl_module import LOGP

# Metric keys under ``learners/<module_id>/``.
PEF_LOSS = "pef_loss"
NUM_PEF_TOKENS = "num_pef_tokens"
PEF_LOG_RATIO_MEAN = "pef_log_ratio_mean"
PEF_U_MEAN = "pef_u_mean"
PEF_WEIGHT = "pef_weight"
JS_EXPLORATION_LOSS = "js_exploration_loss"
#: Learner state key of the D_pef rows' position (``AddPefRows.get_state``).
PEF_ROWS_STATE = "pef_rows"


class DPHTorchLearner(GRPOTorchLearner):
    """Adds DPH-RL's D_pef term (paper Eq. 7) to GRPO's loss:

        loss = L_GRPO(exploration rows)  +  w · token-mean_{D_pef tokens}( f(π_θ/π_ref) )

    with the stored log π_ref of the reference responses and w = ``losses.pef_loss_weight``
    (η scaled as ``pef_loss_normalization`` says: by default as in the original code, η times
    the D_pef share of the mini-batch's rows). A divergence with an exploration term
    (``FDivergenceSpec.exploration_term``; the JS "divergence definition" of Appendix F, whose
    D_pef term is KL(π_ref‖M)) adds β₁·KL(π_θ‖M) on the exploration rows,
    β₁ = η·|D_pef|/|D_exp|, from a live reference model.

    Each learner mixes its own shard of D_pef into its share of every batch with the
    :class:`~rllib_dph.algorithms.dph.pef_rows.AddPefRows` connector piece before the mini-batch loop, which
    spreads the D_pef rows over every mini-batch of every epoch (``GroupMinibatches``).
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
        if cfg.has_exploration_term:
            num_pef = pq.read_metadata(cfg.resolved_pef_path).num_rows
            num_exp = pq.read_metadata(cfg.resolved_exp_path).num_rows
            self.js_beta1 = cfg.pef_coeff * num_pef / max(1, num_exp)

    @override(GRPOTorchLearner)
    def get_state(self, components=None, *, not_components=None, **kwargs) -> dict:
        """The learner's state plus the position in its D_pef shard (a resume takes the next rows)."""
        state = super().get_state(components, not_components=not_components, **kwargs)
        if self._check_component(PEF_ROWS_STATE, components, not_components):
            state[PEF_ROWS_STATE] = self.pef_connector.get_state()
        return state

    @override(GRPOTorchLearner)
    def set_state(self, state: dict) -> None:
        super().set_state(state)
        if PEF_ROWS_STATE in state:
            self.pef_connector.set_state(state[PEF_ROWS_STATE])

    @override(GRPOTorchLearner)
    def update(self, *args, training_data: TrainingData = None, batch: MultiAgentBatch = None, **kwargs):
        """Mixes D_pef rows into the batch, then runs the epoch and mini-batch loop.

        The number of mini-batches is that of the exploration rows alone (``minibatch_size``
        counts exploration rows), so DPH takes as many optimizer steps as GRPO.
        """
        if training_data is None:
            training_data = TrainingData(batch=batch)
        if training_data.batch is not None:
            columns = {
                mid: dict(sample_batch)
                for mid, sample_batch in training_data.batch.policy_batches.items()
            }
            mixed = self.pef_connector(batch=columns)
            rows = max(len(c[C.INPUT_IDS]) for c in mixed.values())
            training_data.batch = MultiAgentBatch(
                {mid: SampleBatch(c) for mid, c in mixed.items()}, env_steps=rows
            )
            self._gather_rows_taken()
        return super().update(*args, training_data=training_data, **kwargs)

    def _gather_rows_taken(self) -> None:
        """Every learner's D_pef rows taken, into each learner's connector (one all-reduce of a
        (num_learners,) tensor): the learners' shares of a batch may differ by a group, so their
        positions may too, and a checkpoint holds one learner's state."""
        taken = self.pef_connector.sampler.rows_taken
        if not distributed():
            self.pef_connector.rows_taken_by_shard = [taken]
            return
        counts = torch.zeros(dist.get_world_size(), dtype=torch.int64, device=self._device)  # (num_learners,)
        counts[dist.get_rank()] = taken
        self.pef_connector.rows_taken_by_shard = all_reduce(counts).cpu().tolist()

    @override(GRPOTorchLearner)
    def auxiliary_loss(self, config, batch, fwd_out, step: Step, metrics: Dict[str, Any]) -> torch.Tensor:
        loss = super().auxiliary_loss(config, batch, fwd_out, step, metrics)
        logp = fwd_out[LOGP]  # (B, L)
        ref_logp = batch[C.REF_LOGP].float()  # (B, L), stored π_ref on D_pef rows
        pef = row_mask(batch, C.ROW_TYPE_PEF)  # (B, L)
        exploration_term = config.divergence_spec.exploration_term
        if exploration_term is not None:
            exp_terms = exploration_term(logp, self.reference_logp(batch))  # (B, L)
            exp_loss = step.aggregate(exp_terms, row_mask(batch, C.ROW_TYPE_EXP), row_type=C.ROW_TYPE_EXP)
            loss = loss + self.js_beta1 * exp_loss
            metrics[JS_EXPLORATION_LOSS] = exp_loss
        pef_terms = f_divergence(logp, ref_logp, kind=config.divergence, alpha=config.alpha)  # (B, L)
        pef_loss = step.aggregate(pef_terms, pef, row_type=C.ROW_TYPE_PEF)
        weight = pef_loss_weight(
            config.pef_coeff,
            normalization=config.pef_loss_normalization,
            divergence=config.divergence,
            num_pef_rows=step.rows(C.ROW_TYPE_PEF),
            num_exp_rows=step.rows(C.ROW_TYPE_EXP),
        )
        log_ratio = (logp - ref_logp).detach()  # (B, L)
        metrics[PEF_LOSS] = pef_loss
        metrics[PEF_WEIGHT] = weight
        metrics[NUM_PEF_TOKENS] = pef.sum().float()
        metrics[PEF_LOG_RATIO_MEAN] = masked_mean(log_ratio, pef)
        metrics[PEF_U_MEAN] = masked_mean(log_ratio.clamp(-20, 20).exp(), pef)
        return loss + weight * pef_loss

