"""LoRA adapters (Hu et al. 2021, arXiv:2106.09685) on the policy, built on ``peft``.

With ``GRPOConfig.llm(lora={...})`` every targeted linear layer W of the policy becomes
W + (alpha / r)·B·A with A (r × in) and B (out × r) trainable and W frozen; B starts at 0, so the
adapted policy starts as the base model. This module owns the concept: the settings and their
check (:func:`lora_problem`), adding adapters to a HF causal LM in place (:func:`add_adapters`,
``peft.inject_adapter_in_model``: the model keeps its class, forward and ``get_decoder()``), the
adapter state that the learner syncs and checkpoints (:func:`adapter_state`, tagged with the
settings under :data:`LORA_SETTINGS` so that a rollout engine can add the same adapters to its
base model: :func:`load_into`), the base model with adapters switched off (the free reference
model π_ref: :func:`adapters_disabled`) and the merged weights W + ΔW (:func:`merged_state`,
for ``rllib export``). ``docs/lora.md`` has the user guide and the measurements.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import numbers
from typing import Any, Iterator, Mapping, Optional

import torch

#: Key of a LoRA module state (:func:`adapter_state`) that holds the settings (a dict), beside
#: the adapter tensors. No parameter name can equal it (those contain dots).
LORA_SETTINGS = "lora_settings"
#: The settings and their defaults (``GRPOConfig.llm(lora=...)``).
LORA_DEFAULTS = {"r": 16, "alpha": 32, "target_modules": "all-linear", "dropout": 0.0}
#: peft's name of the one adapter a policy carries.
ADAPTER_NAME = "default"
#: Parameter-name parts of LoRA tensors (peft's ``lora_A``/``lora_B``, and the embedding variants).
_ADAPTER_PARTS = (".lora_A.", ".lora_B.", ".lora_embedding_A.", ".lora_embedding_B.")


def lora_problem(lora: Any) -> Optional[str]:
    """Why ``lora`` is not a valid ``GRPOConfig.lora`` value (value, rule and fix), or None.

    Valid: None (full fine-tuning), or a dict with keys among :data:`LORA_DEFAULTS`: ``r`` an int
    >= 1, ``alpha`` a finite number > 0, ``target_modules`` ``"all-linear"`` or a non-empty list of
    module-name strings, ``dropout`` a number in [0, 1).
    """
    if lora is None:
        return None
    if not isinstance(lora, Mapping):
        return f"lora={lora!r} is invalid: it must be None or a dict such as {LORA_DEFAULTS}."
    unknown = sorted(set(lora) - set(LORA_DEFAULTS))
    if unknown:
        return f"lora has unknown keys {unknown}: the keys are {sorted(LORA_DEFAULTS)}; remove or rename them."
    s = lora_settings(lora)
    r, alpha, targets, dropout = s["r"], s["alpha"], s["target_modules"], s["dropout"]
    if isinstance(r, bool) or not isinstance(r, numbers.Integral) or r < 1:
        return f"lora['r']={r!r} is invalid: the adapter rank must be an int >= 1, e.g. 16."
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not math.isfinite(alpha) or alpha <= 0:
        return f"lora['alpha']={alpha!r} is invalid: it must be a finite number > 0 (scale alpha/r), e.g. 2·r = {2 * r}."
    names_ok = isinstance(targets, (list, tuple)) and targets and all(isinstance(t, str) and t for t in targets)
    if targets != "all-linear" and not names_ok:
        return (
            f"lora['target_modules']={targets!r} is invalid: it must be 'all-linear' or a non-empty "
            "list of module names, e.g. ['q_proj', 'k_proj', 'v_proj', 'o_proj']."
        )
    if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0 <= dropout < 1:
        return f"lora['dropout']={dropout!r} is invalid: it must be a number in [0, 1), e.g. 0.0."
    return None


def lora_settings(lora: Mapping[str, Any]) -> dict:
    """``lora`` with the defaults of :data:`LORA_DEFAULTS` filled in (a plain dict)."""
    settings = {**LORA_DEFAULTS, **dict(lora)}
    if isinstance(settings["target_modules"], tuple):
        settings["target_modules"] = list(settings["target_modules"])
    return settings


#: Why ``lora=...`` cannot run here and how to fix it (see :func:`peft_problem`).
PEFT_MISSING = "lora=... needs the peft package, which is not installed; run `pip install -e '.[lora]'` (or `pip install peft`)."


def peft_problem() -> Optional[str]:
    """:data:`PEFT_MISSING` when the ``peft`` package cannot be imported here, else None."""
    return PEFT_MISSING if importlib.util.find_spec("peft") is None else None


def _peft():
    """The ``peft`` module, or an ImportError that names the install command."""
    try:
        import peft
        import peft.tuners.lora
    except ImportError as error:
        raise ImportError(PEFT_MISSING) from error
    return peft


def peft_config(lora: Mapping[str, Any]):
    """The ``peft.LoraConfig`` of the settings ``lora`` (causal-LM task, no bias training)."""
    LoraConfig = _peft().LoraConfig
    s = lora_settings(lora)
    return LoraConfig(
        r=s["r"], lora_alpha=s["alpha"], target_modules=s["target_modules"], lora_dropout=s["dropout"],
        bias="none", task_type="CAUSAL_LM",
    )


def add_adapters(model: torch.nn.Module, lora: Mapping[str, Any]) -> torch.nn.Module:
    """Adds LoRA adapters to a HF causal LM in place and freezes everything else.

    The adapters are created in the dtype and on the device of the layers they wrap; B = 0, so
    the model computes what it computed before. Returns ``model`` (same class and forward).
    """
    _peft().inject_adapter_in_model(peft_config(lora), model, adapter_name=ADAPTER_NAME)
    for name, param in model.named_parameters():
        param.requires_grad_(is_adapter_key(name))
    return model


def has_adapters(model: torch.nn.Module) -> bool:
    """Whether ``model`` carries LoRA adapters (:func:`add_adapters`)."""
    return any(is_adapter_key(name) for name, _ in model.named_parameters())


def is_adapter_key(name: str) -> bool:
    """Whether a parameter / state-dict name belongs to a LoRA adapter."""
    return any(part in name for part in _ADAPTER_PARTS)


def adapter_tensors(state: Mapping[str, Any]) -> dict:
    """The adapter entries of a model state dict (the frozen base weights left out)."""
    return {k: v for k, v in state.items() if is_adapter_key(k)}


def adapter_state(model: torch.nn.Module, lora: Mapping[str, Any]) -> dict:
    """The adapter tensors of ``model`` (CPU copies, keyed as in ``model.state_dict()``) plus
    the settings under :data:`LORA_SETTINGS`: everything a base model needs to become the policy."""
    return adapter_state_of(model.state_dict(), lora)


def adapter_state_of(state: Mapping[str, torch.Tensor], lora: Mapping[str, Any]) -> dict:
    """:func:`adapter_state` from a model's full state dict (e.g. one gathered from FSDP2 shards)."""
    tensors = {k: v.detach().to("cpu", copy=True) for k, v in adapter_tensors(state).items()}
    return {**tensors, LORA_SETTINGS: lora_settings(lora)}


