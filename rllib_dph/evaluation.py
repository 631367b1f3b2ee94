"""Evaluation of a policy on a verifier env: greedy accuracy, pass@k, mean@k, maj@k, keep and
exploration rates (DPH-RL paper §6.1) and the diversity of solution styles.

For every prompt of an env split the policy draws ``n`` samples (temperature / top-p) and, by
default, one greedy completion; the env scores each. The metrics are pure functions of the
per-prompt outcomes, so a saved result can be re-summarised, compared with a baseline or plotted
without generating again::

    from rllib_dph.evaluation import compare, evaluate, plot_pass_at_k

    base = evaluate("tiny-sql-math", "rllib_dph/SQL-v0", {"data": "sql_synth/test"}, n=16)
    tuned = evaluate("~/ray_results/GRPO/trial/checkpoint_000003", "rllib_dph/SQL-v0",
                     {"data": "sql_synth/test"}, n=16)
    tuned.summary()["pass@8"], compare(tuned, base, k=8)["keep_rate"]
    plot_pass_at_k([base, tuned], "pass_at_k.png")

During training, :func:`evaluate_engine` runs on an already-built engine and env and
:meth:`EvalResult.flat_metrics` gives the floats to log. The command line is ``rllib evaluate``
(see ``rllib_dph.cli``).
"""

from __future__ import annotations

import csv
import hashlib
import importlib
import json
import math
import os
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from envs.suites import MATH_SUITE, SQL_CROSS_SOURCE, SQL_SUITE, style_of
from rllib_dph.engines.base import RolloutEngine, SamplingParams

#: Longest generated response, in tokens, unless told otherwise (GRPOConfig's default).
DEFAULT_MAX_NEW_TOKENS = 128
#: Prompts per ``engine.generate`` call (16 prompts x n=16 fills the HF engine's 256-row batch).
DEFAULT_BATCH_PROMPTS = 16
#: Data sources whose completions ``envs.suites.style_of`` can name a style for.
STYLE_SUITES = (SQL_SUITE, SQL_CROSS_SOURCE, MATH_SUITE)
#: The style ``style_of`` gives a completion without an answer block; not a solution style.
NO_ANSWER_STYLE = "none"
#: Where an Algorithm checkpoint keeps the learner's RL modules.
RL_MODULE_SUBDIR = Path("learner_group") / "learner" / "rl_module"

#: Maps (env, task, completion) to a majority-vote key: equal keys are the same answer.
AnswerFn = Callable[[Any, Any, str], Optional[str]]


