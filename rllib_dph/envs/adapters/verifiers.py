"""Environments written for ``verifiers`` as verifier envs: ``rllib_dph/Verifiers-v0``.

`verifiers <https://github.com/PrimeIntellect-ai/verifiers>`_ environments (its classic API:
``vf.SingleTurnEnv``, ``vf.MultiTurnEnv`` with ``env_response`` and ``@vf.stop`` conditions, a
``vf.Rubric`` of reward functions, sync or async, parsers such as ``vf.XMLParser``) run here
unchanged. The env's own rollout loop (``Environment.run_rollout``: its dataset row, its state,
``setup_state``, stop conditions, ``env_response``, cleanup, then its rubric) runs on a
background event loop; where it asks its client for a model response, it gets the policy's
turn instead::

    env = gym.make("rllib_dph/Verifiers-v0", environment="my-env", env_args={"level": 2})
    env = VerifiersEnv(my_module.load_environment())          # an env object

``environment`` is an id for ``verifiers.load_environment`` (the installed module ``my_env``
whose ``load_environment(**env_args)`` builds it) or a ``vf.Environment``. Install with
``pip install -e ".[verifiers]"``: the classic API as shipped in verifiers 0.3 (0.4 moved to a
new stack).

How it maps:

- **Prompt**: the row's ``prompt`` messages (system prompt and few-shot examples included, as
  the env formatted them); the engine applies the chat template.
- **Turns**: each policy turn is the assistant message the env's loop receives. When the loop
  asks for another turn, the messages its ``env_response`` added are the observation (their
  contents joined by blank lines, shown as one ``user`` message); when the loop ends (a stop
  condition, ``max_turns``, ``final_env_response``), the episode terminates with the rubric's
  reward.
- **Reward**: ``state["reward"]``, the weighted sum of the rubric's reward functions;
  ``info["metrics"]`` holds each function's score. **Correct** (pass@k): reward >= the env's
  own ``pass_threshold`` (verifiers' default 0.5), or ``correct_threshold`` when given.
- **Time limit**: every wait for the env (its ``setup_state``, ``env_response``, rubric) is
  bounded by ``verifier_timeout_s`` (the registered envs' default); past it the episode ends
  with reward 0 and the reason in ``info["error"]``, worded as the verifier isolation words it
  (``verifiers env timed out after 30 s (verifier_timeout_s)``). The env does not run in the
  isolation's checker subprocess (``rllib_dph.envs.isolation``): its rollout is one coroutine
  that keeps its state across the policy's turns, on this process's event loop, where its
  client hands it each turn; a call that returns once cannot hold it.
- **Errors never pass as rewards**: a reward function that raises (the rubric logs it and counts
  0) or a rollout that records an error gives ``correct=False`` and ``info["error"]``; an
  exception out of the env's loop ends the episode with reward 0 and its message.

What does not map (a ``ValueError`` when the env is built, or the episode's ``info["error"]``,
never a silent reward): group reward functions and rubrics that compute advantages (they need a
group of rollouts; a step scores one); native tool calling (``tool_defs``, ``ToolEnv``,
``MCPEnv``: the policy writes text, not structured tool calls); non-text message content
(images); ``score_rollouts=False``; an env that rewrites earlier messages (a custom
``get_prompt_messages``: the rollout only appends); the env's ``sampling_args`` (sampling is the
engine's; a warning says so); the SIGINT / SIGTERM handlers a verifiers env installs when built
(an env loaded by id here leaves the process's handlers as they were; its teardown still runs
at exit).

Known differences that are not errors: every policy turn reaches the env as a finished message
(``finish_reason="stop"``, no token ids or usage), also one cut at ``max_new_tokens``; the env's
own ``timeout_seconds`` counts the wall time of the whole batch's generation (when it ends a
rollout, ``info["error"]`` says so and the episode is not correct).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import queue
import signal
import threading
import time
import weakref
from typing import Any, Mapping

from rllib_dph.envs.arguments import check_real
from rllib_dph.envs.base import Task, VerifierEnv
from rllib_dph.envs.multiturn import EPISODE_OVER
from rllib_dph.envs.registry import DEFAULT_VERIFIER_TIMEOUT_S, verifier_limits

logger = logging.getLogger(__name__)

#: The install command named when verifiers is missing.
INSTALL_HINT = 'pip install -e ".[verifiers]"  (or: pip install "verifiers>=0.3.1,<0.4")'
#: Most policy turns when the env sets no ``max_turns`` of its own (verifiers' -1, no limit).
DEFAULT_MAX_TURNS = 8
#: The model name the env's loop is given (its client is the policy).
POLICY_MODEL = "rllib_dph-policy"
#: Splits: the env's ``dataset`` or its ``eval_dataset``.
SPLITS = ("train", "eval")


def import_verifiers():
    """The ``verifiers`` module (classic API); ImportError naming the install command."""
    try:
        import verifiers as vf

        vf.Environment  # noqa: B018 - the classic API (verifiers 0.4 has none)
    except (ImportError, AttributeError) as e:
        raise ImportError(
            f"rllib_dph/Verifiers-v0 needs verifiers' classic API ({type(e).__name__}: {e}); install it "
            f"with {INSTALL_HINT}."
        ) from e
    return vf


# ----------------------------------------------------------------------------- the event loop
_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def _loop() -> asyncio.AbstractEventLoop:
    """The process's background event loop (a daemon thread) that runs the envs' rollouts."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, name="verifiers-env-loop", daemon=True).start()
        return _LOOP


