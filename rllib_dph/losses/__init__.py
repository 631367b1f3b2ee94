"""Loss terms of GRPO, DAPO, DPH-RL and DPPO as pure tensor functions, one concept per module.

- :mod:`.tokens`: token math, log-probs and entropy from logits, aggregation over valid tokens;
- :mod:`.advantages`: group-relative advantages and DAPO's reward shaping;
- :mod:`.divergences`: divergences to the reference policy, the KL penalty and DPH-RL's f-divergences;
- :mod:`.trust_regions`: trust regions, off-policy corrections and the policy-gradient term.

Every function takes plain tensors and returns plain tensors; the learners pick the terms they
need and add them up. The public names of the four modules are importable from here too.
"""

from rllib_dph.losses.advantages import group_advantages, has_reward_variance, overlong_penalty
from rllib_dph.losses.divergences import (
    F_DIVERGENCES,
    KL_ESTIMATORS,
    MAX_TERM,
    PEF_NORMALIZATIONS,
    FDivergenceSpec,
    f_divergence,
    js_mixture_policy_term,
    kl_estimate,
    pef_loss_weight,
)
from rllib_dph.losses.tokens import (
    AGGREGATIONS,
    aggregate_parts,
    masked_aggregate,
    masked_mean,
    token_entropy,
    token_logprobs,
    token_stats,
)
from rllib_dph.losses.trust_regions import (
    TRUST_REGIONS,
    Threshold,
    TrustRegionSpec,
    bad_update_fraction,
    dual_clip_mask,
    policy_gradient_loss,
    sequence_mean_log_ratio,
    trust_region_divergence,
    trust_region_mask,
)

__all__ = [
    "AGGREGATIONS", "F_DIVERGENCES", "KL_ESTIMATORS", "MAX_TERM", "PEF_NORMALIZATIONS", "TRUST_REGIONS",
    "FDivergenceSpec", "Threshold", "TrustRegionSpec", "aggregate_parts", "bad_update_fraction",
    "dual_clip_mask", "f_divergence", "group_advantages", "has_reward_variance", "js_mixture_policy_term",
    "kl_estimate", "masked_aggregate", "masked_mean", "overlong_penalty", "pef_loss_weight",
    "policy_gradient_loss", "sequence_mean_log_ratio", "token_entropy", "token_logprobs", "token_stats",
    "trust_region_divergence", "trust_region_mask",
]
