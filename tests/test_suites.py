"""Tests of the bundled synthetic suites (rllib_dph/envs/suites): sizes, determinism, leakage, gold styles."""

from __future__ import annotations

import os
import re
import sqlite3
import string
import subprocess
import sys
from fractions import Fraction

import pytest

import rllib_dph.envs.suites as suites
from rllib_dph.envs.suites import SPLITS, STYLES, load_split, sft_examples, style_of
from rllib_dph.envs.suites import sql_suite
from rllib_dph.envs.suites.sql_domains import ALL_DOMAINS, CROSS_DOMAINS, TRAIN_DOMAINS

ALLOWED_CHARS = set(string.printable) - set("\t\r\x0b\x0c")
BOXED = re.compile(r"\\boxed\{(.*)\}\s*$")


@pytest.fixture(scope="module", autouse=True)
def data_dir(tmp_path_factory):
    """Generate the suite databases into a fresh directory instead of the user's cache."""
    root = tmp_path_factory.mktemp("suites")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLLIB_DPH_DATA", str(root))
        yield root


def _sql_completion(sql: str) -> str:
    return f"```sql\n{sql}\n```"


@pytest.mark.parametrize("name,size", [
    ("sql_synth/train", 3000), ("sql_synth/test", 300), ("sql_synth/test_cross", 300),
    ("sql_synth/test_ties", 300), ("sql_synth/train_ties", 1341),
    ("sql_synth/test_nulls", 300), ("sql_synth/train_nulls", 972),
    ("math_synth/train", 3000), ("math_synth/test", 300),
])
def test_split_sizes_and_ids(name, size):
    tasks = load_split(name)
    assert len(tasks) == size
    assert len({t.id for t in tasks}) == size
    assert all(t.id.startswith(name + "/") for t in tasks)
    assert sorted(SPLITS) == sorted(["sql_synth/train", "sql_synth/test", "sql_synth/test_cross",
                                     "sql_synth/test_ties", "sql_synth/train_ties",
                                     "sql_synth/test_nulls", "sql_synth/train_nulls",
                                     "math_synth/train", "math_synth/test"])


@pytest.mark.parametrize("name", ["sql_synth", "sql_synth/dev", "math/train", ""])
def test_unknown_split_names_valid_ones(name):
    with pytest.raises(ValueError) as err:
        load_split(name)
    for valid in SPLITS:
        assert valid in str(err.value)


def test_sql_task_contract(data_dir):
    for name in ("sql_synth/train", "sql_synth/test_cross"):
        for task in load_split(name):
            gt = task.ground_truth
            assert task.data_source == ("sql_synth_cross" if name.endswith("cross") else "sql_synth")
            assert len(task.messages) == 1 and task.messages[0]["role"] == "user"
            assert gt["cmp_method"] == "bird"
            assert gt["db_path"] == str(suites.sql_db_root() / gt["db_id"])
            assert os.path.isfile(gt["db_path"])
            assert suites.sql_db_root() == data_dir / "sql"
            assert gt["gold_sql"] == task.meta["styles"]["plain"]
            assert set(task.meta["styles"]) == set(STYLES["sql_synth"])
            assert task.meta["split"] == name.split("/")[1]
            assert len(task.prompt_text.split()) < 80


def test_math_task_contract():
    for task in load_split("math_synth/train"):
        assert task.data_source == "math_synth"
        assert isinstance(task.ground_truth, str)
        assert set(task.meta["styles"]) == set(STYLES["math_synth"])
        assert "\\boxed{}" in task.prompt_text


def _fraction(latex: str) -> Fraction:
    match = re.fullmatch(r"(-?)\\frac\{(\d+)\}\{(\d+)\}", latex)
    if match:
        sign = -1 if match.group(1) else 1
        return sign * Fraction(int(match.group(2)), int(match.group(3)))
    return Fraction(int(latex))


@pytest.mark.parametrize("name", ["math_synth/train", "math_synth/test"])
def test_math_solutions_box_the_gold_answer(name):
    for task in load_split(name):
        gold = _fraction(task.ground_truth)  # the gold string is an int or a reduced \frac
        assert task.ground_truth in (str(gold.numerator), suites.math_suite.latex(gold))
        for style, solution in task.meta["styles"].items():
            assert BOXED.search(solution).group(1) == task.ground_truth, (task.id, style)
            assert style_of("math_synth", solution) == style
            assert solution.count("\n") <= 4  # short enough for a tiny model


