"""The SQL verifier: extraction, result comparison, partial credit and the read-only sandbox."""

import hashlib
import os
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rllib_dph.envs import isolation
from rllib_dph.envs.sql import (
    MAX_COMPLETION_CHARS,
    column_overlap_score,
    execute_sql,
    extract_sql,
    has_top_level_order_by,
    sql_reward,
    verify_sql,
)
from rllib_dph.envs.sql.sandbox import MAX_ROWS

SINGERS = [
    # id, name, country, age, net_worth
    (1, "Ann", "FR", 30, 1.5),
    (2, "Bob", "US", 25, 2.0),
    (3, "Cid", "US", 41, None),
    (4, "Dee", "DE", 25, 3.25),
    (5, "Eve", None, 35, 2.0),
]


def make_db(path, singers=SINGERS):
    """Writes a small music database: singer(5 rows) and numbers(0..199) for big joins."""
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE singer (id INTEGER PRIMARY KEY, name TEXT, country TEXT, age INTEGER, "
        "net_worth REAL)"
    )
    conn.executemany("INSERT INTO singer VALUES (?, ?, ?, ?, ?)", singers)
    conn.execute("CREATE TABLE numbers (n INTEGER)")
    conn.executemany("INSERT INTO numbers VALUES (?)", [(i,) for i in range(200)])
    conn.commit()
    conn.close()


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("sqldb") / "music.sqlite"
    make_db(path)
    return str(path)


def fenced(sql):
    return f"Let me think.\n```sql\n{sql}\n```"


@pytest.mark.parametrize(
    "completion,expected",
    [
        ("```sql\nSELECT 1\n```", "SELECT 1"),
        ("```sql\nSELECT 1\n```\nBetter:\n```sql\nSELECT 2;\n```", "SELECT 2;"),
        ("```SQL\nSELECT 3\n```", "SELECT 3"),
        ("```sql SELECT 4 ```", "SELECT 4"),
        ("```sql\nSELECT 5\n```\n```sql\nSELECT 6", "SELECT 5"),  # last block unclosed
        ("```sql\nSELECT 7", None),  # truncated: no closed block
        ("```sqlite\nSELECT 8\n```", None),
        ("```python\nprint(9)\n```", None),
        ("SELECT 10", None),
        ("```sql\n```", ""),
    ],
)
def test_extract_sql(completion, expected):
    assert extract_sql(completion) == expected


@pytest.mark.parametrize(
    "sql,expected",
    [
        ("SELECT name FROM singer ORDER BY age", True),
        ("select name from singer order\n  by age desc limit 2", True),
        ("SELECT name FROM singer ORDER/* c */BY age", True),
        ("SELECT a FROM t UNION SELECT b FROM u ORDER BY 1", True),
        ("SELECT name FROM singer", False),
        ("SELECT name FROM (SELECT name FROM singer ORDER BY age)", False),
        ("WITH s AS (SELECT * FROM singer ORDER BY age) SELECT name FROM s", False),
        ("SELECT name, ROW_NUMBER() OVER (ORDER BY age) FROM singer", False),
        ("SELECT 'ORDER BY' FROM singer", False),
        ('SELECT "order" FROM t -- ORDER BY x', False),
        ("SELECT [order by] FROM t", False),
    ],
)
def test_has_top_level_order_by(sql, expected):
    assert has_top_level_order_by(sql) is expected


