"""Evaluation results: per-prompt records, the result of one evaluation and its files (JSON, CSV),
comparison with a baseline (keep / exploration rates, paired differences), the pass@k plot, the
per-style pass@k bars and the text summary."""

from __future__ import annotations

import csv
import json
import math
import os
import textwrap
from collections import Counter
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from rllib_dph.files import atomic_path, write_json_atomic
from rllib_dph.evaluation.intervals import (
    entropy_interval,
    format_interval,
    keep_exploration_intervals,
    mean_interval,
    paired_difference_interval,
)
from rllib_dph.evaluation.metrics import (
    NO_ANSWER_STYLE,
    distinct_correct_at_k,
    keep_and_exploration_rates,
    maj_at_k,
    mean_at_k,
    mean_over_prompts,
    mean_pass_at_k,
    pass_at_k,
    style_entropy,
    style_pass_at_k,
)


@dataclass
class PromptRecord:
    """What the policy did on one prompt.

    Attributes:
        task_id: The task's id in its data set.
        index: The task's index in the env.
        correct: Whether each of the n samples is correct.
        answers: Majority-vote key of each sample (None: no answer), see
            ``rllib_dph.envs.base.VerifierEnv.answer_key``.
        styles: Solution style of each sample (``rllib_dph.envs.base.VerifierEnv.solution_style``); empty
            when the env names no style for the task.
        num_truncated: Samples that hit ``max_new_tokens`` without stopping.
        greedy_correct: Whether the greedy completion is correct; None when not generated.
        completions: The n sample texts, when kept.
        greedy_completion: The greedy text, when kept.
        solutions: Solution key of each sample, shortened to a hash (equal: the same solution;
            None: no key), see ``rllib_dph.envs.base.VerifierEnv.solution_key``; empty in results written
            before keys were recorded.
        turns: Policy turns of each of the n episodes (empty when not recorded).
        tool_calls: Tool calls (e.g. exploratory queries) of each episode (empty when not recorded).
        task_fingerprint: The task's ``rllib_dph.envs.base.Task.fingerprint`` (what the question
            was, not only its id); empty in results written before fingerprints were recorded.
    """

    task_id: str
    index: int
    correct: list[bool]
    answers: list[Optional[str]]
    styles: list[str]
    num_truncated: int
    greedy_correct: Optional[bool] = None
    completions: Optional[list[str]] = None
    greedy_completion: Optional[str] = None
    solutions: list[Optional[str]] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    tool_calls: list[int] = field(default_factory=list)
    task_fingerprint: str = ""

    @property
    def n(self) -> int:
        """Samples drawn."""
        return len(self.correct)

    @property
    def num_correct(self) -> int:
        """Correct samples (c of pass@k)."""
        return sum(self.correct)


