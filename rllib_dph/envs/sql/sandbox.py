"""The read-only sandbox that runs a query of a completion on a SQLite database.

Every query runs in the one verifier isolation (``rllib_dph.envs.isolation``): in a checker
subprocess that is killed, should the query still run, at its deadline plus
:data:`DEADLINE_GRACE_S` (:func:`sql_limits`). There each query runs on a connection that

- opens the database file read-only and ``immutable`` (``file:...?mode=ro&immutable=1`` URI) with
  ``PRAGMA query_only``: no lock, journal, ``-wal`` or ``-shm`` file is read or created next to
  it, so a WAL-mode database or a hot journal left by a crashed writer changes nothing (the main
  file is read as it is; checkpoint a WAL database before training);
- keeps all temporary storage (sorts, ``DISTINCT``, materialised CTEs) in memory
  (``PRAGMA temp_store = MEMORY``) under SQLite's process-wide hard heap limit
  (:data:`MAX_SQLITE_HEAP_BYTES`, set by the first sandbox of a checker): no temporary file is
  ever written, and a query that needs more memory fails with "out of memory";
- has an authorizer that allows only ``SELECT``, column reads, recursive CTEs and functions, and
  denies everything else: writes, ``CREATE``/``DROP``/``ALTER``, ``ATTACH``/``DETACH`` (hence also
  ``VACUUM INTO``, which attaches its target), every ``PRAGMA``, transactions, ``VACUUM``,
  ``ANALYZE``, ``REINDEX``, and the functions that can reach files or memory
  (``load_extension``, ``fts3_tokenizer``, ``readfile``, ``writefile``, ``edit``). Table-valued
  functions (``json_each``, ``pragma_table_info``) are denied too: setting one up needs an
  internal schema update or a PRAGMA;
- disables extension loading and allows no attached databases (``SQLITE_LIMIT_ATTACHED = 0``);
- caps the length of any string or blob (:data:`MAX_VALUE_BYTES`) and of ``LIKE``/``GLOB``
  patterns, and replaces the built-in functions of which one call could run long (``instr``,
  ``replace``, ``trim``/``ltrim``/``rtrim`` with a character set, ``glob``, and
  ``printf``/``format``, whose ``%c`` would spin for seconds on a huge precision) by functions
  that check the deadline first, then refuse a result over the length cap before building it
  (each is registered with the size of its result), and compute the same result in linear time
  (:class:`_GuardedFunctions`), so that no single call takes more than a few milliseconds
  (``LIKE``, kept native, about 0.025 s on maximal values) or builds a value over the cap. A
  Python function cannot take a text that is not valid UTF-8: a query that passes one to a
  guarded function runs again on a connection with SQLite's own functions (the checker's kill
  bounds their time);
- refuses, before running it, a query whose compiled program (read with ``EXPLAIN``) holds more
  than :data:`MAX_FUNCTION_CALLS` function calls or :data:`MAX_COSTLY_CALLS` calls of
  :data:`COSTLY_FUNCTIONS`. SQLite checks its deadline only between loop iterations, so these
  caps bound the work of one straight run of instructions (e.g. 30 ``LIKE`` on 120 KB in one
  row, or a CTE column repeated by the query flattener);
- stops at the deadline through SQLite's progress handler (checked every :data:`PROGRESS_STEPS`
  virtual-machine instructions). What it cannot stop -- SQLite sorts an ``ORDER BY`` held in
  memory in one step (8M rows take ~9 s) -- ends with the checker, killed by the isolation at
  the deadline plus :data:`DEADLINE_GRACE_S`;
- reads text as UTF-8 with invalid bytes kept as lone surrogates (``surrogateescape``), so that
  two texts are equal exactly when their bytes are;
- fetches rows one at a time, stopping past :data:`MAX_ROWS` rows or :data:`MAX_RESULT_BYTES`
  bytes as Python holds them (``sys.getsizeof`` of each row and value).

A ```sql block longer than :data:`MAX_SQL_BYTES` is refused before any parsing ("too long"),
and only one statement may run (trailing semicolons and comments are fine).

Caches (per checker): the read-only connections, at most :func:`_connection_budget` open --
never more than a quarter of the checker's open-file limit -- and the results of the queries
that ran without error, per (database file identity, statement), weighed by the bytes Python
holds for them, so that a gold query, a query that the scorer and ``answer_key`` both run, and
the same query sampled many times run once (not a query that reads the clock or draws random
numbers: :data:`UNREPEATABLE`); both are LRU caches. The identity is the file's device, inode,
size, modification and change times: a database replaced or rewritten in place is reopened and
its results recomputed. Connections are dropped in a forked child.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import resource
import sqlite3
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from rllib_dph.envs import isolation
from rllib_dph.envs.arguments import check_timeout
from rllib_dph.envs.isolation import Limits
from rllib_dph.envs.sql.compare import Row, _normalize
from rllib_dph.envs.sql.extract import _code_tokens

logger = logging.getLogger(__name__)

#: Most rows a query may return; more is an error ("result too large").
MAX_ROWS = 100_000
#: Most bytes a query result may hold, as Python holds it (``sys.getsizeof`` of each row tuple
#: and of each value: a short text costs about 50 bytes beyond its characters).
MAX_RESULT_BYTES = 64 * 2**20

#: Longest string or blob SQLite may build (``SQLITE_LIMIT_LENGTH``).
MAX_VALUE_BYTES = 128 * 2**10
#: Longest SQL text (``SQLITE_LIMIT_SQL_LENGTH``); a longer ```sql block is refused before any
#: parsing.
MAX_SQL_BYTES = 100_000
#: Longest ``LIKE``/``GLOB`` pattern (``SQLITE_LIMIT_LIKE_PATTERN_LENGTH``).
MAX_LIKE_PATTERN_BYTES = 100
#: Most function calls the compiled program of a query may hold (SQLite checks its deadline
#: only between loop iterations, so this bounds the work of one straight run of instructions).
MAX_FUNCTION_CALLS = 256
#: Most calls of the built-in functions whose one call may cost the product of its arguments'
#: lengths and that the sandbox keeps (:data:`COSTLY_FUNCTIONS`: ``LIKE``, about 0.025 s on
#: maximal values, too common on large tables to be replaced by a slower Python function).
MAX_COSTLY_CALLS = 8
#: Functions counted against :data:`MAX_COSTLY_CALLS`.
COSTLY_FUNCTIONS = frozenset({"like"})
#: SQLite's process-wide hard heap limit, set by the first sandbox of a process (only lowered,
#: never raised): sorts, ``DISTINCT``, materialised CTEs and other temporary storage live in
#: memory, and a query that needs more than this fails with "out of memory".
MAX_SQLITE_HEAP_BYTES = 1 << 30
#: SQLite virtual-machine instructions between two checks of the deadline.
PROGRESS_STEPS = 10_000
#: Wall seconds past a query's deadline after which the isolation kills its checker (what
#: SQLite cannot interrupt, e.g. a sort held in memory).
DEADLINE_GRACE_S = 0.25
#: Default wall-clock limit of one verification, in seconds.
DEFAULT_TIMEOUT_S = 15.0
#: Bytes of query results kept per checker (:func:`_execute`'s cache): each entry weighs what
#: Python holds for its rows (:func:`_held_bytes`) plus its statement plus RESULT_ENTRY_BYTES,
#: and the least recently used entries leave first.
RESULT_CACHE_BYTES = 64 * 2**20
RESULT_ENTRY_BYTES = 256
#: Most database connections (sandboxes) open at once per checker; each holds one file
#: descriptor. Further capped at one per FILES_PER_CONNECTION of the checker's open-file limit
#: (soft ``RLIMIT_NOFILE``, read at each open).
MAX_OPEN_CONNECTIONS = 256
FILES_PER_CONNECTION = 4


class SQLExecutionError(Exception):
    """A query could not run to completion in the sandbox. ``str(error)`` is a short reason."""


#: Start of the reason of a query that ran out of memory.
OUT_OF_MEMORY = "out of memory"


def _capped(sql: str) -> str:
    """Returns ``sql``, refused before any parsing when longer than MAX_SQL_BYTES.

    Raises:
        SQLExecutionError: ``sql`` is too long.
    """
    size = len(sql) if len(sql) > MAX_SQL_BYTES else len(sql.encode("utf-8", "surrogatepass"))
    if size > MAX_SQL_BYTES:
        raise SQLExecutionError(
            f"SQL too long: {size} bytes, more than the sandbox's {MAX_SQL_BYTES}; the ```sql "
            "block must hold a single SELECT query"
        )
    return sql


def _single_statement(sql: str) -> str:
    """Returns ``sql`` without its trailing semicolons.

    Raises:
        SQLExecutionError: ``sql`` holds no statement, more than one, or an ``EXPLAIN`` (the
            sandbox compiles the query under ``EXPLAIN`` itself to count its function calls).
    """
    end = None  # offset of the first ';'
    first = None  # the first code token, upper-cased
    for match in _code_tokens(sql):
        if match.group() == ";":
            end = match.start() if end is None else end
        elif end is not None:
            raise SQLExecutionError(
                "more than one SQL statement; the ```sql block must hold a single SELECT query"
            )
        elif first is None:
            first = match.group().upper()
    if first is None:
        raise SQLExecutionError("empty SQL: the ```sql block holds no statement")
    if first == "EXPLAIN":
        raise SQLExecutionError(
            "not allowed in the read-only sandbox: EXPLAIN (only SELECT may run)"
        )
    return sql if end is None else sql[:end]


# ---------------------------------------------------------------------------------------------
# The sandbox
# ---------------------------------------------------------------------------------------------

_ALLOWED_ACTIONS = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
)
_DENIED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit"})
_ACTION_NAMES = {
    getattr(sqlite3, f"SQLITE_{name}"): name.replace("_", " ")
    for name in (
        "ALTER_TABLE ANALYZE ATTACH CREATE_INDEX CREATE_TABLE CREATE_TEMP_INDEX CREATE_TEMP_TABLE "
        "CREATE_TEMP_TRIGGER CREATE_TEMP_VIEW CREATE_TRIGGER CREATE_VIEW CREATE_VTABLE DELETE "
        "DETACH DROP_INDEX DROP_TABLE DROP_TEMP_INDEX DROP_TEMP_TABLE DROP_TEMP_TRIGGER "
        "DROP_TEMP_VIEW DROP_TRIGGER DROP_VIEW DROP_VTABLE FUNCTION INSERT PRAGMA READ RECURSIVE "
        "REINDEX SAVEPOINT SELECT TRANSACTION UPDATE"
    ).split()
}
_LIMITS = (
    (sqlite3.SQLITE_LIMIT_ATTACHED, 0),
    (sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES),
    (sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_BYTES + len("EXPLAIN ")),
    (sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, MAX_LIKE_PATTERN_BYTES),
    (sqlite3.SQLITE_LIMIT_WORKER_THREADS, 0),
)


# SQLite's printf (alias format) repeats a %c conversion once per unit of precision even after
# the text is over the length cap: printf('%.*c', 2000000000, 'x') spins for many seconds inside
# one call, where neither the progress handler nor interrupt() can stop it. The sandbox overrides
# both names with a wrapper that answers NULL -- SQLite's own answer for a too-long text -- when
# the format has a 'c' after a '%' and any number it could read as a width or precision (a digit
# run of the format, or any argument as SQLite reads it as a number, numeric prefix of a text
# included) exceeds MAX_VALUE_BYTES. The rule reads no conversion syntax, so it cannot disagree
# with SQLite's parser; it may answer NULL for a harmless call such as printf('%c%d', 'x', 10**9).
# Every other call goes to the built-in printf of a private in-memory connection.
_DIGIT_RUN_RE = re.compile(r"\d+")


def _printf_may_repeat_too_long(fmt: str, magnitudes: Sequence[float]) -> bool:
    """Whether a %c conversion of ``fmt`` could repeat its character more than MAX_VALUE_BYTES
    times, given the absolute numeric values of every argument after the format."""
    percent = fmt.find("%")
    if percent < 0 or "c" not in fmt[percent:]:
        return False
    runs = _DIGIT_RUN_RE.findall(fmt[percent:])
    longest = len(str(MAX_VALUE_BYTES))
    if any(len(run) > longest or int(run) > MAX_VALUE_BYTES for run in runs):
        return True
    return any(not m <= MAX_VALUE_BYTES for m in magnitudes)  # NaN counts as too long


def _decode_text(data: bytes) -> str:
    """Text factory: UTF-8, with the bytes of invalid UTF-8 kept as lone surrogates
    (``surrogateescape``), so that different bytes stay different texts."""
    return data.decode("utf-8", errors="surrogateescape")


def _held_bytes(row: Row) -> int:
    """Bytes Python holds for a row: the tuple and each of its values (``sys.getsizeof``)."""
    return sys.getsizeof(row) + sum(map(sys.getsizeof, row))


_heap_limit_set = False


def _limit_sqlite_heap(conn: sqlite3.Connection) -> None:
    """Sets SQLite's process-wide hard heap limit to MAX_SQLITE_HEAP_BYTES (once; the pragma
    only ever lowers it)."""
    global _heap_limit_set
    if not _heap_limit_set:
        conn.execute(f"PRAGMA hard_heap_limit = {MAX_SQLITE_HEAP_BYTES}")
        _heap_limit_set = True


class _PastDeadline(Exception):
    """Raised by a guarded function called after the deadline (SQLite then stops the query)."""


def _strip_ends(text: str, chars: str, left: bool, right: bool) -> str:
    """``text`` without the characters of ``chars`` at its start and/or end (linear time)."""
    strip = set(chars)
    start, end = 0, len(text)
    while left and start < end and text[start] in strip:
        start += 1
    while right and end > start and text[end - 1] in strip:
        end -= 1
    return text[start:end]


def _text_bytes(value: Any) -> int:
    """Bytes of a text (UTF-8, as SQLite stores it) or a blob; 0 for other values."""
    if isinstance(value, str):
        return len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
    return len(value) if isinstance(value, bytes) else 0


def _replace_bytes(text: Any, old: Any, new: Any) -> int | None:
    """Exact size of ``replace(text, old, new)`` computed in Python (texts), else None (built-in).

    ``str.replace`` and ``str.count`` both take the non-overlapping occurrences from the left, so
    the result holds ``len(text) + count * (len(new) - len(old))`` bytes.
    """
    if not all(isinstance(arg, str) for arg in (text, old, new)):
        return None
    if not old:
        return _text_bytes(text)
    return _text_bytes(text) + text.count(old) * (_text_bytes(new) - _text_bytes(old))


def _trim_bytes(text: Any, chars: Any) -> int | None:
    """Largest size of ``trim(text, chars)`` computed in Python (a slice of the text), else None
    (built-in)."""
    return _text_bytes(text) if isinstance(text, str) and isinstance(chars, str) else None


def _integer_result(*args: Any) -> int:
    """Result size of a function that returns an integer (or NULL)."""
    return 8


def _built_by_sqlite(*args: Any) -> None:
    """Result size of a call computed by a built-in function: SQLite checks the length limit
    itself as it builds the result (the private connection has the sandbox's limits)."""
    return None


class _Undecodable(Exception):
    """A built-in function's result is not valid UTF-8, which a Python function cannot return:
    the query runs again with SQLite's own functions, as for an argument that is not (the
    guarded printf of a blob ``X'ff'`` would otherwise fail a correct answer)."""


class _ValueTooLong(Exception):
    """Raised by a guarded function whose result would exceed MAX_VALUE_BYTES (not built)."""


class _GuardedFunctions:
    """Replacements for the built-in SQL functions of which one call can run long.

    SQLite checks its deadline only between loop iterations, never inside a function call, and
    the built-in ``instr``, ``replace`` and ``trim``/``ltrim``/``rtrim`` with a character set take
    time ``len(X) * len(Y)`` (``ltrim`` of 10 KB by a 10 KB set: 0.5 s), ``glob`` with a set up
    to 0.07 s, ``printf`` with a huge ``%c`` precision many seconds. Each replacement computes the
    same result in linear time on texts and blobs (Python's string search), and hands any other
    argument types to the built-in function of a private in-memory connection.

    Every function is registered (:meth:`install`) with a *result size*: a function of the
    arguments giving the exact or largest size in bytes of the result the Python code would
    build, or None when a built-in function builds it under SQLite's own limit. Each call first
    checks the deadline, so that a straight run of calls stops there, then the result size
    against :data:`MAX_VALUE_BYTES` (``SQLITE_LIMIT_LENGTH``): a result over the limit is refused
    before it is built, as SQLite's own functions do ("string or blob too big"), so no call
    allocates more than a few times the limit (``replace`` of 128 KB by 128 KB would otherwise
    build 16 GB before SQLite refused it).

    Args:
        deadline: Returns the deadline (``time.monotonic()`` seconds) of the running query.
    """

    def __init__(self, deadline: Callable[[], float]):
        self._deadline = deadline
        self.builtin = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        self.builtin.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        self.builtin.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, MAX_LIKE_PATTERN_BYTES)
        #: Why the last guarded call of the current query failed, if one did (read by the
        #: sandbox for its error message; reset before each query).
        self.failure: str | None = None

    def registrations(self) -> list[tuple[str, int, Callable, Callable[..., int | None]]]:
        """``(name, number of arguments, function, result size)`` of every guarded function."""
        registrations = [
            ("printf", -1, self.printf, _built_by_sqlite),
            ("format", -1, self.printf, _built_by_sqlite),
            ("instr", 2, self.instr, _integer_result),
            ("replace", 3, self.replace, _replace_bytes),
            ("glob", 2, lambda *args: self.call_builtin("glob", *args), _integer_result),
        ]
        for name in ("trim", "ltrim", "rtrim"):
            registrations.append((name, 2, self._trimmer(name), _trim_bytes))
        return registrations

    def install(self, conn: sqlite3.Connection) -> None:
        """Overrides the built-in functions of ``conn`` by the guarded ones."""
        for name, num_args, function, result_size in self.registrations():
            conn.create_function(
                name, num_args, self._checked(name, function, result_size), deterministic=True
            )

    def close(self) -> None:
        self.builtin.close()

    def _checked(self, name: str, function: Callable, result_size: Callable) -> Callable:
        """``function`` behind the deadline and the length limit (see the class docstring)."""

        def call(*args):
            if time.monotonic() > self._deadline():
                raise _PastDeadline()
            size = result_size(*args)
            if size is not None and size > MAX_VALUE_BYTES:
                self.failure = (f"string or blob too big: {name}() would build {size} bytes, "
                                f"more than the sandbox's limit of {MAX_VALUE_BYTES}")
                raise _ValueTooLong(self.failure)
            try:
                return function(*args)
            except sqlite3.Error as error:  # the built-in refused, e.g. its result too long
                self.failure = f"{error} (in {name}())"
                raise

        return call

    def call_builtin(self, name: str, *args: Any) -> Any:
        placeholders = ", ".join("?" * len(args))
        try:
            return self.builtin.execute(f"SELECT {name}({placeholders})", args).fetchone()[0]
        except sqlite3.OperationalError as error:
            if str(error).startswith("Could not decode to UTF-8"):
                raise _Undecodable() from None  # not a failure of the query: it runs again
            raise

    def instr(self, haystack: Any, needle: Any) -> Any:
        if type(haystack) is type(needle) and isinstance(haystack, (str, bytes)):
            return haystack.find(needle) + 1  # characters of a text, bytes of a blob
        return self.call_builtin("instr", haystack, needle)

    def replace(self, text: Any, old: Any, new: Any) -> Any:
        if all(isinstance(arg, str) for arg in (text, old, new)):
            return text.replace(old, new) if old else text
        return self.call_builtin("replace", text, old, new)

    def _trimmer(self, name: str) -> Callable[[Any, Any], Any]:
        left, right = name != "rtrim", name != "ltrim"

        def trim(text: Any, chars: Any) -> Any:
            if isinstance(text, str) and isinstance(chars, str):
                return _strip_ends(text, chars, left, right)
            return self.call_builtin(name, text, chars)

        return trim

    def _magnitude(self, value: Any) -> float:
        """``abs(value)`` read as a number the way SQLite reads it (numeric prefix of a text)."""
        if value is None:
            return 0.0
        if not isinstance(value, (str, bytes)):
            return abs(float(value))
        number = self.builtin.execute("SELECT abs(CAST(? AS REAL))", (value,)).fetchone()[0]
        return number or 0.0

    def printf(self, *args: Any) -> Any:
        fmt = args[0] if args else None
        if isinstance(fmt, bytes):
            fmt = fmt.decode("utf-8", "replace")
        if isinstance(fmt, str) and _printf_may_repeat_too_long(
            fmt, [self._magnitude(arg) for arg in args[1:]]
        ):
            return None
        return self.call_builtin("printf", *args)


