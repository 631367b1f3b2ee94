"""Pure metrics of per-prompt outcomes: pass@k, mean@k, maj@k, keep and exploration rates
(DPH-RL paper §6.1), the entropy of solution styles, pass@k per solution style and the number of
distinct correct solutions. No I/O, no models, no envs."""

from __future__ import annotations

import math
from collections import Counter
from typing import Mapping, Optional, Sequence

#: The style ``rllib_dph.envs.suites.style_of`` gives a completion without an answer block; not a solution style.
NO_ANSWER_STYLE = "none"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of pass@k for one prompt (Chen et al. 2021).

    pass@k = 1 − C(n−c, k) / C(n, k): the probability that a random subset of k of the n samples
    holds at least one correct one. Computed in the numerically stable product form
    1 − ∏_{i=n−c+1}^{n} (1 − k / i), which is 1 exactly when n − c < k.

    Args:
        n: Samples drawn for the prompt, >= 1.
        c: Correct samples among them, 0 <= c <= n.
        k: Subset size, 1 <= k <= n.
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c={c} correct of n={n} samples; c must be in [0, n].")
    if not 1 <= k <= n:
        raise ValueError(
            f"pass_at_k: k={k} with n={n} samples; k must be in [1, n]. Draw more samples "
            "(larger n) or ask for a smaller k."
        )
    if n - c < k:
        return 1.0
    fail = 1.0
    for i in range(n - c + 1, n + 1):
        fail *= 1.0 - k / i
    return 1.0 - fail


def mean_pass_at_k(num_samples: Sequence[int], num_correct: Sequence[int], k: int) -> float:
    """pass@k of a data set: the mean over prompts of :func:`pass_at_k` (n_i, c_i, k).

    Args:
        num_samples: n_i, samples drawn per prompt.
        num_correct: c_i, correct samples per prompt.
        k: Subset size, 1 <= k <= min n_i.
    """
    _check_same_length(num_samples, num_correct, "num_samples", "num_correct")
    return mean_over_prompts([pass_at_k(n, c, k) for n, c in zip(num_samples, num_correct)])


def mean_at_k(correct: Sequence[Sequence[bool]], k: int) -> float:
    """mean@k: the expected accuracy of a run that draws k samples per prompt.

    The n samples of a prompt are cut into m = ⌊n/k⌋ disjoint blocks of k consecutive samples
    (left-over samples are unused); mean@k = mean over prompts of (correct samples in the m
    blocks) / (m·k). Its expectation is the per-sample accuracy for every k, so values at
    different k differ only by noise; mean@n, which uses every sample, is the most precise.

    Args:
        correct: Per prompt, whether each sample is correct (each with at least k samples).
        k: Block size, >= 1.
    """
    per_prompt = []
    for i, flags in enumerate(correct):
        blocks = _blocks(flags, k, i)
        per_prompt.append(sum(sum(b) for b in blocks) / (len(blocks) * k))
    return mean_over_prompts(per_prompt)


def majority_vote(answers: Sequence[Optional[str]], correct: Sequence[bool]) -> float:
    """Whether a majority vote over one group of samples picks a correct answer (0 to 1).

    Samples with answer None (no answer found) do not vote. The most frequent answer wins; a tie
    between t answers counts as a uniformly random pick among them, so the score is the mean,
    over the tied answers, of the share of their samples that are correct (an answer's samples
    normally agree on correctness). No vote at all scores 0.

    Args:
        answers: Answer key of each sample (equal keys are the same answer), or None.
        correct: Whether each sample is correct.
    """
    _check_same_length(answers, correct, "answers", "correct")
    groups: dict[str, list[bool]] = {}
    for answer, ok in zip(answers, correct):
        if answer is not None:
            groups.setdefault(answer, []).append(bool(ok))
    if not groups:
        return 0.0
    top = max(len(flags) for flags in groups.values())
    tied = [flags for flags in groups.values() if len(flags) == top]
    return sum(sum(flags) / len(flags) for flags in tied) / len(tied)


def maj_at_k(
    answers: Sequence[Sequence[Optional[str]]], correct: Sequence[Sequence[bool]], k: int
) -> float:
    """maj@k: accuracy of the majority vote over k samples (self-consistency).

    Each prompt's n samples are cut into m = ⌊n/k⌋ disjoint blocks of k consecutive samples; the
    prompt scores the mean over its blocks of :func:`majority_vote`, and maj@k is the mean over
    prompts. maj@1 is the accuracy of samples that have an answer.

    Args:
        answers: Per prompt, the answer key of each sample (None when it has no answer).
        correct: Per prompt, whether each sample is correct.
        k: Voters per block, >= 1.
    """
    _check_same_length(answers, correct, "answers", "correct")
    per_prompt = []
    for i, (keys, flags) in enumerate(zip(answers, correct)):
        blocks = zip(_blocks(keys, k, i), _blocks(flags, k, i))
        per_prompt.append(mean_over_prompts([majority_vote(a, c) for a, c in blocks]))
    return mean_over_prompts(per_prompt)