@dataclass
class EvalResult:
    """Per-prompt outcomes of one evaluation and the settings that produced them.

    Attributes:
        records: One :class:`PromptRecord` per prompt, in env order.
        n: Samples per prompt.
        temperature: Sampling temperature of the n samples.
        top_p: Nucleus mass of the n samples.
        max_new_tokens: Longest response.
        seed: Sampling seed.
        ks: The k reported for pass@k and maj@k.
        policy: What was evaluated (model name, path, checkpoint or engine class).
        env_id: The env id.
        env_config: The env's keyword arguments.
        name: Label in plots and tables (defaults to ``policy``).
        duration_s: Wall-clock time of the evaluation.
    """

    records: list[PromptRecord]
    n: int
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int
    ks: list[int]
    policy: str = ""
    env_id: str = ""
    env_config: dict = field(default_factory=dict)
    name: str = ""
    duration_s: float = 0.0

    @property
    def label(self) -> str:
        """``name``, else ``policy``."""
        return self.name or self.policy

    def pass_at(self, k: int) -> list[float]:
        """pass@k of every prompt, in record order."""
        return [pass_at_k(r.n, r.num_correct, k) for r in self.records]

    def style_counts(self) -> dict[str, int]:
        """Number of sampled completions per solution style, over all prompts, most used first."""
        return dict(Counter(s for r in self.records for s in r.styles).most_common())

    def solution_styles(self) -> list[str]:
        """The solution styles sampled, most used first: every recorded style but ``"none"`` (no answer)."""
        return [s for s in self.style_counts() if s != NO_ANSWER_STYLE]

    @property
    def has_solutions(self) -> bool:
        """Whether every record has a solution key per sample (see :attr:`PromptRecord.solutions`)."""
        return bool(self.records) and all(len(r.solutions) == r.n for r in self.records)

    def diversity_metrics(self) -> list[str]:
        """Names of the diversity metrics this result reports, each a mean of per-prompt values
        (:meth:`per_prompt`): ``pass@k/<style>`` (:func:`style_pass_at_k`) for every style of
        :meth:`solution_styles` and k of ``ks``, and ``distinct_correct@k``
        (:func:`distinct_correct_at_k`) for every k when solution keys were recorded."""
        names = [f"pass@{k}/{style}" for style in self.solution_styles() for k in self.ks]
        if self.has_solutions:
            names += [f"distinct_correct@{k}" for k in self.ks]
        return names

    def summary(self) -> dict[str, Any]:
        """The data-set metrics.

        Returns:
            ``num_prompts``, ``n``, ``temperature``, ``top_p``, ``max_new_tokens``,
            ``greedy_accuracy`` (None without greedy completions), ``pass@k`` and ``maj@k`` for
            each k of ``ks``, ``mean@n`` (see :func:`mean_at_k`), ``truncation_rate`` (share of
            samples that hit ``max_new_tokens``) and, when styles were recorded, ``style_counts``
            and ``style_entropy_bits``, and the :meth:`diversity_metrics` (``pass@k/<style>``,
            ``distinct_correct@k``), and, when turns were recorded, ``turns_per_episode``
            (mean over episodes) and ``tool_use_share`` (share of episodes with a tool call).
        """
        greedy = [r.greedy_correct for r in self.records]
        out: dict[str, Any] = {
            "num_prompts": len(self.records),
            "n": self.n,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_new_tokens": self.max_new_tokens,
            "greedy_accuracy": None if None in greedy else mean_over_prompts([float(g) for g in greedy]),
        }
        correct = [r.correct for r in self.records]
        answers = [r.answers for r in self.records]
        num_samples, num_correct = [r.n for r in self.records], [r.num_correct for r in self.records]
        for k in self.ks:
            out[f"pass@{k}"] = mean_pass_at_k(num_samples, num_correct, k)
        out[f"mean@{self.n}"] = mean_at_k(correct, self.n)
        for k in self.ks:
            out[f"maj@{k}"] = maj_at_k(answers, correct, k)
        out["truncation_rate"] = sum(r.num_truncated for r in self.records) / (len(self.records) * self.n)
        counts = self.style_counts()
        if counts:
            out["style_counts"] = counts
            out["style_entropy_bits"] = style_entropy(counts)
        for metric in self.diversity_metrics():
            out[metric] = mean_over_prompts(self.per_prompt(metric))
        if self.records and all(r.turns for r in self.records):
            out["turns_per_episode"] = float(np.mean([t for r in self.records for t in r.turns]))
            out["tool_use_share"] = float(np.mean([c > 0 for r in self.records for c in r.tool_calls]))
        return out

    def per_prompt(self, metric: str) -> list[float]:
        """Per-prompt values whose mean is ``metric``: ``"greedy_accuracy"`` (0/1), ``"pass@k"``,
        ``"pass@k/<style>"`` (:func:`style_pass_at_k`; 0 on prompts without styles) or
        ``"distinct_correct@k"`` (:func:`distinct_correct_at_k`)."""
        if metric == "greedy_accuracy":
            if any(r.greedy_correct is None for r in self.records):
                raise ValueError(f"{self.label}: no greedy completions were generated (greedy=False).")
            return [float(r.greedy_correct) for r in self.records]
        if metric.startswith("pass@"):
            k, _, style = metric[len("pass@") :].partition("/")
            if style:
                return [style_pass_at_k(r.styles, r.correct, style, int(k)) for r in self.records]
            return self.pass_at(int(k))
        if metric.startswith("distinct_correct@"):
            if not self.has_solutions:
                raise ValueError(
                    f"{self.label}: no solution keys were recorded (a result written before they were); "
                    "evaluate again for distinct_correct@k."
                )
            k = int(metric[len("distinct_correct@") :])
            return [distinct_correct_at_k(r.solutions, r.correct, k) for r in self.records]
        raise ValueError(
            f"per_prompt: metric={metric!r} is not 'greedy_accuracy', 'pass@<k>', 'pass@<k>/<style>' or "
            "'distinct_correct@<k>'."
        )

    def style_matrix(self, styles: Sequence[str]) -> np.ndarray:
        """(P, K) number of samples of each of ``styles`` per prompt."""
        return np.array([[Counter(r.styles)[s] for s in styles] for r in self.records], dtype=float)

    def intervals(self, **kwargs) -> dict[str, tuple[float, float]]:
        """95 % bootstrap intervals over prompts (``evaluation.intervals``) of ``greedy_accuracy``
        (when generated), ``pass@k`` for each k, ``style_entropy_bits`` (when styles were recorded)
        and the :meth:`diversity_metrics`.

        Args:
            **kwargs: ``num_boot``, ``level``, ``seed`` of ``intervals.bootstrap_interval``.
        """
        out = {}
        metrics = [f"pass@{k}" for k in self.ks]
        if all(r.greedy_correct is not None for r in self.records):
            metrics.insert(0, "greedy_accuracy")
        for metric in metrics + self.diversity_metrics():
            out[metric] = mean_interval(self.per_prompt(metric), **kwargs)
        styles = list(self.style_counts())
        if styles:
            out["style_entropy_bits"] = entropy_interval(self.style_matrix(styles), style_entropy, styles, **kwargs)
        return out

    def flat_metrics(self, prefix: str = "") -> dict[str, float]:
        """The summary as a flat ``{name: float}`` dict for RLlib's metrics logger or Tune results.

        Keys (after ``prefix``): ``greedy_accuracy`` (when generated), ``pass@k``, ``mean@n``,
        ``maj@k``, ``truncation_rate``, ``style_entropy_bits`` and ``style/<name>`` (share of
        samples in that style) when styles were recorded, ``distinct_correct@k`` when solution
        keys were, ``turns_per_episode`` and ``tool_use_share`` when turns were recorded. The
        per-style ``pass@k/<style>`` (one per style and k) stay in :meth:`summary`.

        Args:
            prefix: Put before every key, e.g. ``"eval/"``.
        """
        summary = self.summary()
        keys = [f"pass@{k}" for k in self.ks] + [f"mean@{self.n}"] + [f"maj@{k}" for k in self.ks]
        keys += ["truncation_rate", "style_entropy_bits"] + [f"distinct_correct@{k}" for k in self.ks]
        keys += ["turns_per_episode", "tool_use_share"]
        if summary["greedy_accuracy"] is not None:
            keys.insert(0, "greedy_accuracy")
        flat = {prefix + k: float(summary[k]) for k in keys if k in summary}
        counts = summary.get("style_counts", {})
        total = sum(counts.values())
        flat.update({f"{prefix}style/{s}": c / total for s, c in counts.items()})
        return flat

    def to_dict(self) -> dict[str, Any]:
        """Settings, summary and records as plain JSON-able data (what :meth:`to_json` writes)."""
        settings = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "records"}
        intervals = {k: list(v) for k, v in self.intervals().items()}
        return {"settings": settings, "summary": self.summary(), "intervals_95": intervals, "records": [asdict(r) for r in self.records]}

    def to_json(self, path: str | os.PathLike) -> Path:
        """Writes :meth:`to_dict` as JSON atomically (parent folders created); returns the path."""
        return write_json_atomic(path, self.to_dict(), indent=1)

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "EvalResult":
        """Reads a result written by :meth:`to_json`."""
        data = json.loads(Path(path).read_text())
        if not {"settings", "records"} <= set(data):
            raise ValueError(
                f"{path} holds no evaluation result (keys {sorted(data)}, expected 'settings' and "
                "'records'); give a results JSON written by `rllib evaluate` or EvalResult.to_json."
            )
        return cls(records=[PromptRecord(**r) for r in data["records"]], **data["settings"])

    def to_csv(self, path: str | os.PathLike) -> Path:
        """Writes one row per prompt (atomically); returns the path.

        Columns: ``task_id``, ``index``, ``n``, ``num_correct``, ``greedy_correct`` (empty when
        not generated), ``num_truncated``, ``pass@k`` for each k, and ``style/<name>`` (samples
        in that style) for every style seen.
        """
        styles = list(self.style_counts())
        header = ["task_id", "index", "n", "num_correct", "greedy_correct", "num_truncated"]
        header += [f"pass@{k}" for k in self.ks] + [f"style/{s}" for s in styles]
        pass_at = {k: self.pass_at(k) for k in self.ks}
        with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            for i, r in enumerate(self.records):
                counts = Counter(r.styles)
                greedy = "" if r.greedy_correct is None else int(r.greedy_correct)
                row = [r.task_id, r.index, r.n, r.num_correct, greedy, r.num_truncated]
                row += [f"{pass_at[k][i]:.6f}" for k in self.ks] + [counts[s] for s in styles]
                writer.writerow(row)
        return Path(path)


