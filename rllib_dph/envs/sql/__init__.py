"""Text-to-SQL: a sandboxed execution verifier and the SQL environment ``rllib_dph/SQL-v0``.

A completion is scored by running SQL, never by comparing text:

1. **Extract** the last ```sql fenced block of the completion (:func:`extract_sql`).
2. **Execute** it on the task's SQLite database in a read-only sandbox (:func:`execute_sql`).
3. **Compare** its result with the gold query's result (``cmp_method="bird"`` or ``"spider"``).

The modules, one concept each: :mod:`~rllib_dph.envs.sql.extract` (the query of a completion),
:mod:`~rllib_dph.envs.sql.sandbox` (running it read-only), :mod:`~rllib_dph.envs.sql.compare`
(equal results), :mod:`~rllib_dph.envs.sql.env` (the verifier and ``SQLEnv``) and
:mod:`~rllib_dph.envs.sql.multiturn` (``rllib_dph/SQLMultiTurn-v0``).
"""

from rllib_dph.envs.sql.compare import COMPARATORS, column_overlap_score
from rllib_dph.envs.sql.env import SQLEnv, sql_reward, verify_sql
from rllib_dph.envs.sql.extract import MAX_COMPLETION_CHARS, extract_sql, has_top_level_order_by
from rllib_dph.envs.sql.sandbox import DEFAULT_TIMEOUT_S, SQLExecutionError, execute_sql

__all__ = [
    "COMPARATORS",
    "DEFAULT_TIMEOUT_S",
    "MAX_COMPLETION_CHARS",
    "SQLEnv",
    "SQLExecutionError",
    "column_overlap_score",
    "execute_sql",
    "extract_sql",
    "has_top_level_order_by",
    "sql_reward",
    "verify_sql",
]