@pytest.mark.parametrize(
    "gold,pred,cmp_method,expected",
    [
        # Same query, and equivalent queries in other surface styles.
        ("SELECT name FROM singer WHERE age > 30", "SELECT name FROM singer WHERE age > 30",
         "bird", 1.0),
        ("SELECT name FROM singer WHERE age > 30",
         "SELECT s.name FROM singer AS s WHERE NOT s.age <= 30", "bird", 1.0),
        ("SELECT name FROM singer WHERE age > 30",
         "WITH old AS (SELECT * FROM singer WHERE age > 30) SELECT name FROM old", "spider", 1.0),
        ("SELECT name FROM singer WHERE age > 30", "SELECT name FROM singer WHERE age >= 30",
         "bird", 0.0),
        # Duplicates: sets in bird, multisets in spider.
        ("SELECT country FROM singer WHERE country IS NOT NULL",
         "SELECT DISTINCT country FROM singer WHERE country IS NOT NULL", "bird", 1.0),
        ("SELECT country FROM singer WHERE country IS NOT NULL",
         "SELECT DISTINCT country FROM singer WHERE country IS NOT NULL", "spider", 0.0),
        # Row order: ignored by bird, and by spider unless the gold query orders at top level.
        ("SELECT name FROM singer ORDER BY age", "SELECT name FROM singer ORDER BY name",
         "bird", 1.0),
        ("SELECT name FROM singer ORDER BY age, id", "SELECT name FROM singer ORDER BY name",
         "spider", 0.0),
        ("SELECT name FROM singer ORDER BY age, id",
         "SELECT name FROM singer ORDER BY age ASC, id ASC", "spider", 1.0),
        ("SELECT name FROM singer", "SELECT name FROM singer ORDER BY name DESC", "spider", 1.0),
        ("SELECT name FROM (SELECT name FROM singer ORDER BY age)",
         "SELECT name FROM singer ORDER BY name DESC", "spider", 1.0),
        # Column permutations: only spider allows them, also together with ORDER BY.
        ("SELECT name, age FROM singer", "SELECT age, name FROM singer", "bird", 0.0),
        ("SELECT name, age FROM singer", "SELECT age, name FROM singer", "spider", 1.0),
        ("SELECT name, age FROM singer ORDER BY age DESC, name",
         "SELECT age, name FROM singer ORDER BY age DESC, name", "spider", 1.0),
        ("SELECT name, age FROM singer ORDER BY age DESC, name",
         "SELECT age, name FROM singer ORDER BY name", "spider", 0.0),
        # Same values per column, but paired differently in the rows.
        ("SELECT name, country FROM singer WHERE id IN (1, 2)",
         "SELECT 'Ann', 'US' UNION ALL SELECT 'Bob', 'FR'", "spider", 0.0),
        ("SELECT name, country, age FROM singer", "SELECT age, country, name FROM singer",
         "spider", 1.0),
        # Column count and extra columns.
        ("SELECT name FROM singer", "SELECT name, age FROM singer", "bird", 0.0),
        ("SELECT name FROM singer", "SELECT name, age FROM singer", "spider", 0.0),
        # NULLs.
        ("SELECT country FROM singer", "SELECT country FROM singer WHERE country IS NOT NULL",
         "bird", 0.0),
        ("SELECT net_worth FROM singer WHERE id = 3", "SELECT NULL", "spider", 1.0),
        # Numbers: int vs float, float rounding, number vs string.
        ("SELECT COUNT(*) FROM singer", "SELECT 5.0", "bird", 1.0),
        ("SELECT AVG(age) FROM singer", "SELECT SUM(age) * 1.0 / COUNT(*) FROM singer",
         "bird", 1.0),
        ("SELECT 0.3", "SELECT 0.1 + 0.2", "spider", 1.0),
        ("SELECT 0.3", "SELECT 0.30001", "bird", 0.0),
        ("SELECT COUNT(*) FROM singer", "SELECT '5'", "bird", 0.0),
        # Empty results are equal.
        ("SELECT name FROM singer WHERE age > 100", "SELECT id FROM singer WHERE age < 0",
         "bird", 1.0),
        ("SELECT name FROM singer WHERE age > 100", "SELECT id FROM singer WHERE age < 0",
         "spider", 1.0),
        # Trailing semicolons and comments are fine.
        ("SELECT COUNT(*) FROM singer;", "SELECT COUNT(*) FROM singer; -- done", "bird", 1.0),
        ("SELECT COUNT(*) FROM singer", "SELECT COUNT(*) FROM singer;;", "spider", 1.0),
    ],
)
def test_equivalence(db, gold, pred, cmp_method, expected):
    assert sql_reward(fenced(pred), gold, db, cmp_method=cmp_method) == expected


