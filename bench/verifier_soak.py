"""Soak test of the SQL and math verifiers under hostile load.

SQL completions from our own generators of hostile queries (every class the sandbox guards
against, plus the adversarial table of tests/test_sql_verifier.py, at random sizes) mixed with
known-correct ones, and pathological math answers mixed with correct ones, all scored through
the environments (``SQLEnv`` / ``MathEnv``, ``reset`` + ``step``) by `--workers` processes with
`--threads` threads each. The databases are a plain one, a WAL-mode one and one with a hot
journal left by a crashed writer. SQLite and the workers get a temp folder of their own
(``TMPDIR``/``SQLITE_TMPDIR``).

It prints calls, latency (p50 / p99 / max) against the timeout, database bytes changed, files
created under the database folder and the temp folder, the peak temp-disk use (those folders
plus SQLite temporary files held open by the workers) and the peak memory (proportional set size)
of the workers with their checker subprocesses and fork servers, checker processes left after
the workers exit, and correct answers scored 0. Targets: max latency <= timeout + 1 s, 0 bytes
changed, 0 files, 0 false zeros, 0 processes left (exit status 1 when one is missed).

    python bench/verifier_soak.py                              # 10,000 SQL + 1,000 math calls
    python bench/verifier_soak.py --sql-calls 1000 --math-calls 200
"""

import argparse
import multiprocessing
import os
import pathlib
import random
import re
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.test_math_verifier import HOSTILE as HOSTILE_MATH  # noqa: E402
from tests.test_sql_verifier import (  # noqa: E402
    ADVERSARIAL,
    make_db,
    make_hot_journal_db,
    make_wal_db,
)

#: Known-correct SQL: (gold query, an equivalent prediction).
CORRECT_SQL = [
    ("SELECT name FROM singer WHERE age > 30",
     "SELECT s.name FROM singer AS s WHERE NOT s.age <= 30"),
    ("SELECT COUNT(*) FROM singer", "SELECT 5.0"),
    ("SELECT AVG(age) FROM singer", "SELECT SUM(age) * 1.0 / COUNT(*) FROM singer"),
    ("SELECT country, COUNT(*) FROM singer GROUP BY country",
     "SELECT country, COUNT(id) FROM singer GROUP BY 1 ORDER BY 2 DESC"),
    ("SELECT name FROM singer WHERE name LIKE '%e%'",
     "SELECT name FROM singer WHERE instr(lower(name), 'e') > 0"),
    ("SELECT SUM(n) FROM numbers", "SELECT 199 * 200 / 2"),
    ("SELECT COUNT(*) FROM numbers a, numbers b WHERE a.n < b.n", "SELECT SUM(n) FROM numbers"),
    ("SELECT MAX(n) FROM numbers WHERE n % 7 = 3",
     "SELECT n FROM numbers WHERE n % 7 = 3 ORDER BY n DESC LIMIT 1"),
    ("SELECT printf('%05d', MAX(age)) FROM singer", "SELECT '000' || MAX(age) FROM singer"),
    ("SELECT replace(name, 'e', 'E') FROM singer",
     "SELECT substr(name, 1, 1) || replace(substr(name, 2), 'e', 'E') FROM singer"),
]
#: Known-correct math: (gold, predicted answer); all need Math-Verify (no fast path).
CORRECT_MATH = [
    ("x+1", "1+x"), ("2\\sqrt{3}", "\\sqrt{12}"), ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
    ("50\\%", "0.5"), ("\\{1,2\\}", "\\{2,1\\}"), ("\\pi", "3.14159265"),
    ("(1,2)", "\\left(1,2\\right)"), ("\\text{(A)}", "A"), ("x^2+2x+1", "(x+1)^2"),
]
BIG = "printf('%.*c', {n}, 'a')"


