"""Which Algorithm checkpoint may be restored: intact ones only, the newest intact one in place of a
damaged latest.

Every checkpoint that ``GRPO.save_to_path`` writes into a local folder ends with
``manifest.sha256`` (``files.write_manifest``): the sha256 of each of its files, written last.
Ray Tune copies a trial's checkpoint into ``--storage-path`` file by file, so a copy cut short (a
full disk, a killed process) leaves a folder that lacks the manifest or files it lists; a
changed byte shows as a sha256 that differs. Such a checkpoint is never restored:
:func:`checkpoint_problem` says what is wrong with it, and :func:`intact_checkpoint` picks the
newest intact checkpoint of the same trial (``checkpoint_<n>`` folders beside it, a lower ``n``)
with a warning naming the damaged one.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Callable, Optional

from rllib_dph.files import manifest_problem

logger = logging.getLogger(__name__)

#: Tune's name of a trial's checkpoint folders: ``checkpoint_000012``.
CHECKPOINT_NAME = re.compile(r"checkpoint_(\d+)")


class CheckpointError(ValueError):
    """A checkpoint that is incomplete or damaged, with no intact one of its trial to use instead."""


def newest_intact(folder: str | os.PathLike) -> Optional[str]:
    """The intact checkpoint with the highest number anywhere under ``folder`` (an experiment or a
    trial folder), or None."""
    found = [p for p in Path(folder).rglob("checkpoint_*") if CHECKPOINT_NAME.fullmatch(p.name) and p.is_dir()]
    for path in sorted(found, key=lambda p: int(p.name.split("_")[1]), reverse=True):
        if checkpoint_problem(path) is None:
            return str(path)
    return None


def checkpoint_problem(path: str | os.PathLike) -> Optional[str]:
    """What makes the checkpoint folder ``path`` unusable, or None when it is complete and unchanged."""
    path = Path(path)
    if not (path / "rllib_checkpoint.json").is_file():
        return f"{path} is not an Algorithm checkpoint (no rllib_checkpoint.json)"
    problem = manifest_problem(path)
    return None if problem is None else f"{path} is incomplete or damaged: {problem}"


def earlier_intact(path: str | os.PathLike) -> Optional[str]:
    """The newest intact checkpoint of ``path``'s trial numbered below it (``checkpoint_<n>``
    folders beside it), or None (none intact, or ``path`` is not in a trial folder)."""
    path = Path(path)
    match = CHECKPOINT_NAME.fullmatch(path.name)
    if not match:
        return None
    earlier = sorted(
        (p for p in path.parent.glob("checkpoint_*")
         if CHECKPOINT_NAME.fullmatch(p.name) and int(p.name.split("_")[1]) < int(match.group(1))),
        key=lambda p: int(p.name.split("_")[1]), reverse=True,
    )
    return next((str(p) for p in earlier if checkpoint_problem(p) is None), None)


def refuse_damaged(path: str | os.PathLike) -> None:
    """Raises :class:`CheckpointError` when the checkpoint folder ``path`` is incomplete or damaged,
    naming the file and the newest intact checkpoint of its trial to restore instead."""
    problem = checkpoint_problem(path)
    if problem is None:
        return
    fallback = earlier_intact(path)
    raise CheckpointError(
        f"{problem}; it is not restored (a partial or damaged checkpoint is never trusted). "
        + (f"Restore the newest intact checkpoint of its trial instead: {fallback}" if fallback
           else "No earlier checkpoint of its trial is intact: start the run again without it.")
    )


def intact_checkpoint(path: str | os.PathLike, *, warn: Callable[[str], None] = logger.warning) -> str:
    """``path`` when it is intact, else the newest intact earlier checkpoint of the same trial.

    Falling back calls ``warn`` with a line naming the damaged checkpoint, what is wrong with it
    and the one used instead; the resumed run repeats the iterations after that one.

    Raises:
        CheckpointError: ``path`` is damaged and no earlier checkpoint beside it is intact.
    """
    path = Path(path)
    problem = checkpoint_problem(path)
    if problem is None:
        return str(path)
    candidate = earlier_intact(path)
    if candidate is not None:
        warn(f"checkpoint {path} is not used: {problem}. Restoring the newest intact checkpoint of its trial, "
             f"{candidate}, instead; the iterations after it are trained again.")
        return candidate
    match = CHECKPOINT_NAME.fullmatch(path.name)
    raise CheckpointError(
        f"{problem}; {'no earlier checkpoint of its trial is intact' if match else 'it is not in a trial folder'}, "
        "so nothing can be restored from it. Start the run again without it (a partial or damaged checkpoint is "
        "never trusted)."
    )
