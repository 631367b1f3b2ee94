"""95 % bootstrap intervals for evaluation metrics, over prompts and (when there are several) seeds.

A metric of an evaluation is a function of its prompts (and of its training seeds, for a method
trained several times). The percentile bootstrap redraws the prompts with replacement (and the
seeds, independently), recomputes the metric on every redraw, and reports the 2.5 % and 97.5 %
quantiles (Efron & Tibshirani, 1993, ch. 13). Differences between two policies evaluated on the
same prompts are *paired*: one redraw of prompt indices serves both, so the variation the two
share (which prompts are easy) cancels (keep / exploration rates, pass@k of a method minus the
base model's).

Two checks of a difference between methods trained on several seeds go beside the bootstrap:
the seed as the unit (:func:`welch_interval`, :func:`paired_t_interval`,
:func:`permutation_p_value`: how far a rerun with new seeds may move), and clusters of related
prompts as the unit
(:func:`cluster_paired_difference_interval`: prompts on one table and column are no independent
draws).

Every function takes per-prompt values as arrays: (S, P) for S seeds × P prompts, or (P,) for one.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Callable, Optional, Sequence

import numpy as np

#: Coverage of the reported intervals.
LEVEL = 0.95
#: Bootstrap redraws per interval.
NUM_BOOTSTRAP = 1000

#: A statistic of redrawn data: (prompt indices (P,), seed indices (S,)) -> float (NaN allowed).
Statistic = Callable[[np.ndarray, np.ndarray], float]


def bootstrap_interval(
    statistic: Statistic,
    num_prompts: int,
    num_seeds: int = 1,
    *,
    num_boot: int = NUM_BOOTSTRAP,
    level: float = LEVEL,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic`` over prompts (and seeds).

    Each redraw takes ``num_prompts`` prompt indices and ``num_seeds`` seed indices with
    replacement (a two-stage bootstrap when there are several seeds); redraws where the
    statistic is undefined (NaN, e.g. a keep rate with no base-solved prompt drawn) are left out.

    Args:
        statistic: ``(prompts (P,), seeds (S,)) -> float`` computed on the redrawn indices.
        num_prompts: P >= 1.
        num_seeds: S >= 1.
        num_boot: Redraws, >= 1.
        level: Coverage in (0, 1).
        seed: Seed of the redraws (the same seed gives the same interval).

    Returns:
        ``(low, high)``; ``(nan, nan)`` when every redraw was undefined.
    """
    prompts, seeds = _redraws(num_prompts, num_seeds, num_boot, level, seed)  # (B, P), (B, S)
    return _percentiles(np.array([statistic(p, s) for p, s in zip(prompts, seeds)]), level)


