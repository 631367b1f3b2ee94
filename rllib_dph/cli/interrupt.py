"""Ctrl-C of ``rllib train``: the running trials stop after their current iteration, each with a
checkpoint, so that ``--resume`` continues them where they stopped.

Tune's own Ctrl-C stops at once: the iteration under way is lost and a trial keeps only its
last periodic checkpoint (or none). While ``experiments.run_experiment`` runs Tune inside
:func:`catching_ctrl_c`, with :class:`GracefulInterrupt` among the run's callbacks, Ctrl-C works
in steps:

1. the first Ctrl-C: each running trial finishes its iteration, whose result asks Tune for a
   checkpoint (``should_checkpoint``, which Tune lets a callback set); once every trial that was
   running has saved one, the experiment stops the way Tune stops it on Ctrl-C (experiment state
   saved, the trials unfinished), so ``--resume`` continues each from that checkpoint;
2. a second Ctrl-C stops at once, by Tune's own stop: the trials continue from their last
   periodic checkpoint (``--checkpoint-freq``);
3. a third raises ``KeyboardInterrupt``.

The state of the presses is this process's (signals are), not the callback's: Tune pickles the
callbacks with the experiment and ``--resume`` runs the unpickled ones.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from typing import Iterator, Optional

from ray import tune
from ray.tune.result import SHOULD_CHECKPOINT

#: Tune's switch for its own SIGINT handler (its SIGUSR1 handler, the same stop, stays).
TUNE_SIGINT_SWITCH = "TUNE_DISABLE_SIGINT_HANDLER"


@dataclass
class _Presses:
    """Ctrl-C in this process while one ``fit`` runs."""

    count: int = 0
    attached: bool = False  # a GracefulInterrupt callback runs in this fit
    waiting: Optional[set[str]] = None  # trials running at the first step after the first press
    saved: set[str] = field(default_factory=set)
    stopped: bool = False


_PRESSES = _Presses()


@contextlib.contextmanager
def catching_ctrl_c() -> Iterator[None]:
    """Handles SIGINT as the module docstring says while the block runs ``Tuner.fit`` (main
    thread only; elsewhere Tune's own handling stays)."""
    global _PRESSES
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _PRESSES = _Presses()
    switch = os.environ.get(TUNE_SIGINT_SWITCH)
    os.environ[TUNE_SIGINT_SWITCH] = "1"
    previous = signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if switch is None:
            os.environ.pop(TUNE_SIGINT_SWITCH, None)
        else:
            os.environ[TUNE_SIGINT_SWITCH] = switch


def _on_sigint(signum, frame) -> None:
    _PRESSES.count += 1
    if _PRESSES.count >= 3:
        raise KeyboardInterrupt
    if _PRESSES.stopped:
        print("\nrllib: stopping already (Ctrl-C again aborts).", file=sys.stderr, flush=True)
    elif _PRESSES.count == 1 and _PRESSES.attached:
        print("\nrllib: Ctrl-C: each running trial stops after its current iteration, with a checkpoint. "
              "Ctrl-C again stops now (--resume then continues from the last periodic checkpoint).",
              file=sys.stderr, flush=True)
    else:
        print("\nrllib: Ctrl-C: stopping now.", file=sys.stderr, flush=True)
        _stop_tune(frame)


def _stop_tune(frame) -> None:
    """Tune's own stop (its SIGUSR1 handler, installed while ``fit`` runs): the experiment state
    is saved and the running trials are stopped unfinished."""
    _PRESSES.stopped = True
    handler = signal.getsignal(signal.SIGUSR1)
    if not callable(handler):  # Tune's loop is not running
        raise KeyboardInterrupt
    handler(signal.SIGUSR1, frame)


class GracefulInterrupt(tune.Callback):
    """The Tune side of the first Ctrl-C (module docstring): asks each running trial's next
    result for a checkpoint and stops Tune once every trial that was running has saved."""

    def setup(self, **info) -> None:
        _PRESSES.attached = True

    def on_trial_result(self, iteration: int, trials: list, trial, result: dict, **info) -> None:
        if _PRESSES.count and not _PRESSES.stopped:
            result[SHOULD_CHECKPOINT] = True

    def on_checkpoint(self, iteration: int, trials: list, trial, checkpoint, **info) -> None:
        if _PRESSES.count:
            _PRESSES.saved.add(trial.trial_id)

    def on_step_end(self, iteration: int, trials: list, **info) -> None:
        if not _PRESSES.count or _PRESSES.stopped:
            return
        running = {t.trial_id for t in trials if t.status == "RUNNING"}
        if _PRESSES.waiting is None:
            _PRESSES.waiting = running
        if not (_PRESSES.waiting & running) - _PRESSES.saved:
            _stop_tune(None)
