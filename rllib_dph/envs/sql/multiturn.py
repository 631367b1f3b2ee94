"""Text-to-SQL with execution feedback: exploratory queries before the final answer.

``rllib_dph/SQLMultiTurn-v0``. The tasks and the verifier are those of ``rllib_dph.envs.sql.SQLEnv``; the
prompt adds the protocol (:data:`PROTOCOL`):

- a turn with a ``<query>...</query>`` block and no ```sql block is an exploratory query: it runs
  through the verifier's own sandbox (:func:`rllib_dph.envs.sql.execute_sql`: read-only, the same time limit
  per query, heap cap, row and byte caps, one statement), and the observation is its first
  ``max_observation_rows`` rows (cut to ``max_observation_chars``) or its error message;
- any other turn is the final answer, scored like a ``SQL-v0`` completion (its last ```sql block
  is executed and compared with the gold query; no block: reward 0, ``error`` "no ```sql block").

SFT traces of the protocol (:func:`sft_traces`, the corpus of the ``tiny-sql-math-mt`` warm start)
are episodes played through this env's own ``step``: query → the env's reply → answer.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Mapping, Sequence

import numpy as np

from rllib_dph.envs.base import Task
from rllib_dph.envs.multiturn import MultiTurnEnv, tag_content
from rllib_dph.envs.sql.env import SQLEnv
from rllib_dph.envs.sql.extract import extract_sql
from rllib_dph.envs.sql.sandbox import SQLExecutionError, execute_sql

#: The protocol appended to every prompt (``str.format`` with ``max_turns`` and ``rows``).
PROTOCOL = (
    "You may explore the database first: write one query in a <query>...</query> block and end "
    "your turn; you will see its first {rows} rows or its error. You have {max_turns} turns in "
    "all. Give your final answer as one SQLite query in a ```sql block."
)


def format_rows(rows: Sequence[tuple], max_rows: int) -> str:
    """Result rows as text, one row per line (values ``|``-separated), at most ``max_rows`` rows."""
    if not rows:
        return "(no rows)"
    lines = [" | ".join("NULL" if v is None else str(v) for v in row) for row in rows[:max_rows]]
    shown = f"first {max_rows} of {len(rows)} rows" if len(rows) > max_rows else f"{len(rows)} rows"
    return "\n".join(lines) + f"\n({shown})"


class SQLMultiTurnEnv(MultiTurnEnv, SQLEnv):
    """Text-to-SQL where the policy may run exploratory queries before it answers.

    ## Description
    Each episode is one question about one SQLite database (schema, question and the protocol of
    :data:`PROTOCOL` in the prompt). Exploratory queries (``<query>...</query>``) run read-only in
    the verifier's sandbox; the final answer's last ```sql block is verified as in ``SQL-v0``.

    ## Action Space
    ``spaces.Text`` over printable characters: one policy turn.

    ## Observation Space
    ``spaces.Text``: the prompt, then each exploratory query's rows or error message.

    ## Rewards
    The ``SQL-v0`` reward of the final answer; 0 when the episode is truncated; plus
    ``tool_reward`` per exploratory query (shaping, 0.0 by default).

    ## Starting State
    A question drawn uniformly with ``self.np_random``, or the one chosen by
    ``options={"index": i}``.

    ## Episode End
    Terminated by the final answer; truncated by an exploratory query in turn ``max_turns``, or by
    the rollout at ``max_episode_tokens`` response tokens.

    ## Info
    As ``SQL-v0``'s, plus ``turn`` and ``tool_calls`` (exploratory queries run so far).

    ## Arguments
    Args:
        data, db_root, cmp_method, timeout_s, partial_credit, format_penalty: As for ``SQLEnv``;
            ``timeout_s`` also limits every exploratory query.
        max_turns: Most policy turns per episode, >= 1.
        max_episode_tokens: Most response tokens per episode (turns and observations).
        max_observation_rows: Most result rows shown per exploratory query, >= 1.
        max_observation_chars: Longest observation in characters, >= 1.
        tool_reward: Reward per exploratory query (per-turn shaping; 0.0: off).
    """

    def __init__(
        self,
        data: str | os.PathLike | Sequence[Task | Mapping[str, Any]] = "sql_synth/train",
        *,
        db_root: str | None = None,
        max_turns: int = 4,
        max_episode_tokens: int | None = 768,
        max_observation_rows: int = 10,
        max_observation_chars: int = 600,
        tool_reward: float = 0.0,
        **sql_kwargs: Any,
    ):
        if max_observation_rows < 1:
            raise ValueError(f"SQLMultiTurnEnv: max_observation_rows={max_observation_rows} must be >= 1.")
        if not (isinstance(data, Sequence) and all(isinstance(t, Task) for t in data)):
            from rllib_dph.envs.data import load_tasks

            data = load_tasks(data, task="sql", db_root=db_root)
        protocol = PROTOCOL.format(rows=max_observation_rows, max_turns=max_turns)
        super().__init__([with_protocol(t, protocol) for t in data], **sql_kwargs)
        self.name = "SQLMultiTurnEnv"
        self.max_observation_rows = int(max_observation_rows)
        self.setup_turns(
            max_turns=max_turns,
            max_episode_tokens=max_episode_tokens,
            max_observation_chars=max_observation_chars,
            tool_reward=tool_reward,
        )

    _find_query = staticmethod(tag_content("query"))

    def tool_call(self, text: str) -> str | None:
        """The ``<query>`` block of a turn without a ```sql block (which is the final answer)."""
        return None if extract_sql(text) is not None else self._find_query(text)

    def run_tool(self, call: str, task: Task) -> str:
        """The exploratory query's rows, or ``error: ...``, from :func:`rllib_dph.envs.sql.execute_sql`."""
        try:
            rows = execute_sql(call, task.ground_truth["db_path"], timeout_s=self.timeout_s)
        except SQLExecutionError as error:
            return f"error: {error}"
        return format_rows(rows, self.max_observation_rows)