# ---------------------------------------------------------------------------------------------
# Pure metrics
# ---------------------------------------------------------------------------------------------


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
    return _mean([pass_at_k(n, c, k) for n, c in zip(num_samples, num_correct)])


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
    return _mean(per_prompt)


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
        per_prompt.append(_mean([majority_vote(a, c) for a, c in blocks]))
    return _mean(per_prompt)


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
        counts: Number of completions per style name (as from ``envs.suites.style_of``).
    """
    used = [c for style, c in counts.items() if style != NO_ANSWER_STYLE and c > 0]
    total = sum(used)
    return -sum(c / total * math.log2(c / total) for c in used) if total else 0.0


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


def _mean(values: Sequence[float]) -> float:
    if len(values) == 0:
        raise ValueError("no prompts to average over; evaluate at least one prompt.")
    return sum(values) / len(values)


def _check_same_length(a: Sequence, b: Sequence, name_a: str, name_b: str) -> None:
    if len(a) != len(b):
        raise ValueError(
            f"{name_a} has {len(a)} entries and {name_b} {len(b)}; give both one entry per prompt (or sample)."
        )


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


@dataclass
class PromptRecord:
    """What the policy did on one prompt.

    Attributes:
        task_id: The task's id in its data set.
        index: The task's index in the env.
        correct: Whether each of the n samples is correct.
        answers: Majority-vote key of each sample (None: no answer), see :func:`answer_key`.
        styles: Solution style of each sample (``envs.suites.style_of``); empty when the suite
            has no style function.
        num_truncated: Samples that hit ``max_new_tokens`` without stopping.
        greedy_correct: Whether the greedy completion is correct; None when not generated.
        completions: The n sample texts, when kept.
        greedy_completion: The greedy text, when kept.
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

    def summary(self) -> dict[str, Any]:
        """The data-set metrics.

        Returns:
            ``num_prompts``, ``n``, ``temperature``, ``top_p``, ``max_new_tokens``,
            ``greedy_accuracy`` (None without greedy completions), ``pass@k`` and ``maj@k`` for
            each k of ``ks``, ``mean@n`` (see :func:`mean_at_k`), ``truncation_rate`` (share of
            samples that hit ``max_new_tokens``) and, when styles were recorded, ``style_counts``
            and ``style_entropy_bits``.
        """
        greedy = [r.greedy_correct for r in self.records]
        out: dict[str, Any] = {
            "num_prompts": len(self.records),
            "n": self.n,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_new_tokens": self.max_new_tokens,
            "greedy_accuracy": None if None in greedy else _mean([float(g) for g in greedy]),
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
        return out

    def flat_metrics(self, prefix: str = "") -> dict[str, float]:
        """The summary as a flat ``{name: float}`` dict for RLlib's metrics logger or Tune results.

        Keys (after ``prefix``): ``greedy_accuracy`` (when generated), ``pass@k``, ``mean@n``,
        ``maj@k``, ``truncation_rate``, ``style_entropy_bits`` and ``style/<name>`` (share of
        samples in that style) when styles were recorded.

        Args:
            prefix: Put before every key, e.g. ``"eval/"``.
        """
        summary = self.summary()
        keys = [k for k in summary if k.startswith(("pass@", "mean@", "maj@"))]
        keys += ["truncation_rate", "style_entropy_bits"]
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
        return {"settings": settings, "summary": self.summary(), "records": [asdict(r) for r in self.records]}

    def to_json(self, path: str | os.PathLike) -> Path:
        """Writes :meth:`to_dict` as JSON (parent folders created); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

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
        """Writes one row per prompt; returns the path.

        Columns: ``task_id``, ``index``, ``n``, ``num_correct``, ``greedy_correct`` (empty when
        not generated), ``num_truncated``, ``pass@k`` for each k, and ``style/<name>`` (samples
        in that style) for every style seen.
        """
        styles = list(self.style_counts())
        header = ["task_id", "index", "n", "num_correct", "greedy_correct", "num_truncated"]
        header += [f"pass@{k}" for k in self.ks] + [f"style/{s}" for s in styles]
        pass_at = {k: self.pass_at(k) for k in self.ks}
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            for i, r in enumerate(self.records):
                counts = Counter(r.styles)
                greedy = "" if r.greedy_correct is None else int(r.greedy_correct)
                row = [r.task_id, r.index, r.n, r.num_correct, greedy, r.num_truncated]
                row += [f"{pass_at[k][i]:.6f}" for k in self.ks] + [counts[s] for s in styles]
                writer.writerow(row)
        return path


def compare(result: EvalResult, baseline: EvalResult, k: int) -> dict[str, float]:
    """Keep and exploration rates of ``result`` against ``baseline`` at pass@k (DPH-RL §6.1).

    Prompts are matched by task id; every prompt of ``result`` must be in ``baseline``.
    See :func:`keep_and_exploration_rates` for the formulas.

    Args:
        result: The trained policy's evaluation.
        baseline: The base policy's evaluation on the same prompts.
        k: The k of pass@k, at most the n of both.

    Returns:
        ``keep_rate``, ``exploration_rate`` (NaN when undefined), and ``base_solved`` /
        ``base_failed``: the expected numbers of prompts the baseline solves / fails at pass@k
        (the denominators).
    """
    base_by_id = {r.task_id: r for r in baseline.records}
    missing = [r.task_id for r in result.records if r.task_id not in base_by_id]
    if missing:
        raise ValueError(
            f"compare: {len(missing)} of {len(result.records)} prompts are not in the baseline "
            f"(e.g. {missing[0]!r}); evaluate both on the same env split (and --limit)."
        )
    base = [base_by_id[r.task_id] for r in result.records]
    base_pass = [pass_at_k(b.n, b.num_correct, k) for b in base]
    keep, exploration = keep_and_exploration_rates(base_pass, result.pass_at(k))
    return {
        "keep_rate": keep,
        "exploration_rate": exploration,
        "base_solved": sum(base_pass),
        "base_failed": len(base_pass) - sum(base_pass),
    }


def plot_pass_at_k(
    results: Sequence[EvalResult | str | os.PathLike],
    out_png: str | os.PathLike,
    *,
    title: Optional[str] = None,
) -> Path:
    """Plots pass@k against k (log2 axis), one line per evaluation, into a PNG.

    Args:
        results: Evaluations, or paths of their JSON files; each is labelled by its ``label``
            (``run <i>`` when it has none).
        out_png: Where to write the figure (parent folders created).
        title: Figure title; by default the env and its data of the first result.

    Returns:
        The path of the PNG.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loaded = [r if isinstance(r, EvalResult) else EvalResult.from_json(r) for r in results]
    if not loaded:
        raise ValueError("plot_pass_at_k: no results to plot; give at least one EvalResult or JSON path.")
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, r in enumerate(loaded):
        summary = r.summary()
        ax.plot(r.ks, [100 * summary[f"pass@{k}"] for k in r.ks], marker="o", label=r.label or f"run {i + 1}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({k for r in loaded for k in r.ks}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k (%)")
    first = loaded[0]
    ax.set_title(title or f"{first.env_id} {json.dumps(first.env_config)}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return out_png


# ---------------------------------------------------------------------------------------------
# Running an evaluation
# ---------------------------------------------------------------------------------------------


def answer_key(env, task, completion: str) -> Optional[str]:
    """The majority-vote key of a completion: completions with equal keys give the same answer.

    - ``SQLEnv``: the query's execution result on the task's database, as a hash of its set of
      rows (column order kept, row order and duplicates ignored, as in BIRD's comparison);
      None when there is no ```sql block or the query fails.
    - ``MathEnv``: the extracted final answer (``\\boxed{}`` or "the answer is") without
      whitespace; equal values written differently (``0.5``, ``\\frac{1}{2}``) are different keys.
    - any other env: the stripped completion text (None when empty).

    Args:
        env: The env that scores the completion.
        task: Its task (``envs.base.Task``).
        completion: The completion text.
    """
    from envs.math import MathEnv, extract_answer
    from envs.sql import SQLEnv, SQLExecutionError, execute_sql, extract_sql

    if isinstance(env, SQLEnv):
        sql = extract_sql(completion)
        if sql is None:
            return None
        try:
            rows = execute_sql(sql, task.ground_truth["db_path"], timeout_s=env.timeout_s)
        except SQLExecutionError:
            return None
        canonical = repr(sorted({tuple(row) for row in rows}, key=repr))
        return "rows:" + hashlib.sha1(canonical.encode()).hexdigest()[:16]
    if isinstance(env, MathEnv):
        answer = extract_answer(completion)
        return None if answer is None else re.sub(r"\s+", "", answer)
    return completion.strip() or None


def evaluate_engine(
    engine: RolloutEngine,
    env,
    *,
    n: int = 16,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    ks: Optional[Sequence[int]] = None,
    greedy: bool = True,
    seed: int = 0,
    style_suite: Optional[str] = None,
    limit: Optional[int] = None,
    batch_prompts: int = DEFAULT_BATCH_PROMPTS,
    keep_completions: bool = False,
    answer_fn: AnswerFn = answer_key,
    progress: bool = False,
) -> EvalResult:
    """Evaluates a rollout engine on the tasks of a built verifier env (no file I/O).

    Prompts are encoded with the engine's tokenizer and chat template (as the env runner does)
    and generated ``batch_prompts`` at a time; chunk j is sampled with seed ``seed + j``, so the
    same seed, ``batch_prompts`` and weights give the same samples.

    Args:
        engine: A rollout engine (``generate``, ``tokenizer``), e.g. an env runner's.
        env: A verifier env (``envs.base.VerifierEnv``: ``tasks``, ``reset``, ``step``).
        n: Samples per prompt, >= 1.
        temperature: Sampling temperature, > 0.
        top_p: Nucleus mass in (0, 1].
        max_new_tokens: Longest response, in tokens.
        ks: The k of pass@k and maj@k, each in [1, n]; default 1, 2, 4, ... <= n and n.
        greedy: Also generate one greedy completion per prompt (greedy accuracy).
        seed: Sampling seed.
        style_suite: Suite whose style function names the solution styles (one of
            :data:`STYLE_SUITES`); None uses each task's ``data_source`` when it is one of them
            and records no styles otherwise.
        limit: Evaluate only the first ``limit`` tasks (>= 1); None evaluates all.
        batch_prompts: Prompts per ``generate`` call, >= 1.
        keep_completions: Keep the completion texts in the records.
        answer_fn: Majority-vote key of a completion, ``(env, task, text) -> str | None``.
        progress: Show a progress bar over prompts.
    """
    from tqdm.auto import tqdm

    from rllib_dph.models.hub import encode_prompt

    ks = list(ks) if ks else default_ks(n)
    _check_settings(
        n=n, temperature=temperature, ks=ks, batch_prompts=batch_prompts, limit=limit, style_suite=style_suite
    )
    indices = list(range(len(env.tasks) if limit is None else min(limit, len(env.tasks))))
    tokenizer = engine.tokenizer
    sample_params = dict(n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens)
    start = time.perf_counter()
    records = []
    with tqdm(total=len(indices), desc=f"evaluating n={n}", unit="prompt", disable=not progress) as bar:
        for j, chunk_start in enumerate(range(0, len(indices), batch_prompts)):
            chunk = indices[chunk_start : chunk_start + batch_prompts]
            prompts = [encode_prompt(tokenizer, [dict(m) for m in env.tasks[i].messages]) for i in chunk]
            groups = engine.generate(prompts, SamplingParams(**sample_params, seed=seed + j))
            greedy_texts = [None] * len(chunk)
            if greedy:
                params = SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens)
                greedy_groups = engine.generate(prompts, params)
                greedy_texts = [tokenizer.decode(g[0].token_ids, skip_special_tokens=True) for g in greedy_groups]
            for i, group, greedy_text in zip(chunk, groups, greedy_texts):
                texts = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in group]
                truncated = sum(c.finish_reason == "length" for c in group)
                records.append(
                    _score_prompt(env, i, texts, truncated, greedy_text, style_suite, answer_fn, keep_completions)
                )
            bar.update(len(chunk))
    return EvalResult(
        records=records,
        n=n,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=max_new_tokens,
        seed=seed,
        ks=ks,
        policy=type(engine).__name__,
        env_id=getattr(env, "name", type(env).__name__),
        duration_s=time.perf_counter() - start,
    )


