"""Token math of the loss terms: log-probs and entropy from logits, and the reduction of
per-token values over the valid tokens (verl's loss aggregation modes).

Every function takes plain tensors and returns plain tensors: no config objects, no batches, no
modules. The learners only pick the terms they need and add them up. Shapes use ``B`` rows
(sequences), ``T`` token positions, ``V`` the vocabulary and ``K`` the rollout engine's top-K.
Per-token inputs may be bfloat16, float16 or float32 on any device; every term is computed and
returned in float32 (float64 inputs stay float64). The other modules of
``rllib_dph.losses`` build on :func:`upcast` and :func:`check_kind`.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

import torch


def upcast(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 at least: bf16, fp16 and integers become float32, float64 stays."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def check_kind(kind: str, registry: Dict[str, Callable], argument: str) -> None:
    """Refuses a ``kind`` that is not a key of ``registry``, naming ``argument`` and the choices."""
    if kind not in registry:
        raise ValueError(f"{argument}={kind!r} is not supported; pass one of {sorted(registry)}.")


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
    check_kind(mode, AGGREGATIONS, "mode")
    norm_length = values.shape[-1] if norm_length is None else norm_length
    if norm_length <= 0:
        raise ValueError(f"norm_length={norm_length} must be > 0; pass the maximum response length.")
    mask = mask.bool()
    values = torch.where(mask, upcast(values), 0.0)  # (B, T)
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
    return torch.where(mask, upcast(values), 0.0).sum() / mask.sum().clamp_min(1)


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
    scaled = upcast(logits) / temperature  # (B, T, V)
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
    scaled = upcast(logits) / temperature  # (B, T, V)
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
    z = upcast(logits)
    if temperature != 1:
        z = z / temperature  # (N, V)
    lse = z.logsumexp(-1)  # (N,)
    logp = z.gather(-1, tokens.long()[:, None]).squeeze(-1) - lse  # (N,)
    topk = None if topk_ids is None else z.gather(-1, topk_ids.long()) - lse[:, None]  # (N, K)
    with torch.set_grad_enabled(entropy_with_grad and torch.is_grad_enabled()):
        entropy = lse - (torch.exp(z - lse[:, None]) * z).sum(-1)  # (N,)
    return logp, entropy, topk