class _Sandbox:
    """A read-only connection to one database file.

    Args:
        path: Absolute path of the database file.
        identity: The file's :func:`_file_identity` when opened.
        guarded: Override the costly built-in functions (:class:`_GuardedFunctions`).
    """

    def __init__(self, path: str, identity: tuple[int, ...], guarded: bool = True):
        self.path = path
        self.identity = identity
        self.deadline = 0.0
        self.denied: str | None = None  # what the authorizer refused in the current statement
        # immutable=1: no locking, no journal or WAL read or created next to the file (a hot
        # journal or a WAL database is read as the main file holds it).
        uri = Path(path).as_uri() + "?mode=ro&immutable=1"
        # isolation_level=None: no implicit BEGIN; cached_statements=0: every statement is
        # prepared, hence authorized, anew.
        self.conn = sqlite3.connect(
            uri, uri=True, isolation_level=None, cached_statements=0, check_same_thread=False
        )
        self.conn.text_factory = _decode_text
        if hasattr(self.conn, "enable_load_extension"):  # absent when Python omits extensions
            self.conn.enable_load_extension(False)
        # Before the authorizer, which denies PRAGMAs: temporary storage in memory only.
        self.conn.execute("PRAGMA query_only = ON")
        self.conn.execute("PRAGMA temp_store = MEMORY")
        _limit_sqlite_heap(self.conn)
        for category, limit in _LIMITS:
            self.conn.setlimit(category, limit)
        self.functions = _GuardedFunctions(lambda: self.deadline)
        if guarded:
            self.functions.install(self.conn)
        self.conn.set_authorizer(self._authorize)

    def close(self) -> None:
        self.conn.close()
        self.functions.close()

    def _authorize(self, action: int, arg1, arg2, db_name, source) -> int:
        if action in _ALLOWED_ACTIONS and not (
            action == sqlite3.SQLITE_FUNCTION and arg2.lower() in _DENIED_FUNCTIONS
        ):
            return sqlite3.SQLITE_OK
        # SQLite stops at the first denial. Name the action and its object (table, pragma,
        # function, file), e.g. "INSERT sqlite_master" for CREATE TABLE.
        detail = arg2 if action == sqlite3.SQLITE_FUNCTION else arg1
        name = _ACTION_NAMES.get(action, f"action {action}")
        self.denied = f"{name} {detail}" if detail else name
        return sqlite3.SQLITE_DENY

    def _past_deadline(self) -> bool:
        return time.monotonic() > self.deadline  # a true value makes SQLite interrupt the query

    def run(self, sql: str, deadline: float) -> list[Row]:
        """Runs one statement and returns its rows (floats normalized); stops at the deadline
        through the progress handler.

        Raises:
            SQLExecutionError: The statement was denied, failed, timed out or returned too much.
        """
        self.deadline = deadline
        self.denied = None
        self.functions.failure = None
        self.conn.set_progress_handler(self._past_deadline, PROGRESS_STEPS)
        try:
            self._check_program(sql)
            return self._fetch(sql)
        except (sqlite3.Error, sqlite3.Warning, MemoryError) as error:
            if self._undecodable_argument(error):
                return self._run_with_builtins(sql, deadline)
            raise SQLExecutionError(self._reason(error)) from None
        finally:
            self.conn.set_progress_handler(None, 0)

    def _undecodable_argument(self, error: Exception) -> bool:
        """Whether a guarded function failed on text that is not valid UTF-8: Python cannot take
        it as an argument (the function failed before its code ran), nor return it
        (:class:`_Undecodable`)."""
        return (str(error) == "user-defined function raised exception" and self.functions.failure is None
                and self.denied is None and time.monotonic() <= self.deadline)

    def _run_with_builtins(self, sql: str, deadline: float) -> list[Row]:
        """Runs ``sql`` again on a connection with SQLite's own functions (module docstring)."""
        sandbox = _Sandbox(self.path, self.identity, guarded=False)
        try:
            return sandbox.run(sql, deadline)
        finally:
            sandbox.close()

    def _check_program(self, sql: str) -> None:
        """Refuses a statement whose compiled program holds too many function calls.

        SQLite's own compiler output (``EXPLAIN``) is read, so a function repeated by the query
        flattener (a CTE column used many times) counts as often as it will run.
        """
        calls = costly = 0
        with contextlib.closing(self.conn.execute("EXPLAIN " + sql)) as program:
            for _, opcode, _, _, _, p4, *_ in program:
                if opcode.startswith(("Function", "PureFunc")):
                    calls += 1
                    costly += str(p4).split("(", 1)[0].lower() in COSTLY_FUNCTIONS
        if calls > MAX_FUNCTION_CALLS:
            raise SQLExecutionError(
                f"query too costly: {calls} function calls in its compiled program "
                f"(at most {MAX_FUNCTION_CALLS})"
            )
        if costly > MAX_COSTLY_CALLS:
            raise SQLExecutionError(
                f"query too costly: {costly} calls of {'/'.join(sorted(COSTLY_FUNCTIONS))} in "
                f"its compiled program (at most {MAX_COSTLY_CALLS})"
            )

    def _fetch(self, sql: str) -> list[Row]:
        """Runs ``sql`` and fetches its rows one at a time (the caps overshoot by one row)."""
        with contextlib.closing(self.conn.execute(sql)) as cursor:
            rows: list[Row] = []
            size = 0
            for row in cursor:
                rows.append(row)
                size += _held_bytes(row)
                if len(rows) > MAX_ROWS:
                    raise SQLExecutionError(f"result too large: more than {MAX_ROWS} rows")
                if size > MAX_RESULT_BYTES:
                    raise SQLExecutionError(f"result too large: more than {MAX_RESULT_BYTES} bytes")
        return [tuple(map(_normalize, row)) for row in rows]

    def _reason(self, error: Exception) -> str:
        if self.denied is not None:
            return f"not allowed in the read-only sandbox: {self.denied} (only SELECT may run)"
        if isinstance(error, MemoryError):
            return (
                f"{OUT_OF_MEMORY}: SQLite's heap limit ({MAX_SQLITE_HEAP_BYTES >> 20} MiB per "
                "process, temporary storage included) was reached"
            )
        stopped = ("interrupted", "user-defined function raised exception")
        if str(error) in stopped and time.monotonic() > self.deadline:
            return "timed out: the query ran past its time limit"
        if str(error) == stopped[1] and self.functions.failure is not None:
            return f"SQL error: {self.functions.failure}"
        return f"SQL error: {error}"


