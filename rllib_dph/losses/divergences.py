"""Divergences to the reference policy (pure tensor functions, see ``rllib_dph.losses.tokens``
for the conventions): GRPO's KL penalty to π_ref and DPH-RL's f-divergence terms on the D_pef rows.

- k1/k2/k3: J. Schulman, "Approximating KL divergence", 2020.
- DPH-RL: "Diversity-Preserving Hybrid RL" (``shared/seeds/000_*``): §4.2 Eq. 5-7, Table 5,
  Appendix F.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F

from rllib_dph.losses.tokens import check_kind, upcast

#: Bound on the magnitude of one token's divergence term (KL penalty, DPH f-divergences): verl's
#: ``kl_penalty(..., "low_var_kl")``, which the original DPH-RL code uses, clamps to [-10, 10].
#: Beyond it the term is constant and the token has no gradient, so one token that π_θ or
#: π_ref finds near-impossible cannot dominate the update (π_ref = 1e-6, π_θ = 0.5 would give a
#: forward-KL term and gradient of ~5e5 unclamped).
MAX_TERM = 10.0


def _k1(d: torch.Tensor) -> torch.Tensor:
    return d


def _k2(d: torch.Tensor) -> torch.Tensor:
    return 0.5 * d**2


def _k3(d: torch.Tensor) -> torch.Tensor:
    return torch.exp(-d) + d - 1


#: Per-token estimators of KL(π‖π_ref) from samples of π, as functions of d = log π − log π_ref.
KL_ESTIMATORS: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"k1": _k1, "k2": _k2, "k3": _k3}


def kl_estimate(
    logp: torch.Tensor, ref_logp: torch.Tensor, *, kind: str = "k3", max_term: float = MAX_TERM
) -> torch.Tensor:
    """Per-token sample estimate of KL(π_θ‖π_ref) (Schulman 2020; the RKL penalty of GRPO).

    With d = log π_θ(a) − log π_ref(a) for a token a sampled from π_θ:

        k1 = d                  unbiased, high variance, can be negative
        k2 = d² / 2             biased, low variance, ≥ 0
        k3 = exp(−d) + d − 1    unbiased (E_π[exp(−d)] = 1), low variance, ≥ 0

    Used as a loss with samples held fixed, the k3 term's gradient is that of KL(π_ref‖π_θ)
    in expectation, not of KL(π_θ‖π_ref) (the usual "k3 as loss" behaviour of GRPO/verl).
    Each estimate is clamped to [−max_term, max_term] as verl's ``low_var_kl`` does: a token
    far from the reference contributes a bounded term and no gradient.

    Args:
        logp: (B, T) log π_θ of the sampled tokens.
        ref_logp: (B, T) log π_ref of the same tokens.
        kind: "k1", "k2" or "k3".
        max_term: bound on |estimate| (default :data:`MAX_TERM`).

    Returns:
        (B, T) float32 per-token estimates.
    """
    check_kind(kind, KL_ESTIMATORS, "kind")
    return KL_ESTIMATORS[kind](upcast(logp) - upcast(ref_logp)).clamp(-max_term, max_term)


def _low_variance_kl(log_w: torch.Tensor) -> torch.Tensor:
    """w − 1 − log w ≥ 0, zero with zero derivative at w = 1."""
    return torch.exp(log_w) - 1 - log_w


def _forward_kl_generator(log_u: torch.Tensor, alpha: float) -> torch.Tensor:
    return _low_variance_kl(log_u)


def _js_generator(log_u: torch.Tensor, alpha: float) -> torch.Tensor:
    u = torch.exp(log_u)
    log_half_u_plus_one = F.softplus(log_u) - math.log(2.0)  # log((u + 1) / 2)
    return 0.5 * (u * log_u - (u + 1) * log_half_u_plus_one)


def _alpha_generator(log_u: torch.Tensor, alpha: float) -> torch.Tensor:
    u = torch.exp(log_u)
    return (torch.exp((1 - alpha) * log_u) - (1 - alpha) * u - alpha) / (alpha * (alpha - 1))


def _nll_generator(log_u: torch.Tensor, alpha: float) -> torch.Tensor:
    """−log u = log π_ref(a) − log π_θ(a): the negative log-likelihood of the reference token
    under π_θ, shifted by its stored log π_ref (a constant in θ), so that its gradient is plain
    NLL's, −∇ log π_θ(a), whatever u is (supervised fine-tuning on the D_pef rows)."""
    return -log_u


def _js_mixture_ref_generator(log_u: torch.Tensor, alpha: float) -> torch.Tensor:
    """KL(π_ref‖M) per token, the D_pef half of the JS "divergence definition" (DPH-RL Appendix F,
    Eq. 17), M = (π_ref + π_θ)/2 per token.

    JS(π_ref, π_θ) = ½ KL(π_ref‖M) + ½ KL(π_θ‖M). This first half is estimated from the stored
    reference responses (tokens a ∼ π_ref). With u = π_θ(a)/π_ref(a) and
    w = M(a)/π_ref(a) = (1 + u)/2 the term is w − 1 − log w, the k3 estimator of KL(π_ref‖M)
    from π_ref samples: its mean is KL(π_ref‖M) and, the samples coming from the fixed π_ref,
    its gradient an unbiased estimate of ∇_θ KL(π_ref‖M). It equals the original code's
    ``kl_penalty(ref_logp, log M, "low_var_kl")``; no reference model is needed for this half.
    """
    log_w = F.softplus(log_u) - math.log(2.0)  # log((1 + u) / 2)
    return _low_variance_kl(log_w)


