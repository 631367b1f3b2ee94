"""The synthetic text-to-SQL suite: templated questions with gold SQL in several styles.

Splits
------
``train`` (3000 questions) and ``test`` (300) are drawn from the 36 :data:`TRAIN_DOMAINS`
databases (six written by hand, thirty generated from word pools) with the three *train
phrasings* of every template; a question instance (database, template and slot values) lands in
exactly one of them, so no test question appears in training under any wording. ``test_cross``
(300) plays the role Spider plays against BIRD in the paper: it uses the three
:data:`CROSS_DOMAINS` databases, whose schemas (table pairs and column sets) no training database
has, and a separate *cross phrasing* of each template that no training question uses (its words
appear in other templates' train phrasings). The SQL skills are the same, so a model can transfer
what it learnt; the schema and the wording are new. With the shipped tiny model: pass@16 0.78
in-domain, 0.23 cross-domain (``README.md``, "The tiny base model").

Every question carries one solution per style of :data:`~rllib_dph.envs.suites.sql_query.SQL_STYLES`,
all returning the gold rows (same set of rows, same column order).
"""

from __future__ import annotations

import functools
import random
import sqlite3
from dataclasses import dataclass, replace
from typing import Callable, Iterator

from .sql_domains import ALL_DOMAINS, CROSS_DOMAINS, TRAIN_DOMAINS, Column, Domain, Table, build_database
from .sql_query import SQL_STYLES, Agg, Col, Cond, Join, Query, Scalar, render

SPLIT_SIZES = {"train": 3000, "test": 300, "test_cross": 300}
#: Splits of the ties family (see :func:`tie_questions`): held-out test prompts, and the pool
#: that training mixes in at a chosen share (``rllib_dph.envs.suites.load_split("sql_synth/train@ties=0.05")``).
TIE_SPLITS = ("test_ties", "train_ties")
#: Instances of the ties family held out for ``test_ties`` (one question each).
TIE_TEST_INSTANCES = 300
#: Version of the ties family's construction (:func:`_in_ties_family`): 1 kept every instance
#: whose top ties; 2 (2026-11-26) keeps those where something also ranks below the top.
TIES_FAMILY_VERSION = 2
#: Seed of the ties family's split (separate from :data:`SPLIT_SEED`).
TIE_SPLIT_SEED = 11
#: Splits of the NULL family (see :func:`null_questions`): held-out test prompts on the databases'
#: NULL copies, and the pool of ordinary family questions that training mixes in at a chosen
#: share (``load_split("sql_synth/train@nulls=0.1")``).
NULL_SPLITS = ("test_nulls", "train_nulls")
#: Instances of the NULL family held out for ``test_nulls`` (one question each).
NULL_TEST_INSTANCES = 300
#: Share of the integer values set to NULL in the NULL family's copies of the training databases.
NULL_SHARE = 0.25
#: Seed of the NULL family's split.
NULL_SPLIT_SEED = 13
#: Seed of the split sampling (instances, phrasings, order).
SPLIT_SEED = 7
INSTRUCTION = "Answer with one SQLite query in a ```sql block."

_OP_WORDS = {">": "more than", "<": "less than"}
_AGG_WORDS = {"MAX": "maximum", "MIN": "minimum", "AVG": "average", "SUM": "total"}
_ORDER_WORDS = {True: "highest", False: "lowest"}
_COUNT_WORDS = {True: "most", False: "fewest"}
_COUNT = Agg("COUNT")

#: One question instance before phrasing: the slot values and the query.
Instance = tuple[dict[str, object], Query]


@dataclass(frozen=True)
class SqlQuestion:
    """One generated question, independent of where the databases are stored.

    Attributes:
        domain: The database's domain.
        template: Name of the question template.
        phrasing: Index of the phrasing within the template's train or cross phrasings.
        question: The natural-language question.
        styles: SQL solution per style name; ``styles["plain"]`` is the gold SQL.
        approaches: For the templates of :data:`EXTREMUM_TEMPLATES`, the solution per style of
            each approach (``sql_query.EXTREMUM_APPROACHES``); ``styles`` is one of them: the
            ``order_limit`` one for ordinary questions, ``extremum`` for the ties family (where
            ``order_limit`` returns one of the tied rows and is wrong). Empty for other templates.
        ties: Whether several rows or groups tie for the highest / lowest value (the ties family).
        nulls: Whether the question is asked of the database's NULL copy (``test_nulls``), where
            only the ``count_col`` approach is right.
    """

    domain: Domain
    template: str
    phrasing: int
    question: str
    styles: dict[str, str]
    approaches: dict[str, dict[str, str]]
    ties: bool = False
    nulls: bool = False

    @property
    def db_id(self) -> str:
        """Path of the question's database file under the SQL database root."""
        return self.domain.nulls_db_id if self.nulls else self.domain.db_id

    @property
    def prompt(self) -> str:
        """The user message: compact schema, question and answer-format instruction."""
        lines = ["Schema:", *self.domain.schema_lines(), f"Question: {self.question}", INSTRUCTION]
        return "\n".join(lines)