def _hostile_sql(rng: random.Random, db_dir: str) -> tuple[str, str]:
    """One hostile completion of a random class and size: (class, completion)."""
    n, k = rng.choice([1_000, 30_000, 120_000]), rng.randint(2, 40)
    strings = f"s(a, b) AS (SELECT {BIG.format(n=n)}, {BIG.format(n=n // 2)} || 'b')"
    fn = rng.choice(["instr(a, b)", "replace(a, b, 'z')", "length(ltrim(a, b || 'a'))",
                     "(a LIKE '%' || substr(b, 1, 98))",
                     "(a GLOB '*[a' || substr(b, 1, 95) || ']b')"])
    width = rng.choice(["2000000000", "'2000000000x'", "2e9", "-2000000000", "' 2e9'"])
    cross = "FROM numbers a, numbers b, numbers c"
    classes = {
        "printf": lambda: f"SELECT printf('%.*c', {width}, 'x')",
        "costly run": lambda: f"WITH {strings} SELECT {' + '.join([fn] * k)} FROM s",
        "flattened": lambda: f"WITH {strings}, t(v) AS (SELECT {fn} FROM s) "
                             f"SELECT {' + '.join(['v'] * k)} FROM t",
        "many calls": lambda: f"WITH {strings} SELECT "
                              + " + ".join(["length(upper(a))"] * (k * 10)) + " FROM s",
        "cross join": lambda: "SELECT count(*) FROM "
                              + ", ".join(f"numbers t{i}" for i in range(rng.randint(3, 5))),
        "recursion": lambda: "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
                             "SELECT count(*) FROM c",
        "temp storage": lambda: "WITH x AS MATERIALIZED (SELECT "
                                f"randomblob({rng.choice([100, 10_000, 100_000])}) {cross}) "
                                "SELECT count(*) FROM x",
        "sort": lambda: f"SELECT a.n, randomblob({rng.choice([10, 1000])}) {cross} "
                        "ORDER BY random()",
        "distinct": lambda: f"SELECT count(DISTINCT randomblob(64)) {cross}",
        "long sql": lambda: "SELECT " + "1 + " * rng.choice([30_000, 300_000, 2_500_000]) + "1",
        "table": lambda: rng.choice(ADVERSARIAL)[0].format(dir=db_dir),
    }
    name = rng.choice(sorted(classes))
    sql = classes[name]()
    if name in ("costly run", "flattened"):
        name += " " + re.search(r"[a-z]+ ?\(|LIKE|GLOB", fn).group().strip(" (").lower()
    if rng.random() < 0.02:
        return "fences", "```sql\n" * rng.choice([10_000, 1_500_000])  # 70 KB or 10 MB
    return name, f"```sql\n{sql}\n```"


def _hostile_math(rng: random.Random) -> tuple[str, str]:
    """One pathological math answer of a random class and size: (class, completion)."""
    d = rng.choice([3, 5, 10, 100, 300, 1000])
    classes = {
        **{name: (lambda v=v: v) for name, v in HOSTILE_MATH.items()},
        "tower": lambda: "^{".join([str(rng.randint(2, 9))] * d) + "}" * (d - 1),
        "nested fractions": lambda: "\\frac{" * d + "1" + "}{2}" * d,
        "nested radicals": lambda: "\\sqrt{" * d + "2" + "}" * d,
        "parentheses": lambda: "(" * (d * 3) + "1" + ")" * (d * 3),
        "long sum": lambda: "+".join(["x"] * d * 5),
        "factorials": lambda: f"{rng.randint(10**4, 10**6)}!",
    }
    name = rng.choice(sorted(classes))
    return name, f"So \\boxed{{{classes[name]()}}}"


# ---------------------------------------------------------------------------------------------
# Worker side
# ---------------------------------------------------------------------------------------------


def _tasks(db_paths: list[str]):
    """The SQL tasks (every gold query on every database) and the math tasks."""
    from rllib_dph.envs.base import Task

    def task(i, gold, truth):
        return Task(f"t{i}", "soak", ({"role": "user", "content": gold},), truth)

    sql = [task(i, gold, {"db_path": path, "gold_sql": gold, "cmp_method": "bird"})
           for i, (path, (gold, _)) in enumerate((p, c) for p in db_paths for c in CORRECT_SQL)]
    math = [task(i, gold, gold) for i, (gold, _) in enumerate(CORRECT_MATH)]
    return sql, math


