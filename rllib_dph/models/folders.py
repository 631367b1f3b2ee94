"""Loading a model folder (or a Hugging Face id) that is already there: no name resolution, no builds.

The layer under ``hub`` (which turns names into folders) and under the builders (``build/``)
and the rollout engines, which
all take folders: nothing here imports another module of the package but ``rllib_dph.files``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from rllib_dph.files import home, write_json_atomic

#: Folder under the cache root where :func:`kept_fingerprint` keeps model fingerprints.
FINGERPRINTS_DIR = "fingerprints"
#: Accepted ``dtype`` strings.
DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
#: Files that determine a model's behaviour: weights and tokenizer (see ``folder_fingerprint``).
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)


def as_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """``"float32"``/``"bfloat16"``/``"float16"`` (or fp32/bf16/fp16, or a torch.dtype) as a torch.dtype.

    ``None`` stays ``None`` (meaning: the dtype stored in the checkpoint).
    """
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; use one of {sorted(DTYPES)} or a torch.dtype.")
    return DTYPES[dtype]


def load_tokenizer_folder(path: str):
    """Loads the tokenizer of a model folder or HF id, with a pad token set (EOS when it has none)."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model_folder(
    path: str, *, dtype: str | torch.dtype | None = None, device: str | torch.device = "cpu"
) -> PreTrainedModel:
    """Loads the causal LM of a model folder or HF id in eval mode.

    Args:
        path: A ``save_pretrained`` folder or a Hugging Face id.
        dtype: Parameter dtype (``"float32"``, ``"bfloat16"``, ``"float16"`` or a torch.dtype);
            ``None`` keeps the dtype stored in the checkpoint.
        device: Where to put the model.

    Returns:
        The model; its ``config.pad_token_id`` and ``generation_config.pad_token_id`` are set
        (to the EOS id when the checkpoint has no pad token).
    """
    torch_dtype = as_dtype(dtype)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype if torch_dtype is not None else "auto")
    if model.config.pad_token_id is None:
        eos = model.config.eos_token_id
        model.config.pad_token_id = eos[0] if isinstance(eos, (list, tuple)) else eos
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = model.config.pad_token_id
    return model.to(device).eval()


def _fingerprinted_files(path: Path) -> list[Path]:
    """The weight and tokenizer files of a model folder that :func:`folder_fingerprint` hashes."""
    weights = {p for pattern in WEIGHT_PATTERNS for p in path.glob(pattern)}
    files = sorted(p for p in weights | {path / f for f in TOKENIZER_FILES} if p.is_file())
    if not any(p.suffix in (".safetensors", ".bin") for p in files):
        raise FileNotFoundError(
            f"no weight files ({', '.join(WEIGHT_PATTERNS)}) in {path}; give a directory written by "
            "save_pretrained."
        )
    return files


def folder_fingerprint(path: str | os.PathLike) -> str:
    """A short sha256 over a model folder's weight and tokenizer files (names and bytes).

    Two folders with the same fingerprint hold the same weights and tokenizer, so data made with
    one (pre-sampled responses, reference log-probs) is valid for the other. Reads every file:
    callers that may ask again use :func:`kept_fingerprint`.

    Returns:
        16 hex characters.
    """
    digest = hashlib.sha256()
    for p in _fingerprinted_files(Path(path)):
        digest.update(p.name.encode() + b"\0")
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _file_states(path: Path) -> list[list]:
    """Name, size, mtime, ctime and inode of each file :func:`folder_fingerprint` hashes."""
    states = []
    for p in _fingerprinted_files(path):
        st = p.stat()
        states.append([p.name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino])
    return states


def kept_fingerprint(path: str | os.PathLike) -> str:
    """:func:`folder_fingerprint` of a model folder, hashed once per state of its files and kept.

    The value is kept in ``$RLLIB_DPH_HOME/fingerprints/<hash of the folder's path>.json``
    together with what it was computed from: the folder's resolved path and each hashed file's
    name, size, mtime, ctime and inode. While those are unchanged, the kept value is returned
    without reading the weights; a file written, replaced or touched since (ctime changes even
    when a copy keeps the old mtime) is hashed again. A store that cannot be written (a read-only
    home) costs only the hashing.
    """
    path = Path(path).resolve()
    record = home() / FINGERPRINTS_DIR / f"{hashlib.sha256(str(path).encode()).hexdigest()[:16]}.json"
    states = _file_states(path)
    try:
        kept = json.loads(record.read_text())
        if kept["path"] == str(path) and kept["files"] == states:
            return kept["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none kept yet, or unreadable: hash
    fingerprint = folder_fingerprint(path)
    if _file_states(path) == states:  # not changed while it was read
        try:
            write_json_atomic(record, {"path": str(path), "files": states, "fingerprint": fingerprint}, indent=None)
        except OSError:
            pass
    return fingerprint
