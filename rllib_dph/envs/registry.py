"""One place to register verifier envs with Gymnasium and Ray Tune.

A new task is a verifier function, a data set and a prompt format::

    import gymnasium as gym
    import rllib_dph.envs

    words = ["ray", "rllib", "policy", "gradient"]
    rllib_dph.envs.register_verifier_env(
        "demo/Reverse-v0",
        verifier=lambda completion, answer: completion.strip() == answer,
        data=[{"question": w, "answer": w[::-1]} for w in words],
        prompt_format="Reverse the word: {question}",
    )
    env = gym.make("demo/Reverse-v0")      # or AlgorithmConfig().environment("demo/Reverse-v0")

Ids are versioned, ``namespace/Name-vN``. Every env registered here is a Gymnasium env at once and
a Ray Tune env name once :func:`register_tune_envs` has run: that is done at registration time
when ``ray.tune`` is already imported (importing RLlib does it), else call it yourself (it is
idempotent) before building an algorithm. Keeping Ray out of ``import envs`` keeps it fast.
The Tune creator builds the env class directly from its entry point (no gymnasium wrappers), so it
also works in Ray workers where the registration code never ran.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import logging
import re
import sys
from typing import Any, Callable, Mapping, Sequence

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

from rllib_dph.envs.arguments import check_timeout
from rllib_dph.envs.base import DEFAULT_VERIFIER_TIMEOUT_S, Task, Verdict, VerifierEnv
from rllib_dph.envs.isolation import Limits
from rllib_dph.envs.data.loaders import PromptFormat, check_prompt_format, load_tasks

logger = logging.getLogger(__name__)

_ENV_ID = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+?-v\d+")  # namespace/Name-vN

#: Ids registered through this module, in registration order (builtins first).
_REGISTERED: dict[str, None] = {}


def check_env_id(env_id: str) -> None:
    """Raises ValueError unless ``env_id`` looks like ``namespace/Name-vN``."""
    if not isinstance(env_id, str) or _ENV_ID.fullmatch(env_id) is None:
        raise ValueError(
            f"env id {env_id!r} is not versioned as 'namespace/Name-vN' (letters, digits, '_', "
            "'.', '-'); e.g. 'demo/Reverse-v0'. Bump the version when the task changes."
        )


def register(env_id: str, *, entry_point: str, kwargs: Mapping[str, Any] | None = None) -> None:
    """Registers an env class with Gymnasium (and with Ray Tune when ``ray.tune`` is imported).

    Registering an id again replaces the earlier registration silently.

    Args:
        env_id: Versioned id ``namespace/Name-vN``.
        entry_point: ``"module:Class"`` of the env, imported on first use.
        kwargs: Default constructor arguments; ``gym.make(env_id, **kw)`` and a Tune
            ``env_config`` override them.
    """
    check_env_id(env_id)
    gym.registry.pop(env_id, None)  # re-registration (module reload, notebook cell) is quiet
    gym.register(id=env_id, entry_point=entry_point, kwargs=dict(kwargs or {}))
    _REGISTERED[env_id] = None
    if "ray.tune.registry" in sys.modules:  # already imported (e.g. by RLlib): cheap
        _register_with_tune(env_id)


def register_verifier_env(
    env_id: str,
    *,
    verifier: Callable[..., float | bool | Verdict],
    data: str | Sequence[Task | Mapping[str, Any]],
    prompt_format: PromptFormat | None = None,
    ground_truth_field: str = "answer",
    system_prompt: str | None = None,
    verifier_timeout_s: float | None = DEFAULT_VERIFIER_TIMEOUT_S,
    **defaults: Any,
) -> None:
    """Registers a verifier task as a Gymnasium env and a Ray Tune env name (see module docstring).

    Args:
        env_id: Versioned id ``namespace/Name-vN``.
        verifier: ``verifier(completion, ground_truth, **defaults) -> float | bool | Verdict``.
            A bool becomes reward 1.0 / 0.0; a number is the reward and counts as correct when
            >= 1.0; return a :class:`Verdict` to set ``correct`` and ``error`` yourself. Should it
            raise, the step gets reward 0 and the exception in ``info["error"]``, except for an
            ``rllib_dph.envs.arguments.ArgumentError`` (a bad argument such as ``timeout_s=inf``, which
            would score every step 0): that one is raised. Pass a plain function (Gymnasium
            deep-copies kwargs and Ray pickles them).
        data: A ``.parquet`` / ``.jsonl`` path, a list of row dicts (or :class:`Task` objects), or
            a bundled suite split name (see :func:`rllib_dph.envs.data.load_tasks`).
        prompt_format: ``str.format`` template over a row's fields (``"Reverse: {question}"``) or
            a function ``row -> str | list of chat messages``. ``None``: the rows are in the verl
            layout (``prompt``, ``reward_model.ground_truth``, ``data_source``).
        ground_truth_field: The row field passed to the verifier as ``ground_truth`` (with a
            ``prompt_format``).
        system_prompt: Optional system message put before every prompt.
        verifier_timeout_s: Wall-clock limit of one verifier call in seconds, in [0.01, 3600]
            (None: no limit); a call past it scores 0 with the reason in ``info["error"]``. See
            :class:`FunctionVerifierEnv` (the verifier runs on a helper thread).
        **defaults: Keyword arguments of ``verifier``; ``gym.make(env_id, name=value)`` or a Tune
            ``env_config`` overrides them, like ``data``.

    Raises:
        ValueError / TypeError: A malformed id, a non-callable verifier, a bad prompt format or
            a ``verifier_timeout_s`` out of range.
    """
    check_env_id(env_id)
    _check_verifier_timeout(verifier_timeout_s, env_id)
    if not callable(verifier):
        raise TypeError(
            f"{env_id}: verifier must be a function (completion, ground_truth) -> float | bool | "
            f"Verdict; got a {type(verifier).__name__}."
        )
    if prompt_format is not None:
        check_prompt_format(prompt_format)
    kwargs = dict(data=data, verifier=verifier, prompt_format=prompt_format,
                  ground_truth_field=ground_truth_field, system_prompt=system_prompt,
                  verifier_timeout_s=verifier_timeout_s, name=env_id, **defaults)
    register(env_id, entry_point="rllib_dph.envs.registry:FunctionVerifierEnv", kwargs=kwargs)


def register_multiturn_env(
    env_id: str,
    *,
    tool: Callable[[str, Any], Any],
    verifier: Callable[..., float | bool | Verdict],
    data: str | Sequence[Task | Mapping[str, Any]],
    prompt_format: PromptFormat | None = None,
    tool_call: str | Callable[[str], str | None] = "tool",
    max_turns: int = 4,
    **kwargs: Any,
) -> None:
    """Registers a multi-turn verifier task: a tool, a verifier and a prompt format.

    A policy turn that holds a tool call gets the tool's reply as the next observation; a turn
    without one is the final answer, scored by the verifier (``rllib_dph.envs.multiturn``).

    Args:
        env_id: Versioned id ``namespace/Name-vN``.
        tool: ``tool(call, ground_truth) -> reply`` (its ``str`` is the observation, cut to
            ``max_observation_chars``); an exception becomes the observation ``error: ...``.
        verifier: As for :func:`register_verifier_env`, applied to the final turn.
        data: As for :func:`register_verifier_env`.
        prompt_format: As for :func:`register_verifier_env`; it should explain the protocol.
        tool_call: A tag name (the last ``<tag>...</tag>`` block is the call) or a function
            ``turn -> call or None`` (None: the turn is the final answer).
        max_turns: Most policy turns per episode, >= 1.
        **kwargs: ``max_episode_tokens``, ``max_observation_chars``, ``tool_reward``
            (``rllib_dph.envs.multiturn.MultiTurnEnv.setup_turns``) and the keyword arguments of
            :func:`register_verifier_env` (``ground_truth_field``, ``system_prompt``,
            ``verifier_timeout_s``, the verifier's own).
    """
    check_env_id(env_id)
    _check_verifier_timeout(kwargs.get("verifier_timeout_s"), env_id)
    for name, fn in (("tool", tool), ("verifier", verifier)):
        if not callable(fn):
            raise TypeError(f"{env_id}: {name} must be a function; got a {type(fn).__name__}.")
    if prompt_format is not None:
        check_prompt_format(prompt_format)
    defaults = dict(tool=tool, verifier=verifier, data=data, prompt_format=prompt_format,
                    tool_call=tool_call, max_turns=max_turns, name=env_id)
    register(env_id, entry_point="rllib_dph.envs.multiturn:FunctionMultiTurnEnv", kwargs={**defaults, **kwargs})


def registered_env_ids() -> list[str]:
    """Ids registered through this module (bundled envs first, then user envs)."""
    return list(_REGISTERED)


def register_tune_envs() -> list[str]:
    """Registers every env of :func:`registered_env_ids` with Ray Tune; returns their ids.

    Call it after registering envs in a process that imported ``envs`` before ``ray`` (it imports
    ``ray.tune``). Idempotent. Afterwards ``AlgorithmConfig().environment("<id>")`` resolves the
    id through ``ray.tune.registry``, in the driver and in every Ray worker.
    """
    for env_id in _REGISTERED:
        _register_with_tune(env_id)
    return list(_REGISTERED)


def make_env(env_id: Any, env_config: Mapping[str, Any]) -> gym.Env:
    """Creates the env named in ``config.environment(...)``: the one way to build an env.

    Args:
        env_id: An env class, a Ray Tune registered name, or a gymnasium id
            (``rllib_dph/SQL-v0``; importing ``rllib_dph.envs`` registers the bundled ones).
        env_config: The env's keyword arguments.
    """
    from ray.tune.registry import ENV_CREATOR, _global_registry

    if isinstance(env_id, type):
        return env_id(**env_config)
    if _global_registry.contains(ENV_CREATOR, env_id):
        return _global_registry.get(ENV_CREATOR, env_id)(env_config)
    return gym.make(env_id, **env_config).unwrapped


def _tune_creator(entry_point: str, kwargs: Mapping[str, Any], env_config: Mapping | None) -> gym.Env:
    """The Tune env creator of a registered id: builds ``entry_point(**kwargs, **env_config)``."""
    return load_env_creator(entry_point)(**{**kwargs, **dict(env_config or {})})


def _register_with_tune(env_id: str) -> None:
    from ray.tune.registry import register_env

    spec = gym.spec(env_id)
    register_env(env_id, functools.partial(_tune_creator, spec.entry_point, dict(spec.kwargs)))


def _check_verifier_timeout(value: Any, where: str) -> float | None:
    """``verifier_timeout_s`` as a float in [MIN_TIMEOUT_S, MAX_TIMEOUT_S] of
    ``rllib_dph.envs.arguments``, or None (no limit)."""
    if value is None:
        return None
    return check_timeout(value, where=where, default=DEFAULT_VERIFIER_TIMEOUT_S,
                         name="verifier_timeout_s")


def verifier_limits(verifier_timeout_s: float | None, where: str) -> Limits | None:
    """The isolation limits of a verifier with this ``verifier_timeout_s`` (checked): its wall
    clock, the default memory cap; None: no isolation (the step's own thread, no limits)."""
    timeout_s = _check_verifier_timeout(verifier_timeout_s, where)
    return None if timeout_s is None else Limits(wall_s=timeout_s, setting="verifier_timeout_s")


def check_keywords(fn: Callable, kwargs: Mapping[str, Any], where: str, *, takes: str,
                   positional: int = 2) -> None:
    """Raises TypeError when ``fn`` cannot take ``positional`` arguments plus ``kwargs``: a key
    it does not take, or an argument it needs that is missing (so that a misspelt ``env_config``
    key fails when the env is built, not at every step). A function without a readable
    signature is not checked."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*range(positional), **kwargs)
    except TypeError as error:
        names = [p for p in signature.parameters][positional:]
        unknown = [k for k in kwargs if k not in signature.parameters]
        hint = "".join(f"; did you mean {close[0]!r} for {k!r}?" for k in unknown
                       if (close := difflib.get_close_matches(k, names, n=1)))
        raise TypeError(
            f"{where}: {getattr(fn, '__qualname__', fn)}{signature} cannot take {takes} "
            f"{sorted(kwargs)} ({error}){hint}. Pass only the keyword arguments it takes ({names}) "
            "besides the env's own."
        ) from None


class FunctionVerifierEnv(VerifierEnv):
    """A verifier text env around a plain verifier function (made by :func:`register_verifier_env`).

    ## Description
    Each episode is one row of the data set: the prompt is built from the row with the prompt
    format, the completion is scored with ``verifier(completion, ground_truth, **defaults)``.

    ## Action Space
    ``spaces.Text`` over printable characters: the model's complete answer.

    ## Observation Space
    ``spaces.Text``: the prompt text (chat message contents joined by blank lines).

    ## Rewards
    The verifier's reward: a bool gives 1.0 / 0.0, a number is used as is, a Verdict's ``reward``;
    0 when the verifier raised, crashed, ran past ``verifier_timeout_s`` or returned a NaN or
    infinite reward.

    ## Starting State
    A row drawn uniformly with ``self.np_random``, or the one given by ``options={"index": i}``.

    ## Episode End
    Always terminated after one step; never truncated.

    ## Info
    ``task_id``, ``data_source``, ``index``, ``messages``; after ``step`` also ``correct`` and, when
    the verifier said so, raised or timed out, ``error``.

    ## Arguments
    See :func:`register_verifier_env`; extra keyword arguments go to the verifier, and one it
    does not take is refused here (TypeError), not at every step.

    ## Verifier timeout
    As the bundled verifiers have a time limit, so does yours: ``verifier_timeout_s`` (default
    :data:`DEFAULT_VERIFIER_TIMEOUT_S`, wall clock) in the one verifier isolation
    (``rllib_dph.envs.isolation``): the verifier runs in a checker subprocess, with a memory cap;
    a call still running at the limit is killed and scores 0 with ``info["error"]`` "verifier
    timed out after ... s (verifier_timeout_s)". The verifier must be picklable (a module-level
    function, or a lambda or closure without locks, files or connections).
    ``verifier_timeout_s=None``: no isolation, the verifier runs in the step's thread.
    """

    def __init__(
        self,
        data: str | Sequence[Task | Mapping[str, Any]],
        *,
        verifier: Callable[..., float | bool | Verdict],
        prompt_format: PromptFormat | None = None,
        ground_truth_field: str = "answer",
        system_prompt: str | None = None,
        verifier_timeout_s: float | None = DEFAULT_VERIFIER_TIMEOUT_S,
        name: str = "custom",
        **verifier_kwargs: Any,
    ):
        check_keywords(verifier, verifier_kwargs, name, takes="the keyword arguments")
        limits = verifier_limits(verifier_timeout_s, name)
        tasks = load_tasks(
            data,
            task="generic",
            prompt_format=prompt_format,
            ground_truth_field=ground_truth_field,
            system_prompt=system_prompt,
        )
        super().__init__(tasks, functools.partial(verifier, **verifier_kwargs), name=name, limits=limits)
        self.verifier_fn = verifier
        self.verifier_kwargs = verifier_kwargs
        self.verifier_timeout_s = None if limits is None else limits.wall_s
