"""The verifiers under hostile input, one section per class:
result lengths of the Python-side SQL functions, int/float comparison, open files, numeric
arguments, Markdown around a math answer. See docs/verifiers.md."""

import itertools
import math
import os
import sqlite3
import subprocess
import sys
import time

import pytest

from rllib_dph.envs.base import Task
from rllib_dph.envs.math import MathEnv, extract_answer, set_checker_pool, verify_math
from rllib_dph.envs.sql import SQLEnv, execute_sql, sql_reward, verify_sql
from rllib_dph.envs.sql.sandbox import (
    FILES_PER_CONNECTION,
    MAX_VALUE_BYTES,
    SQLExecutionError,
    _GuardedFunctions,
    _text_bytes,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fenced(sql):
    return f"```sql\n{sql}\n```"


def make_db(path, numbers=()):
    """A database with one table ``t(n INTEGER)`` holding ``numbers``."""
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (n INTEGER)")
        conn.executemany("INSERT INTO t VALUES (?)", [(n,) for n in numbers])
    conn.close()
    return str(path)


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return make_db(tmp_path_factory.mktemp("hostile") / "t.sqlite", range(10))


def run_python(code, *args, timeout=120):
    """Runs ``code`` in a fresh interpreter with this checkout on its path; returns its stdout."""
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": ROOT}, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out.stdout


# ---------------------------------------------------------------------------------------------
# 1. Python-side SQL functions respect SQLite's length limit before building their result
# ---------------------------------------------------------------------------------------------

_PEAK_GROWTH = """
import resource, sys, time
from rllib_dph.envs.sql import verify_sql
db, sql = sys.argv[1], sys.argv[2]
verify_sql("```sql\\nSELECT 1\\n```", "SELECT 1", db)  # everything imported and opened
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.monotonic()
verdict = verify_sql("```sql\\n" + sql + "\\n```", "SELECT 1", db, timeout_s=10)
seconds = time.monotonic() - start
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(verdict.reward, seconds, grown * 1024, verdict.error, sep="\\n")
"""

A = "printf('%.*c', {n}, 'a')"


@pytest.mark.parametrize(
    "sql,size",
    [  # before the fix: 1 GB, then 14 GB of Python strings built and refused by SQLite
        (f"SELECT replace({A.format(n=100_000)}, 'a', {A.format(n=10_000)})", 10**9),
        (f"SELECT replace({A.format(n=120_000)}, 'a', {A.format(n=120_000)})", 120_000**2),
    ],
)
def test_a_too_long_result_is_refused_before_it_is_built(db, sql, size):
    reward, seconds, grown, error = run_python(_PEAK_GROWTH, db, sql).splitlines()
    assert float(reward) == 0.0
    assert error == (f"SQL error: string or blob too big: replace() would build {size} bytes, "
                     f"more than the sandbox's limit of {MAX_VALUE_BYTES}")
    assert float(seconds) < 2.0  # about 0.1 s; the 1 GB one took 1.7 s before
    assert int(grown) < 32 * 2**20  # peak RSS; the result itself would be >= 1 GB


@pytest.mark.parametrize("count", [MAX_VALUE_BYTES // 2 - 1, MAX_VALUE_BYTES // 2,
                                   MAX_VALUE_BYTES // 2 + 1])
def test_the_limit_is_counted_in_utf8_bytes_as_sqlite_does(db, count):
    """'a' -> 'é' doubles the bytes: the sandbox refuses exactly what SQLite's own replace does."""
    sql = f"SELECT length(replace({A.format(n=count)}, 'a', 'é'))"
    with sqlite3.connect(":memory:") as plain:
        plain.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        try:
            expected = plain.execute(sql).fetchall()
        except sqlite3.DataError:
            expected = None
    try:
        got = execute_sql(sql, db)
    except SQLExecutionError as error:
        assert "string or blob too big" in str(error)
        got = None
    assert got == expected
    assert (got is None) == (2 * count > MAX_VALUE_BYTES)


_SAMPLES = ["", "a", "ab", "é", "aéa", "abab", "ééé" * 5, b"", b"ab", b"\x00a\x00", 0, 12, 2.5,
            None, "%c%s", "%.3c", "%-5s|%d"]


def _registered_names():
    functions = _GuardedFunctions(lambda: 0)
    names = sorted({registration[0] for registration in functions.registrations()})
    functions.close()
    return names


@pytest.mark.parametrize("name", _registered_names())
def test_every_python_side_function_declares_a_true_result_size(name):
    """For each registered function and every sample argument tuple, the declared size bounds
    the result (None: the built-in function builds it under the limit itself)."""
    functions = _GuardedFunctions(lambda: math.inf)
    registration = {r[0]: r for r in functions.registrations()}[name]
    _, num_args, function, result_size = registration
    checked = 0
    for args in itertools.product(_SAMPLES, repeat=3 if num_args == -1 else num_args):
        try:
            result = function(*args)
        except sqlite3.Error:
            continue
        size = result_size(*args)
        actual = 0 if result is None else 8  # NULL, an integer
        if isinstance(result, (str, bytes)):
            actual = _text_bytes(result)
        assert actual <= (MAX_VALUE_BYTES if size is None else size), (name, args, result, size)
        checked += 1
    functions.close()
    assert checked > len(_SAMPLES)


# ---------------------------------------------------------------------------------------------
# 2. Integers and floats of the same value compare equal at every magnitude
# ---------------------------------------------------------------------------------------------

MAGNITUDES = [5, -7, 10**11 + 7, 1_234_567_890_123, -98_765_432_109_876, 10**15 + 1,
              2**53 - 1, 2**53, 2**60, -(2**62), 2**63 - 2**10]


@pytest.mark.parametrize("n", MAGNITUDES)
@pytest.mark.parametrize("cmp_method", ["bird", "spider"])
def test_an_integer_equals_its_float_twin(db, n, cmp_method):
    assert float(n) == n  # exactly representable: the same number
    as_int, as_float = f"SELECT {n}", f"SELECT CAST({n} AS REAL)"
    assert sql_reward(fenced(as_float), as_int, db, cmp_method=cmp_method) == 1.0
    assert sql_reward(fenced(as_int), as_float, db, cmp_method=cmp_method) == 1.0


@pytest.mark.parametrize("n", MAGNITUDES)
def test_distinct_integers_stay_distinct(db, n):
    neighbour = n + 1 if abs(n) < 2**53 else n + 2**11
    assert sql_reward(fenced(f"SELECT {neighbour}"), f"SELECT {n}", db) == 0.0
    assert sql_reward(fenced(f"SELECT CAST({neighbour} AS REAL)"), f"SELECT {n}", db) == 0.0


def test_beyond_2_53_an_integer_and_a_float_are_equal_only_when_their_values_are(db):
    n = 2**53 + 1  # float(n) == 2**53: another number (SQLite's own = says so too)
    with sqlite3.connect(":memory:") as plain:
        assert plain.execute(f"SELECT {n} = CAST({n} AS REAL)").fetchone() == (0,)
    assert sql_reward(fenced(f"SELECT CAST({n} AS REAL)"), f"SELECT {n}", db) == 0.0
    assert sql_reward(fenced(f"SELECT CAST({n} AS REAL)"), f"SELECT {2**53}", db) == 1.0


def test_sum_and_total_agree_on_large_integers(tmp_path):
    """SUM of integers is an integer, TOTAL a float: the same result beyond 12 digits."""
    big = make_db(tmp_path / "big.sqlite", [123_456_789_012_345, 987_654_321_098, 7])
    assert sql_reward(fenced("SELECT TOTAL(n) FROM t"), "SELECT SUM(n) FROM t", big) == 1.0
    assert sql_reward(fenced("SELECT SUM(n) * 1.0 FROM t"), "SELECT SUM(n) FROM t", big) == 1.0
    assert sql_reward(fenced("SELECT SUM(n) + 1 FROM t"), "SELECT SUM(n) FROM t", big) == 0.0


@pytest.mark.parametrize(
    "gold,pred,expected",
    [
        ("SELECT 1234567890123.0", "SELECT 1234567890123.0001", 1.0),  # last bits of a float
        ("SELECT 1234567890123", "SELECT 1234567890122.9999", 1.0),
        ("SELECT 1234567890123.0", "SELECT 1234567890124.0", 0.0),  # one unit apart
        ("SELECT 0.1 + 0.2", "SELECT 0.3", 1.0),  # below 1e11: 12 significant digits, as before
        ("SELECT 0.3", "SELECT 0.30001", 0.0),
    ],
)
def test_float_rounding_is_never_coarser_than_an_integer(db, gold, pred, expected):
    assert sql_reward(fenced(pred), gold, db) == expected


# ---------------------------------------------------------------------------------------------
# 3. Open connections stay within the process's open-file limit
# ---------------------------------------------------------------------------------------------

_MANY_DATABASES = """
import os, resource, sys, threading
from concurrent.futures import ThreadPoolExecutor
limit, folder = int(sys.argv[1]), sys.argv[2]
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
import rllib_dph.envs.isolation
import rllib_dph.envs.sql
import rllib_dph.envs.sql.sandbox
rllib_dph.envs.isolation._IN_CHECKER = True  # the sandboxes open here, as in one checker
paths = sorted(os.path.join(folder, name) for name in os.listdir(folder))
peak, lock = [0], threading.Lock()

def score(i):
    path = paths[i % len(paths)]
    reward = rllib_dph.envs.sql.sql_reward("```sql\\nSELECT count(*) + 0.0 FROM t\\n```",
                                 "SELECT COUNT(*) FROM t", path)
    with lock:
        peak[0] = max(peak[0], len(os.listdir("/proc/self/fd")))
    return reward

with ThreadPoolExecutor(16) as pool:
    rewards = list(pool.map(score, range(3 * len(paths))))
print(sum(r == 1.0 for r in rewards), len(rewards), peak[0], rllib_dph.envs.sql.sandbox._CONNECTIONS.open_count)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_scoring_many_databases_from_many_threads_stays_under_the_open_file_limit(tmp_path):
    folder = tmp_path / "dbs"
    folder.mkdir()
    for i in range(300):
        make_db(folder / f"{i}.sqlite", range(i % 7))
    limit = 128  # far below 32 query threads x 64 cached connections each (before the fix)
    correct, calls, peak, open_now = map(int, run_python(_MANY_DATABASES, limit, folder).split())
    assert correct == calls == 900
    assert peak < limit
    assert open_now <= limit // FILES_PER_CONNECTION


_NO_FREE_DESCRIPTOR = """
import os, sys
import rllib_dph.envs.isolation
import rllib_dph.envs.sql
import rllib_dph.envs.sql.sandbox
rllib_dph.envs.isolation._IN_CHECKER = True  # the sandboxes open here, as in one checker
paths = sys.argv[1:]
score = lambda path: rllib_dph.envs.sql.sql_reward("```sql\\nSELECT 3\\n```", "SELECT COUNT(*) FROM t", path)
print(all(score(path) == 1.0 for path in paths[:-1]))  # leaves idle connections open
held = []
try:
    while True:  # the rest of the process takes every free descriptor
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
print(score(paths[-1]) == 1.0, rllib_dph.envs.sql.sandbox._CONNECTIONS.open_count)
"""


def test_a_new_database_opens_when_the_process_has_no_free_descriptor(tmp_path):
    """An idle connection is closed to make room: a correct answer never scores 0 for lack of
    a file handle while one can be freed."""
    paths = [make_db(tmp_path / f"{i}.sqlite", range(3)) for i in range(6)]
    first, last = run_python(_NO_FREE_DESCRIPTOR, *paths).splitlines()
    assert first == "True"
    reopened, open_now = last.split()
    assert reopened == "True" and int(open_now) <= 5


# ---------------------------------------------------------------------------------------------
# 4. Numeric arguments are validated
# ---------------------------------------------------------------------------------------------

BAD_TIMEOUTS = [math.inf, -math.inf, math.nan, 0, -1.0, 1e-9, 1e10, 1e300]
WRONG_TYPES = ["5", None, True]


def _math_task():
    return Task("m0", "test", ({"role": "user", "content": "1+1?"},), "2")


def _sql_task(db):
    truth = {"db_path": db, "gold_sql": "SELECT 1", "cmp_method": "bird"}
    return Task("s0", "test", ({"role": "user", "content": "one?"},), truth)


def _callers(db):
    return {
        "verify_sql": lambda t: verify_sql(fenced("SELECT 1"), "SELECT 1", db, timeout_s=t),
        "execute_sql": lambda t: execute_sql("SELECT 1", db, timeout_s=t),
        "SQLEnv": lambda t: SQLEnv.from_tasks([_sql_task(db)], timeout_s=t),
        "verify_math": lambda t: verify_math("\\boxed{2}", "2", timeout_s=t),
        "MathEnv": lambda t: MathEnv.from_tasks([_math_task()], timeout_s=t),
    }


@pytest.mark.parametrize("caller", ["verify_sql", "execute_sql", "SQLEnv", "verify_math",
                                    "MathEnv"])
def test_bad_timeouts_are_refused_with_value_rule_and_fix(db, caller):
    call = _callers(db)[caller]
    for value in BAD_TIMEOUTS:
        with pytest.raises(ValueError) as error:
            call(value)
        message = str(error.value)
        assert f"{caller}: timeout_s={value!r} is outside [0.01, 3600]" in message
        assert "pass a finite number in that range" in message
    for value in WRONG_TYPES:
        with pytest.raises(TypeError, match=f"timeout_s={value!r} is a"):
            call(value)
    assert call(2) is not None  # an int number of seconds is fine


@pytest.mark.parametrize("penalty", [math.nan, math.inf, -0.5, 2.0])
def test_format_penalty_is_checked(db, penalty):
    with pytest.raises(ValueError, match="format_penalty="):
        verify_sql("no sql", "SELECT 1", db, format_penalty=penalty)
    with pytest.raises(ValueError, match="SQLEnv: format_penalty="):
        SQLEnv.from_tasks([_sql_task(db)], format_penalty=penalty)
    assert verify_sql("no sql", "SELECT 1", db, format_penalty=0.5).reward == -0.5


@pytest.mark.parametrize("kwargs", [{"idle_s": math.inf}, {"idle_s": math.nan}, {"idle_s": 0},
                                    {"idle_s": 1e12}, {"size": 0}, {"size": True},
                                    {"size": 10**6}, {"size": 2.0}])
def test_checker_pool_bounds_are_checked(kwargs):
    from rllib_dph.envs.isolation import _POOL

    before = (_POOL.size, _POOL.idle_s)
    with pytest.raises(ValueError, match=f"set_checker_pool: {next(iter(kwargs))}="):
        set_checker_pool(**kwargs)
    assert (_POOL.size, _POOL.idle_s) == before


def test_a_registered_verifier_with_a_bad_timeout_raises_instead_of_scoring_0():
    """FunctionVerifierEnv scores a verifier's exceptions 0, but not an argument error: with
    timeout_s=inf every step would score 0."""
    import gymnasium as gym

    import rllib_dph.envs

    rllib_dph.envs.register_verifier_env(
        "test/MathInf-v0", verifier=verify_math, timeout_s=math.inf,
        data=[{"question": "1+1", "answer": "2"}], prompt_format="{question}",
    )
    env = gym.make("test/MathInf-v0")
    env.reset(options={"index": 0})
    with pytest.raises(ValueError, match="verify_math: timeout_s=inf is outside"):
        env.step("\\boxed{2}")
    env = gym.make("test/MathInf-v0", timeout_s=2.0)
    env.reset(options={"index": 0})
    assert env.step("\\boxed{2}")[1] == 1.0


# ---------------------------------------------------------------------------------------------
# 5. Markdown emphasis around a math answer without \boxed{}
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion,expected",
    [
        ("So the answer is **5**.", "5"),
        ("The answer is __5__", "5"),
        ("The answer is *5*", "5"),
        ("The answer is _5_.", "5"),
        ("The final answer is ***5***.", "5"),
        ("The answer is: **$\\frac{1}{2}$**.", "\\frac{1}{2}"),
        ("The answer is **12** apples.", "12"),
        ("**The answer is 5**", "5"),
        ("__The answer is 5.__", "5"),
        ("The answer is 2*3*4.", "2*3*4"),  # stars inside the answer stay
        ("The answer is x_1", "x_1"),
        ("The answer is **", None),
    ],
)
def test_markdown_emphasis_around_the_answer(completion, expected):
    assert extract_answer(completion) == expected


def test_an_emphasised_answer_scores_1():
    verdict = verify_math("Adding them up, the answer is **5**.", "5")
    assert verdict.correct and verdict.reward == 1.0


def test_an_unclosed_emphasis_on_a_long_line_is_read_in_linear_time():
    start = time.monotonic()
    assert extract_answer("The answer is **" + "1" * 1_000_000) == "1" * 1_000_000
    assert time.monotonic() - start < 0.5
