"""Bundled synthetic task suites: text-to-SQL and math, generated deterministically offline.

Splits (see :data:`SPLITS`):

==========================  =====  ===========================================================
name                        size   content
==========================  =====  ===========================================================
``sql_synth/train``         3000   36 databases (6 written, 30 generated), 3 train phrasings
``sql_synth/test``          300    same databases and phrasings, question instances unseen
``sql_synth/test_cross``    300    3 unseen schemas, unseen phrasings of the same SQL skills
``sql_synth/test_ties``     300    the ties family: highest / lowest questions whose top ties
``sql_synth/train_ties``    1341   the ties family's training pool (other instances)
``sql_synth/test_nulls``    300    the NULL family: "how many X have a recorded Y", NULLs in Y
``sql_synth/train_nulls``   972    the NULL family's ordinary questions (nothing NULL)
``math_synth/train``        3000   11 word-problem generators
``math_synth/test``         300    same generators, question texts unseen in train
==========================  =====  ===========================================================

Every question has one reference solution per style (:data:`STYLES`); :func:`style_of` names
the style of any completion, so that the diversity of a policy's answers can be measured. The
SQL databases are written under :func:`sql_db_root` on first use.

**The ties family**: questions that ask for the row or group with the highest or
lowest value (``sql_suite.EXTREMUM_TEMPLATES``) can be answered by two approaches,
``order_limit`` (``ORDER BY ... LIMIT 1``) and ``extremum`` (``= (SELECT MAX(...) ...)``). On
the ordinary splits nothing ties and both are right; in ``test_ties`` and ``train_ties`` the top
ties, something ranks below it, and only ``extremum`` returns every tied row (family version 2,
:data:`sql_suite.TIES_FAMILY_VERSION`: version 1 also kept questions where every candidate ties,
which listing the candidates without ranking answers). The wording does not tell the two apart, only
the data do. The SFT corpus answers :data:`EXTREMUM_SFT_SHARE` of the ordinary questions of
those templates with ``extremum``, so the base model writes it as a minority. The solution
style of a ties-family completion is its approach (data source :data:`SQL_TIES_SOURCE`).
Training mixes the family in at a chosen share with ``"sql_synth/train@ties=0.05"``: the 3000
``train`` questions and ``round(3000 * share / (1 - share))`` ``train_ties`` questions, in a
fixed shuffled order (so 5 % of the prompts are ties questions).

**The NULL family** (docs/collapse.md): questions that count the rows with a known
value of a column ("How many singers have a recorded age?", ``sql_suite.NULL_TEMPLATES``) can be
answered by two approaches that differ by one token, ``count_star`` (``COUNT(*)``) and
``count_col`` (``COUNT(age)``). ``train_nulls`` asks them of the training databases, where no
value is NULL and both are right; ``test_nulls`` asks held-out instances of the databases' NULL
copies (a quarter of their integer values NULL, ``sql_suite.NULL_SHARE``), where only
``count_col`` is right. The bundled tiny model was not trained on the family;
``tiny-sql-math-nulls`` is (``rllib_dph.models.build.tiny``), answering :data:`NULL_SFT_SHARE` of its
questions with ``count_col``. ``"sql_synth/train@nulls=0.1"`` mixes ``train_nulls`` into training
as ``@ties`` does ``train_ties``. The solution style of a NULL-family completion is its approach
(data source :data:`SQL_NULLS_SOURCE`).

Example::

    from rllib_dph.envs.suites import load_split, sft_examples, style_of
    tasks = load_split("sql_synth/test")
    rows = sft_examples("math_synth/train")   # one row per (question, style)
    style_of("sql_synth", "```sql\\nWITH t AS (...) SELECT ...\\n```")  # -> "cte"
"""

from __future__ import annotations

import functools
import hashlib
import pathlib
import random
import re

from rllib_dph.files import write_bytes_atomic

from ..base import Task
from . import math_suite, sql_suite
from .math_suite import MATH_STYLES, math_style
from .sql_query import EXTREMUM_APPROACHES, NULL_APPROACHES, SQL_STYLES, count_approach, sql_approach, sql_style
from .storage import sql_db_root, suite_root

__all__ = [
    "SPLITS", "STYLES", "STYLE_SUITES", "SQL_SUITE", "MATH_SUITE", "load_split", "sft_examples", "style_of",
    "task_style", "suite_root", "sql_db_root", "ensure_databases",
]

