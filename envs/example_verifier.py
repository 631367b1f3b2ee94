"""A verifier env of your own: one function, some rows, one registration.

The task: answer the bundled SQL suite's questions with a query written as a CTE
(``WITH t AS (...) SELECT ...``), the house style of a team that wants it. The verifier runs
the completion's query on the question's SQLite database and gives reward 1.0 when it is a CTE
and returns the gold query's rows. The bundled model, ``tiny-sql-math``, answers about half of
these questions right but writes a CTE in about one answer of six, so the reward starts low
and GRPO raises it within minutes on a laptop CPU.

See it score (from the repository root)::

    python envs/example_verifier.py

Train on it (``--import`` registers the env in the driver and in every Ray worker)::

    rllib train --algo GRPO --env example/SQLWithCTE-v0 --import envs/example_verifier.py \\
        --config '{"lr": 0.0003, "max_response_length": 96}' --stop '{"training_iteration": 20}'
"""

import re
import sqlite3
from contextlib import closing

import gymnasium as gym

from rllib_dph.envs import register_verifier_env

#: The last ```sql fenced block of a completion holds its query.
SQL_BLOCK = re.compile(r"```sql\s*(.*?)```", re.DOTALL | re.IGNORECASE)


def cte_with_the_gold_rows(completion: str, truth: dict) -> bool:
    """The verifier, ``verifier(completion, ground_truth) -> bool | float | Verdict``: True
    (reward 1.0) when the completion's query starts with ``WITH`` and returns the same rows as
    the gold query (as sets). ``truth`` is a suite task's ground truth: ``db_path``, ``gold_sql``.

    The database is opened read-only; a query that runs too long is cut off by the env's
    ``verifier_timeout_s``. The bundled ``rllib_dph/SQL-v0`` env checks queries in a sandbox
    with more limits (rllib_dph/envs/sql.py).
    """
    blocks = SQL_BLOCK.findall(completion)
    if not blocks or not blocks[-1].lstrip().upper().startswith("WITH"):
        return False
    with closing(sqlite3.connect(f"file:{truth['db_path']}?mode=ro", uri=True)) as db:
        try:
            rows = db.execute(blocks[-1]).fetchall()
        except sqlite3.Error:
            return False
        return set(rows) == set(db.execute(truth["gold_sql"]).fetchall())


register_verifier_env(
    "example/SQLWithCTE-v0",
    verifier=cte_with_the_gold_rows,
    data="sql_synth/train",  # the bundled suite's training questions (rows or a file of yours work too)
)

if __name__ == "__main__":
    env = gym.make("example/SQLWithCTE-v0")
    prompt, _ = env.reset(options={"index": 0})
    print(prompt.splitlines()[-2])  # the question
    for style in ("plain", "cte"):
        query = env.unwrapped.tasks[0].meta["styles"][style]  # the suite's reference query in that style
        _, reward, _, _, info = env.step(f"```sql\n{query}\n```")
        print(f"{style} query: reward {reward}, correct {info['correct']}")
        env.reset(options={"index": 0})
