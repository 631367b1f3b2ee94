"""95 % bootstrap intervals: over prompts, over seeds, paired differences, rates and entropies."""

import math

import numpy as np
import pytest

from rllib_dph.evaluation import EvalResult, PromptRecord, plot_pass_at_k, style_entropy
from rllib_dph.evaluation.intervals import (
    bootstrap_interval,
    entropy_interval,
    format_interval,
    keep_exploration_intervals,
    mean_interval,
    paired_difference_interval,
    paired_entropy_difference_interval,
)


def test_mean_interval_is_deterministic_contains_the_mean_and_collapses_for_constants():
    values = (np.random.default_rng(1).random(100) < 0.3).astype(float)
    low, high = mean_interval(values)
    assert low < values.mean() < high and high - low < 0.25
    assert mean_interval(values) == (low, high)  # same seed, same interval
    assert mean_interval(np.full(50, 0.4)) == pytest.approx((0.4, 0.4))


def test_mean_interval_covers_the_true_rate_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    covered = 0
    for trial in range(40):
        low, high = mean_interval((rng.random(200) < 0.3).astype(float), seed=trial, num_boot=400)
        covered += low <= 0.3 <= high
    assert covered >= 34  # 95 % nominal; a broken interval (e.g. no redraw) covers far less


def test_seeds_are_redrawn_too():
    two_seeds = np.stack([np.zeros(30), np.ones(30)])  # (S=2, P=30): the seeds disagree entirely
    assert mean_interval(two_seeds) == (0.0, 1.0)  # a redraw can take seed 0 twice, or seed 1 twice
    assert mean_interval(two_seeds.mean(axis=0)) == (0.5, 0.5)  # pooled first: no seed variation left


def test_paired_difference_cancels_what_both_policies_share():
    rng = np.random.default_rng(2)
    base = rng.random(80)  # per-prompt difficulty varies a lot
    assert paired_difference_interval(base + 0.1, base) == pytest.approx((0.1, 0.1))
    assert paired_difference_interval(base, base) == (0.0, 0.0)
    with pytest.raises(ValueError, match="80 prompts vs 79"):
        paired_difference_interval(base, base[:-1])


def test_mean_and_paired_intervals_equal_the_bootstrap_of_one_redraw_at_a_time():
    # mean_interval and paired_difference_interval compute every redraw at once; they must give the
    # interval of the scalar statistic on the same redraws (the baseline's seeds from seed + 1).
    rng = np.random.default_rng(3)
    values, baseline = rng.random((3, 40)), rng.random((2, 40))  # (S, P), (S_b, P)
    one_at_a_time = bootstrap_interval(lambda p, s: values[np.ix_(s, p)].mean(), 40, 3, seed=5, num_boot=300)
    assert mean_interval(values, seed=5, num_boot=300) == pytest.approx(one_at_a_time, abs=1e-12)
    baseline_seeds = np.random.default_rng(6)

    def difference(p, s):
        seeds_b = baseline_seeds.integers(0, 2, 2)
        return values[np.ix_(s, p)].mean() - baseline[np.ix_(seeds_b, p)].mean()

    expected = bootstrap_interval(difference, 40, 3, seed=5, num_boot=300)
    assert paired_difference_interval(values, baseline, seed=5, num_boot=300) == pytest.approx(expected, abs=1e-12)
    assert mean_interval(values, seed=6, num_boot=300) != one_at_a_time  # another seed, other redraws


def test_keep_and_exploration_intervals_hold_the_rates_and_nan_when_undefined():
    base = np.array([1, 1, 1, 0, 0, 0], dtype=float)
    new = np.array([1, 1, 0, 1, 0, 0], dtype=float)
    (keep_low, keep_high), (explore_low, explore_high) = keep_exploration_intervals(base, new)
    assert keep_low <= 2 / 3 <= keep_high and explore_low <= 1 / 3 <= explore_high
    _, explore = keep_exploration_intervals(np.ones(5), np.ones(5))  # the base failed nothing
    assert all(math.isnan(x) for x in explore)