def compare(result: EvalResult, baseline: EvalResult, k: int) -> dict[str, float]:
    """Keep and exploration rates of ``result`` against ``baseline`` at pass@k (DPH-RL §6.1).

    Prompts are matched by task id; every prompt of ``result`` must be in ``baseline``.
    See :func:`keep_and_exploration_rates` for the formulas.

    Args:
        result: The trained policy's evaluation.
        baseline: The base policy's evaluation on the same prompts.
        k: The k of pass@k, at most the n of both.

    Returns:
        ``keep_rate``, ``exploration_rate`` (NaN when undefined) and their 95 % intervals
        (``*_ci``, paired bootstrap over prompts), ``pass_diff``: pass@k of ``result`` minus the
        baseline's, with ``pass_diff_ci``, and ``base_solved`` / ``base_failed``: the expected
        numbers of prompts the baseline solves / fails at pass@k (the denominators). Then the
        paired differences of :func:`diversity_differences`.
    """
    base_by_id = {r.task_id: r for r in baseline.records}
    missing = [r.task_id for r in result.records if r.task_id not in base_by_id]
    if missing:
        raise ValueError(
            f"compare: {len(missing)} of {len(result.records)} prompts are not in the baseline "
            f"(e.g. {missing[0]!r}); evaluate both on the same env split (and --limit)."
        )
    matched = replace(baseline, records=[base_by_id[r.task_id] for r in result.records])
    base_pass = matched.pass_at(k)
    new_pass = result.pass_at(k)
    keep, exploration = keep_and_exploration_rates(base_pass, new_pass)
    keep_ci, exploration_ci = keep_exploration_intervals(base_pass, new_pass)
    return {
        "keep_rate": keep,
        "exploration_rate": exploration,
        "keep_rate_ci": keep_ci,
        "exploration_rate_ci": exploration_ci,
        "pass_diff": float(np.mean(new_pass) - np.mean(base_pass)),
        "pass_diff_ci": paired_difference_interval(new_pass, base_pass),
        "base_solved": sum(base_pass),
        "base_failed": len(base_pass) - sum(base_pass),
        **diversity_differences(result, matched, k),
    }


