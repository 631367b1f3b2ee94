"""``rllib export <checkpoint> <folder>``: a trained policy as a Hugging Face model folder.

The folder holds the policy's weights (``model.safetensors``), its config and generation config,
and the tokenizer of the model it was trained from (with its chat template), so that
``AutoModelForCausalLM.from_pretrained(folder)``, ``AutoTokenizer.from_pretrained(folder)`` and
``vllm.LLM(folder)`` load it like any hub model. A LoRA policy (``GRPOConfig.llm(lora=...)``) is
exported merged (W + ΔW, a plain model folder) by default, or with ``adapter_only=True`` as a
PEFT adapter folder (``adapter_config.json``, ``adapter_model.safetensors``) that
``peft.PeftModel.from_pretrained(base_model, folder)`` loads on top of its base model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

#: File in the exported folder that records where it came from.
EXPORT_RECORD = "rllib_dph_export.json"


def load_checkpoint_policy(checkpoint: str | os.PathLike):
    """The learner's RL module of an Algorithm checkpoint (see ``evaluation.find_module_checkpoint``).

    Raises:
        ValueError: ``checkpoint`` is not an Algorithm checkpoint folder.
    """
    from ray.rllib.core.rl_module.rl_module import RLModule

    from rllib_dph.evaluation import find_module_checkpoint

    path = Path(checkpoint).expanduser()
    module_dir = find_module_checkpoint(path) if path.is_dir() else None
    if module_dir is None:
        raise ValueError(
            f"{checkpoint} is not an RLlib Algorithm checkpoint (no rllib_checkpoint.json); give a "
            "checkpoint_00000N folder of a Tune trial or a folder written by algo.save_to_path."
        )
    return RLModule.from_checkpoint(str(module_dir))


def export_checkpoint(
    checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *, dtype: Optional[str] = None, adapter_only: bool = False
) -> Path:
    """Writes the policy of ``checkpoint`` as a Hugging Face model folder.

    Args:
        checkpoint: An Algorithm checkpoint folder (Tune ``checkpoint_00000N`` or ``save_to_path``).
        out_dir: Folder to write (created; files of the same name are overwritten).
        dtype: Weight dtype of the export (``"float32"``, ``"bfloat16"``, ``"float16"``); None
            keeps the learner's float32 master weights.
        adapter_only: Write a LoRA policy's adapters as a PEFT adapter folder instead of the
            merged model (the folder records the base model's path or id).

    Returns:
        ``out_dir`` as a Path.

    Raises:
        ValueError: ``adapter_only`` for a checkpoint trained without LoRA.
    """
    from rllib_dph.models.hub import load_tokenizer

    module = load_checkpoint_policy(checkpoint)
    base = module.model_config["model"]
    lora_settings = module.model_config.get("lora")
    if adapter_only and lora_settings is None:
        raise ValueError(
            f"--adapter-only: {checkpoint} was trained without LoRA (lora=None), so it has no adapters; "
            "export the whole model without --adapter-only."
        )
    model = _export_model(module, base, adapter_only=adapter_only)
    if dtype is not None:
        from rllib_dph.models.folders import as_dtype

        model = model.to(as_dtype(dtype))
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)  # weights / adapters, config.json, generation_config.json
    load_tokenizer(base).save_pretrained(out)  # tokenizer files and chat_template.jinja
    record = {"checkpoint": str(Path(checkpoint).expanduser().resolve()), "base_model": base, "dtype": str(model.dtype)}
    if lora_settings is not None:
        record.update(lora=lora_settings, adapter_only=adapter_only)
    (out / EXPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return out


def _export_model(module, base: str, *, adapter_only: bool):
    """The model to save: the policy's own HF model; for LoRA the merged plain model, or a
    ``peft.PeftModel`` holding the adapters (``adapter_only``)."""
    from rllib_dph.policy import lora
    from rllib_dph.models.hub import load_causal_lm, resolve_model

    settings = module.model_config.get("lora")
    if settings is None:
        return module.model
    plain = load_causal_lm(base, dtype="float32")
    if not adapter_only:
        plain.load_state_dict(lora.merged_state(module.model), strict=True)
        return plain
    return lora.peft_model(plain, lora.adapter_state(module.model, settings), base=resolve_model(base))
