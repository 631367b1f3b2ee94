"""A small query representation rendered in several equivalent SQL surface styles.

A :class:`Query` describes one SELECT over a table (optionally joined to its parent). Each
style renders the same query differently, and every rendering returns the same set of rows with
the same column order:

==========  =========================================================  ==========================
style       shape                                                       recognised by
==========  =========================================================  ==========================
plain       ``SELECT name FROM singer WHERE country = 'Spain'``          none of the markers below
alias       ``SELECT T1.name FROM singer AS T1 WHERE T1.country = ...``  ``T1.`` (from the 1st item)
subquery    ``SELECT name FROM (SELECT name, country FROM singer ...)``  ``FROM (SELECT``
cte         ``WITH t AS (SELECT ...) SELECT name FROM t``                starts with ``WITH``
negated     ``SELECT name FROM singer WHERE NOT country <> 'Spain'``     ``WHERE NOT``
==========  =========================================================  ==========================

A query shows exactly one marker in its own style; one that shows several mixes styles and is
named ``"other"`` by :func:`sql_style`.

Apart from its surface style, a query that picks the row or group with the highest or lowest
value takes one of two *approaches* (:data:`EXTREMUM_APPROACHES`, named by :func:`sql_approach`):
``order_limit`` sorts and keeps the first row (``ORDER BY sales DESC LIMIT 1``) and returns one
row even when several tie for the top; ``extremum`` compares with the extreme value
(``WHERE sales = (SELECT MAX(sales) FROM singer)``) and returns every tied row. Where nothing
ties they return the same rows; where something does, only ``extremum`` answers the question.

A query that counts the rows with a known value of a column (the NULL family) takes one of two
approaches too (:data:`NULL_APPROACHES`, named by :func:`count_approach`): ``count_star`` counts
rows (``COUNT(*)``, or the key in the alias style) and ``count_col`` counts the column's values
(``COUNT(age)``), which skips NULLs. Where the column has no NULL they return the same count;
where it has, only ``count_col`` answers the question.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Union

#: SQL solution styles, in a fixed order.
SQL_STYLES: tuple[str, ...] = ("plain", "alias", "subquery", "cte", "negated")
#: Name of the derived table in the CTE style.
CTE_NAME = "t"

_NEGATE = {"=": "<>", "<>": "=", ">": "<=", "<=": ">", "<": ">=", ">=": "<"}
_MARKERS = (
    ("cte", re.compile(r"^WITH\b", re.IGNORECASE)),
    ("subquery", re.compile(r"\bFROM\s*\(\s*SELECT\b", re.IGNORECASE)),
    ("alias", re.compile(r"\bT1\s*\.", re.IGNORECASE)),
    ("negated", re.compile(r"\bWHERE\s+NOT\b", re.IGNORECASE)),
)
_STARTS_WITH_SELECT = re.compile(r"^SELECT\b", re.IGNORECASE)
#: Ways to pick the rows with the highest / lowest value (see the module docstring).
EXTREMUM_APPROACHES: tuple[str, ...] = ("order_limit", "extremum")
_COMPARES_WITH_SUBQUERY = re.compile(r"(?:[=<>]|\bIN)\s*\(\s*SELECT\b", re.IGNORECASE)
_LIMIT_ONE = re.compile(r"\bLIMIT\s+1\b", re.IGNORECASE)
#: Ways to count the rows with a known value of a column (see the module docstring).
NULL_APPROACHES: tuple[str, ...] = ("count_star", "count_col")
_COUNT_ARGUMENT = re.compile(r"\bCOUNT\s*\(\s*([^()]*?)\s*\)", re.IGNORECASE)
_KEY_COLUMN = re.compile(r"^(?:\w+\.)?\w+_id$", re.IGNORECASE)
_IS_NOT_NULL = re.compile(r"\bIS\s+NOT\s+NULL\b", re.IGNORECASE)


@dataclass(frozen=True)
class Col:
    """A column of a table."""

    table: str
    name: str


@dataclass(frozen=True)
class Agg:
    """An aggregate: ``func(col)``, ``func(DISTINCT col)`` or, with ``col=None``, ``COUNT(*)``."""

    func: str
    col: Col | None = None
    distinct: bool = False


Expr = Union[Col, Agg]


@dataclass(frozen=True)
class Scalar:
    """A scalar sub-query used as a comparison value, e.g. ``(SELECT MAX(sales) FROM singer)``.

    ``query`` is rendered in the plain style whatever the outer query's style, so that only the
    outer query shows its style's marker.
    """

    query: "Query"


@dataclass(frozen=True)
class Cond:
    """A comparison ``col op value`` (value an int, a string literal or a :class:`Scalar`)."""

    col: Col
    op: str
    value: "int | str | Scalar"


@dataclass(frozen=True)
class Join:
    """``JOIN table ON <main table>.fk = table.key``."""

    table: str
    fk: str
    key: str


@dataclass(frozen=True)
class Query:
    """One SELECT statement in a style-neutral form.

    Attributes:
        select: Output expressions, in order.
        table: Main table of the FROM clause.
        key: Primary key of the main table (never NULL; used by styles that need a column).
        join: Optional join to the parent table.
        where: Conditions joined by AND.
        distinct: SELECT DISTINCT.
        group_by: Optional grouping column.
        having: Optional ``(aggregate, op, value)`` filter on groups (value an int or a
            :class:`Scalar`).
        order_by: Optional ordering expression.
        descending: Order direction.
        limit: Optional row limit.
    """

    select: tuple[Expr, ...]
    table: str
    key: str
    join: Join | None = None
    where: tuple[Cond, ...] = ()
    distinct: bool = False
    group_by: Col | None = None
    having: tuple[Agg, str, "int | Scalar"] | None = None
    order_by: Expr | None = None
    descending: bool = False
    limit: int | None = None

    def with_select(self, select: tuple[Expr, ...], limit: int | None) -> "Query":
        """A copy with other output expressions and limit (used to inspect ORDER BY ties)."""
        return Query(select, self.table, self.key, self.join, self.where, self.distinct,
                     self.group_by, self.having, self.order_by, self.descending, limit)


def _literal(value: "int | str | Scalar") -> str:
    if isinstance(value, Scalar):
        return f"({render(value.query, 'plain')})"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(value)


class _Renderer:
    """Renders a query with a given way of naming columns; the styles below specialise it."""

    def __init__(self, query: Query):
        self.q = query

    def col(self, col: Col) -> str:
        return f"{col.table}.{col.name}" if self.q.join else col.name

    def count_star(self) -> str:
        return "COUNT(*)"

    def expr(self, e: Expr) -> str:
        if isinstance(e, Col):
            return self.col(e)
        if e.col is None:
            return self.count_star()
        inner = ("DISTINCT " if e.distinct else "") + self.col(e.col)
        return f"{e.func}({inner})"

    def source(self) -> str:
        q = self.q
        if q.join is None:
            return q.table
        j = q.join
        return f"{q.table} JOIN {j.table} ON {q.table}.{j.fk} = {j.table}.{j.key}"

    def condition(self, cond: Cond) -> str:
        return f"{self.col(cond.col)} {cond.op} {_literal(cond.value)}"

    def where(self) -> str:
        if not self.q.where:
            return ""
        return " WHERE " + " AND ".join(self.condition(c) for c in self.q.where)

    def select_list(self) -> str:
        head = "SELECT DISTINCT " if self.q.distinct else "SELECT "
        return head + ", ".join(self.expr(e) for e in self.q.select)

    def tail(self) -> str:
        """GROUP BY / HAVING / ORDER BY / LIMIT clauses."""
        q = self.q
        parts = []
        if q.group_by is not None:
            parts.append(f" GROUP BY {self.col(q.group_by)}")
        if q.having is not None:
            agg, op, value = q.having
            parts.append(f" HAVING {self.expr(agg)} {op} {_literal(value)}")
        if q.order_by is not None:
            parts.append(f" ORDER BY {self.expr(q.order_by)}" + (" DESC" if q.descending else " ASC"))
        if q.limit is not None:
            parts.append(f" LIMIT {q.limit}")
        return "".join(parts)

    def render(self) -> str:
        return f"{self.select_list()} FROM {self.source()}{self.where()}{self.tail()}"


class _AliasRenderer(_Renderer):
    """Tables aliased T1 (main) and T2 (joined); COUNT(*) becomes COUNT(T1.key)."""

    def alias(self, table: str) -> str:
        return "T1" if table == self.q.table else "T2"

    def col(self, col: Col) -> str:
        return f"{self.alias(col.table)}.{col.name}"

    def count_star(self) -> str:
        return f"COUNT(T1.{self.q.key})"

    def source(self) -> str:
        q = self.q
        if q.join is None:
            return f"{q.table} AS T1"
        j = q.join
        return f"{q.table} AS T1 JOIN {j.table} AS T2 ON T1.{j.fk} = T2.{j.key}"


class _NegatedRenderer(_Renderer):
    """The WHERE clause written as ``NOT`` of its negation (``NOT key IS NULL`` when empty)."""

    def where(self) -> str:
        conds = self.q.where
        if not conds:
            return f" WHERE NOT {self.col(Col(self.q.table, self.q.key))} IS NULL"
        negated = [f"{self.col(c.col)} {_NEGATE[c.op]} {_literal(c.value)}" for c in conds]
        if len(negated) == 1:
            return f" WHERE NOT {negated[0]}"
        return " WHERE NOT (" + " OR ".join(negated) + ")"


class _OuterRenderer(_Renderer):
    """The outer query over a derived table whose columns carry their bare names."""

    def col(self, col: Col) -> str:
        return col.name


def _inner_select(query: Query) -> str:
    """The FROM/JOIN/WHERE part of a query as a SELECT of every column the rest of it needs.

    The sub-query and CTE styles put this inner SELECT in a derived table and run the query's
    SELECT list, grouping, ordering and limit over it with bare column names.
    """
    needed: list[Col] = []
    exprs: list[Expr] = list(query.select)
    if query.group_by is not None:
        exprs.append(query.group_by)
    if query.having is not None:
        exprs.append(query.having[0])
    if query.order_by is not None:
        exprs.append(query.order_by)
    for e in exprs:
        col = e if isinstance(e, Col) else e.col
        if col is not None and col not in needed:
            needed.append(col)
    if not needed:
        needed.append(Col(query.table, query.key))
    plain = _Renderer(query)
    inner = "SELECT " + ", ".join(plain.col(c) for c in needed) + f" FROM {plain.source()}{plain.where()}"
    return inner


def render(query: Query, style: str) -> str:
    """Render ``query`` as SQL in one of :data:`SQL_STYLES`.

    Args:
        query: The query.
        style: One of ``"plain"``, ``"alias"``, ``"subquery"``, ``"cte"``, ``"negated"``.

    Returns:
        One SQL statement without a trailing semicolon.
    """
    if style not in _STYLE_RENDERERS:
        raise ValueError(f"Unknown SQL style {style!r}; use one of {SQL_STYLES}.")
    return _STYLE_RENDERERS[style](query)


def _render_subquery(query: Query) -> str:
    inner = _inner_select(query)
    outer = _OuterRenderer(query)
    return f"{outer.select_list()} FROM ({inner}){outer.tail()}"


def _render_cte(query: Query) -> str:
    inner = _inner_select(query)
    outer = _OuterRenderer(query)
    return f"WITH {CTE_NAME} AS ({inner}) {outer.select_list()} FROM {CTE_NAME}{outer.tail()}"


_STYLE_RENDERERS: dict[str, Callable[[Query], str]] = {
    "plain": lambda q: _Renderer(q).render(),
    "alias": lambda q: _AliasRenderer(q).render(),
    "subquery": _render_subquery,
    "cte": _render_cte,
    "negated": lambda q: _NegatedRenderer(q).render(),
}


def sql_style(sql: str) -> str:
    """Name the surface style of one SQL query.

    Args:
        sql: The query text (whitespace and keyword case do not matter).

    Returns:
        The single style whose marker the query shows, ``"plain"`` for a SELECT with no marker,
        and ``"other"`` for anything else (several markers, or not a SELECT/WITH statement).
    """
    text = " ".join(sql.split())
    found = [name for name, pattern in _MARKERS if pattern.search(text)]
    if len(found) == 1:
        return found[0]
    if not found and _STARTS_WITH_SELECT.match(text):
        return "plain"
    return "other"


def sql_approach(sql: str) -> str:
    """Name how a query picks the rows with the highest / lowest value (see the module docstring).

    Args:
        sql: The query text.

    Returns:
        ``"extremum"`` when it compares with a sub-query's value (``= (SELECT ...``, ``<> (SELECT ...``),
        ``"order_limit"`` when it keeps the first row of an ordering (``LIMIT 1``), else
        ``"other"``.
    """
    text = " ".join(sql.split())
    if _COMPARES_WITH_SUBQUERY.search(text):
        return "extremum"
    if _LIMIT_ONE.search(text):
        return "order_limit"
    return "other"


def count_approach(sql: str) -> str:
    """Name how a query counts the rows with a known value of a column (see the module docstring).

    Args:
        sql: The query text.

    Returns:
        ``"count_col"`` when it counts a column that is not a key (``COUNT(age)``, ``COUNT(T1.age)``)
        or filters with ``IS NOT NULL``; ``"count_star"`` when it counts rows (``COUNT(*)``, a
        ``..._id`` key); ``"other"`` when it counts nothing. The name says how the query is
        written, not whether its column is the one asked about.
    """
    text = " ".join(sql.split())
    arguments = [a.upper().removeprefix("DISTINCT ").strip() for a in _COUNT_ARGUMENT.findall(text)]
    if _IS_NOT_NULL.search(text) or any(a != "*" and not _KEY_COLUMN.match(a) for a in arguments):
        return "count_col"
    return "count_star" if arguments else "other"