def test_entropy_interval_recomputes_the_entropy_of_redrawn_prompts():
    styles = ["plain", "cte"]
    one_style = np.array([[4, 0]] * 10)  # (P, K): every prompt used one style only
    assert entropy_interval(one_style, style_entropy, styles) == (0.0, 0.0)
    mixed = np.array([[4, 0], [0, 4]] * 10)
    low, high = entropy_interval(mixed, style_entropy, styles)
    assert 0.5 < low < 1.0 and high == pytest.approx(1.0)


def test_paired_entropy_difference_is_zero_for_equal_counts_and_signed_otherwise():
    styles = ["plain", "cte"]
    mixed = np.array([[4, 0], [0, 4]] * 10)  # 1 bit pooled
    one_style = np.array([[4, 0]] * 20)  # 0 bits
    assert paired_entropy_difference_interval(mixed, mixed, style_entropy, styles) == (0.0, 0.0)
    low, high = paired_entropy_difference_interval(one_style, mixed, style_entropy, styles)
    assert high < 0 and low >= -1.0
    with pytest.raises(ValueError, match="differ in P or K"):
        paired_entropy_difference_interval(one_style[:-1], mixed, style_entropy, styles)


def test_format_interval():
    assert format_interval(0.62, (0.48, 0.74), scale=100) == "62.0 [48.0, 74.0]"
    assert format_interval(math.nan, (0.1, 0.2)) == "—" and format_interval(0.5, (math.nan, math.nan)) == "0.5"


def _result(data: str, correct: list[list[int]]) -> EvalResult:
    records = [
        PromptRecord(task_id=f"t{i}", index=i, correct=[bool(c) for c in row], answers=[None] * len(row),
                     styles=[], num_truncated=0, greedy_correct=bool(row[0]))
        for i, row in enumerate(correct)
    ]
    return EvalResult(records=records, n=4, temperature=1.0, top_p=1.0, max_new_tokens=8, seed=0,
                      ks=[1, 2, 4], env_id="rllib_dph/SQL-v0", env_config={"data": data})


def test_results_carry_intervals_and_the_plot_refuses_two_data_sets(tmp_path):
    result = _result("sql_synth/test", [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]])
    intervals = result.intervals()
    assert set(intervals) == {"greedy_accuracy", "pass@1", "pass@2", "pass@4"}
    low, high = intervals["pass@1"]
    assert low <= result.summary()["pass@1"] <= high
    assert plot_pass_at_k([result], tmp_path / "one.png").is_file()
    with pytest.raises(ValueError, match="2 data sets"):
        plot_pass_at_k([result, _result("sql_synth/test_cross", [[1, 0, 0, 0]])], tmp_path / "two.png")


# ------------------------------------------------------------ seed-level and cluster statistics
def test_welch_interval_by_hand():
    from scipy.stats import t as student_t

    from rllib_dph.evaluation.intervals import welch_interval

    a = np.array([[0.5, 0.7], [0.6, 0.8], [0.7, 0.9]])  # seed means 0.6, 0.7, 0.8
    b = np.array([[0.2, 0.4], [0.4, 0.4], [0.3, 0.3]])  # seed means 0.3, 0.4, 0.3
    va, vb = np.var([0.6, 0.7, 0.8], ddof=1) / 3, np.var([0.3, 0.4, 0.3], ddof=1) / 3
    dof = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    half = student_t.ppf(0.975, dof) * math.sqrt(va + vb)
    diff = 0.7 - 1 / 3
    assert welch_interval(a, b) == pytest.approx((diff - half, diff + half))
    assert welch_interval(np.ones((2, 3)), np.zeros((3, 3))) == (1.0, 1.0)
    with pytest.raises(ValueError, match="at least 2"):
        welch_interval(np.ones(3), np.zeros((3, 3)))


