"""Evaluation: pass@k against enumeration, mean@k / maj@k / keep / exploration / style entropy /
pass@k per style / distinct correct solutions on hand-made data, scoring through a scripted
engine, `rllib evaluate` files, and checkpoints."""

import csv
import itertools
import json
import math

import numpy as np
import pytest
import torch

from rllib_dph.envs.suites import load_split
from rllib_dph.chat import encode_prompt
from rllib_dph.cli.main import main
from rllib_dph.engines.base import Completion, SamplingParams
from rllib_dph.engines import make_engine
from rllib_dph.evaluation import (
    EvalResult,
    EvalSettings,
    PromptRecord,
    compare,
    default_ks,
    distinct_correct_at_k,
    evaluate_policy,
    evaluate_engine,
    find_module_checkpoint,
    format_summary,
    keep_and_exploration_rates,
    maj_at_k,
    majority_vote,
    mean_at_k,
    mean_pass_at_k,
    pass_at_k,
    plot_pass_at_k,
    plot_style_pass_at_k,
    seed_matrix,
    style_entropy,
    style_pass_at_k,
)
from rllib_dph.models.hub import load_tokenizer

SQL_ENV = "rllib_dph/SQL-v0"
SQL_TEST = {"data": "sql_synth/test"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------ pure metrics
def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """Share of the k-subsets of n samples (the first c correct) holding a correct sample."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in subset) for subset in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 11))
def test_pass_at_k_equals_enumeration_over_all_subsets(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_is_stable_for_large_n():
    # C(200, 100) overflows a float; the product form does not.
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5)
    assert pass_at_k(200, 0, 100) == 0.0
    assert pass_at_k(200, 150, 100) == 1.0


@pytest.mark.parametrize("n,c,k,match", [(4, 5, 1, "c=5"), (4, 2, 5, "k=5"), (4, 2, 0, "k=0"), (4, -1, 1, "c=-1")])
def test_pass_at_k_rejects_impossible_arguments(n, c, k, match):
    with pytest.raises(ValueError, match=match):
        pass_at_k(n, c, k)


def test_mean_pass_at_k_averages_prompts():
    # pass@2: 1 - C(2,2)/C(4,2) = 5/6 ; 0 ; 1  ->  mean 11/18
    assert mean_pass_at_k([4, 4, 4], [2, 0, 4], 2) == pytest.approx(11 / 18)
    with pytest.raises(ValueError, match="3 entries"):
        mean_pass_at_k([4, 4, 4], [1, 2], 1)


@pytest.mark.parametrize("n,expected", [
    (1, [1]), (2, [1, 2]), (12, [1, 2, 4, 8, 12]), (16, [1, 2, 4, 8, 16]), (64, [1, 2, 4, 8, 16, 32, 64]),
    (100, [1, 2, 4, 8, 16, 32, 64, 100]),
])
def test_default_ks(n, expected):
    assert default_ks(n) == expected


def test_mean_at_k_uses_disjoint_blocks_of_k_samples():
    correct = [[1, 0, 1, 1], [0, 0, 0, 1]]
    assert mean_at_k(correct, 4) == pytest.approx((3 / 4 + 1 / 4) / 2)
    assert mean_at_k(correct, 2) == pytest.approx(0.5)
    # k=3: one block, the first three samples: 2/3 and 0.
    assert mean_at_k(correct, 3) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="k=5 with 4 samples"):
        mean_at_k(correct, 5)


@pytest.mark.parametrize(
    "answers,correct,expected",
    [
        (["a", "a", "b", None], [1, 1, 0, 0], 1.0),
        (["a", "b", "b"], [1, 0, 0], 0.0),
        (["a", "b"], [1, 0], 0.5),  # tie: a random pick among the tied answers
        ([None, None], [0, 0], 0.0),  # nobody votes
        (["a", "a", None, None, None], [1, 1, 0, 0, 0], 1.0),  # no-answer samples do not vote
    ],
)
def test_majority_vote(answers, correct, expected):
    assert majority_vote(answers, correct) == expected


def test_maj_at_k_on_hand_made_prompts():
    answers = [["a", "b", "b", None], ["x", "x", "x", "y"]]
    correct = [[1, 0, 0, 0], [0, 0, 0, 1]]
    # k=4: b beats a (0), x beats y (0).
    assert maj_at_k(answers, correct, 4) == 0.0
    # k=2: prompt 1 blocks [a,b] tie 0.5, [b,None] 0 -> 0.25 ; prompt 2 [x,x] 0, [x,y] 0.5 -> 0.25.
    assert maj_at_k(answers, correct, 2) == pytest.approx(0.25)
    # k=1: plain sample accuracy.
    assert maj_at_k(answers, correct, 1) == pytest.approx(0.25)


def test_keep_and_exploration_rates_on_hand_made_example():
    # Base solved prompts 0, 1, 4; failed 2, 3. New solves 0, 2, 4.
    keep, exploration = keep_and_exploration_rates([1, 1, 0, 0, 1], [1, 0, 1, 0, 1])
    assert keep == pytest.approx(2 / 3) and exploration == pytest.approx(1 / 2)
    # Fractional pass@k: expected shares.
    keep, exploration = keep_and_exploration_rates([0.5, 1.0, 0.0], [1.0, 0.5, 0.25])
    assert keep == pytest.approx((0.5 * 1.0 + 1.0 * 0.5) / 1.5)
    assert exploration == pytest.approx((0.5 * 1.0 + 1.0 * 0.25) / 1.5)
    # Undefined when the base solved everything.
    keep, exploration = keep_and_exploration_rates([1, 1], [1, 0])
    assert keep == 0.5 and math.isnan(exploration)


def test_style_pass_at_k_by_hand_and_against_enumeration():
    # n = 4: a correct plain, a correct cte, a wrong plain, a wrong alias.
    styles, correct = ["plain", "cte", "plain", "alias"], [True, True, False, False]
    # c_plain = 1: pass@2 = 1 - C(3, 2) / C(4, 2) = 1 - 3/6; the same for cte; alias is never correct.
    assert style_pass_at_k(styles, correct, "plain", 2) == pytest.approx(1 / 2)
    assert style_pass_at_k(styles, correct, "cte", 2) == pytest.approx(1 / 2)
    assert style_pass_at_k(styles, correct, "alias", 4) == 0.0
    assert style_pass_at_k(styles, correct, "cte", 1) == pytest.approx(1 / 4)
    assert style_pass_at_k(styles, correct, "plain", 4) == 1.0
    # c_plain = 3: pass@1 = 3/4, pass@2 = 1 - C(1, 2) / C(4, 2) = 1; the wrong cte scores nothing.
    styles, correct = ["plain", "plain", "cte", "plain"], [True, True, False, True]
    assert style_pass_at_k(styles, correct, "plain", 1) == pytest.approx(3 / 4)
    assert style_pass_at_k(styles, correct, "plain", 2) == 1.0
    assert style_pass_at_k(styles, correct, "cte", 2) == 0.0
    assert style_pass_at_k([], [True, True], "plain", 1) == 0.0  # the env named no style

    rng = np.random.default_rng(0)
    for _ in range(30):
        n = int(rng.integers(1, 8))
        styles, correct = rng.choice(["a", "b", "c"], n).tolist(), (rng.random(n) < 0.5).tolist()
        for style, k in itertools.product("abc", range(1, n + 1)):
            subsets = list(itertools.combinations(range(n), k))
            share = sum(any(correct[i] and styles[i] == style for i in s) for s in subsets) / len(subsets)
            assert style_pass_at_k(styles, correct, style, k) == pytest.approx(share, abs=1e-12)
    with pytest.raises(ValueError, match="styles has 1 entries and correct 2"):
        style_pass_at_k(["plain"], [True, False], "plain", 1)
    with pytest.raises(ValueError, match="k=3"):
        style_pass_at_k(["plain", "cte"], [True, False], "plain", 3)


def test_distinct_correct_at_k_by_hand_and_against_enumeration():
    # n = 4: correct samples "a", "a", "b"; the wrong sample's "c" is not a correct solution.
    solutions, correct = ["a", "a", "b", "c"], [True, True, True, False]
    # D@k = [1 - C(4 - 2, k) / C(4, k)] + [1 - C(4 - 1, k) / C(4, k)]
    assert distinct_correct_at_k(solutions, correct, 1) == pytest.approx(2 / 4 + 1 / 4)
    assert distinct_correct_at_k(solutions, correct, 2) == pytest.approx((1 - 1 / 6) + (1 - 3 / 6))
    assert distinct_correct_at_k(solutions, correct, 4) == pytest.approx(2)  # the plain count at k = n
    assert distinct_correct_at_k(["a", None, "a"], [True, True, True], 3) == pytest.approx(1)  # no key: not counted

    rng = np.random.default_rng(1)
    for _ in range(30):
        n = int(rng.integers(1, 8))
        solutions, correct = rng.choice(["a", "b", "c", "d"], n).tolist(), (rng.random(n) < 0.6).tolist()
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(range(n), k))
            mean = sum(len({solutions[i] for i in s if correct[i]}) for s in subsets) / len(subsets)
            assert distinct_correct_at_k(solutions, correct, k) == pytest.approx(mean, abs=1e-12)
    with pytest.raises(ValueError, match="k=5 with n=4"):
        distinct_correct_at_k(["a"] * 4, [False] * 4, 5)  # checked even with nothing correct
    with pytest.raises(ValueError, match="solutions has 1 entries"):
        distinct_correct_at_k(["a"], [True, True], 1)


@pytest.mark.parametrize(
    "counts,bits",
    [
        ({"plain": 4}, 0.0),
        ({"plain": 2, "cte": 2}, 1.0),
        ({"a": 1, "b": 1, "c": 1, "d": 1, "none": 10}, 2.0),  # "none" is no style
        ({"plain": 3, "other": 1}, -(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25))),
        ({}, 0.0),
    ],
)
def test_style_entropy_in_bits(counts, bits):
    assert style_entropy(counts) == pytest.approx(bits)


# ------------------------------------------------------------------------------ results
def record(task_id, correct, *, answers=None, styles=(), greedy=None, index=0, solutions=()):
    return PromptRecord(
        task_id=task_id,
        index=index,
        correct=[bool(c) for c in correct],
        answers=answers or [None] * len(correct),
        styles=list(styles),
        num_truncated=0,
        greedy_correct=greedy,
        solutions=list(solutions),
    )


def result_of(records, n=4):
    return EvalResult(records=records, n=n, temperature=1.0, top_p=1.0, max_new_tokens=8, seed=0, ks=default_ks(n))


def test_compare_matches_prompts_by_task_id():
    # Baseline at pass@4 (k = n, binary): solved t0, t1, t3; failed t2, t4.
    baseline = result_of([
        record("t4", [0, 0, 0, 0]),
        record("t0", [1, 0, 0, 0]),
        record("t1", [0, 1, 1, 0]),
        record("t2", [0, 0, 0, 0]),
        record("t3", [1, 1, 1, 1]),
        record("t5", [1, 1, 1, 1]),  # not evaluated by the tuned policy: ignored
    ])
    tuned = result_of([
        record("t0", [1, 1, 1, 1]),  # kept
        record("t1", [0, 0, 0, 0]),  # forgotten
        record("t2", [0, 0, 1, 0]),  # explored
        record("t3", [0, 0, 0, 1]),  # kept
        record("t4", [0, 0, 0, 0]),  # still failed
    ])
    out = compare(tuned, baseline, k=4)
    expected = {"keep_rate": 2 / 3, "exploration_rate": 1 / 2, "base_solved": 3, "base_failed": 2}
    assert {key: out[key] for key in expected} == pytest.approx(expected)
    assert out["pass_diff"] == pytest.approx(0.0)  # 3 of 5 solved by each: one forgotten, one explored
    low, high = out["keep_rate_ci"]
    assert 0 <= low <= 2 / 3 <= high <= 1  # paired bootstrap interval around the estimate
    low, high = out["pass_diff_ci"]
    assert -1 <= low < 0 < high <= 1
    with pytest.raises(ValueError, match="1 of 1 prompts are not in the baseline"):
        compare(result_of([record("t9", [1, 1, 1, 1])]), baseline, k=4)


def test_a_task_fingerprint_names_the_question_not_where_its_data_lie():
    import dataclasses

    task = load_split("sql_synth/test_ties")[0]
    moved = dataclasses.replace(task, ground_truth={**task.ground_truth, "db_path": "/elsewhere/db.sqlite"})
    other_gold = dataclasses.replace(task, ground_truth={**task.ground_truth, "gold_sql": "SELECT 1"})
    assert moved.fingerprint == task.fingerprint != other_gold.fingerprint
    assert len(task.fingerprint) == 16 and task.fingerprint != load_split("sql_synth/test_ties")[1].fingerprint


def test_evaluations_of_other_questions_under_the_same_ids_are_not_paired(tmp_path):
    """A task id names a position; when the data changed between two evaluations (the ties
    family's version 1 and 2, say), compare() and a stored file's check refuse, naming the task."""
    import dataclasses

    from rllib_dph.evaluation.results import check_current

    tasks = load_split("sql_synth/test_ties")[:3]
    base = result_of([dataclasses.replace(record(t.id, [1, 0, 0, 0]), index=i, task_fingerprint=t.fingerprint)
                      for i, t in enumerate(tasks)])
    new = result_of([dataclasses.replace(r, correct=[True] * 4) for r in base.records])
    assert compare(new, base, k=1)["pass_diff"] == pytest.approx(0.75)
    assert check_current(base, tasks, "base.json") == 0
    stale = result_of([dataclasses.replace(r, task_fingerprint="0" * 16) if r.index == 1 else r for r in base.records])
    with pytest.raises(ValueError, match=rf"1 of 3 prompts are other questions.*{tasks[1].id}"):
        compare(new, stale, k=4)
    with pytest.raises(ValueError, match=rf"stale.json: '{tasks[1].id}' was another question.*delete the file"):
        check_current(stale, tasks, "stale.json")
    legacy = result_of([dataclasses.replace(r, task_fingerprint="") for r in base.records])
    assert check_current(legacy, tasks, "old.json") == 3  # written before fingerprints: counted, not refused
    assert compare(new, legacy, k=1)["pass_diff"] == pytest.approx(0.75)
    with pytest.raises(ValueError, match="record 0 .* has no task at that index now"):
        check_current(base, load_split("sql_synth/test")[:3], "other.json")


def test_summary_flat_metrics_and_files(tmp_path):
    result = result_of([
        record(
            "t0", [1, 1, 0, 0], answers=["a", "a", "b", None], styles=["plain", "cte", "plain", "none"], greedy=True
        ),
        record("t1", [0, 0, 0, 1], answers=["x", "x", "y", "z"], styles=["plain"] * 4, greedy=False, index=1),
    ])
    summary = result.summary()
    assert summary["greedy_accuracy"] == 0.5
    assert summary["pass@1"] == pytest.approx((2 / 4 + 1 / 4) / 2)
    assert summary["pass@4"] == 1.0
    assert summary["mean@4"] == pytest.approx(3 / 8)
    assert summary["maj@4"] == pytest.approx((1.0 + 0.0) / 2)
    assert summary["style_counts"] == {"plain": 6, "cte": 1, "none": 1}
    assert summary["style_entropy_bits"] == pytest.approx(style_entropy({"plain": 6, "cte": 1}))

    flat = result.flat_metrics(prefix="eval/")
    assert set(flat) == {
        "eval/greedy_accuracy", "eval/pass@1", "eval/pass@2", "eval/pass@4", "eval/mean@4", "eval/maj@1",
        "eval/maj@2", "eval/maj@4", "eval/truncation_rate", "eval/style_entropy_bits", "eval/style/plain",
        "eval/style/cte", "eval/style/none",
    }
    assert all(isinstance(v, float) for v in flat.values())
    assert flat["eval/style/plain"] == pytest.approx(6 / 8)

    restored = EvalResult.from_json(result.to_json(tmp_path / "r.json"))
    assert restored.summary() == summary and restored.records == result.records

    with open(result.to_csv(tmp_path / "r.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [r["task_id"] for r in rows] == ["t0", "t1"]
    assert rows[0]["num_correct"] == "2" and rows[0]["greedy_correct"] == "1" and rows[0]["style/cte"] == "1"
    assert float(rows[1]["pass@2"]) == pytest.approx(0.5)

    png = plot_pass_at_k([result, tmp_path / "r.json"], tmp_path / "plot" / "p.png")
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_style_pass_and_distinct_solutions_in_summary_intervals_compare_table_and_plot(tmp_path):
    baseline = result_of([
        record("t0", [1, 1, 0, 0], styles=["plain", "cte", "plain", "alias"], solutions=["p1", "c1", "p2", "a1"]),
        record("t1", [1, 1, 1, 0], styles=["plain"] * 3 + ["none"], solutions=["p1", "p2", "p1", None], index=1),
    ])
    tuned = result_of([  # another prompt order: compare matches by task id
        record("t1", [1, 1, 1, 1], styles=["plain"] * 4, solutions=["p1"] * 4, index=1),
        record("t0", [1, 1, 0, 1], styles=["plain", "plain", "cte", "plain"], solutions=["p1", "p1", "c1", "p1"]),
    ])
    assert baseline.solution_styles() == ["plain", "cte", "alias"]  # "none" is no solution style
    base = baseline.summary()
    # t0: c_plain = c_cte = 1 -> pass@2 = 1 - C(3, 2) / C(4, 2) = 1/2 each; t1: c_plain = 3 -> 1, c_cte = 0.
    assert base["pass@2/plain"] == pytest.approx((1 / 2 + 1) / 2)
    assert base["pass@2/cte"] == pytest.approx((1 / 2 + 0) / 2)
    assert base["pass@4/alias"] == 0.0
    # Distinct correct solutions: t0 {p1, c1}, t1 {p1, p2} (p1 twice). At k = 2, t0: 2 * (1 - 3/6);
    # t1: (1 - C(2, 2) / 6) + (1 - 3/6).
    assert base["distinct_correct@4"] == pytest.approx(2)
    assert base["distinct_correct@2"] == pytest.approx((1 + (5 / 6 + 1 / 2)) / 2)
    assert base["distinct_correct@1"] == pytest.approx((2 / 4 + 3 / 4) / 2)
    intervals = baseline.intervals()
    for key in ("pass@2/plain", "pass@4/cte", "distinct_correct@2"):
        low, high = intervals[key]
        assert low <= base[key] <= high
    assert intervals["pass@4/alias"] == (0.0, 0.0)
    flat = baseline.flat_metrics()
    assert flat["distinct_correct@4"] == pytest.approx(2) and "pass@2/plain" not in flat

    out = compare(tuned, baseline, k=2)
    # tuned: plain is correct in 3 and 4 samples -> pass@2/plain = 1; its one cte is wrong; it never writes alias.
    assert out["pass_diff/plain"] == pytest.approx(1 - 3 / 4)
    assert out["pass_diff/cte"] == pytest.approx(0 - 1 / 4)
    assert out["pass_diff/alias"] == 0.0 and out["pass_diff_ci/alias"] == (0.0, 0.0)
    assert out["distinct_correct_diff"] == pytest.approx(1 - 7 / 6)  # one solution (p1) per prompt
    low, high = out["pass_diff_ci/cte"]
    assert -1 / 2 <= low <= -1 / 4 <= high <= 0

    table = format_summary(tuned, {2: out})
    assert "pass@k per solution style" in table and "k=2 - base" in table
    rows = {line.split()[0]: line for line in table.splitlines()[-3:]}
    assert set(rows) == {"plain", "cte", "distinct"}
    assert "-0.250 [" in rows["cte"] and "-0.167 [" in rows["distinct"]

    png = plot_style_pass_at_k([baseline, tuned], tmp_path / "styles.png", k=2)
    assert png.read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(ValueError, match=r"k=8 must be in \[1, n\]"):
        plot_style_pass_at_k([baseline], tmp_path / "x.png", k=8)
    with pytest.raises(ValueError, match="no result recorded a solution style"):
        plot_style_pass_at_k([result_of([record("t0", [1, 0, 0, 0])])], tmp_path / "x.png")


def test_one_runs_seeds_are_pooled_in_the_plots_as_the_tables_pool_them(tmp_path, monkeypatch):
    from rllib_dph.evaluation import results as results_module
    from rllib_dph.evaluation.intervals import mean_interval

    def seed(name, outcomes):
        result = result_of([record(f"t{i}", c, styles=["plain", "cte", "plain", "cte"], index=i)
                            for i, c in enumerate(outcomes)])
        result.name = name
        return result

    base = seed("base", [[1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    seeds = [seed("tuned", [[1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 1, 0]]), seed("tuned", [[0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]])]
    matrix = seed_matrix(seeds, "pass@2")  # (S=2, P=3)
    assert matrix.shape == (2, 3)
    np.testing.assert_allclose(matrix, [seeds[0].pass_at(2), seeds[1].pass_at(2)])

    figures = []
    monkeypatch.setattr(results_module, "_save", lambda fig, out: figures.append(fig) or out)
    plot_pass_at_k([base, seeds], tmp_path / "p.png")
    ax = figures[-1].axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["base", "tuned (2 seeds)"]
    pooled = ax.lines[1].get_ydata()
    np.testing.assert_allclose(pooled, [100 * seed_matrix(seeds, f"pass@{k}").mean() for k in seeds[0].ks])
    band = ax.collections[1].get_paths()[0].vertices[:, 1]  # the band's outline: its lows and highs
    assert 100 * mean_interval(seed_matrix(seeds, "pass@1"))[0] == pytest.approx(band.min())

    plot_style_pass_at_k([base, seeds], tmp_path / "s.png", k=2)
    bars = [patch.get_height() for patch in figures[-1].axes[0].patches]  # base's styles, then tuned's
    assert bars[2:] == pytest.approx([100 * seed_matrix(seeds, f"pass@2/{style}").mean() for style in ("plain", "cte")])

    other = seed("tuned", [[1, 1, 1, 1], [0, 0, 0, 0]])  # two prompts, not the first seed's three
    with pytest.raises(ValueError, match="not the same prompts in the same order"):
        plot_pass_at_k([base, [seeds[0], other]], tmp_path / "x.png")
    with pytest.raises(ValueError, match="run 2 is an empty list"):
        plot_pass_at_k([base, []], tmp_path / "x.png")


def test_results_written_before_solution_keys_still_load_and_report_the_rest(tmp_path):
    result = result_of([record("t0", [1, 1, 0, 0], styles=["plain"] * 4, solutions=["a", "b", "c", "d"])])
    data = result.to_dict()
    assert data["summary"]["distinct_correct@4"] == 2 and data["intervals_95"]["distinct_correct@4"] == [2.0, 2.0]
    for r in data["records"]:
        del r["solutions"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    old = EvalResult.from_json(path)
    assert not old.has_solutions and old.summary()["pass@2/plain"] == pytest.approx(1 - 1 / 6)
    assert not any(key.startswith("distinct_correct") for key in old.summary())
    with pytest.raises(ValueError, match="no solution keys were recorded"):
        old.per_prompt("distinct_correct@2")
    assert "distinct_correct_diff" not in compare(result, old, k=2)


def test_from_json_rejects_other_files(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"foo": 1}))
    with pytest.raises(ValueError, match="no evaluation result"):
        EvalResult.from_json(path)


# ------------------------------------------------------------------------------ scoring
class ScriptedEngine:
    """A rollout engine that answers each prompt with fixed texts (samples in order, greedy text)."""

    def __init__(self, tokenizer, script):
        self.tokenizer = tokenizer
        self.script = script  # prompt ids (tuple) -> (sample texts, greedy text)

    def _completion(self, text):
        ids = np.array(self.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
        return Completion(token_ids=ids, logprobs=np.zeros(len(ids), dtype=np.float32))

    def generate(self, prompts, params):
        groups = []
        for prompt in prompts:
            samples, greedy = self.script[tuple(prompt)]
            texts = [greedy] if params.temperature == 0 else samples[: params.n]
            groups.append([self._completion(t) for t in texts])
        return groups


@pytest.fixture(scope="module")
def sql_env():
    from rllib_dph.envs.sql import SQLEnv

    return SQLEnv(load_split("sql_synth/test")[:3])


def sql_block(query):
    return f"```sql\n{query}\n```"


def test_evaluate_engine_scores_votes_and_styles(sql_env):
    tokenizer = load_tokenizer("tiny-random")
    gold = [t.meta["styles"] for t in sql_env.tasks]
    wrong = sql_block("SELECT 123456789")
    samples = [
        [sql_block(gold[0]["plain"]), sql_block(gold[0]["cte"]), "no query here", wrong],
        [wrong, wrong, wrong, sql_block(gold[1]["subquery"])],
        [sql_block("SELEC nonsense"), wrong, "", sql_block(gold[2]["alias"])],
    ]
    greedy = [sql_block(gold[0]["plain"]), wrong, wrong]
    script = {
        tuple(encode_prompt(tokenizer, [dict(m) for m in task.messages])): (s, g)
        for task, s, g in zip(sql_env.tasks, samples, greedy)
    }
    engine = ScriptedEngine(tokenizer, script)
    result = evaluate_engine(engine, sql_env, EvalSettings(sampling=SamplingParams(n=4), batch_prompts=2, keep_completions=True))

    assert [r.correct for r in result.records] == [
        [True, True, False, False],
        [False, False, False, True],
        [False, False, False, True],
    ]
    assert [r.greedy_correct for r in result.records] == [True, False, False]
    first = result.records[0]
    # Two queries with the same result rows share one answer; no block or a failing query: None.
    assert first.answers[0] == first.answers[1] and first.answers[2] is None
    assert first.answers[3] not in first.answers[:3]
    assert result.records[2].answers[:3] == [None, result.records[1].answers[0], None]
    assert [r.styles for r in result.records][0] == ["plain", "cte", "none", "plain"]
    assert result.records[1].completions == samples[1] and result.records[0].greedy_completion == greedy[0]
    # Solutions: the gold plain and cte queries differ; no block has none; the same wrong query is one.
    solutions = [r.solutions for r in result.records]
    assert solutions[0][0] != solutions[0][1] and solutions[0][2] is None
    assert solutions[1][0] == solutions[1][1] == solutions[1][2] == solutions[0][3] != solutions[1][3]

    summary = result.summary()
    assert summary["greedy_accuracy"] == pytest.approx(1 / 3)
    assert summary["pass@1"] == pytest.approx((2 / 4 + 1 / 4 + 1 / 4) / 3)
    assert summary["pass@4"] == 1.0
    # maj@4: gold wins prompt 0 (2 vs 1); wrong wins prompt 1 (3 vs 1); prompt 2 ties 1-1.
    assert summary["maj@4"] == pytest.approx((1 + 0 + 0.5) / 3)
    assert summary["style_counts"]["cte"] == 1 and summary["style_counts"]["subquery"] == 1
    assert summary["distinct_correct@4"] == pytest.approx((2 + 1 + 1) / 3)
    # A correct cte sample only on prompt 0 (of 4 samples): pass@1/cte = (1/4) / 3.
    assert summary["pass@1/cte"] == pytest.approx(1 / 12) and summary["pass@4/cte"] == pytest.approx(1 / 3)
    assert [r.task_fingerprint for r in result.records] == [t.fingerprint for t in sql_env.tasks]


def test_sql_solution_key_ignores_whitespace_case_comments_and_semicolons(sql_env):
    def key(query):
        return sql_env.solution_key(0, "Here it is:\n" + sql_block(query))

    assert key("select name  from t;") == key("SELECT name\nFROM T -- the names\n;;") == "SELECT NAME FROM T"
    assert key("SELECT t.name FROM t") != key("SELECT name FROM t")  # another way to write it
    assert key("SELECT 'Bob' FROM t") != key("SELECT 'bob' FROM t")  # quoted text keeps its case
    assert sql_env.solution_key(0, "no query here") is None


def test_the_default_solution_key_is_the_text_with_whitespace_folded():
    from rllib_dph.envs.math import MathEnv

    env = MathEnv(load_split("math_synth/test")[:1])  # math keeps the default of rllib_dph.envs.base
    assert env.solution_key(0, " 2 +  2\n= \\boxed{4} ") == "2 + 2 = \\boxed{4}"
    assert env.solution_key(0, " \n ") is None


def test_evaluate_engine_checks_its_settings(sql_env):
    engine = ScriptedEngine(load_tokenizer("tiny-random"), {})
    with pytest.raises(ValueError, match=r"ks=\[8\] must all be in \[1, n=4\]"):
        evaluate_engine(engine, sql_env, EvalSettings(sampling=SamplingParams(n=4), ks=[8]))
    with pytest.raises(ValueError, match="style_suite='spider'"):
        evaluate_engine(engine, sql_env, EvalSettings(sampling=SamplingParams(n=4), style_suite="spider"))
    with pytest.raises(ValueError, match="temperature=0"):
        evaluate_engine(engine, sql_env, EvalSettings(sampling=SamplingParams(n=4, temperature=0)))


# ------------------------------------------------------------------------------ CLI and checkpoints
def test_rllib_evaluate_writes_results_plot_and_comparison(tmp_path, capsys):
    common = ["--env", SQL_ENV, "--env-config", json.dumps(SQL_TEST), "--n", "4", "--limit", "3"]
    common += ["--max-new-tokens", "8"]
    base_dir, tuned_dir = tmp_path / "base", tmp_path / "tuned"
    main(["evaluate", "tiny-random", *common, "--out", str(base_dir), "--name", "base"])
    main([
        "evaluate", "tiny-random", *common, "--seed", "1", "--out", str(tuned_dir),
        "--baseline", str(base_dir / "results.json"), "--plot", str(base_dir / "results.json"),
    ])
    printed = capsys.readouterr().out
    assert "pass@k" in printed and "keep" in printed and "greedy accuracy" in printed

    data = json.loads((tuned_dir / "results.json").read_text())
    assert {"settings", "summary", "records"} <= set(data) and len(data["records"]) == 3
    assert data["settings"]["env_config"] == SQL_TEST and data["settings"]["seed"] == 1
    for key in ("greedy_accuracy", "pass@1", "pass@2", "pass@4", "mean@4", "maj@4", "style_entropy_bits"):
        assert key in data["summary"]
    with open(tuned_dir / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and {"task_id", "num_correct", "greedy_correct", "pass@4"} <= set(rows[0])
    assert (tuned_dir / "pass_at_k.png").read_bytes()[:8] == PNG_MAGIC
    comparison = json.loads((tuned_dir / "compare.json").read_text())
    assert set(comparison["by_k"]) == {"1", "2", "4"}
    assert set(comparison["by_k"]["4"]) == {
        "keep_rate", "exploration_rate", "base_solved", "base_failed",
        "keep_rate_ci", "exploration_rate_ci", "pass_diff", "pass_diff_ci",
        "distinct_correct_diff", "distinct_correct_diff_ci",  # the random model writes no solution style
    }
    assert set(data["intervals_95"]) >= {"greedy_accuracy", "pass@1", "pass@4", "distinct_correct@4"}
    assert "written before task fingerprints" not in printed
    # a baseline whose prompt 0 was another question under the same id (the data changed since)
    stale = json.loads((base_dir / "results.json").read_text())
    stale["records"][0]["task_fingerprint"] = "0" * 16
    (tmp_path / "stale.json").write_text(json.dumps(stale))
    with pytest.raises(SystemExit, match=r"--baseline: 1 of 3 prompts are other questions .*sql_synth/test/00000"):
        main(["evaluate", "tiny-random", *common, "--out", str(tmp_path / "again"), "--baseline", str(tmp_path / "stale.json")])


def test_rllib_evaluate_at_n_64_reports_pass_at_64_styles_and_distinct_solutions(tmp_path, capsys):
    out = tmp_path / "n64"
    main([
        "evaluate", "tiny-sql-math", "--env", SQL_ENV, "--env-config", json.dumps(SQL_TEST), "--n", "64",
        "--limit", "2", "--max-new-tokens", "96", "--no-greedy", "--out", str(out),
    ])
    printed = capsys.readouterr().out
    data = json.loads((out / "results.json").read_text())
    assert data["settings"]["ks"] == [1, 2, 4, 8, 16, 32, 64]
    summary, intervals = data["summary"], data["intervals_95"]
    styles = [s for s in summary["style_counts"] if s != "none"]
    assert styles and {f"pass@64/{s}" for s in styles} <= set(summary) and "distinct_correct@64" in intervals
    for s in styles:  # a style's pass@k is at most the overall pass@k
        assert 0 <= summary[f"pass@64/{s}"] <= summary["pass@64"]
        low, high = intervals[f"pass@64/{s}"]
        assert low <= summary[f"pass@64/{s}"] <= high
    assert 1 <= summary["distinct_correct@64"] <= 64 * summary["pass@64"]
    assert f"\n{styles[0]} " in printed and "distinct correct" in printed
    assert (out / "style_pass_at_k.png").read_bytes()[:8] == PNG_MAGIC


def test_trial_folders_and_partial_checkpoints_are_refused(tmp_path):
    (tmp_path / "trial" / "checkpoint_000001").mkdir(parents=True)
    with pytest.raises(ValueError, match="Tune trial folder.*checkpoint_000001"):
        find_module_checkpoint(tmp_path / "trial")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "rllib_checkpoint.json").write_text("{}")
    with pytest.raises(ValueError, match="without learner_group"):
        find_module_checkpoint(tmp_path / "ckpt")
    assert find_module_checkpoint(tmp_path) is None
    (tmp_path / "trial" / "config.json").write_text("{}")  # a model folder, whatever else it holds
    assert find_module_checkpoint(tmp_path / "trial") is None


def test_checkpoint_evaluates_like_the_weights_it_was_saved_with(ray_session, tiny_grpo_config, tmp_path, monkeypatch):
    from ray.rllib.core import DEFAULT_MODULE_ID

    algo = tiny_grpo_config.build_algo()
    weights = algo.learner_group.get_weights()[DEFAULT_MODULE_ID]
    generator = torch.Generator().manual_seed(0)
    # Perturb the decoder layers (not the tied embeddings) so that the outputs change.
    saved = {
        name: value + 0.1 * torch.randn(value.shape, generator=generator) if ".layers." in name else value
        for name, value in weights.items()
    }
    algo.learner_group.set_weights({DEFAULT_MODULE_ID: saved})
    algo.save_to_path(str(tmp_path / "ckpt"))
    algo.stop()

    settings = EvalSettings(sampling=SamplingParams(n=2, max_new_tokens=12), limit=3, keep_completions=True, progress=False)
    from_checkpoint = evaluate_policy(str(tmp_path / "ckpt"), SQL_ENV, SQL_TEST, settings)
    engine = make_engine("hf", "tiny-random")
    base = evaluate_policy(engine, SQL_ENV, SQL_TEST, settings)
    engine.update_weights(saved)
    expected = evaluate_policy(engine, SQL_ENV, SQL_TEST, settings)

    greedy = [r.greedy_completion for r in from_checkpoint.records]
    assert greedy == [r.greedy_completion for r in expected.records]
    assert [r.completions for r in from_checkpoint.records] == [r.completions for r in expected.records]
    assert greedy != [r.greedy_completion for r in base.records]
    assert from_checkpoint.policy == str(tmp_path / "ckpt")
    monkeypatch.chdir(tmp_path)  # a relative checkpoint path (RLlib's pyarrow reader refuses one as given)
    relative = evaluate_policy("ckpt", SQL_ENV, SQL_TEST, settings)
    assert [r.completions for r in relative.records] == [r.completions for r in expected.records]