def check_same_tasks(result: EvalResult, baseline: EvalResult) -> None:
    """Refuses to pair two evaluations whose records of the same position hold different
    questions: a task id names a position in a data set, and the data may have changed between
    the evaluations (``PromptRecord.task_fingerprint``; records without one are not checked).

    Raises:
        ValueError: Some pair's fingerprints differ; the message names the first task.
    """
    differ = [(r.task_id, r.task_fingerprint, b.task_fingerprint) for r, b in zip(result.records, baseline.records)
              if r.task_fingerprint and b.task_fingerprint and r.task_fingerprint != b.task_fingerprint]
    if differ:
        task_id, new, old = differ[0]
        raise ValueError(
            f"{len(differ)} of {len(result.records)} prompts are other questions in the two evaluations "
            f"(e.g. {task_id!r}: task fingerprint {new} in {result.label!r}, {old} in {baseline.label!r}): the "
            "data changed between them; evaluate both on the data as it is now."
        )


def check_current(result: EvalResult, tasks: Sequence[Any], where: str) -> int:
    """Checks that an evaluation's records are of ``tasks`` as they are now.

    Args:
        result: A stored evaluation.
        tasks: The data set's tasks now (``rllib_dph.envs.base.Task``), indexed by the records' ``index``.
        where: The stored file, for the message.

    Returns:
        The number of records written before fingerprints were recorded (not checkable).

    Raises:
        ValueError: A record's task id or fingerprint differs from the task at its index now.
    """
    unchecked = 0
    for r in result.records:
        task = tasks[r.index] if 0 <= r.index < len(tasks) else None
        if task is None or task.id != r.task_id:
            raise ValueError(f"{where}: record {r.index} ({r.task_id!r}) has no task at that index now; "
                             "the data set changed since it was evaluated: delete the file to evaluate again.")
        if not r.task_fingerprint:
            unchecked += 1
        elif r.task_fingerprint != task.fingerprint:
            raise ValueError(
                f"{where}: {r.task_id!r} was another question when it was evaluated (task fingerprint "
                f"{r.task_fingerprint}, now {task.fingerprint}): the data changed since; delete the file to "
                "evaluate again, or read it at the commit that wrote it.")
    return unchecked


