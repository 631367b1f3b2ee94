"""Rollout engines: the :class:`RolloutEngine` interface and the engine named by an algorithm config."""

from __future__ import annotations

import importlib

from rllib_dph.engines.base import Completion, RolloutEngine, SamplingParams

# config.engine → "module:class" with a ``from_pretrained(name, *, dtype, device, **engine_kwargs)``.
ENGINE_CLASSES = {
    "hf": "rllib_dph.engines.hf:HFEngine",
    "vllm": "rllib_dph.engines.vllm:VLLMEngine",
}


def build_engine(config) -> RolloutEngine:
    """Builds the rollout engine of an algorithm config (on an env runner).

    Args:
        config: A ``GRPOConfig``: ``engine`` picks the class, ``model_name`` the weights,
            ``engine_kwargs`` go to its ``from_pretrained`` (a ``dtype`` there overrides the
            learner's ``dtype``), and ``num_gpus_per_env_runner > 0`` puts it on ``"cuda"``.
    """
    if config.engine not in ENGINE_CLASSES:
        raise ValueError(
            f"engine={config.engine!r} is not available; choose one of {sorted(ENGINE_CLASSES)}."
        )
    module_name, class_name = ENGINE_CLASSES[config.engine].split(":")
    engine_class = getattr(importlib.import_module(module_name), class_name)
    kwargs = {"dtype": config.dtype, **config.engine_kwargs}
    kwargs.setdefault("device", "cuda" if config.num_gpus_per_env_runner > 0 else "cpu")
    return engine_class.from_pretrained(config.model_name, **kwargs)


__all__ = ["Completion", "RolloutEngine", "SamplingParams", "build_engine", "ENGINE_CLASSES"]
