"""Text-to-SQL with execution feedback: exploratory queries before the final answer.

``rllib_dph/SQLMultiTurn-v0``. The tasks and the verifier are those of ``rllib_dph.envs.sql.SQLEnv``; the
prompt adds the protocol (:data:`PROTOCOL`):

- a turn with a ``<query>...</query>`` block and no ```sql block is an exploratory query: it runs
  through the verifier's own sandbox (:func:`rllib_dph.envs.sql.execute_sql`: read-only, the same time limit
  per query, heap cap, row and byte caps, one statement), and the observation is its first
  ``max_observation_rows`` rows (cut to ``max_observation_chars``) or its error message;
- any other turn is the final answer, scored like a ``SQL-v0`` completion (its last ```sql block
  is executed and compared with the gold query; no block: reward 0, ``error`` "no ```sql block").
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Sequence

from rllib_dph.envs.base import Task
from rllib_dph.envs.multiturn import MultiTurnEnv, tag_content
from rllib_dph.envs.sql import SQLEnv, SQLExecutionError, execute_sql, extract_sql

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
