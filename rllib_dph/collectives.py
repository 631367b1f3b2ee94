"""Collectives between learners: the one place that asks whether this learner is one of several
and reduces over them. The learners (``rllib_dph.learners``) and the FSDP2 shards
(``rllib_dph.sharding``) both build on it, so neither imports the other for it."""

from __future__ import annotations

import torch
import torch.distributed as dist


def distributed() -> bool:
    """Whether this learner is one of several (a torch.distributed group of more than one)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce(tensor: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """``tensor`` reduced over all learners (in place), unchanged with a single learner."""
    if distributed():
        dist.all_reduce(tensor, op=op)
    return tensor