@pytest.mark.parametrize(
    "gold,pred,expected",
    [
        ("SELECT name, age FROM singer", "SELECT name FROM singer", 0.8 * 1 / 2),
        ("SELECT name, age FROM singer", "SELECT name, age, country FROM singer", 0.8 * 4 / 6),
        ("SELECT name FROM singer", "SELECT country, name FROM singer", 0.8 * 1 / 2),
        # Value sets, not multisets: DISTINCT loses duplicates but keeps the set.
        ("SELECT age, id FROM singer", "SELECT DISTINCT age FROM singer", 0.8 * 1 / 2),
        ("SELECT name FROM singer", "SELECT id FROM singer", 0.0),
        ("SELECT name FROM singer", "SELECT name FROM singer WHERE age > 30", 0.0),
        ("SELECT name FROM singer", "SELECT name FROM singer WHERE 0", 0.0),
        ("SELECT name FROM singer", "SELECT name FROM singer ORDER BY age", 1.0),
    ],
)
def test_partial_credit(db, gold, pred, expected):
    verdict = verify_sql(fenced(pred), gold, db, partial_credit=True)
    assert verdict.reward == pytest.approx(expected)
    assert verdict.correct is (expected == 1.0)
    assert verdict.error is None
    # Off by default.
    assert sql_reward(fenced(pred), gold, db) == (1.0 if expected == 1.0 else 0.0)


def test_column_overlap_score_is_capped():
    gold = [(1, 1)]  # both gold columns match the single predicted column: count 2
    assert column_overlap_score([(1,)], gold) == pytest.approx(0.8 * min(4 / 2, 1))


@pytest.mark.parametrize(
    "completion,format_penalty,reward,error",
    [
        ("I don't know.", 0.0, 0.0, "no ```sql block"),
        ("I don't know.", 0.5, -0.5, "no ```sql block"),
        ("```sql\nSELECT 1", 0.5, -0.5, "no ```sql block"),
        ("```sql\n-- nothing\n```", 0.5, 0.0, "empty SQL"),
        (fenced("SELEC name FROM singer"), 0.5, 0.0, "syntax error"),
        (fenced("SELECT nope FROM singer"), 0.0, 0.0, "no such column"),
        (fenced("SELECT COUNT(*) FROM singer WHERE id = ?"), 0.0, 0.0, "binding"),
    ],
)
def test_format_and_sql_errors(db, completion, format_penalty, reward, error):
    verdict = verify_sql(
        completion, "SELECT COUNT(*) FROM singer", db, format_penalty=format_penalty
    )
    assert verdict.reward == reward
    assert verdict.correct is False
    assert error in verdict.error


def test_bad_gold_query_and_missing_database(db, tmp_path):
    verdict = verify_sql(fenced("SELECT 1"), "SELECT nope FROM singer", db)
    assert (verdict.reward, verdict.correct) == (0.0, False)
    assert verdict.error.startswith("gold query failed") and "no such column" in verdict.error

    missing = str(tmp_path / "missing.sqlite")
    verdict = verify_sql(fenced("SELECT 1"), "SELECT 1", missing)
    assert verdict.reward == 0.0 and "database file not found" in verdict.error
    assert not os.path.exists(missing)

    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"not a database" * 100)
    verdict = verify_sql(fenced("SELECT 5"), "SELECT COUNT(*) FROM singer", str(garbage))
    assert verdict.reward == 0.0 and "not a database" in verdict.error


