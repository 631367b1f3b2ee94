"""Resolving model names: a bundled name, a local folder or a Hugging Face id to what loads it.

Anywhere rllib_dph takes a model, it accepts these names and treats them alike:

- a bundled model (``catalog.BUNDLED_MODELS``: the tiny models, the SmolLM2 conversion, the warm
  starts): its current build, shipped inside the package (``tiny-sql-math``) or in the model cache
  ``$RLLIB_DPH_HOME/models/<name>`` (default ``~/.cache/rllib_dph``);
- a local directory written by ``save_pretrained``: used as is;
- anything else: a Hugging Face id, handed to ``transformers`` unchanged (it loads from the local
  HF cache, or downloads when the environment allows it).

Nothing here builds. A bundled name without a current build raises :class:`ModelNotFoundError`
naming ``rllib build-model <name>``; building is ``rllib_dph.models.build.prepare``'s, run by
``rllib build-model`` and by the preparation step of a run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel

from rllib_dph.models.catalog import BUNDLED_MODELS, TINY_MODELS, WARM_STARTS, build_folder, cache_dir
from rllib_dph.models.folders import kept_fingerprint, load_model_folder, load_tokenizer_folder


class ModelNotFoundError(FileNotFoundError):
    """A model name that resolves to nothing loadable.

    Attributes:
        name: The name as given.
        kind: What the name was taken for (:data:`MODEL_KINDS`).
        reason: What is missing, e.g. ``"not built at /path"``.
        fix: What to do about it.

    Callers (preflight, evaluation, pre-sampling, engines) format these fields; none of them
    re-derives what kind of name it was given.
    """

    def __init__(self, name: str, kind: str, reason: str, fix: str):
        self.name, self.kind, self.reason, self.fix = name, kind, reason, fix
        super().__init__(f"model {name!r}: {reason}; {fix}")


#: What a model name can be: a bundled name, a local folder, or a Hugging Face id.
MODEL_KINDS = ("bundled", "folder", "hub")


@dataclass(frozen=True)
class ModelRef:
    """What a model name resolves to (:func:`locate_model`).

    Attributes:
        name: The name as given.
        kind: One of :data:`MODEL_KINDS`.
        location: What ``from_pretrained`` loads: the folder of a bundled name (shipped or in
            the cache) or of a local folder; a Hugging Face id unchanged.
    """

    name: str
    kind: str
    location: str

    def folder(self) -> Path:
        """The folder on disk: ``location``, or a Hugging Face id's snapshot in the local HF cache.

        Raises:
            ModelNotFoundError: A Hugging Face id that is not in the local cache.
        """
        if self.kind != "hub":
            return Path(self.location)
        from huggingface_hub import snapshot_download

        try:
            return Path(snapshot_download(self.location, local_files_only=True))
        except Exception as e:  # noqa: BLE001 - not cached, or not a valid id
            raise ModelNotFoundError(
                self.name, "hub", "not in the local Hugging Face cache",
                f"on a machine with internet run `hf download {self.name}` and copy "
                "~/.cache/huggingface/hub here (or set HF_HOME), or pass a folder written by save_pretrained",
            ) from e

    def fingerprint(self) -> str:
        """A short sha256 over the weight and tokenizer files, hashed once per state of the files
        and kept (``folders.kept_fingerprint``); 16 hex characters."""
        return kept_fingerprint(self.folder())


def locate_model(name_or_path: str) -> ModelRef:
    """The one resolver: a model name to its kind and location (and, through it, its fingerprint).

    Args:
        name_or_path: A bundled model name (``BUNDLED_MODELS``), a local ``save_pretrained``
            directory or a Hugging Face id (``is_local_path`` tells a path from an id).

    Raises:
        ModelNotFoundError: A bundled name without a current build (none, or one made by another
            recipe), or a local path that is not a folder.
    """
    if name_or_path in BUNDLED_MODELS:
        folder = build_folder(name_or_path)
        if folder is None:
            raise ModelNotFoundError(
                name_or_path, "bundled", f"not built at {cache_dir(name_or_path)} (or built by another version of rllib_dph)",
                f"build it with `rllib build-model {name_or_path}` (rllib train, presample and evaluate "
                "build it in their preparation step, as does build_algo())",
            )
        return ModelRef(name_or_path, "bundled", str(folder))
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        return ModelRef(name_or_path, "folder", str(local))
    if is_local_path(name_or_path):
        raise ModelNotFoundError(
            name_or_path, "folder", "no such model folder",
            f"give a directory written by save_pretrained, a Hugging Face id, or one of {list(BUNDLED_MODELS)}",
        )
    return ModelRef(name_or_path, "hub", name_or_path)


def resolve_model(name_or_path: str) -> str:
    """``locate_model(name_or_path).location``: what ``from_pretrained`` loads (same errors)."""
    return locate_model(name_or_path).location


def config_source(name_or_path: str) -> str:
    """A folder or Hugging Face id holding the architecture and tokenizer of ``name_or_path``
    without building anything: its own location, or a warm start's base while the warm start is
    not built (an SFT keeps both).

    Raises:
        ModelNotFoundError: As :func:`locate_model`, for the name or the warm start's base.
    """
    try:
        return locate_model(name_or_path).location
    except ModelNotFoundError:
        if name_or_path not in WARM_STARTS:
            raise
        return locate_model(WARM_STARTS[name_or_path].base).location


def architecture(name_or_path: str):
    """The ``transformers`` config of a model without building anything: read from
    :func:`config_source`, or, for a bundled tiny model not built yet, made from its spec (with
    the spec's target vocabulary size).

    Raises:
        FileNotFoundError: The model's config is not on this machine yet.
    """
    from transformers import AutoConfig, Qwen2Config

    try:
        path = config_source(name_or_path)
    except FileNotFoundError:
        if name_or_path not in TINY_MODELS:
            raise
        spec = TINY_MODELS[name_or_path]
        return Qwen2Config(
            vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
            num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
            num_key_value_heads=spec.num_kv_heads, tie_word_embeddings=True)
    try:
        return AutoConfig.from_pretrained(path, local_files_only=True)
    except OSError as e:
        raise FileNotFoundError(f"no config of {name_or_path!r} on this machine ({e})") from e


def is_local_path(name_or_path: str) -> bool:
    """The one "is this a path?" rule for anything that takes a model or a checkpoint.

    A bundled model name is a name; text that starts with ``/``, ``./``, ``../`` or ``~``, or that
    names an existing file or folder, is a local path; anything else is a Hugging Face id.
    """
    if name_or_path in BUNDLED_MODELS:
        return False
    return name_or_path.startswith(("/", "./", "../", "~")) or Path(name_or_path).expanduser().exists()


def absolute_path(text: str) -> str:
    """A path argument as an absolute path (``~`` expanded, relative to the current folder).

    Ray's checkpoint loading (pyarrow) and Tune's storage need absolute paths; every path
    argument of the ``rllib`` command goes through this or :func:`absolute_if_path`.
    """
    return os.path.abspath(os.path.expanduser(text))


def absolute_if_path(name_or_path: str) -> str:
    """A model-or-checkpoint argument: :func:`absolute_path` when :func:`is_local_path` says it is a
    path; a bundled model name or a Hugging Face id unchanged."""
    return absolute_path(name_or_path) if is_local_path(name_or_path) else name_or_path


def load_tokenizer(name_or_path: str):
    """Loads the tokenizer of a model (see ``resolve_model``), with a pad token set (EOS when it has none)."""
    return load_tokenizer_folder(locate_model(name_or_path).location)


def load_causal_lm(
    name_or_path: str, *, dtype: str | torch.dtype | None = None, device: str | torch.device = "cpu"
) -> PreTrainedModel:
    """Loads a causal LM (see ``resolve_model``) in eval mode (``folders.load_model_folder``).

    Args:
        name_or_path: Bundled model name, local directory or Hugging Face id.
        dtype: Parameter dtype (``"float32"``, ``"bfloat16"``, ``"float16"`` or a torch.dtype);
            ``None`` keeps the dtype stored in the checkpoint.
        device: Where to put the model.
    """
    return load_model_folder(locate_model(name_or_path).location, dtype=dtype, device=device)


def model_fingerprint(name_or_path: str) -> str:
    """``locate_model(name_or_path).fingerprint()``: 16 hex characters over a model's weight and
    tokenizer files (a bundled name must be built, a Hugging Face id cached)."""
    return locate_model(name_or_path).fingerprint()
