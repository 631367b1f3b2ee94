"""Task loaders (rllib_dph.envs.data.load_tasks): the verl / DPH-RL layout, jsonl, lists, suites, errors."""

import json
import os
import sqlite3

import gymnasium as gym
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import rllib_dph.envs  # noqa: F401  (registers the bundled envs)
from rllib_dph.envs.base import Task
from rllib_dph.envs.data import load_tasks

# The nested types of the original DPH-RL (verl) SQL files.
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
SQL_TRUTH = pa.struct(
    [("db_id", pa.string()), ("gold_sql", pa.string()), ("cmp_method", pa.string())]
)
SQL_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(MESSAGE)),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", SQL_TRUTH)])),
        ("extra_info", pa.struct([("split", pa.string()), ("index", pa.int64())])),
        ("id", pa.string()),
    ]
)
DB_ID = "concert_singer/concert_singer.sqlite"


def _sql_row(i, *, db_id=DB_ID, gold_sql="SELECT count(*) FROM singer", cmp_method="bird"):
    return {
        "data_source": "bird",
        "prompt": [
            {"role": "system", "content": "You write SQLite queries."},
            {"role": "user", "content": f"Question {i}: how many singers?"},
        ],
        "reward_model": {
            "style": "rule",
            "ground_truth": {"db_id": db_id, "gold_sql": gold_sql, "cmp_method": cmp_method},
        },
        "extra_info": {"split": "train", "index": 100 + i},
        "id": f"bird-{i}",
    }


@pytest.fixture
def db_root(tmp_path):
    root = tmp_path / "databases"
    (root / "concert_singer").mkdir(parents=True)
    with sqlite3.connect(root / DB_ID) as conn:
        conn.execute("CREATE TABLE singer (name TEXT)")
    return root


def _write_sql_parquet(path, rows, schema=SQL_SCHEMA):
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return str(path)


def test_verl_sql_parquet_loads_unchanged(tmp_path, db_root):
    rows = [_sql_row(0), _sql_row(1, cmp_method=None), _sql_row(2, cmp_method="spider")]
    path = _write_sql_parquet(tmp_path / "bird_train.parquet", rows)
    tasks = load_tasks(path, task="sql", db_root=db_root)
    assert [t.id for t in tasks] == ["bird-0", "bird-1", "bird-2"]
    first = tasks[0]
    assert first.data_source == "bird"
    assert first.messages == (
        {"role": "system", "content": "You write SQLite queries."},
        {"role": "user", "content": "Question 0: how many singers?"},
    )
    assert first.ground_truth == {
        "db_id": DB_ID,
        "db_path": str(db_root / DB_ID),
        "gold_sql": "SELECT count(*) FROM singer",
        "cmp_method": "bird",
    }
    assert os.path.isabs(first.ground_truth["db_path"])
    assert first.meta == {"reward_style": "rule", "extra_info": {"split": "train", "index": 100}}
    assert [t.ground_truth["cmp_method"] for t in tasks] == ["bird", "bird", "spider"]


def test_sql_env_serves_a_verl_file(tmp_path, db_root):
    path = _write_sql_parquet(tmp_path / "bird_dev.parquet", [_sql_row(0)])
    env = gym.make("rllib_dph/SQL-v0", data=path, db_root=str(db_root)).unwrapped
    assert env.reset(options={"index": 0})[0].endswith("Question 0: how many singers?")
    assert env.step("```sql\nSELECT COUNT(name) FROM singer\n```")[1] == 1.0


def test_cmp_methods_match_the_sql_verifier():
    from rllib_dph.envs.data.loaders import SQL_CMP_METHODS
    from rllib_dph.envs.sql import COMPARATORS

    assert set(SQL_CMP_METHODS) == set(COMPARATORS)


def test_db_root_defaults_to_the_data_folder(db_root):
    path = _write_sql_parquet(db_root / "dev.parquet", [_sql_row(0)])
    assert load_tasks(path, task="sql")[0].ground_truth["db_path"] == str(db_root / DB_ID)


@pytest.mark.parametrize(
    "drop,expected_ids",
    [("id", ["100", "101"]), ("id+extra_info", ["0", "1"])],
)
def test_id_falls_back_to_extra_info_index_then_row_number(tmp_path, db_root, drop, expected_ids):
    names = drop.split("+")
    schema = pa.schema([f for f in SQL_SCHEMA if f.name not in names])
    rows = [{k: v for k, v in _sql_row(i).items() if k not in names} for i in range(2)]
    path = _write_sql_parquet(tmp_path / "x.parquet", rows, schema)
    assert [t.id for t in load_tasks(path, task="sql", db_root=db_root)] == expected_ids