@pytest.mark.parametrize("kwargs", [{"cmp_method": "exact"}, {"timeout_s": 0}])
def test_caller_errors_raise(db, kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        verify_sql(fenced("SELECT 1"), "SELECT 1", db, **kwargs)


def test_gold_cache_follows_database_changes(tmp_path):
    path = tmp_path / "changing.sqlite"
    make_db(path)
    gold = "SELECT COUNT(*) FROM singer"
    assert sql_reward(fenced("SELECT 5"), gold, str(path)) == 1.0
    path.unlink()
    make_db(path, SINGERS[:2])
    assert sql_reward(fenced("SELECT 5"), gold, str(path)) == 0.0
    assert sql_reward(fenced("SELECT 2"), gold, str(path)) == 1.0


def test_gold_cache_follows_a_rewrite_in_place(tmp_path):
    """Same inode, same size, modification time put back: the change time still tells."""
    path, other = tmp_path / "inplace.sqlite", tmp_path / "other.sqlite"
    make_db(path)
    make_db(other, SINGERS[:3])
    assert os.path.getsize(path) == os.path.getsize(other)
    gold = "SELECT COUNT(*) FROM singer"
    assert sql_reward(fenced("SELECT 5"), gold, str(path)) == 1.0
    before = os.stat(path)
    with open(path, "r+b") as f:
        f.write(other.read_bytes())
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_ino == before.st_ino
    assert sql_reward(fenced("SELECT 3"), gold, str(path)) == 1.0


@pytest.fixture
def in_checker(monkeypatch):
    """Calls of the isolation run in this process, as they do inside a checker: the sandbox's
    own parts can be watched and patched here."""
    monkeypatch.setattr(isolation, "_IN_CHECKER", True)


def test_a_query_that_ran_is_answered_from_the_result_cache_unless_it_failed_or_is_random(db, monkeypatch,
                                                                                          in_checker):
    """The scorer's and ``answer_key``'s run of one query, and a query sampled many times, run
    once per database file (per checker); a failed query and one drawing random numbers run each
    time."""
    import rllib_dph.envs.sql.sandbox as sql

    monkeypatch.setattr(sql, "_results", sql._LRUCache(1 << 20))
    runs = []
    real_run = sql._Sandbox.run

    def counted(self, statement, deadline):
        runs.append(statement)
        return real_run(self, statement, deadline)

    monkeypatch.setattr(sql._Sandbox, "run", counted)
    for _ in range(3):
        assert sql_reward(fenced("SELECT COUNT(*) FROM singer"), "SELECT COUNT(*) FROM singer", db) == 1.0
        assert execute_sql("SELECT COUNT(*) FROM singer;", db) == [(len(SINGERS),)]  # same statement
        with pytest.raises(sql.SQLExecutionError):
            execute_sql("SELECT nope FROM singer", db)
        execute_sql("SELECT random() FROM singer", db)
        execute_sql("SELECT date('NOW')", db)
        execute_sql("SELECT datetime()", db)  # no time value: now
        execute_sql("SELECT strftime('%Y')", db)
    assert sorted(set(runs)) == ["SELECT COUNT(*) FROM singer", "SELECT date('NOW')", "SELECT datetime()",
                                 "SELECT nope FROM singer", "SELECT random() FROM singer", "SELECT strftime('%Y')"]
    assert runs.count("SELECT COUNT(*) FROM singer") == 1
    assert all(runs.count(s) == 3 for s in set(runs) - {"SELECT COUNT(*) FROM singer"})


def test_the_result_cache_keeps_at_most_its_weight_least_recently_used_first():
    from rllib_dph.envs.sql.sandbox import _LRUCache

    cache = _LRUCache(10)
    cache.put("a", 1, 4)
    cache.put("b", 2, 4)
    assert cache.get("a") == 1  # "b" is now the least recently used
    cache.put("c", 3, 4)
    assert (cache.get("a"), cache.get("b"), cache.get("c"), cache.weight) == (1, None, 3, 8)
    cache.put("a", 4, 2)  # replaced: its old weight leaves
    cache.put("big", 5, 11)  # heavier than the whole cache: not kept, nothing evicted for it
    assert (cache.get("a"), cache.get("big"), cache.get("c"), cache.weight) == (4, None, 3, 6)


def make_wal_db(path):
    """A database in WAL mode (SQLite would create -wal and -shm files next to it to read it)."""
    make_db(path)
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode = WAL")


def make_hot_journal_db(path):
    """A database with the hot journal of a writer that crashed mid-transaction (SQLite would
    roll it back before reading, which a read-only connection cannot). Returns the journal."""
    make_db(path)
    journal = path.with_name(path.name + "-journal")
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = PERSIST")
    conn.execute("PRAGMA cache_size = 1")
    conn.execute("BEGIN")
    conn.execute("DELETE FROM singer")
    conn.executemany("INSERT INTO numbers VALUES (?)", [(i,) for i in range(5000)])
    journal_bytes = journal.read_bytes()
    conn.rollback()
    conn.close()
    journal.write_bytes(journal_bytes)
    return journal


def test_wal_database_and_hot_journal_need_no_side_files(tmp_path):
    wal, hot = tmp_path / "wal.sqlite", tmp_path / "hot.sqlite"
    make_wal_db(wal)
    journal = make_hot_journal_db(hot)
    journal_bytes = journal.read_bytes()
    files = sorted(os.listdir(tmp_path))
    for path in (wal, hot):
        verdict = verify_sql(fenced("SELECT 5"), "SELECT COUNT(*) FROM singer", str(path))
        assert verdict.correct, verdict.error
    assert sorted(os.listdir(tmp_path)) == files  # no -wal, -shm or journal created
    assert journal.read_bytes() == journal_bytes  # the hot journal was not rolled back


def test_execute_sql_returns_normalized_rows(db):
    rows = execute_sql("SELECT id, net_worth, 0.1 + 0.2 FROM singer WHERE id <= 3 ORDER BY id", db)
    assert rows == [(1, 1.5, 0.3), (2, 2.0, 0.3), (3, None, 0.3)]


BIG = "printf('%.*c', 120000, 'a')"  # about the longest string the sandbox allows
LONG_PATTERN = "'%' || printf('%.*c', 98, 'a') || 'b'"  # the costliest LIKE pattern on BIG

# Hostile queries: (SQL, timeout_s, words expected in the error). The gold query is cheap.
ADVERSARIAL = [
    ("DROP TABLE singer", 15.0, "not allowed"),
    ("DELETE FROM singer", 15.0, "not allowed"),
    ("UPDATE singer SET age = 0", 15.0, "not allowed"),
    ("INSERT INTO singer (name) VALUES ('x')", 15.0, "not allowed"),
    ("REPLACE INTO singer (id, name) VALUES (1, 'x')", 15.0, "not allowed"),
    ("CREATE TABLE evil (x)", 15.0, "not allowed"),
    ("CREATE TEMP TABLE evil AS SELECT * FROM singer", 15.0, "not allowed"),
    ("CREATE VIEW evil AS SELECT 1", 15.0, "not allowed"),
    ("ALTER TABLE singer RENAME TO evil", 15.0, "not allowed"),
    ("SELECT 1; DROP TABLE singer", 15.0, "more than one SQL statement"),
    ("SELECT 1; SELECT 2", 15.0, "more than one SQL statement"),
    ("ATTACH DATABASE '{dir}/attached.sqlite' AS evil", 15.0, "not allowed"),
    ("ATTACH DATABASE 'file:{dir}/uri.sqlite?mode=rwc' AS evil", 15.0, "not allowed"),
    ("VACUUM INTO '{dir}/copy.sqlite'", 15.0, "not allowed"),
    ("VACUUM", 15.0, "not allowed"),
    ("PRAGMA writable_schema = ON", 15.0, "not allowed"),
    ("PRAGMA journal_mode = WAL", 15.0, "not allowed"),
    ("PRAGMA query_only = OFF", 15.0, "not allowed"),
    ("BEGIN IMMEDIATE", 15.0, "not allowed"),
    ("ANALYZE", 15.0, "not allowed"),
    ("EXPLAIN DELETE FROM singer", 15.0, "not allowed"),
    ("SELECT load_extension('{dir}/evil.so')", 15.0, "not allowed"),
    ("SELECT fts3_tokenizer('simple')", 15.0, "not allowed"),
    ("SELECT zeroblob(1000000000)", 15.0, "too big"),
    ("SELECT randomblob(1000000000)", 15.0, "too big"),
    ("SELECT hex(randomblob(200000))", 15.0, "too big"),
    ("SELECT zeroblob(100000) FROM numbers a, numbers b", 15.0, "result too large"),
    ("SELECT * FROM numbers a, numbers b, numbers c", 15.0, f"more than {MAX_ROWS} rows"),
    ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c",
     15.0, "result too large"),
    ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
     1.0, "timed out"),
    ("SELECT count(*) FROM numbers a, numbers b, numbers c, numbers d", 1.0, "timed out"),
    ("SELECT a.n FROM numbers a, numbers b, numbers c ORDER BY random()", 1.0, "timed out"),
    ("SELECT count(DISTINCT randomblob(64)) FROM numbers a, numbers b, numbers c", 1.0,
     "timed out"),
    ("WITH x AS MATERIALIZED (SELECT randomblob(100000) FROM numbers a, numbers b, numbers c) "
     "SELECT count(*) FROM x", 1.0, "timed out"),
    # One straight run of LIKE calls, which no deadline check interrupts: refused up front,
    # also when the query flattener repeats a CTE column.
    (f"WITH s(a, b) AS (SELECT {BIG}, {LONG_PATTERN}) SELECT "
     + " + ".join(["(a LIKE b)"] * 30) + " FROM s", 1.0, "query too costly: 30 calls of like"),
    (f"WITH s(a, b) AS (SELECT {BIG}, {LONG_PATTERN}), t(v) AS (SELECT a LIKE b FROM s) SELECT "
     + " + ".join(["v"] * 30) + " FROM t", 1.0, "query too costly: 30 calls of like"),
    (f"WITH s(a) AS (SELECT {BIG}) SELECT " + " + ".join(["length(upper(a))"] * 300) + " FROM s",
     1.0, "function calls in its compiled program"),
    ("SELECT " + "1 + " * 30_000 + "1", 1.0, "SQL too long: 120008 bytes"),
    ("EXPLAIN SELECT * FROM singer", 15.0, "not allowed"),
]


