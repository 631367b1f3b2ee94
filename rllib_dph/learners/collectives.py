"""Collectives between learners: the one place that asks whether this learner is one of several
and reduces over them. The learners (``rllib_dph.learners``) and the FSDP2 shards
(``rllib_dph.learners.sharding``) both build on it, so neither imports the other for it.

Every collective waits at most the process group's timeout, ``collective_timeout_s``
(``config.learners(collective_timeout_s=...)``, default 1800 s), set by :func:`set_timeout` when
the learner is built: Ray Train creates the group with its own fixed 30 min, which RLlib does not
expose. A peer that died or hangs then fails the waiting learners' update instead of holding
them forever; the driver's ``learner_update_timeout_s`` bounds the update as a whole
(``rllib_dph.learners.remote_calls``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist


def distributed() -> bool:
    """Whether this learner is one of several (a torch.distributed group of more than one)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


#: The timeout :func:`set_timeout` gave this process's group (for error messages).
_timeout_s: Optional[float] = None


def set_timeout(seconds: float) -> None:
    """Sets the default process group's timeout (gloo and NCCL) to ``seconds``; no-op with a
    single learner. torch keeps no public setter for an existing group (``_set_pg_timeout``)."""
    global _timeout_s
    if distributed():
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=seconds))
        _timeout_s = seconds


def all_reduce(tensor: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """``tensor`` reduced over all learners (in place), unchanged with a single learner.

    Raises:
        TimeoutError: Another learner did not join within ``collective_timeout_s``.
    """
    if distributed():
        try:
            dist.all_reduce(tensor, op=op)
        except RuntimeError as e:  # gloo and NCCL report a timeout as a RuntimeError subclass
            if "timed out" not in str(e).lower() and "timeout" not in str(e).lower():
                raise
            raise TimeoutError(
                f"learner rank {dist.get_rank()}: all_reduce of a {tuple(tensor.shape)} tensor between "
                f"{dist.get_world_size()} learners did not complete within collective_timeout_s="
                f"{_timeout_s} s: another learner is dead or stuck. Check the other "
                "learners' logs, or raise config.learners(collective_timeout_s=...)."
            ) from e
    return tensor
