"""Torch learner of GRPO: assembles the loss terms of ``rllib_dph.losses`` and logs each one."""

from __future__ import annotations

from typing import Any, Dict

import torch
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.annotations import override
from ray.rllib.utils.typing import ModuleID, TensorType

from rllib_dph import columns as C
from rllib_dph.learners.base import LLMTorchLearner
from rllib_dph.learners.step import STEP, Step, open_step, row_mask
from rllib_dph.losses.divergences import kl_estimate
from rllib_dph.losses.tokens import masked_mean
from rllib_dph.losses.trust_regions import (
    bad_update_fraction,
    dual_clip_mask,
    policy_gradient_loss,
    trust_region_mask,
)
from rllib_dph.policy.rl_module import ENTROPY, LOGP, TOPK_LOGP

# Metric keys under ``learners/<module_id>/``.
POLICY_LOSS = "policy_loss"
KL_LOSS = "kl_loss"
ENTROPY_MEAN = "entropy"
TOTAL_LOSS = "total_loss"
CLIP_FRACTION = "clip_fraction"
CLIP_FRACTION_POS = "clip_fraction_pos_adv"
CLIP_FRACTION_NEG = "clip_fraction_neg_adv"
PROB_DIFF_MEAN = "abs_prob_diff_mean"
PROB_DIFF_MAX = "abs_prob_diff_max"
TRUST_REGION_DIVERGENCE = "trust_region_divergence_mean"
BAD_UPDATE_FRACTION = "bad_update_fraction"
APPROX_KL = "approx_kl_to_behavior"
NUM_EXP_TOKENS = "num_exploration_tokens"
DUAL_CLIP_FRACTION = "dual_clip_fraction"