class _Channel:
    """What an episode's rollout and its env exchange: events out (``("turn", messages)``,
    ``("done", output)``, ``("error", exception)``), the policy's turn in."""

    def __init__(self):
        self.events: queue.Queue = queue.Queue()
        self.reply: asyncio.Future | None = None

    async def turn(self, prompt) -> str:
        """Called by the client: hands the prompt out and waits for the policy's turn."""
        self.reply = asyncio.get_running_loop().create_future()
        self.events.put(("turn", prompt))
        return await self.reply

    def answer(self, text: str) -> None:
        reply = self.reply
        _loop().call_soon_threadsafe(lambda: reply.done() or reply.set_result(text))


def _policy_client(vf, channel: _Channel):
    """A ``vf.Client`` whose responses are the policy's turns."""
    from verifiers.types import Response, ResponseMessage

    class PolicyClient(vf.Client):
        def setup_client(self, config):
            return None

        async def to_native_tool(self, tool):
            raise NotImplementedError("tool calls do not map")

        async def to_native_prompt(self, messages):
            return messages, {}

        async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
            raise NotImplementedError("the policy answers through get_response")

        async def raise_from_native_response(self, response):
            return None

        async def from_native_response(self, response):
            return response

        async def close(self):
            return None

        async def get_response(self, prompt, model, sampling_args, tools=None, **kwargs):
            text = await channel.turn(prompt)
            message = ResponseMessage(role="assistant", content=text, finish_reason="stop", is_truncated=False)
            return Response(id="policy", created=int(time.time()), model=model, message=message)

    return PolicyClient(None)


async def _run(env, row: dict, client, channel: _Channel) -> None:
    try:
        output = await env.run_rollout(row, client, POLICY_MODEL, {})
    except asyncio.CancelledError:
        raise
    except BaseException as e:  # the env's code failed: reported to the step, never raised there
        channel.events.put(("error", e))
    else:
        channel.events.put(("done", output))


