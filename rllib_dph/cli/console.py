"""A readable console for ``rllib train``: one line per training iteration.

Without ``--verbose`` Tune prints nothing of its own (no status table, no dump of the config's
settings); :class:`IterationPrinter` prints, per result::

    iter    3  reward 0.412  acc 0.398  pass@8 0.610  policy_loss -0.0123  1534 tok/s  4.6 s

(``pass@k``: the largest k of the validation split, only on iterations that measured it.)
"""

from __future__ import annotations

import logging
import re
from typing import Any, Mapping, Optional

from ray import tune

#: Loggers whose start-up chatter (new-API-stack notices, deprecations) the quiet console hides.
CHATTY_LOGGERS = ("ray.rllib", "ray.tune", "ray.train", "ray.data")
_PASS_AT = re.compile(r"pass@(\d+)")


def _number(value: Any, spec: str) -> Optional[str]:
    """``value`` formatted with ``spec``, or None when it is not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return format(value, spec)


def best_pass_at_k(evaluation: Mapping[str, Any]) -> Optional[tuple[str, float]]:
    """The ``pass@k`` entry of ``evaluation`` with the largest k, or None."""
    found = [(int(m.group(1)), key) for key in evaluation if (m := _PASS_AT.fullmatch(key))]
    if not found:
        return None
    _, key = max(found)
    return key, evaluation[key]


def iteration_line(result: Mapping[str, Any], module_id: str = "default_policy") -> str:
    """One console line for a Tune result of GRPO / DPH (missing metrics are left out).

    Args:
        result: The result dict of one training iteration.
        module_id: The RL module whose learner metrics are shown.
    """
    runners = result.get("env_runners") or {}
    learner = (result.get("learners") or {}).get(module_id) or {}
    fields = [
        ("reward", runners.get("reward_mean", runners.get("episode_return_mean")), ".3f"),
        ("acc", runners.get("accuracy"), ".3f"),
    ]
    best = best_pass_at_k(result.get("evaluation") or {})
    if best is not None:
        fields.append(best + (".3f",))
    fields.append(("policy_loss", learner.get("policy_loss"), ".4g"))
    parts = [f"iter {result.get('training_iteration', '?'):>4}"]
    parts += [f"{name} {text}" for name, value, spec in fields if (text := _number(value, spec))]
    tokens = _number(runners.get("generation_tokens_per_s"), ".0f")
    if tokens is not None:
        parts.append(f"{tokens} tok/s")
    seconds = _number(result.get("time_this_iter_s"), ".1f")
    if seconds is not None:
        parts.append(f"{seconds} s")
    return "  ".join(parts)


class IterationPrinter(tune.Callback):
    """Prints :func:`iteration_line` for every result; prefixes the trial id when there are several."""

    def on_trial_result(self, iteration: int, trials: list, trial, result: dict, **info) -> None:
        prefix = f"{trial.trial_id}  " if len(trials) > 1 else ""
        print(prefix + iteration_line(result), flush=True)

    def on_trial_error(self, iteration: int, trials: list, trial, **info) -> None:
        print(f"trial {trial.trial_id} failed; its error follows at the end.", flush=True)


def quiet_logging() -> None:
    """Hides Ray's log records in this process: start-up chatter, and trial errors, which
    ``rllib train`` reports once at the end (see :func:`error_summary`)."""
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def error_summary(error: BaseException) -> str:
    """The first line of the exception a trial's error ends with (``RuntimeError: boom``), without
    Ray's wrapping tracebacks: the line after the traceback's last frame, so an error whose
    message spans lines (a dead learner's: its name, index and pid, then its worker log and what
    to do) is summed up by the line that names it; without a traceback, the last line."""
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    frames = [i for i, line in enumerate(lines) if line.lstrip().startswith('File "')]
    if frames:
        after = [line for line in lines[frames[-1] + 1 :] if not line[:1].isspace()]  # past the frame's source line
        if after:
            return after[0].strip()
    return lines[-1].strip() if lines else type(error).__name__