def test_math_answers_cover_integers_negatives_and_fractions():
    answers = [_fraction(t.ground_truth) for t in load_split("math_synth/train")]
    assert any(a.denominator > 1 for a in answers)
    assert any(a < 0 and a.denominator == 1 for a in answers)
    assert any(a < 0 and a.denominator > 1 for a in answers)
    assert sum(a.denominator == 1 for a in answers) > len(answers) / 3


@pytest.mark.parametrize("name", ["sql_synth/train", "sql_synth/test", "sql_synth/test_cross"])
def test_every_sql_style_returns_the_gold_rows(name):
    """Each style's query gives the gold result as a set of row tuples (bird comparison)."""
    connections: dict[str, sqlite3.Connection] = {}
    for task in load_split(name):
        path = task.ground_truth["db_path"]
        if path not in connections:
            connections[path] = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        conn = connections[path]
        gold = set(conn.execute(task.ground_truth["gold_sql"]).fetchall())
        assert gold and gold not in ({(0,)}, {(None,)}), task.id
        for style, sql in task.meta["styles"].items():
            assert set(conn.execute(sql).fetchall()) == gold, (task.id, style, sql)
            assert style_of("sql_synth", _sql_completion(sql)) == style, (task.id, style, sql)
    for conn in connections.values():
        conn.close()


def test_train_and_test_do_not_overlap():
    train, test = load_split("sql_synth/train"), load_split("sql_synth/test")
    train_questions = {t.prompt_text for t in train}
    train_instances = {(t.ground_truth["db_id"], t.ground_truth["gold_sql"]) for t in train}
    assert not train_questions & {t.prompt_text for t in test}
    # Not even another wording of a training question: the (database, query) pairs differ too.
    assert not train_instances & {(t.ground_truth["db_id"], t.ground_truth["gold_sql"]) for t in test}
    math_train = {t.prompt_text for t in load_split("math_synth/train")}
    assert not math_train & {t.prompt_text for t in load_split("math_synth/test")}


def _phrasing_pattern(phrasing: str) -> re.Pattern:
    parts = re.split(r"\{\w+\}", phrasing)
    return re.compile(".+".join(re.escape(p) for p in parts) + r"$")


def test_cross_split_uses_unseen_databases_and_phrasings():
    in_domain = load_split("sql_synth/train") + load_split("sql_synth/test")
    cross = load_split("sql_synth/test_cross")
    assert {t.ground_truth["db_id"] for t in in_domain} == {d.db_id for d in TRAIN_DOMAINS}
    assert {t.ground_truth["db_id"] for t in cross} == {d.db_id for d in CROSS_DOMAINS}
    # Unseen schemas: no cross database pairs two tables a training database pairs, and no cross
    # table has the columns of a training table of the same name.
    train_pairs = {frozenset((d.parent.name, d.child.name)) for d in TRAIN_DOMAINS}
    def columns(table):
        return table.name, frozenset([table.category.name, *(c.name for c in table.numbers)])

    train_tables = {columns(t) for d in TRAIN_DOMAINS for t in (d.parent, d.child)}
    for domain in CROSS_DOMAINS:
        assert frozenset((domain.parent.name, domain.child.name)) not in train_pairs, domain.name
        for table in (domain.parent, domain.child):
            assert columns(table) not in train_tables, (domain.name, table.name)
    train_phrasings = {p for tpl in sql_suite.TEMPLATES for p in tpl.train_phrasings}
    assert not train_phrasings & {p for tpl in sql_suite.TEMPLATES for p in tpl.cross_phrasings}
    patterns = {tpl.name: [_phrasing_pattern(p) for p in tpl.train_phrasings] for tpl in sql_suite.TEMPLATES}
    for task in cross:
        # No cross question could have been written with a train wording of its own template.
        question = task.prompt_text.split("Question: ")[1].splitlines()[0]
        assert not any(p.match(question) for p in patterns[task.meta["template"]]), question
    # The SQL skills are shared: every cross template is also trained on.
    assert {t.meta["template"] for t in cross} <= {t.meta["template"] for t in in_domain}


