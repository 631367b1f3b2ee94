"""Group-relative advantages and reward shaping of GRPO, Dr. GRPO and DAPO (pure tensor functions,
see ``rllib_dph.losses.tokens`` for the conventions).

- GRPO: Shao et al. 2024, "DeepSeekMath", Eq. 3 (group-relative advantages).
- Dr. GRPO: Liu et al. 2025, "Understanding R1-Zero-like training" (no std normalisation).
- DAPO: Yu et al. 2025 (dynamic sampling, overlong shaping).
"""

from __future__ import annotations

import math

import torch

from rllib_dph.losses.tokens import upcast


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
    rewards = upcast(rewards)
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
    rewards = upcast(rewards)
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
    excess = (max_length - cache_length) - upcast(response_lengths)  # (B,)
    return (excess / cache_length).clamp(-1.0, 0.0)