def is_lora_state(state: Mapping[str, Any]) -> bool:
    """Whether a module state is an :func:`adapter_state` (not a full state dict)."""
    return LORA_SETTINGS in state


def load_adapter_state(model: torch.nn.Module, state: Mapping[str, Any]) -> None:
    """Loads the adapter tensors of an :func:`adapter_state` into ``model`` (which has adapters
    of the same settings), cast to each adapter's own dtype and device.

    Raises:
        ValueError: the state's adapter names differ from the model's (other target modules or
            another base model).
    """
    own = adapter_tensors(model.state_dict())
    given = {k: v for k, v in state.items() if k != LORA_SETTINGS}
    if set(given) != set(own):
        missing, extra = sorted(set(own) - set(given))[:3], sorted(set(given) - set(own))[:3]
        raise ValueError(
            f"the adapter state does not fit this model's adapters (missing e.g. {missing}, unexpected "
            f"e.g. {extra}); load adapters trained with the same base model and lora settings."
        )
    with torch.no_grad():
        for name, value in given.items():
            own[name].copy_(torch.as_tensor(value))


def load_into(model: torch.nn.Module, state: Mapping[str, Any]) -> None:
    """Makes a model the policy of an :func:`adapter_state`: adds the adapters on first use (in
    the model's dtype; the base weights stay), then loads the tensors. For rollout engines."""
    if not has_adapters(model):
        add_adapters(model, state[LORA_SETTINGS])
        model.requires_grad_(False)
    load_adapter_state(model, state)