def diversity_differences(result: EvalResult, baseline: EvalResult, k: int) -> dict[str, Any]:
    """Paired differences, ``result`` minus ``baseline``, of the diversity metrics at k.

    Args:
        result: The trained policy's evaluation.
        baseline: The baseline's evaluation of the same prompts in the same order.
        k: The k, at most the n of both.

    Returns:
        ``pass_diff/<style>`` (pass@k of that style, :func:`style_pass_at_k`) for every style
        either recorded (a style one of them never sampled scores 0 there), and
        ``distinct_correct_diff`` (:func:`distinct_correct_at_k`) when both recorded solution keys;
        each with its 95 % interval (``pass_diff_ci/<style>``, ``distinct_correct_diff_ci``),
        paired bootstrap over prompts.
    """
    if [r.task_id for r in result.records] != [r.task_id for r in baseline.records]:
        raise ValueError(
            "diversity_differences: the baseline's prompts are not the result's in the same order; "
            "use compare(), which matches them by task id."
        )
    check_same_tasks(result, baseline)
    styles = list(dict.fromkeys(result.solution_styles() + baseline.solution_styles()))
    pairs = [(f"pass@{k}/{style}", f"pass_diff/{style}", f"pass_diff_ci/{style}") for style in styles]
    if result.has_solutions and baseline.has_solutions:
        pairs.append((f"distinct_correct@{k}", "distinct_correct_diff", "distinct_correct_diff_ci"))
    out: dict[str, Any] = {}
    for metric, name, ci_name in pairs:
        new, old = result.per_prompt(metric), baseline.per_prompt(metric)
        out[name] = float(np.mean(new) - np.mean(old))
        out[ci_name] = paired_difference_interval(new, old)
    return out


