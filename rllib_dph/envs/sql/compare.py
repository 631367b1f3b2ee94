"""Whether two query results are equal (``cmp_method``), and the partial credit of a differing one.

Comparison. Values are made comparable first (:func:`_normalize`): a float is rounded to
:data:`FLOAT_DIGITS` significant digits, or to the nearest integer when that is finer (a float
of more than FLOAT_DIGITS integer digits), so that results differing only in the last bits of
float arithmetic (``AVG(x)`` vs ``SUM(x) * 1.0 / COUNT(x)``) compare equal; integers are exact.
An integer and a float of the same value are equal at every magnitude (``1`` and ``1.0``,
``1234567890123`` and ``1234567890123.0``, ``2**60`` and ``2.0**60``); values that differ are
not: ``2**53 + 1`` is not ``float(2**53 + 1)``, which is ``2**53`` (SQLite's own ``=`` says the
same). Rounding a float never coarser than to an integer is what keeps this an equivalence that
also keeps distinct integers distinct (a coarser step would make ``2**53`` equal ``2**53 + 2``
through their float twins); the cost is that floats above about 1e15, whose last bits are worth
more than 0.1, only compare equal when they round to the same integer. A number never equals a
string (``5`` vs ``'5'``); ``NULL`` equals ``NULL``.

- ``"bird"``: equal as **sets** of row tuples. Column order matters; row order and duplicates
  do not (BIRD's official metric).
- ``"spider"``: equal as **multisets** of rows under some permutation of the predicted columns
  (same number of columns and rows). When the gold query has a top-level ``ORDER BY`` (not one
  inside a sub-query, CTE or window) the rows must also come in the same order; the original
  DPH-RL code meant to do this but its check never fired. Both empty results are equal.

Partial credit (off by default) reproduces the original DPH-RL scorer: when the query ran but
its result differs, the reward is ``0.8 * min(count**2 / (gold_cols * pred_cols), 1)`` where
``count`` is the number of gold columns whose **set** of values equals the set of values of some
predicted column (the original de-duplicates rows, then compares per-column value sets; the count
runs over gold columns). Either result empty gives 0.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Callable, Sequence

from rllib_dph.envs.sql.extract import has_top_level_order_by

#: Significant digits floats are rounded to before comparing.
FLOAT_DIGITS = 12
#: Most search steps spent looking for a column permutation in spider mode; past it the results
#: count as different.
MAX_PERMUTATION_STEPS = 10_000
#: Scale of the partial-credit reward (keeps it below a correct answer's 1.0).
PARTIAL_CREDIT_SCALE = 0.8

Row = tuple[Any, ...]
#: Decides whether a predicted result equals the gold one: ``(pred_rows, gold_rows, gold_sql)``.
Comparator = Callable[[Sequence[Row], Sequence[Row], str], bool]


#: Floats at least this large have FLOAT_DIGITS integer digits or more: they are rounded to the
#: nearest integer rather than to FLOAT_DIGITS significant digits.
_INTEGER_ROUNDING_FROM = 10.0 ** (FLOAT_DIGITS - 1)


def _normalize(value: Any) -> Any:
    """The value as compared: a finite float rounded to FLOAT_DIGITS significant digits, or to
    the nearest integer when that is finer (it stays a float); other values are unchanged.

    Python's ``==`` and ``hash`` then make an int equal to a float exactly when their values are
    equal, at every magnitude (see the module docstring for why no coarser rounding is used).
    """
    if isinstance(value, float) and math.isfinite(value):
        if abs(value) >= _INTEGER_ROUNDING_FROM:
            return float(round(value))  # exact: such a float's nearest integer is a float too
        return float(f"{value:.{FLOAT_DIGITS}g}")
    return value


def _same_row_set(pred: Sequence[Row], gold: Sequence[Row], gold_sql: str) -> bool:
    """BIRD: equal as sets of rows (column order matters; row order and duplicates do not)."""
    return set(pred) == set(gold)


def _same_rows_up_to_column_order(pred: Sequence[Row], gold: Sequence[Row], gold_sql: str) -> bool:
    """Spider: equal as row multisets under a column permutation; ordered if the gold query is."""
    if len(pred) != len(gold):
        return False
    if not gold:
        return True
    if len(pred[0]) != len(gold[0]):
        return False
    pred_cols = list(zip(*pred))  # columns as tuples of values, in row order
    gold_cols = list(zip(*gold))
    if has_top_level_order_by(gold_sql):
        # Rows in the same order: each gold column must equal some predicted column, one to one.
        return Counter(pred_cols) == Counter(gold_cols)
    if Counter(pred) == Counter(gold):
        return True
    return _permutation_exists(pred_cols, gold_cols)


def _permutation_exists(pred_cols: list[tuple], gold_cols: list[tuple]) -> bool:
    """Whether some permutation of ``pred_cols`` gives the same row multiset as ``gold_cols``.

    Gold column ``i`` may only take a predicted column with the same value multiset. Gold
    columns are assigned one at a time (fewest candidates first); after each assignment the rows
    projected on the columns assigned so far must match as multisets, which prunes wrong branches
    early. Identical predicted columns are interchangeable and tried once per step.
    """
    num_cols = len(gold_cols)
    pred_counts = [Counter(col) for col in pred_cols]
    gold_counts = [Counter(col) for col in gold_cols]
    candidates = [[j for j, p in enumerate(pred_counts) if p == g] for g in gold_counts]
    order = sorted(range(num_cols), key=lambda i: len(candidates[i]))
    gold_prefix: dict[int, Counter] = {}  # depth -> multiset of gold rows on order[: depth + 1]
    steps = 0

    def search(depth: int, assigned: list[int]) -> bool:
        nonlocal steps
        if depth == num_cols:
            return True
        if depth not in gold_prefix:
            gold_prefix[depth] = Counter(zip(*(gold_cols[i] for i in order[: depth + 1])))
        tried: set[tuple] = set()
        for j in candidates[order[depth]]:
            if j in assigned or pred_cols[j] in tried:
                continue
            tried.add(pred_cols[j])
            steps += 1
            if steps > MAX_PERMUTATION_STEPS:
                return False
            columns = assigned + [j]
            if Counter(zip(*(pred_cols[k] for k in columns))) == gold_prefix[depth] and search(
                depth + 1, columns
            ):
                return True
        return False

    return search(0, [])


#: Result comparison per ``cmp_method``.
COMPARATORS: dict[str, Comparator] = {
    "bird": _same_row_set,
    "spider": _same_rows_up_to_column_order,
}


def column_overlap_score(pred: Sequence[Row], gold: Sequence[Row]) -> float:
    """Partial credit of the original DPH-RL scorer for a result that differs from the gold one.

    ``0.8 * min(count**2 / (gold_cols * pred_cols), 1)``, where ``count`` is the number of gold
    columns whose set of values equals the set of values of some predicted column. 0 when either
    result is empty.

    Args:
        pred: Rows of the predicted query.
        gold: Rows of the gold query.
    """
    if not pred or not gold:
        return 0.0
    pred_sets = [set(col) for col in zip(*pred)]
    gold_sets = [set(col) for col in zip(*gold)]
    count = sum(any(g == p for p in pred_sets) for g in gold_sets)
    return PARTIAL_CREDIT_SCALE * min(count**2 / (len(gold_sets) * len(pred_sets)), 1.0)