def test_math_jsonl_with_string_prompts_and_numeric_answers(tmp_path):
    path = tmp_path / "math_test.jsonl"
    rows = [
        {"data_source": "math", "prompt": "6 * 7?", "reward_model": {"ground_truth": 42}},
        {"data_source": "math", "prompt": "1/2 + 1/4?", "reward_model": {"ground_truth": 0.75}},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = load_tasks(str(path), task="math")
    assert [t.ground_truth for t in tasks] == ["42", "0.75"]
    assert tasks[0].messages == ({"role": "user", "content": "6 * 7?"},)
    assert tasks[1].prompt_text == "1/2 + 1/4?"


def test_flat_rows_with_a_prompt_format_and_system_prompt():
    rows = [{"question": "abc", "answer": "cba"}, {"question": "xy", "answer": "yx", "id": "k"}]
    tasks = load_tasks(rows, task="generic", prompt_format="Reverse: {question}",
                       system_prompt="Answer with the word only.")
    assert tasks[0].messages == (
        {"role": "system", "content": "Answer with the word only."},
        {"role": "user", "content": "Reverse: abc"},
    )
    assert [(t.id, t.data_source, t.ground_truth) for t in tasks] == [
        ("0", "custom", "cba"),
        ("k", "custom", "yx"),
    ]


def test_callable_prompt_format_and_custom_ground_truth_field(tmp_path):
    path = tmp_path / "pairs.parquet"
    pq.write_table(pa.Table.from_pylist([{"a": 2, "b": 3, "sum": 5}]), path)
    tasks = load_tasks(
        str(path),
        task="math",
        prompt_format=lambda row: f"{row['a']} + {row['b']} = ?",
        ground_truth_field="sum",
    )
    task = tasks[0]
    assert (task.prompt_text, task.ground_truth, task.data_source) == ("2 + 3 = ?", "5", "pairs")


def test_tasks_in_a_list_are_kept():
    message = {"role": "user", "content": "hi"}
    task = Task(id="t", data_source="d", messages=(message,), ground_truth="1")
    assert load_tasks([task], task="math") == [task]


def test_suite_split_names_load_the_bundled_suites():
    from rllib_dph.envs import suites

    assert load_tasks("math_synth/test", task="math") == suites.load_split("math_synth/test")
    with pytest.raises(ValueError, match="bundled splits: sql_synth/train, sql_synth/test"):
        load_tasks("math_synth/validation", task="math")


def test_a_row_range_selects_rows_of_a_split_or_a_file(tmp_path):
    whole = load_tasks("sql_synth/train", task="sql")
    assert load_tasks("sql_synth/train[:5]", task="sql") == whole[:5]
    assert load_tasks("sql_synth/train[10:12]", task="sql") == whole[10:12]
    assert load_tasks("sql_synth/train[-3:]", task="sql") == whole[-3:]
    path = tmp_path / "math.jsonl"
    path.write_text("".join(json.dumps({"data_source": "m", "prompt": f"{i}+1?", "id": f"q{i}",
                                        "reward_model": {"ground_truth": i + 1}}) + "\n" for i in range(6)))
    assert [t.id for t in load_tasks(f"{path}[2:4]", task="math")] == ["q2", "q3"]
    env = gym.make("rllib_dph/Math-v0", data="math_synth/test[:7]")
    assert len(env.unwrapped) == 7
    with pytest.raises(ValueError, match=r"the row range selects no row of 'sql_synth/train' \(3000 rows\)"):
        load_tasks("sql_synth/train[5000:]", task="sql")


# ---------------------------------------------------------------- errors


def _error_message(tmp_path, db_root, rows, schema=SQL_SCHEMA):
    path = _write_sql_parquet(tmp_path / "broken.parquet", rows, schema)
    with pytest.raises(ValueError) as info:
        load_tasks(path, task="sql", db_root=db_root)
    return path, str(info.value)


@pytest.mark.parametrize(
    "row,field",
    [
        (_sql_row(0, db_id="missing/missing.sqlite"), "reward_model.ground_truth.db_id"),
        (_sql_row(0, gold_sql=""), "reward_model.ground_truth.gold_sql"),
        (_sql_row(0, gold_sql=None), "reward_model.ground_truth.gold_sql"),
        (_sql_row(0, db_id=None), "reward_model.ground_truth.db_id"),
        (_sql_row(0, cmp_method="exact"), "reward_model.ground_truth.cmp_method"),
        ({**_sql_row(0), "prompt": []}, "prompt"),
        ({**_sql_row(0), "prompt": [{"role": "user", "content": None}]}, "prompt[0].content"),
        ({**_sql_row(0), "prompt": [{"role": None, "content": "hi"}]}, "prompt[0].role"),
        ({**_sql_row(0), "data_source": None}, "data_source"),
        ({**_sql_row(0), "reward_model": None}, "reward_model"),
    ],
    ids=["missing db file", "empty gold", "null gold", "null db_id", "unknown cmp_method",
         "no messages", "message without content", "message without role", "null data_source",
         "null reward_model"],
)
def test_malformed_row_names_file_row_and_field(tmp_path, db_root, row, field):
    path, message = _error_message(tmp_path, db_root, [_sql_row(0), _sql_row(1), row])
    assert path in message and "row 2" in message and f"'{field}'" in message


def test_missing_column_names_file_and_column(tmp_path, db_root):
    schema = pa.schema([f for f in SQL_SCHEMA if f.name != "reward_model"])
    rows = [{k: v for k, v in _sql_row(0).items() if k != "reward_model"}]
    path, message = _error_message(tmp_path, db_root, rows, schema)
    assert path in message and "missing column 'reward_model'" in message


def test_wrongly_typed_jsonl_field(tmp_path):
    path = tmp_path / "math.jsonl"
    row = {"data_source": "m", "prompt": 7, "reward_model": {"ground_truth": "1"}}
    path.write_text(json.dumps(row) + "\n")
    expected = r"math.jsonl: line 1 \(row 0\), field 'prompt': expected a string or a list"
    with pytest.raises(ValueError, match=expected):
        load_tasks(str(path), task="math")


def _math_line(i, prompt=None):
    row = {"data_source": "m", "prompt": prompt or f"{i} + 1?",
           "reward_model": {"ground_truth": i + 1}}
    return json.dumps(row) + "\n"


@pytest.mark.parametrize(
    "broken,match",
    [
        (b'{"data_source": "m", "prompt": \n', r"line 6003: not valid JSON"),
        (b"[1, 2]\n", r"line 6003: expected a JSON object"),
        (b'{"data_source": "m", "prompt": "caf\xe9?"}\n', r"line 6003: invalid UTF-8 at byte 35"),
        (_math_line(0, prompt=7).encode(), r"line 6003 \(row 6001\), field 'prompt'"),
    ],
    ids=["bad json", "not an object", "invalid utf-8", "bad field"],
)
def test_jsonl_errors_name_the_line_of_the_file(tmp_path, broken, match):
    """Far past pyarrow's first block (its errors counted rows within a block), after a blank
    line, and after a change of a field's type (which pyarrow refused)."""
    good = "".join(_math_line(i) for i in range(6000)) + "\n" + _math_line(0, prompt=[
        {"role": "user", "content": "1 + 1?"}])
    path = tmp_path / "math.jsonl"
    path.write_bytes(good.encode() + broken)
    with pytest.raises(ValueError, match=match) as info:
        load_tasks(str(path), task="math")
    assert str(path) in str(info.value)
    path.write_bytes(good.encode())
    assert len(load_tasks(str(path), task="math")) == 6001


@pytest.mark.parametrize("db_id", ["/etc/passwd", "../outside.sqlite",
                                   "concert_singer/../../outside.sqlite"])
def test_db_id_outside_db_root_is_refused(tmp_path, db_root, db_id):
    (tmp_path / "outside.sqlite").write_bytes(b"")
    path, message = _error_message(tmp_path, db_root, [_sql_row(0), _sql_row(1, db_id=db_id)])
    assert path in message and "row 1" in message and "'reward_model.ground_truth.db_id'" in message
    assert "outside db_root" in message


def test_db_id_may_walk_inside_db_root(tmp_path, db_root):
    path = _write_sql_parquet(tmp_path / "ok.parquet",
                              [_sql_row(0, db_id="concert_singer/../" + DB_ID)])
    assert load_tasks(path, task="sql", db_root=db_root)[0].ground_truth["db_path"] == str(
        db_root / DB_ID)


@pytest.mark.parametrize(
    "rows,kwargs,match",
    [
        ([{"question": "a"}], {"prompt_format": "Q: {question}"}, "row 0: missing field 'answer'"),
        ([{"q": "a", "answer": "b"}], {"prompt_format": "Q: {question}"}, "field 'question'"),
        ([{"question": "a", "answer": None}], {"prompt_format": "Q {question}"}, "field 'answer'"),
        ([{"question": "a", "answer": "b"}], {"prompt_format": "Q: {}"}, "positional field"),
        ([{"prompt": "x"}], {}, r"row 0: missing field 'data_source'"),
        (["not a row"], {}, r"row 0, field '<row>': expected a Task or a dict"),
    ],
)
def test_bad_in_memory_rows(rows, kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_tasks(rows, task="generic", **kwargs)


@pytest.mark.parametrize(
    "data,task,error,match",
    [
        ("x.parquet", "math", FileNotFoundError, "x.parquet does not exist"),
        ([], "poetry", ValueError, "task='poetry' is not a known task type"),
        (42, "math", TypeError, "got a int"),
    ],
)
def test_bad_arguments(tmp_path, data, task, error, match):
    if isinstance(data, str):
        data = str(tmp_path / data)
    with pytest.raises(error, match=match):
        load_tasks(data, task=task)
