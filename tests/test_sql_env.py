"""The text-to-SQL environment on hand-made tasks (no data loaders, no Ray)."""

import sqlite3

import pytest
from gymnasium.utils.env_checker import check_env

from rllib_dph.envs.base import Task
from rllib_dph.envs.sql import SQLEnv

SCHEMA = "CREATE TABLE singer (id INTEGER PRIMARY KEY, name TEXT, country TEXT, age INTEGER)"
SINGERS = [(1, "Ann", "FR", 30), (2, "Bob", "US", 25), (3, "Cid", "US", 41)]


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "concert.sqlite"
    conn = sqlite3.connect(path)
    conn.execute(SCHEMA)
    conn.executemany("INSERT INTO singer VALUES (?, ?, ?, ?)", SINGERS)
    conn.commit()
    conn.close()
    return str(path)


def make_task(db, task_id, question, gold_sql, cmp_method="bird"):
    prompt = f"Database schema:\n{SCHEMA}\n\nQuestion: {question} Answer in a ```sql block. ✓"
    return Task(
        id=task_id,
        data_source="sql_test",
        messages=({"role": "user", "content": prompt},),
        ground_truth={"db_id": "concert", "db_path": db, "gold_sql": gold_sql,
                      "cmp_method": cmp_method},
    )


@pytest.fixture
def tasks(db):
    return [
        make_task(db, "q0", "How many singers are there?", "SELECT COUNT(*) FROM singer"),
        make_task(db, "q1", "Name and age of singers from the US?",
                  "SELECT name, age FROM singer WHERE country = 'US'", "spider"),
    ]


def answer(sql):
    return f"The query:\n```sql\n{sql}\n```"


def test_check_env(tasks):
    check_env(SQLEnv.from_tasks(tasks), skip_render_check=True)


@pytest.mark.parametrize(
    "index,completion,reward,correct,has_error",
    [
        (0, answer("SELECT COUNT(id) FROM singer"), 1.0, True, False),
        (0, answer("SELECT COUNT(*) FROM singer WHERE age > 26"), 0.0, False, False),
        (0, "There are three singers.", 0.0, False, True),
        (0, answer("DELETE FROM singer"), 0.0, False, True),
        (1, answer("SELECT age, name FROM singer WHERE country = 'US'"), 1.0, True, False),
        (1, answer("SELECT name FROM singer WHERE country = 'US'"), 0.0, False, False),
    ],
)
def test_step(tasks, index, completion, reward, correct, has_error):
    env = SQLEnv.from_tasks(tasks)
    obs, info = env.reset(options={"index": index})
    assert obs == tasks[index].prompt_text and info["task_id"] == tasks[index].id
    obs, r, terminated, truncated, info = env.step(completion)
    assert (r, terminated, truncated) == (reward, True, False)
    assert info["correct"] is correct
    assert ("error" in info) is has_error


@pytest.mark.parametrize(
    "kwargs,completion,reward",
    [
        # cmp_method given to the env overrides the task's own ("spider" for q1).
        ({}, answer("SELECT age, name FROM singer WHERE country = 'US'"), 1.0),
        ({"cmp_method": "bird"}, answer("SELECT age, name FROM singer WHERE country = 'US'"), 0.0),
        ({"partial_credit": True}, answer("SELECT name FROM singer WHERE country = 'US'"), 0.4),
        ({"format_penalty": 0.25}, "no query here", -0.25),
    ],
)
def test_options_reach_the_verifier(tasks, kwargs, completion, reward):
    env = SQLEnv.from_tasks(tasks, **kwargs)
    env.reset(options={"index": 1})
    _, r, _, _, _ = env.step(completion)
    assert r == pytest.approx(reward)


def test_timeout_is_reported(tasks):
    env = SQLEnv.from_tasks(tasks, timeout_s=0.5)
    env.reset(options={"index": 0})
    joins = ", ".join(f"singer t{i}" for i in range(16))  # 3**16 rows
    _, reward, _, _, info = env.step(answer(f"SELECT count(*) FROM {joins}"))
    assert reward == 0.0 and info["error"].startswith("timed out")


@pytest.mark.parametrize(
    "change,message",
    [
        ({"gold_sql": ""}, "ground_truth['gold_sql'] is missing"),
        ({"db_path": None}, "ground_truth['db_path'] is missing"),
        ({"cmp_method": "exact"}, "ground_truth['cmp_method']='exact' is unknown"),
        ({"db_path": "/nonexistent/db.sqlite"}, "is not a file"),
    ],
)
def test_bad_ground_truth_names_the_task(db, change, message):
    task = make_task(db, "bad7", "?", "SELECT 1")
    task = Task(task.id, task.data_source, task.messages, {**task.ground_truth, **change})
    with pytest.raises(ValueError, match="task 'bad7'") as error:
        SQLEnv.from_tasks([task])
    assert message in str(error.value)


@pytest.mark.parametrize(
    "kwargs,message",
    [({"cmp_method": "exact"}, "cmp_method='exact'"), ({"timeout_s": 0.0}, "timeout_s=0.0")],
)
def test_bad_options(tasks, kwargs, message):
    with pytest.raises(ValueError, match=message):
        SQLEnv.from_tasks(tasks, **kwargs)
