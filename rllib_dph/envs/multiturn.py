"""Multi-turn verifier envs: the policy may call a tool before it gives its final answer.

The episode contract is the one of ``rllib_dph.envs.base`` (Gymnasium ``reset`` / ``step`` with text
actions and observations); :class:`MultiTurnEnv` adds turns to any :class:`~rllib_dph.envs.base.VerifierEnv`:

- a policy turn that holds a tool call (:meth:`MultiTurnEnv.tool_call` finds it) runs the tool
  (:meth:`MultiTurnEnv.run_tool`), and the tool's reply, cut to ``max_observation_chars``, is the
  observation; the episode goes on;
- a turn without a tool call is the final answer: the env's verifier scores it exactly as the
  single-turn env scores a completion (an answer in the wrong format gets the verifier's reward,
  usually 0, and its reason in ``info["error"]``), and the episode terminates;
- a tool call in turn ``max_turns`` truncates the episode: reward 0, ``info["error"]`` says why.

Per-turn shaping (off by default): every tool turn earns ``tool_reward`` (negative: a cost per
call), added to the episode's reward; with the default 0.0 the episode's reward is the
verifier's alone. A tool that raises never ends the rollout: its error message is the observation.
The tool of :class:`FunctionMultiTurnEnv` runs in the verifier isolation (``rllib_dph.envs.isolation``)
under the verifier's limits; one that times out or crashes gives the reason as the observation.

:class:`FunctionMultiTurnEnv` is the env that ``rllib_dph.envs.register_multiturn_env`` builds from a tool
function, a verifier and a prompt format.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Mapping, Sequence

from gymnasium import spaces

from rllib_dph.envs import isolation
from rllib_dph.envs.arguments import check_real
from rllib_dph.envs.base import Task, Verdict
from rllib_dph.envs.registry import FunctionVerifierEnv

logger = logging.getLogger(__name__)

#: The observation when the episode is over (Gymnasium still wants one).
EPISODE_OVER = ""


def truncate_text(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters, with a note of how many were cut."""
    if len(text) <= max_chars:
        return text
    note = f"\n... ({len(text) - max_chars} more characters)"
    return text[:max_chars] + note


def tag_content(tag: str) -> Callable[[str], str | None]:
    """A tool-call finder: the content of the last complete ``<tag>...</tag>`` block of a turn
    (the last closing tag and the last opening tag before it), or None. Linear time: a turn of
    many unclosed ``<tag>`` costs one pass, where a non-greedy regex would rescan the rest of the
    turn from each of them."""
    opening, closing = f"<{tag}>", f"</{tag}>"

    def find(text: str) -> str | None:
        end = text.rfind(closing)
        start = text.rfind(opening, 0, end) if end >= 0 else -1
        return None if start < 0 else text[start + len(opening):end].strip()

    return find