@functools.lru_cache(maxsize=8)
def _redraws(num_prompts: int, num_seeds: int, num_boot: int, level: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The redrawn indices of :func:`bootstrap_interval`: (num_boot, P) prompts and (num_boot, S)
    seeds, drawn redraw by redraw (prompts, then seeds) from ``default_rng(seed)``. Every interval
    of an evaluation redraws the same indices, so they are drawn once (cached, read-only)."""
    if num_prompts < 1 or num_seeds < 1 or num_boot < 1 or not 0 < level < 1:
        raise ValueError(
            f"bootstrap_interval: num_prompts={num_prompts}, num_seeds={num_seeds} and num_boot="
            f"{num_boot} must be >= 1 and level={level} in (0, 1)."
        )
    rng = np.random.default_rng(seed)
    draws = [
        (rng.integers(0, num_prompts, num_prompts), rng.integers(0, num_seeds, num_seeds)) for _ in range(num_boot)
    ]
    prompts, seeds = np.stack([p for p, _ in draws]), np.stack([s for _, s in draws])
    prompts.flags.writeable = seeds.flags.writeable = False
    return prompts, seeds


@functools.lru_cache(maxsize=8)
def _baseline_seed_redraws(num_seeds: int, num_boot: int, seed: int) -> np.ndarray:
    """(num_boot, S_b) redrawn seed indices of a paired difference's baseline, one redraw after
    another from their own ``default_rng(seed)``, independent of the policy's (cached, read-only)."""
    rng = np.random.default_rng(seed)
    seeds = np.stack([rng.integers(0, num_seeds, num_seeds) for _ in range(num_boot)])
    seeds.flags.writeable = False
    return seeds


def _percentiles(values: np.ndarray, level: float) -> tuple[float, float]:
    """The (1 − level)/2 and (1 + level)/2 quantiles of the finite ``values`` (num_boot,); NaNs if none."""
    values = values[np.isfinite(values)]
    if values.size == 0:
        return (math.nan, math.nan)
    low, high = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return (float(low), float(high))


def _batched_means(values: np.ndarray, prompts: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """(B,) means of ``values`` (S, P) over redrawn seeds (B, S') and prompts (B, P') at once."""
    return values[seeds[:, :, None], prompts[:, None, :]].mean(axis=(1, 2))


def _seeds_by_prompts(values: Sequence) -> np.ndarray:
    """(S, P) float array of per-prompt values; a (P,) input is one seed."""
    array = np.asarray(values, dtype=float)
    return array[None] if array.ndim == 1 else array


def mean_interval(values: Sequence, **kwargs) -> tuple[float, float]:
    """Interval of the mean over seeds and prompts of per-prompt values (pass@k, greedy 0/1, ...).

    Args:
        values: (S, P) or (P,) per-prompt values.
        **kwargs: ``num_boot``, ``level``, ``seed`` of :func:`bootstrap_interval`.
    """
    v = _seeds_by_prompts(values)  # (S, P)
    return _vectorised_interval(lambda p, s: _batched_means(v, p, s), v.shape[1], v.shape[0], **kwargs)


def _vectorised_interval(
    batched: Callable[[np.ndarray, np.ndarray], np.ndarray], num_prompts: int, num_seeds: int, *,
    num_boot: int = NUM_BOOTSTRAP, level: float = LEVEL, seed: int = 0,
) -> tuple[float, float]:
    """:func:`bootstrap_interval` of a statistic computed for all redraws at once: ``batched``
    maps the redrawn prompts (B, P) and seeds (B, S) to the (B,) values. The same redraws, so
    the same interval as the one-redraw-at-a-time statistic, at a fraction of the cost."""
    prompts, seeds = _redraws(num_prompts, num_seeds, num_boot, level, seed)
    return _percentiles(batched(prompts, seeds), level)


def paired_difference_interval(values: Sequence, baseline: Sequence, **kwargs) -> tuple[float, float]:
    """Interval of mean(values) − mean(baseline) on the same prompts (paired over prompts).

    Args:
        values: (S, P) or (P,) per-prompt values of the policy (S seeds).
        baseline: (S_b, P) or (P,) per-prompt values of the baseline on the same P prompts in the
            same order; its seeds are redrawn independently of ``values``' seeds.
        **kwargs: ``num_boot``, ``level``, ``seed`` of :func:`bootstrap_interval`.
    """
    v, b = _seeds_by_prompts(values), _seeds_by_prompts(baseline)  # (S, P), (S_b, P)
    if v.shape[1] != b.shape[1]:
        raise ValueError(f"paired_difference_interval: {v.shape[1]} prompts vs {b.shape[1]} in the baseline.")

    def diff(p, s):  # (B, P), (B, S) -> (B,)
        seeds_b = _baseline_seed_redraws(b.shape[0], len(p), kwargs.get("seed", 0) + 1)  # (B, S_b)
        return _batched_means(v, p, s) - _batched_means(b, p, seeds_b)

    return _vectorised_interval(diff, v.shape[1], v.shape[0], **kwargs)


def keep_exploration_intervals(
    base_pass: Sequence, new_pass: Sequence, **kwargs
) -> tuple[tuple[float, float], tuple[float, float]]:
    """Intervals of the keep and exploration rates (``metrics.keep_and_exploration_rates``).

    Args:
        base_pass: (P,) or (S_b, P) base pass@k per prompt (seeds averaged per prompt first).
        new_pass: (S, P) or (P,) pass@k of the trained policy on the same prompts.
        **kwargs: ``num_boot``, ``level``, ``seed`` of :func:`bootstrap_interval`.

    Returns:
        ``((keep_low, keep_high), (exploration_low, exploration_high))``.
    """
    b = _seeds_by_prompts(base_pass).mean(axis=0)  # (P,)
    v = _seeds_by_prompts(new_pass)  # (S, P)

    def rate(weights: np.ndarray) -> Statistic:
        def statistic(p, s):
            w = weights[p]  # (P,)
            total = w.sum()
            return float((w * v[np.ix_(s, p)].mean(axis=0)).sum() / total) if total > 0 else math.nan

        return statistic

    keep = bootstrap_interval(rate(b), v.shape[1], v.shape[0], **kwargs)
    exploration = bootstrap_interval(rate(1 - b), v.shape[1], v.shape[0], **kwargs)
    return keep, exploration


def entropy_interval(
    style_counts: Sequence, entropy: Callable[[dict], float], styles: Sequence[str], **kwargs
) -> tuple[float, float]:
    """Interval of the style entropy of pooled per-prompt style counts.

    Args:
        style_counts: (S, P, K) or (P, K) counts of each of the K ``styles`` per prompt.
        entropy: ``metrics.style_entropy`` (a function of a ``{style: count}`` dict).
        styles: The K style names, in the order of the last axis.
        **kwargs: ``num_boot``, ``level``, ``seed`` of :func:`bootstrap_interval`.
    """
    counts = np.asarray(style_counts, dtype=float)
    counts = counts[None] if counts.ndim == 2 else counts  # (S, P, K)

    def statistic(p, s):
        pooled = counts[np.ix_(s, p)].sum(axis=(0, 1))  # (K,)
        return entropy(dict(zip(styles, pooled)))

    return bootstrap_interval(statistic, counts.shape[1], counts.shape[0], **kwargs)


def paired_entropy_difference_interval(
    style_counts: Sequence, baseline_counts: Sequence, entropy: Callable[[dict], float], styles: Sequence[str],
    **kwargs,
) -> tuple[float, float]:
    """Interval of entropy(pooled styles) − entropy(pooled baseline styles), paired over prompts.

    Args:
        style_counts: (S, P, K) or (P, K) counts of the K ``styles`` per prompt of the policy.
        baseline_counts: (S_b, P, K) or (P, K) counts of the baseline on the same P prompts; its
            seeds are redrawn independently.
        entropy: ``metrics.style_entropy``.
        styles: The K style names, in the order of the last axis.
        **kwargs: ``num_boot``, ``level``, ``seed`` of :func:`bootstrap_interval`.
    """
    v, b = (np.asarray(c, dtype=float) for c in (style_counts, baseline_counts))
    v, b = (c[None] if c.ndim == 2 else c for c in (v, b))  # (S, P, K), (S_b, P, K)
    if v.shape[1:] != b.shape[1:]:
        raise ValueError(f"paired_entropy_difference_interval: shapes {v.shape} and {b.shape} differ in P or K.")
    rng = np.random.default_rng(kwargs.get("seed", 0) + 1)  # the baseline's seed redraws

    def diff(p, s):
        seeds_b = rng.integers(0, b.shape[0], b.shape[0])
        pooled, pooled_b = v[np.ix_(s, p)].sum(axis=(0, 1)), b[np.ix_(seeds_b, p)].sum(axis=(0, 1))
        return entropy(dict(zip(styles, pooled))) - entropy(dict(zip(styles, pooled_b)))

    return bootstrap_interval(diff, v.shape[1], v.shape[0], **kwargs)


def format_interval(
    value: Optional[float], interval: Optional[tuple[float, float]], scale: float = 1.0, digits: int = 1
) -> str:
    """``"62.0 [48.0, 74.0]"``: a value and its interval, scaled (100 for %); ``"—"`` for None/NaN."""
    if value is None or not math.isfinite(value):
        return "—"
    text = f"{scale * value:.{digits}f}"
    if interval is not None and all(math.isfinite(x) for x in interval):
        text += f" [{scale * interval[0]:.{digits}f}, {scale * interval[1]:.{digits}f}]"
    return text


# ---------------------------------------------------------------- seed-level and cluster statistics
def seed_means(values: Sequence) -> np.ndarray:
    """(S,) per-seed means over prompts of (S, P) or (P,) per-prompt values."""
    return _seeds_by_prompts(values).mean(axis=1)


def welch_interval(values: Sequence, baseline: Sequence, *, level: float = LEVEL) -> tuple[float, float]:
    """Welch's t interval of mean(values) − mean(baseline) with the seed as the unit.

    Each side is reduced to its per-seed means over prompts (:func:`seed_means`), which are
    taken as independent draws of a run's outcome; the interval is
    d ± t_{(1+level)/2, ν} · √(s_a²/S_a + s_b²/S_b), ν the Welch-Satterthwaite degrees of
    freedom (Welch, 1947). It counts the seeds only, not the prompts: with 3 seeds a side it is
    wide, and it is the interval that says how much a rerun with new seeds may move.

    Args:
        values: (S_a, P) per-prompt values of the policy, S_a >= 2 seeds.
        baseline: (S_b, P) per-prompt values of the baseline, S_b >= 2 seeds.
        level: Coverage in (0, 1).

    Returns:
        ``(low, high)``; ``(d, d)`` when both sides' seeds agree exactly.

    Raises:
        ValueError: A side has fewer than 2 seeds (no variance to estimate).
    """
    from scipy.stats import t as student_t

    a, b = seed_means(values), seed_means(baseline)
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"welch_interval: {len(a)} and {len(b)} seeds; each side needs at least 2 (its variance).")
    diff = float(a.mean() - b.mean())
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    if va + vb == 0:
        return (diff, diff)
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = float(student_t.ppf((1 + level) / 2, dof) * math.sqrt(va + vb))
    return (diff - half, diff + half)


def paired_t_interval(values: Sequence, baseline: Sequence, *, level: float = LEVEL) -> tuple[float, float]:
    """The t interval of the mean per-seed difference, seed s of the policy against seed s of the
    baseline (both trained with seed s).

    Each side is reduced to its per-seed means over prompts (:func:`seed_means`);
    d_s = a_s − b_s, and the interval is d̄ ± t_{(1+level)/2, S−1} · s_d / √S (Student's paired t).
    Like :func:`welch_interval` it counts the seeds only; pairing removes what seed s does to
    both sides alike (the same prompts drawn for training, say).

    Args:
        values: (S, P) per-prompt values of the policy, S >= 2 seeds.
        baseline: (S, P) per-prompt values of the baseline, seed s beside seed s.
        level: Coverage in (0, 1).

    Returns:
        ``(low, high)``; ``(d̄, d̄)`` when every seed's difference is the same.

    Raises:
        ValueError: The sides have different numbers of seeds, or fewer than 2.
    """
    from scipy.stats import t as student_t

    a, b = seed_means(values), seed_means(baseline)
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"paired_t_interval: {len(a)} and {len(b)} seeds; the sides need the same seeds, "
                         "at least 2 (the variance of their differences).")
    diff = a - b  # (S,)
    half = float(student_t.ppf((1 + level) / 2, len(diff) - 1) * diff.std(ddof=1) / math.sqrt(len(diff)))
    return (float(diff.mean()) - half, float(diff.mean()) + half)