def _score_prompt(
    env,
    index: int,
    texts: list[str],
    num_truncated: int,
    greedy_text: Optional[str],
    style_suite: Optional[str],
    answer_fn: AnswerFn,
    keep_completions: bool,
) -> PromptRecord:
    """Scores the samples (and greedy completion) of task ``index`` with the env."""
    task = env.tasks[index]

    def correct(text: str) -> bool:
        env.reset(options={"index": index})
        return bool(env.step(text)[4]["correct"])

    suite = style_suite or (task.data_source if task.data_source in STYLE_SUITES else None)
    return PromptRecord(
        task_id=task.id,
        index=index,
        correct=[correct(t) for t in texts],
        answers=[answer_fn(env, task, t) for t in texts],
        styles=[style_of(suite, t) for t in texts] if suite else [],
        num_truncated=num_truncated,
        greedy_correct=None if greedy_text is None else correct(greedy_text),
        completions=texts if keep_completions else None,
        greedy_completion=greedy_text if keep_completions else None,
    )


def _check_settings(
    *,
    n: int,
    temperature: float,
    ks: list[int],
    batch_prompts: int,
    limit: Optional[int],
    style_suite: Optional[str],
) -> None:
    """Raises ``ValueError`` naming the first setting of :func:`evaluate_engine` out of its range."""
    rules = [
        (n >= 1, f"n={n} samples per prompt must be >= 1"),
        (temperature > 0, f"temperature={temperature} must be > 0 for the n samples (greedy=True adds greedy)"),
        (all(1 <= k <= n for k in ks), f"ks={ks} must all be in [1, n={n}]; drop the larger k or raise n"),
        (batch_prompts >= 1, f"batch_prompts={batch_prompts} must be >= 1"),
        (limit is None or limit >= 1, f"limit={limit} must be >= 1, or None for every prompt"),
        (
            style_suite is None or style_suite in STYLE_SUITES,
            f"style_suite={style_suite!r} has no style function; use one of {STYLE_SUITES} or None",
        ),
    ]
    for ok, message in rules:
        if not ok:
            raise ValueError(f"evaluate: {message}.")


