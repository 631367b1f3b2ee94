"""Loss terms of GRPO, DAPO, DPH-RL and DPPO as pure tensor functions.

Every function takes plain tensors and returns plain tensors: no config objects, no batches, no
modules. The learners only pick the terms they need and add them up. Shapes use ``B`` rows
(sequences), ``T`` token positions, ``V`` the vocabulary and ``K`` the rollout engine's top-K.
Per-token inputs may be bfloat16, float16 or float32 on any device; every term is computed and
returned in float32 (float64 inputs stay float64).

Papers referred to below:

- GRPO: Shao et al. 2024, "DeepSeekMath", Eq. 3 (group-relative advantages).
- Dr. GRPO: Liu et al. 2025, "Understanding R1-Zero-like training" (no std normalisation,
  constant length normaliser).
- DAPO: Yu et al. 2025 (clip-higher, token-level loss, dynamic sampling, overlong shaping).
- DPH-RL: "Diversity-Preserving Hybrid RL" (``shared/seeds/000_*``): §4.2 Eq. 5-7, Table 5,
  Appendix F.
- DPPO: Qi et al., "Divergence Proximal Policy Optimization" (``shared/seeds/003_*``): §4.3-4.4
  Eq. 11-16, §5.3, Appendix C, Appendix D Eq. 23.
- k1/k2/k3: J. Schulman, "Approximating KL divergence", 2020.
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
import torch.nn.functional as F

# Smallest probability mass used where a mass enters a logarithm (DPPO binary / top-K divergences).
_MIN_MASS = 1e-12
#: Bound on the magnitude of one token's divergence term (KL penalty, DPH f-divergences): verl's
#: ``kl_penalty(..., "low_var_kl")``, which the original DPH-RL code uses, clamps to [-10, 10].
#: Beyond it the term is constant and the token has no gradient, so one token that π_θ or
#: π_ref finds near-impossible cannot dominate the update (π_ref = 1e-6, π_θ = 0.5 would give a
#: forward-KL term and gradient of ~5e5 unclamped).
MAX_TERM = 10.0


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 at least: bf16, fp16 and integers become float32, float64 stays."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _check_kind(kind: str, registry: Dict[str, Callable], argument: str) -> None:
    if kind not in registry:
        raise ValueError(f"{argument}={kind!r} is not supported; pass one of {sorted(registry)}.")


# --------------------------------------------------------------------------------- advantages
def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-relative advantages of GRPO (Shao et al. 2024; DPH-RL Appendix E, Eq. 9).

        Â_i = (r_i − mean_g(r)) / (std_g(r) + eps)     if normalize_std (GRPO)
        Â_i =  r_i − mean_g(r)                          otherwise (Dr. GRPO)

    where g is the group of row i (the completions of one prompt) and std is the unbiased
    (n − 1) standard deviation. A group with one member gets advantage 0.

    Args:
        rewards: (B,) scalar reward of each completion.
        group_ids: (B,) integer group of each row; any integers, not necessarily contiguous
            or sorted.
        normalize_std: divide by the group's standard deviation.
        eps: added to the standard deviation, so that groups with equal rewards get 0.

    Returns:
        (B,) float32 advantages, on the device of ``rewards``.
    """
    rewards = _upcast(rewards)
    _, group, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)  # (B,), (G,)
    sums = rewards.new_zeros(counts.shape).index_add_(0, group, rewards)  # (G,)
    centered = rewards - (sums / counts)[group]  # (B,); exactly 0 for a group of one
    if not normalize_std:
        return centered
    squares = rewards.new_zeros(counts.shape).index_add_(0, group, centered**2)  # (G,)
    std = (squares / (counts - 1).clamp_min(1)).sqrt()  # (G,)
    return centered / (std[group] + eps)