class MultiTurnEnv:
    """Mixin that gives a :class:`~rllib_dph.envs.base.VerifierEnv` subclass turns (module docstring).

    Put it before the env class (``class MyEnv(MultiTurnEnv, SQLEnv)``), call
    :meth:`setup_turns` in ``__init__`` after the env's own ``__init__``, and define
    :meth:`tool_call` and :meth:`run_tool`.

    ## Episode End
    Terminated by a turn without a tool call (the final answer); truncated by a tool call in turn
    ``max_turns``, or by the rollout at ``max_episode_tokens``. A ``step`` after the end is
    refused (RuntimeError) until the next ``reset``.

    ## Info
    As the env's, plus ``turn`` (1-based) and ``tool_calls`` (tool calls run so far) at every step.
    """

    def setup_turns(
        self,
        *,
        max_turns: int = 4,
        max_episode_tokens: int | None = None,
        max_observation_chars: int = 1000,
        tool_reward: float = 0.0,
    ) -> None:
        """Sets the turn budget, observation budget and shaping; raises ValueError on bad values.

        Args:
            max_turns: Most policy turns per episode, >= 1.
            max_episode_tokens: Most response tokens per episode (policy turns and observations),
                enforced by the rollout; None: no limit beyond the engine's per-turn limit.
            max_observation_chars: Longest observation, >= 1; longer tool replies are cut.
            tool_reward: Reward of every tool turn (per-turn shaping; 0.0: off), a finite number
                in [-1e6, 1e6] (an ArgumentError otherwise: a NaN would reach training).
        """
        rules = [
            (max_turns >= 1, f"max_turns={max_turns} must be >= 1"),
            (max_episode_tokens is None or max_episode_tokens >= 1,
             f"max_episode_tokens={max_episode_tokens} must be >= 1, or None for no limit"),
            (max_observation_chars >= 1, f"max_observation_chars={max_observation_chars} must be >= 1"),
        ]
        for ok, message in rules:
            if not ok:
                raise ValueError(f"{self.name}: {message}.")
        self.max_turns = int(max_turns)
        self.max_episode_tokens = max_episode_tokens
        self.max_observation_chars = int(max_observation_chars)
        self.tool_reward = check_real(tool_reward, "tool_reward", low=-1e6, high=1e6, where=self.name, default=0.0)
        longest = max(self.observation_space.max_length, self.max_observation_chars + 40)
        self.observation_space = spaces.Text(max_length=longest, charset=self.observation_space.character_set)
        self._turn = 0
        self._tool_calls = 0

    def tool_call(self, text: str) -> str | None:
        """The tool call of a policy turn (what :meth:`run_tool` gets), or None: the final answer."""
        raise NotImplementedError

    def run_tool(self, call: str, task: Task) -> str:
        """The tool's reply to ``call`` on ``task``: the observation text before truncation."""
        raise NotImplementedError

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self._turn = 0
        self._tool_calls = 0
        return super().reset(seed=seed, options=options)

    def step(self, action: str):
        self._check_step()
        self._turn += 1
        call = self.tool_call(str(action))
        if call is None:  # the final answer: the single-turn env's step scores it
            obs, reward, _, _, info = super().step(action)
            return obs, reward, True, False, self._with_turns(info)
        info = self._with_turns(self._info(self._index))
        if self._turn >= self.max_turns:
            info["correct"] = False
            info["error"] = f"max_turns={self.max_turns} reached without a final answer"
            self._done = True
            return EPISODE_OVER, 0.0, False, True, info
        self._tool_calls += 1
        info["tool_calls"] = self._tool_calls
        return self._observe(call), self.tool_reward, False, False, info

    def _observe(self, call: str) -> str:
        """The tool's reply, cut to the observation budget; a tool error, or its failure in the
        isolation, is the reply itself."""
        try:
            reply = str(self.run_tool(call, self.tasks[self._index]))
        except isolation.IsolationFailure as failure:
            reply = f"error: {failure.reason}"
        except Exception as e:  # bad model output never ends the rollout
            logger.debug("%s: tool raised on %r", self.name, call[:80], exc_info=True)
            reply = f"error: {isolation.exception_name(e)}: {e}"
        return truncate_text(reply, self.max_observation_chars)

    def _with_turns(self, info: dict) -> dict:
        info["turn"], info["tool_calls"] = self._turn, self._tool_calls
        return info


class FunctionMultiTurnEnv(MultiTurnEnv, FunctionVerifierEnv):
    """A multi-turn env around a tool function and a verifier (made by ``register_multiturn_env``).

    ## Description
    Each episode is one row of the data set, prompted with the prompt format. A policy turn with a
    tool call (by default a ``<tool>...</tool>`` block) gets ``tool(call, ground_truth)`` back; a
    turn without one is scored by ``verifier(turn, ground_truth, **defaults)``.

    ## Action Space
    ``spaces.Text`` over printable characters: one policy turn.

    ## Observation Space
    ``spaces.Text``: the prompt, then each tool reply (cut to ``max_observation_chars``).

    ## Rewards
    The verifier's reward on the final answer (as ``FunctionVerifierEnv``), 0 for a truncated
    episode, plus ``tool_reward`` at every tool call (shaping, 0.0 by default).

    ## Starting State
    A row drawn uniformly with ``self.np_random``, or the one given by ``options={"index": i}``.

    ## Episode End
    See :class:`MultiTurnEnv`.

    ## Info
    ``task_id``, ``data_source``, ``index``, ``messages``, ``turn``, ``tool_calls``; at the end
    also ``correct`` and, when the answer could not be checked or never came, ``error``.

    ## Arguments
    See ``rllib_dph.envs.registry.register_multiturn_env``; extra keyword arguments go to the verifier.
    """

    def __init__(
        self,
        data: str | Sequence[Task | Mapping[str, Any]],
        *,
        tool: Callable[[str, Any], Any],
        verifier: Callable[..., float | bool | Verdict],
        tool_call: str | Callable[[str], str | None] = "tool",
        max_turns: int = 4,
        max_episode_tokens: int | None = None,
        max_observation_chars: int = 1000,
        tool_reward: float = 0.0,
        **kwargs: Any,
    ):
        super().__init__(data, verifier=verifier, **kwargs)
        self.tool_fn = tool
        self.find_call = tag_content(tool_call) if isinstance(tool_call, str) else tool_call
        self.setup_turns(
            max_turns=max_turns,
            max_episode_tokens=max_episode_tokens,
            max_observation_chars=max_observation_chars,
            tool_reward=tool_reward,
        )

    def tool_call(self, text: str) -> str | None:
        return self.find_call(text)

    def run_tool(self, call: str, task: Task) -> str:
        """``tool(call, ground_truth)`` in the verifier isolation, under the verifier's limits."""
        limits = None if self.limits is None else dataclasses.replace(self.limits, label="tool")
        return str(isolation.run(self.tool_fn, call, task.ground_truth, limits=limits))
