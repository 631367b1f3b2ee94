"""Verifier text environments: the episode contract, and its one-turn case.

A *task* is one prompt with the ground truth needed to check an answer. A
:class:`VerifierEnv` serves a list of tasks one episode at a time: ``reset`` shows
the prompt, ``step`` takes the model's turn. Groups of episodes for the same prompt
are run by resetting to the same task with ``options={"index": i}``.

The episode contract (Gymnasium API, text actions and text observations), the same for
single- and multi-turn envs:

- ``reset(options={"index": i}) -> (prompt_text, info)``;
- ``step(text) -> (observation, reward, terminated, truncated, info)``: ``text`` is one policy
  turn; while neither flag is set, ``observation`` is the env's reply (e.g. a tool's result),
  which the rollout appends as a chat message of role :attr:`VerifierEnv.observation_role`
  before the next turn. ``terminated``: the policy gave its final answer (scored by the
  verifier); ``truncated``: the episode hit :attr:`VerifierEnv.max_turns`. The episode's
  reward is the sum of its step rewards; the final step's ``info`` has ``correct`` and, when
  the episode ended without a checked answer, ``error`` (the reason).
- :attr:`VerifierEnv.max_episode_tokens`: the rollout ends (truncates) an episode whose
  response tokens (policy turns and observations) would pass it; None: no limit beyond
  the engine's ``max_new_tokens`` per turn.

A :class:`VerifierEnv` is the one-turn case: ``step`` scores the whole completion and always
terminates (``rllib_dph.envs.multiturn.MultiTurnEnv`` adds turns). The rollout runs concurrent episodes on
shallow copies of one env (``copy.copy``), so an env keeps its per-episode state in attributes
that ``reset`` assigns, never in objects it mutates in place.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import numbers
import string
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rllib_dph.envs import isolation
from rllib_dph.envs.arguments import ArgumentError
from rllib_dph.envs.isolation import Limits

logger = logging.getLogger(__name__)

#: Characters every env accepts: all printable ASCII. Data-specific characters are added per env.
BASE_CHARSET = frozenset(string.printable)
#: Longest completion the action space describes (``step`` accepts any string regardless).
MAX_COMPLETION_CHARS = 16384
#: Default wall-clock limit of one verifier call (``verifier_timeout_s``), in seconds: twice the
#: SQL verifier's default, so a slow but working verifier is not cut off.
DEFAULT_VERIFIER_TIMEOUT_S = 30.0
#: The isolation limits of a verifier unless its env sets others (:attr:`VerifierEnv.limits`).
DEFAULT_LIMITS = Limits(wall_s=DEFAULT_VERIFIER_TIMEOUT_S, setting="verifier_timeout_s")


@dataclass(frozen=True)
class Task:
    """One prompt of a verifier task.

    Attributes:
        id: Unique id of the task within its data set.
        data_source: Name of the data set / domain the task comes from (e.g. ``"sql_synth"``).
        messages: The prompt as chat messages ``({"role": ..., "content": ...}, ...)``. The model
            side applies its chat template to them.
        ground_truth: Whatever the verifier needs (a gold answer string, a dict with the gold SQL
            and database path, ...).
        meta: Free-form extra fields (e.g. the solution style of a reference answer, the split).
    """

    id: str
    data_source: str
    messages: tuple[Mapping[str, str], ...]
    ground_truth: Any
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def prompt_text(self) -> str:
        """The observation text: message contents joined by blank lines."""
        return "\n\n".join(m["content"] for m in self.messages)

    def content_json(self) -> str:
        """What the task is, as JSON: its id, messages and ground truth (a SQL task's ``db_path``
        left out: it is where this machine keeps the file, not what the task asks)."""
        truth = self.ground_truth
        if isinstance(truth, Mapping):
            truth = {k: v for k, v in truth.items() if k != "db_path"}
        return json.dumps([self.id, list(self.messages), truth], sort_keys=True, default=str)

    @property
    def fingerprint(self) -> str:
        """16 hex characters of sha256 over :meth:`content_json`: equal for the same question, so
        results stored under a task id can be checked against the data as it is now."""
        return hashlib.sha256(self.content_json().encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying one completion.

    Attributes:
        reward: Scalar reward, usually 1.0 (correct) or 0.0.
        correct: Whether the completion solves the task.
        error: Short reason when the completion could not be checked (no answer found, SQL error,
            timeout, ...). ``None`` when verification ran normally.
    """

    reward: float
    correct: bool
    error: str | None = None


#: The one verifier signature, of the bundled envs and of yours (``register_verifier_env``):
#: ``verifier(completion, ground_truth) -> Verdict | bool | float`` (read by :func:`as_verdict`);
#: ``ground_truth`` is the task's :attr:`Task.ground_truth`.
Verifier = Callable[[str, Any], "Verdict | bool | float"]