def test_welch_interval_covers_about_95_percent_with_three_seeds():
    from rllib_dph.evaluation.intervals import welch_interval

    rng = np.random.default_rng(0)
    covered = sum(
        low <= 0.1 <= high
        for low, high in (welch_interval(rng.normal(0.6, 0.05, (3, 1)), rng.normal(0.5, 0.05, (3, 1))) for _ in range(400))
    )
    assert 0.91 <= covered / 400 <= 0.99


def test_permutation_p_value_is_exact():
    from rllib_dph.evaluation.intervals import permutation_p_value

    high, low = np.array([[0.9], [0.8], [0.85]]), np.array([[0.1], [0.2], [0.15]])
    assert permutation_p_value(high, low) == pytest.approx(2 / 20)  # the smallest p of 3 seeds a side
    assert permutation_p_value(high, high) == 1.0
    assert permutation_p_value(np.array([[1.0], [0.0]]), np.array([[0.0], [1.0]])) == 1.0


def test_cluster_interval_is_wider_than_the_prompt_interval_when_clusters_move_together():
    from rllib_dph.evaluation.intervals import cluster_paired_difference_interval

    rng = np.random.default_rng(3)
    clusters = np.repeat(np.arange(20), 10)  # 20 clusters of 10 prompts
    effect = rng.normal(0.1, 0.3, 20)[clusters]  # one shared difference per cluster
    values, baseline = 0.5 + effect + rng.normal(0, 0.01, 200), np.full(200, 0.5)
    prompt_low, prompt_high = paired_difference_interval(values, baseline)
    low, high = cluster_paired_difference_interval(values, baseline, clusters)
    assert low < values.mean() - 0.5 < high
    assert (high - low) > 2.5 * (prompt_high - prompt_low)
    # One prompt per cluster: the prompt bootstrap, redrawn the same way.
    singles = cluster_paired_difference_interval(values, baseline, np.arange(200))
    assert singles == pytest.approx((prompt_low, prompt_high), abs=0.02)
    with pytest.raises(ValueError, match="one label per prompt"):
        cluster_paired_difference_interval(values, baseline, clusters[:10])


def test_cluster_entropy_interval_widens_with_clusters_and_matches_the_prompt_interval_with_singletons():
    from rllib_dph.evaluation import style_entropy
    from rllib_dph.evaluation.intervals import (
        cluster_paired_entropy_difference_interval,
        paired_entropy_difference_interval,
    )

    rng = np.random.default_rng(4)
    styles = ["a", "b"]
    clusters = np.repeat(np.arange(20), 10)  # 20 clusters of 10 prompts; a cluster writes one style or mixes
    share_a = rng.choice([0.05, 0.5, 0.95], 20)[clusters]  # (P,)
    policy = np.stack([rng.binomial(8, share_a), np.zeros(200)], axis=-1)
    policy[:, 1] = 8 - policy[:, 0]  # (P, K)
    baseline = np.stack([np.full(200, 4.0), np.full(200, 4.0)], axis=-1)  # 1 bit on every prompt
    diff = style_entropy(dict(zip(styles, policy.sum(0)))) - 1.0
    prompt_low, prompt_high = paired_entropy_difference_interval(policy, baseline, style_entropy, styles)
    low, high = cluster_paired_entropy_difference_interval(policy, baseline, clusters, style_entropy, styles)
    assert low <= diff <= high
    assert (high - low) > 2 * (prompt_high - prompt_low)
    singles = cluster_paired_entropy_difference_interval(policy, baseline, np.arange(200), style_entropy, styles)
    assert singles == pytest.approx((prompt_low, prompt_high), abs=0.01)
    with pytest.raises(ValueError, match="one label per prompt"):
        cluster_paired_entropy_difference_interval(policy, baseline, clusters[:10], style_entropy, styles)