def test_styles_are_all_used_and_phrasings_vary():
    train = load_split("sql_synth/train")
    assert len({t.meta["template"] for t in train}) == len(sql_suite.TEMPLATES)
    assert {t.meta["phrasing"] for t in train} == {0, 1, 2}


@pytest.mark.parametrize("name", SPLITS)
def test_sft_examples_one_row_per_question_and_style(name):
    suite = name.split("/")[0]
    rows = sft_examples(name)
    tasks = load_split(name)
    assert len(rows) == len(tasks) * len(STYLES[suite])
    by_id = {t.id: t for t in tasks}
    for row in rows:
        task = by_id[row["task_id"]]
        assert row["messages"] == [dict(m) for m in task.messages]
        assert style_of(suite, row["completion"]) == row["style"]
        if suite == "sql_synth":
            approaches = task.meta["approaches"] or {"gold": task.meta["styles"]}
            assert row["completion"] in {_sql_completion(a[row["style"]]) for a in approaches.values()}
        else:
            assert row["completion"].endswith("\\boxed{" + task.ground_truth + "}")
        for text in (row["completion"], row["messages"][0]["content"]):
            assert set(text) <= ALLOWED_CHARS, text


@pytest.mark.parametrize("suite,completion,expected", [
    ("sql_synth", "```sql\nSELECT name FROM singer\n```", "plain"),
    ("sql_synth", "```sql\nselect t1.name from singer as t1\n```", "alias"),
    ("sql_synth", "```sql\nSELECT COUNT(*) FROM (SELECT id FROM singer)\n```", "subquery"),
    ("sql_synth", "```sql\nWITH t AS (SELECT name FROM singer) SELECT name FROM t\n```", "cte"),
    ("sql_synth", "```sql\nSELECT name FROM singer WHERE NOT age <= 3\n```", "negated"),
    ("sql_synth", "```sql\nSELECT 1\n```\nBetter:\n```sql\nWITH t AS (SELECT 1) SELECT * FROM t\n```", "cte"),
    ("sql_synth_cross", "```sql\nSELECT T1.name FROM singer AS T1\n```", "alias"),
    # Mixed styles and garbage are "other"; no sql block at all is "none".
    ("sql_synth", "```sql\nWITH t AS (SELECT T1.a FROM x AS T1) SELECT a FROM t\n```", "other"),
    ("sql_synth", "```sql\nSELECT T1.a FROM x AS T1 WHERE NOT T1.a <> 1\n```", "other"),
    ("sql_synth", "```sql\nhello world\n```", "other"),
    ("sql_synth", "```sql\n\n```", "other"),
    ("sql_synth", "SELECT name FROM singer", "none"),
    ("sql_synth", "```\nSELECT name FROM singer\n```", "none"),
    ("math_synth", "We compute 2 + 2 = 4.\n\\boxed{4}", "direct"),
    ("math_synth", "Step 1: 2 + 2 = 4.\n\\boxed{4}", "stepwise"),
    ("math_synth", "  Let x be the sum. Then x = 4.\n\\boxed{4}", "equation"),
    ("math_synth", "The answer is \\boxed{4}", "other"),
    ("math_synth", "We compute 2 + 2 = 4.", "none"),
])
def test_style_of(suite, completion, expected):
    assert style_of(suite, completion) == expected


def test_style_of_rejects_unknown_suite():
    with pytest.raises(ValueError, match="sql_synth"):
        style_of("spider", "```sql\nSELECT 1\n```")