def _lora_layers(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    LoraLayer = _peft().tuners.lora.LoraLayer

    return (module for module in model.modules() if isinstance(module, LoraLayer))


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module):
    """The base model inside the block: every LoRA layer computes its frozen base layer only.

    This is π_ref = the initial policy, with no second model in memory (``learners.base``).
    """
    layers = list(_lora_layers(model))
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)


@torch.no_grad()
def merged_state(model: torch.nn.Module) -> dict:
    """The plain HF state dict of the adapted model: W + (alpha / r)·B·A for every adapted
    weight, keyed as in the base model (no ``base_layer`` or adapter keys), CPU float32 tensors."""
    LoraLayer = _peft().tuners.lora.LoraLayer

    deltas = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer) and ADAPTER_NAME in module.lora_A:
            deltas[f"{name}.base_layer.weight"] = module.get_delta_weight(ADAPTER_NAME)
    out = {}
    for key, value in model.state_dict().items():
        if is_adapter_key(key):
            continue
        value = value + deltas[key].to(value.dtype) if key in deltas else value
        out[key.replace(".base_layer.", ".")] = value.detach().to("cpu", torch.float32, copy=True)
    return out


def write_peft_folder(state: Mapping[str, Any], folder, *, base: str) -> None:
    """Writes an :func:`adapter_state` as a PEFT adapter folder without building a model: the
    ``adapter_config.json`` and ``adapter_model.safetensors`` that ``PeftModel.save_pretrained``
    writes (keys ``base_model.model.<module>.lora_A.weight``; ``target_modules`` the adapted
    modules' names, so a reader needs no ``"all-linear"`` rule). For engines that load adapters
    from a folder (vLLM's ``LoRARequest``).

    Args:
        state: An :func:`adapter_state` (linear-layer adapters only).
        folder: Where to write (created).
        base: The base model's folder or HF id, recorded in the config.

    Raises:
        ValueError: The state adapts an embedding (``lora_embedding_*``), which a folder reader
            such as vLLM does not take; target linear layers only.
    """
    from pathlib import Path

    from safetensors.torch import save_file

    tensors = {k: v for k, v in state.items() if k != LORA_SETTINGS}
    embeddings = sorted(k for k in tensors if ".lora_embedding_" in k)[:2]
    if embeddings:
        raise ValueError(
            f"the adapter state adapts embeddings (e.g. {embeddings}), which an adapter folder for a "
            "rollout engine cannot carry; set lora['target_modules'] to linear layers only (e.g. 'all-linear')."
        )
    config = peft_config(state[LORA_SETTINGS])
    config.target_modules = sorted({k.split(".lora_")[0].rsplit(".", 1)[-1] for k in tensors})
    config.base_model_name_or_path = base
    config.inference_mode = True
    folder = Path(folder)
    config.save_pretrained(str(folder))
    save_file(
        {"base_model.model." + k.replace(f".{ADAPTER_NAME}.", "."): torch.as_tensor(v).contiguous() for k, v in tensors.items()},
        str(folder / "adapter_model.safetensors"),
    )


def peft_model(base_model: torch.nn.Module, state: Mapping[str, Any], *, base: str):
    """A ``peft.PeftModel`` of ``base_model`` with the adapters of an :func:`adapter_state`, whose
    ``save_pretrained`` writes a PEFT adapter folder naming ``base`` (a folder or HF id)."""
    config = peft_config(state[LORA_SETTINGS])
    config.base_model_name_or_path = base
    model = _peft().get_peft_model(base_model, config, adapter_name=ADAPTER_NAME)
    load_adapter_state(model.base_model.model, state)
    return model