def find_module_checkpoint(path: str | os.PathLike) -> Optional[Path]:
    """The learner's RL-module folder of an RLlib Algorithm checkpoint, or None for other folders.

    Args:
        path: A folder written by ``algo.save_to_path`` (or a Tune ``checkpoint_00000N``).

    Raises:
        ValueError: ``path`` is an RLlib checkpoint without a learner RL module, or a Tune trial
            folder (``checkpoint_*`` sub-folders and no model ``config.json``).
    """
    path = Path(path).expanduser()
    if (path / "rllib_checkpoint.json").is_file():
        from ray.rllib.core import DEFAULT_MODULE_ID

        module_dir = path / RL_MODULE_SUBDIR / DEFAULT_MODULE_ID
        if not module_dir.is_dir():
            raise ValueError(
                f"{path} is an RLlib checkpoint without {RL_MODULE_SUBDIR / DEFAULT_MODULE_ID}; give "
                "the Algorithm checkpoint folder that algo.save_to_path (or Tune) wrote."
            )
        return module_dir
    nested = sorted(path.glob("checkpoint_*"))
    if nested and not (path / "config.json").is_file():  # a model folder has a config.json
        raise ValueError(
            f"{path} is a Tune trial folder, not a checkpoint; give one of its checkpoints, "
            f"e.g. {nested[-1]}."
        )
    return None