def _completion(item: tuple, db_dir: str) -> tuple[str, str, int]:
    """(class, completion, task index) of a work item ``(kind, seed, correct)``."""
    kind, seed, correct = item
    rng = random.Random(seed)
    if kind == "sql":
        index = rng.randrange(len(CORRECT_SQL) * 3)  # 3 databases
        if correct:
            return "correct", f"```sql\n{CORRECT_SQL[index % len(CORRECT_SQL)][1]}\n```", index
        return (*_hostile_sql(rng, db_dir), index)
    index = rng.randrange(len(CORRECT_MATH))
    if correct:
        return "correct", f"Hence the answer is \\boxed{{{CORRECT_MATH[index][1]}}}.", index
    return (*_hostile_math(rng), index)


def score_chunk(items: list, db_paths: list[str], threads: int, timeouts: dict) -> tuple:
    """In a worker process: scores ``items`` through the envs from ``threads`` threads.

    Returns the records ``(kind, class, correct, reward, error, latency_s)`` and the pids of the
    checker subprocesses alive at the end.
    """
    from rllib_dph.envs.math import MathEnv
    from rllib_dph.envs.isolation import _POOL
    from rllib_dph.envs.sql import SQLEnv

    sql_tasks, math_tasks = _tasks(db_paths)
    local = threading.local()

    def score(item):
        if not hasattr(local, "envs"):  # an env serves one episode at a time: one per thread
            local.envs = {"sql": SQLEnv.from_tasks(sql_tasks, timeout_s=timeouts["sql"]),
                          "math": MathEnv.from_tasks(math_tasks, timeout_s=timeouts["math"])}
        name, completion, index = _completion(item, os.path.dirname(db_paths[0]))
        env = local.envs[item[0]]
        env.reset(options={"index": index})
        start = time.monotonic()
        _, reward, _, _, info = env.step(completion)
        return item[0], name, item[2], reward, info.get("error"), time.monotonic() - start

    with ThreadPoolExecutor(threads) as pool:
        records = list(pool.map(score, items))
    server = getattr(_POOL, "_server", None)  # the fork server, where checkers are forked
    pids = [checker.proc.pid for checker in list(_POOL._live)]
    return records, pids + ([server.proc.pid] if server else [])


# ---------------------------------------------------------------------------------------------
# Driver side: databases, sampling, report
# ---------------------------------------------------------------------------------------------


def _make_databases(db_dir: pathlib.Path) -> list[str]:
    """A plain database, a WAL-mode one and one with a hot journal."""
    plain, wal, hot = db_dir / "plain.sqlite", db_dir / "wal.sqlite", db_dir / "hot.sqlite"
    make_db(plain)
    make_wal_db(wal)
    make_hot_journal_db(hot)
    return [str(plain), str(wal), str(hot)]


def _files(folder: pathlib.Path) -> dict[str, int]:
    """Every file under ``folder`` with its size."""
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                found[os.path.join(root, name)] = os.path.getsize(os.path.join(root, name))
            except OSError:  # removed meanwhile
                pass
    return found


def _proc(pid: int, name: str) -> str:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _descendants(ancestors: set[int]) -> set[int]:
    """The live processes descending from ``ancestors`` (checkers are children of the workers,
    or of their fork server)."""
    parent_of = {}
    for entry in os.listdir("/proc"):
        stat = _proc(int(entry), "stat") if entry.isdigit() else ""
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[0] != "Z":
            parent_of[int(entry)] = int(fields[1])
    found, frontier = set(), set(ancestors)
    while frontier:
        frontier = {pid for pid, parent in parent_of.items() if parent in frontier} - found
        found |= frontier
    return found


def _pss(pid: int) -> int:
    """Proportional set size: a page shared by n processes counts 1/n in each (forked checkers
    share their fork server's pages)."""
    for line in _proc(pid, "smaps_rollup").splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) << 10
    return 0


def _sqlite_temp_bytes(pid: int) -> int:
    """Bytes of the SQLite temporary files (``etilqs_*``, deleted or not) ``pid`` holds open."""
    total = 0
    for fd in os.listdir(f"/proc/{pid}/fd") if os.path.isdir(f"/proc/{pid}/fd") else ():
        try:
            if "etilqs_" in os.readlink(f"/proc/{pid}/fd/{fd}"):
                total += os.stat(f"/proc/{pid}/fd/{fd}").st_size
        except OSError:
            pass
    return total