def _check_unique_ids(tasks: Sequence[Task], name: str) -> None:
    """Raises ValueError naming the first two tasks that share an id."""
    seen: dict[str, int] = {}
    for i, task in enumerate(tasks):
        first = seen.setdefault(task.id, i)
        if first != i:
            raise ValueError(
                f"{name}: tasks {first} and {i} share the id {task.id!r}; task ids must be unique "
                "(results, pre-sampled rows and evaluations are stored by id): give each task its own."
            )


def as_verdict(result: Any, env_id: str) -> Verdict:
    """Turns a verifier's return value (Verdict, bool or number) into a :class:`Verdict` whose
    reward is a finite float, ``correct`` a bool and ``error`` a str or None.

    A NaN or infinite reward (returned, or in a Verdict) never reaches training: it becomes
    reward 0, not correct, with the reason in ``error``.

    Raises:
        TypeError: The verifier returned something else, or a Verdict whose reward is not a real
            number (a bug of the verifier, not a property of the completion).
    """
    if isinstance(result, Verdict):
        reward, correct, error = result.reward, result.correct, result.error
    elif isinstance(result, (bool, np.bool_)):
        reward, correct, error = (1.0 if result else 0.0), bool(result), None
    elif isinstance(result, numbers.Real):
        reward, correct, error = result, None, None
    else:
        raise TypeError(
            f"{env_id}: the verifier returned a {type(result).__name__} ({result!r:.80}); "
            "return a float reward, a bool or an rllib_dph.envs.base.Verdict."
        )
    if isinstance(reward, (bool, np.bool_)) or not isinstance(reward, numbers.Real):
        raise TypeError(
            f"{env_id}: the verifier's Verdict has reward={reward!r:.80} (a {type(reward).__name__}); "
            "a reward is a real number, e.g. Verdict(1.0, True)."
        )
    reward = float(reward)
    if not math.isfinite(reward):
        return Verdict(0.0, False, f"the verifier returned a non-finite reward ({reward!r}); scored 0")
    correct = reward >= 1.0 if correct is None else bool(correct)
    return Verdict(reward, correct, None if error is None else str(error))