def load_engine(
    policy: str | os.PathLike,
    *,
    engine: str = "hf",
    dtype: Optional[str] = None,
    device: str = "cpu",
    engine_kwargs: Optional[Mapping[str, Any]] = None,
) -> RolloutEngine:
    """Builds a rollout engine for a model name, local model folder, HF id or RLlib checkpoint.

    For a checkpoint, the engine is built from the model named in the learner's RL-module config
    (``model_config["model"]``) and then gets the checkpoint's weights (``update_weights``).

    Args:
        policy: Bundled tiny name, ``save_pretrained`` folder, Hugging Face id, or an Algorithm
            checkpoint folder (``algo.save_to_path`` / Tune ``checkpoint_00000N``).
        engine: Engine name, a key of ``rllib_dph.engines.ENGINE_CLASSES``.
        dtype: Weight dtype (``"float32"``, ``"bfloat16"``, ...); None keeps the checkpoint's
            (for an RLlib checkpoint: the learner's compute dtype, ``GRPOConfig.llm(dtype=...)``;
            its float32 master weights are cast to it).
        device: Where to run the engine.
        engine_kwargs: More keyword arguments of the engine's ``from_pretrained``.
    """
    from rllib_dph.engines import ENGINE_CLASSES

    if engine not in ENGINE_CLASSES:
        raise ValueError(f"engine={engine!r} is not available; choose one of {sorted(ENGINE_CLASSES)}.")
    module_name, class_name = ENGINE_CLASSES[engine].split(":")
    engine_class = getattr(importlib.import_module(module_name), class_name)
    kwargs = {"device": device, **dict(engine_kwargs or {})}
    module_dir = find_module_checkpoint(policy) if Path(policy).expanduser().is_dir() else None
    if module_dir is None:
        return engine_class.from_pretrained(str(policy), dtype=dtype, **kwargs)
    from ray.rllib.core.rl_module.rl_module import RLModule

    module = RLModule.from_checkpoint(str(module_dir))
    model_config = module.model_config
    dtype = dtype or model_config.get("dtype")
    built = engine_class.from_pretrained(model_config["model"], dtype=dtype, **kwargs)
    built.update_weights(module.get_state())
    return built