class Sampler(threading.Thread):
    """Samples, every ``period_s``, the workers' memory (with their checker subprocesses), the
    temp-disk use and the files that appear under the watched folders."""

    def __init__(self, folders: list[pathlib.Path], period_s: float = 0.1):
        super().__init__(daemon=True)
        self.folders, self.period_s = folders, period_s
        self.initial = {path for folder in folders for path in _files(folder)}
        self.workers: set[int] = set()
        self.checkers: set[int] = set()
        self.created: set[str] = set()
        self.peak_memory = self.peak_temp = 0
        self.peak_load = 0.0  # the machine's 1-minute load average: other jobs share the cores
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.period_s):
            workers = set(self.workers)
            children = _descendants(workers)
            self.checkers |= {p for p in children if "rllib_dph.envs.isolation" in _proc(p, "cmdline")}
            self.peak_memory = max(self.peak_memory, sum(map(_pss, workers | children)))
            files = {path: size for folder in self.folders for path, size in _files(folder).items()}
            new = {path: size for path, size in files.items() if path not in self.initial}
            self.created |= set(new)
            temp = sum(new.values()) + sum(map(_sqlite_temp_bytes, workers))
            self.peak_temp = max(self.peak_temp, temp)
            self.peak_load = max(self.peak_load, os.getloadavg()[0])

    def stop(self) -> None:
        self._done.set()
        self.join()


def _work_items(args) -> list[tuple]:
    """The shuffled ``(kind, seed, correct)`` items of the run."""
    rng = random.Random(args.seed)
    items = [(kind, rng.randrange(2**32), rng.random() >= args.hostile_fraction)
             for kind, calls in (("sql", args.sql_calls), ("math", args.math_calls))
             for _ in range(calls)]
    rng.shuffle(items)
    return items


def _run(args, db_paths: list[str], sampler: Sampler) -> tuple[list, set[int], float]:
    """Scores every item from the worker processes; returns the records, the checker pids the
    workers reported, and the wall time."""
    items = _work_items(args)
    chunks = [items[i :: args.workers * 8] for i in range(args.workers * 8)]
    timeouts = {"sql": args.sql_timeout, "math": args.math_timeout}
    records, reported = [], set()
    start = time.monotonic()
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.workers, mp_context=context) as pool:
        futures = [pool.submit(score_chunk, c, db_paths, args.threads, timeouts) for c in chunks]
        sampler.workers = set(pool._processes)  # started by the first submit
        for done, future in enumerate(futures, 1):
            chunk_records, pids = future.result()
            records += chunk_records
            reported |= set(pids)
            print(f"  {done}/{len(chunks)} chunks, {len(records)} calls, "
                  f"{time.monotonic() - start:.0f} s", flush=True)
    return records, reported, time.monotonic() - start


def _latency_table(records: list, timeouts: dict) -> list[str]:
    """Lines: calls and p50 / p99 / max latency per kind and class of answer."""
    lines = [f"{'kind':6} {'answers':10} {'calls':>6} {'p50 s':>7} {'p99 s':>7} {'max s':>7} "
             f"{'timeout s':>9}"]
    for kind in ("sql", "math"):
        for correct in (True, False):
            times = [r[5] for r in records if r[0] == kind and r[2] == correct]
            if times:
                p50, p99 = np.percentile(times, [50, 99])
                lines.append(f"{kind:6} {'correct' if correct else 'hostile':10} {len(times):6d} "
                             f"{p50:7.3f} {p99:7.3f} {max(times):7.3f} {timeouts[kind]:9.1f}")
    return lines


def _class_table(records: list) -> list[str]:
    """Lines: per hostile class, calls, max latency and the most frequent reason."""
    lines = [f"{'class':26} {'calls':>6} {'max s':>7}  most frequent reason"]
    for kind, name in sorted({(r[0], r[1]) for r in records if not r[2]}):
        rows = [r for r in records if (r[0], r[1]) == (kind, name) and not r[2]]
        reasons = [str(r[4])[:60] for r in rows]
        common = max(set(reasons), key=reasons.count)
        lines.append(f"{kind + ' ' + name:26} {len(rows):6d} {max(r[5] for r in rows):7.3f}  "
                     f"{common} ({reasons.count(common)})")
    return lines