def with_protocol(task: Task, protocol: str) -> Task:
    """``task`` with ``protocol`` appended to its last message."""
    messages = [dict(m) for m in task.messages]
    messages[-1]["content"] = messages[-1]["content"] + "\n" + protocol
    return dataclasses.replace(task, messages=tuple(messages))


#: The exploratory queries of an SFT trace (:func:`sft_traces`): the plain-style solution itself
#: (run it, read its rows, answer), or the first rows of the table it reads.
PROBES = ("solution", "table")
_FIRST_TABLE = re.compile(r"\bFROM\s+([A-Za-z_]\w*)", re.IGNORECASE)


def probe_query(task: Task, probe: str) -> str:
    """The exploratory query ``probe`` (one of :data:`PROBES`) of a suite task (``meta["styles"]``)."""
    plain = task.meta["styles"]["plain"]
    if probe == "solution":
        return plain
    if probe == "table":
        return f"SELECT * FROM {_FIRST_TABLE.search(plain).group(1)} LIMIT 3"
    raise ValueError(f"probe_query: probe={probe!r}; use one of {PROBES}.")


def sft_trace(env: SQLMultiTurnEnv, index: int, turns: Sequence[str]) -> list[str]:
    """Plays ``turns`` (policy turns, the last one the answer) through ``env``'s ``step`` on task
    ``index``: ``[turn, observation, turn, ..., answer]``, each observation the env's own reply.

    Raises:
        ValueError: A turn before the last ends the episode, or the last one does not end it
            with a correct answer (a trace must be one the verifier accepts).
    """
    env.reset(options={"index": index})
    parts: list[str] = []
    for i, turn in enumerate(turns):
        observation, _, terminated, truncated, info = env.step(turn)
        last = i == len(turns) - 1
        if (terminated or truncated) != last or (last and not info.get("correct")):
            raise ValueError(
                f"sft_trace: turn {i + 1} of {len(turns)} on task {env.tasks[index].id} "
                f"(max_turns={env.max_turns}) gave terminated={terminated}, truncated={truncated}, "
                f"correct={info.get('correct')}, error={info.get('error')!r}; a trace's turns before the "
                "last must be exploratory queries and its last a correct answer."
            )
        parts += [turn] if last else [turn, observation]
    return parts


def sft_traces(
    split: str,
    examples: Sequence[Mapping[str, Any]],
    *,
    seed: int,
    turn_budgets: Sequence[int] = (1, 2, 3, 4),
    explore_share: float = 0.75,
) -> list[dict]:
    """SFT examples of the protocol: the suite's ``examples`` of ``split`` replayed in this env.

    Each example (a ``rllib_dph.envs.suites.sft_examples`` row) gets a turn budget drawn from
    ``turn_budgets`` (the prompt says it) and, when the budget allows a query, with probability
    ``explore_share`` an exploratory query (a :data:`PROBES` entry drawn uniformly) before its
    answer; the rest answer at once. Observations are the env's replies (:func:`sft_trace`).

    Returns:
        Dicts ``{"messages", "completion", "style", "task_id", "probe"}``: ``messages`` the
        env's prompt (with the protocol), ``completion`` the trace's parts (policy turns and
        observations alternating, for ``rllib_dph.models.build.sft.encode_example``), ``probe`` None
        for a direct answer.
    """
    envs = {b: SQLMultiTurnEnv(split, max_turns=b) for b in turn_budgets}
    first = envs[turn_budgets[0]]
    index_of = {t.id: i for i, t in enumerate(first.tasks)}
    rng = np.random.default_rng(seed)
    out = []
    for ex in examples:
        env = envs[turn_budgets[rng.integers(len(turn_budgets))]]
        i = index_of[ex["task_id"]]
        explore, drawn = rng.random() < explore_share, PROBES[rng.integers(len(PROBES))]
        probe = drawn if explore and env.max_turns > 1 else None
        turns = [ex["completion"]]
        if probe is not None:
            turns.insert(0, f"<query>{probe_query(env.tasks[i], probe)}</query>")
        out.append({
            "messages": [dict(m) for m in env.tasks[i].messages],
            "completion": sft_trace(env, i, turns),
            "style": ex["style"],
            "task_id": ex["task_id"],
            "probe": probe,
        })
    return out