class _ErrorLog(logging.Handler):
    """Collects verifiers' ERROR records (a reward function that raised) while a step waits."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _text(message: Any, where: str) -> tuple[str, str]:
    """``(role, content)`` of a verifiers message (dict or pydantic); ValueError for non-text."""
    get = message.get if isinstance(message, Mapping) else lambda k: getattr(message, k, None)
    role, content = get("role"), get("content")
    if not isinstance(content, str):
        raise ValueError(
            f"{where}: a {role} message has {type(content).__name__} content ({str(content)[:80]}); only "
            "text messages map to this env (no images or content parts)."
        )
    return role, content


# ----------------------------------------------------------------------------- the env
class VerifiersEnv(VerifierEnv):
    """A ``verifiers`` environment as a verifier env (module docstring).

    ## Description
    Each episode is one row of the env's dataset, played by the env's own rollout loop with the
    policy as its model.

    ## Action Space
    ``spaces.Text``: one policy turn.

    ## Observation Space
    ``spaces.Text``: the prompt, then the text of each ``env_response``.

    ## Rewards
    The rubric's reward of the finished rollout; 0 when the env raised or timed out, or the
    episode was truncated.

    ## Starting State
    A row drawn uniformly with ``self.np_random``, or the one given by ``options={"index": i}``.

    ## Episode End
    Terminated when the env's loop ends; truncated when the env wants turn ``max_turns + 1``. A
    ``step`` after the end is refused (RuntimeError) until the next ``reset``.

    ## Info
    ``task_id``, ``data_source``, ``index``, ``messages``, ``turn``; at the end also ``correct``,
    ``metrics`` (each reward function's score), ``stop_condition`` and, when something failed,
    ``error``.

    ## Arguments
    Args:
        environment: A ``vf.Environment``, or an env id for ``verifiers.load_environment``.
        env_args: Keyword arguments of the env's ``load_environment`` (with an id).
        split: ``"train"`` (the env's ``dataset``) or ``"eval"`` (its ``eval_dataset``).
        max_turns: Most policy turns; None: the env's ``max_turns``, or
            :data:`DEFAULT_MAX_TURNS` when it sets none.
        max_episode_tokens: Most response tokens per episode (the rollout enforces it).
        correct_threshold: Reward that counts as correct; None: the env's ``pass_threshold``.
        verifier_timeout_s: Longest wait for the env in one step, in seconds (None: no limit).
    """

    def __init__(
        self,
        environment: Any,
        *,
        env_args: Mapping[str, Any] | None = None,
        split: str = "train",
        max_turns: int | None = None,
        max_episode_tokens: int | None = None,
        correct_threshold: float | None = None,
        verifier_timeout_s: float | None = DEFAULT_VERIFIER_TIMEOUT_S,
    ):
        vf = import_verifiers()
        if isinstance(environment, str):
            with _keep_signal_handlers():
                environment = vf.load_environment(environment, **dict(env_args or {}))
        if not isinstance(environment, vf.Environment):
            raise TypeError(
                f"VerifiersEnv: environment is a {type(environment).__name__}; give a verifiers Environment "
                "(e.g. vf.SingleTurnEnv(...)) or an env id for verifiers.load_environment."
            )
        name = f"Verifiers-{environment.env_id or type(environment).__name__}"
        self.vf_env = environment
        self._vf = vf
        _check_features(environment, name, split)
        rows = [dict(r) for r in (environment.get_dataset() if split == "train" else environment.get_eval_dataset())]
        tasks = [_task(row, i, name, environment.env_id or "verifiers", split) for i, row in enumerate(rows)]
        limits = verifier_limits(verifier_timeout_s, name)
        super().__init__(tasks, _scored_by_rubric, name=name,
                         limits=None if limits is None else dataclasses.replace(limits, label="verifiers env"))
        self.rows = rows
        own = getattr(environment, "max_turns", -1)
        self.max_turns = int(max_turns if max_turns is not None else own if own > 0 else DEFAULT_MAX_TURNS)
        if self.max_turns < 1:
            raise ValueError(f"{name}: max_turns={max_turns} must be >= 1.")
        self.max_episode_tokens = max_episode_tokens
        threshold = environment.pass_threshold if correct_threshold is None else correct_threshold
        self.correct_threshold = check_real(threshold, "correct_threshold", low=-1e9, high=1e9, where=name, default=None)
        self.verifier_timeout_s = None if limits is None else limits.wall_s
        self._episode: _Episode | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = super().reset(seed=seed, options=options)
        if self._episode is not None:
            self._episode.cancel()
        self._episode = _Episode(self._vf, self.vf_env, self.rows[self._index])
        self._turn = 0
        self._pending = self._episode.wait(self.verifier_timeout_s)  # the env's first request, or its end
        shown = [(m["role"], m["content"]) for m in self.tasks[self._index].messages]
        if self._pending[0] == "turn" and self._episode.messages != shown:
            self._pending = ("error", ValueError("its first prompt is not its dataset row's prompt (setup_state "
                                                 "changed it); the policy is shown the row's prompt"))
        return obs, info

    def step(self, action: str):
        if self._episode is None:
            raise RuntimeError(f"{self.name}: call reset() before step().")
        self._check_step()
        self._turn += 1
        info = self._info(self._index)
        info["turn"] = self._turn
        episode, event = self._episode, self._pending
        if event[0] == "turn":
            log = _ErrorLog()
            logging.getLogger("verifiers").addHandler(log)
            try:
                episode.channel.answer(str(action))
                event = episode.wait(self.verifier_timeout_s)
            finally:
                logging.getLogger("verifiers").removeHandler(log)
            episode.errors += log.messages
        self._pending = event
        kind, value = event
        if kind == "turn":
            return self._next_turn(episode, value, str(action), info)
        return self._end(kind, value, episode, info)

    def _next_turn(self, episode: "_Episode", prompt, action: str, info: dict):
        try:
            observation = episode.observe(prompt, action, self.name)
        except ValueError as e:
            return self._end("error", e, episode, info)
        if self._turn >= self.max_turns:
            episode.cancel()
            info["correct"] = False
            info["error"] = f"max_turns={self.max_turns} reached without the env ending the episode"
            self._done = True
            return EPISODE_OVER, 0.0, False, True, info
        return observation, 0.0, False, False, info

    def _end(self, kind: str, value: Any, episode: "_Episode", info: dict):
        episode.cancel()
        self._done = True
        if kind == "timeout":
            info["correct"] = False
            info["error"] = self.limits.timed_out(cpu=False)
            return EPISODE_OVER, 0.0, True, False, info
        if kind == "error":
            info["correct"] = False
            info["error"] = f"the verifiers env raised {type(value).__name__}: {value}"
            return EPISODE_OVER, 0.0, True, False, info
        reward = float(value.get("reward") or 0.0)
        problems = list(episode.errors) + ([f"the rollout recorded {value['error']!r}"] if value.get("error") else [])
        if not math.isfinite(reward):  # never into training
            problems.append(f"the rubric's reward is {reward!r}; scored 0")
            reward = 0.0
        if value.get("stop_condition") == "timeout_reached":  # its wall clock counts the batch's generation too
            problems.append(f"the env's own timeout_seconds={self.vf_env.timeout_seconds} ended the rollout")
        info["metrics"] = dict(value.get("metrics") or {})
        info["stop_condition"] = value.get("stop_condition")
        info["correct"] = not problems and reward >= self.correct_threshold
        if problems:
            info["error"] = "; ".join(problems)
        return EPISODE_OVER, reward, True, False, info

    def close(self):
        if self._episode is not None:
            self._episode.cancel()
        super().close()


def _scored_by_rubric(completion: str, ground_truth: Any):
    raise RuntimeError("VerifiersEnv scores in step(), through the verifiers env's own rollout and rubric.")


class _Episode:
    """One rollout of the verifiers env on the background loop; cancelled when the env copy that
    owns it is reset again, closed or garbage-collected (an episode the rollout ended early)."""

    def __init__(self, vf, env, row: dict):
        self.channel = _Channel()
        self.errors: list[str] = []
        self.messages: list[tuple[str, str]] | None = None
        client = _policy_client(vf, self.channel)
        self.future = asyncio.run_coroutine_threadsafe(_run(env, row, client, self.channel), _loop())
        weakref.finalize(self, self.future.cancel)

    def wait(self, timeout_s: float | None) -> tuple[str, Any]:
        try:
            event = self.channel.events.get(timeout=timeout_s)
        except queue.Empty:
            return ("timeout", None)
        if event[0] == "turn" and self.messages is None:
            self.messages = [_text(m, "the prompt") for m in event[1]]
        return event

    def observe(self, prompt, action: str, where: str) -> str:
        """The text of the messages the env added after the policy's turn ``action``."""
        messages = [_text(m, f"{where}: env_response") for m in prompt]
        expected = self.messages + [("assistant", action)]
        if messages[: len(expected)] != expected:
            raise ValueError(
                f"{where}: the env's next prompt does not extend the conversation (a custom "
                "get_prompt_messages rewrote earlier messages); only appended env responses map."
            )
        self.messages = messages
        return "\n\n".join(content for _, content in messages[len(expected):])

    def cancel(self) -> None:
        self.future.cancel()


@contextlib.contextmanager
def _keep_signal_handlers():
    """Restores this process's SIGINT and SIGTERM handlers after the block: building a verifiers
    env installs its own (its teardown, then exit), and the trainer owns those signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _task(row: Mapping[str, Any], index: int, name: str, source: str, split: str) -> Task:
    where = f"{name}: {split} row {index}"
    prompt = row.get("prompt")
    if not isinstance(prompt, list) or not prompt:
        raise ValueError(f"{where}: 'prompt' is {type(prompt).__name__}; the env's dataset must give chat messages.")
    info = row.get("info")
    if isinstance(info, Mapping) and info.get("tool_defs"):
        raise ValueError(f"{where}: info['tool_defs'] asks for native tool calls, which do not map (the policy writes text).")
    messages = tuple({"role": role, "content": content} for role, content in (_text(m, where) for m in prompt))
    example = row.get("example_id", index)
    return Task(id=f"{source}/{split}/{example}", data_source=source, messages=messages, ground_truth=row,
                meta={"split": split})


def _check_features(env, name: str, split: str) -> None:
    """Raises ValueError for the features of the module docstring that do not map."""
    rubric = type(env.rubric).__name__
    rules = [
        (split in SPLITS, f"split={split!r} must be one of {SPLITS}"),
        (not env.requires_group_rollouts, f"the rubric ({rubric}) has group reward functions (parameters "
                                          "such as completions, states, answers: they score a group of "
                                          "rollouts together; a step scores one episode); score each rollout"),
        (not env.provides_advantages, f"the rubric ({rubric}) computes advantages itself; the algorithm "
                                      "computes them here"),
        (not env.tool_defs, f"the env declares tools {[t.name for t in env.tool_defs or []]} for native tool "
                            "calls, which do not map (the policy writes text); use a MultiTurnEnv whose "
                            "env_response reads the call from the text"),
        (env.score_rollouts, "score_rollouts=False gives every rollout reward 0"),
        (env.message_type == "chat", f"message_type={env.message_type!r}: only chat prompts map"),
    ]
    for ok, message in rules:
        if not ok:
            raise ValueError(f"{name}: {message}.")
    extra = {k: v for k, v in env.sampling_args.items() if k not in ("n", "extra_body") and v is not None}
    if extra or env.sampling_args.get("extra_body"):
        logger.warning("%s: the env's sampling_args %s are not applied; the engine's sampling settings are.",
                       name, env.sampling_args)