def keep_and_exploration_rates(
    base_pass: Sequence[float], new_pass: Sequence[float]
) -> tuple[float, float]:
    """Keep rate and exploration rate of a trained policy against its base (DPH-RL §6.1).

    With b_i and p_i the pass@k of prompt i under the base and the new policy (probabilities of
    solving it with k samples, e.g. from :func:`pass_at_k`):

        keep        = Σ b_i p_i / Σ b_i                (base solved it; still solved)
        exploration = Σ (1 − b_i) p_i / Σ (1 − b_i)    (base failed it; now solved)

    These are the expected shares when both policies draw k fresh samples per prompt; with
    k = n every b_i, p_i is 0 or 1 and they are the paper's plain counts (share of D_sub^correct
    still solved, share of D_sub^wrong now solved). NaN when the denominator is 0 (the base
    solved every prompt, or none).

    Args:
        base_pass: b_i in [0, 1], per prompt.
        new_pass: p_i in [0, 1], for the same prompts in the same order.

    Returns:
        ``(keep_rate, exploration_rate)``.
    """
    _check_same_length(base_pass, new_pass, "base_pass", "new_pass")
    solved = sum(base_pass)
    failed = len(base_pass) - solved
    kept = sum(b * p for b, p in zip(base_pass, new_pass))
    explored = sum((1 - b) * p for b, p in zip(base_pass, new_pass))
    return (kept / solved if solved > 0 else math.nan, explored / failed if failed > 0 else math.nan)


def style_entropy(counts: Mapping[str, int]) -> float:
    """Entropy in bits of the distribution of solution styles.

    H = −Σ_s q_s log2 q_s with q_s = counts[s] / Σ counts over the styles s of completions that
    have an answer; ``"none"`` (no answer block) is left out, ``"other"`` (an answer in no known
    style) counts as a style. 0 for a single style (or none); log2(S) for S equally used styles.

    Args:
        counts: Number of completions per style name (as from ``rllib_dph.envs.suites.style_of``).
    """
    used = [c for style, c in counts.items() if style != NO_ANSWER_STYLE and c > 0]
    total = sum(used)
    return -sum(c / total * math.log2(c / total) for c in used) if total else 0.0


def style_pass_at_k(styles: Sequence[str], correct: Sequence[bool], style: str, k: int) -> float:
    """pass@k of one solution style for one prompt: the chance that k of its n samples hold a
    correct sample of that style ("which styles a policy still produces correctly").

    The unbiased estimator of Chen et al. (2021) with c_s, the samples that are correct *and* of
    style s, in place of c:

        pass@k_s = 1 − C(n − c_s, k) / C(n, k)

    DPH-RL (Appendix B, Figure 4) draws per-style bars of how often each style is sampled; this
    scores each style by its correct samples. Every pass@k_s <= pass@k <= Σ_s pass@k_s.

    Args:
        styles: Style name of each of the n samples; empty when the env names no style for the
            prompt (then c_s = 0).
        correct: Whether each sample is correct (n entries, n >= k).
        style: The style s.
        k: Subset size, 1 <= k <= n.
    """
    if styles:
        _check_same_length(styles, correct, "styles", "correct")
    c_s = sum(1 for name, ok in zip(styles, correct) if ok and name == style)
    return pass_at_k(len(correct), c_s, k)


def distinct_correct_at_k(solutions: Sequence[Optional[str]], correct: Sequence[bool], k: int) -> float:
    """Expected number of distinct correct solutions among k of a prompt's n samples.

    With m_u the number of correct samples whose solution key is u (samples without a key are
    not counted):

        D@k = Σ_u [1 − C(n − m_u, k) / C(n, k)]

    Each term is the unbiased pass@k estimator (Chen et al. 2021) of "a sample is solution u", so
    D@k is unbiased for the expected number of distinct correct solutions in k fresh samples.
    D@n is the plain count of distinct correct solutions among the n samples; D@1 is the
    per-sample accuracy of samples with a key.

    Args:
        solutions: Solution key of each of the n samples (equal keys: the same solution), or
            None (e.g. ``rllib_dph.envs.base.VerifierEnv.solution_key``).
        correct: Whether each sample is correct.
        k: Subset size, 1 <= k <= n.
    """
    _check_same_length(solutions, correct, "solutions", "correct")
    if not 1 <= k <= len(correct):
        raise ValueError(
            f"distinct_correct_at_k: k={k} with n={len(correct)} samples; k must be in [1, n]. Draw "
            "more samples (larger n) or ask for a smaller k."
        )
    counts = Counter(key for key, ok in zip(solutions, correct) if ok and key is not None)
    multiplicities = Counter(counts.values())  # m -> number of solutions seen m times
    return sum(num * pass_at_k(len(correct), m, k) for m, num in multiplicities.items())


def default_ks(n: int) -> list[int]:
    """The k of pass@k reported by default: 1, 2, 4, ... up to n, and n itself."""
    if n < 1:
        raise ValueError(f"n={n} samples per prompt; n must be >= 1.")
    ks = [2**i for i in range(n.bit_length()) if 2**i <= n]
    return ks if ks[-1] == n else ks + [n]


def _blocks(values: Sequence, k: int, prompt: int) -> list[Sequence]:
    if k < 1 or len(values) < k:
        raise ValueError(
            f"k={k} with {len(values)} samples for prompt {prompt}; k must be in [1, n]. Draw "
            "more samples per prompt or ask for a smaller k."
        )
    return [values[j : j + k] for j in range(0, len(values) - k + 1, k)]


def mean_over_prompts(values: Sequence[float]) -> float:
    """The mean of one value per prompt; raises ``ValueError`` when there is none."""
    if len(values) == 0:
        raise ValueError("no prompts to average over; evaluate at least one prompt.")
    return sum(values) / len(values)


def _check_same_length(a: Sequence, b: Sequence, name_a: str, name_b: str) -> None:
    if len(a) != len(b):
        raise ValueError(
            f"{name_a} has {len(a)} entries and {name_b} {len(b)}; give both one entry per prompt (or sample)."
        )