def has_reward_variance(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Rows whose group carries a learning signal, for DAPO dynamic sampling (DAPO §3.2).

    A group whose rewards are all equal (all correct or all wrong) has zero advantages and no
    policy gradient; DAPO drops such groups and samples more prompts.

    Args:
        rewards: (B,) scalar reward of each completion.
        group_ids: (B,) integer group of each row (any integers).

    Returns:
        (B,) bool, True where the row's group has max reward ≠ min reward (a group of one
        member has no variance).
    """
    rewards = _upcast(rewards)
    _, group, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)  # (B,), (G,)
    highest = rewards.new_full(counts.shape, -math.inf).scatter_reduce(0, group, rewards, "amax")  # (G,)
    lowest = rewards.new_full(counts.shape, math.inf).scatter_reduce(0, group, rewards, "amin")  # (G,)
    return (highest > lowest)[group]  # (B,)


def overlong_penalty(response_lengths: torch.Tensor, *, max_length: int, cache_length: int) -> torch.Tensor:
    """DAPO soft overlong punishment (DAPO §3.4, Eq. 13), added to the task reward.

        R(L) = 0                                  if L ≤ L_max − L_cache
               ((L_max − L_cache) − L) / L_cache  if L_max − L_cache < L ≤ L_max
               −1                                 if L > L_max

    i.e. ``clamp(((L_max − L_cache) − L) / L_cache, −1, 0)``: a linear ramp from 0 to −1 over
    the last ``cache_length`` tokens before the limit.

    Args:
        response_lengths: (B,) number of response tokens of each completion.
        max_length: L_max, the maximum response length.
        cache_length: L_cache, the length of the punishment buffer, 0 < L_cache ≤ L_max.

    Returns:
        (B,) float32 penalties in [−1, 0].
    """
    if not 0 < cache_length <= max_length:
        raise ValueError(
            f"cache_length={cache_length} must satisfy 0 < cache_length <= max_length={max_length}; "
            "use a buffer shorter than the maximum response length."
        )
    excess = (max_length - cache_length) - _upcast(response_lengths)  # (B,)
    return (excess / cache_length).clamp(-1.0, 0.0)


# ----------------------------------------------------------------------- KL to the reference
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
    _check_kind(kind, KL_ESTIMATORS, "kind")
    return KL_ESTIMATORS[kind](_upcast(logp) - _upcast(ref_logp)).clamp(-max_term, max_term)


# -------------------------------------------------------------------------------- aggregation
def _token_mean_parts(values: torch.Tensor, mask: torch.Tensor, norm_length: float):
    return values.sum(), mask.sum()


def _seq_mean_token_mean_parts(values: torch.Tensor, mask: torch.Tensor, norm_length: float):
    counts = mask.sum(-1)  # (B,)
    per_seq = values.sum(-1) / counts.clamp_min(1)  # (B,)
    return per_seq.sum(), (counts > 0).sum()


def _seq_mean_token_sum_norm_parts(values: torch.Tensor, mask: torch.Tensor, norm_length: float):
    per_seq = values.sum(-1) / norm_length  # (B,)
    return per_seq.sum(), (mask.sum(-1) > 0).sum()


#: Loss aggregation modes (verl's ``loss_agg_mode``): functions of (zeroed values, mask, norm)
#: returning (numerator, denominator), so that shards of one mini-batch (DDP learners,
#: micro-batches) aggregate exactly as the whole: Σ numerators / Σ denominators.
AGGREGATIONS: Dict[str, Callable[[torch.Tensor, torch.Tensor, float], tuple]] = {
    "token-mean": _token_mean_parts,
    "seq-mean-token-mean": _seq_mean_token_mean_parts,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm_parts,
}


def aggregate_parts(
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str,
    norm_length: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Numerator and denominator of :func:`masked_aggregate`: the loss is ``num / max(den, 1)``.

    With m the mask, |o_i| = Σ_t m_it and S the set of rows with at least one valid token:

        "token-mean"               num = Σ_it m·v                  den = Σ_it m     (DAPO)
        "seq-mean-token-mean"      num = Σ_{i∈S} Σ_t m·v / |o_i|   den = |S|        (GRPO, DPH-RL Eq. 5)
        "seq-mean-token-sum-norm"  num = Σ_{i∈S} Σ_t m·v / N       den = |S|        (Dr. GRPO)

    Both parts are sums over rows, so a mini-batch split over learners or micro-batches is
    aggregated exactly by summing the parts of its shards (all-reduce the denominator) before
    dividing: "token-mean" then normalises by the response tokens of the whole mini-batch.

    Args:
        values: (B, T) per-token values.
        mask: (B, T) bool or 0/1, the tokens to aggregate over.
        mode: one of ``AGGREGATIONS``.
        norm_length: N of "seq-mean-token-sum-norm" (e.g. the maximum response length);
            defaults to T. Ignored by the other modes.

    Returns:
        (numerator, denominator): scalar float32 tensors; the numerator keeps the graph.
    """
    _check_kind(mode, AGGREGATIONS, "mode")
    norm_length = values.shape[-1] if norm_length is None else norm_length
    if norm_length <= 0:
        raise ValueError(f"norm_length={norm_length} must be > 0; pass the maximum response length.")
    mask = mask.bool()
    values = torch.where(mask, _upcast(values), 0.0)  # (B, T)
    num, den = AGGREGATIONS[mode](values, mask, norm_length)
    return num, den.to(num.dtype)