SQL_SUITE = "sql_synth"
MATH_SUITE = "math_synth"
#: Data source of the cross-domain SQL split (the role Spider plays against BIRD).
SQL_CROSS_SOURCE = "sql_synth_cross"
#: Data source of the ties family; its "styles" are the approaches (``order_limit``, ``extremum``).
SQL_TIES_SOURCE = "sql_synth_ties"
#: Share of the ordinary questions of ``sql_suite.EXTREMUM_TEMPLATES`` that the SFT corpus
#: answers with the ``extremum`` approach (drawn per question and style, deterministically).
EXTREMUM_SFT_SHARE = 0.15
#: Data source of the NULL family; its "styles" are the approaches (``count_star``, ``count_col``).
SQL_NULLS_SOURCE = "sql_synth_nulls"
#: Share of the NULL family's ordinary questions that the SFT corpus of ``tiny-sql-math-nulls``
#: answers with the ``count_col`` approach (drawn per question and style, deterministically).
NULL_SFT_SHARE = 0.2
#: The robust approach of each two-approach family and the share of the SFT answers written with it.
ROBUST_SFT_SHARE = {"extremum": EXTREMUM_SFT_SHARE, "count_col": NULL_SFT_SHARE}

SPLITS: tuple[str, ...] = (
    "sql_synth/train", "sql_synth/test", "sql_synth/test_cross", "sql_synth/test_ties",
    "sql_synth/train_ties", "sql_synth/test_nulls", "sql_synth/train_nulls", "math_synth/train", "math_synth/test",
)
#: ``"sql_synth/train@ties=<share>"`` / ``"sql_synth/train@nulls=<share>"``: the train split with
#: a family's training pool (``train_ties``, ``train_nulls``) mixed in.
FAMILY_MIX = re.compile(r"^sql_synth/train@(?P<family>ties|nulls)=(?P<share>[0-9.eE+-]+)$")
#: Solution style names per suite; :func:`style_of` also returns "other" and "none".
STYLES: dict[str, tuple[str, ...]] = {SQL_SUITE: SQL_STYLES, MATH_SUITE: MATH_STYLES,
                                      SQL_TIES_SOURCE: EXTREMUM_APPROACHES, SQL_NULLS_SOURCE: NULL_APPROACHES}
#: Data sources whose completions :func:`style_of` names a style for.
STYLE_SUITES: tuple[str, ...] = (SQL_SUITE, SQL_CROSS_SOURCE, SQL_TIES_SOURCE, SQL_NULLS_SOURCE, MATH_SUITE)
#: How the approach of each two-approach family's completions is named.
_APPROACH_OF = {SQL_TIES_SOURCE: sql_approach, SQL_NULLS_SOURCE: count_approach}

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


def is_split_name(name: str) -> bool:
    """Whether ``name`` is a bundled split (:data:`SPLITS`) or a family mix (:data:`FAMILY_MIX`)."""
    return name in SPLITS or bool(FAMILY_MIX.match(name))


def _split_parts(name: str) -> tuple[str, str]:
    if not is_split_name(name):
        raise ValueError(f"Unknown suite split {name!r}; valid names are: {', '.join(SPLITS)}, "
                         "or sql_synth/train@ties=<share> / sql_synth/train@nulls=<share> (e.g. 0.05).")
    suite, split = name.split("/")
    return suite, split


def _sql_source(split: str) -> str:
    if split == "test_cross":
        return SQL_CROSS_SOURCE
    if split in sql_suite.NULL_SPLITS:
        return SQL_NULLS_SOURCE
    return SQL_TIES_SOURCE if split in sql_suite.TIE_SPLITS else SQL_SUITE


@functools.lru_cache(maxsize=None)
def _sql_tasks(split: str, db_root: pathlib.Path) -> tuple[Task, ...]:
    tasks = []
    for i, q in enumerate(sql_suite.questions(split)):
        ground_truth = {
            "db_id": q.db_id,
            "db_path": str(db_root / q.db_id),
            "gold_sql": q.styles["plain"],
            "cmp_method": "bird",
        }
        meta = {"split": split, "template": q.template, "phrasing": q.phrasing, "styles": dict(q.styles),
                "approaches": {a: dict(v) for a, v in q.approaches.items()}, "ties": q.ties, "nulls": q.nulls}
        messages = ({"role": "user", "content": q.prompt},)
        tasks.append(Task(f"{SQL_SUITE}/{split}/{i:05d}", _sql_source(split), messages, ground_truth, meta))
    return tuple(tasks)