class GRPOTorchLearner(LLMTorchLearner):
    """Policy-gradient loss on exploration rows (``ROW_TYPE_EXP``), per token:

        loss = agg( −M_t · sg(min(π_θ/μ, C)) · Â · log π_θ )  +  β · agg( KL_est(π_θ‖π_ref) )
               − c_H · agg( H(π_θ) )

    with M_t the trust-region mask anchored on the rollout policy μ (PPO ratio clipping or a
    DPPO divergence mask), C the importance-weight truncation and agg the configured
    aggregation. Aggregation is global (:meth:`Step.aggregate`): a term's denominator (tokens or
    sequences) is summed over all learners and micro-batches before dividing, so N DDP learners
    take the step one learner would take on the same rows. A frozen reference model is built
    only when ``kl_coeff > 0``. Mini-batches, micro-batches, non-finite steps and sharding:
    :class:`LLMTorchLearner`.
    """

    @override(TorchLearner)
    def compute_loss_for_module(
        self,
        *,
        module_id: ModuleID,
        config,
        batch: Dict[str, Any],
        fwd_out: Dict[str, TensorType],
    ) -> TensorType:
        """The terms assembled; their metrics go to the step (logged by it), or are logged here
        when called outside an update (no ``STEP`` in ``batch``: the batch is its own step)."""
        step = batch[STEP] if STEP in batch else open_step(batch, norm_length=config.max_response_length)
        metrics: Dict[str, Any] = {}
        total = self.policy_loss(config, batch, fwd_out, step, metrics)
        total = total + self.auxiliary_loss(config, batch, fwd_out, step, metrics)
        metrics[TOTAL_LOSS] = total
        metrics = {k: v.detach() if torch.is_tensor(v) else v for k, v in metrics.items()}
        if STEP in batch:
            step.metrics.append(metrics)
        else:
            self.metrics.log_dict(metrics, key=module_id, window=1)
        return total

    def policy_loss(self, config, batch, fwd_out, step: Step, metrics: Dict[str, Any]) -> torch.Tensor:
        """The trust-region policy-gradient term on exploration rows (DPPO Eq. 23).

        The mask and the importance weight are anchored on ``ANCHOR_LOGP`` when the batch has
        it (the "recompute" ablation), else on the rollout engine's μ (``BEHAVIOR_LOGP``).
        """
        logp = fwd_out[LOGP]  # (B, L)
        behavior_logp = batch[C.BEHAVIOR_LOGP].float()  # (B, L)
        anchor_logp = batch.get(C.ANCHOR_LOGP, batch[C.BEHAVIOR_LOGP]).float()  # (B, L)
        advantages = batch[C.ADVANTAGES].float()[:, None]  # (B, 1)
        valid = row_mask(batch, C.ROW_TYPE_EXP)  # (B, L)
        region = config.trust_region_setting
        topk = dict(
            topk_logp=fwd_out.get(TOPK_LOGP),
            topk_behavior_logp=batch.get(C.TOPK_ANCHOR_LOGP, batch.get(C.TOPK_BEHAVIOR_LOGP)),
        )
        keep, divergence = trust_region_mask(
            logp.detach(), anchor_logp, advantages, kind=region.kind, low=region.low, high=region.high,
            return_divergence=True, response_mask=valid, **topk
        )  # (B, L), (B, L) or None
        dual_keep = dual_clip_mask(logp.detach(), anchor_logp, advantages, clip_ratio_c=config.clip_ratio_c)  # (B, L)
        pg = policy_gradient_loss(
            logp, anchor_logp, advantages, keep & dual_keep, truncation=region.truncation
        )  # (B, L)
        loss = step.aggregate(pg, valid, row_type=C.ROW_TYPE_EXP, mode=config.loss_agg_mode)
        metrics[POLICY_LOSS] = loss
        metrics[NUM_EXP_TOKENS] = valid.sum().float()
        metrics[DUAL_CLIP_FRACTION] = masked_mean((~dual_keep).float(), valid)
        metrics.update(self._trust_region_metrics(logp.detach(), behavior_logp, advantages, keep, divergence, valid))
        return loss

    def auxiliary_loss(self, config, batch, fwd_out, step: Step, metrics: Dict[str, Any]) -> torch.Tensor:
        """β·KL(π_θ‖π_ref) on exploration rows (when ``kl_coeff > 0``) and the entropy bonus."""
        logp = fwd_out[LOGP]  # (B, L)
        valid = row_mask(batch, C.ROW_TYPE_EXP)  # (B, L)
        loss = logp.new_zeros(())
        if config.kl_coeff > 0:
            kl = kl_estimate(logp, self.reference_logp(batch), kind=config.kl_estimator)  # (B, L)
            kl_loss = step.aggregate(kl, valid, row_type=C.ROW_TYPE_EXP, mode=config.loss_agg_mode)
            loss = loss + config.kl_coeff * kl_loss
            metrics[KL_LOSS] = kl_loss
        metrics[ENTROPY_MEAN] = masked_mean(fwd_out[ENTROPY], valid)
        if config.entropy_coeff:
            entropy = step.aggregate(fwd_out[ENTROPY], valid, row_type=C.ROW_TYPE_EXP, mode=config.loss_agg_mode)
            loss = loss - config.entropy_coeff * entropy
        return loss

    def _trust_region_metrics(self, logp, behavior_logp, advantages, keep, divergence, valid):
        """Masked fractions by advantage sign, the mask's divergence (to the anchor; None for
        a trust region without one), and the train-inference mismatch to the rollout policy μ:
        |π − μ|, KL, bad updates (DPPO §5.3)."""
        adv = advantages.expand_as(logp)  # (B, L)
        dropped = (~keep).float()
        prob_diff = (logp.exp() - behavior_logp.exp()).abs()  # (B, L)
        log_ratio = logp - behavior_logp  # (B, L)
        out = {
            CLIP_FRACTION: masked_mean(dropped, valid),
            CLIP_FRACTION_POS: masked_mean(dropped, valid & (adv > 0)),
            CLIP_FRACTION_NEG: masked_mean(dropped, valid & (adv < 0)),
            PROB_DIFF_MEAN: masked_mean(prob_diff, valid),
            PROB_DIFF_MAX: prob_diff.masked_fill(~valid, 0).max(),
            APPROX_KL: masked_mean(torch.exp(-log_ratio) + log_ratio - 1, valid),
            BAD_UPDATE_FRACTION: bad_update_fraction(logp, behavior_logp, advantages, valid),
        }
        if divergence is not None:
            out[TRUST_REGION_DIVERGENCE] = masked_mean(divergence, valid)
        return out