def plot_pass_at_k(
    results: Sequence[EvalResult | str | os.PathLike | Sequence[EvalResult | str | os.PathLike]],
    out_png: str | os.PathLike,
    *,
    title: Optional[str] = None,
) -> Path:
    """Plots pass@k against k (log2 axis, 0-100 %) with 95 % bands, one line per run.

    Args:
        results: Evaluations of one data set (the same env and env config), or paths of their
            JSON files; an entry that is a list is one run's seeds on the same prompts, drawn as
            their mean over seeds and prompts with the interval that redraws both
            (:func:`~rllib_dph.evaluation.intervals.mean_interval`). Each line is labelled by its
            first evaluation's ``label`` (``run <i>`` when it has none), plus the number of seeds.
        out_png: Where to write the figure (parent folders created).
        title: Figure title; by default the env and its data.

    Returns:
        The path of the PNG.

    Raises:
        ValueError: when the results come from different data sets (one title would mislabel
            them), or one run's seeds were evaluated on different prompts (:func:`seed_matrix`).
    """
    import matplotlib

    plt = _pyplot()
    runs, data_set = _runs(results, "plot_pass_at_k")
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, run in enumerate(runs):
        ks = [k for k in run[0].ks if all(k in r.ks for r in run)]  # the ks every seed has
        per_k = [seed_matrix(run, f"pass@{k}") for k in ks]  # each (S, P)
        line, = ax.plot(ks, [100 * v.mean() for v in per_k], marker="o", label=_run_label(run, i))
        low, high = zip(*(mean_interval(v) for v in per_k))
        ax.fill_between(ks, 100 * np.array(low), 100 * np.array(high), color=line.get_color(), alpha=0.15)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({k for run in runs for r in run for k in r.ks}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_ylim(0, 100)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k (%), 95 % bootstrap band")
    ax.set_title(title or _wrapped(data_set), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out_png)


def plot_style_pass_at_k(
    results: Sequence[EvalResult | str | os.PathLike | Sequence[EvalResult | str | os.PathLike]],
    out_png: str | os.PathLike,
    *,
    k: Optional[int] = None,
    title: Optional[str] = None,
) -> Path:
    """Bars of pass@k per solution style (:func:`style_pass_at_k`, 0-100 %) with 95 % bootstrap
    error bars: one group of bars per style, one bar per evaluation (DPH-RL Appendix B, Figure 4
    draws such bars for how often each style is sampled; these score the correct samples).

    Args:
        results: Evaluations of one data set, or paths of their JSON files, an entry that is a
            list being one run's seeds (as for :func:`plot_pass_at_k`); the styles are those any
            of them sampled.
        out_png: Where to write the figure (parent folders created).
        k: The k, at most every result's n; None: the smallest of the results' largest k.
        title: Figure title; by default the env, its data and k.

    Returns:
        The path of the PNG.

    Raises:
        ValueError: different data sets, one run's seeds on different prompts, no recorded
            solution style, or k larger than some n.
    """
    plt = _pyplot()
    runs, data_set = _runs(results, "plot_style_pass_at_k")
    loaded = [r for run in runs for r in run]
    styles = list(dict.fromkeys(style for r in loaded for style in r.solution_styles()))
    k = min(max(r.ks) for r in loaded) if k is None else k
    if not styles:
        raise ValueError(
            "plot_style_pass_at_k: no result recorded a solution style; plot evaluations on an env "
            "that names styles (rllib_dph.envs.base.VerifierEnv.solution_style), e.g. the bundled suites."
        )
    ns = [r.n for r in loaded]
    if not 1 <= k <= min(ns):
        raise ValueError(
            f"plot_style_pass_at_k: k={k} must be in [1, n] for every result (n = {ns}); give a smaller k."
        )
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(styles) + 2), 4))
    width = 0.8 / len(runs)
    for i, run in enumerate(runs):
        per_style = [seed_matrix(run, f"pass@{k}/{style}") for style in styles]  # each (S, P)
        values = 100 * np.array([v.mean() for v in per_style])
        low, high = (100 * np.array(bound) for bound in zip(*(mean_interval(v) for v in per_style)))
        x = np.arange(len(styles)) + (i - (len(runs) - 1) / 2) * width
        errors = np.clip([values - low, high - values], 0, None)
        ax.bar(x, values, width, yerr=errors, capsize=3, label=_run_label(run, i))
    ax.set_xticks(np.arange(len(styles)), styles)
    ax.set_ylim(0, 100)
    ax.set_xlabel("solution style")
    ax.set_ylabel(f"pass@{k} of the style (%), 95 % interval")
    ax.set_title(title or _wrapped(f"{data_set}, k={k}"), fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out_png)