class TempFileWatch:
    """Samples the open files of this process and of its checkers (``/proc/<pid>/fd``: the
    queries run in the checkers of the isolation) for SQLite temporary files."""

    def __init__(self):
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        while not self._stop.wait(0.005):
            pids = ["self"] + [str(checker.proc.pid) for checker in list(isolation._POOL._live)]
            for pid in pids:
                try:
                    fds = os.listdir(f"/proc/{pid}/fd")
                except OSError:
                    continue
                for fd in fds:
                    try:
                        target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    except OSError:
                        continue
                    if "etilqs_" in target:  # the prefix of SQLite's temporary file names
                        self.seen.add(target)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


@pytest.mark.parametrize(
    "sql,timeout_s,reason",
    ADVERSARIAL,
    ids=[row[0][:60] for row in ADVERSARIAL],
)
def test_hostile_queries_are_contained(db, sql, timeout_s, reason):
    directory = os.path.dirname(db)
    files_before = sorted(os.listdir(directory))
    digest_before = sha256(db)
    start = time.monotonic()
    with TempFileWatch() as temp_files:
        verdict = verify_sql(
            fenced(sql.format(dir=directory)), "SELECT COUNT(*) FROM singer", db,
            timeout_s=timeout_s,
        )
    elapsed = time.monotonic() - start
    assert not temp_files.seen
    assert verdict.reward == 0.0 and verdict.correct is False
    assert verdict.error is not None and reason in verdict.error
    assert elapsed < min(timeout_s, 5.0) + 1.0
    assert sha256(db) == digest_before
    assert sorted(os.listdir(directory)) == files_before
    # The connection is still usable afterwards.
    assert sql_reward(fenced("SELECT 5"), "SELECT COUNT(*) FROM singer", db) == 1.0


