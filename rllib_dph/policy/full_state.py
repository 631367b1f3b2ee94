"""The policy's full state when its parameters are FSDP2 shards (``sharding="fsdp2"``).

A sharded module holds a shard of every tensor on each learner (the learners build the shards:
``rllib_dph.learners.sharding``). Its full state, for checkpoints and the weight sync to the
rollout engines, is gathered tensor by tensor into rank 0's host memory; a full state is loaded
by every learner keeping its own shard (``torch.distributed.checkpoint.state_dict`` with
``full_state_dict=True``). The RL module reads and writes its state through these functions;
the learners gather the optimizer's full state with the same options (:data:`GATHER`,
:data:`SCATTER`).
"""

from __future__ import annotations

import torch
from ray.rllib.utils.typing import StateDict
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.fsdp import FSDPModule

#: Full tensors, gathered on rank 0's host (the accelerator holds at most one beyond its shards).
GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)
#: A full state given to every rank, each keeping its shard.
SCATTER = StateDictOptions(full_state_dict=True)


def is_sharded(module: torch.nn.Module) -> bool:
    """Whether ``module`` is an FSDP2 unit (its parameters are sharded ``DTensor``s)."""
    return isinstance(module, FSDPModule)


def full_model_state(model: torch.nn.Module) -> StateDict:
    """The full state dict of a sharded ``model`` on rank 0 (CPU tensors), {} elsewhere.

    A collective: every learner must call it. Gathers one tensor at a time.
    """
    return get_model_state_dict(model, options=GATHER)


def load_full_model_state(model: torch.nn.Module, state: StateDict, *, strict: bool = True) -> None:
    """Loads a full state dict into a sharded ``model`` (each learner keeps its shard); with
    ``strict=False`` a part of it (e.g. LoRA adapters alone)."""
    options = SCATTER if strict else StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(model, state, options=options)