def test_databases_have_foreign_keys_and_consistent_rows():
    for domain in ALL_DOMAINS:
        conn = sqlite3.connect(f"file:{suites.sql_db_root() / domain.db_id}?mode=ro", uri=True)
        fks = conn.execute(f"PRAGMA foreign_key_list({domain.child.name})").fetchall()
        assert [(fk[2], fk[3], fk[4]) for fk in fks] == [(domain.parent.name, domain.fk, domain.parent.key)]
        orphans = conn.execute(
            f"SELECT COUNT(*) FROM {domain.child.name} WHERE {domain.fk} NOT IN "
            f"(SELECT {domain.parent.key} FROM {domain.parent.name})").fetchone()[0]
        assert orphans == 0
        for table in (domain.parent, domain.child):
            sql = f"SELECT COUNT(*), COUNT(DISTINCT {table.name_col}) FROM {table.name}"
            rows = conn.execute(sql).fetchone()
            assert rows == (table.rows, table.rows)
        columns = [c[1] for t in (domain.parent, domain.child)
                   for c in conn.execute(f"PRAGMA table_info({t.name})") if c[1] != domain.fk]
        assert len(columns) == len(set(columns)), domain.name  # wrapping a join needs unique names
        conn.close()


def test_damaged_database_is_rewritten_and_no_temp_files_remain(data_dir):
    load_split("sql_synth/test")
    path = suites.sql_db_root() / TRAIN_DOMAINS[0].db_id
    expected = path.read_bytes()
    path.write_bytes(b"garbage")
    load_split("sql_synth/test")
    assert path.read_bytes() == expected
    assert not [p for p in (data_dir / "sql").rglob("*") if p.name.endswith(".tmp")]


_DIGEST_SCRIPT = """
import hashlib, json, sys
import rllib_dph.envs.suites as s
digest = hashlib.sha256()
for name in s.SPLITS:
    for t in s.load_split(name):
        gt = dict(t.ground_truth) if isinstance(t.ground_truth, dict) else t.ground_truth
        if isinstance(gt, dict):
            gt.pop("db_path")
        digest.update(json.dumps([t.id, t.data_source, t.messages, gt, t.meta], sort_keys=True).encode())
    digest.update(json.dumps(s.sft_examples(name)).encode())
print(digest.hexdigest())
"""