def _pyplot():
    """matplotlib.pyplot on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def seed_matrix(run: Sequence[EvalResult], metric: str) -> np.ndarray:
    """(S, P) per-prompt values of ``metric`` (:meth:`EvalResult.per_prompt`) of one run's S seeds.

    Raises:
        ValueError: a seed's records are not the first seed's prompts in the same order (task ids,
            and :func:`check_same_tasks`): their values cannot be averaged prompt by prompt.
    """
    first = run[0]
    ids = [r.task_id for r in first.records]
    for other in run[1:]:
        if [r.task_id for r in other.records] != ids:
            raise ValueError(
                f"{other.label!r} holds {len(other.records)} prompts, {first.label!r} {len(ids)}, not the same "
                "prompts in the same order: one run's seeds are averaged prompt by prompt; evaluate every seed "
                "on the same prompts."
            )
        check_same_tasks(other, first)
    return np.array([r.per_prompt(metric) for r in run], dtype=float)


def _run_label(run: Sequence[EvalResult], i: int) -> str:
    """A run's legend entry: its first evaluation's label (``run <i+1>`` without one), and its seeds."""
    label = run[0].label or f"run {i + 1}"
    return label if len(run) == 1 else f"{label} ({len(run)} seeds)"


def _wrapped(title: str, width: int = 80) -> str:
    """A default figure title in lines of at most ``width`` characters (an env config in JSON,
    such as a reasoning-gym data set's, runs past the figure's width on one line)."""
    return "\n".join(textwrap.wrap(title, width))


def _runs(results: Sequence, caller: str) -> tuple[list[list[EvalResult]], str]:
    """The results as runs (an entry that is a list or tuple is one run's seeds; any other is a
    run of one), JSON paths read, and their one data set (:func:`_one_data_set`).

    Raises:
        ValueError: an empty run, or results from different data sets.
    """
    groups = [list(r) if isinstance(r, (list, tuple)) else [r] for r in results]
    if any(not g for g in groups):
        raise ValueError(f"{caller}: run {[len(g) for g in groups].index(0) + 1} is an empty list; give each run "
                         "one evaluation or a list of its seeds' evaluations.")
    loaded, data_set = _one_data_set([r for g in groups for r in g], caller)
    flat = iter(loaded)
    return [[next(flat) for _ in g] for g in groups], data_set


def _one_data_set(results: Sequence[EvalResult | str | os.PathLike], caller: str) -> tuple[list[EvalResult], str]:
    """The results (JSON paths read) and their one data set ("env_id env_config").

    Raises:
        ValueError: no results, or results from different data sets (one title would mislabel them).
    """
    loaded = [r if isinstance(r, EvalResult) else EvalResult.from_json(r) for r in results]
    if not loaded:
        raise ValueError(f"{caller}: no results to plot; give at least one EvalResult or JSON path.")
    data_sets = sorted({f"{r.env_id} {json.dumps(r.env_config, sort_keys=True)}" for r in loaded})
    if len(data_sets) > 1:
        raise ValueError(
            f"{caller}: the results come from {len(data_sets)} data sets ({'; '.join(data_sets)}); "
            "plot each data set in its own figure."
        )
    return loaded, data_sets[0]


def _save(fig, out_png: str | os.PathLike) -> Path:
    """Writes ``fig`` as a PNG atomically (parent folders created), closes it and returns the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    return Path(out_png)