def _file_identity(db_path: str) -> tuple[str, tuple[int, ...]]:
    """Returns the absolute path of the database file and its (device, inode, size, mtime_ns,
    ctime_ns): a file replaced, or rewritten in place, gets a new identity."""
    path = os.path.abspath(db_path)
    try:
        stat = os.stat(path)
    except OSError:
        raise SQLExecutionError(f"database file not found: {path}") from None
    return path, (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def _connection_budget() -> int:
    """Most sandboxes open at once now: MAX_OPEN_CONNECTIONS, and at most 1 per
    FILES_PER_CONNECTION of the process's open-file limit (soft ``RLIMIT_NOFILE``), at least 1."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return MAX_OPEN_CONNECTIONS
    return max(1, min(MAX_OPEN_CONNECTIONS, soft // FILES_PER_CONNECTION))


def _out_of_file_handles(path: str) -> bool:
    """Whether opening ``path`` now fails for lack of a file descriptor (EMFILE / ENFILE)."""
    try:
        os.close(os.open(path, os.O_RDONLY))
    except OSError as error:
        return error.errno in (errno.EMFILE, errno.ENFILE)
    return False


class _Connections:
    """The sandboxes of this process (read-only connections, one file descriptor each), at most
    :func:`_connection_budget` open: the least recently used idle one closes first. A query
    takes the idle sandbox of its file (one whose file changed is closed), else opens one;
    should the open fail for lack of a file descriptor, the idle ones are closed and the open
    tried once more."""

    def __init__(self):
        self._lock = threading.Lock()
        self._idle: OrderedDict[int, _Sandbox] = OrderedDict()  # id -> sandbox, LRU first
        self._open = 0  # sandboxes open, in use or idle
        self._parents: list = []  # see forget()

    @property
    def open_count(self) -> int:
        """Sandboxes open now (idle or in use)."""
        return self._open

    @contextlib.contextmanager
    def sandbox(self, path: str, identity: tuple[int, ...]) -> Iterator[_Sandbox]:
        """A sandbox of ``path`` for this thread's use until the block ends.

        Raises:
            SQLExecutionError: The file cannot be opened.
        """
        sandbox = self._take(path, identity) or self._open_new(path, identity)
        try:
            yield sandbox
        finally:
            with self._lock:
                self._idle[id(sandbox)] = sandbox

    def _take(self, path: str, identity: tuple) -> _Sandbox | None:
        with self._lock:
            found = next((s for s in reversed(self._idle.values()) if s.path == path), None)
            if found is not None:
                del self._idle[id(found)]
        if found is not None and found.identity != identity:  # the file changed since
            self._close(found)
            return None
        return found

    def _open_new(self, path: str, identity: tuple) -> _Sandbox:
        """Opens a sandbox in a slot reserved first (so that threads opening at once never pass
        the budget together), closing the least recently used idle ones to make room."""
        self._reserve()
        try:
            for retry in (False, True):
                try:
                    return _Sandbox(path, identity)
                except sqlite3.Error as error:
                    if retry or not _out_of_file_handles(path):
                        raise SQLExecutionError(f"cannot open database {path}: {error}") from None
                    while self._close_least_recent():  # free descriptors, then try once more
                        pass
        except BaseException:
            with self._lock:
                self._open -= 1
            raise

    def _reserve(self) -> None:
        """Counts a sandbox about to open, once fewer than the budget are open or none is idle
        to close (all in use: only more threads than the budget can get there)."""
        while True:
            with self._lock:
                if self._open < _connection_budget() or not self._idle:
                    self._open += 1
                    return
                sandbox = self._idle.popitem(last=False)[1]
            self._close(sandbox)

    def _close(self, sandbox: _Sandbox) -> None:
        sandbox.close()
        with self._lock:
            self._open -= 1

    def _close_least_recent(self) -> bool:
        """Closes the least recently used idle sandbox; False when none is idle."""
        with self._lock:
            if not self._idle:
                return False
            sandbox = self._idle.popitem(last=False)[1]
        self._close(sandbox)
        return True

    def forget(self) -> None:
        """In a forked child: start with no sandbox. The parent's are kept referenced, never
        used or closed here (SQLite connections must not cross a fork)."""
        parents = self._parents + list(self._idle.values())
        self.__init__()
        self._parents = parents


_CONNECTIONS = _Connections()
os.register_at_fork(after_in_child=_CONNECTIONS.forget)


#: Statements whose result may differ between two runs on the same file (SQLite's random
#: numbers and the time now: ``'now'``, ``CURRENT_*``, a date function called without a time
#: value, e.g. ``date()`` or ``strftime('%Y')``): never served from the result cache.
UNREPEATABLE = re.compile(
    r"random|current_(date|time)|['\"]now['\"]|\b(date|time|datetime|julianday|unixepoch)\s*\(\s*\)"
    r"|\bstrftime\s*\(\s*('[^']*'|\"[^\"]*\")\s*\)",
    re.IGNORECASE,
)


def sql_limits(timeout_s: float, label: str = "verifier") -> Limits:
    """The isolation limits of a SQL call with this ``timeout_s``: the checker is killed at the
    deadline plus DEADLINE_GRACE_S, should the sandbox not have stopped the query by then."""
    return Limits(wall_s=timeout_s, grace_s=DEADLINE_GRACE_S, setting="timeout_s", label=label)


def _execute(sql: str, db_path: str, deadline: float) -> list[Row]:
    """Runs ``sql`` in this process's sandbox of the database file before ``deadline`` (in a
    checker); a statement that ran without error on the same file before is answered from the
    result cache (unless :data:`UNREPEATABLE`). Errors are never cached: a time-out or an
    out-of-memory failure may not happen again."""
    statement = _single_statement(_capped(sql))
    identity = _file_identity(db_path)
    key = (identity, statement)
    rows = _results.get(key)
    if rows is None:
        with _CONNECTIONS.sandbox(*identity) as sandbox:
            rows = tuple(sandbox.run(statement, deadline))
        if not UNREPEATABLE.search(statement):
            weight = RESULT_ENTRY_BYTES + sys.getsizeof(statement) + sys.getsizeof(rows)
            _results.put(key, rows, weight + sum(map(_held_bytes, rows)))
    return list(rows)


def _execute_within(sql: str, db_path: str, timeout_s: float) -> list[Row]:
    """:func:`_execute` with its deadline ``timeout_s`` from now (the call a checker runs)."""
    return _execute(sql, db_path, time.monotonic() + timeout_s)


def execute_sql(sql: str, db_path: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Row]:
    """Runs one read-only SQL statement in the sandbox, in the isolation, and returns its rows.

    Args:
        sql: A single statement (trailing semicolons and comments allowed).
        db_path: Path of the SQLite database file.
        timeout_s: Wall-clock limit in seconds.

    Returns:
        The result rows as tuples, floats rounded to FLOAT_DIGITS significant digits.

    Raises:
        SQLExecutionError: The statement is not a single read-only query, failed, timed out,
            stopped its checker, or returned more than MAX_ROWS rows or MAX_RESULT_BYTES bytes;
            ``str(error)`` says which.
        ArgumentError: ``timeout_s`` is not a number of seconds in [MIN_TIMEOUT_S,
            MAX_TIMEOUT_S] of ``rllib_dph.envs.arguments`` (a caller error).
    """
    timeout_s = check_timeout(timeout_s, where="execute_sql", default=DEFAULT_TIMEOUT_S)
    try:
        return isolation.run(_execute_within, sql, db_path, timeout_s, limits=sql_limits(timeout_s, "query"))
    except isolation.IsolationFailure as failure:
        raise SQLExecutionError(failure.reason) from None


class _LRUCache:
    """A thread-safe least-recently-used mapping holding at most ``max_weight`` (the sum of its
    entries' weights); an entry heavier than that is not kept."""

    def __init__(self, max_weight: int):
        self.max_weight = max_weight
        self.weight = 0
        self._data: OrderedDict = OrderedDict()  # key -> (value, weight)
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                return None
            self._data.move_to_end(key)
            return entry[0]

    def put(self, key, value, weight: int) -> None:
        if weight > self.max_weight:
            return
        with self._lock:
            old = self._data.pop(key, None)
            self.weight += weight - (old[1] if old else 0)
            self._data[key] = (value, weight)
            while self.weight > self.max_weight:
                self.weight -= self._data.popitem(last=False)[1][1]


_results = _LRUCache(RESULT_CACHE_BYTES)