class VerifierEnv(gym.Env):
    """Single-turn text environment with a verifiable reward.

    ## Description
    Each episode is one task: the observation is the prompt text, the action is the model's
    complete answer, and the episode ends after that one step with the verifier's reward.

    ## Action Space
    ``spaces.Text`` over printable characters; ``step`` accepts any ``str``.

    ## Observation Space
    ``spaces.Text`` whose charset is printable ASCII plus every character found in the prompts.

    ## Rewards
    Whatever the verifier returns (typically 1.0 for a correct answer, else 0.0); 0 when it
    raised, timed out, crashed or returned a NaN or infinite reward (:meth:`score`).

    ## Starting State
    A task drawn uniformly with ``self.np_random``, or the one chosen by ``options={"index": i}``.

    ## Episode End
    Always terminated after one step; never truncated. A ``step`` after the end is refused
    (RuntimeError) until the next ``reset``.

    ## Info
    ``reset``: ``task_id``, ``data_source``, ``index``, ``messages``.
    ``step``: the same plus ``correct`` (bool) and, when something went wrong, ``error`` (str).

    ## Isolation
    The verifier runs in the one verifier isolation (``rllib_dph.envs.isolation``) under
    :attr:`limits` (default :data:`DEFAULT_LIMITS`: a wall clock of
    :data:`DEFAULT_VERIFIER_TIMEOUT_S`, a memory cap); ``limits=None`` runs it in the step's own
    thread without limits.
    """

    metadata = {"render_modes": []}
    #: Most policy turns per episode (the contract of the module docstring): 1, single-turn.
    max_turns: int = 1
    #: Most response tokens per episode (policy turns and observations); None: no limit.
    max_episode_tokens: int | None = None
    #: Chat role of the env's observation messages between turns.
    observation_role: str = "user"

    def __init__(self, tasks: Sequence[Task], verifier: Verifier, *, name: str = "verifier",
                 limits: Limits | None = DEFAULT_LIMITS):
        if len(tasks) == 0:
            raise ValueError(f"{name}: the task list is empty; give at least one task.")
        self.tasks = list(tasks)
        _check_unique_ids(self.tasks, name)
        self.verifier = verifier
        self.name = name
        #: The isolation limits of every verifier call (None: in the step's thread, no limits).
        self.limits = limits
        charset = set(BASE_CHARSET)
        longest = 1
        for t in self.tasks:
            text = t.prompt_text
            charset.update(text)
            longest = max(longest, len(text))
        self.observation_space = spaces.Text(max_length=longest, charset="".join(sorted(charset)))
        self.action_space = spaces.Text(
            max_length=MAX_COMPLETION_CHARS, min_length=0, charset="".join(sorted(BASE_CHARSET))
        )
        self._index: int | None = None
        self._done = False
        self._warned = False

    def __len__(self) -> int:
        return len(self.tasks)

    def _info(self, index: int) -> dict[str, Any]:
        task = self.tasks[index]
        return {
            "task_id": task.id,
            "data_source": task.data_source,
            "index": index,
            "messages": [dict(m) for m in task.messages],
        }

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        if "index" in options:
            index = int(options["index"])
            if not 0 <= index < len(self.tasks):
                raise IndexError(
                    f"{self.name}: options['index']={index} is out of range; "
                    f"this env has {len(self.tasks)} tasks (0..{len(self.tasks) - 1})."
                )
        else:
            index = int(self.np_random.integers(len(self.tasks)))
        self._index = index
        self._done = False
        return self.tasks[index].prompt_text, self._info(index)

    def _check_step(self) -> None:
        """Refuses a ``step`` before ``reset`` or after the episode's end."""
        if self._index is None:
            raise RuntimeError(f"{self.name}: call reset() before step().")
        if self._done:
            raise RuntimeError(f"{self.name}: step() after the episode ended (terminated or truncated); "
                               "call reset() to start the next episode.")

    def step(self, action: str):
        self._check_step()
        task = self.tasks[self._index]
        verdict = self.score(str(action), task.ground_truth)
        self._done = True
        info = self._info(self._index)
        info["correct"] = verdict.correct
        if verdict.error is not None:
            info["error"] = verdict.error
        return task.prompt_text, verdict.reward, True, False, info

    def score(self, completion: str, ground_truth: Any) -> Verdict:
        """The verifier's verdict on ``completion``, run in the isolation under :attr:`limits`.

        A verifier that raises, calls ``sys.exit``, crashes or runs past a limit gives reward 0
        with the reason in ``error`` (the first such failure of the env is logged with the task);
        a NaN or infinite reward gives 0 too (:func:`as_verdict`). Raised instead: an
        :class:`~rllib_dph.envs.arguments.ArgumentError` (a setting such as ``timeout_s=inf``
        that would score every step 0), :class:`~rllib_dph.envs.isolation.IsolationSetupError`
        (a verifier that cannot be sent to a checker), :class:`~rllib_dph.envs.isolation.CheckerPoolTimeout`
        and a return value of the wrong type.
        """
        try:
            result = isolation.run(self.verifier, completion, ground_truth, limits=self.limits)
        except (ArgumentError, isolation.IsolationSetupError, isolation.CheckerPoolTimeout):
            raise
        except isolation.IsolationFailure as failure:
            return self._failed(failure.reason, None)
        except Exception as error:
            return self._failed(f"verifier raised {isolation.exception_name(error)}: {error}", error)
        return as_verdict(result, self.name)

    def _failed(self, reason: str, error: Exception | None) -> Verdict:
        """Reward 0 with ``reason``; the env's first failure is logged in full."""
        if not self._warned:
            task_id = self.tasks[self._index].id if self._index is not None else None
            logger.warning("%s: %s on task %s", self.name, reason, task_id, exc_info=error)
            self._warned = True
        return Verdict(0.0, False, reason)

    def answer_key(self, index: int, completion: str) -> str | None:
        """The majority-vote key of a completion: completions with equal keys give the same answer.

        This default compares whole texts: the stripped completion (None when empty). Envs that
        can extract an answer override it (SQL: the query's result rows; math: the final answer).

        Args:
            index: The task's index in :attr:`tasks`.
            completion: The completion text.
        """
        return completion.strip() or None

    def solution_style(self, index: int, completion: str, suite: str | None = None) -> str | None:
        """The name of the solution style of a completion, or None when this env names none.

        This default names none. Envs whose tasks come from a suite with style names
        (``rllib_dph.envs.suites.style_of``) override it.

        Args:
            index: The task's index in :attr:`tasks`.
            completion: The completion text.
            suite: Name the style with this suite's style function (one of
                ``rllib_dph.envs.suites.STYLE_SUITES``) instead of the task's ``data_source``.
        """
        return None

    def solution_key(self, index: int, completion: str) -> str | None:
        """The solution of a completion: completions with equal keys give the same solution
        (the evaluation's count of distinct correct solutions counts each key once).

        This default is the completion with every run of whitespace folded to one space (None
        when empty): differently worded texts are different solutions. Envs whose answer is a
        program override it (SQL: the query's code tokens).

        Args:
            index: The task's index in :attr:`tasks`.
            completion: The completion text.
        """
        return " ".join(completion.split()) or None
