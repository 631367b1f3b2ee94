"""Bundled synthetic task suites: text-to-SQL and math, generated deterministically offline.

Splits (see :data:`SPLITS`):

==========================  =====  ===========================================================
name                        size   content
==========================  =====  ===========================================================
``sql_synth/train``         3000   36 databases (6 written, 30 generated), 3 train phrasings
``sql_synth/test``          300    same databases and phrasings, question instances unseen
``sql_synth/test_cross``    300    3 unseen schemas, unseen phrasings of the same SQL skills
``math_synth/train``        3000   11 word-problem generators
``math_synth/test``         300    same generators, question texts unseen in train
==========================  =====  ===========================================================

Every question has one reference solution per style (:data:`STYLES`); :func:`style_of` names
the style of any completion, so that the diversity of a policy's answers can be measured. The
SQL databases are written under :func:`sql_db_root` on first use.

Example::

    from envs.suites import load_split, sft_examples, style_of
    tasks = load_split("sql_synth/test")
    rows = sft_examples("math_synth/train")   # one row per (question, style)
    style_of("sql_synth", "```sql\\nWITH t AS (...) SELECT ...\\n```")  # -> "cte"
"""

from __future__ import annotations

import functools
import pathlib
import re

from ..base import Task
from . import math_suite, sql_suite
from .math_suite import MATH_STYLES, math_style
from .sql_query import SQL_STYLES, sql_style
from .storage import sql_db_root, suite_root, write_bytes_atomic

__all__ = [
    "SPLITS", "STYLES", "STYLE_SUITES", "SQL_SUITE", "MATH_SUITE", "load_split", "sft_examples", "style_of",
    "task_style", "suite_root", "sql_db_root", "ensure_databases",
]

SQL_SUITE = "sql_synth"
MATH_SUITE = "math_synth"
#: Data source of the cross-domain SQL split (the role Spider plays against BIRD).
SQL_CROSS_SOURCE = "sql_synth_cross"

SPLITS: tuple[str, ...] = (
    "sql_synth/train", "sql_synth/test", "sql_synth/test_cross", "math_synth/train", "math_synth/test",
)
#: Solution style names per suite; :func:`style_of` also returns "other" and "none".
STYLES: dict[str, tuple[str, ...]] = {SQL_SUITE: SQL_STYLES, MATH_SUITE: MATH_STYLES}
#: Data sources whose completions :func:`style_of` names a style for.
STYLE_SUITES: tuple[str, ...] = (SQL_SUITE, SQL_CROSS_SOURCE, MATH_SUITE)

_SQL_BLOCK = re.compile(r"```sql[ \t]*\n?(.*?)```", re.DOTALL | re.IGNORECASE)


def ensure_databases() -> pathlib.Path:
    """Write every suite database under :func:`sql_db_root` unless it is already there, byte-exact.

    Safe when several processes do it at once: each file is replaced atomically.

    Returns:
        The database root, such that ``sql_db_root() / db_id`` is a database file.
    """
    root = sql_db_root()
    for db_id, data in sql_suite.database_files().items():
        write_bytes_atomic(root / db_id, data)
    return root


def _split_parts(name: str) -> tuple[str, str]:
    if name not in SPLITS:
        raise ValueError(f"Unknown suite split {name!r}; valid names are: {', '.join(SPLITS)}.")
    suite, split = name.split("/")
    return suite, split


@functools.lru_cache(maxsize=None)
def _sql_tasks(split: str, db_root: pathlib.Path) -> tuple[Task, ...]:
    source = SQL_CROSS_SOURCE if split == "test_cross" else SQL_SUITE
    tasks = []
    for i, q in enumerate(sql_suite.questions(split)):
        ground_truth = {
            "db_id": q.domain.db_id,
            "db_path": str(db_root / q.domain.db_id),
            "gold_sql": q.styles["plain"],
            "cmp_method": "bird",
        }
        meta = {"split": split, "template": q.template, "phrasing": q.phrasing, "styles": dict(q.styles)}
        messages = ({"role": "user", "content": q.prompt},)
        tasks.append(Task(f"{SQL_SUITE}/{split}/{i:05d}", source, messages, ground_truth, meta))
    return tuple(tasks)


