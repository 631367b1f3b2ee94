"""The math verifier (:func:`verify_math`) and the environment ``rllib_dph/Math-v0`` (:class:`MathEnv`).

The final answer (:mod:`~rllib_dph.envs.math.extract`) is compared with the gold one
(:mod:`~rllib_dph.envs.math.compare`), by Math-Verify where the fast path cannot decide. Math-Verify
runs in the one verifier isolation (``rllib_dph.envs.isolation``), under :func:`math_limits`:

Time limits count the checker's own **CPU time**, so that a correct answer is not scored 0
because the machine is busy: an interval timer interrupts a check once it has used
``timeout_s`` CPU seconds. A check stuck in C code (``9^{9^{9^9}}`` computes a huge integer)
cannot be interrupted: the isolation, which reads the checker's CPU time, kills it once it has
used ``CHECKER_KILL_GRACE_S`` more. A checker silent for ``CHECKER_WALL_FACTOR * timeout_s``
wall seconds without having used its CPU budget (starved, or stopped) is killed too, and the
pair is checked once more on a fresh checker. Neither waiting for a checker nor its start-up
and the loading of Math-Verify (:func:`start_checker`) is charged to ``timeout_s``. So a check
never hangs, from any thread or Ray actor, whatever the input (huge exponents, deep nesting,
malformed LaTeX). A check may add :data:`CHECKER_MEMORY_BYTES` to its checker's memory.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from typing import Any, Mapping, Sequence

from rllib_dph.envs import isolation
from rllib_dph.envs.arguments import check_timeout
from rllib_dph.envs.base import Task, Verdict, VerifierEnv
from rllib_dph.envs.data import load_tasks
from rllib_dph.envs.isolation import CHECKER_KILL_GRACE_S, CheckerPoolTimeout, Limits
from rllib_dph.envs.math.compare import _fast_equal, _gold_text, load_math_verify, math_verify_equal
from rllib_dph.envs.math.extract import extract_answer
from rllib_dph.envs.suites import task_style

logger = logging.getLogger(__name__)

#: Default CPU-time limit of one answer check, in seconds.
DEFAULT_TIMEOUT_S = 5.0
#: A check silent for ``CHECKER_WALL_FACTOR * timeout_s`` (+ CHECKER_KILL_GRACE_S) wall seconds
#: without having used its CPU budget (starved by a busy machine, or stopped) is made again on a
#: fresh checker.
CHECKER_WALL_FACTOR = 10.0
#: Address space a check may add to its checker (pathological inputs could otherwise eat all
#: memory).
CHECKER_MEMORY_BYTES = 1 << 30


def math_limits(timeout_s: float) -> Limits:
    """The isolation limits of a math check of ``timeout_s`` CPU seconds (module docstring)."""
    return Limits(cpu_s=timeout_s, wall_s=CHECKER_WALL_FACTOR * timeout_s, grace_s=CHECKER_KILL_GRACE_S,
                  memory_bytes=CHECKER_MEMORY_BYTES, setting="timeout_s", label="math check",
                  prepare=load_math_verify)


def start_checker() -> None:
    """Starts a checker now, with Math-Verify loaded and warmed up, and waits until it is ready
    (about a second of CPU).

    Optional: the first check that needs Math-Verify does it otherwise (not counted in its
    ``timeout_s``). Useful before timing checks, or to pay the start-up before training starts.

    Raises:
        RuntimeError: The checker could not start (e.g. ``math-verify`` is not installed).
    """
    isolation.start_checker(prepare=load_math_verify)


def verify_math(
    completion: str, gold_answer: Any, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Verdict:
    """Checks the final answer of a completion against the gold answer.

    Args:
        completion: The model's full answer text.
        gold_answer: The gold answer (LaTeX or plain text; a number is accepted; a ``\\boxed{}``
            gold is unboxed).
        timeout_s: Most CPU time Math-Verify may spend on this pair, > 0. A check that runs
            longer is abandoned (reward 0, ``error`` says so). Time spent waiting for a free
            checker or for a busy CPU, and the start of a checker subprocess (about half a
            second), are not counted.

    Returns:
        ``Verdict(1.0, True)`` when the answers are equivalent, else reward 0.0 with ``error`` set
        when no answer was found or the check failed.

    Raises:
        ArgumentError: ``timeout_s`` is not a number of seconds in [MIN_TIMEOUT_S,
            MAX_TIMEOUT_S] of ``rllib_dph.envs.arguments`` (a caller error, raised before any check).
            Nothing about the completion or the gold answer ever raises.
        CheckerPoolTimeout: No checker was free within the pool's ``wait_s``
            (:func:`set_checker_pool`): a stuck pool, not the completion.
    """
    timeout_s = check_timeout(timeout_s, where="verify_math", default=DEFAULT_TIMEOUT_S)
    try:
        if not isinstance(completion, str):
            return Verdict(0.0, False, f"completion is a {type(completion).__name__}, not a str")
        try:
            gold = _gold_text(gold_answer)
        except ValueError as error:  # None, NaN: scored 0, never equal to the text "None"
            return Verdict(0.0, False, str(error))
        if not gold:
            return Verdict(0.0, False, "the gold answer is empty")
        pred = extract_answer(completion)
        if pred is None:
            return Verdict(0.0, False, "no answer found: no \\boxed{...} and no 'the answer is'")
        equal = _fast_equal(gold, pred)
        error = None
        if equal is None:
            equal, error = isolation.run(math_verify_equal, gold, pred, limits=math_limits(timeout_s))
        return Verdict(1.0 if equal else 0.0, equal, error)
    except CheckerPoolTimeout:  # a stuck pool, not the completion: the run must see it
        raise
    except isolation.IsolationFailure as failure:
        return Verdict(0.0, False, failure.reason)
    except Exception as e:  # the training loop must never see a verifier exception
        logger.warning("verify_math failed", exc_info=True)
        return Verdict(0.0, False, f"math check failed: {type(e).__name__}: {e}")


def math_reward(
    completion: str, gold_answer: Any, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> float:
    """1.0 when the completion's final answer equals ``gold_answer``, else 0.0.

    See :func:`verify_math` for the arguments and the rules.
    """
    return verify_math(completion, gold_answer, timeout_s=timeout_s).reward


class MathEnv(VerifierEnv):
    """Math word problems with a verifiable final answer (``rllib_dph/Math-v0``).

    ## Description
    Each episode is one problem; the model answers with its reasoning and puts the final answer in
    ``\\boxed{}``. The answer is checked against the gold answer with Math-Verify.

    ## Action Space
    ``spaces.Text`` over printable characters: the model's complete answer.

    ## Observation Space
    ``spaces.Text``: the prompt text (chat message contents joined by blank lines).

    ## Rewards
    1.0 when the last ``\\boxed{}`` (fallback: "the answer is X") equals the gold answer, else 0.0.

    ## Starting State
    A problem drawn uniformly with ``self.np_random``, or the one given by ``options={"index": i}``.

    ## Episode End
    Always terminated after one step; never truncated.

    ## Info
    ``task_id``, ``data_source``, ``index``, ``messages``; after ``step`` also ``correct`` and, when
    no answer was found or the check failed or timed out, ``error``.

    ## Arguments
    ``data``: a bundled split name (default ``"math_synth/train"``), a ``.parquet`` / ``.jsonl``
    file in the verl layout (answer in ``reward_model.ground_truth``), or a list of tasks / rows.
    ``timeout_s``: CPU-time limit of one answer check in seconds (waiting for a busy CPU or for
    a free checker subprocess is not counted; see :func:`verify_math`), in [0.01, 3600].
    """

    def __init__(
        self,
        data: str | os.PathLike | Sequence[Task | Mapping[str, Any]] = "math_synth/train",
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ):
        self.timeout_s = check_timeout(timeout_s, where="MathEnv", default=DEFAULT_TIMEOUT_S)
        super().__init__(load_tasks(data, task="math"), functools.partial(verify_math, timeout_s=self.timeout_s),
                         name="rllib_dph/Math-v0", limits=math_limits(self.timeout_s))

    @classmethod
    def from_tasks(cls, tasks: Sequence[Task], **kwargs) -> "MathEnv":
        """Builds the env on already-loaded tasks (``ground_truth`` = the gold answer)."""
        return cls(list(tasks), **kwargs)

    def answer_key(self, index: int, completion: str) -> str | None:
        """The extracted final answer without whitespace; None when there is none.

        Equal values written differently (``0.5``, ``\\frac{1}{2}``) are different keys.

        Args:
            index: The task's index in :attr:`tasks`.
            completion: The completion text.
        """
        answer = extract_answer(completion)
        return None if answer is None else re.sub(r"\s+", "", answer)

    def solution_style(self, index: int, completion: str, suite: str | None = None) -> str | None:
        """The math style (``rllib_dph.envs.suites.style_of``) when the task's suite has styles, else None."""
        return task_style(self.tasks[index].data_source, completion, suite)
