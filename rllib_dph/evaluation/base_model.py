"""The base model's quality check: what a freshly built model can do on the bundled test splits.

``rllib build-model`` runs it after a tiny model's SFT (``models.hub.build_model(...,
evaluate=evaluate_base_policy)``) and stores the metrics in the build record
(``rllib_dph_build.json``); ``research/base_model.py`` runs it on any model folder. It lives here,
not in ``models/``, so that the model layer imports no engine, rollout or evaluation code.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import numpy as np
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rllib_dph.envs import suites
from rllib_dph.envs.math import MathEnv
from rllib_dph.envs.sql import SQLEnv
from rllib_dph.envs.suites.sql_suite import TIES_FAMILY_VERSION
from rllib_dph.engines.base import SamplingParams
from rllib_dph.engines.hf import HFEngine
from rllib_dph.evaluation.metrics import mean_pass_at_k
from rllib_dph.rollout.episodes import ScoredGroup, rollout_chunks


def evaluate_base_policy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    samples: int = 8,
    max_new_tokens: int = 160,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Measures a policy on the bundled test splits, through the rollout path and an ``HFEngine``.

    Greedy accuracy on ``sql_synth/test``, ``sql_synth/test_cross`` and ``math_synth/test``;
    pass@1 and pass@``samples`` (unbiased) and the count of each solution style among
    ``samples`` completions per ``sql_synth/test`` prompt at temperature 1.0; the same, per
    approach, on the two-approach families' test splits (``sql_ties/...``, ``sql_nulls/...``).

    Args:
        model: The policy (eval mode).
        tokenizer: Its tokenizer.
        samples: Completions per SQL test prompt for pass@k and the style counts.
        max_new_tokens: Longest completion.
        seed: Seed of the sampler.
        progress: Show progress bars.

    Returns:
        A flat dict of metrics (JSON-serialisable).
    """
    engine = HFEngine(model, tokenizer, device=model.device)
    sql_test = SQLEnv(suites.load_split("sql_synth/test"))
    run = functools.partial(_rollout_split, engine, max_new_tokens=max_new_tokens, seed=seed, progress=progress)
    greedy = run(sql_test, 1, 0.0)
    metrics = {
        "sql_test/greedy_acc": _accuracy(greedy),
        "sql_test/greedy_styles": _style_counts("sql_synth", [g.texts[0] for g in greedy]),
    }
    if samples > 0:
        sampled = run(sql_test, samples, 1.0)
        num_correct = [int(g.correct.sum()) for g in sampled]
        for k in (1, samples):
            metrics[f"sql_test/pass@{k}"] = mean_pass_at_k([samples] * len(sampled), num_correct, k)
        metrics["sql_test/sample_styles"] = _style_counts("sql_synth", [t for g in sampled for t in g.texts])
        metrics["sql_test/correct_sample_styles"] = _style_counts(
            "sql_synth", [t for g in sampled for t, ok in zip(g.texts, g.correct) if ok]
        )
    metrics["sql_test_cross/greedy_acc"] = _accuracy(run(SQLEnv(suites.load_split("sql_synth/test_cross")), 1, 0.0))
    metrics["math_test/greedy_acc"] = _accuracy(run(MathEnv(suites.load_split("math_synth/test")), 1, 0.0))
    metrics.update(_ties_metrics(run, samples))
    metrics.update(_family_metrics(run, samples, "sql_synth/test_nulls", "sql_nulls"))
    return metrics


def _ties_metrics(run: Callable, samples: int) -> dict:
    """The ties family (``sql_synth/test_ties``; the family asks the base model to write
    its ``extremum`` approach in about 10-25 % of its samples), with the family's version
    (``sql_suite.TIES_FAMILY_VERSION``): see :func:`_family_metrics`."""
    metrics = _family_metrics(run, samples, "sql_synth/test_ties", "sql_ties")
    return {"sql_ties/family_version": TIES_FAMILY_VERSION, **metrics}


def _family_metrics(run: Callable, samples: int, split: str, prefix: str) -> dict:
    """A two-approach family's test split: greedy accuracy, pass@1 / pass@``samples`` and how
    many samples take each approach, among all and among the correct ones."""
    tasks = suites.load_split(split)
    env, source = SQLEnv(tasks), tasks[0].data_source
    greedy = run(env, 1, 0.0)
    metrics = {f"{prefix}/greedy_acc": _accuracy(greedy),
               f"{prefix}/greedy_approaches": _style_counts(source, [g.texts[0] for g in greedy])}
    if samples > 0:
        sampled = run(env, samples, 1.0)
        num_correct = [int(g.correct.sum()) for g in sampled]
        for k in (1, samples):
            metrics[f"{prefix}/pass@{k}"] = mean_pass_at_k([samples] * len(sampled), num_correct, k)
        metrics[f"{prefix}/sample_approaches"] = _style_counts(source, [t for g in sampled for t in g.texts])
        metrics[f"{prefix}/correct_sample_approaches"] = _style_counts(
            source, [t for g in sampled for t, ok in zip(g.texts, g.correct) if ok])
    return metrics


def _rollout_split(
    engine: HFEngine, env, n: int, temperature: float, *, max_new_tokens: int, seed: int, progress: bool
) -> list[ScoredGroup]:
    """``n`` scored completions for every task of ``env``; prompt chunk j is sampled with seed ``seed + j``.

    A chunk holds ``engine.max_batch_size // n`` prompts (at least one): one decoding batch.
    """
    per_chunk = max(1, engine.max_batch_size // n)
    params = SamplingParams(n=n, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    chunks = rollout_chunks(engine, env, range(len(env.tasks)), params, chunk_size=per_chunk)
    total, desc = -(-len(env.tasks) // per_chunk), f"{env.tasks[0].data_source} n={n}"
    return [g for _, _, r in tqdm(chunks, total=total, desc=desc, disable=not progress, dynamic_ncols=True) for g in r.groups]


def _accuracy(groups: Sequence[ScoredGroup]) -> float:
    """The share of correct completions over all groups."""
    return float(np.mean([ok for g in groups for ok in g.correct]))


def _style_counts(suite: str, completions: Sequence[str]) -> dict[str, int]:
    """How many completions show each style of ``suite`` (styles in their fixed order, then others)."""
    counts = {style: 0 for style in suites.STYLES[suite]}
    for completion in completions:
        style = suites.style_of(suite, completion)
        counts[style] = counts.get(style, 0) + 1
    return counts
