"""The envs' answer keys (majority vote) and solution styles, table-driven."""

import dataclasses

import pytest

from rllib_dph.envs.base import Verdict, VerifierEnv
from rllib_dph.envs.math import MathEnv
from rllib_dph.envs.sql import SQLEnv
from rllib_dph.envs.suites import load_split, sft_examples


def sql_block(query):
    return f"```sql\n{query}\n```"


@pytest.fixture(scope="module")
def sql_env():
    return SQLEnv(load_split("sql_synth/test")[:2])


@pytest.fixture(scope="module")
def math_env():
    return MathEnv(load_split("math_synth/test")[:2])


# "gold": the key of the gold query's result; "other": a key, different from the gold one.
@pytest.mark.parametrize(
    "style_or_completion,expected",
    [
        ("plain", "gold"),
        ("cte", "gold"),  # another query with the same result rows
        ("subquery", "gold"),
        ("no query here", None),
        (sql_block("SELEC nonsense"), None),  # the query fails
        (sql_block("SELECT 123456789"), "other"),
    ],
)
def test_sql_answer_key_is_the_result_set(sql_env, style_or_completion, expected):
    styles = sql_env.tasks[0].meta["styles"]
    gold = sql_env.answer_key(0, sql_block(styles["plain"]))
    completion = sql_block(styles[style_or_completion]) if style_or_completion in styles else style_or_completion
    key = sql_env.answer_key(0, completion)
    assert gold.startswith("rows:") and len(gold) == len("rows:") + 16
    if expected == "gold":
        assert key == gold
    elif expected == "other":
        assert key is not None and key != gold
    else:
        assert key is None


@pytest.mark.parametrize(
    "completion,expected",
    [
        ("so x = 2.\n\\boxed{ -22 }", "-22"),
        ("I do not know", None),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{0.5}", "0.5"),  # equal values written differently are different keys
        ("\\boxed{1 + 2}", "1+2"),
    ],
)
def test_math_answer_key_is_the_final_answer(math_env, completion, expected):
    assert math_env.answer_key(0, completion) == expected


@pytest.mark.parametrize("completion,expected", [("  42 \n", "42"), ("   ", None), ("", None)])
def test_base_answer_key_is_the_stripped_text(completion, expected):
    env = VerifierEnv(load_split("math_synth/test")[:1], lambda completion, ground_truth: Verdict(0.0, False))
    assert env.answer_key(0, completion) == expected


@pytest.mark.parametrize("split,env_name", [("sql_synth/test", "sql_env"), ("math_synth/test", "math_env")])
def test_solution_style_names_every_reference_style(request, split, env_name):
    env = request.getfixturevalue(env_name)
    index_of = {task.id: i for i, task in enumerate(env.tasks)}
    rows = [row for row in sft_examples(split) if row["task_id"] in index_of]
    assert len({row["style"] for row in rows}) >= 3
    for row in rows:
        assert env.solution_style(index_of[row["task_id"]], row["completion"]) == row["style"]


@pytest.mark.parametrize(
    "data_source,completion,suite,expected",
    [
        ("sql_synth", "no query here", None, "none"),
        ("sql_synth_cross", sql_block("WITH t AS (SELECT 1) SELECT * FROM t"), None, "cte"),
        ("bird", sql_block("SELECT 1"), None, None),  # not a suite with styles
        ("bird", sql_block("SELECT 1"), "sql_synth", "plain"),  # an explicit suite is honoured
        ("sql_synth", "\\boxed{3}", "math_synth", "other"),
    ],
)
def test_sql_solution_style_follows_the_data_source_or_the_suite(sql_env, data_source, completion, suite, expected):
    task = dataclasses.replace(sql_env.tasks[0], data_source=data_source)
    env = SQLEnv([task])
    assert env.solution_style(0, completion, suite) == expected


def test_base_env_names_no_style():
    env = VerifierEnv(load_split("sql_synth/test")[:1], lambda completion, ground_truth: Verdict(0.0, False))
    assert env.solution_style(0, sql_block("SELECT 1")) is None