@dataclass(frozen=True)
class Template:
    """A question template.

    Attributes:
        name: Template name (the SQL skill), stored in each task's ``meta["template"]``.
        train_phrasings: Wordings used by the train and in-domain test splits.
        cross_phrasings: Wordings used only by the cross-domain test split.
        instances: Enumerates ``(slots, query)`` pairs of a domain; the slots fill the phrasing.
    """

    name: str
    train_phrasings: tuple[str, ...]
    cross_phrasings: tuple[str, ...]
    instances: Callable[[Domain, sqlite3.Connection], Iterator[Instance]]


# ---------------------------------------------------------------------------------------------
# Slot helpers


def _table_slots(table: Table) -> dict[str, object]:
    return {"t": table.singular, "ts": table.plural}


def _join_slots(domain: Domain) -> dict[str, object]:
    return {"c": domain.child.singular, "cs": domain.child.plural,
            "p": domain.parent.singular, "ps": domain.parent.plural}


def _col(table: Table, column: Column | str) -> Col:
    return Col(table.name, column if isinstance(column, str) else column.name)


def _join(domain: Domain) -> Join:
    return Join(domain.parent.name, domain.fk, domain.parent.key)


def _thresholds(conn: sqlite3.Connection, table: Table, column: Column) -> list[int]:
    """Round thresholds spread over the column's values (two significant digits)."""
    values = sorted(v for (v,) in conn.execute(f"SELECT {column.name} FROM {table.name}"))
    picks = []
    for q in (0.15, 0.3, 0.45, 0.6, 0.75, 0.9):
        v = values[int(q * (len(values) - 1))]
        digits = max(len(str(abs(v))) - 2, 0)
        rounded = round(v, -digits)
        if rounded not in picks:
            picks.append(rounded)
    return picks


def _names(conn: sqlite3.Connection, table: Table) -> list[str]:
    return [n for (n,) in conn.execute(f"SELECT {table.name_col} FROM {table.name} ORDER BY {table.key}")]


def _both(domain: Domain) -> tuple[Table, Table]:
    return (domain.child, domain.parent)


# ---------------------------------------------------------------------------------------------
# Instance generators, one per template


