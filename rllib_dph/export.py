"""``rllib export <checkpoint> <folder>``: a trained policy as a Hugging Face model folder.

The folder holds the policy's weights (``model.safetensors``), its config and generation config,
and the tokenizer of the model it was trained from (with its chat template), so that
``AutoModelForCausalLM.from_pretrained(folder)``, ``AutoTokenizer.from_pretrained(folder)`` and
``vllm.LLM(folder)`` load it like any hub model.
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


def export_checkpoint(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *, dtype: Optional[str] = None) -> Path:
    """Writes the policy of ``checkpoint`` as a Hugging Face model folder.

    Args:
        checkpoint: An Algorithm checkpoint folder (Tune ``checkpoint_00000N`` or ``save_to_path``).
        out_dir: Folder to write (created; files of the same name are overwritten).
        dtype: Weight dtype of the export (``"float32"``, ``"bfloat16"``, ``"float16"``); None
            keeps the learner's float32 master weights.

    Returns:
        ``out_dir`` as a Path.
    """
    from rllib_dph.models.folders import as_dtype
    from rllib_dph.models.hub import load_tokenizer

    module = load_checkpoint_policy(checkpoint)
    model = module.model
    if dtype is not None:
        model = model.to(as_dtype(dtype))
    base = module.model_config["model"]
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)  # weights, config.json, generation_config.json
    load_tokenizer(base).save_pretrained(out)  # tokenizer files and chat_template.jinja
    record = {"checkpoint": str(Path(checkpoint).expanduser().resolve()), "base_model": base, "dtype": str(model.dtype)}
    (out / EXPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return out