def _bytes_changed(originals: dict[str, bytes]) -> int:
    """Bytes of the databases that differ from their original content (size change included)."""
    changed = 0
    for path, before in originals.items():
        after = pathlib.Path(path).read_bytes()
        changed += abs(len(after) - len(before)) + sum(a != b for a, b in zip(after, before))
    return changed


def _left_over(pids: set[int], wait_s: float = 2.0) -> set[int]:
    """The processes of ``pids`` still alive ``wait_s`` after the workers exited."""
    time.sleep(wait_s)
    states = {pid: _proc(pid, "stat").rsplit(")", 1)[-1].split()[:1] for pid in pids}
    return {pid for pid, state in states.items() if state not in ([], ["Z"])}  # gone or zombie


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sql-calls", type=int, default=10_000)
    parser.add_argument("--math-calls", type=int, default=1_000)
    parser.add_argument("--hostile-fraction", type=float, default=0.5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4, help="threads per worker process")
    parser.add_argument("--sql-timeout", type=float, default=1.0)
    parser.add_argument("--math-timeout", type=float, default=1.0, help="CPU seconds")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="verifier_soak_") as root:
        db_dir, tmp_dir = pathlib.Path(root, "databases"), pathlib.Path(root, "tmp")
        db_dir.mkdir()
        tmp_dir.mkdir()
        db_paths = _make_databases(db_dir)
        originals = {path: pathlib.Path(path).read_bytes() for path in db_paths}
        os.environ["TMPDIR"] = os.environ["SQLITE_TMPDIR"] = str(tmp_dir)  # for the workers
        sampler = Sampler([db_dir, tmp_dir])
        sampler.start()
        records, reported, wall_s = _run(args, db_paths, sampler)
        sampler.stop()
        left = _left_over(sampler.checkers | reported)
        changed = _bytes_changed(originals)
        shutil.rmtree(tmp_dir)
    return _report(args, records, wall_s, sampler, left, changed)


def _report(args, records, wall_s, sampler: Sampler, left: set[int], changed: int) -> int:
    """Prints the figures and the targets; returns 1 when a target is missed."""
    timeouts = {"sql": args.sql_timeout, "math": args.math_timeout}
    false_zeros = [r for r in records if r[2] and r[3] != 1.0]
    sql_max = max((r[5] for r in records if r[0] == "sql"), default=0.0)
    print(f"\n{len(records)} calls in {wall_s:.0f} s ({args.workers} worker processes x "
          f"{args.threads} threads, {os.cpu_count()} cores, peak load average "
          f"{sampler.peak_load:.0f})\n")
    print("\n".join(_latency_table(records, timeouts) + [""] + _class_table(records)))
    for r in sorted((r for r in records if r[0] == "sql"), key=lambda r: -r[5])[:5]:
        print(f"slow: sql {r[1]} {r[5]:.2f} s: {str(r[4])[:70]}")
    for r in false_zeros[:10]:
        print(f"false zero: {r[0]} {r[1]}: reward {r[3]}, error {r[4]!r}")
    checks = [
        (f"SQL max latency {sql_max:.2f} s <= timeout + 1 s", sql_max <= args.sql_timeout + 1),
        (f"database bytes changed: {changed}", changed == 0),
        (f"files created under the database and temp folders: {len(sampler.created)} "
         f"{sorted(sampler.created)[:5]}", not sampler.created),
        (f"correct answers scored 0: {len(false_zeros)}", not false_zeros),
        (f"checker processes left after exit: {len(left)} (of {len(sampler.checkers)} seen, fork "
         "servers included)",
         not left),
    ]
    print(f"\npeak temp disk (new files + SQLite temp files held open): "
          f"{sampler.peak_temp / 2**20:.1f} MiB")
    print(f"peak memory (PSS) of the workers and their checkers: {sampler.peak_memory / 2**20:.0f} MiB")
    for text, ok in checks:
        print(f"[{'ok' if ok else 'MISSED'}] {text}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