def permutation_p_value(values: Sequence, baseline: Sequence) -> float:
    """Exact two-sided permutation test of equal means, the seed as the unit.

    Every way of labelling S_a of the S_a + S_b per-seed means (:func:`seed_means`) as the
    policy's is one equally likely outcome under the null hypothesis that the method does not
    matter; the p-value is the share of labellings whose |mean difference| is at least the
    observed one (the observed labelling included). Its smallest possible value is
    2 / C(S_a + S_b, S_a) for a balanced design: 0.1 with 3 seeds a side, so 3 seeds can never
    reach p < 0.05 with this test.
    """
    a, b = seed_means(values), seed_means(baseline)
    pooled = np.concatenate([a, b])
    observed = abs(a.mean() - b.mean())
    count = total = 0
    for chosen in itertools.combinations(range(len(pooled)), len(a)):
        mask = np.zeros(len(pooled), dtype=bool)
        mask[list(chosen)] = True
        total += 1
        count += abs(pooled[mask].mean() - pooled[~mask].mean()) >= observed - 1e-12
    return count / total


def cluster_paired_difference_interval(
    values: Sequence, baseline: Sequence, clusters: Sequence, *, num_boot: int = NUM_BOOTSTRAP,
    level: float = LEVEL, seed: int = 0,
) -> tuple[float, float]:
    """:func:`paired_difference_interval` with clusters of prompts as the unit: each redraw
    takes as many clusters as there are, with replacement, and with each cluster all of its
    prompts (both sides alike), and the seeds of each side independently. Prompts that share a
    cluster (questions on one table and column, say) are not independent draws; this interval
    counts them as the one draw they are (Cameron & Miller, 2015, on cluster-robust inference).

    Args:
        values: (S, P) or (P,) per-prompt values of the policy.
        baseline: (S_b, P) or (P,) per-prompt values of the baseline on the same prompts.
        clusters: (P,) the cluster of each prompt (any hashable labels).
        num_boot, level, seed: As for :func:`bootstrap_interval`.
    """
    v, b = _seeds_by_prompts(values), _seeds_by_prompts(baseline)  # (S, P), (S_b, P)
    weights, seeds_v, seeds_b = _cluster_redraws("cluster_paired_difference_interval", clusters, v.shape[:2],
                                                 b.shape[:2], num_boot, seed)
    mean_v = (v[seeds_v].mean(axis=1) * weights).sum(axis=1) / weights.sum(axis=1)  # (B,)
    mean_b = (b[seeds_b].mean(axis=1) * weights).sum(axis=1) / weights.sum(axis=1)
    return _percentiles(mean_v - mean_b, level)