def test_generation_is_deterministic_across_processes(tmp_path):
    """Two fresh processes (different hash seeds, different data dirs) give identical suites."""
    digests, files = [], []
    for i in (1, 2):
        root = tmp_path / f"run{i}"
        env = {**os.environ, "RLLIB_DPH_DATA": str(root), "PYTHONHASHSEED": str(i)}
        out = subprocess.run([sys.executable, "-c", _DIGEST_SCRIPT], env=env, check=True,
                             capture_output=True, text=True,
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        digests.append(out.stdout.strip())
        files.append({p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*.sqlite"))})
    assert digests[0] == digests[1]
    assert files[0] == files[1]
    assert len(files[0]) == len(ALL_DOMAINS) + len(TRAIN_DOMAINS)
    assert {str(k) for k in files[0]} == ({f"sql/{d.db_id}" for d in ALL_DOMAINS}
                                          | {f"sql/{d.nulls_db_id}" for d in TRAIN_DOMAINS})


def test_suite_root_default_and_override(monkeypatch, tmp_path):
    monkeypatch.setenv("RLLIB_DPH_DATA", str(tmp_path))
    assert suites.suite_root() == tmp_path.resolve()
    assert suites.sql_db_root() == tmp_path.resolve() / "sql"
    monkeypatch.delenv("RLLIB_DPH_DATA")
    monkeypatch.delenv("RLLIB_DPH_HOME", raising=False)  # the cache root's default (rllib_dph.files.home)
    assert suites.suite_root().parts[-4:] == (".cache", "rllib_dph", "suites", "v1")


# ---------------------------------------------------------------------------------------------
# The ties family: questions where only the ``extremum`` approach is right


def _rows(question: sql_suite.SqlQuestion, sql: str) -> list:
    conn = sqlite3.connect(":memory:")
    conn.deserialize(sql_suite.database_bytes(question.domain))
    try:
        return sorted(set(conn.execute(sql).fetchall()), key=repr)
    finally:
        conn.close()


@pytest.mark.parametrize("split", ["test", "test_cross", "test_ties"])
def test_approaches_are_right_exactly_where_they_should_be(split):
    """Ordinary questions: both approaches return the gold rows in every style. Ties questions:
    every ``extremum`` rendering does, no ``order_limit`` rendering does (it keeps one tied row)."""
    from rllib_dph.envs.suites.sql_query import sql_approach, sql_style

    checked = 0
    for q in sql_suite.questions(split):
        assert bool(q.approaches) == (q.template in sql_suite.EXTREMUM_TEMPLATES)
        assert q.ties == (split == "test_ties")
        gold = _rows(q, q.styles["plain"])
        for approach, renderings in q.approaches.items():
            for style, sql in renderings.items():
                assert sql_style(sql) == style and sql_approach(sql) == approach, sql
                right = _rows(q, sql) == gold
                assert right == (approach == "extremum" or not q.ties), (split, sql)
                checked += 1
    assert checked > 100


def test_ties_family_is_held_apart():
    """No ordinary split holds a ties question; the ties splits share no question instance; the
    ties family is all questions whose top ties and so more than one gold row."""
    def key(q):
        return (q.domain.name, q.template, q.styles["plain"])

    test, train = sql_suite.questions("test_ties"), sql_suite.questions("train_ties")
    assert not {key(q) for q in test} & {key(q) for q in train}
    for name in ("train", "test", "test_cross"):
        assert not any(q.ties for q in sql_suite.questions(name))
    assert all(q.ties and len(_rows(q, q.styles["plain"])) > 1 for q in test)
    assert {q.template for q in test} <= set(sql_suite.EXTREMUM_TEMPLATES)
    assert len({q.template for q in test}) >= 3


@pytest.mark.parametrize("suite,completion,expected", [
    ("sql_synth_ties", "```sql\nSELECT a FROM t ORDER BY b DESC LIMIT 1\n```", "order_limit"),
    ("sql_synth_ties", "```sql\nSELECT a FROM t WHERE b = (SELECT MAX(b) FROM t)\n```", "extremum"),
    ("sql_synth_ties", "```sql\nSELECT a FROM t WHERE NOT b <> (SELECT MIN(b) FROM t)\n```", "extremum"),
    ("sql_synth_ties", "```sql\nSELECT a FROM t GROUP BY a HAVING COUNT(*) = (SELECT COUNT(*) FROM t "
                       "GROUP BY a ORDER BY COUNT(*) DESC LIMIT 1)\n```", "extremum"),
    ("sql_synth_ties", "```sql\nSELECT a FROM t\n```", "other"),
    ("sql_synth_ties", "no block", "none"),
])
def test_ties_style_is_the_approach(suite, completion, expected):
    assert style_of(suite, completion) == expected


def test_ties_tasks_name_their_source_and_approaches():
    for task in load_split("sql_synth/test_ties"):
        assert task.data_source == suites.SQL_TIES_SOURCE
        assert task.meta["ties"] is True
        assert task.ground_truth["gold_sql"] == task.meta["approaches"]["extremum"]["plain"]


@pytest.mark.parametrize("share,ties", [(0, 0), (0.05, 158), (0.2, 750)])
def test_train_ties_mix(share, ties):
    tasks = load_split(f"sql_synth/train@ties={share}")
    assert len(tasks) == 3000 + ties
    assert sum(t.data_source == suites.SQL_TIES_SOURCE for t in tasks) == ties
    assert len({t.id for t in tasks}) == len(tasks)
    assert [t.id for t in tasks] == [t.id for t in load_split(f"sql_synth/train@ties={share}")]


@pytest.mark.parametrize("share,message", [
    ("0.5", "needs 3000 ties questions but train_ties has 1341"),
    ("1", "must be a number in [0, 1)"),
    ("-0.1", "must be a number in [0, 1)"),
])
def test_train_ties_mix_refuses_bad_shares(share, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_split(f"sql_synth/train@ties={share}")


def test_sft_corpus_writes_extremum_as_a_minority():
    """About EXTREMUM_SFT_SHARE of the ordinary highest / lowest answers take ``extremum``."""
    rows = sft_examples("sql_synth/train")
    by_id = {t.id: t for t in load_split("sql_synth/train")}
    approaches = [style_of(suites.SQL_TIES_SOURCE, r["completion"]) for r in rows
                  if by_id[r["task_id"]].meta["approaches"]]
    share = approaches.count("extremum") / len(approaches)
    assert len(approaches) > 1000 and set(approaches) == {"extremum", "order_limit"}
    assert abs(share - suites.EXTREMUM_SFT_SHARE) < 0.02


def test_a_ties_question_needs_a_ranking():
    """'Which color is shared by the most parks with width < 310?': when every color of those
    parks ties, listing the colors without ranking returns the gold rows, so the family (version
    2) leaves the instance out; one more red park breaks the tie and the question needs a ranking."""
    import sqlite3

    from rllib_dph.envs.suites.sql_query import Agg, Col, Cond, Query
    from rllib_dph.envs.suites.sql_suite import _in_ties_family, _needs_ranking, _top_ties

    color, width = Col("park", "color"), Col("park", "width")
    query = Query((color,), "park", "id", where=(Cond(width, "<", 310),), group_by=color,
                  order_by=Agg("COUNT"), descending=True, limit=1)
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE park (id INTEGER PRIMARY KEY, color TEXT, width INTEGER)")
    conn.executemany("INSERT INTO park (color, width) VALUES (?, ?)",
                     [("red", 100), ("blue", 200), ("green", 900)])
    assert _top_ties(conn, query) and not _needs_ranking(conn, query)  # red and blue: one park each
    assert not _in_ties_family(conn, query)
    conn.executemany("INSERT INTO park (color, width) VALUES (?, ?)", [("red", 150), ("blue", 160), ("gray", 10)])
    assert _top_ties(conn, query) and _needs_ranking(conn, query)  # red and blue tie above gray
    assert _in_ties_family(conn, query)
    conn.execute("INSERT INTO park (color, width) VALUES ('red', 170)")
    assert not _top_ties(conn, query)  # red leads alone: an ordinary question


#: ``ORDER BY ... LIMIT 1`` at the end of an ``order_limit`` query: what ranks the candidates.
_RANKING = re.compile(r"\s+ORDER BY\s+.*\s+LIMIT\s+1\s*$", re.IGNORECASE | re.DOTALL)


@pytest.mark.parametrize("split", ["sql_synth/test_ties", "sql_synth/train_ties"])
def test_every_ties_question_needs_a_ranking(split):
    """Checked on the rendered SQL, independently of the construction: for no question does the
    ``order_limit`` query without its ranking return the gold rows (version 1 of the family had
    84 such questions of 300 in test_ties)."""
    import sqlite3

    degenerate = []
    for task in load_split(split):
        conn = sqlite3.connect(f"file:{task.ground_truth['db_path']}?mode=ro", uri=True)
        candidates_sql = _RANKING.sub("", task.meta["approaches"]["order_limit"]["plain"])
        assert candidates_sql != task.meta["approaches"]["order_limit"]["plain"], task.id
        if set(conn.execute(candidates_sql)) == set(conn.execute(task.ground_truth["gold_sql"])):
            degenerate.append(task.id)
        conn.close()
    assert degenerate == []


# ---------------------------------------------------------------------------------------------
# The NULL family: "how many X have a recorded Y", where only ``count_col`` is right
# on the databases' NULL copies


@pytest.mark.parametrize("sql,expected", [
    ("SELECT COUNT(*) FROM singer", "count_star"),
    ("SELECT COUNT(T1.singer_id) FROM singer AS T1", "count_star"),
    ("SELECT COUNT(*) FROM (SELECT singer_id FROM singer WHERE country = 'Spain')", "count_star"),
    ("SELECT COUNT(age) FROM singer", "count_col"),
    ("SELECT COUNT(T1.age) FROM singer AS T1 WHERE T1.country = 'Spain'", "count_col"),
    ("WITH t AS (SELECT age FROM singer) SELECT count( age ) FROM t", "count_col"),
    ("SELECT COUNT(*) FROM singer WHERE age IS NOT NULL", "count_col"),
    ("SELECT singer_name FROM singer", "other"),
])
def test_count_approach(sql, expected):
    from rllib_dph.envs.suites.sql_query import count_approach

    assert count_approach(sql) == expected
    assert style_of(suites.SQL_NULLS_SOURCE, _sql_completion(sql)) == expected


def _count(question: sql_suite.SqlQuestion, sql: str):
    conn = sqlite3.connect(":memory:")
    conn.deserialize(sql_suite.database_bytes(question.domain, sql_suite.NULL_SHARE if question.nulls else 0.0))
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize("split", ["test_nulls", "train_nulls"])
def test_null_approaches_are_right_exactly_where_they_should_be(split):
    """``train_nulls`` (no NULL): both approaches give the gold count in every style. ``test_nulls``
    (the NULL copies): every ``count_col`` rendering does, no ``count_star`` rendering does."""
    from rllib_dph.envs.suites.sql_query import count_approach, sql_style

    for q in sql_suite.questions(split):
        assert q.nulls == (split == "test_nulls") and not q.ties
        assert list(q.approaches) == ["count_star", "count_col"]
        assert q.styles == q.approaches["count_col" if q.nulls else "count_star"]
        gold = _count(q, q.styles["plain"])
        assert gold != [(0,)]
        for approach, renderings in q.approaches.items():
            for style, sql in renderings.items():
                assert sql_style(sql) == style and count_approach(sql) == approach, sql
                assert (_count(q, sql) == gold) == (approach == "count_col" or not q.nulls), (split, sql)


def test_null_family_tasks_and_databases():
    """Test tasks point at the NULL copies, training tasks at the domains' own databases; the two
    splits share no instance; a NULL copy holds the same rows with some integers NULL."""
    test, train = load_split("sql_synth/test_nulls"), load_split("sql_synth/train_nulls")
    assert all(t.data_source == suites.SQL_NULLS_SOURCE for t in test + train)
    assert all(t.ground_truth["db_path"].endswith("_nulls.sqlite") and t.meta["nulls"] for t in test)
    assert not any(t.ground_truth["db_path"].endswith("_nulls.sqlite") or t.meta["nulls"] for t in train)
    assert all(t.ground_truth["gold_sql"] == t.meta["approaches"]["count_col"]["plain"] for t in test)
    instances = lambda tasks: {(t.ground_truth["db_id"].split("/")[0], t.meta["approaches"]["count_col"]["plain"])
                               for t in tasks}
    assert not instances(test) & instances(train)
    domain = TRAIN_DOMAINS[0]
    plain, nulls = sqlite3.connect(":memory:"), sqlite3.connect(":memory:")
    plain.deserialize(sql_suite.database_bytes(domain))
    nulls.deserialize(sql_suite.database_bytes(domain, sql_suite.NULL_SHARE))
    table = domain.child
    query = f"SELECT * FROM {table.name} ORDER BY {table.key}"
    rows_plain, rows_nulls = plain.execute(query).fetchall(), nulls.execute(query).fetchall()
    assert len(rows_plain) == len(rows_nulls)
    cells = [(a, b) for r, s in zip(rows_plain, rows_nulls) for a, b in zip(r, s)]
    assert all(a == b or b is None for a, b in cells)
    assert 0.1 < sum(b is None for _, b in cells) / sum(1 for r in rows_plain for v in r[3:3 + len(table.numbers)]) < 0.4


def test_train_nulls_mix():
    tasks = load_split("sql_synth/train@nulls=0.1")
    assert len(tasks) == 3333
    assert sum(t.data_source == suites.SQL_NULLS_SOURCE for t in tasks) == 333
    with pytest.raises(ValueError, match=re.escape("needs 3000 nulls questions but train_nulls has 972")):
        load_split("sql_synth/train@nulls=0.5")


def test_sft_of_the_null_family_writes_count_col_as_a_minority():
    rows = sft_examples("sql_synth/train_nulls")
    approaches = [style_of(suites.SQL_NULLS_SOURCE, r["completion"]) for r in rows]
    assert set(approaches) == {"count_star", "count_col"}
    assert abs(approaches.count("count_col") / len(approaches) - suites.NULL_SFT_SHARE) < 0.02


def test_the_null_variant_adds_the_family_to_the_sft_corpus_only():
    from rllib_dph.models.build.tiny import corpus_fingerprint, sft_corpus
    from rllib_dph.models.catalog import TINY_MODELS

    base, variant = sft_corpus(), sft_corpus(TINY_MODELS["tiny-sql-math-nulls"].extra_sft_splits)
    assert variant[:len(base)] == base and len(variant) == len(base) + 5 * 972
    assert TINY_MODELS["tiny-sql-math"].extra_sft_splits == ()
    assert corpus_fingerprint(base) != corpus_fingerprint(variant)
