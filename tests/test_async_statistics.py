"""The asynchronous corrections' endpoint against its synchronous control, seed by seed
(research/trust_region.py ``--control``): the paired t interval and its reading rule, the
seed-level checks beside it, and the bootstraps over prompts and schema clusters."""

import math

import numpy as np
import pytest


@pytest.fixture(scope="module")
def trust_region(load_script):
    load_script("research/reproduce_dph")  # schema_cluster, imported by control_statistics
    return load_script("research/trust_region")


def test_paired_t_interval_by_hand():
    from scipy.stats import t as student_t

    from rllib_dph.evaluation.intervals import paired_t_interval

    a = np.array([[0.50], [0.40], [0.45]])
    b = np.array([[0.46], [0.53], [0.45]])
    diffs = np.array([0.04, -0.13, 0.0])
    half = student_t.ppf(0.975, 2) * diffs.std(ddof=1) / math.sqrt(3)
    assert paired_t_interval(a, b) == pytest.approx((diffs.mean() - half, diffs.mean() + half))
    assert paired_t_interval(np.full((3, 2), 0.6), np.full((3, 2), 0.5)) == pytest.approx((0.1, 0.1))
    with pytest.raises(ValueError, match="the same seeds"):
        paired_t_interval(np.ones((3, 1)), np.ones((2, 1)))


@pytest.mark.parametrize("low, high, expected", [
    (-0.20, -0.01, "degrades"),
    (-0.04, +0.06, "keeps learning"),
    (-0.06, +0.06, "cannot tell"),
    (+0.01, +0.10, "cannot tell"),  # above the control is no reading of this rule
])
def test_reading_rule(trust_region, low, high, expected):
    assert trust_region.verdict(low, high) == expected


def _runs(values_by_seed, task_ids):
    return [{"validation": {"pass@1": float(np.mean(v))},
             "validation_prompts": {"task_ids": task_ids, "pass@1": list(v)}} for v in values_by_seed]


def test_control_statistics_pairs_seeds_and_clusters_the_prompts(trust_region):
    from rllib_dph.envs.suites import load_split

    ids = [t.id for t in load_split("sql_synth/test")[:40]]
    rng = np.random.default_rng(0)
    control = rng.uniform(0.3, 0.7, (3, 40))
    worse = np.clip(control - 0.3, 0, 1)  # every prompt 0.3 lower, seed by seed
    table, numbers = trust_region.control_statistics({"worse": _runs(worse, ids), "same": _runs(control, ids)},
                                                     _runs(control, ids))
    w, s = numbers["worse"], numbers["same"]
    assert w["seeds"] == pytest.approx(worse.mean(axis=1).tolist())
    assert w["mean"] < -0.2 and w["paired_t"][1] < 0 and w["verdict"] == "degrades"
    assert w["bootstrap"][1] < 0 and w["cluster_bootstrap"][1] < 0 and 1 < w["clusters"] < 40
    assert s["paired_t"] == pytest.approx([0.0, 0.0]) and s["verdict"] == "keeps learning"
    assert s["permutation_p"] == 1.0
    assert "| worse |" in table and "clusters" in table


def test_control_statistics_without_prompt_records_and_its_errors(trust_region):
    seeds = [{"validation": {"pass@1": v}} for v in (0.4, 0.5, 0.45)]
    table, numbers = trust_region.control_statistics({"none": seeds}, seeds)
    assert "bootstrap" not in numbers["none"] and "clusters" not in table
    with pytest.raises(ValueError, match="2 seeds against the control's 3"):
        trust_region.control_statistics({"none": seeds[:2]}, seeds)
    with pytest.raises(ValueError, match="no validation"):
        trust_region.control_statistics({"none": [{"reward": [0.1]}] * 3}, seeds)