def evaluate(
    policy: str | os.PathLike | RolloutEngine,
    env_id: str,
    env_config: Optional[Mapping[str, Any]] = None,
    *,
    n: int = 16,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    ks: Optional[Sequence[int]] = None,
    greedy: bool = True,
    seed: int = 0,
    style_suite: Optional[str] = None,
    limit: Optional[int] = None,
    batch_prompts: int = DEFAULT_BATCH_PROMPTS,
    keep_completions: bool = False,
    progress: bool = True,
    engine: str = "hf",
    dtype: Optional[str] = None,
    device: str = "cpu",
    engine_kwargs: Optional[Mapping[str, Any]] = None,
    name: str = "",
) -> EvalResult:
    """Evaluates a policy on an env split: n samples (and one greedy completion) per prompt.

    Args:
        policy: A model name / local folder / HF id, an RLlib Algorithm checkpoint folder (see
            :func:`load_engine`), or an already-built rollout engine.
        env_id: Env id (``"rllib_dph/SQL-v0"``), Tune env name or env class.
        env_config: The env's keyword arguments, e.g. ``{"data": "sql_synth/test"}``.
        n, temperature, top_p, max_new_tokens, ks, greedy, seed, style_suite, limit,
            batch_prompts, keep_completions, progress: See :func:`evaluate_engine`.
        engine, dtype, device, engine_kwargs: How to build the engine (:func:`load_engine`);
            unused when ``policy`` is an engine.
        name: Label of the result in plots (default: ``policy``).
    """
    from rllib_dph.env_runner import make_env

    env_config = dict(env_config or {})
    if isinstance(policy, RolloutEngine):
        built, described = policy, type(policy).__name__
    else:
        built = load_engine(policy, engine=engine, dtype=dtype, device=device, engine_kwargs=engine_kwargs)
        described = str(policy)
    env = make_env(env_id, env_config)
    try:
        result = evaluate_engine(
            built,
            env,
            n=n,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            ks=ks,
            greedy=greedy,
            seed=seed,
            style_suite=style_suite,
            limit=limit,
            batch_prompts=batch_prompts,
            keep_completions=keep_completions,
            progress=progress,
        )
    finally:
        env.close()
    result.policy, result.env_id, result.env_config, result.name = described, str(env_id), env_config, name
    return result


def format_summary(result: EvalResult, comparisons: Optional[Mapping[int, Mapping[str, float]]] = None) -> str:
    """A plain-text table of a result's summary (and keep / exploration rates per k).

    Args:
        result: The evaluation.
        comparisons: ``{k: compare(result, baseline, k)}`` for the k to show keep and
            exploration rates at.
    """
    s = result.summary()
    lines = [
        f"policy: {result.label}",
        f"env: {result.env_id} {json.dumps(result.env_config)}",
        f"prompts: {s['num_prompts']}  n={s['n']}  temperature={s['temperature']}  top_p={s['top_p']}  "
        f"max_new_tokens={s['max_new_tokens']}  ({result.duration_s:.1f} s)",
    ]
    if s["greedy_accuracy"] is not None:
        lines.append(f"greedy accuracy   {s['greedy_accuracy']:.3f}")
    lines.append(f"mean@{result.n:<12} {s[f'mean@{result.n}']:.3f}")
    lines.append(f"truncation rate   {s['truncation_rate']:.3f}")
    header = f"{'k':>4} {'pass@k':>8} {'maj@k':>8}"
    comparisons = comparisons or {}
    if comparisons:
        header += f" {'keep':>8} {'explore':>8}"
    lines.append(header)
    for k in result.ks:
        line = f"{k:>4} {s[f'pass@{k}']:>8.3f} {s[f'maj@{k}']:>8.3f}"
        if k in comparisons:
            line += f" {comparisons[k]['keep_rate']:>8.3f} {comparisons[k]['exploration_rate']:>8.3f}"
        lines.append(line)
    if "style_counts" in s:
        total = sum(s["style_counts"].values())
        shares = ", ".join(f"{style} {count / total:.2f}" for style, count in s["style_counts"].items())
        lines.append(f"styles ({s['style_entropy_bits']:.3f} bits): {shares}")
    return "\n".join(lines)


def finite_or_none(values: Mapping[str, float]) -> dict[str, Optional[float]]:
    """``values`` with NaN and infinities replaced by None (JSON has no NaN)."""
    return {k: (v if math.isfinite(v) else None) for k, v in values.items()}
