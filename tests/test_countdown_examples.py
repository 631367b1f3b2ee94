"""The countdown tuned examples are the arms of research/reproduce_dph.py's countdown budgets:
GRPO's and DPH-JS (eta = 10)'s settings are the budget's, so the budget's runs measure them; both
validate on the budget's evaluation split; and the budget's primary endpoint names its split."""

import json
from types import SimpleNamespace

import pytest

from rllib_dph.cli.experiments import load_tuned_example

#: Where an example and its arm may differ: the pre-sampling folder (the budget gives every seed
#: its own) and ``env_config["data"]`` (the budget sets it to None; DPH sets it to D_exp).
FREE = ("presample", "env_config")
#: Fields read from neither side (bookkeeping that says nothing about the run's settings).
IGNORED = ("_is_frozen", "algo_class", "_tune_trial_id")
#: The examples' validation during training (``held_out``), which the budget leaves to its own
#: evaluation after training: validation samples with its own seed, and the training run is the
#: same with and without it.
VALIDATION = ("val_interval", "val_env_config", "val_n", "val_limit")


@pytest.fixture(scope="module")
def reproduce(load_script):
    return load_script("research/reproduce_dph")


def settings(config) -> dict:
    return {k: v for k, v in config.to_dict().items() if k not in FREE + IGNORED + VALIDATION}


@pytest.mark.parametrize("method, path", [
    ("GRPO", "tuned_examples/grpo/countdown_tiny_grpo.py"),
    ("DPH-JS (η=10)", "tuned_examples/dph/countdown_tiny_dph_js.py"),
])
def test_each_countdown_example_is_its_budget_arm(reproduce, method, path):
    budget = reproduce.BUDGETS["countdown"]
    arm = reproduce.run_config(method, SimpleNamespace(overrides=budget["config"]), 0)
    example, stop = load_tuned_example(str(reproduce.REPO / path))
    assert stop["training_iteration"] == budget["iterations"]
    mine, theirs = settings(example), settings(arm)
    assert {k for k in mine if mine[k] != theirs.get(k)} == set()
    assert {**example.env_config, "data": None} == arm.env_config
    assert example.val_env_config == {**reproduce.SPLITS["countdown"][1], "data": None}
    assert (example.val_interval, example.val_n, example.val_limit) == (20, 8, 100)
    if method.startswith("DPH"):
        a, b = example.presample, arm.presample
        assert (a.k, a.min_correct, a.pef_samples) == (b.k, b.min_correct, b.pef_samples)


def test_the_primary_endpoints_name_their_split_for_a_data_file_and_for_reasoning_gym(reproduce):
    numbers = {"differences": {"DPH-JS (η=10)": {
        "countdown pass@64 − GRPO": {"mean": 0.05, "ci95": [-0.01, 0.11]},
        "nulls pass@64 − GRPO": {"mean": 0.3, "ci95": [0.2, 0.4]},
    }}}
    lines = reproduce.primary_endpoints(numbers, 64)
    assert lines == [
        "**Primary endpoint** (pre-registered, docs/collapse.md): pass@64 on sql_synth/test_nulls, "
        "DPH-JS (η=10) − GRPO = +30.0 [+20.0, +40.0] points: DPH-JS better than GRPO.",
        "**Primary endpoint** (pre-registered, docs/collapse.md): pass@64 on countdown's 300 test puzzles, "
        "DPH-JS (η=10) − GRPO = +5.0 [-1.0, +11.0] points: cannot tell.",
    ]


def test_the_curves_script_reads_a_trial_and_tabulates_its_validation_points(load_script, tmp_path):
    curves = load_script("research/countdown_curves")
    rows = [{"training_iteration": i, "time_total_s": 10.0 * i, "env_runners": {"reward_mean": 0.01 * i},
             "evaluation": {"pass@1": 0.02, "pass@8": 0.1, "greedy_accuracy": 0.03} if i % 2 == 0 else
             {"pass@1": float("nan")}}  # RLlib's results keep the key between validations, NaN
            for i in range(1, 5)]
    (tmp_path / "result.json").write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    curve = curves.curve(curves.read_trial(tmp_path))
    assert curve["reward"] == pytest.approx([0.01, 0.02, 0.03, 0.04])
    assert sorted(curve["validation"]) == [2, 4] and curve["time_total_s"] == 40.0
    table = curves.curve_table({"GRPO": curve}, {"pass@1": 0.005, "pass@8": 0.034}, interval=2).splitlines()
    assert table[2] == "| base model | 0 | — | 0.50 | 3.4 | — |"
    assert table[4] == "| GRPO | 4 | 0.035 | 2.00 | 10.0 | 3.0 |"  # the mean reward of iterations 3 and 4
    with pytest.raises(SystemExit, match="result.json does not exist"):
        curves.read_trial(tmp_path / "missing")


def test_the_curves_script_splits_name_and_path_at_the_last_equals_sign(load_script):
    curves = load_script("research/countdown_curves")
    assert curves.named("DPH-JS (η=10)=runs/dph") == ("DPH-JS (η=10)", curves.pathlib.Path("runs/dph"))
    with pytest.raises(Exception, match="expected NAME=PATH"):
        curves.named("runs/dph")