@pytest.mark.parametrize(
    "sql,expected",
    [
        # Too long for the length cap: NULL, as SQLite itself answers, but at once.
        ("SELECT printf('%.*c', 1000000000, 'x')", None),
        ("SELECT format('%.2000000000c', 'x')", None),
        ("SELECT printf('%d%.*c', 7, -2000000000, 'x')", None),
        # Whatever SQLite reads as a number: a text's numeric prefix, a float, a blob's text.
        ("SELECT printf('%.*c', '2000000000x', 'x')", None),
        ("SELECT printf('%.*c', ' 2e9', 'x')", None),
        ("SELECT printf('%.*c', 2e9, 'x')", None),
        ("SELECT printf('%.*c', CAST('2000000000' AS BLOB), 'x')", None),
        ("SELECT printf('%!.*c', 2000000000, 'x')", None),
        ("SELECT printf('%.99999999999c', 'x')", None),
        # The rule reads no conversion syntax: a large number anywhere gives NULL with a %c.
        ("SELECT printf('%c%d', 'x', 1000000000)", None),
        ("SELECT printf('%s%d', 'x', 1000000000)", "x1000000000"),
        # Everything else behaves as SQLite's printf.
        ("SELECT printf('%.*c|%5.2f|%%|%s', 3, 'x', 3.14159, 'end')", "xxx| 3.14|%|end"),
        ("SELECT printf('%*d|%.*c', 5, 42, 4, 'z')", "   42|zzzz"),
        ("SELECT format('%q', 'it''s')", "it''s"),
        ("SELECT printf(123)", "123"),
        ("SELECT printf(NULL)", None),
    ],
)
def test_printf_is_guarded(db, sql, expected):
    start = time.monotonic()
    assert execute_sql(sql, db, timeout_s=1.0) == [(expected,)]
    assert time.monotonic() - start < 0.5


