"""Trust regions, off-policy corrections and the policy-gradient term in DPPO's unified form
(pure tensor functions, see ``rllib_dph.losses.tokens`` for the conventions).

- PPO: Schulman et al. 2017 (ratio clip); DAPO: Yu et al. 2025 (clip-higher).
- DPPO: Qi et al., "Divergence Proximal Policy Optimization" (``shared/seeds/003_*``): §4.3-4.4
  Eq. 11-16, §5.3, Appendix C, Appendix D Eq. 23.
- Off-policy corrections anchored on the rollout engine's μ (``TRUST_REGIONS``; table with
  formulas and sources in ``docs/trust_regions.md``): TIS (Yao et al. 2025; verl, slime), CISPO
  (MiniMax-M1, arXiv 2506.13585), ICEPOP (Ring-1T, arXiv 2510.18855), IPO (prime-rl), OPSM
  (DeepSeek-V3.2; slime).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Union

import torch

from rllib_dph.losses.tokens import check_kind, masked_mean, upcast

# Smallest probability mass used where a mass enters a logarithm (DPPO binary / top-K divergences).
_MIN_MASS = 1e-12


def _binary_masses(logp: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B, T, 2): (π(a_t), 1 − π(a_t)), the sampled token vs. all others."""
    return torch.stack([logp.exp(), -torch.expm1(logp)], dim=-1).clamp_min(_MIN_MASS)


def _topk_masses(topk_logp: torch.Tensor) -> torch.Tensor:
    """(B, T, K) -> (B, T, K + 1): the K tokens' masses and the "other" bucket."""
    probs = upcast(topk_logp).exp()  # (B, T, K)
    other = 1 - probs.sum(-1, keepdim=True)  # (B, T, 1)
    return torch.cat([probs, other], dim=-1).clamp_min(_MIN_MASS)  # (B, T, K + 1)


