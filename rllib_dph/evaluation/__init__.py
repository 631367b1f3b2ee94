"""Evaluation of a policy on a verifier env: greedy accuracy, pass@k, mean@k, maj@k, keep and
exploration rates (DPH-RL paper §6.1) and diversity: the entropy of solution styles, pass@k per
style and the number of distinct correct solutions.

Three modules, one concern each:

- :mod:`~rllib_dph.evaluation.metrics`: pure functions of per-prompt outcomes (pass@k, ...);
- :mod:`~rllib_dph.evaluation.results`: :class:`PromptRecord`, :class:`EvalResult` and its
  files (JSON, CSV), :func:`compare` with a baseline, :func:`seed_matrix` (one run's seeds),
  :func:`plot_pass_at_k`, :func:`plot_style_pass_at_k`, :func:`format_summary`;
- :mod:`~rllib_dph.evaluation.runner`: :class:`EvalSettings`, :func:`evaluate_engine` (a built
  engine and env, e.g. during training), :func:`evaluate` (names or an RLlib checkpoint).

A saved result can be re-summarised, compared with a baseline or plotted without generating
again::

    from rllib_dph.evaluation import EvalSettings, compare, evaluate_policy, plot_pass_at_k, plot_style_pass_at_k

    settings = EvalSettings(sampling=SamplingParams(n=16, seed=0))  # engines.base.SamplingParams
    base = evaluate_policy("tiny-sql-math", "rllib_dph/SQL-v0", {"data": "sql_synth/test"}, settings)
    tuned = evaluate_policy("~/ray_results/GRPO/trial/checkpoint_000003", "rllib_dph/SQL-v0",
                     {"data": "sql_synth/test"}, settings)
    tuned.summary()["pass@8"], compare(tuned, base, k=8)["keep_rate"]
    tuned.summary()["pass@16/cte"], tuned.summary()["distinct_correct@16"]  # a correct CTE among 16
    compare(tuned, base, k=16)["pass_diff/cte"], compare(tuned, base, k=16)["pass_diff_ci/cte"]
    plot_pass_at_k([base, tuned], "pass_at_k.png")
    plot_style_pass_at_k([base, tuned], "style_pass_at_k.png")  # bars per style at the largest k
    plot_pass_at_k([base, [tuned_seed0, tuned_seed1]], "seeds.png")  # a list: one run's seeds, pooled

During training, :meth:`EvalResult.flat_metrics` gives the floats to log. The command line is
``rllib evaluate`` (see ``rllib_dph.cli.main``).
"""

from rllib_dph.evaluation.metrics import (
    default_ks,
    distinct_correct_at_k,
    keep_and_exploration_rates,
    maj_at_k,
    majority_vote,
    mean_at_k,
    mean_pass_at_k,
    pass_at_k,
    style_entropy,
    style_pass_at_k,
)
from rllib_dph.evaluation.results import (
    EvalResult,
    PromptRecord,
    compare,
    finite_or_none,
    format_summary,
    diversity_differences,
    plot_pass_at_k,
    plot_style_pass_at_k,
    seed_matrix,
)
from rllib_dph.evaluation.runner import (
    EvalSettings,
    evaluate_policy,
    evaluate_engine,
    find_module_checkpoint,
    load_engine,
)

__all__ = [
    "EvalResult",
    "EvalSettings",
    "PromptRecord",
    "compare",
    "default_ks",
    "distinct_correct_at_k",
    "diversity_differences",
    "evaluate_policy",
    "evaluate_engine",
    "find_module_checkpoint",
    "finite_or_none",
    "format_summary",
    "keep_and_exploration_rates",
    "load_engine",
    "maj_at_k",
    "majority_vote",
    "mean_at_k",
    "mean_pass_at_k",
    "pass_at_k",
    "plot_pass_at_k",
    "plot_style_pass_at_k",
    "seed_matrix",
    "style_entropy",
    "style_pass_at_k",
]