def cluster_paired_entropy_difference_interval(
    style_counts: Sequence, baseline_counts: Sequence, clusters: Sequence, entropy: Callable[[dict], float],
    styles: Sequence[str], *, num_boot: int = NUM_BOOTSTRAP, level: float = LEVEL, seed: int = 0,
) -> tuple[float, float]:
    """:func:`paired_entropy_difference_interval` with clusters of prompts as the unit, redrawn as
    in :func:`cluster_paired_difference_interval`: each redraw pools the style counts of the
    drawn clusters' prompts (each as often as its cluster was drawn) over each side's redrawn seeds.

    Args:
        style_counts: (S, P, K) or (P, K) counts of the K ``styles`` per prompt of the policy.
        baseline_counts: (S_b, P, K) or (P, K) counts of the baseline on the same P prompts.
        clusters: (P,) the cluster of each prompt (any hashable labels).
        entropy: ``metrics.style_entropy``.
        styles: The K style names, in the order of the last axis.
        num_boot, level, seed: As for :func:`bootstrap_interval`.
    """
    v, b = (np.asarray(c, dtype=float) for c in (style_counts, baseline_counts))
    v, b = (c[None] if c.ndim == 2 else c for c in (v, b))  # (S, P, K), (S_b, P, K)
    if v.shape[2] != b.shape[2]:
        raise ValueError(f"cluster_paired_entropy_difference_interval: {v.shape[2]} styles vs {b.shape[2]} in the baseline.")
    weights, seeds_v, seeds_b = _cluster_redraws("cluster_paired_entropy_difference_interval", clusters,
                                                 v.shape[:2], b.shape[:2], num_boot, seed)
    pooled_v = np.einsum("bspk,bp->bk", v[seeds_v], weights)  # (B, K)
    pooled_b = np.einsum("bspk,bp->bk", b[seeds_b], weights)
    diffs = np.array([entropy(dict(zip(styles, x))) - entropy(dict(zip(styles, y))) for x, y in zip(pooled_v, pooled_b)])
    return _percentiles(diffs, level)