def _tv(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return 0.5 * (p - q).abs().sum(-1)


def _kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return (p * (p.log() - q.log())).sum(-1)


def _binary_tv(logp, behavior_logp, topk_logp, topk_behavior_logp):
    return _tv(_binary_masses(behavior_logp), _binary_masses(logp))


def _binary_kl(logp, behavior_logp, topk_logp, topk_behavior_logp):
    return _kl(_binary_masses(behavior_logp), _binary_masses(logp))


def _topk_tv(logp, behavior_logp, topk_logp, topk_behavior_logp):
    return _tv(_topk_masses(topk_behavior_logp), _topk_masses(topk_logp))


def _topk_kl(logp, behavior_logp, topk_logp, topk_behavior_logp):
    return _kl(_topk_masses(topk_behavior_logp), _topk_masses(topk_logp))


def _ratio_keep(logp, behavior_logp, advantages, low, high, divergence, response_mask):
    """PPO's ratio clip as a mask (Schulman et al. 2017; DAPO clip-higher): drop if
    (Â > 0 and r > 1 + ε_high) or (Â < 0 and r < 1 − ε_low), r = π_θ/μ."""
    ratio = torch.exp(logp - behavior_logp)  # (B, T)
    drop = ((advantages > 0) & (ratio > 1 + high)) | ((advantages < 0) & (ratio < 1 - low))
    return ~drop


def _divergence_keep(logp, behavior_logp, advantages, low, high, divergence, response_mask):
    """DPPO's divergence mask (DPPO §4.3, Eq. 12): drop if (Â > 0 and π > μ and D > δ_high) or
    (Â < 0 and π < μ and D > δ_low): only moves further from μ are blocked."""
    up, down = logp > behavior_logp, logp < behavior_logp
    drop = ((advantages > 0) & up & (divergence > high)) | ((advantages < 0) & down & (divergence > low))
    return ~drop


def _sign_agnostic_keep(logp, behavior_logp, advantages, low, high, divergence, response_mask):
    """IPO's mask (INTELLECT Policy Optimization, prime-rl ``ipo_loss_fn``, PRs #1930, #2798,
    #3586): drop if (π > μ and |π − μ| > ε_high) or (π < μ and |π − μ| > ε_low), whatever the
    advantage's sign. A probability difference, not a ratio: a rare token (μ = 1e-4) may
    move by a large ratio. prime-rl has one ε (0.3); here low and high default to it."""
    up, down = logp > behavior_logp, logp < behavior_logp
    drop = (up & (divergence > high)) | (down & (divergence > low))  # (B, T), whatever Â's sign
    return ~drop & torch.ones_like(advantages, dtype=torch.bool)


def _ratio_band_keep(logp, behavior_logp, advantages, low, high, divergence, response_mask):
    """ICEPOP (Ring-1T "IcePop", arXiv 2510.18855, M(k) = k·1[α ≤ k ≤ β]): keep iff
    α ≤ π_θ/μ ≤ β, whatever the advantage's sign; tokens outside are masked, not truncated.
    Paper defaults α = 0.5, β = 5. The kept token's weight k = π_θ/μ is Eq. 23's, C = ∞."""
    log_ratio = logp - behavior_logp  # (B, T); compared in log space: no overflow of π/μ
    inside = (log_ratio >= math.log(low)) & (log_ratio <= math.log(high))
    return inside & torch.ones_like(advantages, dtype=torch.bool)


def _sequence_keep(logp, behavior_logp, advantages, low, high, divergence, response_mask):
    """OPSM, off-policy sequence masking (DeepSeek-V3.2 report; slime ``compute_opsm_mask``,
    ``--use-opsm --opsm-delta``, default δ = 1e-4): drop every token of row i if Â < 0 and
    (1/|o_i|) Σ_t (log μ − log π_θ) > δ, i.e. the geometric-mean ratio exp(s_i) < exp(−δ).
    Only negative advantages, as in the source; rows with Â ≥ 0 are never masked."""
    seq = sequence_mean_log_ratio(logp, behavior_logp, response_mask)  # (B,)
    drop = (advantages < 0) & (seq[:, None] < -low)  # (B, T) or (B, 1)
    return ~drop & torch.ones_like(logp, dtype=torch.bool)


def _keep_all(logp, behavior_logp, advantages, low, high, divergence, response_mask):
    """No mask: "none", and TIS / CISPO, whose correction is the truncated weight C."""
    return torch.ones(torch.broadcast_shapes(logp.shape, advantages.shape), dtype=torch.bool, device=logp.device)


def sequence_mean_log_ratio(
    logp: torch.Tensor, behavior_logp: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """Per-row mean log-ratio of the response, the log of the geometric-mean ratio (OPSM, GSPO):

        s_i = (1/|o_i|) Σ_t m_it (log π_θ(a_it) − log μ(a_it)),    ρ_i = exp(s_i)

    The mean, not the sum: a sum's variance grows with the length (TRL #5814). −s_i is the k1
    estimate of KL(μ‖π_θ) per token along the row (slime's ``seq_kl``).

    Args:
        logp: (B, T) log π_θ of the sampled tokens.
        behavior_logp: (B, T) log μ of the sampled tokens.
        response_mask: (B, T) bool or 0/1, the response tokens of each row.

    Returns:
        (B,) float32 s_i, 0 for a row without response tokens; values at masked positions are
        ignored even if inf or NaN.
    """
    mask = response_mask.bool()
    log_ratio = torch.where(mask, upcast(logp) - upcast(behavior_logp), 0.0)  # (B, T)
    return log_ratio.sum(-1) / mask.sum(-1).clamp_min(1)


@dataclass(frozen=True)
class Threshold:
    """One threshold of a trust region (the ``low`` or ``high`` key of ``GRPOConfig.trust_region``).

    Attributes:
        default: The value when the config's key is None.
        low, high: The valid range's ends (None: unbounded above).
        low_open, high_open: Whether an end itself is excluded.
    """

    default: float
    low: float = 0
    high: Optional[float] = None
    low_open: bool = True
    high_open: bool = True

    def resolve(self, value: Optional[float]) -> float:
        """The config's ``value``, or the default when it is None."""
        return self.default if value is None else value


@dataclass(frozen=True)
class TrustRegionSpec:
    """One trust region or off-policy correction, under its ``GRPOConfig.trust_region`` name.

    Every entry is a keep mask M_t anchored on μ (the rollout engine), plus optionally the
    truncation C of the importance weight, in the policy gradient of
    :func:`policy_gradient_loss` (DPPO Appendix D, Eq. 23).

    Attributes:
        keep: The mask rule, (logp, behavior_logp, advantages, low, high, divergence,
            response_mask) -> (B, T) bool, True where a token keeps its gradient.
        divergence: D(μ‖π_θ) per token, (logp, behavior_logp, topk_logp, topk_behavior_logp)
            -> (B, T) (DPPO §4.4); None for the rules that read no divergence.
        needs_topk: The divergence reads the rollout engine's top-K log-probs.
        measure: What the thresholds bound, in words (None without thresholds).
        delta_low: The threshold ``low`` of the rule (``trust_region["low"]``, PPO's ε_low);
            None when the rule has none.
        delta_high: The threshold ``high`` (``trust_region["high"]``); None when none.
        truncation: C of the correction's source, for the corrections whose point is the
            truncated weight min(π_θ/μ, C) (no mask): the default of
            ``trust_region["truncation"]``. None for the masks (C = ∞).
        sequence_level: The rule reduces over each row's response tokens and needs the
            response mask.
    """

    keep: Callable[..., torch.Tensor]
    divergence: Optional[Callable[..., torch.Tensor]] = None
    needs_topk: bool = False
    measure: Optional[str] = None
    delta_low: Optional[Threshold] = None
    delta_high: Optional[Threshold] = None
    truncation: Optional[float] = None
    sequence_level: bool = False

    @property
    def has_thresholds(self) -> bool:
        """Whether the rule reads the thresholds ``low``/``high`` (``tis``, ``cispo`` and ``none`` do not)."""
        return self.delta_low is not None or self.delta_high is not None


_TV_DELTA = Threshold(0.15, high=1)  # DPPO Appendix F; a TV is at most 1
_KL_DELTA = Threshold(0.05)
_TV = dict(measure="TV divergence", delta_low=_TV_DELTA, delta_high=_TV_DELTA)
_KL = dict(measure="KL divergence", delta_low=_KL_DELTA, delta_high=_KL_DELTA)
#: IPO's ε (prime-rl ``IPOLossConfig.eps``, 0.3 since PR #3586) on |π − μ| ≤ 1.
_IPO_EPS = Threshold(0.3, high=1)
#: Trust regions and off-policy corrections by their ``GRPOConfig.trust_region`` name; the
#: formulas and sources are in :func:`trust_region_mask` and ``docs/trust_regions.md``.
TRUST_REGIONS: Dict[str, TrustRegionSpec] = {
    "ppo": TrustRegionSpec(
        _ratio_keep,
        measure="ratio π/μ as 1 − ε_low and 1 + ε_high",
        delta_low=Threshold(0.2, high=1, low_open=False),  # 1 − ε_low must stay > 0
        delta_high=Threshold(0.2, low_open=False),
    ),
    "dppo_binary_tv": TrustRegionSpec(_divergence_keep, _binary_tv, **_TV),
    "dppo_binary_kl": TrustRegionSpec(_divergence_keep, _binary_kl, **_KL),
    "dppo_topk_tv": TrustRegionSpec(_divergence_keep, _topk_tv, needs_topk=True, **_TV),
    "dppo_topk_kl": TrustRegionSpec(_divergence_keep, _topk_kl, needs_topk=True, **_KL),
    "tis": TrustRegionSpec(_keep_all, truncation=2.0),
    "cispo": TrustRegionSpec(_keep_all, truncation=3.0),
    "icepop": TrustRegionSpec(
        _ratio_band_keep,
        measure="ratio π/μ",
        delta_low=Threshold(0.5, high=1, high_open=False),
        delta_high=Threshold(5.0, low=1, low_open=False),
    ),
    "ipo": TrustRegionSpec(
        _sign_agnostic_keep, _binary_tv, measure="TV divergence |π − μ|", delta_low=_IPO_EPS, delta_high=_IPO_EPS
    ),
    "opsm": TrustRegionSpec(
        _sequence_keep, measure="mean log-ratio of μ to π", delta_low=Threshold(1e-4), sequence_level=True
    ),
    "none": TrustRegionSpec(_keep_all),
}


def trust_region_divergence(
    logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    *,
    kind: str,
    topk_logp: Optional[torch.Tensor] = None,
    topk_behavior_logp: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Per-token approximation of D(μ(·|s_t)‖π_θ(·|s_t)) used by the DPPO masks (DPPO §4.4).

    The vocabulary is partitioned and the divergence taken between the partition masses, a
    lower bound of the full divergence that is exact when each cell is a single token
    (DPPO Appendix C). With P = μ and Q = π_θ:

        "dppo_binary_tv"  |q − p|                                                  (Eq. 13)
        "dppo_binary_kl"  q·log(q/p) + (1−q)·log((1−q)/(1−p))                         (Eq. 14)
        "dppo_topk_tv"    ½(Σ_k |P_k − Q_k| + |P_other − Q_other|)                     (Eq. 15)
        "dppo_topk_kl"    Σ_k P_k·log(P_k/Q_k) + P_other·log(P_other/Q_other)          (Eq. 16)
        "ipo"             |q − p|, as "dppo_binary_tv"

    where p = π_θ(a_t), q = μ(a_t) (cells: the sampled token and the rest), and the top-K
    cells are the rollout engine's top-K tokens of μ (the sampled token included) plus an
    "other" cell with P_other = 1 − Σ_k P_k (the paper's Eq. 15 omits the other cell's term;
    with it, TV is the TV of the reduced distributions, a lower bound by Appendix C). Masses
    are clamped to ≥ 1e-12 before logarithms; 1 − p is computed as −expm1(log p), accurate for
    p near 1.

    Args:
        logp: (B, T) log π_θ of the sampled tokens.
        behavior_logp: (B, T) log μ of the sampled tokens (rollout engine).
        kind: a trust region of ``TRUST_REGIONS`` with a divergence ("dppo_*", "ipo").
        topk_logp: (B, T, K) log π_θ of μ's top-K token ids; top-K kinds only.
        topk_behavior_logp: (B, T, K) log μ of the same ids; top-K kinds only.

    Returns:
        (B, T) float32 divergences, without gradient.
    """
    check_kind(kind, TRUST_REGIONS, "kind")
    spec = TRUST_REGIONS[kind]
    if spec.divergence is None:
        with_divergence = [name for name, other in TRUST_REGIONS.items() if other.divergence is not None]
        raise ValueError(f"kind={kind!r} bounds no divergence; pass one of {with_divergence}.")
    if spec.needs_topk:
        _check_topk(kind, topk_logp, topk_behavior_logp)
    with torch.no_grad():
        return spec.divergence(upcast(logp), upcast(behavior_logp), topk_logp, topk_behavior_logp)


def _check_topk(kind: str, topk_logp: Optional[torch.Tensor], topk_behavior_logp: Optional[torch.Tensor]) -> None:
    if topk_logp is None or topk_behavior_logp is None:
        raise ValueError(
            f"kind={kind!r} needs topk_logp and topk_behavior_logp (B, T, K); ask the rollout "
            "engine for top-K log-probs or use a binary kind."
        )
    if topk_logp.shape != topk_behavior_logp.shape:
        raise ValueError(
            f"topk_logp {tuple(topk_logp.shape)} and topk_behavior_logp "
            f"{tuple(topk_behavior_logp.shape)} must have the same (B, T, K) shape: the "
            "log-probs of the same K ids under π_θ and μ."
        )


def _check_response_mask(kind: str, response_mask: Optional[torch.Tensor]) -> None:
    if response_mask is None:
        raise ValueError(
            f"kind={kind!r} reduces log π/μ over each row's response tokens: pass "
            "response_mask (B, T), the response tokens the loss is aggregated over."
        )


def trust_region_mask(
    logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    kind: str,
    low: Optional[float],
    high: Optional[float],
    topk_logp: Optional[torch.Tensor] = None,
    topk_behavior_logp: Optional[torch.Tensor] = None,
    response_mask: Optional[torch.Tensor] = None,
    return_divergence: bool = False,
) -> Union[torch.Tensor, tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """Which tokens keep their policy gradient, M_t of DPPO Eq. 12 / Appendix D, anchored on μ.

    With p = π_θ(a_t), q = μ(a_t) (μ: the rollout engine's distribution, DPPO §5.2), r = p/q,
    Â_t the advantage and D from :func:`trust_region_divergence`, a token is dropped if

        "ppo"      (Â > 0 and r > 1 + high) or (Â < 0 and r < 1 − low)
        "dppo_*"   (Â > 0 and p > q and D > high) or (Â < 0 and p < q and D > low)
        "ipo"      (p > q and |p − q| > high) or (p < q and |p − q| > low), whatever Â
        "icepop"   r < low or r > high, whatever Â
        "opsm"     Â < 0 and s_i < −low: s_i the row's :func:`sequence_mean_log_ratio`
        "tis", "cispo", "none"   never (TIS and CISPO truncate the weight: C of
                   :func:`policy_gradient_loss`)

    Each rule's source is in the docstring of its ``TrustRegionSpec.keep`` and in
    ``docs/trust_regions.md``; the thresholds' defaults are ``TrustRegionSpec.delta_low/high``.

    Args:
        logp: (B, T) log π_θ of the sampled tokens (gradients are not used).
        behavior_logp: (B, T) log μ of the sampled tokens.
        advantages: Â, broadcastable to (B, T), e.g. (B, 1) per sequence.
        kind: one of ``TRUST_REGIONS``.
        low: The rule's ``delta_low`` (PPO's ε_low); None where the rule has none.
        high: The rule's ``delta_high`` (PPO's ε_high); None where the rule has none.
        topk_logp: (B, T, K) log π_θ of μ's top-K ids; top-K kinds only.
        topk_behavior_logp: (B, T, K) log μ of the same ids; top-K kinds only.
        response_mask: (B, T) bool or 0/1, each row's response tokens; sequence-level kinds
            ("opsm") only.
        return_divergence: also return the (B, T) divergence D the mask used (None for the
            kinds without one), so that metrics need not compute it again.

    Returns:
        (B, T) bool, True where the token keeps its gradient; with ``return_divergence`` the
        pair (mask, D or None).
    """
    check_kind(kind, TRUST_REGIONS, "kind")
    spec = TRUST_REGIONS[kind]
    if spec.sequence_level:
        _check_response_mask(kind, response_mask)
    with torch.no_grad():
        logp, behavior_logp = upcast(logp), upcast(behavior_logp)
        divergence = None
        if spec.divergence is not None:
            divergence = trust_region_divergence(
                logp, behavior_logp, kind=kind, topk_logp=topk_logp, topk_behavior_logp=topk_behavior_logp
            )  # (B, T)
        keep = spec.keep(logp, behavior_logp, upcast(advantages), low, high, divergence, response_mask)  # (B, T)
    return (keep, divergence) if return_divergence else keep


def dual_clip_mask(
    logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_ratio_c: Optional[float],
) -> torch.Tensor:
    """Dual-clip PPO (Ye et al. 2020, "Mastering Complex Control in MOBA Games", Eq. 5; verl's
    ``clip_ratio_c``): which tokens keep their gradient under the lower bound on negative
    advantages.

    For Â < 0 the clipped surrogate −Â·max(r, clip(r, 1−ε, 1+ε)) grows without bound in r;
    dual clip takes min(that, −Â·c), a constant once r > c. In the policy-gradient form of
    :func:`policy_gradient_loss` that is a mask:

        keep_t = not (Â_t < 0 and π_θ(a_t)/μ(a_t) > c)

    so a token the rollout policy found much less likely than π_θ now does, with a negative
    advantage, cannot dominate the update. ``clip_ratio_c=None`` keeps every token.

    Args:
        logp: (B, T) log π_θ of the sampled tokens (gradients are not used).
        behavior_logp: (B, T) log μ of the sampled tokens.
        advantages: Â, broadcastable to (B, T).
        clip_ratio_c: c > 1 (verl default 3), or None to disable.

    Returns:
        (B, T) bool, True where the token keeps its gradient.
    """
    shape = torch.broadcast_shapes(logp.shape, advantages.shape)
    if clip_ratio_c is None:
        return torch.ones(shape, dtype=torch.bool, device=logp.device)
    if not clip_ratio_c > 1:
        raise ValueError(f"clip_ratio_c={clip_ratio_c} must be > 1 (verl: 3.0), or None to disable dual clip.")
    with torch.no_grad():
        log_ratio = upcast(logp) - upcast(behavior_logp)  # (B, T)
        return ~((upcast(advantages) < 0) & (log_ratio > math.log(clip_ratio_c)))


# -------------------------------------------------------------------------- policy gradient
def policy_gradient_loss(
    logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    truncation: float = float("inf"),
) -> torch.Tensor:
    """Per-token policy-gradient loss in the unified form of DPPO Appendix D, Eq. 23.

        loss_t = −M_t · sg(min(π_θ(a_t)/μ(a_t), C)) · Â_t · log π_θ(a_t)

    so that ∇loss_t = −M_t · min(r_t, C) · Â_t · ∇log π_θ(a_t), with r_t = π_θ/μ the
    importance ratio to the rollout policy μ and sg the stop-gradient:

        PPO/GRPO/DAPO  M = trust_region_mask(kind="ppo"), C = ∞: the gradient of the clipped
                       surrogate −min(r·Â, clip(r, 1−ε_low, 1+ε_high)·Â), since a clipped token
                       has zero gradient and an unclipped one −Â·r·∇log π_θ
        DPPO           M = a divergence mask, C = ∞
        PG-IS          M = 1, C = ∞
        TIS            M = 1, C = 2: token-level truncated importance sampling (Yao et al. 2025,
                       "Your efficient RL framework secretly brings you off-policy RL training";
                       verl ``rollout_is``, slime ``--tis-clip``), whose weight min(π_old/μ, C)
                       is min(π_θ/μ, C) anchored on μ (π_old = π_θ before the update)
        CISPO          M = 1, C = 1 + ε_high^IS: MiniMax-M1 (arXiv 2506.13585),
                       sg(clip(r, 1 − ε_low^IS, 1 + ε_high^IS))·Â·log π_θ with no lower bound;
                       "PG-TIS (CISPO)" with C = 3 in DPPO Appendix D
        ICEPOP, IPO, OPSM   M = their masks (``trust_region_mask``), C = ∞

    Only the gradient matches these objectives; the loss value itself is not the surrogate.

    Args:
        logp: (B, T) log π_θ of the sampled tokens, with gradient.
        behavior_logp: (B, T) log μ of the sampled tokens.
        advantages: Â, broadcastable to (B, T), e.g. (B, 1).
        mask: (B, T) bool trust-region mask M (``trust_region_mask``).
        truncation: C, upper bound on the importance weight; ∞ for none.

    Returns:
        (B, T) float32 per-token losses, to be reduced with ``masked_aggregate``.
    """
    logp = upcast(logp)
    with torch.no_grad():
        ratio = torch.exp(logp - upcast(behavior_logp)).clamp_max(truncation)  # (B, T)
        weight = torch.where(mask.bool(), ratio, 0.0) * upcast(advantages)  # (B, T)
    return -weight * logp


# ------------------------------------------------------------------------------ diagnostics
def bad_update_fraction(
    logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    threshold: float = 0.5,
) -> torch.Tensor:
    """Share of valid tokens that are "bad updates" (DPPO §5.3, Figure 5).

        bad_t = (Â_t < 0) and (μ(a_t) − π_θ(a_t) > threshold)

    i.e. negative-advantage tokens whose probability already dropped far below the rollout
    policy's; DPPO identifies them as the main source of training collapse.

    Args:
        logp: (B, T) log π_θ of the sampled tokens.
        behavior_logp: (B, T) log μ of the sampled tokens.
        advantages: Â, broadcastable to (B, T).
        mask: (B, T) bool or 0/1 valid tokens.
        threshold: δ of the paper, 0.5.

    Returns:
        Scalar float32: bad tokens / valid tokens (0 without valid tokens), without gradient.
    """
    with torch.no_grad():
        drop = upcast(behavior_logp).exp() - upcast(logp).exp()  # (B, T)
        bad = (advantages < 0) & (drop > threshold)  # (B, T)
        return masked_mean(bad.float(), mask)