def masked_aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str,
    norm_length: Optional[float] = None,
) -> torch.Tensor:
    """Reduces per-token loss values over the valid tokens to a scalar: num / max(den, 1).

    See :func:`aggregate_parts` for the modes. Rows without valid tokens (padding rows, or
    rows of another type, e.g. D_pef rows under an exploration mask) do not count as
    sequences. Values at masked positions are ignored even if they are inf or NaN. Zero valid
    tokens give 0, connected to the graph (zero gradient).

    Args:
        values: (B, T) per-token values.
        mask: (B, T) bool or 0/1, the tokens to aggregate over.
        mode: one of ``AGGREGATIONS``.
        norm_length: N of "seq-mean-token-sum-norm"; defaults to T.

    Returns:
        Scalar float32 tensor.
    """
    num, den = aggregate_parts(values, mask, mode=mode, norm_length=norm_length)
    return num / den.clamp_min(1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the valid tokens, 0 when there are none (for metrics).

    Args:
        values: any shape, e.g. (B, T).
        mask: bool or 0/1, broadcastable to ``values``.

    Returns:
        Scalar float32 tensor; values at masked positions are ignored even if inf or NaN.
    """
    mask = mask.bool().expand_as(values)
    return torch.where(mask, _upcast(values), 0.0).sum() / mask.sum().clamp_min(1)


# ----------------------------------------------------------------------- DPH f-divergences
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
    log_u = (_upcast(logp) - _upcast(ref_logp)).clamp(-clamp, clamp)  # (B, T)
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
    _check_kind(kind, F_DIVERGENCES, "kind")
    spec = F_DIVERGENCES[kind]
    if spec.uses_alpha and not 0 < alpha < 1:
        raise ValueError(
            f"alpha={alpha} is outside (0, 1); use kind='forward_kl' for α = 1 or pick 0 < α < 1."
        )
    log_u = (_upcast(logp) - _upcast(ref_logp)).clamp(-clamp, clamp)  # (B, T)
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
    _check_kind(divergence, F_DIVERGENCES, "divergence")
    return pef_coeff * F_DIVERGENCES[divergence].original_scale * num_pef_rows / max(num_exp_rows, 1.0)


# ------------------------------------------------------------------ log-probs and entropy
def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, *, temperature: float = 1.0) -> torch.Tensor:
    """Log-prob of given tokens under softmax(logits / temperature), computed in float32.

        log π(a_t) = z_t[a_t] − logsumexp(z_t),   z_t = logits_t / temperature

    The gathered logit minus the log-normaliser: the (B, T, V) log-softmax is never stored.

    Args:
        logits: (B, T, V) next-token logits, any float dtype.
        tokens: (B, T) integer token ids.
        temperature: sampling temperature, > 0 (the rollout engine's, so that log π matches μ).

    Returns:
        (B, T) float32 log-probs.
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0; use the sampling temperature.")
    scaled = _upcast(logits) / temperature  # (B, T, V)
    picked = scaled.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)  # (B, T)
    return picked - scaled.logsumexp(-1)  # (B, T)


def token_entropy(logits: torch.Tensor, *, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) at every position, computed in float32.

        H_t = −Σ_a π(a) log π(a) = logsumexp(z_t) − Σ_a softmax(z_t)_a · z_t[a]

    Args:
        logits: (B, T, V) next-token logits, any float dtype.
        temperature: sampling temperature, > 0.

    Returns:
        (B, T) float32 entropies in nats.
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0; use the sampling temperature.")
    scaled = _upcast(logits) / temperature  # (B, T, V)
    return scaled.logsumexp(-1) - (scaled.softmax(-1) * scaled).sum(-1)  # (B, T)


def token_stats(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    *,
    temperature: float = 1.0,
    topk_ids: Optional[torch.Tensor] = None,
    entropy_with_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Log-prob of ``tokens``, entropy and top-K log-probs from one logsumexp per position.

        z = logits / T,  lse = logsumexp(z),  log π(a) = z[a] − lse,
        H = lse − Σ_a softmax(z)_a · z_a

    :func:`token_logprobs` and :func:`token_entropy` each normalise on their own; here the
    log-normaliser is computed once and shared, z is not copied when T = 1, and the entropy's
    (N, V) softmax is built without autograd unless ``entropy_with_grad``. Used by the learner
    on response positions only (N = response tokens of the batch, not B × L).

    Args:
        logits: (N, V) next-token logits, any float dtype (computed in float32).
        tokens: (N,) integer token ids.
        temperature: T > 0, the sampling temperature.
        topk_ids: (N, K) ids whose log-probs to return (the rollout engine's top-K), or None.
        entropy_with_grad: keep the entropy in the autograd graph (an entropy bonus needs it).

    Returns:
        logp (N,), entropy (N,) and top-K log-probs (N, K) or None, all float32.
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0; use the sampling temperature.")
    z = _upcast(logits)
    if temperature != 1:
        z = z / temperature  # (N, V)
    lse = z.logsumexp(-1)  # (N,)
    logp = z.gather(-1, tokens.long()[:, None]).squeeze(-1) - lse  # (N,)
    topk = None if topk_ids is None else z.gather(-1, topk_ids.long()) - lse[:, None]  # (N, K)
    with torch.set_grad_enabled(entropy_with_grad and torch.is_grad_enabled()):
        entropy = lse - (torch.exp(z - lse[:, None]) * z).sum(-1)  # (N,)
    return logp, entropy, topk


# ------------------------------------------------- trust regions and off-policy corrections
def _binary_masses(logp: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B, T, 2): (π(a_t), 1 − π(a_t)), the sampled token vs. all others."""
    return torch.stack([logp.exp(), -torch.expm1(logp)], dim=-1).clamp_min(_MIN_MASS)


def _topk_masses(topk_logp: torch.Tensor) -> torch.Tensor:
    """(B, T, K) -> (B, T, K + 1): the K tokens' masses and the "other" bucket."""
    probs = _upcast(topk_logp).exp()  # (B, T, K)
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
    log_ratio = torch.where(mask, _upcast(logp) - _upcast(behavior_logp), 0.0)  # (B, T)
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
    _check_kind(kind, TRUST_REGIONS, "kind")
    spec = TRUST_REGIONS[kind]
    if spec.divergence is None:
        with_divergence = [name for name, other in TRUST_REGIONS.items() if other.divergence is not None]
        raise ValueError(f"kind={kind!r} bounds no divergence; pass one of {with_divergence}.")
    if spec.needs_topk:
        _check_topk(kind, topk_logp, topk_behavior_logp)
    with torch.no_grad():
        return spec.divergence(_upcast(logp), _upcast(behavior_logp), topk_logp, topk_behavior_logp)


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
    _check_kind(kind, TRUST_REGIONS, "kind")
    spec = TRUST_REGIONS[kind]
    if spec.sequence_level:
        _check_response_mask(kind, response_mask)
    with torch.no_grad():
        logp, behavior_logp = _upcast(logp), _upcast(behavior_logp)
        divergence = None
        if spec.divergence is not None:
            divergence = trust_region_divergence(
                logp, behavior_logp, kind=kind, topk_logp=topk_logp, topk_behavior_logp=topk_behavior_logp
            )  # (B, T)
        keep = spec.keep(logp, behavior_logp, _upcast(advantages), low, high, divergence, response_mask)  # (B, T)
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
        log_ratio = _upcast(logp) - _upcast(behavior_logp)  # (B, T)
        return ~((_upcast(advantages) < 0) & (log_ratio > math.log(clip_ratio_c)))


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
    logp = _upcast(logp)
    with torch.no_grad():
        ratio = torch.exp(logp - _upcast(behavior_logp)).clamp_max(truncation)  # (B, T)
        weight = torch.where(mask.bool(), ratio, 0.0) * _upcast(advantages)  # (B, T)
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
        drop = _upcast(behavior_logp).exp() - _upcast(logp).exp()  # (B, T)
        bad = (advantages < 0) & (drop > threshold)  # (B, T)
        return masked_mean(bad.float(), mask)