def _family_mix(name: str, db_root: pathlib.Path) -> list[Task]:
    """The tasks of ``"sql_synth/train@<family>=<share>"`` (see the module docstring)."""
    family, text = FAMILY_MIX.match(name).group("family", "share")
    try:
        share = float(text)
    except ValueError:
        share = float("nan")
    if not 0 <= share < 1:
        raise ValueError(f"{name!r}: the {family} share {text!r} must be a number in [0, 1), e.g. "
                         f"sql_synth/train@{family}=0.05 for 5 % {family} questions.")
    train, pool = _sql_tasks("train", db_root), _sql_tasks(f"train_{family}", db_root)
    count = round(len(train) * share / (1 - share))
    if count > len(pool):
        most = len(pool) / (len(train) + len(pool))
        raise ValueError(f"{name!r} needs {count} {family} questions but train_{family} has {len(pool)}; "
                         f"use a share of at most {most:.3f}.")
    mixed = [*train, *pool[:count]]
    random.Random(sql_suite.TIE_SPLIT_SEED).shuffle(mixed)
    return mixed


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
    ``template`` and ``styles`` (reference solution per style name); SQL tasks also ``approaches``
    (the solution per style of each approach, for ``sql_suite.EXTREMUM_TEMPLATES``) and ``ties``.

    Args:
        name: One of :data:`SPLITS`, e.g. ``"sql_synth/train"``.

    Returns:
        A new list of tasks (the tasks themselves are shared and must not be modified).
    """
    suite, split = _split_parts(name)
    if suite == SQL_SUITE and FAMILY_MIX.match(name):
        return _family_mix(name, ensure_databases())
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
        ending in ``\\boxed{answer}`` for math. A SQL question with two approaches is answered
        with its robust one (``extremum``, ``count_col``) in its family's share of its styles
        (:data:`ROBUST_SFT_SHARE`, :func:`_sft_solution`).
    """
    suite, _ = _split_parts(name)
    rows = []
    for task in load_split(name):
        for style in STYLES[suite]:
            rows.append({
                "messages": [dict(m) for m in task.messages],
                "completion": _completion(suite, _sft_solution(task, style)),
                "style": style,
                "task_id": task.id,
            })
    return rows


def _sft_solution(task: Task, style: str) -> str:
    """The SFT answer of a task in one style: for the (question, style) pairs of an ordinary
    two-approach question, its robust approach for a fixed draw of :data:`ROBUST_SFT_SHARE` of
    them and its fragile one otherwise; else the gold."""
    approaches = task.meta.get("approaches")
    if not approaches or task.meta.get("ties") or task.meta.get("nulls"):
        return task.meta["styles"][style]
    fragile, robust = approaches
    draw = int(hashlib.sha256(f"{task.id}|{style}".encode()).hexdigest()[:8], 16) / 16**8
    return approaches[robust if draw < ROBUST_SFT_SHARE[robust] else fragile][style]


def style_of(suite: str, completion: str) -> str:
    """Name the solution style of a completion.

    SQL: the last ```sql block is inspected (see :func:`rllib_dph.envs.suites.sql_query.sql_style`); math:
    the opening words (see :func:`rllib_dph.envs.suites.math_suite.math_style`).

    Args:
        suite: ``"sql_synth"`` or ``"math_synth"`` (``"sql_synth_cross"`` counts as SQL);
            ``"sql_synth_ties"`` names the approach (``order_limit``, ``extremum``, ``other``),
            ``"sql_synth_nulls"`` too (``count_star``, ``count_col``, ``other``).
        completion: The model's whole answer.

    Returns:
        A name from ``STYLES[suite]``, ``"other"`` when no style fits, or ``"none"`` when the
        completion has no answer block (no ```sql block / no ``\\boxed{}``).
    """
    if suite in (SQL_SUITE, SQL_CROSS_SOURCE, SQL_TIES_SOURCE, SQL_NULLS_SOURCE):
        blocks = _SQL_BLOCK.findall(completion)
        if not blocks:
            return "none"
        return _APPROACH_OF.get(suite, sql_style)(blocks[-1])
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