def format_summary(result: EvalResult, comparisons: Optional[Mapping[int, Mapping[str, float]]] = None) -> str:
    """A plain-text table of a result's summary with 95 % intervals (and keep / exploration rates
    and the paired pass@k difference to a baseline per k), then a table of the diversity metrics
    (pass@k per style, distinct correct solutions) at the smallest and largest k (and their
    paired difference to the baseline at the largest compared k).

    Args:
        result: The evaluation.
        comparisons: ``{k: compare(result, baseline, k)}`` for the k to show keep and
            exploration rates at.
    """
    s, ci = result.summary(), result.intervals()
    lines = [
        f"policy: {result.label}",
        f"env: {result.env_id} {json.dumps(result.env_config)}",
        f"prompts: {s['num_prompts']}  n={s['n']}  temperature={s['temperature']}  top_p={s['top_p']}  "
        f"max_new_tokens={s['max_new_tokens']}  ({result.duration_s:.1f} s)",
    ]
    if s["greedy_accuracy"] is not None:
        lines.append(f"greedy accuracy   {format_interval(s['greedy_accuracy'], ci.get('greedy_accuracy'), digits=3)}")
    lines.append(f"mean@{result.n:<12} {s[f'mean@{result.n}']:.3f}")
    lines.append(f"truncation rate   {s['truncation_rate']:.3f}")
    header = f"{'k':>4} {'pass@k [95% interval]':>24} {'maj@k':>7}"
    comparisons = comparisons or {}
    if comparisons:
        header += f" {'keep':>22} {'explore':>22} {'pass@k - base':>26}"
    lines.append(header)
    for k in result.ks:
        line = f"{k:>4} {format_interval(s[f'pass@{k}'], ci[f'pass@{k}'], digits=3):>24} {s[f'maj@{k}']:>7.3f}"
        if k in comparisons:
            c = comparisons[k]
            line += f" {format_interval(c['keep_rate'], c['keep_rate_ci'], digits=3):>22}"
            line += f" {format_interval(c['exploration_rate'], c['exploration_rate_ci'], digits=3):>22}"
            line += f" {format_interval(c['pass_diff'], c['pass_diff_ci'], digits=3):>26}"
        lines.append(line)
    if "style_counts" in s:
        total = sum(s["style_counts"].values())
        shares = ", ".join(f"{style} {count / total:.2f}" for style, count in s["style_counts"].items())
        entropy = format_interval(s["style_entropy_bits"], ci.get("style_entropy_bits"), digits=3)
        lines.append(f"styles ({entropy} bits): {shares}")
    return "\n".join(lines + _diversity_lines(result, s, ci, comparisons))


def _diversity_lines(
    result: EvalResult, s: Mapping[str, Any], ci: Mapping[str, Any], comparisons: Mapping[int, Mapping[str, Any]]
) -> list[str]:
    """The diversity table of :func:`format_summary` (no lines when there is no diversity metric)."""
    rows = [
        (style, f"pass@{{k}}/{style}", f"pass_diff/{style}", f"pass_diff_ci/{style}")
        for style in result.solution_styles()
    ]
    if result.has_solutions:
        rows.append(("distinct correct", "distinct_correct@{k}", "distinct_correct_diff", "distinct_correct_diff_ci"))
    if not rows:
        return []
    ks = sorted({min(result.ks), max(result.ks)})
    k_diff = max(comparisons) if comparisons else None
    header = f"{'':<18}" + "".join(f" {f'k={k}':>22}" for k in ks)
    header += f" {f'k={k_diff} - base':>24}" if k_diff is not None else ""
    lines = ["pass@k per solution style (a correct sample of it among k) and distinct correct solutions "
             "(expected among k) [95% interval]:", header]
    for label, metric, diff, diff_ci in rows:
        names = [metric.replace("{k}", str(k)) for k in ks]
        line = f"{label:<18}" + "".join(f" {format_interval(s[name], ci[name], digits=3):>22}" for name in names)
        if k_diff is not None and diff in comparisons[k_diff]:
            c = comparisons[k_diff]
            line += f" {format_interval(c[diff], c[diff_ci], digits=3):>24}"
        lines.append(line)
    return lines


def finite_or_none(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with NaN and infinities replaced by None (JSON has no NaN), also inside intervals."""

    def clean(v):
        if isinstance(v, (tuple, list)):
            return [clean(x) for x in v]
        return v if math.isfinite(v) else None

    return {k: clean(v) for k, v in values.items()}