"""research/collapse_search.py: the commands of the collapse sweep and of the curves, per family."""

import json
from types import SimpleNamespace

import pytest


@pytest.fixture(scope="module")
def search(load_script):
    return load_script("research/collapse_search")


def _args(family, curve=True):
    return SimpleNamespace(family=family, curve=curve, n=64, limit=100, iterations=100, every=20, seed=0, config="{}")


def _flag(cmd, name):
    return cmd[cmd.index(name) + 1]


def test_the_ties_curve_trains_the_tuned_examples_and_evaluates_test_ties(search):
    cmd = search.command("dph-js", _args("ties"))
    assert _flag(cmd, "--split") == "sql_synth/test_ties"
    assert _flag(cmd, "--example").endswith("tuned_examples/dph/sql_tiny_dph_js.py")
    assert json.loads(_flag(cmd, "--config")) == {"max_response_length": 96}
    assert _flag(cmd, "--out").endswith("research/out/collapse/curves/dph-js")


def test_the_nulls_curve_uses_the_nulls_budget_and_its_own_folders(search):
    args = _args("nulls")
    cmd = search.command("dph-js-eta10", args)
    assert _flag(cmd, "--split") == "sql_synth/test_nulls"
    assert json.loads(_flag(cmd, "--config")) == {
        "max_response_length": 96, "model_name": "tiny-sql-math-nulls",
        "env_config": {"data": "sql_synth/train@nulls=0.1"}, "pef_coeff": 10.0}
    assert _flag(cmd, "--out").endswith("research/out/collapse/nulls/curves/dph-js-eta10")
    assert _flag(cmd, "--base-cache").endswith("research/out/collapse/nulls/base")
    assert search.command("grpo", args)[search.command("grpo", args).index("--example") + 1].endswith("sql_tiny_grpo.py")
    assert search.FAMILIES["nulls"]["curve"].split(",") == ["grpo", "dph-js", "dph-js-eta10"]
    assert all(name in search.SETTINGS for name in search.FAMILIES["nulls"]["curve"].split(","))
