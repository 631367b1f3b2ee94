"""The SQL verifier (:func:`verify_sql`) and the environment ``rllib_dph/SQL-v0`` (:class:`SQLEnv`).

A completion is scored by running SQL, never by comparing text: its last ```sql block
(:mod:`~rllib_dph.envs.sql.extract`) runs in the read-only sandbox
(:mod:`~rllib_dph.envs.sql.sandbox`) and its rows are compared with the gold query's
(:mod:`~rllib_dph.envs.sql.compare`). A bad, slow or hostile query gets reward 0 and a short
reason; the verifier never raises because of the completion or the database.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from typing import Any, Mapping, Sequence

import numpy as np

from rllib_dph.envs import isolation
from rllib_dph.envs.arguments import ArgumentError, check_real, check_timeout
from rllib_dph.envs.base import Task, Verdict, VerifierEnv
from rllib_dph.envs.sql.compare import COMPARATORS, column_overlap_score
from rllib_dph.envs.sql.extract import MAX_COMPLETION_CHARS, _code_tokens, extract_sql
from rllib_dph.envs.sql.sandbox import DEFAULT_TIMEOUT_S, SQLExecutionError, _execute, execute_sql, sql_limits
from rllib_dph.envs.suites import task_style


def verify_sql(
    completion: str,
    gold_sql: str,
    db_path: str,
    *,
    cmp_method: str = "bird",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    partial_credit: bool = False,
    format_penalty: float = 0.0,
) -> Verdict:
    """Scores a completion by executing its last ```sql block against the gold query.

    Args:
        completion: The model's whole completion.
        gold_sql: The reference query.
        db_path: Path of the SQLite database file both queries run on.
        cmp_method: ``"bird"`` (row sets, column order matters) or ``"spider"`` (row multisets up
            to a column permutation, ordered when the gold query has a top-level ORDER BY).
        timeout_s: Wall-clock limit in seconds for the whole call (gold query included when it is
            not cached yet).
        partial_credit: Give the original code's column-overlap score (< 1) to a query that ran
            but whose result differs.
        format_penalty: Reward ``-format_penalty`` (instead of 0) when there is no ```sql block.

    Returns:
        ``Verdict(1.0, True)`` when the results are equal; otherwise reward 0 (or the partial
        credit, or the format penalty) with ``correct=False`` and, when the query could not be
        checked, a short ``error``.

    Raises:
        ArgumentError: ``cmp_method`` is unknown, ``timeout_s`` is not a number of seconds in
            [MIN_TIMEOUT_S, MAX_TIMEOUT_S] of ``rllib_dph.envs.arguments`` (NaN and infinity included), or
            ``format_penalty`` is not in [0, 1] (caller errors, raised before any scoring; a
            ValueError). Nothing about the completion or the database ever raises.
    """
    if cmp_method not in COMPARATORS:
        raise ArgumentError(
            f"cmp_method={cmp_method!r} is unknown; use one of {sorted(COMPARATORS)}."
        )
    timeout_s = check_timeout(timeout_s, where="verify_sql", default=DEFAULT_TIMEOUT_S)
    format_penalty = _check_format_penalty(format_penalty, "verify_sql")
    if len(completion) > MAX_COMPLETION_CHARS:
        return Verdict(0.0, False, f"completion too long: {len(completion)} characters, more than "
                       f"the verifier reads ({MAX_COMPLETION_CHARS})")
    sql = extract_sql(completion)
    if sql is None:
        return Verdict(0.0 - format_penalty, False, "no ```sql block")
    try:
        return isolation.run(_run_and_compare, sql, gold_sql, db_path, cmp_method, timeout_s, partial_credit,
                             limits=sql_limits(timeout_s))
    except isolation.IsolationFailure as failure:
        return Verdict(0.0, False, failure.reason)


def _run_and_compare(sql: str, gold_sql: str, db_path: str, cmp_method: str, timeout_s: float,
                     partial_credit: bool) -> Verdict:
    """Runs the gold and the predicted query within ``timeout_s`` and compares their rows (in a
    checker of the isolation).

    Args:
        sql: The completion's query.
        gold_sql: The reference query.
        db_path: The SQLite database file.
        cmp_method: A key of ``COMPARATORS``.
        timeout_s: Seconds by which both queries must have finished.
        partial_credit: Score a differing result by column overlap instead of 0.

    Returns:
        The verdict of :func:`verify_sql`; never raises.
    """
    deadline = time.monotonic() + timeout_s
    try:
        try:
            gold = _execute(gold_sql, db_path, deadline)
        except SQLExecutionError as error:
            return Verdict(0.0, False, f"gold query failed on {db_path}: {error}")
        try:
            pred = _execute(sql, db_path, deadline)
        except SQLExecutionError as error:
            return Verdict(0.0, False, str(error))
        if COMPARATORS[cmp_method](pred, gold, gold_sql):
            return Verdict(1.0, True)
        return Verdict(column_overlap_score(pred, gold) if partial_credit else 0.0, False)
    except Exception as error:  # never raise into the training loop
        return Verdict(0.0, False, f"verifier error: {type(error).__name__}: {error}")


def sql_reward(
    completion: str,
    gold_sql: str,
    db_path: str,
    *,
    cmp_method: str = "bird",
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> float:
    """1.0 when the last ```sql block of ``completion`` gives the gold query's result, else 0.0.

    See :func:`verify_sql` for the arguments; this is its reward with the default options.
    """
    verdict = verify_sql(completion, gold_sql, db_path, cmp_method=cmp_method, timeout_s=timeout_s)
    return verdict.reward


def _check_format_penalty(value: Any, where: str) -> float:
    """``format_penalty`` as a float in [0, 1]: a negative one would reward a completion without
    SQL, one above a correct answer's reward 1 would dominate the reward."""
    return check_real(value, "format_penalty", low=0.0, high=1.0, where=where, default=0.0)


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------

_GROUND_TRUTH_KEYS = ("db_path", "gold_sql")


class SQLEnv(VerifierEnv):
    """Text-to-SQL: write one SQLite query that answers a question about a database.

    ## Description
    Each episode is one question about one SQLite database (schema and question in the prompt).
    The model answers with a completion whose last ```sql fenced block is executed read-only on
    the database and compared with the gold query's result (see :func:`verify_sql`).

    ## Action Space
    ``spaces.Text`` over printable characters: the whole completion. ``step`` accepts any ``str``.

    ## Observation Space
    ``spaces.Text``: the prompt text (printable ASCII plus every character of the prompts).

    ## Rewards
    1.0 when the query's result equals the gold result under ``cmp_method``; otherwise 0.0, or
    the column-overlap partial credit in [0, 0.8] when ``partial_credit=True``, or
    ``-format_penalty`` when the completion has no ```sql block.

    ## Starting State
    A question drawn uniformly with ``self.np_random``, or the one chosen by
    ``options={"index": i}``.

    ## Episode End
    Terminated after one step; never truncated.

    ## Info
    ``reset``: ``task_id``, ``data_source``, ``index``, ``messages``. ``step``: the same plus
    ``correct`` and, when the query could not be checked (no block, SQL error, denied statement,
    timeout, result too large), ``error``.

    ## Arguments
    Args:
        data: A bundled suite split (``"sql_synth/train"``), a parquet or jsonl file, or a list
            of row dicts, all read by ``rllib_dph.envs.data.load_tasks``; or a list of already-loaded
            :class:`~rllib_dph.envs.base.Task` (used as they are, ``db_root`` unused).
        db_root: Directory the ``db_id`` paths of a data file are relative to.
        cmp_method: ``"bird"`` or ``"spider"`` for every task; None uses each task's own.
        timeout_s: Wall-clock limit per verification in seconds, in [0.01, 3600].
        partial_credit: Give the original column-overlap partial credit to wrong results.
        format_penalty: Reward ``-format_penalty`` for a completion without a ```sql block, in
            [0, 1].
    """

    def __init__(
        self,
        data: str | os.PathLike | Sequence[Task | Mapping[str, Any]] = "sql_synth/train",
        *,
        db_root: str | None = None,
        cmp_method: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        partial_credit: bool = False,
        format_penalty: float = 0.0,
    ):
        if isinstance(data, Sequence) and all(isinstance(t, Task) for t in data):
            tasks = list(data)
        else:
            # Imported here so that the verifier and from_tasks work without the data loaders.
            from rllib_dph.envs.data import load_tasks

            tasks = load_tasks(data, task="sql", db_root=db_root)
        if cmp_method is not None and cmp_method not in COMPARATORS:
            raise ValueError(
                f"SQLEnv: cmp_method={cmp_method!r} is unknown; use one of "
                f"{sorted(COMPARATORS)}, or None to use each task's own."
            )
        timeout_s = check_timeout(timeout_s, where="SQLEnv", default=DEFAULT_TIMEOUT_S)
        format_penalty = _check_format_penalty(format_penalty, "SQLEnv")
        if not isinstance(partial_credit, (bool, np.bool_)):  # "false" from a config file is truthy
            raise ArgumentError(
                f"SQLEnv: partial_credit={partial_credit!r} is a {type(partial_credit).__name__}; pass "
                "True or False (default False)."
            )
        for task in tasks:
            _check_ground_truth(task, needs_cmp_method=cmp_method is None)
        self.cmp_method = cmp_method
        self.timeout_s = timeout_s
        self.partial_credit = partial_credit
        self.format_penalty = format_penalty
        verifier = functools.partial(verify_task, cmp_method=cmp_method, timeout_s=timeout_s,
                                     partial_credit=partial_credit, format_penalty=format_penalty)
        super().__init__(tasks, verifier, name="SQLEnv", limits=sql_limits(timeout_s))

    @classmethod
    def from_tasks(cls, tasks: Sequence[Task], **kwargs) -> "SQLEnv":
        """Builds the env on already-loaded tasks; ``kwargs`` as for ``SQLEnv`` (not ``data``)."""
        return cls(list(tasks), **kwargs)

    def answer_key(self, index: int, completion: str) -> str | None:
        """The query's execution result on the task's database, as a hash of its set of rows.

        Column order is kept, row order and duplicates are ignored (as in BIRD's comparison);
        None when there is no ```sql block or the query fails.

        Args:
            index: The task's index in :attr:`tasks`.
            completion: The completion text.
        """
        sql = extract_sql(completion)
        if sql is None:
            return None
        try:
            rows = execute_sql(sql, self.tasks[index].ground_truth["db_path"], timeout_s=self.timeout_s)
        except SQLExecutionError:
            return None
        canonical = repr(sorted({tuple(row) for row in rows}, key=repr))
        return "rows:" + hashlib.sha1(canonical.encode()).hexdigest()[:16]

    def solution_style(self, index: int, completion: str, suite: str | None = None) -> str | None:
        """The SQL style (``rllib_dph.envs.suites.style_of``) when the task's suite has styles, else None."""
        return task_style(self.tasks[index].data_source, completion, suite)

    def solution_key(self, index: int, completion: str) -> str | None:
        """The query of the last ```sql block as code: its tokens without comments or whitespace,
        unquoted words (keywords, names: SQLite ignores their case) upper-cased, quoted strings
        and names as written, trailing semicolons dropped; None without a block. So
        ``select name  from t;`` and ``SELECT name FROM T`` are one solution, and
        ``SELECT t.name FROM t`` is another.

        Args:
            index: The task's index in :attr:`tasks`.
            completion: The completion text.
        """
        sql = extract_sql(completion)
        if sql is None:
            return None
        tokens = [m.group().upper() if m.lastgroup == "word" else m.group() for m in _code_tokens(sql)]
        while tokens and tokens[-1] == ";":
            tokens.pop()
        return " ".join(tokens) or None


def verify_task(completion: str, truth: Mapping[str, Any], *, cmp_method: str | None, timeout_s: float,
                partial_credit: bool, format_penalty: float) -> Verdict:
    """:func:`verify_sql` on a task's ground truth (``gold_sql``, ``db_path`` and, when
    ``cmp_method`` is None, its ``cmp_method``): the verifier of :class:`SQLEnv`."""
    return verify_sql(completion, truth["gold_sql"], truth["db_path"], cmp_method=cmp_method or truth["cmp_method"],
                      timeout_s=timeout_s, partial_credit=partial_credit, format_penalty=format_penalty)


def _check_ground_truth(task: Task, *, needs_cmp_method: bool) -> None:
    """Raises ValueError naming the task and field when its ground truth cannot be verified."""
    where = f"SQLEnv: task {task.id!r} (data_source {task.data_source!r})"
    truth = task.ground_truth
    if not isinstance(truth, Mapping):
        raise ValueError(
            f"{where}: ground_truth is a {type(truth).__name__}; SQL tasks need a dict with "
            f"'db_path', 'gold_sql' and 'cmp_method' (as built by rllib_dph.envs.data.load_tasks)."
        )
    for key in _GROUND_TRUTH_KEYS + (("cmp_method",) if needs_cmp_method else ()):
        if not truth.get(key):
            raise ValueError(
                f"{where}: ground_truth[{key!r}] is missing or empty; SQL tasks need 'db_path', "
                f"'gold_sql' and 'cmp_method' (or pass cmp_method= to SQLEnv)."
            )
    if needs_cmp_method and truth["cmp_method"] not in COMPARATORS:
        raise ValueError(
            f"{where}: ground_truth['cmp_method']={truth['cmp_method']!r} is unknown; use one of "
            f"{sorted(COMPARATORS)}."
        )
    if not os.path.isfile(truth["db_path"]):
        raise ValueError(
            f"{where}: ground_truth['db_path']={truth['db_path']!r} is not a file; check db_root "
            f"and the task's db_id."
        )