def _cluster_redraws(caller: str, clusters: Sequence, shape: tuple[int, int], baseline_shape: tuple[int, int],
                     num_boot: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The redraws of a cluster bootstrap over (S, P) policy and (S_b, P) baseline values: (B, P)
    weights (each prompt as often as its cluster was drawn), (B, S) and (B, S_b) seed indices."""
    (num_seeds, num_prompts), (num_seeds_b, num_prompts_b) = shape, baseline_shape
    if not num_prompts == num_prompts_b == len(clusters):
        raise ValueError(f"{caller}: {num_prompts} prompts, {num_prompts_b} in the baseline and {len(clusters)} "
                         "cluster labels; give one label per prompt, in the prompts' order.")
    _, cluster_of = np.unique(np.asarray([repr(c) for c in clusters]), return_inverse=True)  # (P,)
    num_clusters = int(cluster_of.max()) + 1
    rng = np.random.default_rng(seed)
    drawn = rng.integers(0, num_clusters, (num_boot, num_clusters))  # (B, C)
    counts = np.stack([np.bincount(row, minlength=num_clusters) for row in drawn])  # (B, C)
    weights = counts[:, cluster_of].astype(float)  # (B, P)
    seeds_v = rng.integers(0, num_seeds, (num_boot, num_seeds))  # (B, S)
    seeds_b = rng.integers(0, num_seeds_b, (num_boot, num_seeds_b))  # (B, S_b)
    return weights, seeds_v, seeds_b