@functools.lru_cache(maxsize=None)
def _math_tasks(split: str) -> tuple[Task, ...]:
    tasks = []
    for i, p in enumerate(math_suite.problems(split)):
        meta = {"split": split, "template": p.template, "styles": dict(p.styles)}
        messages = ({"role": "user", "content": p.prompt},)
        tasks.append(Task(f"{MATH_SUITE}/{split}/{i:05d}", MATH_SUITE, messages, p.answer_latex, meta))
    return tuple(tasks)


def load_split(name: str) -> list[Task]:
    """Tasks of one bundled split, in a fixed order.

    SQL tasks carry ``ground_truth = {"db_id", "db_path", "gold_sql", "cmp_method": "bird"}``;
    their databases are written first (see :func:`ensure_databases`). Math tasks carry the
    answer string (``"12"``, ``"-5"``, ``"\\frac{3}{4}"``). ``meta`` holds ``split``,
    ``template`` and ``styles`` (reference solution per style name).

    Args:
        name: One of :data:`SPLITS`, e.g. ``"sql_synth/train"``.

    Returns:
        A new list of tasks (the tasks themselves are shared and must not be modified).
    """
    suite, split = _split_parts(name)
    if suite == SQL_SUITE:
        return list(_sql_tasks(split, ensure_databases()))
    return list(_math_tasks(split))


def _completion(suite: str, solution: str) -> str:
    return f"```sql\n{solution}\n```" if suite == SQL_SUITE else solution


def sft_examples(name: str) -> list[dict]:
    """Supervised examples of one split: one row per (question, solution style).

    Args:
        name: One of :data:`SPLITS`.

    Returns:
        Dicts ``{"messages", "completion", "style", "task_id"}``; ``completion`` is exactly what a
        perfect model answers in that style: a ```sql block for SQL, a short worked solution
        ending in ``\\boxed{answer}`` for math.
    """
    suite, _ = _split_parts(name)
    rows = []
    for task in load_split(name):
        for style in STYLES[suite]:
            rows.append({
                "messages": [dict(m) for m in task.messages],
                "completion": _completion(suite, task.meta["styles"][style]),
                "style": style,
                "task_id": task.id,
            })
    return rows


def style_of(suite: str, completion: str) -> str:
    """Name the solution style of a completion.

    SQL: the last ```sql block is inspected (see :func:`envs.suites.sql_query.sql_style`); math:
    the opening words (see :func:`envs.suites.math_suite.math_style`).

    Args:
        suite: ``"sql_synth"`` or ``"math_synth"`` (``"sql_synth_cross"`` counts as SQL).
        completion: The model's whole answer.

    Returns:
        A name from ``STYLES[suite]``, ``"other"`` when no style fits, or ``"none"`` when the
        completion has no answer block (no ```sql block / no ``\\boxed{}``).
    """
    if suite in (SQL_SUITE, SQL_CROSS_SOURCE):
        blocks = _SQL_BLOCK.findall(completion)
        return sql_style(blocks[-1]) if blocks else "none"
    if suite == MATH_SUITE:
        return math_style(completion)
    raise ValueError(f"Unknown suite {suite!r} for style_of; use {SQL_SUITE!r} or {MATH_SUITE!r}.")


def task_style(data_source: str, completion: str, suite: str | None = None) -> str | None:
    """The style of a completion to a task, or None when its data source has no style names.

    Args:
        data_source: The task's ``data_source``; its style function is used when it is one of
            :data:`STYLE_SUITES`.
        completion: The model's whole answer.
        suite: Use this suite's style function instead (one of :data:`STYLE_SUITES`).

    Returns:
        As :func:`style_of`, or None.
    """
    suite = suite or data_source
    return style_of(suite, completion) if suite in STYLE_SUITES else None