def js_mixture_policy_term(
    logp: torch.Tensor, ref_logp: torch.Tensor, *, clamp: float = 20.0, max_term: float = MAX_TERM
) -> torch.Tensor:
    """Per-token KL(π_θ‖M) on exploration rows, JS "divergence definition" (DPH-RL Appendix F, Eq. 15).

    The second half of JS(π_ref, π_θ) (the first: ``f_divergence(kind="js_definition")``),
    estimated from the online rollouts (tokens a ∼ μ ≈ π_θ) with log π_ref(a) from a live
    reference model. With v = π_ref(a)/π_θ(a) and w = M(a)/π_θ(a) = (1 + v)/2:

        term = w − 1 − log w        (the k3 estimator of KL(π_θ‖M) from π_θ samples)

    Its value estimates KL(π_θ‖M) per position. Like GRPO's k3 KL loss (and the original
    code's ``kl_penalty(logp, log M, "low_var_kl")``) the samples are held fixed, so on
    on-policy samples its expected gradient is not ∇KL(π_θ‖M) but
    ∇_θ [½ KL(π_ref‖π_θ) − KL(π_ref‖M)], the gradient of a divergence that is ≥ 0 (KL is
    convex in its second argument) and 0 only at π_θ = π_ref: it still pulls π_θ toward π_ref.
    Eq. 15 weighs it by β₁ = η·|D_pef|/|D_exp| (Eq. 16).

    Args:
        logp: (B, T) log π_θ of the sampled exploration tokens.
        ref_logp: (B, T) log π_ref of the same tokens (reference model forward pass).
        clamp: bound on |log(π_θ/π_ref)|.
        max_term: bound on the per-token term (default :data:`MAX_TERM`).

    Returns:
        (B, T) float32 per-token terms in [0, max_term], zero with zero gradient where π_θ = π_ref.
    """
    log_u = (upcast(logp) - upcast(ref_logp)).clamp(-clamp, clamp)  # (B, T)
    log_w = F.softplus(-log_u) - math.log(2.0)  # log((1 + 1/u) / 2)
    return _low_variance_kl(log_w).clamp_max(max_term)


@dataclass(frozen=True)
class FDivergenceSpec:
    """One divergence of DPH-RL's regulariser, under its ``DPHConfig.divergence`` name.

    Attributes:
        generator: The D_pef term f as a function of (log u, α), u = π_θ/π_ref per token
            (:func:`f_divergence`).
        original_scale: s_f, the original code's generator over ``generator``
            (:func:`pef_loss_weight`).
        uses_alpha: f reads α (the α-divergence), which must then lie in (0, 1).
        exploration_term: A second term on the exploration rows, (log π_θ, log π_ref) -> (B, T),
            with log π_ref from a live reference model and weighted by β₁ = η·|D_pef|/|D_exp|
            (so it also needs the D_exp file); None when the D_pef term is the whole regulariser.
    """

    generator: Callable[[torch.Tensor, float], torch.Tensor]
    original_scale: float = 1.0
    uses_alpha: bool = False
    exploration_term: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = None


#: DPH-RL's divergences (Table 5, Appendix F). The original code's "js_low_var" generator is
#: 2 × the JS generator of Table 5 (s_js = 2).
F_DIVERGENCES: Dict[str, FDivergenceSpec] = {
    "forward_kl": FDivergenceSpec(_forward_kl_generator),
    "js": FDivergenceSpec(_js_generator, original_scale=2.0),
    "alpha": FDivergenceSpec(_alpha_generator, uses_alpha=True),
    "js_definition": FDivergenceSpec(_js_mixture_ref_generator, exploration_term=js_mixture_policy_term),
    # Not an f-divergence term: the control that replays D_pef by likelihood (f_divergence's docstring).
    "nll": FDivergenceSpec(_nll_generator),
}