def test_verifier_from_worker_threads(db):
    gold = "SELECT name, age FROM singer WHERE age > 26"
    cases = [
        ("SELECT name, age FROM singer WHERE age > 26", "bird", 1.0),
        ("SELECT age, name FROM singer WHERE age >= 27", "spider", 1.0),
        ("SELECT age, name FROM singer WHERE age > 26", "bird", 0.0),
        ("SELECT name, age FROM singer", "bird", 0.0),
        ("DELETE FROM singer", "bird", 0.0),
    ] * 8

    def score(case):
        pred, cmp_method, _ = case
        return sql_reward(fenced(pred), gold, db, cmp_method=cmp_method)

    digest_before = sha256(db)
    with ThreadPoolExecutor(max_workers=4) as pool:
        rewards = list(pool.map(score, cases))
    assert rewards == [expected for _, _, expected in cases]
    assert sha256(db) == digest_before


@pytest.mark.parametrize(
    "completion",
    [
        "```sql\n" * 1_500_000,  # 10 MB of opening fences, none closed
        "```sql\nSELECT " + "1 + " * 2_500_000 + "1\n```",  # a 10 MB SQL block
        "```sql\nSELECT 1\n```" + "x" * 10_000_000,
    ],
    ids=["unclosed fences", "huge block", "huge tail"],
)
def test_huge_completions_are_cheap(db, completion):
    start = time.monotonic()
    verdict = verify_sql(completion, "SELECT COUNT(*) FROM singer", db, timeout_s=1.0)
    assert time.monotonic() - start < 0.5
    assert verdict.reward == 0.0 and "completion too long: 10" in verdict.error
    # Below the cap: linear-time extraction, SQL length capped before parsing.
    start = time.monotonic()
    verdict = verify_sql(completion[:MAX_COMPLETION_CHARS], "SELECT 2", db, timeout_s=1.0)
    assert time.monotonic() - start < 0.5
    assert verdict.reward == 0.0


HALF = "printf('%.*c', 60000, 'a')"


@pytest.mark.parametrize(
    "expr,expected",
    [
        # Worst cases of the built-ins, whose time is len(X) * len(Y): 0.065 s per call for
        # instr and replace, 20 s for ltrim; the guarded functions take linear time.
        (f"instr({BIG}, {HALF} || 'b')", 0),
        (f"length(replace({BIG}, {HALF} || 'b', 'z'))", 120000),
        (f"length(ltrim({HALF}, printf('%.*c', 60000, 'b') || 'a'))", 0),
        (f"length(rtrim({HALF}, printf('%.*c', 60000, 'b') || 'a'))", 0),
        (f"length(trim({HALF} || 'c', printf('%.*c', 60000, 'b') || 'a'))", 1),
    ],
)
def test_costly_builtins_take_linear_time(db, expr, expected):
    start = time.monotonic()
    rows = execute_sql(f"SELECT {expr} FROM numbers LIMIT 50", db)
    assert rows == [(expected,)] * 50
    assert time.monotonic() - start < 1.5  # the built-ins: 3 s or more


def test_a_straight_run_of_glob_calls_stops_at_the_deadline(db):
    calls = " + ".join(["(a GLOB p)"] * 200)  # below MAX_FUNCTION_CALLS
    pattern = "'*[a' || printf('%.*c', 95, 'c') || ']b'"
    start = time.monotonic()
    verdict = verify_sql(fenced(f"WITH s(a, p) AS (SELECT {BIG}, {pattern}) SELECT {calls} FROM s"),
                         "SELECT 1", db, timeout_s=0.5)
    assert "timed out" in verdict.error
    assert time.monotonic() - start < 1.5  # the built-in glob: about 10 s