def _count_cat(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    for table in _both(domain):
        cat = table.category
        for v in cat.values:
            q = Query((_COUNT,), table.name, table.key, where=(Cond(_col(table, cat), "=", v),))
            yield {**_table_slots(table), "k": cat.nl, "v": v}, q


def _count_num(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    for table in _both(domain):
        for num in table.numbers:
            for x in _thresholds(conn, table, num):
                for op, words in _OP_WORDS.items():
                    q = Query((_COUNT,), table.name, table.key, where=(Cond(_col(table, num), op, x),))
                    yield {**_table_slots(table), "n": num.nl, "op": words, "x": x}, q


def _list_cat(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    for table in _both(domain):
        cat = table.category
        for v in cat.values:
            q = Query((_col(table, table.name_col),), table.name, table.key,
                      where=(Cond(_col(table, cat), "=", v),))
            yield {**_table_slots(table), "k": cat.nl, "v": v}, q


def _list_num(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    for table in _both(domain):
        for num in table.numbers:
            for x in _thresholds(conn, table, num):
                for op, words in _OP_WORDS.items():
                    q = Query((_col(table, table.name_col), _col(table, num)), table.name, table.key,
                              where=(Cond(_col(table, num), op, x),))
                    yield {**_table_slots(table), "n": num.nl, "op": words, "x": x}, q


def _aggregate(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    for table in _both(domain):
        for num in table.numbers:
            for func, words in _AGG_WORDS.items():
                if func == "SUM" and not num.summable:
                    continue
                q = Query((Agg(func, _col(table, num)),), table.name, table.key)
                yield {**_table_slots(table), "n": num.nl, "f": words}, q


def _aggregate_cat(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    for table in _both(domain):
        cat = table.category
        for num in table.numbers:
            for func, words in _AGG_WORDS.items():
                if func == "SUM" and not num.summable:
                    continue
                for v in cat.values:
                    q = Query((Agg(func, _col(table, num)),), table.name, table.key,
                              where=(Cond(_col(table, cat), "=", v),))
                    yield {**_table_slots(table), "n": num.nl, "f": words, "k": cat.nl, "v": v}, q


def _top(domain: Domain, conn: sqlite3.Connection, counts: tuple[int, ...]) -> Iterator[Instance]:
    for table in _both(domain):
        for num in table.numbers:
            if not num.unique:
                continue
            for descending, words in _ORDER_WORDS.items():
                for m in counts:
                    q = Query((_col(table, table.name_col),), table.name, table.key,
                              order_by=_col(table, num), descending=descending, limit=m)
                    yield {**_table_slots(table), "n": num.nl, "dir": words, "m": m}, q


def _argmax(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    # Every integer column: on a column with repeated values the top may tie (the ties family).
    for table in _both(domain):
        for num in table.numbers:
            for descending, words in _ORDER_WORDS.items():
                q = Query((_col(table, table.name_col),), table.name, table.key,
                          order_by=_col(table, num), descending=descending, limit=1)
                yield {**_table_slots(table), "n": num.nl, "dir": words}, q


def _top_k(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    return _top(domain, conn, (2, 3, 4))


def _lookup(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    for table in _both(domain):
        for name in _names(conn, table):
            for column in (table.category, *table.numbers):
                q = Query((_col(table, column),), table.name, table.key,
                          where=(Cond(_col(table, table.name_col), "=", name),))
                yield {**_table_slots(table), "n": column.nl, "name": name}, q


def _group_count(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    for table in _both(domain):
        cat = _col(table, table.category)
        q = Query((cat, _COUNT), table.name, table.key, group_by=cat)
        yield {**_table_slots(table), "k": table.category.nl}, q


def _having(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    for table in _both(domain):
        cat = _col(table, table.category)
        for c in range(1, 9):
            q = Query((cat,), table.name, table.key, group_by=cat, having=(_COUNT, ">", c))
            yield {**_table_slots(table), "k": table.category.nl, "c": c}, q


def _argmax_group(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    for table in _both(domain):
        cat = _col(table, table.category)
        for descending, words in _COUNT_WORDS.items():
            q = Query((cat,), table.name, table.key, group_by=cat, order_by=_COUNT,
                      descending=descending, limit=1)
            yield {**_table_slots(table), "k": table.category.nl, "most": words}, q


def _argmax_group_filter(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    for table in _both(domain):
        cat = _col(table, table.category)
        for num in table.numbers:
            for x in _thresholds(conn, table, num):
                for op, words in _OP_WORDS.items():
                    for descending, most in _COUNT_WORDS.items():
                        q = Query((cat,), table.name, table.key, where=(Cond(_col(table, num), op, x),),
                                  group_by=cat, order_by=_COUNT, descending=descending, limit=1)
                        yield {**_table_slots(table), "k": table.category.nl, "most": most,
                               "n": num.nl, "op": words, "x": x}, q


def _distinct_num(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    for table in _both(domain):
        for num in table.numbers:
            for x in _thresholds(conn, table, num):
                for op, words in _OP_WORDS.items():
                    q = Query((_col(table, table.category),), table.name, table.key, distinct=True,
                              where=(Cond(_col(table, num), op, x),))
                    yield {**_table_slots(table), "k": table.category.nl, "n": num.nl,
                           "op": words, "x": x}, q


def _count_distinct(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    for table in _both(domain):
        for num in table.numbers:
            for x in _thresholds(conn, table, num):
                for op, words in _OP_WORDS.items():
                    q = Query((Agg("COUNT", _col(table, table.category), distinct=True),), table.name,
                              table.key, where=(Cond(_col(table, num), op, x),))
                    yield {**_table_slots(table), "k": table.category.nl, "n": num.nl,
                           "op": words, "x": x}, q


def _two_conditions(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    for table in _both(domain):
        cat = table.category
        for num in table.numbers:
            for x in _thresholds(conn, table, num):
                for op, words in _OP_WORDS.items():
                    for v in cat.values:
                        where = (Cond(_col(table, cat), "=", v), Cond(_col(table, num), op, x))
                        q = Query((_col(table, table.name_col),), table.name, table.key, where=where)
                        yield {**_table_slots(table), "k": cat.nl, "v": v, "n": num.nl,
                               "op": words, "x": x}, q


def _join_cat(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    child, parent = domain.child, domain.parent
    for v in parent.category.values:
        q = Query((_col(child, child.name_col),), child.name, child.key, join=_join(domain),
                  where=(Cond(_col(parent, parent.category), "=", v),))
        yield {**_join_slots(domain), "pk": parent.category.nl, "v": v}, q


def _join_num(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    child, parent = domain.child, domain.parent
    for num in parent.numbers:
        for x in _thresholds(conn, parent, num):
            for op, words in _OP_WORDS.items():
                q = Query((_col(child, child.name_col),), child.name, child.key, join=_join(domain),
                          where=(Cond(_col(parent, num), op, x),))
                yield {**_join_slots(domain), "pn": num.nl, "op": words, "x": x}, q


def _join_lookup(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    child, parent = domain.child, domain.parent
    for name in _names(conn, child):
        q = Query((_col(parent, parent.name_col),), child.name, child.key, join=_join(domain),
                  where=(Cond(_col(child, child.name_col), "=", name),))
        yield {**_join_slots(domain), "name": name}, q


def _join_count(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    child, parent = domain.child, domain.parent
    for name in _names(conn, parent):
        q = Query((_COUNT,), child.name, child.key, join=_join(domain),
                  where=(Cond(_col(parent, parent.name_col), "=", name),))
        yield {**_join_slots(domain), "name": name}, q


def _join_group(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    child, parent = domain.child, domain.parent
    pname = _col(parent, parent.name_col)
    q = Query((pname, _COUNT), child.name, child.key, join=_join(domain), group_by=pname)
    yield _join_slots(domain), q


def _join_argmax(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    child, parent = domain.child, domain.parent
    pname = _col(parent, parent.name_col)
    for descending, words in _COUNT_WORDS.items():
        q = Query((pname,), child.name, child.key, join=_join(domain), group_by=pname,
                  order_by=_COUNT, descending=descending, limit=1)
        yield {**_join_slots(domain), "most": words}, q


TEMPLATES: tuple[Template, ...] = (
    Template("count_filter",
             ("How many {ts} have {k} {v}?", "Count the {ts} whose {k} is {v}.",
              "Report the number of {ts} whose {k} is {v}."),
             ("What is the number of {ts} with {k} equal to {v}?",), _count_cat),
    Template("count_compare",
             ("How many {ts} have {n} {op} {x}?", "Count the {ts} with {n} {op} {x}.",
              "Compute how many {ts} have {n} {op} {x}."),
             ("What is the number of {ts} whose {n} is {op} {x}?",), _count_num),
    Template("list_filter",
             ("List the names of {ts} whose {k} is {v}.", "Which {ts} have {k} {v}? Give their names.",
              "Find the names of the {ts} that have {k} equal to {v}."),
             ("Show the name of every {t} with {k} equal to {v}.",), _list_cat),
    Template("list_compare",
             ("Give the name and {n} of each {t} with {n} {op} {x}.",
              "Which {ts} have {n} {op} {x}? Show their names and {n}.",
              "Show the name and {n} of every {t} whose {n} is {op} {x}."),
             ("For every {t} whose {n} is {op} {x}, return its name and {n}.",), _list_num),
    Template("aggregate",
             ("What is the {f} {n} of all {ts}?", "Find the {f} {n} over all {ts}.",
              "Report the {f} {n} of every {t}."),
             ("Compute the {f} {n} across every {t}.",), _aggregate),
    Template("aggregate_filter",
             ("What is the {f} {n} of {ts} whose {k} is {v}?",
              "Among {ts} with {k} {v}, what is the {f} {n}?",
              "Compute the {f} {n} of the {ts} whose {k} is {v}."),
             ("Report the {f} {n} for the {ts} that have {k} equal to {v}.",), _aggregate_cat),
    Template("argmax",
             ("Which {t} has the {dir} {n}?", "What is the name of the {t} with the {dir} {n}?",
              "Show the name of the {t} with the {dir} {n} of all."),
             ("Find the {t} whose {n} is the {dir} of all.",), _argmax),
    Template("top_k",
             ("List the names of the {m} {ts} with the {dir} {n}.",
              "Which {m} {ts} have the {dir} {n}? Give their names.",
              "Find the {m} {ts} with the {dir} {n} values and give their names."),
             ("Show the names of {m} {ts} that have the {dir} {n} values.",), _top_k),
    Template("lookup",
             ("What is the {n} of the {t} named {name}?", "Give the {n} of {t} {name}.",
              "Report the {n} of the {t} called {name}."),
             ("Find the {n} for the {t} called {name}.",), _lookup),
    Template("group_count",
             ("For each {k}, how many {ts} are there?", "Count the {ts} per {k}.",
              "Report every {k} together with its count of {ts}."),
             ("Show each {k} together with the number of {ts} that have it.",), _group_count),
    Template("group_having",
             ("Which {k} values have more than {c} {ts}?", "List each {k} shared by more than {c} {ts}.",
              "Show the {k} values shared by over {c} {ts}."),
             ("Find the {k} values that occur for over {c} {ts}.",), _having),
    Template("group_argmax",
             ("Which {k} has the {most} {ts}?", "Name the {k} with the {most} {ts}.",
              "Report the {k} that occurs for the {most} {ts}."),
             ("Find the {k} shared by the {most} {ts}.",), _argmax_group),
    Template("group_argmax_filter",
             ("Among {ts} with {n} {op} {x}, which {k} has the {most} of them?",
              "Which {k} is shared by the {most} {ts} with {n} {op} {x}?",
              "Name the {k} that occurs for the {most} {ts} whose {n} is {op} {x}."),
             ("Find the {k} of the {most} {ts} that have {n} {op} {x}.",), _argmax_group_filter),
    Template("distinct",
             ("List the distinct {k} values of {ts} with {n} {op} {x}.",
              "Which different {k} values appear among {ts} with {n} {op} {x}?",
              "Find the unique {k} values of {ts} that have {n} {op} {x}."),
             ("Show the unique {k} of {ts} whose {n} is {op} {x}.",), _distinct_num),
    Template("count_distinct",
             ("How many different {k} values do {ts} with {n} {op} {x} have?",
              "Count the distinct {k} values among {ts} with {n} {op} {x}.",
              "Compute the number of unique {k} values among {ts} with {n} {op} {x}."),
             ("What is the number of unique {k} values of {ts} whose {n} is {op} {x}?",), _count_distinct),
    Template("two_filters",
             ("List the names of {ts} with {k} {v} and {n} {op} {x}.",
              "Which {ts} have {k} {v} and {n} {op} {x}? Give their names.",
              "Find the names of {ts} that have {k} equal to {v} and {n} {op} {x}."),
             ("Show the name of each {t} whose {k} is {v} and whose {n} is {op} {x}.",), _two_conditions),
    Template("join_filter",
             ("List the names of {cs} whose {p} has {pk} {v}.",
              "Which {cs} belong to a {p} with {pk} {v}? Give their names.",
              "Find the names of {cs} linked to a {p} with {pk} equal to {v}."),
             ("Show the name of every {c} linked to a {p} whose {pk} is {v}.",), _join_cat),
    Template("join_compare",
             ("List the names of {cs} whose {p} has {pn} {op} {x}.",
              "Which {cs} belong to a {p} with {pn} {op} {x}? Give their names.",
              "Find the names of {cs} linked to a {p} that has {pn} {op} {x}."),
             ("Show the name of every {c} linked to a {p} whose {pn} is {op} {x}.",), _join_num),
    Template("join_lookup",
             ("What is the name of the {p} of the {c} named {name}?",
              "Which {p} does the {c} {name} belong to?",
              "Report the {p} of the {c} called {name}."),
             ("Find the {p} linked to the {c} called {name}.",), _join_lookup),
    Template("join_count",
             ("How many {cs} belong to the {p} named {name}?", "Count the {cs} of {p} {name}.",
              "Compute the number of {cs} of the {p} called {name}."),
             ("What is the number of {cs} linked to the {p} called {name}?",), _join_count),
    Template("join_group",
             ("For each {p}, give its name and the number of {cs}.",
              "How many {cs} does each {p} have? Show the {p} name and the count.",
              "Report every {p} name and how many {cs} are linked to it."),
             ("Show every {p} name together with its count of {cs}.",), _join_group),
    Template("join_argmax",
             ("Which {p} has the {most} {cs}? Give its name.", "Name the {p} with the {most} {cs}.",
              "Show the name of the {p} linked to the {most} {cs}."),
             ("Find the {p} linked to the {most} {cs}.",), _join_argmax),
)


def _count_known(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    for table in _both(domain):
        for num in table.numbers:
            q = Query((Agg("COUNT", _col(table, num)),), table.name, table.key)
            yield {**_table_slots(table), "n": num.nl}, q


def _count_known_filter(domain: Domain, conn: sqlite3.Connection) -> Iterator[Instance]:
    for table in _both(domain):
        cat = table.category
        for num in table.numbers:
            for v in cat.values:
                q = Query((Agg("COUNT", _col(table, num)),), table.name, table.key,
                          where=(Cond(_col(table, cat), "=", v),))
                yield {**_table_slots(table), "n": num.nl, "k": cat.nl, "v": v}, q


#: The NULL family's templates: count the rows whose integer column holds a value. Their
#: instances are written with ``COUNT(col)`` (the ``count_col`` approach); ``count_star_form``
#: gives the ``count_star`` one. Not part of :data:`TEMPLATES`, so the other splits are as they were.
NULL_TEMPLATES: tuple[Template, ...] = (
    Template("count_known",
             ("How many {ts} have a recorded {n}?", "Count the {ts} whose {n} is recorded.",
              "Report the number of {ts} with a known {n}."),
             ("What is the number of {ts} that have a value for {n}?",), _count_known),
    Template("count_known_filter",
             ("How many {ts} with {k} {v} have a recorded {n}?",
              "Count the {ts} with {k} {v} whose {n} is recorded.",
              "Report the number of {ts} with {k} {v} and a known {n}."),
             ("What is the number of {ts} with {k} equal to {v} that have a value for {n}?",),
             _count_known_filter),
)


def count_star_form(query: Query) -> Query:
    """The ``count_star`` approach of a NULL-family query: ``COUNT(col)`` becomes ``COUNT(*)``."""
    return replace(query, select=(_COUNT,))


#: Most instances of one template kept per domain, so that no skill dominates a split.
MAX_PER_TEMPLATE = 45
#: Templates that ask for the row or group with the highest / lowest value: their questions
#: carry both approaches (``SqlQuestion.approaches``), and their instances whose top ties make
#: up the ties family.
EXTREMUM_TEMPLATES = ("argmax", "group_argmax", "join_argmax", "group_argmax_filter")


def extremum_form(query: Query) -> Query:
    """The ``extremum`` approach of an ``order_limit`` query (``ORDER BY e LIMIT 1``).

    ``ORDER BY col DESC LIMIT 1`` becomes ``WHERE col = (SELECT MAX(col) FROM ... WHERE ...)``;
    ``GROUP BY g ORDER BY COUNT(*) DESC LIMIT 1`` becomes ``GROUP BY g HAVING COUNT(*) =
    (SELECT COUNT(*) FROM ... GROUP BY g ORDER BY COUNT(*) DESC LIMIT 1)``. Both return every
    row or group tied for the top.
    """
    base = Query(query.select, query.table, query.key, query.join, query.where, query.distinct, query.group_by)
    if isinstance(query.order_by, Col):
        best = Query((Agg("MAX" if query.descending else "MIN", query.order_by),), query.table, query.key,
                     query.join, query.where)
        return replace(base, where=query.where + (Cond(query.order_by, "=", Scalar(best)),))
    best = replace(query, select=(query.order_by,))
    return replace(base, having=(query.order_by, "=", Scalar(best)))


# ---------------------------------------------------------------------------------------------
# Split construction


def _top_ties(conn: sqlite3.Connection, query: Query) -> bool:
    """Whether rows tie at a query's ``LIMIT`` (the last row kept and the first one cut)."""
    if query.limit is None:
        return False
    ranking = query.with_select((query.order_by,), query.limit + 1)
    keys = [r[0] for r in conn.execute(render(ranking, "plain"))]
    return len(keys) > query.limit and keys[query.limit - 1] == keys[query.limit]


def _needs_ranking(conn: sqlite3.Connection, query: Query) -> bool:
    """Whether a ties question needs a ranking: some candidate falls below the tied top.

    The candidates are the rows or groups the question ranks (``query`` without its ``ORDER BY``
    and ``LIMIT``). When every candidate ties, listing them without ranking returns the gold rows
    too (under set comparison), so such a question cannot tell a policy that keeps every tied row
    from one that never ranked. Family version 1 kept them (84 of ``test_ties``' 300 questions);
    found on 2026-11-26 in SmolLM2-135M's correct answers (docs/collapse.md).
    """
    candidates = replace(query, order_by=None, descending=False, limit=None)
    rows = set(conn.execute(render(candidates, "plain")))
    return rows != set(conn.execute(render(extremum_form(query), "plain")))


def _in_ties_family(conn: sqlite3.Connection, query: Query) -> bool:
    """Whether an instance of :data:`EXTREMUM_TEMPLATES` belongs to the ties family: its top
    ties (:func:`_top_ties`) and something ranks below it (:func:`_needs_ranking`)."""
    return _top_ties(conn, query) and _needs_ranking(conn, query)


def _informative(conn: sqlite3.Connection, query: Query) -> bool:
    """Whether the gold result is worth asking for: non-empty, not zero, no ORDER BY tie at LIMIT."""
    rows = conn.execute(render(query, "plain")).fetchall()
    if not rows or rows in ([(0,)], [(None,)]):
        return False
    return not _top_ties(conn, query)


@functools.lru_cache(maxsize=None)
def database_bytes(domain: Domain, null_share: float = 0.0) -> bytes:
    """The file content of the domain's database (its NULL copy with ``null_share`` > 0)."""
    conn = build_database(domain, null_share)
    try:
        return conn.serialize()
    finally:
        conn.close()


def _domain_instances(domain: Domain, rng: random.Random, ties: bool = False) -> list[tuple[Template, dict, Query]]:
    """Instances of every template on a domain, at most MAX_PER_TEMPLATE of each.

    Args:
        domain: The database.
        rng: Shuffles each template's instances before the cap.
        ties: False: the informative instances (:func:`_informative`); True: the instances of
            :data:`EXTREMUM_TEMPLATES` in the ties family (:func:`_in_ties_family`).
    """
    conn = sqlite3.connect(":memory:")
    try:
        conn.deserialize(database_bytes(domain))
        kept = []
        for template in TEMPLATES:
            if ties and template.name not in EXTREMUM_TEMPLATES:
                continue
            keep = (lambda q: _in_ties_family(conn, q)) if ties else (lambda q: _informative(conn, q))
            good = [(slots, q) for slots, q in template.instances(domain, conn) if keep(q)]
            rng.shuffle(good)
            kept += [(template, slots, q) for slots, q in good[:MAX_PER_TEMPLATE]]
        return kept
    finally:
        conn.close()


def _renderings(query: Query) -> dict[str, str]:
    return {style: render(query, style) for style in SQL_STYLES}


def _approaches(template: Template, query: Query) -> dict[str, dict[str, str]]:
    """The renderings of each approach of a two-approach template's instance, the fragile one
    first (``order_limit`` / ``extremum``, ``count_star`` / ``count_col``); {} for other templates."""
    if template.name in EXTREMUM_TEMPLATES:
        return {"order_limit": _renderings(query), "extremum": _renderings(extremum_form(query))}
    if template in NULL_TEMPLATES:
        return {"count_star": _renderings(count_star_form(query)), "count_col": _renderings(query)}
    return {}


def _phrase(domain: Domain, template: Template, slots: dict, query: Query, index: int,
            cross: bool, ties: bool = False, nulls: bool = False) -> SqlQuestion:
    """Word an instance with phrasing ``index`` (taken modulo the number of phrasings).

    A two-approach instance's gold styles are its robust approach's in its family's own splits
    (``ties``, ``nulls``: only that one is right there) and its fragile approach's elsewhere."""
    phrasings = template.cross_phrasings if cross else template.train_phrasings
    index = index % len(phrasings)
    approaches = _approaches(template, query)
    if approaches:
        fragile, robust = approaches
        styles = approaches[robust if ties or nulls else fragile]
    else:
        styles = _renderings(query)
    return SqlQuestion(domain, template.name, index, phrasings[index].format(**slots), styles, approaches,
                       ties, nulls)


def _split_questions(pool: list, test_size: int, split: str, cross: bool, ties: bool,
                     rng: random.Random) -> tuple[SqlQuestion, ...]:
    """A test split takes the first ``test_size`` instances (cycling through the phrasings);
    training asks each remaining instance under every train phrasing, then keeps a sample."""
    if split.startswith("test"):
        return tuple(_phrase(d, t, s, q, i, cross, ties) for i, (d, t, s, q) in enumerate(pool[:test_size]))
    phrased = [(d, t, s, q, i) for d, t, s, q in pool[test_size:] for i in range(len(t.train_phrasings))]
    rng.shuffle(phrased)
    return tuple(_phrase(d, t, s, q, i, cross, ties) for d, t, s, q, i in phrased[: SPLIT_SIZES.get(split)])


@functools.lru_cache(maxsize=None)
def questions(split: str) -> tuple[SqlQuestion, ...]:
    """All questions of a split, in their fixed order.

    ``train``, ``test`` and ``test_cross`` hold no question whose top ties; the ties family
    (:func:`_in_ties_family`) is split apart, from its own seed, into ``test_ties`` (:data:`TIE_TEST_INSTANCES` instances, one
    wording each) and ``train_ties`` (every other tie instance of the training databases under
    every train phrasing), so adding it left the other splits as they were.

    Args:
        split: ``"train"``, ``"test"``, ``"test_cross"``, ``"test_ties"`` or ``"train_ties"``.

    Returns:
        The questions; the same objects on every call within a process.
    """
    if split not in (*SPLIT_SIZES, *TIE_SPLITS, *NULL_SPLITS):
        raise ValueError(f"Unknown SQL split {split!r}; use one of {(*SPLIT_SIZES, *TIE_SPLITS, *NULL_SPLITS)}.")
    if split in NULL_SPLITS:
        return null_questions(split)
    ties = split in TIE_SPLITS
    rng = random.Random(TIE_SPLIT_SEED if ties else SPLIT_SEED)
    cross = split == "test_cross"
    pool = []
    for domain in CROSS_DOMAINS if cross else TRAIN_DOMAINS:
        pool += [(domain, *item) for item in _domain_instances(domain, rng, ties)]
    rng.shuffle(pool)
    test_size = TIE_TEST_INSTANCES if ties else SPLIT_SIZES["test"]
    return _split_questions(pool, test_size, split, cross, ties, rng)


def _null_instances(domain: Domain) -> list[tuple[Template, dict, Query, bool]]:
    """The NULL family's instances on a training domain whose count is not 0, each with whether
    its two approaches count differently on the domain's NULL copy (it may then be a test question)."""
    conn, nulls = sqlite3.connect(":memory:"), sqlite3.connect(":memory:")
    try:
        conn.deserialize(database_bytes(domain))
        nulls.deserialize(database_bytes(domain, NULL_SHARE))
        kept = []
        for template in NULL_TEMPLATES:
            for slots, query in template.instances(domain, conn):
                if not _informative(conn, query):
                    continue
                (known,), = nulls.execute(render(query, "plain"))
                (rows,), = nulls.execute(render(count_star_form(query), "plain"))
                kept.append((template, slots, query, 0 < known != rows))
        return kept
    finally:
        conn.close()
        nulls.close()


@functools.lru_cache(maxsize=None)
def null_questions(split: str) -> tuple[SqlQuestion, ...]:
    """The NULL family's questions (``test_nulls`` or ``train_nulls``), in their fixed order.

    Every instance of :data:`NULL_TEMPLATES` on the training databases lands in one split, from
    :data:`NULL_SPLIT_SEED`: ``test_nulls`` takes the first :data:`NULL_TEST_INSTANCES` (one wording
    each) whose column is NULL in some of the counted rows of the NULL copy, and asks them of that
    copy, where only ``count_col`` is right; ``train_nulls`` asks every other instance under
    every train phrasing of the domain's own database, where nothing is NULL and both approaches
    are right (the ordinary family questions that training mixes in). The wording never tells
    the two apart.
    """
    rng = random.Random(NULL_SPLIT_SEED)
    pool = [(domain, *item) for domain in TRAIN_DOMAINS for item in _null_instances(domain)]
    rng.shuffle(pool)
    test, rest = [], []
    for domain, template, slots, query, differs in pool:
        held_out = differs and len(test) < NULL_TEST_INSTANCES
        (test if held_out else rest).append((domain, template, slots, query))
    if split == "test_nulls":
        return tuple(_phrase(d, t, s, q, i, cross=False, nulls=True) for i, (d, t, s, q) in enumerate(test))
    phrased = [(d, t, s, q, i) for d, t, s, q in rest for i in range(len(t.train_phrasings))]
    rng.shuffle(phrased)
    return tuple(_phrase(d, t, s, q, i, cross=False) for d, t, s, q, i in phrased)


def database_files() -> dict[str, bytes]:
    """File bytes of every suite database, keyed by ``db_id``: each domain's database and the
    NULL copy of each training database (``Domain.nulls_db_id``)."""
    files = {domain.db_id: database_bytes(domain) for domain in ALL_DOMAINS}
    files.update({domain.nulls_db_id: database_bytes(domain, NULL_SHARE) for domain in TRAIN_DOMAINS})
    return files