def f_divergence(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    *,
    kind: str,
    alpha: float = 0.5,
    clamp: float = 20.0,
    max_term: float = MAX_TERM,
) -> torch.Tensor:
    """Per-token DPH-RL f-divergence term on D_pef rows, "generator" form (DPH-RL §4.2.1, Table 5).

    With u = π_θ(a)/π_ref(a) = exp(clamp(log π_θ(a) − log π_ref(a), −clamp, clamp)):

        "forward_kl"     f(u) = u − 1 − log u                                 (DPH-F)
        "js"             f(u) = ½·[u·log u − (u + 1)·log((u + 1)/2)]          (DPH-JS)
        "alpha"          f(u) = (u^(1−α) − (1−α)·u − α) / (α(α − 1)),  0 < α < 1
        "js_definition"  f(u) = w − 1 − log w,  w = (1 + u)/2:  KL(π_ref‖M)   (Appendix F, Eq. 17)
        "nll"            f(u) = −log u = log π_ref(a) − log π_θ(a)            (a control, no f-divergence term)

    The tokens a are those of stored reference responses, sampled from π_ref during
    pre-sampling, so no reference model runs for this term. The expectation under π_ref is
    the f-divergence D_f(π_θ‖π_ref) = E_{a∼π_ref}[f(π_θ(a)/π_ref(a))] of DPH-RL Eq. 6 (with the
    paper's naming): "forward_kl" gives KL(π_ref‖π_θ) (generator −log u; the added u − 1 has
    zero mean under π_ref and makes the sample estimate non-negative), "js" the Jensen-Shannon
    divergence (the original code used twice this), "alpha" the α-divergence
    (Σ π_θ^(1−α) π_ref^α − 1) / (α(α−1)), which tends to forward KL as α → 1 and to reverse KL
    as α → 0, "js_definition" KL(π_ref‖M) with M = (π_ref + π_θ)/2, the D_pef half of JS (its
    other half is :func:`js_mixture_policy_term`). Each f is convex with f(1) = 0 and
    f'(1) = 0, so the term is ≥ 0, and 0 with zero gradient where π_θ = π_ref; its gradient is
    an unbiased estimate of ∇D_f because the samples come from the fixed π_ref.

    "nll" is the control that replays D_pef by likelihood (SFT on the reference responses):
    gradient −∇ log π_θ(a) on every token, never 0 at π_θ = π_ref, and the term can be < 0.
    Its mean under π_ref is KL(π_ref‖π_θ), as "forward_kl"'s: they differ per sample only.

    u is per token, conditioned on the reference prefix, as in the original implementation:
    sequence-level likelihood ratios are products over hundreds of tokens and overflow. The
    log-ratio is clamped to ±``clamp`` (the original's ±20) and the term to ≤ ``max_term``
    (the original's ``low_var_kl`` clamp of 10); beyond either the term is constant and has no
    gradient.

    Args:
        logp: (B, T) log π_θ of the reference response tokens.
        ref_logp: (B, T) stored log π_ref of the same tokens.
        kind: one of ``F_DIVERGENCES``.
        alpha: α of the "alpha" divergence, 0 < α < 1.
        clamp: bound on |log u|.
        max_term: bound on the per-token term (default :data:`MAX_TERM`).

    Returns:
        (B, T) float32 per-token terms in [0, max_term] ("nll": in [−clamp, max_term]).
    """
    check_kind(kind, F_DIVERGENCES, "kind")
    spec = F_DIVERGENCES[kind]
    if spec.uses_alpha and not 0 < alpha < 1:
        raise ValueError(
            f"alpha={alpha} is outside (0, 1); use kind='forward_kl' for α = 1 or pick 0 < α < 1."
        )
    log_u = (upcast(logp) - upcast(ref_logp)).clamp(-clamp, clamp)  # (B, T)
    return spec.generator(log_u, alpha).clamp_max(max_term)


#: How η weighs the D_pef term against the policy loss (``DPHConfig.pef_loss_normalization``).
PEF_NORMALIZATIONS = ("original", "token_mean")


def pef_loss_weight(
    pef_coeff: float,
    *,
    normalization: str,
    divergence: str,
    num_pef_rows: float,
    num_exp_rows: float,
) -> float:
    """Weight w of the D_pef term in ``loss = L_policy + w · token-mean(f)`` (DPH-RL Eq. 7).

        "token_mean"  w = η                                   (Eq. 7 read literally)
        "original"    w = η · s_f · N_pef / N_exp             (the original code's weight)

    The original implementation routes micro-batches by row type and averages them with
    gradient accumulation, so each term is weighted by its share of the mini-batch's rows:
    (N_exp/N)·L_policy + (N_pef/N)·η·L_pef, i.e. relative to the policy loss η·N_pef/N_exp
    (≈ η/8 at its 2048 : 256 mix). Its "js_low_var" generator is twice the JS generator of
    Table 5 (s_js = 2; s = 1 for the others, ``FDivergenceSpec.original_scale``). With
    "original", the paper's η values (Table 6, tuned with that code) mean what they meant there.

    Args:
        pef_coeff: η ≥ 0.
        normalization: one of ``PEF_NORMALIZATIONS``.
        divergence: one of ``F_DIVERGENCES`` (its s_f).
        num_pef_rows, num_exp_rows: D_pef and exploration rows of the mini-batch (all learners).

    Returns:
        w ≥ 0.
    """
    if normalization == "token_mean":
        return pef_coeff
    if normalization != "original":
        raise ValueError(f"normalization={normalization!r} is not one of {list(PEF_NORMALIZATIONS)}.")
    check_kind(divergence, F_DIVERGENCES, "divergence")
    return pef_coeff * F_DIVERGENCES[divergence].original_scale * num_pef_rows / max(num_exp_rows, 1.0)