GUARDED_CALLS = [
    "instr('héllo wörld', 'wö')", "instr('abc', '')", "instr(NULL, 'a')", "instr('a', NULL)",
    "instr(12345, 34)", "instr(x'00ff10', x'10')", "instr(x'616263', 'c')", "instr(1.5, '.')",
    "replace('a.b.c', '.', '--')", "replace('abc', '', 'x')", "replace(NULL, 'a', 'b')",
    "replace(12.5, '.', ',')", "replace('aaa', 'a', NULL)", "replace(x'616161', 'a', 'b')",
    "trim('xxhixx', 'x')", "ltrim('xxhixx', 'x')", "rtrim('xxhixx', 'x')", "trim('  hi  ')",
    "trim('abc', '')", "trim('ééhié', 'é')", "ltrim(123321, 31)", "trim(NULL, 'x')",
    "'abc' GLOB 'a*'", "'abc' GLOB '[!a]*'", "NULL GLOB 'a'", "glob('*b*', 'abc')",
    "printf('%d|%5.2f|%s|%q', 7, 3.14159, 'x', 'it''s')",
]


@pytest.mark.parametrize("call", GUARDED_CALLS)
def test_guarded_functions_agree_with_sqlite(db, call):
    with sqlite3.connect(":memory:") as plain:
        expected = plain.execute(f"SELECT {call}").fetchall()
    assert execute_sql(f"SELECT {call}", db) == expected


def test_the_deadline_holds_where_the_sandbox_cannot_stop_the_query(db, monkeypatch, in_checker):
    """In the sandbox, a query that no deadline check stops runs on (the progress handler is
    what stops it); in a checker the isolation kills it at the deadline plus the grace."""
    import rllib_dph.envs.sql.sandbox as sql

    cross = fenced("SELECT count(*) FROM numbers a, numbers b, numbers c, numbers d")
    start = time.monotonic()
    verdict = verify_sql(cross, "SELECT COUNT(*) FROM singer", db, timeout_s=0.5)
    assert verdict.error == "timed out: the query ran past its time limit"  # the progress handler
    assert time.monotonic() - start < 1.0
    monkeypatch.setattr(isolation, "_IN_CHECKER", False)
    start = time.monotonic()
    sort = fenced("SELECT a.n, randomblob(100) FROM numbers a, numbers b, numbers c ORDER BY random()")
    verdict = verify_sql(sort, "SELECT COUNT(*) FROM singer", db, timeout_s=0.5)
    elapsed = time.monotonic() - start
    assert "timed out" in verdict.error
    assert elapsed < 0.5 + sql.DEADLINE_GRACE_S + 0.5
    assert sql_reward(fenced("SELECT 5"), "SELECT COUNT(*) FROM singer", db) == 1.0


_MEMORY_CAP = """
import resource, sys, time
import rllib_dph.envs.isolation
import rllib_dph.envs.sql
import rllib_dph.envs.sql.sandbox
rllib_dph.envs.isolation._IN_CHECKER = True  # the sandbox runs here, with this heap limit
rllib_dph.envs.sql.sandbox.MAX_SQLITE_HEAP_BYTES = 64 << 20
sql = ("```sql\\nWITH x AS MATERIALIZED (SELECT randomblob(100000) FROM numbers a, numbers b)"
       " SELECT count(*) FROM x\\n```")
verdict = rllib_dph.envs.sql.verify_sql(sql, "SELECT 1", sys.argv[1], timeout_s=30)
print(verdict.error)
print(rllib_dph.envs.sql.verify_sql("```sql\\nSELECT 1\\n```", "SELECT 1", sys.argv[1]).correct)
"""


def test_temporary_storage_is_capped_in_memory(db):
    """4 GB of materialised rows: refused at the heap cap, no temporary file, nothing left."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", _MEMORY_CAP, db], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": root}, timeout=60)
    error, still_works = out.stdout.splitlines()
    assert error.startswith("out of memory: SQLite's heap limit (64 MiB"), out.stderr
    assert still_works == "True"
